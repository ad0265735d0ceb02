"""What does qbench itself cost on a production-sized evaluation table? Wall time and peak memory per command.

Generates a table of --rows rows (default 500,000) in a temporary folder: an int64 id, 8 float features as one
list column, an epoch-milliseconds timestamp (an integer input beyond float32's exact range, as real feature
tables hold), a 4-class label, three slice columns (20, 10 and 50 values) and a calib/eval split; and a tiny MLP
(8 -> 16 -> 4, plus the timestamp, built with onnx.helper) whose inference is cheap, so what is measured is
qbench's own work: reading and checking the table, the slices, the metrics, the results, the gate. Then runs, each
as its own `python -m qbench.cli` process (peak RSS from wait4; the interpreter and imports included):

  validate   qbench validate (every check, FP32 on a few rows)
  sweep      qbench sweep --no-track with fp16 and int8 (minmax) beside FP32
  gate       qbench gate (re-reads the table, re-derives the slices, checks the inputs' digests)

on the Parquet table and, with --csv, the same table as CSV. Compare two checkouts by running this script with
PYTHONPATH pointing at each (the commands run whichever qbench the interpreter imports).

    python bench/scale.py [--rows 500000] [--csv] [--out bench/out/scale.json]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_output import write_json  # noqa: E402

FEATURES, HIDDEN, CLASSES = 8, 16, 4
COMMANDS = (("validate", ["validate"]), ("sweep", ["sweep", "--no-track"]), ("gate", ["gate"]))


def make_model(path: Path, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """x (rows, 8) and ts (rows, 1) -> scores (rows, 4): relu(x W1 + b1) W2 + b2 + ts * w3 (w3 tiny)."""
    weights = {
        "W1": rng.normal(size=(FEATURES, HIDDEN)).astype(np.float32),
        "b1": rng.normal(size=HIDDEN).astype(np.float32),
        "W2": rng.normal(size=(HIDDEN, CLASSES)).astype(np.float32),
        "b2": rng.normal(size=CLASSES).astype(np.float32),
        "w3": np.full((1, CLASSES), 1e-15, dtype=np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "W2"], ["h3"]),
        helper.make_node("Add", ["h3", "b2"], ["h4"]), helper.make_node("Mul", ["ts", "w3"], ["t1"]),
        helper.make_node("Add", ["h4", "t1"], ["scores"]),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "scale_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, FEATURES]),
         helper.make_tensor_value_info("ts", TensorProto.FLOAT, [None, 1])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, CLASSES])],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return weights


def make_table(rows: int, weights: dict[str, np.ndarray], rng: np.random.Generator) -> pd.DataFrame:
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    scores = np.maximum(x @ weights["W1"] + weights["b1"], 0) @ weights["W2"] + weights["b2"]
    label = (scores + rng.normal(scale=2.0, size=scores.shape)).argmax(1)
    return pd.DataFrame({
        "id": np.arange(rows, dtype=np.int64) + 10**12,
        "x": list(x),
        "ts": 1_700_000_000_000 + rng.integers(0, 10**9, rows),
        "label": label.astype(np.int64),
        "region": rng.choice([f"r{i:02d}" for i in range(20)], rows),
        "device": rng.choice([f"d{i}" for i in range(10)], rows),
        "segment": rng.integers(0, 50, rows),
        "split": np.where(rng.random(rows) < 0.02, "calib", "eval"),
    })  # fmt: skip


RECIPE = """\
name: scale
task: classification
model: {{path: model.onnx}}
data:
  path: {data}
  inputs: {{x: x, ts: ts}}
  label: label
  calibration: {{filter: {{split: calib}}, samples: 256, seed: 0}}
  evaluation: {{filter: {{split: eval}}}}
  slices: [{{by: region}}, {{by: device}}, {{by: segment}}]
variants:
  - {{name: fp16, precision: fp16}}
  - {{name: int8-minmax, precision: int8, calibrator: minmax}}
backends: [onnxruntime-cpu]
latency: {{batch_sizes: [1, 32], warmup: 5, iterations: 20, threads: null}}
gate: {{metric: accuracy, max_drop: 0.5, max_slice_drop: 0.5}}
analysis: {{ranges: false}}
output_dir: reports
"""


def write_case(folder: Path, rows: int, csv: bool) -> list[tuple[str, Path]]:
    """The model, the table (Parquet, and CSV with `csv`) and one recipe per table format."""
    rng = np.random.default_rng(0)
    weights = make_model(folder / "model.onnx", rng)
    table = make_table(rows, weights, rng)
    table.to_parquet(folder / "data.parquet")
    cases = [("parquet", folder / "parquet.yaml")]
    (folder / "parquet.yaml").write_text(RECIPE.format(data="data.parquet"))
    if csv:
        text = table.assign(x=["[" + ",".join(f"{v:.6g}" for v in row) + "]" for row in table["x"]])
        text.to_csv(folder / "data.csv", index=False)
        (folder / "csv.yaml").write_text(RECIPE.format(data="data.csv"))
        cases.append(("csv", folder / "csv.yaml"))
    return cases


def run_command(args: list[str], cwd: Path) -> dict:
    """One `python -m qbench.cli ...` process: wall seconds, peak RSS (MiB) and exit code."""
    start = time.perf_counter()
    with open(cwd / "bench.log", "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "qbench.cli", *args], cwd=cwd, stdout=log, stderr=log)
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return {"wall_s": round(time.perf_counter() - start, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "exit_code": process.returncode}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--csv", action="store_true", help="also measure the same table as CSV")
    parser.add_argument("--out", type=Path, default=Path("bench/out/scale.json"))
    args = parser.parse_args()
    console = Console()
    import qbench

    results = []
    with tempfile.TemporaryDirectory(prefix="qbench-scale-") as tmp:
        folder = Path(tmp)
        for fmt, recipe in write_case(folder, args.rows, args.csv):
            for name, command in COMMANDS:
                figures = run_command([*command, recipe.name], folder)
                results.append({"format": fmt, "command": name, **figures})
                console.print(f"{fmt} {name}: {figures}")
        failed = [r for r in results if r["exit_code"] != 0]
        if failed:
            console.print((folder / "bench.log").read_text()[-4000:])
    table = Table(title=f"qbench on {args.rows:,} rows ({Path(qbench.__file__).parent})")
    for column in ("table", "command", "wall s", "peak RSS MiB", "exit"):
        table.add_column(column, justify="right" if column not in ("table", "command") else "left")
    for r in results:
        table.add_row(r["format"], r["command"], f"{r['wall_s']:.2f}", f"{r['peak_rss_mib']:.0f}", str(r["exit_code"]))
    console.print(table)
    report = {"rows": args.rows, "qbench": str(Path(qbench.__file__).parent), "results": results}
    write_json(args.out, report, console)
    return 1 if any(r["exit_code"] != 0 for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
