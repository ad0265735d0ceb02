"""Serving questions per variant: where the time goes, batching under load, cost per inference, the bound,
and the latency budget (`slo:`) judged as its own kind of gate check.

`serving_figures` runs in the sweep, from the timed runs of the real runner; `judge_slo` is pure
and fails closed (a budgeted variant without a latency figure is a problem, never a pass), and
`qbench.gate` turns its judgements into gate checks with scope "slo" and metric "latency.p99_ms".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from qbench.errors import QbenchError, expected_one_of
from qbench.recipe.slo import MIN_P99_SAMPLES, CostSpec, SloSpec
from qbench.recipe.spec import Recipe
from qbench.results.schema import LatencyPoint, SweepResults, VariantResult
from qbench.results.serving import ServingResult
from qbench.validate.catalogue import within
from qbench.validate.contention import contended, cpus_allowed, oversubscribed, threads_that_fit
from qbench.validate.cost import usd_per_million, usd_per_million_at_rate
from qbench.validate.tail import Verdict

if TYPE_CHECKING:  # the measuring side's types; its modules (which load pandas) are imported where it measures, so
    # that judging and pricing (`qbench gate`, `qbench report`) load none of them
    from qbench.backends.base import Runner
    from qbench.data.text import Padding
    from qbench.validate.clock import PhaseClock
    from qbench.validate.latency import BatcherSamples
    from qbench.validate.load import LoadReplay, MeasuredServiceTimes
    from qbench.validate.serve import RealServer

SLO_SCOPE = "slo"
SLO_METRIC = "latency.p99_ms"
# MIN_P99_SAMPLES: fewer samples hold none beyond their 99th percentile, so their "p99" is an interpolation between
# the largest one or two, and with n iid samples none at all lands in the slowest 1 % with probability 0.99^n (82 %
# for 20, 61 % for 50): such a figure cannot show that a budget holds.


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
    serving = ServingResult(preprocess_ms_per_row=preprocess_ms_per_row, transfer_ms_b1=_transfer_ms(b1, runtime), bound=bound)
    if recipe.slo is not None:
        if server is None:
            raise QbenchError("serving figures with `slo:` need a real server to check the highest rate against")
        serving = _with_load(serving, recipe.slo, backend, samples_ms, batcher, recipe.latency.batch_sizes, server,
                             clock or PhaseClock())  # fmt: skip
    price = recipe.cost.price_per_hour.get(backend) if recipe.cost is not None else None
    return priced(serving, price, points)


def priced(serving: ServingResult, price: float | None, points: Sequence[LatencyPoint]) -> ServingResult:
    """`serving` with its costs per million computed from `price` (USD per hour; None: no price, no costs) and its
    own rates: each timed batch size's throughput (`points`), its highest rate within budget and the budget's rate
    on the instances it takes (`instances_at_rate`)."""
    if price is None:
        return replace(serving, price_per_hour=None, usd_per_million={})
    costs = {f"b{p.batch_size}": usd_per_million(price, p.items_per_s) for p in points}
    if serving.max_rate_rps is not None:
        costs["max_rate"] = usd_per_million(price, serving.max_rate_rps)
        if serving.rate_rps:
            costs["at_rate"] = usd_per_million_at_rate(price, serving.rate_rps, instances_at_rate(serving))
    return replace(serving, price_per_hour=price, usd_per_million=costs)


def instances_at_rate(serving: ServingResult) -> int | None:
    """The whole instances that serve the budget's rate within the budget (None: no count is known to): one where
    one instance meets it there (`met_at_rate`: the served search can stop below a rate a real run at the budget's
    rate met, 783 req/s claimed beside a pass at 1,873 req/s, priced as 3); else the sweep's `split_instances`,
    from ceil(rate / highest rate within budget) up, not that ceil alone: with a queue delay a lower rate can miss a
    budget a higher one meets (8 rows in 1 ms, 10 ms delay: 4 ms met from about 4,000 to 6,937 req/s; 7,500 req/s
    was priced on 2 instances at 3,750 req/s each, p99 4.3 ms). None where one instance misses the rate it exceeds."""
    rate, highest = serving.rate_rps, serving.max_rate_rps
    if not rate or highest is None:
        return None
    if met_at_rate(serving):
        return 1
    if highest >= rate:
        return None
    return serving.split_instances or None


def met_at_rate(serving: ServingResult) -> bool:
    """Whether one instance meets the budget swept at its rate, as the gate judges it: within the budget, keeping up,
    and neither the real run nor the simulation there unable to tell (qbench.report.serving judges the reference,
    which is never gated, by it)."""
    judged = p99_under_load(serving, serving.rate_rps) if serving.rate_rps else None
    budget = serving.budget_ms
    return (judged is not None and budget is not None and within(judged[0], budget) and not judged[1]
            and not _undecided(serving) and not serving.at_rate_undecided)  # fmt: skip


# instance counts tried from ceil(rate / highest rate within budget) up, for the budget's rate split over instances
SPLITS_TRIED = 4


def split_instances(serving: ServingResult, replay: LoadReplay, overhead_ms: float) -> int | None:
    """Where one instance does not serve the budget's rate within budget but its highest rate within budget is below
    the rate: the fewest of SPLITS_TRIED instance counts from ceil(rate / highest) up at whose share of the rate
    `replay` shows the p99 within the budget (qbench.validate.load.LoadReplay.verdict), 0 when none is; None
    where no split is needed or none can be priced (`instances_at_rate`)."""
    rate, highest, budget = serving.rate_rps, serving.max_rate_rps, serving.budget_ms
    if not rate or highest is None or budget is None or highest >= rate or met_at_rate(serving):
        return None
    first = math.ceil(rate / highest)
    shown = (n for n in range(first, first + SPLITS_TRIED)
             if replay.verdict(rate / n, budget, overhead_ms=overhead_ms)[0] is Verdict.PASS)  # fmt: skip
    return next(shown, 0)


def repriced(results: SweepResults, cost: CostSpec | None) -> SweepResults:
    """`results` with every variant's costs computed again, when judged, from the recipe's price for its backend (the
    one recorded at sweep time, `--price` included, where the recipe names none) and the recorded rates: a price
    changed since the sweep is the one the cheapest variant is ranked by, and a cost figure edited into the results
    (or left from another price) ranks nothing."""
    prices = cost.price_per_hour if cost is not None else {}
    variants = tuple(
        replace(v, serving=priced(v.serving, prices.get(v.backend, v.serving.price_per_hour),
                                  v.latency.points if v.latency is not None else ()))
        if v.serving is not None else v
        for v in results.variants
    )  # fmt: skip
    return replace(results, variants=variants)


def _transfer_ms(b1: LatencyPoint | None, runtime: Mapping[str, Any]) -> float | None:
    """Host p50 minus device p50 at batch 1, when the backend times the device apart (copies + launch)."""
    device = runtime.get("gpu_compute_ms", {})
    entry = device.get("1") if isinstance(device, Mapping) else None
    if b1 is None or not isinstance(entry, Mapping) or "p50" not in entry:
        return None
    return max(b1.p50_ms - float(entry["p50"]), 0.0)


def load_settings(slo: SloSpec, backend: str, batch_sizes: Sequence[int]) -> dict[str, Any]:
    """What the load figures depend on; results simulated with other settings cannot be judged."""
    budget = slo.budget(backend)
    return {
        "rate_rps": budget.rate_rps,
        "max_batch_size": slo.load.max_batch_size or max(batch_sizes),
        "max_queue_delay_ms": slo.queue_delay_ms(backend),
        "requests": slo.load.requests,
        "seed": slo.load.seed,
    }


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
    A run at the budget's rate that cannot tell whether the server keeps up is served again, longer (validate.serve.settling_runs)."""
    from qbench.backends import BACKENDS
    from qbench.backends.base import needs_gpu
    from qbench.validate.background import hand_over_beside_timing, settle_before_timing
    from qbench.validate.load import Batcher, Draws, HostWork, LoadReplay
    from qbench.validate.load_search import judge_rate, search_max_rate
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
    served = served_max_rate(server, search.max_rate_rps, budget.p99_ms, overhead) if search.max_rate_rps is not None else None
    served_at_rate = None
    # a search cut short by its cost stands in for no real run: the real run at the budget's rate is never skipped
    if budget.rate_rps and (search.cut_short or not served_above(served.max_rate_rps if served else None, budget.rate_rps)):
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


def served_above(max_rate_rps: float | None, rate_rps: float) -> bool:
    """Whether real runs at a rate at least `rate_rps` met the budget (`max_rate_rps`: the highest rate they did)."""
    return max_rate_rps is not None and rate_rps <= max_rate_rps


def with_prices(recipe: Recipe, prices: Sequence[str]) -> Recipe:
    """The recipe with `--price backend=USD` entries (USD per hour) over its cost.price_per_hour."""
    merged = dict(recipe.cost.price_per_hour) if recipe.cost is not None else {}
    for entry in prices:
        backend, _, value = entry.partition("=")
        if backend not in recipe.backends:
            raise QbenchError(f"--price {entry}: backend {expected_one_of(backend, recipe.backends)}")
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not (price > 0 and math.isfinite(price)):
            raise QbenchError(f"--price {entry}: expected backend=USD per hour, a positive number (e.g. {backend}=0.10)")
        merged[backend] = price
    return recipe.model_copy(update={"cost": CostSpec(price_per_hour=merged)}) if merged else recipe


# -- the budget check -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SloJudgement:
    variant: str
    backend: str
    budget_ms: float
    observed_ms: float
    samples: int  # requests simulated, or timed runs
    status: str  # "pass" | "breach"
    reason: str = ""  # why a breach with a p99 within the budget: the instance fell behind at the rate

    @property
    def over_ms(self) -> float:
        return self.observed_ms - self.budget_ms


def judge_slo(
    results: SweepResults, slo: SloSpec, pairs: Sequence[tuple[str, str]], batch_sizes: Sequence[int]
) -> tuple[list[SloJudgement], list[str]]:
    """Judge every (variant, backend) in `pairs` against its budget; problems name what could not be judged."""
    judgements: list[SloJudgement] = []
    problems: list[str] = []
    for variant, backend in pairs:
        result = results.find(variant, backend)
        judgement, problem = _judge_one(result, slo, backend, batch_sizes)
        if problem is not None:
            problems.append(f"{variant}@{backend}: SLO: {problem}")
        if judgement is not None:
            judgements.append(judgement)
    return judgements, problems


def _judge_one(
    result: VariantResult | None, slo: SloSpec, backend: str, batch_sizes: Sequence[int]
) -> tuple[SloJudgement | None, str | None]:
    budget = slo.budget(backend)
    if result is None or result.status != "ok":
        return None, "no latency figure (the variant is missing or failed)"
    serving = result.serving
    if budget.rate_rps is not None:
        if serving is None or serving.at_rate is None:
            return None, "no load figure at the budget rate: re-run `qbench sweep` with this slo section"
        judged = p99_under_load(serving, budget.rate_rps, budget.p99_ms)
        if judged is None:
            return None, ("no real run at or above the budget rate met or missed it (served_at_rate, max_rate_rps"
                          f"{_met_looser(serving, budget.rate_rps, budget.p99_ms)}): re-run `qbench sweep` with this slo section")  # fmt: skip
        recorded = {k: getattr(serving, k) for k in ("rate_rps", "max_batch_size", "max_queue_delay_ms", "requests", "seed")}
        if recorded != load_settings(slo, backend, batch_sizes):
            return None, f"results were simulated with other load settings ({recorded}): re-run `qbench sweep`"
        observed, behind = judged
        swept = serving.budget_ms if serving.budget_ms is not None else math.nan  # its share over it was bounded
        shown = within(swept, budget.p99_ms) and within(serving.at_rate.p99_ms, swept)
        if within(observed, budget.p99_ms) and not behind and not shown:
            return None, (f"the sweep judged the simulated p99 at the budget's rate against {swept:g} ms, the budget "
                          f"it was swept with, not {budget.p99_ms:g} ms: re-run `qbench sweep` with this slo section")
        served = serving.served_at_rate
        if serving.at_rate_undecided and not behind and (served is None or within(served.p99_ms, budget.p99_ms)):
            return None, (f"the simulation at the budget's rate ({budget.rate_rps:,.4g} req/s) cannot tell whether its "
                          f"p99 is within the budget ({serving.at_rate.requests:,} simulated requests, near 1 % of them "
                          "over it): budget a rate further from the instance's capacity, or a looser p99")  # fmt: skip
        if within(observed, budget.p99_ms) and not behind and _undecided(serving):
            return None, (f"the real run at the budget's rate ({budget.rate_rps:,.4g} req/s) cannot tell whether one "
                          f"instance keeps up ({_undecided(serving)}): re-run `qbench sweep` on a machine nothing else "
                          "runs on, or budget a rate further from the instance's capacity")  # fmt: skip
        samples = min(_load_samples(result, serving), served.requests if served else math.inf)
    else:
        point = result.latency.at(budget.batch_size) if result.latency else None
        if point is None:
            return None, f"no latency measured at batch size {budget.batch_size}"
        preprocess = serving.preprocess_ms_per_row if serving is not None else math.nan
        observed = point.p99_ms + preprocess * budget.batch_size
        samples, behind = point.iterations, ""
    if not math.isfinite(observed):
        return None, "the p99 latency is missing or NaN"
    if samples < MIN_P99_SAMPLES:
        basis = p99_basis(samples, serving if budget.rate_rps is not None else None)
        return None, (f"the p99 rests on {basis}, expected at least {MIN_P99_SAMPLES} (fewer hold no sample "
                      "beyond their 99th percentile): raise latency.iterations (or slo.load.requests)")  # fmt: skip
    status = "pass" if within(observed, budget.p99_ms) and not behind else "breach"
    reason = behind if within(observed, budget.p99_ms) else ""  # a p99 over the budget says why itself
    crowded = _crowded_timing(result, None if budget.rate_rps is not None else budget.batch_size)
    if status == "breach" and crowded:
        return None, f"a breach timed {crowded} is no verdict on the variant: re-run `qbench sweep` {_remedy(result)}"
    return SloJudgement(result.variant, result.backend, budget.p99_ms, observed, samples, status, reason), None


def _crowded_timing(result: VariantResult, batch_size: int | None) -> str:
    """How the timed points a p99 rests on (`batch_size`'s, or every one for a simulated load) competed for CPUs, in
    words ('' when they did not): beside other processes' load, or with more threads than usable CPUs
    (qbench.validate.contention). Either only slows a run, so a pass measured so stands, while a breach may be the
    load's or the CPU allowance's doing rather than the variant's."""
    points = [p for p in (result.latency.points if result.latency else ())
              if contended(p) and batch_size in (None, p.batch_size)]  # fmt: skip
    loaded = ", ".join(f"{p.others_cpus:.2f} at batch {p.batch_size}" for p in points)
    causes = [f"while other processes kept CPUs busy ({loaded})" if loaded else "",
              f"with {oversubscribed(result.latency)}" if oversubscribed(result.latency) else ""]  # fmt: skip
    return " and ".join(cause for cause in causes if cause)


def _remedy(result: VariantResult) -> str:
    """Where to time again for a verdict: with no more threads than usable CPUs, on a machine nothing else runs on."""
    latency = result.latency
    if latency is None or not oversubscribed(latency):
        return "on a machine nothing else runs on"
    fit = threads_that_fit(latency.machine)
    return f"with latency.threads at most {fit}, or " * (fit >= 1) + f"where {cpus_allowed(latency.threads)} and nothing else runs"


def p99_under_load(serving: ServingResult, rate_rps: float, budget_ms: float | None = None) -> tuple[float, str] | None:
    """The p99 judged at `rate_rps` (the budget's, with `serving.at_rate` simulated there) and, when the instance
    fell behind there (a breach whatever that p99: its queue grows), why ('' when it kept up): the worse of the simulation and the real server's run at the rate (the simulation models no
    server's own work per request), or the simulation alone where real runs at a rate at least as high met the budget
    (`budget_ms`, the one judged now; None: the one swept): runs that met a looser budget at the sweep stand for none
    (a budget tightened from 10 to 6 ms since was judged on the simulated 5.5 ms alone, a pass);
    None when neither real figure is recorded (nothing real to judge by). The gate judges every budgeted variant by
    it, and the report the reference, which is never gated (qbench.report.serving.cheapest)."""
    served = serving.served_at_rate
    if serving.at_rate is None or (served is None and not _met_above(serving, rate_rps, budget_ms)):
        return None
    observed = float(np.max([serving.at_rate.p99_ms, served.p99_ms if served else -math.inf]))  # NaN: NaN
    if serving.at_rate.overloaded:
        return observed, "overloaded: the rate is above what one instance sustains, so its queue grows without bound"
    if served is not None and served.overloaded:
        return observed, f"the real server fell behind at the rate (it completed {served.achieved_rps:.4g} req/s)"
    return observed, ""


def _met_above(serving: ServingResult, rate_rps: float, budget_ms: float | None) -> bool:
    """Whether the real runs at the highest rate within budget show `budget_ms` met at `rate_rps`: at a rate at least
    as high, under a budget at most as long (what met 10 ms meets 20 ms, not 6 ms)."""
    swept = serving.budget_ms
    tight_enough = budget_ms is None or (swept is not None and within(swept, budget_ms))
    return tight_enough and served_above(serving.max_rate_rps, rate_rps)


def _met_looser(serving: ServingResult, rate_rps: float, budget_ms: float) -> str:
    """Where the sweep's real runs at a rate at least `rate_rps` met a looser budget than `budget_ms`, saying so ('':
    none did)."""
    swept = serving.budget_ms
    if swept is None or within(swept, budget_ms) or not served_above(serving.max_rate_rps, rate_rps):
        return ""
    return f"; the runs above it met the {swept:g} ms budget swept, not {budget_ms:g} ms"


def _undecided(serving: ServingResult) -> str:
    """Why the real run at the budget's rate could not tell whether the instance keeps up ('' when it could, or none
    was served)."""
    return serving.served_at_rate.keep_up_undecided if serving.served_at_rate is not None else ""


def p99_basis(samples: int, serving: ServingResult | None) -> str:
    """What a judged p99 rests on, in words: `samples` simulated requests when `serving` (a p99 under load) simulated
    no more than that, else timed runs (a fixed-batch p99, or a simulation that drew from fewer timed runs)."""
    simulated = serving is not None and serving.at_rate is not None and samples >= serving.at_rate.requests
    return f"{samples:,} simulated requests" if simulated else f"{samples:,} timed runs per batch size"


def _load_samples(result: VariantResult, serving: ServingResult) -> int:
    """What a simulated p99 rests on: the simulated requests, but no more than the timed runs of any batch size the
    simulation drew service times from (each simulated batch takes one of them, so the simulated tail is no finer
    than theirs): the sizes up to its largest batch, and the next timed one that sizes between interpolate with."""
    requests = serving.at_rate.requests if serving.at_rate is not None else 0
    points = sorted(result.latency.points, key=lambda p: p.batch_size) if result.latency is not None else []
    largest = serving.max_batch_size or 0
    drawn = [p for p in points if p.batch_size <= largest] + [p for p in points if p.batch_size >= largest][:1]
    return min([requests, *(p.iterations for p in drawn)])


# -- MLflow ---------------------------------------------------------------------------------------


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
                    "load.p99_ms": serving.at_rate.p99_ms, "load.mean_batch_size": serving.at_rate.mean_batch_size}  # fmt: skip
    if serving.budget_ms is not None:
        metrics["load.max_rate_rps"] = serving.max_rate_rps if serving.max_rate_rps is not None else 0.0
        metrics["load.simulated_requests"] = float(serving.simulated_requests)
        metrics["load.simulated_undecided"] = float(serving.simulated_undecided)  # 1: the search did not settle
    if serving.bound is not None and serving.bound.bandwidth_fraction is not None:
        metrics["bound.bandwidth_fraction"] = serving.bound.bandwidth_fraction
    return metrics
