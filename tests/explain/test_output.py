"""The noise each quantized node causes at the model's outputs (qbench.explain.output), against the noise it adds where
it computes (per-layer SQNR), on a 3-layer MLP whose head amplifies its first layer's noise.

`amplifying_mlp` is shared with tests/search/test_ranking.py (tests/ is on sys.path: no __init__.py files).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.backends import get_backend
from qbench.backends.base import RunOptions
from qbench.explain.graph import quantized_nodes, sqnr_costs
from qbench.explain.output import bypassable, merged_order, output_effects
from qbench.search.candidates import Candidate
from qbench.variants import BuildContext, build_variant
from qbench.variants.onnx_utils import load_model

WIDTH, CLASSES = 16, 4
OUTLIER = 50.0  # the input channel scaled up before `first`: per-tensor INT8 rounds the others in steps of about 1


def amplifying_mlp(path: Path) -> Path:
    """x [batch, WIDTH] (about N(0, 1)) -> channel 0 times OUTLIER -> MatMul `first` -> MatMul `middle` (identity) ->
    + 8 -> Relu -> MatMul `head` -> y [batch, CLASSES].

    `first` undoes the scale: each hidden channel is 2 x0 (common to all, clean: x0's rounding is small beside its
    range) plus a random mix of x1..x15, which the coarse rounding of its input makes noisy. The head's columns are
    +-1, as many of each (exact in INT8), so the common part cancels and only the noisy mix reaches y: its output's
    noise ratio is far above its input's (where the common part dominates), so per-layer SQNR blames the head; but
    that noise is `first`'s, and only keeping `first` float removes it."""
    rng = np.random.default_rng(0)
    first = np.zeros((WIDTH, WIDTH))
    first[0, :] = 2.0 / OUTLIER
    first[1:, :] = rng.normal(scale=0.25, size=(WIDTH - 1, WIDTH))
    scale = np.ones(WIDTH)
    scale[0] = OUTLIER
    head = np.array([rng.permutation([1.0, -1.0] * (WIDTH // 2)) for _ in range(CLASSES)]).T
    weights = {"s": scale, "w1": first, "w2": np.eye(WIDTH), "b2": np.full(WIDTH, 8.0), "w3": head}
    nodes = [helper.make_node("Mul", ["x", "s"], ["xs"], name="scale"),
             helper.make_node("MatMul", ["xs", "w1"], ["h1"], name="first"),
             helper.make_node("MatMul", ["h1", "w2"], ["m2"], name="middle"),
             helper.make_node("Add", ["m2", "b2"], ["a2"], name="bias"),
             helper.make_node("Relu", ["a2"], ["h2"], name="relu"),
             helper.make_node("MatMul", ["h2", "w3"], ["y"], name="head")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "amplifying_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", CLASSES])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _rows(seed: int, count: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).normal(size=(count, WIDTH)).astype(np.float32)}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("amplifying")
    model = amplifying_mlp(root / "model.onnx")
    return model, build_variant(Candidate("ort-static").spec("static"),
                                BuildContext(model, root / "build", [_rows(1, 96)]))  # fmt: skip


def test_the_first_layer_costs_most_at_the_outputs_where_per_layer_sqnr_blames_the_head(built, tmp_path):
    model, static = built
    backend, options, feeds = get_backend("onnxruntime-cpu"), RunOptions(threads=1), _rows(2, 48)
    nodes = quantized_nodes(load_model(model), static)
    groups = {n.name: [n] for n in nodes}
    local = sqnr_costs(model, static, nodes, [feeds], backend, options, tmp_path)
    effects = output_effects(model, static, groups, feeds, backend, options, tmp_path / "work", None, math.inf)
    print(f"per-layer SQNR {local}; at the outputs {effects.costs}")
    assert local["head"] > 5 * local["first"]  # the old ranking: the head first
    assert effects.costs["first"] > 5 * max(effects.costs["head"], effects.costs["middle"])
    local_order = sorted(local, key=lambda n: -local[n])
    assert local_order[0] == "head" and merged_order(local_order, effects.costs)[0] == "first"
    assert effects.bypassable == 3 and effects.predicted_s > 0
    assert "at the model's outputs" in effects.describe(3, "nodes")
    assert list((tmp_path / "work").iterdir()) == []  # every candidate's file removed


def test_past_its_allowance_nothing_is_measured_and_the_note_says_per_layer_sqnr(built, tmp_path):
    model, static = built
    nodes = quantized_nodes(load_model(model), static)
    effects = output_effects(model, static, {n.name: [n] for n in nodes}, _rows(2, 8), get_backend("onnxruntime-cpu"),
                             RunOptions(threads=1), tmp_path, None, 1e-9)  # fmt: skip
    assert effects.costs == {} and effects.bypassable == 3 and effects.predicted_s > 1e-9
    note = effects.describe(3, "nodes")
    assert "per-layer SQNR" in note and "past the 1e-09 s allowed" in note


def test_a_dynamic_build_has_nothing_to_bypass(built, tmp_path):
    model, _ = built
    dynamic = build_variant(Candidate("ort-dynamic").spec("dynamic"), BuildContext(model, tmp_path, []))
    nodes = quantized_nodes(load_model(model), dynamic)
    assert nodes and bypassable(dynamic, load_model(dynamic.onnx_path), {n.name: [n] for n in nodes}) == []
    effects = output_effects(model, dynamic, {n.name: [n] for n in nodes}, _rows(2, 8), get_backend("onnxruntime-cpu"),
                             RunOptions(threads=1), tmp_path / "work", None, math.inf)  # fmt: skip
    assert effects.costs == {} and "none of its 3 nodes can be bypassed" in effects.describe(len(nodes), "nodes")


def test_merged_order_refills_the_measured_places_and_leaves_the_others_where_they_were():
    local = ["a", "b", "c", "d"]  # b and d could not be bypassed; e was not measurable where it computes
    costs = {"a": 0.1, "c": 0.5, "e": 0.2, "f": math.nan}
    assert merged_order(local, costs) == ["c", "b", "e", "d", "a"]
    assert merged_order(local, {}) == local


def test_explain_sqnr_ranks_as_the_search_does_and_says_so(tmp_path, monkeypatch):
    """`qbench explain --method sqnr` ranks by the noise at the outputs too: the first layer, not the head."""
    from test_sensitivity import INT8, write_fragile_project

    from qbench.explain.sensitivity import explain_variant
    from qbench.recipe.spec import load_recipe

    monkeypatch.chdir(tmp_path)
    path = write_fragile_project(tmp_path, [INT8])
    amplifying_mlp(tmp_path / "model.onnx")
    result = explain_variant(load_recipe(path), "int8", method="sqnr", track=False)
    print([(c.group, c.nsr, c.share) for c in result.costs], result.notes)
    assert [c.group for c in result.costs][0] == "first" and result.costs[0].share > 0.9
    assert any(note.startswith("ranked by the noise each causes at the model's outputs") for note in result.notes)
