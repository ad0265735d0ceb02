"""Can qbench find an INT8 all-MiniLM-L6-v2 that is both faster and more accurate than ONNX Runtime's defaults?

Contenders, on recipes/minilm.yaml (seq 128; its evaluation sentences, slices and gate):
  fp32          the exported FP32 encoder
  ort-static    `quantize_static(fp32, out, reader)` with every default (minmax, QDQ, U8S8, all op types)
  ort-dynamic   `quantize_dynamic(fp32, out)` with every default (per-tensor S8 weights)
  qbench        the variant qbench's search picks on its own: calibrator auto + fallback to FP32
                per node until the recipe's gate holds (the sweep's results.json records the path)

Latency: one interleaved run; each round loads each contender in turn (one session alive at a time)
and times batch 1 and 16; medians over rounds. Accuracy: cosine vs FP32 per evaluation row,
mean / min overall and on the worst slice. With --profile, ORT's per-op profile of FP32 and the
qbench variant at batch 16 shows where the time goes.

    python bench/minilm_int8.py [--rounds 5] [--iterations 20] [--threads 2] [--max-excluded 6] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, quantize_dynamic, quantize_static
from rich.console import Console
from rich.table import Table

from qbench.environment import describe_environment
from qbench.preflight.prepare import Prepared, prepare
from qbench.recipe.spec import FallbackSpec, Recipe, VariantSpec, load_recipe
from qbench.sweep.runner import run_sweep
from qbench.validate.accuracy import evaluate_accuracy, run_batched
from qbench.validate.latency import take_batch
from qbench.variants.onnx_utils import quiet_stdout, scratch_dir

BATCH_SIZES = (1, 16)
GOAL = {"speedup_b16": 1.5, "mean_cosine": 0.995, "slice_cosine": 0.99}
console = Console()


class _Reader(CalibrationDataReader):
    def __init__(self, batches: list[dict[str, np.ndarray]]) -> None:
        self._batches = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)


def ort_defaults(prepared: Prepared, out: Path) -> dict[str, Path]:
    """ONNX Runtime's two one-call quantizers with nothing but their defaults (run in a scratch folder:
    ORT leaves shape-inference temp files in the working directory)."""
    fp32 = prepared.source.onnx_path
    paths = {"ort-static": out / "ort-static.onnx", "ort-dynamic": out / "ort-dynamic.onnx"}
    with scratch_dir("qbench-bench-"), quiet_stdout():
        quantize_static(fp32, paths["ort-static"], _Reader(list(prepared.calibration_batches)))
        quantize_dynamic(fp32, paths["ort-dynamic"])
    return paths


def qbench_search(recipe: Recipe, out: Path, max_excluded: int) -> tuple[Path, dict[str, Any]]:
    """Sweep the recipe with one searched INT8 variant; returns its model and its record in results.json."""
    variant = VariantSpec(name="qbench-int8", precision="int8", calibrator="auto", per_channel=True,
                          op_types=["MatMul"], fallback=FallbackSpec(max_excluded=max_excluded))  # fmt: skip
    searched = recipe.model_copy(update={"variants": [variant], "output_dir": out})
    outcome = run_sweep(searched, track=False)
    result = outcome.results.find("qbench-int8", recipe.backends[0])
    if result is None or result.status != "ok" or result.model_path is None:
        raise SystemExit(f"the qbench search failed: {result.error if result else 'no result'}")
    record = {"params": result.params, "notes": list(result.notes), "results": str(outcome.results_path),
              "gate": outcome.gate.status_of("qbench-int8", recipe.backends[0])}  # fmt: skip
    return Path(result.model_path), record


def session(path: Path, threads: int, profile_prefix: str | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def p50_ms(sess: ort.InferenceSession, batch: dict[str, np.ndarray], warmup: int, iterations: int) -> float:
    for _ in range(warmup):
        sess.run(None, batch)
    durations = []
    for _ in range(iterations):
        start = time.perf_counter_ns()
        sess.run(None, batch)
        durations.append((time.perf_counter_ns() - start) / 1e6)
    return float(np.percentile(durations, 50))


def interleaved_latency(models: dict[str, Path], feeds: dict[str, np.ndarray],
                        args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    """Per contender and batch size: the p50 of every round and their median."""
    batches = {b: take_batch(feeds, b) for b in BATCH_SIZES}
    rounds: dict[str, dict[int, list[float]]] = {name: {b: [] for b in BATCH_SIZES} for name in models}
    for index in range(args.rounds):
        for name, path in models.items():
            sess = session(path, args.threads)
            for b, batch in batches.items():
                rounds[name][b].append(p50_ms(sess, batch, args.warmup, args.iterations))
            del sess
        console.print(f"round {index + 1}/{args.rounds}: " + ", ".join(f"{n} {r[16][-1]:.1f} ms"
                                                                       for n, r in rounds.items()))
    return {name: {f"b{b}": {"rounds_p50_ms": v, "p50_ms": statistics.median(v)} for b, v in per.items()}
            for name, per in rounds.items()}  # fmt: skip


def accuracy(models: dict[str, Path], prepared: Prepared, threads: int) -> dict[str, Any]:
    """Cosine vs FP32 per contender: mean / min overall, and the worst slice by mean cosine."""
    feeds, batch_size = prepared.evaluation_feeds, prepared.recipe.data.evaluation.batch_size
    outputs = {}
    for name, path in models.items():
        sess = session(path, threads)
        outputs[name] = run_batched(_Runner(sess), feeds, batch_size, prepared.output_index, description=name)
        del sess
    found = {}
    for name, values in outputs.items():
        result = evaluate_accuracy("embedding", values, outputs["fp32"], None, prepared.slices)
        worst = min(result.slices, key=lambda s: s.metrics["cosine"])
        found[name] = {"mean_cosine": result.overall.metrics["cosine"],
                       "min_cosine": result.overall.metrics["cosine_min"],
                       "worst_slice": worst.name, "worst_slice_cosine": worst.metrics["cosine"],
                       "worst_slice_min_cosine": worst.metrics["cosine_min"]}  # fmt: skip
    return found


class _Runner:
    def __init__(self, sess: ort.InferenceSession) -> None:
        self._sess = sess

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self._sess.run(None, dict(feeds))


def op_profile(path: Path, feeds: dict[str, np.ndarray], threads: int, runs: int = 10) -> dict[str, Any]:
    """ORT's own profile at batch 16: share of kernel time per op type (what the INT8 graph really runs)."""
    with tempfile.TemporaryDirectory() as tmp:
        sess = session(path, threads, profile_prefix=os.path.join(tmp, "profile"))
        batch = take_batch(feeds, 16)
        for _ in range(runs):
            sess.run(None, batch)
        events = json.loads(Path(sess.end_profiling()).read_text())
    per_op: Counter[str] = Counter()
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            per_op[event["args"]["op_name"]] += event["dur"]
    total = sum(per_op.values())
    return {op: {"ms_per_run": us / runs / 1000, "share": us / total} for op, us in per_op.most_common(12)}


def report(latency: dict[str, Any], cosines: dict[str, Any]) -> dict[str, Any]:
    table = Table(title="all-MiniLM-L6-v2, seq 128: speed vs FP32 (median "
                        "p50 of interleaved rounds) and cosine vs FP32")
    for column in ("contender", "b1 ms", "b16 ms", "speed b1", "speed b16", "mean cos", "min cos", "worst slice"):
        table.add_column(column, justify="left" if column in ("contender", "worst slice") else "right")
    summary = {}
    for name, per in latency.items():
        speed = {b: latency["fp32"][b]["p50_ms"] / per[b]["p50_ms"] for b in per}
        c = cosines[name]
        summary[name] = {"speedup_b1": speed["b1"], "speedup_b16": speed["b16"], **c}
        table.add_row(name, f"{per['b1']['p50_ms']:.1f}", f"{per['b16']['p50_ms']:.1f}", f"{speed['b1']:.2f}×",
                      f"{speed['b16']:.2f}×", f"{c['mean_cosine']:.4f}", f"{c['min_cosine']:.4f}",
                      f"{c['worst_slice']} {c['worst_slice_cosine']:.4f}")  # fmt: skip
    console.print(table)
    ours = summary["qbench"]
    goal = {
        "speedup_b16": ours["speedup_b16"] >= GOAL["speedup_b16"],
        "mean_cosine": ours["mean_cosine"] >= GOAL["mean_cosine"],
        "slice_cosine": ours["worst_slice_cosine"] >= GOAL["slice_cosine"],
        "beats_ort_defaults": all(ours["speedup_b16"] > summary[o]["speedup_b16"]
                                  and ours["mean_cosine"] > summary[o]["mean_cosine"]
                                  for o in ("ort-static", "ort-dynamic")),
    }  # fmt: skip
    console.print("goal: " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in goal.items()))
    return {"summary": summary, "goal": goal}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=Path("recipes/minilm.yaml"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-excluded", type=int, default=6)
    parser.add_argument("--profile", action="store_true", help="add ORT's per-op profile of fp32 and qbench")
    parser.add_argument("--out", type=Path, default=Path("bench/out/minilm_int8.json"))
    args = parser.parse_args()

    started = time.perf_counter()
    work = (args.out.parent / "minilm_int8").resolve()
    work.mkdir(parents=True, exist_ok=True)
    recipe = load_recipe(args.recipe)
    prepared = prepare(recipe)
    best, search = qbench_search(recipe, work, args.max_excluded)
    models = {"fp32": prepared.source.onnx_path, **ort_defaults(prepared, work), "qbench": best}
    cosines = accuracy(models, prepared, args.threads)
    latency = interleaved_latency(models, prepared.evaluation_feeds, args)
    outcome = report(latency, cosines)
    profile = ({n: op_profile(models[n], prepared.evaluation_feeds, args.threads) for n in ("fp32", "qbench")}
               if args.profile else None)
    write_record(args, started, {"goal": GOAL},
                 {**outcome, "latency": latency, "qbench_search": search, "profile": profile})  # fmt: skip
    return 0


def write_record(args: argparse.Namespace, started: float, settings: dict[str, Any], body: dict[str, Any]) -> None:
    """Write the bench's JSON to args.out: settings, environment, load average, wall time, then `body`."""
    load = os.getloadavg()
    console.print(f"load average during the run: {load[0]:.1f} (a busy machine makes every latency figure noisy)")
    record = {
        "settings": {**{k: str(v) for k, v in vars(args).items()}, "batch_sizes": list(BATCH_SIZES), **settings},
        "environment": describe_environment(), "load_average": load, "seconds": time.perf_counter() - started,
        **body,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2, default=str))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    raise SystemExit(main())
