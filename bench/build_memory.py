"""Peak memory and bytes written by each variant build of a large model, for one or two qbench trees side by side.

The model: a float32 MLP stack in the transformer's FFN shape (x -> MatMul up + Add -> Relu -> MatMul down + Add
-> + x, `--blocks` times, width `--width`, 4x hidden), saved with external data (~200 MB at the defaults). Each
build runs in a child process of its own: peak RSS is the child's VmHWM (what the kernel saw, protobuf's and
ORT's native allocations included; ru_maxrss would start from the parent's size at fork), "written" its /proc/self/io
write_bytes (bytes sent to the block layer by the build, the saved model and every temporary file included). The FP16
build also writes its CPU emulation (`<name>.emulated.onnx`), as a sweep scoring FP16 on CPU does.

    python bench/build_memory.py [--before /path/to/old/qbench/tree] [--blocks 6] [--width 1024] [--json out.json]

With --before, every build runs once with that tree's qbench and once with this one, alternately.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

BUILDS = {  # name -> VariantSpec fields
    "fp16": {"precision": "fp16"},
    "bf16": {"precision": "bf16"},
    "int8-dynamic": {"precision": "int8", "calibrator": "dynamic"},
    "int8-minmax": {"precision": "int8", "calibrator": "minmax"},
    "fp8": {"precision": "fp8", "calibrator": "minmax"},
    "smoothquant": {"precision": "int8", "calibrator": "minmax", "smoothquant": {"alpha": 0.5}},
}
ROWS, BATCHES = 8, 2


def make_model(path: Path, blocks: int, width: int) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, current = [], [], "x"
    for block in range(blocks):
        for name, shape in (("up", (width, 4 * width)), ("down", (4 * width, width))):
            weights.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.02).astype(np.float32),
                                                   f"b{block}.{name}.w"))  # fmt: skip
            weights.append(numpy_helper.from_array(np.zeros(shape[1], np.float32), f"b{block}.{name}.b"))
        p = f"b{block}"
        nodes += [
            helper.make_node("MatMul", [current, f"{p}.up.w"], [f"{p}.up.mm"], name=f"{p}/up/MatMul"),
            helper.make_node("Add", [f"{p}.up.mm", f"{p}.up.b"], [f"{p}.up"], name=f"{p}/up/Add"),
            helper.make_node("Relu", [f"{p}.up"], [f"{p}.act"], name=f"{p}/Relu"),
            helper.make_node("MatMul", [f"{p}.act", f"{p}.down.w"], [f"{p}.down.mm"], name=f"{p}/down/MatMul"),
            helper.make_node("Add", [f"{p}.down.mm", f"{p}.down.b"], [f"{p}.down"], name=f"{p}/down/Add"),
            helper.make_node("Add", [current, f"{p}.down"], [f"{p}.out"], name=f"{p}/residual"),
        ]
        current = f"{p}.out"
    nodes.append(helper.make_node("Identity", [current], ["y"], name="out"))
    graph = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, str(path), save_as_external_data=True, location=f"{path.name}.data")


def child(build: str, model: str, workdir: str, width: int) -> None:
    """Build `build` of `model` into `workdir` and print {"peak_rss": bytes, "written": bytes} (run in a child)."""
    from qbench.recipe.spec import VariantSpec
    from qbench.variants import build_variant
    from qbench.variants.base import BuildContext

    rng = np.random.default_rng(1)
    calibration = [{"x": rng.standard_normal((ROWS, width)).astype(np.float32)} for _ in range(BATCHES)]
    built = build_variant(VariantSpec(name=build, **BUILDS[build]),
                          BuildContext(Path(model), Path(workdir), calibration))  # fmt: skip
    if build == "fp16":
        from qbench.variants.emulate import save_float16_emulation

        save_float16_emulation(built.onnx_path)
    io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    peak = int(status["VmHWM"].split()[0]) * 1024
    print(json.dumps({"peak_rss": peak, "written": int(io["write_bytes"])}))


def measure(tree: Path, build: str, model: Path, width: int) -> dict[str, int]:
    workdir = Path(tempfile.mkdtemp(prefix=f"build-memory-{build}-", dir=model.parent))
    try:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run([sys.executable, __file__, "--child", build, str(model), str(workdir), str(width)],
                              env=env, cwd=tree, capture_output=True, text=True, check=False)  # fmt: skip
        if done.returncode:
            return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"rc {done.returncode}"}
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="another qbench tree to measure side by side")
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--builds", nargs="*", default=list(BUILDS))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--make", nargs=3, metavar=("MODEL", "BLOCKS", "WIDTH"), help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=4, metavar=("BUILD", "MODEL", "WORKDIR", "WIDTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make:  # in a process of its own: the children would start from this one's size
        make_model(Path(args.make[0]), int(args.make[1]), int(args.make[2]))
        return
    if args.child:
        child(*args.child[:3], int(args.child[3]))
        return
    trees = {"after": Path(__file__).resolve().parents[1]}
    if args.before:
        trees = {"before": args.before.resolve(), **trees}
    with tempfile.TemporaryDirectory(prefix="build-memory-") as folder:
        model = Path(folder) / "ffn.onnx"
        subprocess.run([sys.executable, __file__, "--make", str(model), str(args.blocks), str(args.width)], check=True)
        size = sum(f.stat().st_size for f in Path(folder).iterdir())
        print(f"model: {size / 1e6:.0f} MB ({args.blocks} blocks, width {args.width})")
        results: dict[str, dict[str, dict[str, int]]] = {}
        for build in args.builds:
            results[build] = {label: measure(tree, build, model, args.width) for label, tree in trees.items()}
            row = "  ".join(f"{label}: " + (f"peak {r['peak_rss'] / 1e6:6.0f} MB  written {r['written'] / 1e6:6.0f} MB"
                                              if "error" not in r else r["error"])
                                              for label, r in results[build].items())  # fmt: skip
            print(f"{build:13s} {row}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"model_bytes": size, "builds": results}, indent=2))


if __name__ == "__main__":
    main()
