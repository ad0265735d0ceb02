"""Fallback on nodes that matter only together: keeping either one in FP32 recovers nothing, keeping both passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qbench.gate.evaluate import EXIT_PASS
from qbench.recipe.spec import load_recipe
from qbench.sweep.runner import run_sweep
from tests.explain.test_sensitivity import INT8, NOTED_GATE, OUTLIER, WIDTH, write_fragile_project

MILD = 4.0  # the side path's outlier: a little noise, which keeping `side` in FP32 alone removes


def together_model(path: Path) -> Path:
    """x -> mm1 -> Relu -> +1 -> two copies of one fragile branch (branch_a, branch_b) -> Max, plus a side path
    x -> side -> Add -> head -> y[4].

    Each branch multiplies channel 0 by OUTLIER before its MatMul (whose weights undo it), so per-tensor INT8 rounds
    the other channels (all >= 1) to zero; their weights are negative, so the INT8 branch reads higher than FP32's
    everywhere and the Max takes it: with one branch back in FP32 the Max still reads the other, and only both in FP32
    recover the output. `side` has a milder outlier: it and mm1 are nodes whose FP32 version alone helps, so a ranking
    by single recoveries puts one of them first."""
    rng = np.random.default_rng(0)
    scale, branch = np.ones(WIDTH), -np.abs(rng.normal(size=(WIDTH, WIDTH))) / 4
    scale[0], branch[0, :] = OUTLIER, rng.normal(size=WIDTH) / 4 / OUTLIER
    side_scale, side = np.ones(WIDTH), rng.normal(size=(WIDTH, WIDTH)) / 4
    side_scale[0], side[0, :] = MILD, side[0, :] / MILD
    weights = {"w1": rng.normal(size=(WIDTH, WIDTH)) / 4, "s": scale, "wb": branch, "ss": side_scale, "ws": side,
               "w3": rng.normal(size=(WIDTH, 4)) / 4, "one": np.ones(1)}  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
             helper.make_node("Relu", ["h1"], ["r0"], name="relu"),
             helper.make_node("Add", ["r0", "one"], ["r1"], name="shift")]  # fmt: skip
    for b in ("a", "b"):
        nodes += [helper.make_node("Mul", ["r1", "s"], [f"o_{b}"], name=f"scale_{b}"),
                  helper.make_node("MatMul", [f"o_{b}", "wb"], [f"h_{b}"], name=f"branch_{b}")]  # fmt: skip
    nodes += [helper.make_node("Max", ["h_a", "h_b"], ["m"], name="join"),
              helper.make_node("Mul", ["x", "ss"], ["xs"], name="side_scale"),
              helper.make_node("MatMul", ["xs", "ws"], ["hs"], name="side"),
              helper.make_node("Add", ["m", "hs"], ["h2"], name="sum"),
              helper.make_node("MatMul", ["h2", "w3"], ["y"], name="head")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "together", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_fallback_finds_two_nodes_that_only_help_together(tmp_path, monkeypatch):
    """Ranked by one-node recoveries (mm1, branch_a, branch_b, side, head), the first two in FP32 left 100 % of the
    noise and the fallback was skipped as unreachable ('100% of its output noise would stay with 2 nodes in FP32'),
    though keeping branch_a and branch_b in FP32 passes. Pairs are now tried when the singles stall."""
    max_excluded = 2
    monkeypatch.chdir(tmp_path)
    variants = [{**INT8, "fallback": {"max_excluded": max_excluded}},
                {**INT8, "name": "int8-pair", "exclude_nodes": ["branch_a", "branch_b"]}]  # fmt: skip
    path = write_fragile_project(tmp_path, variants, gate=NOTED_GATE)
    together_model(tmp_path / "model.onnx")
    outcome = run_sweep(load_recipe(path), track=False)
    pair = outcome.results.find("int8-pair", "onnxruntime-cpu")
    result = outcome.results.find("int8", "onnxruntime-cpu")
    print(result.params.get("fallback.ranking"), result.params.get("fallback.skipped"), result.params["search.steps"])
    assert outcome.gate.status_of("int8-pair", "onnxruntime-cpu") == "pass", pair.accuracy.overall.drops
    assert result.params["search.outcome"] == "passed" and {"branch_a", "branch_b"} <= set(result.params["exclude_nodes"])
    assert result.params["fallback.together"] == {"minmax": ["branch_a", "branch_b"]}
    assert outcome.gate.exit_code == EXIT_PASS
