"""Serving questions per variant, measured in the sweep: where the time goes, batching under load (simulated from the
timed runs of the real runner, its highest rate within budget checked by a real server), cost per inference and the
bound; and the figures' MLflow metrics. The budget's verdict is qbench.slo's, the costs qbench.pricing's."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from qbench.errors import QbenchError
from qbench.pricing import priced, split_instances
from qbench.recipe.slo import SloSpec
from qbench.recipe.spec import Recipe
from qbench.results.schema import LatencyPoint, VariantResult
from qbench.results.serving import ServingResult
from qbench.slo import load_settings, served_above
from qbench.validate.tail import Verdict

if TYPE_CHECKING:  # the measuring side's types; its modules (which load pandas) are imported where it measures, so
    # that judging and pricing (`qbench gate`, `qbench report`) load none of them
    from qbench.backends.base import Runner
    from qbench.data.text import Padding
    from qbench.validate.clock import PhaseClock
    from qbench.validate.latency import BatcherSamples
    from qbench.validate.load import MeasuredServiceTimes
    from qbench.validate.serve import RealServer


def serving_figures(
    recipe: Recipe,
    backend: str,
    samples_ms: Mapping[int, np.ndarray],
    points: Sequence[LatencyPoint],
    *,
    model_bytes: int | None,
    lookup_bytes: int = 0,
    runtime: Mapping[str, Any],
    preprocess_ms_per_row: float,
    batcher: BatcherSamples | None = None,
    server: RealServer | None,
    clock: PhaseClock | None = None,
) -> ServingResult:
    """Pre-processing split, load scenario (with `slo:`), cost (with a price) and bound of one variant on `backend`;
    `batcher` (`measure_batcher_samples` at `idle_ms`): what serving through a dynamic batcher adds to the timed
    runs (without it the load is simulated from the timed runs alone); `server` (required with `slo:`): real runs of
    the variant behind a batcher with the recipe's load settings (qbench.validate.serve.real_server), which the
    simulated highest rate is checked against. The simulation's time goes to `clock`'s "simulation" phase.
    `lookup_bytes`: of `model_bytes`, the tables a run reads only rows of (qbench.validate.bound.lookup_table_bytes)."""
    from qbench.validate.bound import estimate_bound, last_level_cache_bytes, memory_bandwidth_bytes_per_s
    from qbench.validate.clock import PhaseClock

    by_batch = {p.batch_size: p for p in points}
    b1 = by_batch.get(1)
    largest = max(by_batch.values(), key=lambda p: p.batch_size, default=None)
    gpu_util = runtime.get("gpu_util_mean_pct")
    bound = estimate_bound(
        model_bytes, b1.p50_ms if b1 else None, bandwidth_bytes_per_s=memory_bandwidth_bytes_per_s(),
        batched=(largest.batch_size, largest.p50_ms) if largest else None,
        gpu_util_pct=float(gpu_util) if gpu_util is not None else None, cache_bytes=last_level_cache_bytes(),
        lookup_bytes=lookup_bytes,
    )  # fmt: skip
    serving = ServingResult(preprocess_ms_per_row=preprocess_ms_per_row, transfer_ms_b1=_transfer_ms(b1, runtime),
                            bound=bound)
    if recipe.slo is not None:
        if server is None:
            raise QbenchError("serving figures with `slo:` need a real server to check the highest rate against")
        serving = _with_load(serving, recipe.slo, backend, samples_ms, batcher, recipe.latency.batch_sizes, server,
                             clock or PhaseClock())  # fmt: skip
    price = recipe.cost.price_per_hour.get(backend) if recipe.cost is not None else None
    return priced(serving, price, points)



def _transfer_ms(b1: LatencyPoint | None, runtime: Mapping[str, Any]) -> float | None:
    """Host p50 minus device p50 at batch 1, when the backend times the device apart (copies + launch)."""
    device = runtime.get("gpu_compute_ms", {})
    entry = device.get("1") if isinstance(device, Mapping) else None
    if b1 is None or not isinstance(entry, Mapping) or "p50" not in entry:
        return None
    return max(b1.p50_ms - float(entry["p50"]), 0.0)



def server_for(
    slo: SloSpec, backend: str, batch_sizes: Sequence[int], runner: Runner, feeds: Mapping[str, np.ndarray],
    padding: Padding | None = None, fixed_batch: int | None = None,
) -> RealServer:
    """A real server on the open `runner` with the load settings' batcher and seed; its requests are the rows the
    timed batches of the largest size hold, as the simulation's service times are theirs (a model whose cost depends
    on the row, a slice of slow rows, is served them too: one batch of 32 rows held none of 2 % slow ones about half
    the time); with `padding`, at the set's padded length, each batch the batcher forms cut back to its own longest
    row, as a server padding each batch runs it and as the timed batches were (it served the first timed batch's rows
    only, all at that batch's one length: the short queries at a long document's length, or a mix whose first batch
    held no document served for real without one); `fixed_batch`: the model takes batches of that size only
    (qbench.preflight.checks.fixed_batch), each batch is filled up to it."""
    from qbench.validate.latency import timed_batches
    from qbench.validate.load import Batcher
    from qbench.validate.serve import real_server

    settings = load_settings(slo, backend, batch_sizes)
    batches = timed_batches(feeds, settings["max_batch_size"])
    rows = {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}
    batcher = Batcher(settings["max_batch_size"], settings["max_queue_delay_ms"])
    return real_server(runner, rows, batcher, settings["seed"], fixed_batch, padding)



def served_times(samples_ms: Mapping[int, np.ndarray], batcher: BatcherSamples | None) -> MeasuredServiceTimes:
    """The service times of batches served through a dynamic batcher: the timed runs plus the gathering of their
    rows when the model is busy (the batch starts as the previous one ends); when it is idle, the timed runs
    shifted by how much longer an idle start took (its median over the runs' median, never negative). The many
    timed runs give the distribution and its tail; the few idle starts only the shift, so a stall among them
    does not become every idle batch's time."""
    from qbench.validate.load import MeasuredServiceTimes

    if batcher is None:
        return MeasuredServiceTimes(samples_ms)
    runs = {bs: np.asarray(values, dtype=np.float64) for bs, values in samples_ms.items()}
    busy = {bs: values + batcher.gather_ms.get(bs, 0.0) for bs, values in runs.items()}
    idle = {bs: values + max(batcher.idle_ms.get(bs, 0.0) - float(np.median(values)), 0.0) if len(values) else values
            for bs, values in runs.items()}  # fmt: skip
    return MeasuredServiceTimes(busy, idle)



# the longest idle an idle start is timed after: the mean gap at 20 req/s, the lowest rate the real server serves
# (qbench.validate.serve.MAX_SECONDS); at most IDLE_BUDGET_S / this many idle starts fit a batch size's timing
IDLE_MAX_MS = 50.0


def idle_ms(slo: SloSpec, backend: str) -> float:
    """How long the model idles before each idle-start batch is timed: what an idle batch waits on average at the
    budget's rate, the mean gap between Poisson arrivals (1000 / rate_rps: memoryless, so also the mean wait from the
    model falling free to the next arrival) plus the queue delay it then waits for company, within [1, IDLE_MAX_MS]
    ms (a fixed-batch budget: the queue delay). A batcher without a delay still idles between arrivals. On a 2-core
    CPU 1 ms and 5 ms of idling cost an ONNX Runtime batch the same (its threads have parked by then), but a model
    whose caches or allocator go cold after a longer idle is slow on most requests at a low rate: at 20 req/s one
    slow (15 ms, 3 ms otherwise) after 5 ms of idle was timed after 1 ms and simulated at a p99 of 6.1 ms where
    every request took 15 ms."""
    gap_ms = 1000.0 / rate if (rate := slo.budget(backend).rate_rps) else 0.0
    return min(max(slo.queue_delay_ms(backend) + gap_ms, 1.0), IDLE_MAX_MS)



def _with_load(
    serving: ServingResult, slo: SloSpec, backend: str, samples_ms: Mapping[int, np.ndarray],
    batcher_samples: BatcherSamples | None, batch_sizes: Sequence[int], server: RealServer, clock: PhaseClock,
) -> ServingResult:  # fmt: skip
    """The simulation at the budget's rate, and the highest rate within budget: the simulation's, then served for
    real and stepped down until a real run meets the budget (the simulation models no server's own work). The
    budget's rate is served for real only where no real run at a rate at least as high met the budget (a slow model,
    or one that misses it): at a low rate a run of MIN_REQUESTS takes long (20 req/s: 10 s a variant) and says what
    the real runs at the higher rate already showed, while the simulation there models the batcher's waits; a
    search for the highest rate that its cost cut short (noisy timings: qbench.validate.load_search) skips nothing.
    A run at the budget's rate that cannot tell whether the server keeps up is served again, longer
    (validate.serve.settling_runs)."""
    from qbench.backends import BACKENDS
    from qbench.backends.base import needs_gpu
    from qbench.validate.background import hand_over_beside_timing, settle_before_timing
    from qbench.validate.load import Batcher, Draws, HostWork, LoadReplay
    from qbench.validate.load_search import search_max_rate
    from qbench.validate.load_verdict import judge_rate
    from qbench.validate.serve import served_max_rate, settling_runs

    settings = load_settings(slo, backend, batch_sizes)
    budget = slo.budget(backend)
    batcher = Batcher(settings["max_batch_size"], settings["max_queue_delay_ms"])
    overhead = serving.preprocess_ms_per_row if math.isfinite(serving.preprocess_ms_per_row) else 0.0
    service = served_times(samples_ms, batcher_samples)  # a host backend's model shares its CPUs with pre-processing
    service = service if needs_gpu(BACKENDS.get(backend)) else HostWork(service, overhead)
    replay = LoadReplay(service, batcher, Draws.make(settings["requests"], settings["seed"]))
    hand_over_beside_timing()  # the MLflow logging held since the last measurement runs beside the simulation
    with clock.within("simulation"):
        at_rate, judged = (judge_rate(replay, budget.rate_rps, budget.p99_ms, overhead_ms=overhead) if budget.rate_rps
                           else (None, None))  # fmt: skip
        search = search_max_rate(replay, budget.p99_ms, overhead_ms=overhead)
    with clock.within("track"):  # waiting for it is MLflow's cost, not inference
        settle_before_timing()  # idle again before the real serving runs are timed
    served = (served_max_rate(server, search.max_rate_rps, budget.p99_ms, overhead)
              if search.max_rate_rps is not None else None)
    served_at_rate = None
    # a search cut short by its cost stands in for no real run: the real run at the budget's rate is never skipped
    if budget.rate_rps and (search.cut_short
                            or not served_above(served.max_rate_rps if served else None, budget.rate_rps)):
        served_at_rate = server(budget.rate_rps, overhead, budget.p99_ms)
        if served_at_rate.keep_up_undecided:  # too short to tell: once more, longer (the gate needs a verdict)
            served_at_rate = server(budget.rate_rps, overhead, budget.p99_ms, runs=settling_runs(served_at_rate))
    swept = replace(
        serving, budget_ms=budget.p99_ms, batch_size=budget.batch_size, at_rate=at_rate,
        at_rate_undecided=judged is Verdict.UNDECIDED, served_at_rate=served_at_rate,
        max_rate_rps=served.max_rate_rps if served else None, at_max_rate=served.at_max if served else None,
        simulated_max_rate_rps=search.max_rate_rps, simulations=search.simulations,
        simulated_requests=search.requests, simulated_undecided=search.undecided,
        served_runs=served.runs if served else 0, **settings,
    )  # fmt: skip
    with clock.within("simulation"):
        return replace(swept, split_instances=split_instances(swept, replay, overhead))



def serving_metrics(variant: VariantResult) -> dict[str, float]:
    """Metric name -> value for the variant's MLflow run: cost.usd_per_million.b32, load.p99_ms, ..."""
    serving = variant.serving
    if serving is None:
        return {}
    metrics = {"time.preprocess_ms_per_row": serving.preprocess_ms_per_row}
    metrics |= {f"cost.usd_per_million.{key}": value for key, value in serving.usd_per_million.items()}
    if serving.transfer_ms_b1 is not None:
        metrics["time.transfer_ms_b1"] = serving.transfer_ms_b1
    if serving.at_rate is not None:
        metrics |= {"load.p50_ms": serving.at_rate.p50_ms, "load.p95_ms": serving.at_rate.p95_ms,
                    "load.p99_ms": serving.at_rate.p99_ms,
                    "load.mean_batch_size": serving.at_rate.mean_batch_size}  # fmt: skip
    if serving.budget_ms is not None:
        metrics["load.max_rate_rps"] = serving.max_rate_rps if serving.max_rate_rps is not None else 0.0
        metrics["load.simulated_requests"] = float(serving.simulated_requests)
        metrics["load.simulated_undecided"] = float(serving.simulated_undecided)  # 1: the search did not settle
    if serving.bound is not None and serving.bound.bandwidth_fraction is not None:
        metrics["bound.bandwidth_fraction"] = serving.bound.bandwidth_fraction
    return metrics
