"""Does qbench's load simulation predict real serving? Predicted vs real, side by side in one run.

For the digits CNN (FP32 and the variants a sweep of recipes/digits.yaml builds, FP16 and INT8 by
default), per variant:

1. Prediction: the runner is timed as the sweep times it (qbench.validate.latency.measure_samples with
   the recipe's latency settings, and measure_batcher_samples as measure() does with `slo:`), then
   `serving_figures` gives the max rate within the budget and `LoadReplay` over `served_times` the
   figures at each rate, with the recipe's batcher and draws, exactly as the sweep. "b2b" columns: the
   same simulation from the timed back-to-back runs alone (qbench before gathering and idle starts
   were charged).
2. Reality: qbench's open-loop server (qbench.validate.serve, the one the sweep checks its highest rate
   with) on the same runner (ONNX Runtime, the recipe's threads): a client thread sends one-row requests at the Poisson
   arrival times of the same draws (scaled to the rate), a batcher thread takes the oldest request once the model is
   free, waits until the batch is full or that request has waited max_queue_delay_ms, concatenates the rows, runs them
   and stamps each request's completion. Latency = completion - scheduled arrival (open loop: a late client
   counts against the server), plus qbench's pre-processing per row, as the simulation adds it; the JSON
   also has it from the moment the client enqueued the request, and the client's lag.
3. Service times at batch sizes the recipe never times: measured at intermediate sizes against
   qbench's interpolation between the timed sizes, and the real server's per-batch time (assembly and
   run) per size.

Rates: fractions of qbench's capacity (full batches back to back at the mean service time), the recipe's rate and
the same fractions of the real max rate within budget (where the server keeps up). Real max rate within budget:
doubling then bisection over real runs, a rate failing when its p99 breaks the budget or the server falls behind (fewer
than 95 % of the rate served). The machine is shared: the load average before and after is recorded.

    python bench/serving_validation.py [--variants fp16,int8-entropy] [--fractions 0.25,0.5,0.75,0.9]
                                       [--requests 5000] [--out bench/out/serving_validation.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_output import write_json
from rich.console import Console
from rich.table import Table

from qbench.backends import get_backend
from qbench.backends.base import Runner, RunOptions
from qbench.demo.digits import make_digits_demo
from qbench.environment import describe_environment
from qbench.preflight.prepare import prepare
from qbench.recipe.spec import Recipe, load_recipe
from qbench.serving import idle_ms, served_times, server_for, serving_figures
from qbench.slo import load_settings
from qbench.sweep.runner import run_sweep
from qbench.validate.latency import latency_points, measure_batcher_samples, measure_samples
from qbench.validate.load import Batcher, Draws, LoadReplay, MeasuredServiceTimes
from qbench.validate.load_search import search_max_rate
from qbench.validate.serve import Served, real_server, serve
from qbench.validate.tail import Verdict
from qbench.variants import BuiltVariant

ROOT = Path(__file__).resolve().parents[1]
INTERMEDIATE_SIZES = (1, 2, 4, 8, 16, 24, 32)


def build(scratch: Path, variants: list[str]) -> tuple[Recipe, list[BuiltVariant]]:
    """The digits assets in `scratch`, and FP32 plus `variants` as a sweep of the recipe builds them."""
    make_digits_demo(scratch, seed=0)
    recipe = load_recipe(scratch / "recipes" / "digits.yaml")
    kept = [v for v in recipe.variants if v.name in variants]
    gate = recipe.gate.model_copy(update={"applies_to": [v.name for v in kept]})
    swept = recipe.model_copy(update={"variants": kept, "gate": gate, "output_dir": scratch / "reports"})
    results = run_sweep(swept, track=False).results
    built = [BuiltVariant(v.variant, v.precision, Path(v.model_path)) for v in results.variants if v.status == "ok"]
    return swept, built


def real_figures(served: Served, overhead_ms: float, rate: float) -> dict[str, float]:
    latencies = served.latencies_ms + overhead_ms
    p50, p99 = np.percentile(latencies, [50, 99])
    # from when the client actually enqueued the request: what a server that stamps arrivals itself would report
    from_enqueue = np.percentile(served.latencies_ms - served.client_lag_ms + overhead_ms, [50, 99])
    return {"p50_ms": float(p50), "p99_ms": float(p99), "mean_batch_size": float(served.batch_sizes.mean()),
            "achieved_rps": served.latencies_ms.size * 1000 / served.done_ms.max(),
            "keeps_up": served.keeps_up(rate).verdict is Verdict.PASS,
            "client_lag_p50_ms": float(np.percentile(served.client_lag_ms, 50)),
            "client_lag_p99_ms": float(np.percentile(served.client_lag_ms, 99)),
            "from_enqueue_p50_ms": float(from_enqueue[0]), "from_enqueue_p99_ms": float(from_enqueue[1]),
            "assembly_ms_mean": float(served.assembly_ms.mean()),
            "run_ms_mean": float(served.run_ms.mean())}  # fmt: skip


def real_max_rate(runner: Runner, rows: dict[str, np.ndarray], seed: int, batcher: Batcher, budget_ms: float,
                  overhead_ms: float, start_rps: float, rel_tol: float = 0.05) -> tuple[float | None, int]:  # fmt: skip
    """Doubling then bisection over real runs (qbench.validate.serve.real_server: half a second of arrivals each, a
    rate the server does not keep up with fails), as qbench searches its simulation."""
    runs = 0
    server = real_server(runner, rows, batcher, seed)

    def passes(rate: float) -> bool:
        nonlocal runs
        runs += 1
        stats = server(rate, overhead_ms)
        return stats.p99_ms <= budget_ms and not stats.overloaded and not stats.keep_up_undecided

    low = start_rps
    while not passes(low):
        low /= 4
        if low < start_rps / 256:
            return None, runs
    high = low * 2
    while passes(high):
        low, high = high, high * 2
    while high - low > rel_tol * low:
        middle = (low + high) / 2
        low, high = (middle, high) if passes(middle) else (low, middle)
    return low, runs


def service_check(runner: Runner, feeds: dict[str, np.ndarray], recipe: Recipe,
                  samples: dict[int, np.ndarray]) -> list[dict[str, Any]]:
    """p50 service time measured at intermediate batch sizes against qbench's interpolation of the timed sizes."""
    timing = recipe.latency
    service = MeasuredServiceTimes(samples)
    measured = measure_samples(runner, feeds, INTERMEDIATE_SIZES, timing.warmup, timing.iterations,
                               description="intermediate")  # fmt: skip
    rows = []
    for size in INTERMEDIATE_SIZES:
        predicted = {q: float(service.service_ms(size, q)) for q in (0.5, 0.99)}
        real = {q: float(np.quantile(measured[size], q)) for q in (0.5, 0.99)}
        rows.append({"batch_size": size, "predicted_p50_ms": predicted[0.5], "measured_p50_ms": real[0.5],
                     "predicted_p99_ms": predicted[0.99], "measured_p99_ms": real[0.99]})  # fmt: skip
    return rows


def validate_variant(recipe: Recipe, prepared: Any, built: BuiltVariant, fractions: list[float],
                     requests: int) -> dict[str, Any]:
    backend = get_backend(recipe.backends[0])
    timing = recipe.latency
    settings = load_settings(recipe.slo, backend.name, timing.batch_sizes)
    batcher = Batcher(settings["max_batch_size"], settings["max_queue_delay_ms"])
    draws = Draws.make(requests, settings["seed"])
    overhead = prepared.preprocess_ms_per_row
    feeds = prepared.evaluation_feeds
    runner = backend.load(built,
                          RunOptions(threads=timing.threads,
                                     batch_sizes=tuple(sorted({*timing.batch_sizes, *INTERMEDIATE_SIZES}))))
    try:
        runner.run({k: v[:1] for k, v in feeds.items()})
        samples = measure_samples(runner, feeds, timing.batch_sizes, timing.warmup, timing.iterations,
                                  description=f"{built.name} latency", stability=timing.stability)  # fmt: skip
        batcher_samples = measure_batcher_samples(runner, feeds, timing.batch_sizes, timing.iterations,
                                                  idle_ms(recipe.slo, backend.name))  # fmt: skip
        points = latency_points(samples, timing.warmup)
        serving = serving_figures(recipe, backend.name, samples, points, model_bytes=None, runtime=runner.describe(),
                                  preprocess_ms_per_row=overhead, batcher=batcher_samples,
                                  server=server_for(recipe.slo, backend.name, timing.batch_sizes, runner,
                                                    feeds))  # fmt: skip
        replay = LoadReplay(served_times(samples, batcher_samples), batcher, draws)
        back_to_back = LoadReplay(MeasuredServiceTimes(samples), batcher, draws)  # the simulation before the batcher
        old_max = search_max_rate(back_to_back, serving.budget_ms, overhead_ms=overhead).max_rate_rps
        budget = serving.budget_ms
        real_max, real_runs = real_max_rate(runner, feeds, settings["seed"], batcher, budget, overhead,
                                            start_rps=serving.simulated_max_rate_rps
                                            or replay.capacity_rps / 64)  # fmt: skip
        rates = sorted({*(f * replay.capacity_rps for f in fractions), float(settings["rate_rps"] or 0),
                        *((f * real_max for f in fractions) if real_max else ())} - {0.0})  # fmt: skip
        rows = []
        for rate in rates:
            predicted = replay.at(rate, overhead_ms=overhead)
            old = back_to_back.at(rate, overhead_ms=overhead)
            served = serve(runner, feeds, np.cumsum(draws.unit_gaps) * 1000 / rate, batcher)
            real = real_figures(served, overhead, rate)
            # the model's own runs inside the server against the back-to-back timings at the same batch sizes
            timed = np.asarray([float(back_to_back.service.service_ms(int(b), 0.5)) for b in served.batch_sizes])
            real["run_vs_timed"] = float(served.run_ms.sum() / timed.sum())
            rows.append({"rate_rps": rate, "of_capacity": rate / replay.capacity_rps,
                         "predicted": {"p50_ms": predicted.p50_ms, "p99_ms": predicted.p99_ms,
                                       "mean_batch_size": predicted.mean_batch_size,
                                       "overloaded": predicted.overloaded},
                         "back_to_back": {"p50_ms": old.p50_ms, "p99_ms": old.p99_ms},
                         "real": real, "p50_ratio": real["p50_ms"] / predicted.p50_ms,
                         "p99_ratio": real["p99_ms"] / predicted.p99_ms,
                         "back_to_back_p50_ratio": real["p50_ms"] / old.p50_ms,
                         "back_to_back_p99_ratio": real["p99_ms"] / old.p99_ms})  # fmt: skip
        intermediate = service_check(runner, feeds, recipe, samples)
    finally:
        runner.close()
    return {"variant": built.name, "backend": backend.name, "settings": settings, "preprocess_ms_per_row": overhead,
            "timed_p50_ms": {bs: float(np.median(v)) for bs, v in samples.items()},
            "timed_p99_ms": {bs: float(np.quantile(v, 0.99)) for bs, v in samples.items()},
            "gather_ms": batcher_samples.gather_ms,
            "idle_p50_ms": batcher_samples.idle_ms,
            "back_to_back_max_rate_rps": old_max,
            "capacity_rps": replay.capacity_rps, "budget_ms": budget,
            "predicted_max_rate_rps": serving.simulated_max_rate_rps, "served_max_rate_rps": serving.max_rate_rps,
            "real_max_rate_rps": real_max, "real_search_runs": real_runs,
            "rates": rows, "where_real_kept_up": summary(rows), "service_times": intermediate}  # fmt: skip


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median real/predicted ratios over the rates the real server was shown keeping up with
    (qbench.validate.keep_up)."""
    kept = [row for row in rows if row["real"]["keeps_up"]]
    if not kept:
        return {"rates_kept_up": 0}
    return {"rates_kept_up": len(kept), "up_to_rps": max(row["rate_rps"] for row in kept)} | {
        key: float(np.median([row[key] for row in kept]))
        for key in ("p50_ratio", "p99_ratio", "back_to_back_p50_ratio", "back_to_back_p99_ratio")
    }


def _table(figures: dict[str, Any], load: tuple[float, float]) -> Table:
    title = (f"{figures['variant']}: capacity {figures['capacity_rps']:,.0f} req/s, budget {figures['budget_ms']:g} "
             f"ms; max rate within budget predicted {figures['predicted_max_rate_rps'] or 0:,.0f} "
             f"(back to back {figures['back_to_back_max_rate_rps'] or 0:,.0f}; reported after real runs "
             f"{figures['served_max_rate_rps'] or 0:,.0f}) vs real "
             f"{figures['real_max_rate_rps'] or 0:,.0f} req/s; "
             f"load average {load[0]:.2f} -> {load[1]:.2f}")  # fmt: skip
    table = Table(title=title)
    for header in ("req/s", "of capacity", "p50 b2b", "p50 pred", "p50 real", "ratio b2b/pred", "p99 b2b", "p99 pred",
                   "p99 real", "ratio b2b/pred", "batch pred/real", "served req/s", "run real/timed",
                   "client lag p50/p99"):  # fmt: skip
        table.add_column(header, justify="right")
    for row in figures["rates"]:
        p, r, b = row["predicted"], row["real"], row["back_to_back"]
        table.add_row(f"{row['rate_rps']:,.0f}", f"{row['of_capacity']:.1%}", f"{b['p50_ms']:.3f}",
                      f"{p['p50_ms']:.3f}",
                      f"{r['p50_ms']:.3f}", f"{row['back_to_back_p50_ratio']:.2f} / {row['p50_ratio']:.2f}",
                      f"{b['p99_ms']:.3f}", f"{p['p99_ms']:.3f}", f"{r['p99_ms']:.3f}",
                      f"{row['back_to_back_p99_ratio']:.2f} / {row['p99_ratio']:.2f}",
                      f"{p['mean_batch_size']:.1f} / {r['mean_batch_size']:.1f}", f"{r['achieved_rps']:,.0f}",
                      f"{r['run_vs_timed']:.2f}",
                      f"{r['client_lag_p50_ms']:.3f} / {r['client_lag_p99_ms']:.3f}")  # fmt: skip
    return table


def _service_table(figures: dict[str, Any]) -> Table:
    table = Table(title=f"{figures['variant']}: service time (ms) per batch size, qbench's interpolation vs measured")
    for header in ("batch", "p50 interp.", "p50 measured", "p99 interp.", "p99 measured"):
        table.add_column(header, justify="right")
    for row in figures["service_times"]:
        table.add_row(str(row["batch_size"]), f"{row['predicted_p50_ms']:.4f}", f"{row['measured_p50_ms']:.4f}",
                      f"{row['predicted_p99_ms']:.4f}", f"{row['measured_p99_ms']:.4f}")  # fmt: skip
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="fp16,int8-entropy", help="variants of recipes/digits.yaml besides FP32")
    parser.add_argument("--fractions", default="0.25,0.5,0.75,0.9", help="rates as fractions of qbench's capacity")
    parser.add_argument("--requests", type=int, help="requests per rate (default: the recipe's slo.load.requests)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "serving_validation.json")
    args = parser.parse_args(argv)
    console = Console(width=240)
    fractions = [float(f) for f in args.fractions.split(",")]
    report: dict[str, Any] = {"environment": describe_environment(), "variants": []}
    with tempfile.TemporaryDirectory(prefix="qbench-serving-") as scratch:
        recipe, built = build(Path(scratch), args.variants.split(","))
        prepared = prepare(recipe, track=False)
        requests = args.requests or recipe.slo.load.requests
        report |= {"recipe": recipe.name, "latency": recipe.latency.model_dump(mode="json"),
                   "slo": recipe.slo.model_dump(mode="json"), "requests": requests}  # fmt: skip
        for variant in built:
            before = os.getloadavg()
            started = time.perf_counter()
            figures = validate_variant(recipe, prepared, variant, fractions, requests)
            load = (before[0], os.getloadavg()[0])
            figures |= {"load_average_1min": {"before": load[0], "after": load[1]},
                        "seconds": time.perf_counter() - started}  # fmt: skip
            report["variants"].append(figures)
            console.print(_table(figures, load))
            console.print(f"{figures['variant']}: where the server kept up, median real/predicted "
                          + ", ".join(f"{k} {v:,.2f}" for k, v in figures["where_real_kept_up"].items()))
            console.print(_service_table(figures))
    return write_json(args.out, report, console)


if __name__ == "__main__":
    sys.exit(main())
