"""What does qbench cost when the model's output is wide? Wall time and peak memory of a sweep per row count.

bench/scale.py measures a wide table with a 4-class output; here the table is narrow (64 float features, one
slice column of 20 values) and the output is wide, so what grows is the evaluation of the outputs: the metrics,
the outputs kept for the agreement with FP32, the per-row figures, the results. Two models, built with
onnx.helper so that inference is cheap:

  classifier   x (rows, 64) -> MatMul -> Softmax over 1,000 classes, with a label
  embedding    x (rows, 64) -> MatMul -> Tanh, 384 floats (task: embedding, nearest-neighbour agreement: past
               task_options.nn_queries rows, 10,000 by default, a sample of query rows each searched among all rows)

Each case runs `python -m qbench.cli sweep --no-track` (FP32, FP16 and dynamic INT8; 20 latency iterations at
batch 32) in its own process: wall seconds and peak RSS from wait4, the interpreter and imports included. The tables
are written by a spawned process: a forked child's peak RSS counts its parent's at the fork, so a parent that had
generated a large table would inflate every figure after it. Compare two checkouts by running this script with
PYTHONPATH pointing at each.

    python bench/scale_outputs.py [--classifier-rows 20000 100000] [--embedding-rows 5000 20000 100000]
                                  [--out bench/out/scale_outputs.json]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_output import write_json  # noqa: E402

FEATURES = 64
SHAPES = {"classifier": (1000, "Softmax"), "embedding": (384, "Tanh")}

RECIPE = """\
name: scale-{case}
task: {task}
model: {{path: {case}.onnx}}
data:
  path: {case}-{rows}.parquet
  inputs: {{x: x}}
{label}  evaluation: {{batch_size: 256}}
  slices: [{{by: region}}]
variants:
  - {{name: fp16, precision: fp16}}
  - {{name: int8-dynamic, precision: int8, calibrator: dynamic}}
backends: [onnxruntime-cpu]
latency: {{batch_sizes: [32], warmup: 2, iterations: 20, threads: null}}
gate: {{max_drop: 0.5, max_slice_drop: 0.5}}
analysis: {{ranges: false}}
output_dir: reports
"""


def make_model(path: Path, case: str, rng: np.random.Generator) -> np.ndarray:
    """x (rows, 64) -> op(x W): the weights W, scaled so the outputs are spread (not all one class or all ±1)."""
    width, op = SHAPES[case]
    weights = (rng.normal(size=(FEATURES, width)) / np.sqrt(FEATURES)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node(op, ["h"], ["y"])]
    graph = helper.make_graph(
        nodes, f"scale_{case}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, width])], [numpy_helper.from_array(weights, "W")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return weights


def write_case(folder: Path, case: str, rows: int) -> Path:
    """The model, a table of `rows` rows and its recipe in `folder`; the recipe's path."""
    rng = np.random.default_rng(0)
    weights = make_model(folder / f"{case}.onnx", case, rng)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    table = pd.DataFrame({"x": list(x), "region": rng.choice([f"r{i:02d}" for i in range(20)], rows)})
    label = ""
    if case == "classifier":
        noise = rng.normal(scale=0.5, size=(rows, weights.shape[1])).astype(np.float32)
        table["label"] = (x @ weights + noise).argmax(axis=1).astype(np.int64)
        label = "  label: label\n"
    table.to_parquet(folder / f"{case}-{rows}.parquet")
    task = "classification" if case == "classifier" else "embedding"
    recipe = folder / f"{case}-{rows}.yaml"
    recipe.write_text(RECIPE.format(case=case, task=task, rows=rows, label=label))
    return recipe


def run_sweep(recipe: Path) -> dict:
    """One `python -m qbench.cli sweep --no-track` process: wall seconds, peak RSS (MiB) and exit code."""
    start = time.perf_counter()
    with open(recipe.parent / "bench.log", "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "qbench.cli", "sweep", recipe.name, "--no-track"],
                                   cwd=recipe.parent, stdout=log, stderr=log)  # fmt: skip
        _, status, usage = os.wait4(process.pid, 0)
    return {"wall_s": round(time.perf_counter() - start, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "exit_code": os.waitstatus_to_exitcode(status)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classifier-rows", type=int, nargs="*", default=[20_000, 100_000])
    parser.add_argument("--embedding-rows", type=int, nargs="*", default=[5_000, 20_000, 100_000])
    parser.add_argument("--out", type=Path, default=Path("bench/out/scale_outputs.json"))
    args = parser.parse_args()
    console = Console()
    import qbench

    results = []
    with tempfile.TemporaryDirectory(prefix="qbench-scale-outputs-") as tmp:
        folder = Path(tmp)
        for case, counts in (("classifier", args.classifier_rows), ("embedding", args.embedding_rows)):
            for rows in counts:
                with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                    recipe = pool.submit(write_case, folder, case, rows).result()
                figures = run_sweep(recipe)
                results.append({"case": case, "rows": rows, **figures})
                console.print(f"{case} {rows:,} rows: {figures}")
        if any(r["exit_code"] != 0 for r in results):
            console.print((folder / "bench.log").read_text()[-4000:])
    table = Table(title=f"qbench sweep, wide outputs ({Path(qbench.__file__).parent})")
    for column in ("case", "rows", "wall s", "peak RSS MiB", "exit"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for r in results:
        table.add_row(r["case"], f"{r['rows']:,}", f"{r['wall_s']:.2f}", f"{r['peak_rss_mib']:.0f}",
                      str(r["exit_code"]))  # fmt: skip
    console.print(table)
    write_json(args.out, {"qbench": str(Path(qbench.__file__).parent), "results": results}, console)
    return 1 if any(r["exit_code"] != 0 for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
