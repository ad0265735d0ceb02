"""An A/A test of the sweep's latency verdicts: variants that compute exactly what FP32 computes, at the same cost.

Each A-variant is FP32's graph re-saved with an Identity inserted (on the output, `aa-out`, or on the input,
`aa-in`): another file, another graph digest, so the sweep times it as a variant of its own (a re-save that only
renames nodes, or copies the bytes, is detected as identical and never timed; it is listed too, as `copy`).
Three models of different cost (the digits demo CNN, an MLP of ~0.2 / 0.6 ms, an MLP of ~4 / 12 ms at batch 1 / 32)
are swept `--rounds` times each, one sweep at a time, without MLflow. Per sweep, A-variant and batch size: its
speed-up vs FP32 (FP32 p50 / its p50), the p99 ratio, the two points' window spreads, the noise margin the report
judges "faster" by (`qbench.frontier.pareto.timing_margin`), the CPUs other processes kept busy while each was timed
(in the JSON) and whether the A-variant sits on the frontier without FP32
(a false "faster"). A variant computing the same thing at the same cost should be as fast as FP32 within that
margin, with no systematic direction (it is always timed after FP32).

    python bench/aa_latency.py [--rounds 5] [--out bench/out/aa_latency.json]

The A-variant technique is registered in this process only (`TECHNIQUES.register`), as any extension is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench import load_recipe, run_sweep
from qbench.demo.digits import make_digits_demo
from qbench.frontier.pareto import timing_margin
from qbench.techniques import TECHNIQUES
from qbench.techniques.base import Technique
from qbench.techniques.floats import FloatCast
from qbench.variants.base import BuiltVariant

A_VARIANTS = ("aa-out", "aa-in")


def build_aa(spec, ctx) -> BuiltVariant:
    """FP32's graph with an Identity on its first output (`aa-out`) or first input (`aa-in`): the same arithmetic."""
    model = onnx.load(str(ctx.reference_path))
    graph = model.graph
    if spec.name == "aa-in":
        old, new = graph.input[0].name, graph.input[0].name + "__aa"
        for node in graph.node:
            node.input[:] = [new if name == old else name for name in node.input]
        graph.node.insert(0, helper.make_node("Identity", [old], [new], name="aa_identity"))
    else:
        old, new = graph.output[0].name, graph.output[0].name + "__aa"
        for node in graph.node:
            node.output[:] = [new if name == old else name for name in node.output]
        graph.node.append(helper.make_node("Identity", [new], [old], name="aa_identity"))
    path = Path(ctx.workdir) / f"{spec.name}.onnx"
    onnx.save(model, str(path))
    return BuiltVariant(name=spec.name, precision="fp32", onnx_path=path, params={"aa": spec.name})


def _mlp(dims: list[int], path: Path, rng: np.random.Generator) -> None:
    nodes, weights, current = [], [], "x"
    for i, (n_in, n_out) in enumerate(zip(dims, dims[1:])):
        last = i == len(dims) - 2
        weights += [numpy_helper.from_array((rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32),
                                            f"w{i}"),
                    numpy_helper.from_array(np.zeros(n_out, np.float32), f"b{i}")]  # fmt: skip
        out = "logits" if last else f"h{i}"
        nodes.append(helper.make_node("Gemm", [current, f"w{i}", f"b{i}"], [out if last else out + "_pre"]))
        if not last:
            nodes.append(helper.make_node("Relu", [out + "_pre"], [out]))
        current = out
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", dims[0]])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", dims[-1]])],
                              weights)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def _recipe(folder: Path, name: str, model: Path, data: Path, inputs: dict, slice_by: str) -> Path:
    recipe = {
        "name": name, "task": "classification", "model": {"path": str(model)},
        "data": {"path": str(data), "inputs": inputs, "label": "label",
                 "calibration": {"filter": {"split": "calib"}, "samples": 64},
                 "evaluation": {"filter": {"split": "eval"}}, "slices": [{"by": slice_by}]},
        "variants": [{"name": "fp32", "precision": "fp32"},
                     *({"name": a, "precision": "fp32", "technique": "aa-copy"} for a in A_VARIANTS),
                     {"name": "copy", "precision": "fp32", "technique": "fp32"}],
        "backends": ["onnxruntime-cpu"], "latency": {"batch_sizes": [1, 32], "warmup": 20, "iterations": 200},
        "analysis": {"ranges": False}, "output_dir": str(folder / "reports"),
    }  # fmt: skip
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def make_recipes(folder: Path) -> list[Path]:
    digits = make_digits_demo(folder / "digits")
    recipes = [_recipe(folder, "aa-digits", digits["model"], digits["data"], {"pixels": "input"}, "condition")]
    rng = np.random.default_rng(0)
    for name, dims in (("aa-mlp-small", [512, 1024, 1024, 1024, 10]), ("aa-mlp-large", [1024, 4096, 4096, 4096, 10])):
        model, data = folder / f"{name}.onnx", folder / f"{name}.parquet"
        _mlp(dims, model, rng)
        rows = 600
        pd.DataFrame({"x": list(rng.standard_normal((rows, dims[0])).astype(np.float32)),
                      "label": rng.integers(0, dims[-1], rows),
                      "split": np.where(np.arange(rows) < 200, "calib", "eval"),
                      "half": np.where(np.arange(rows) % 2 == 0, "a", "b")}).to_parquet(data)  # fmt: skip
        recipes.append(_recipe(folder, name, model, data, {"x": "x"}, "half"))
    return recipes


def rows_of(name: str, results) -> list[dict]:
    reference = results.find(results.reference, "onnxruntime-cpu")
    frontier = {(p.batch_size, p.variant) for p in results.frontier}
    found = []
    for variant in results.variants:
        if variant.variant not in A_VARIANTS or variant.latency is None:
            continue
        for point in variant.latency.points:
            theirs = reference.latency.at(point.batch_size)
            found.append({
                "model": name, "variant": variant.variant, "batch": point.batch_size,
                "speedup": theirs.p50_ms / point.p50_ms, "p99_ratio": theirs.p99_ms / point.p99_ms,
                "spread": point.spread, "fp32_spread": theirs.spread,
                "margin": timing_margin(point.spread, theirs.spread),
                "others_cpus": point.others_cpus, "fp32_others_cpus": theirs.others_cpus,
                "false_faster": (point.batch_size, variant.variant) in frontier
                and (point.batch_size, results.reference) not in frontier,
            })  # fmt: skip
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/out/aa_latency.json"))
    args = parser.parse_args()
    TECHNIQUES.register("aa-copy", Technique(FloatCast, build_aa))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in make_recipes(Path(tmp)):
            for sweep in range(args.rounds):
                outcome = run_sweep(load_recipe(recipe), track=False)
                rows += [{**row, "sweep": sweep} for row in rows_of(recipe.stem, outcome.results)]
    print(f"{'model':13} {'variant':7} {'batch':>5} {'speed-up min/median/max':>24} {'p99 ratio median':>16} "
          f"{'margin median':>13} {'beyond margin':>13} {'false faster':>12}")  # fmt: skip
    summary = []
    for key in sorted({(r["model"], r["variant"], r["batch"]) for r in rows}):
        group = [r for r in rows if (r["model"], r["variant"], r["batch"]) == key]
        speedups = [r["speedup"] for r in group]
        beyond = sum(abs(r["speedup"] - 1) > r["margin"] for r in group)
        false_faster = sum(r["false_faster"] for r in group)
        summary.append({"model": key[0], "variant": key[1], "batch": key[2], "speedups": speedups,
                        "beyond_margin": beyond, "false_faster": false_faster})  # fmt: skip
        print(f"{key[0]:13} {key[1]:7} {key[2]:>5} {min(speedups):8.3f} {statistics.median(speedups):7.3f} "
              f"{max(speedups):7.3f} {statistics.median(r['p99_ratio'] for r in group):16.3f} "
              f"{statistics.median(r['margin'] for r in group):13.3f} {beyond:>8}/{len(group)} "
              f"{false_faster:>7}/{len(group)}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
