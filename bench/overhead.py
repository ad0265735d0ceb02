"""How much does qbench itself cost? Two measurements, side by side in one run.

1. Timing fidelity: qbench's steady-state p50 (backend runner + measure_steady_state) against a
   bare ONNX Runtime loop (InferenceSession.run under perf_counter_ns) on the same model, the same
   threads and the same batch, interleaved over several rounds. A ratio near 1.0 means qbench's
   latency figures are the runtime's, not qbench's.
2. Sweep overhead: the share of a whole demo sweep spent outside variant building (calibration
   included) and inference — data preparation, scoring, load simulation, reporting, plotting, MLflow
   logging — in a sweep whose tracking store already exists (its one-time creation is not counted).
   Each demo is swept from the library without MLflow and with the recipe's sqlite store (interleaved
   rounds; MLflow's cost is also given as the median paired difference of wall times), and as a
   `qbench sweep` process (whose wall time also holds the interpreter's start and the imports).
   The digits CNN always; the MiniLM search demo with --minilm (about 5 minutes).

    python bench/overhead.py [--rounds 5] [--iterations 300] [--threads 2] [--minilm]
                             [--out bench/out/overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from rich.console import Console
from rich.table import Table

from qbench.backends import get_backend
from qbench.backends.base import RunOptions
from qbench.demo.digits import make_digits_demo
from qbench.demo.minilm import write_text_sets
from qbench.recipe import load_recipe
from qbench.sweep import run_sweep
from qbench.validate.latency import measure_steady_state
from qbench.variants import BuiltVariant

BATCH_SIZES = (1, 32)
REPO = Path(__file__).resolve().parents[1]


def bare_ort_p50_ms(model: Path, batch: np.ndarray, threads: int, warmup: int, iterations: int) -> float:
    """The reference: nothing but InferenceSession.run in a timed loop."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    feeds = {session.get_inputs()[0].name: batch}
    for _ in range(warmup):
        session.run(None, feeds)
    durations = np.empty(iterations, dtype=np.int64)
    for i in range(iterations):
        start = time.perf_counter_ns()
        session.run(None, feeds)
        durations[i] = time.perf_counter_ns() - start
    del session
    return float(np.percentile(durations, 50) / 1e6)


def qbench_p50_ms(model: Path, batch: np.ndarray, threads: int, warmup: int, iterations: int) -> float:
    """The same measurement through qbench's backend and latency loop."""
    backend = get_backend("onnxruntime-cpu")
    runner = backend.load(BuiltVariant("fp32", "fp32", model), RunOptions(threads=threads))
    try:
        [point] = measure_steady_state(runner, {"input": batch}, [len(batch)], warmup, iterations)
    finally:
        runner.close()
    return point.p50_ms


def timing_fidelity(model: Path, rounds: int, threads: int, warmup: int, iterations: int) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for batch_size in BATCH_SIZES:
        batch = rng.random((batch_size, 1, 8, 8), dtype=np.float32)
        bare, ours = [], []
        for _ in range(rounds):  # interleaved, one session alive at a time
            bare.append(bare_ort_p50_ms(model, batch, threads, warmup, iterations))
            ours.append(qbench_p50_ms(model, batch, threads, warmup, iterations))
        bare_p50, ours_p50 = statistics.median(bare), statistics.median(ours)
        rows.append({
            "batch_size": batch_size, "bare_ort_p50_ms": bare_p50, "qbench_p50_ms": ours_p50,
            "ratio": ours_p50 / bare_p50, "rounds": rounds, "iterations": iterations, "threads": threads,
        })  # fmt: skip
    return rows


def _split(timings: dict[str, float], wall_s: float) -> dict:
    outside = wall_s - timings.get("build", 0.0) - timings.get("inference", 0.0)
    return {**timings, "wall_s": wall_s, "outside_build_and_inference_s": outside, "overhead_fraction": outside / wall_s}


def library_sweep(root: Path, recipe_name: str, *, track: bool) -> dict:
    """run_sweep on the demo recipe (into the tracking store created beforehand, with `track`): its phases."""
    cwd = Path.cwd()
    os.chdir(root)
    try:
        timings = run_sweep(load_recipe(root / "recipes" / f"{recipe_name}.yaml"), track=track).results.timings
    finally:
        os.chdir(cwd)
    return _split(timings, timings["total"])


def _median_row(rows: list[dict]) -> dict:
    """Each figure's median over rounds."""
    return {key: statistics.median(row[key] for row in rows) if isinstance(rows[0][key], (int, float)) else rows[0][key]
            for key in rows[0]}  # fmt: skip


def cli_sweep(root: Path, recipe_name: str) -> dict:
    """`qbench sweep` as a user runs it, into the store the library sweeps created: the process's wall time."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "qbench.cli", "sweep", f"recipes/{recipe_name}.yaml"], cwd=root, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    wall = time.perf_counter() - started
    newest = max(root.glob("**/results.json"), key=lambda p: p.stat().st_mtime)
    return _split(json.loads(newest.read_text())["timings"], wall)


def prepare_demo(root: Path, name: str) -> None:
    if name == "digits":
        make_digits_demo(root)
    else:
        shutil.copytree(REPO / "recipes", root / "recipes", ignore=shutil.ignore_patterns("reports"), dirs_exist_ok=True)
        write_text_sets(root / "calibration" / "minilm")


def sweep_overheads(root: Path, demos: list[str], rounds: int) -> list[dict]:
    """Per demo: library sweeps without MLflow and with the recipe's sqlite store, interleaved over `rounds` (the
    digits demo; MiniLM once), medians (the store is created by a first sweep, not counted), the MLflow row with the
    median paired difference of wall times; then one `qbench sweep` process."""
    rows = []
    for name in demos:
        prepare_demo(root, name)
        library_sweep(root, name, track=True)
        kinds = {"library, no MLflow": False, "library, MLflow": True}
        measured: dict[str, list[dict]] = {how: [] for how in kinds}
        for _ in range(rounds if name == "digits" else 1):
            for how, track in kinds.items():
                measured[how].append(library_sweep(root, name, track=track))
        untracked = _median_row(measured["library, no MLflow"])
        tracked = measured["library, MLflow"]
        added = statistics.median(a["wall_s"] - b["wall_s"] for a, b in zip(tracked, measured["library, no MLflow"],
                                                                          strict=True))  # fmt: skip
        by_difference = (untracked["outside_build_and_inference_s"] + added) / (untracked["wall_s"] + added)
        rows.append({"demo": name, "how": "library, no MLflow", **untracked})
        rows.append({"demo": name, "how": "library, MLflow", **_median_row(tracked), "mlflow_adds_s": added,
                     "overhead_by_difference": by_difference})  # fmt: skip
        rows.append({"demo": name, "how": "qbench sweep process", **cli_sweep(root, name)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--minilm", action="store_true", help="also the MiniLM search demo (about 5 minutes)")
    parser.add_argument("--out", type=Path, default=Path("bench/out/overhead.json"))
    args = parser.parse_args()

    console = Console(width=150)
    with tempfile.TemporaryDirectory(prefix="qbench-bench-") as tmp:
        root = Path(tmp)
        make_digits_demo(root)
        fidelity = timing_fidelity(root / "models" / "digits.onnx", args.rounds, args.threads, args.warmup,
                                   args.iterations)  # fmt: skip
        overheads = sweep_overheads(root, ["digits", "minilm"] if args.minilm else ["digits"], args.rounds)

    table = Table(title="qbench p50 vs bare ONNX Runtime loop (digits CNN, medians of interleaved rounds)")
    for column in ("batch", "bare ORT p50 ms", "qbench p50 ms", "ratio"):
        table.add_column(column, justify="right")
    for row in fidelity:
        table.add_row(str(row["batch_size"]), f"{row['bare_ort_p50_ms']:.4f}", f"{row['qbench_p50_ms']:.4f}",
                      f"{row['ratio']:.3f}")  # fmt: skip
    console.print(table)
    phases = Table(title="demo sweeps: wall time by phase, s (tracking store already created)")
    columns = ("prepare", "build", "inference", "ranges", "report", "track")
    for column in ("demo", "how", *columns, "wall", "outside build + inference"):
        phases.add_column(column, justify="left" if column in ("demo", "how") else "right")
    for row in overheads:
        outside = f"{row['outside_build_and_inference_s']:.2f} ({row['overhead_fraction']:.1%})"
        phases.add_row(row["demo"], row["how"], *(f"{row.get(c, 0.0):.2f}" for c in columns), f"{row['wall_s']:.2f}",
                       outside)  # fmt: skip
    console.print(phases)
    for row in overheads:
        if "mlflow_adds_s" in row:
            console.print(f"{row['demo']}, {row['how']}: MLflow adds {row['mlflow_adds_s']:.2f} s of wall time (median "
                          f"paired difference); overhead counted that way: {row['overhead_by_difference']:.1%}")  # fmt: skip

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"timing_fidelity": fidelity, "sweeps": overheads}, indent=2))
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
