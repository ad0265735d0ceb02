"""How much does qbench itself cost? Two measurements, side by side in one run.

1. Timing fidelity: qbench's steady-state p50 (backend runner + measure_steady_state) against a
   bare runtime loop on the same model, the same threads and the same batch, interleaved over several
   rounds: for onnxruntime-cpu InferenceSession.run under perf_counter_ns (the digits CNN); for torch-cpu
   the module's forward under torch.inference_mode, inputs already tensors (a small MLP and a small
   conv net, each as FP32, FP16, BF16 and torchao INT8 dynamic). A ratio near 1.0 means qbench's
   latency figures are the runtime's, not qbench's. Then what the cold start and the real server run per batch
   (`served call`: numpy in, numpy out, qbench.backends.base.served_call) against a bare server's call (ONNX
   Runtime's run; torch's forward on torch.from_numpy, .numpy() of its output, inference_mode entered once), and
   the cold start (`served cold`: load + first served call, one per round) against a bare load + first call.
2. Sweep overhead: the share of a whole demo sweep spent outside variant building (calibration
   included) and inference (the runs of the model: scoring, timing, real serving runs) — data preparation, the load
   simulation, reporting, plotting, MLflow logging — in a sweep whose tracking store already exists (its one-time
   creation is not counted).
   Each demo is swept from the library without MLflow and with the recipe's sqlite store (interleaved
   rounds; MLflow's cost is also given as the median paired difference of wall times), and as a
   `qbench sweep` process (whose wall time also holds the interpreter's start and the imports; qbench's modules are
   compiled to bytecode first, as an installed package's are).
   The digits CNN always; the MiniLM search demo with --minilm (about 5 minutes).

    python bench/overhead.py [--rounds 5] [--iterations 300] [--torch-iterations 50] [--threads 2] [--minilm]
                             [--out bench/out/overhead.json]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from rich.console import Console
from rich.table import Table

from qbench.backends import get_backend
from qbench.backends.base import RunOptions, served_call, timed_load
from qbench.demo.digits import make_digits_demo
from qbench.demo.minilm import write_text_sets
from qbench.recipe.spec import VariantSpec, load_recipe
from qbench.sweep.runner import run_sweep
from qbench.validate.latency import measure_cold_start, measure_steady_state
from qbench.variants import BuiltVariant
from qbench.variants.torch_forms import TorchForm, torch_form_for

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


def qbench_p50_ms(backend: str, variant: BuiltVariant, batch: np.ndarray, threads: int, warmup: int,
                  iterations: int) -> float:  # fmt: skip
    """The same measurement through qbench's backend and latency loop."""
    runner = get_backend(backend).load(variant, RunOptions(threads=threads))
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
            ours.append(qbench_p50_ms("onnxruntime-cpu", BuiltVariant("fp32", "fp32", model), batch, threads, warmup,
                                      iterations))  # fmt: skip
        rows.append(_fidelity_row("onnxruntime-cpu", "digits CNN", batch_size, bare, ours, iterations, threads))
    return rows


class SmallMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                          torch.nn.ReLU(), torch.nn.Linear(128, 10))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class SmallConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                                            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
                                            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())  # fmt: skip
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


TORCH_MODELS = {"mlp": (SmallMLP, (64,)), "conv": (SmallConv, (1, 8, 8))}  # model -> (class, one row's shape)
TORCH_VARIANTS = {"fp32": {}, "fp16": {}, "bf16": {}, "int8": {"calibrator": "dynamic"}}  # int8: torchao dynamic


@dataclass(frozen=True)
class _Seeded:
    """What torch_form_for needs of a torch model: a fresh module (the same weights each time) per build()."""

    cls: type[torch.nn.Module]

    def build(self) -> torch.nn.Module:
        torch.manual_seed(0)
        return self.cls().eval()


def torch_variant(root: Path, model: str, precision: str) -> BuiltVariant:
    """The variant's torch form as qbench builds it (qbench.variants.torch_forms), with the ONNX file that names
    the module's input."""
    cls, row = TORCH_MODELS[model]
    onnx_path = root / f"{model}.onnx"
    if not onnx_path.exists():
        torch.onnx.export(_Seeded(cls).build(), (torch.zeros(1, *row),), str(onnx_path), input_names=["input"],
                          dynamic_axes={"input": {0: "batch"}}, dynamo=False)  # fmt: skip
    form = torch_form_for(VariantSpec(name=precision, precision=precision, **TORCH_VARIANTS[precision]), _Seeded(cls))
    assert isinstance(form, TorchForm), form
    return BuiltVariant(precision, precision, onnx_path, torch_module=lambda: form.transform(_Seeded(cls).build()))


def bare_torch_p50_ms(variant: BuiltVariant, batch: np.ndarray, threads: int, warmup: int, iterations: int) -> float:
    """The reference: the module's forward alone, inputs already tensors of its dtype, under inference_mode."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        module = variant.torch_module()
        dtype = next(module.parameters()).dtype
        inputs = torch.from_numpy(batch).to(dtype if dtype.is_floating_point else torch.float32)
        durations = np.empty(iterations, dtype=np.int64)
        with torch.inference_mode():
            for _ in range(warmup):
                module(inputs)
            for i in range(iterations):
                start = time.perf_counter_ns()
                module(inputs)
                durations[i] = time.perf_counter_ns() - start
    finally:
        torch.set_num_threads(previous)
    return float(np.percentile(durations, 50) / 1e6)


def torch_fidelity(root: Path, rounds: int, threads: int, warmup: int, iterations: int) -> list[dict]:
    """torch-cpu's rows of the fidelity table: each small model and precision at each batch size, interleaved."""
    rng = np.random.default_rng(0)
    rows = []
    for model, (_, row) in TORCH_MODELS.items():
        for precision in TORCH_VARIANTS:
            variant = torch_variant(root, model, precision)
            for batch_size in BATCH_SIZES:
                batch = rng.random((batch_size, *row), dtype=np.float32)
                bare, ours = [], []
                for _ in range(rounds):
                    bare.append(bare_torch_p50_ms(variant, batch, threads, warmup, iterations))
                    ours.append(qbench_p50_ms("torch-cpu", variant, batch, threads, warmup, iterations))
                rows.append(_fidelity_row("torch-cpu", f"{model} {precision}", batch_size, bare, ours, iterations,
                                          threads))  # fmt: skip
    return rows


def _median_call_ms(call, feeds: dict[str, np.ndarray], warmup: int, iterations: int) -> float:
    for _ in range(warmup):
        call(feeds)
    durations = np.empty(iterations, dtype=np.int64)
    for i in range(iterations):
        start = time.perf_counter_ns()
        call(feeds)
        durations[i] = time.perf_counter_ns() - start
    return float(np.percentile(durations, 50) / 1e6)


def _bare(backend: str, variant: BuiltVariant, threads: int):
    """A bare server's per-batch call, numpy in and numpy out: ONNX Runtime's run; for torch the module's forward on
    torch.from_numpy, its output's .numpy(), inside inference_mode entered once (the caller's)."""
    if backend == "onnxruntime-cpu":
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(variant.onnx_path), options, providers=["CPUExecutionProvider"])
        return lambda feeds: session.run(None, feeds)
    torch.set_num_threads(threads)
    module = variant.torch_module()
    return lambda feeds: module(torch.from_numpy(feeds["input"])).numpy()


def served_fidelity(backend: str, model: str, variant: BuiltVariant, row: tuple[int, ...], rounds: int, threads: int,
                    warmup: int, iterations: int) -> list[dict]:  # fmt: skip
    """What the cold start and the real server time per batch (qbench.backends.base.served_call) against a bare
    server's call, and the cold start (load + first served call) against a bare load + first call; interleaved."""
    rng = np.random.default_rng(0)
    rows = []
    previous = torch.get_num_threads()
    for batch_size in BATCH_SIZES:
        feeds = {"input": rng.random((batch_size, *row), dtype=np.float32)}
        figures: dict[str, list[float]] = {"bare_call": [], "qbench_call": [], "bare_cold": [], "qbench_cold": []}
        for _ in range(rounds):
            start = time.perf_counter_ns()
            with torch.inference_mode():
                bare = _bare(backend, variant, threads)
                bare(feeds)
                figures["bare_cold"].append((time.perf_counter_ns() - start) / 1e6)
                figures["bare_call"].append(_median_call_ms(bare, feeds, warmup, iterations))
            del bare
            load = timed_load(get_backend(backend), variant, RunOptions(threads=threads))
            runner, create_ms, first_ms = measure_cold_start(load, feeds, batch_size)
            figures["qbench_cold"].append(create_ms + first_ms)
            try:
                with served_call(runner) as call:
                    figures["qbench_call"].append(_median_call_ms(call, feeds, warmup, iterations))
            finally:
                runner.close()
        torch.set_num_threads(previous)
        for what in ("call", "cold"):
            row_ = _fidelity_row(backend, f"{model} served {what}", batch_size, figures[f"bare_{what}"],
                                 figures[f"qbench_{what}"], iterations if what == "call" else 1, threads)  # fmt: skip
            rows.append(row_)
    return rows


def _fidelity_row(backend: str, model: str, batch_size: int, bare: list[float], ours: list[float], iterations: int,
                  threads: int) -> dict:
    bare_p50, ours_p50 = statistics.median(bare), statistics.median(ours)
    return {"backend": backend, "model": model, "batch_size": batch_size, "bare_p50_ms": bare_p50,
            "qbench_p50_ms": ours_p50, "ratio": ours_p50 / bare_p50, "rounds": len(bare), "iterations": iterations,
            "threads": threads}  # fmt: skip


def _split(timings: dict[str, float], wall_s: float) -> dict:
    outside = wall_s - timings.get("build", 0.0) - timings.get("inference", 0.0)
    return {**timings, "wall_s": wall_s, "outside_build_and_inference_s": outside,
            "overhead_fraction": outside / wall_s}  # fmt: skip


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
        shutil.copytree(REPO / "recipes", root / "recipes", ignore=shutil.ignore_patterns("reports"),
                        dirs_exist_ok=True)  # fmt: skip
        write_text_sets(root / "calibration" / "minilm")


def sweep_overheads(root: Path, demos: list[str], rounds: int) -> list[dict]:
    """Per demo: library sweeps without MLflow and with the recipe's sqlite store and `qbench sweep` processes,
    interleaved over `rounds` (the digits demo; MiniLM once), medians (the store is created by a first sweep, not
    counted), the MLflow row with the median paired difference of wall times."""
    rows = []
    for name in demos:
        prepare_demo(root, name)
        library_sweep(root, name, track=True)
        kinds = {"library, no MLflow": False, "library, MLflow": True}
        measured: dict[str, list[dict]] = {how: [] for how in (*kinds, "qbench sweep process")}
        for _ in range(rounds if name == "digits" else 1):
            for how, track in kinds.items():
                measured[how].append(library_sweep(root, name, track=track))
            measured["qbench sweep process"].append(cli_sweep(root, name))
        untracked = _median_row(measured["library, no MLflow"])
        tracked = measured["library, MLflow"]
        added = statistics.median(a["wall_s"] - b["wall_s"] for a, b in zip(tracked, measured["library, no MLflow"],
                                                                          strict=True))  # fmt: skip
        by_difference = (untracked["outside_build_and_inference_s"] + added) / (untracked["wall_s"] + added)
        rows.append({"demo": name, "how": "library, no MLflow", **untracked})
        rows.append({"demo": name, "how": "library, MLflow", **_median_row(tracked), "mlflow_adds_s": added,
                     "overhead_by_difference": by_difference})  # fmt: skip
        rows.append({"demo": name, "how": "qbench sweep process", **_median_row(measured["qbench sweep process"])})
    return rows


def compile_bytecode() -> None:
    """qbench's modules compiled to bytecode, as an installed package has them (pip compiles a wheel's modules): an
    editable install under PYTHONDONTWRITEBYTECODE=1 compiles every module again in each process, a cost of the
    checkout, not of qbench."""
    compileall.compile_dir(REPO / "qbench", quiet=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--torch-warmup", type=int, default=10)
    parser.add_argument("--torch-iterations", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--minilm", action="store_true", help="also the MiniLM search demo (about 5 minutes)")
    parser.add_argument("--out", type=Path, default=Path("bench/out/overhead.json"))
    args = parser.parse_args()

    console = Console(width=150)
    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="qbench-bench-") as tmp:
        root = Path(tmp)
        make_digits_demo(root)
        fidelity = timing_fidelity(root / "models" / "digits.onnx", args.rounds, args.threads, args.warmup,
                                   args.iterations)  # fmt: skip
        fidelity += torch_fidelity(root, args.rounds, args.threads, args.torch_warmup, args.torch_iterations)
        digits = BuiltVariant("fp32", "fp32", root / "models" / "digits.onnx")
        fidelity += served_fidelity("onnxruntime-cpu", "digits CNN", digits, (1, 8, 8), args.rounds, args.threads,
                                    args.warmup, args.iterations)  # fmt: skip
        fidelity += served_fidelity("torch-cpu", "conv fp32", torch_variant(root, "conv", "fp32"), (1, 8, 8),
                                    args.rounds, args.threads, args.torch_warmup, args.torch_iterations)  # fmt: skip
        overheads = sweep_overheads(root, ["digits", "minilm"] if args.minilm else ["digits"], args.rounds)

    table = Table(title="qbench p50 vs a bare runtime loop (medians of interleaved rounds)")
    for column in ("backend", "model", "batch", "bare p50 ms", "qbench p50 ms", "ratio"):
        table.add_column(column, justify="left" if column in ("backend", "model") else "right")
    for row in fidelity:
        table.add_row(row["backend"], row["model"], str(row["batch_size"]), f"{row['bare_p50_ms']:.4f}",
                      f"{row['qbench_p50_ms']:.4f}", f"{row['ratio']:.3f}")  # fmt: skip
    console.print(table)
    phases = Table(title="demo sweeps: wall time by phase, s (tracking store already created)")
    columns = ("prepare", "build", "inference", "simulation", "ranges", "report", "track")
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
                          "paired difference); overhead counted that way: "
                          f"{row['overhead_by_difference']:.1%}")  # fmt: skip

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"timing_fidelity": fidelity, "sweeps": overheads}, indent=2))
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
