"""The keep-float ranking covers every node a base quantized, also those the static build it is ranked on leaves
float: ONNX Runtime's dynamic INT8 lowers an LSTM (DynamicQuantizeLSTM), which `ort-static` (Conv, MatMul, Gemm) does
not touch."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.backends import get_backend
from qbench.recipe.spec import load_recipe
from qbench.search import ranking
from qbench.search import run as search_run
from qbench.search.budget import Budget
from qbench.search.candidates import Candidate
from qbench.sweep.runner import run_sweep
from qbench.variants import BuildContext, build_variant
from tests.explain.test_output import amplifying_mlp
from tests.explain.test_sensitivity import SEARCH_BUDGET_S, write_fragile_project

WIDTH, HIDDEN, CLASSES = 6, 16, 3


def lstm_model(path):
    """x [batch, WIDTH] as a sequence of one step -> LSTM (only its last hidden state named, Y left unnamed) -> a
    Gemm head: the Gemm is all a static build quantizes; dynamic INT8 quantizes the LSTM too."""
    rng = np.random.default_rng(5)
    weights = {"w": rng.normal(size=(1, 4 * HIDDEN, WIDTH)), "r": rng.normal(size=(1, 4 * HIDDEN, HIDDEN)) / 4,
               "b": rng.normal(size=(1, 8 * HIDDEN)) / 10, "head_w": rng.normal(size=(HIDDEN, CLASSES)),
               "head_b": np.zeros(CLASSES)}  # fmt: skip
    nodes = [helper.make_node("Unsqueeze", ["x", "axis0"], ["seq"], name="to_seq"),
             helper.make_node("LSTM", ["seq", "w", "r", "b"], ["", "h"], name="lstm", hidden_size=HIDDEN),
             helper.make_node("Squeeze", ["h", "axis0"], ["last"], name="last"),
             helper.make_node("Gemm", ["last", "head_w", "head_b"], ["y"], name="head")]  # fmt: skip
    initializers = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    initializers.append(numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0"))
    graph = helper.make_graph(nodes, "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", CLASSES])],
                              initializer=initializers)  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def test_a_dynamic_base_that_quantizes_an_lstm_can_keep_the_lstm_float(tmp_path):
    """Ranked on the static build alone (the Gemm only), the dynamic base's LSTM could never be kept float: its
    keep-float candidates would keep the head float and leave the LSTM's noise in place."""
    lstm_model(tmp_path / "model.onnx")
    ctx = BuildContext(tmp_path / "model.onnx", tmp_path / "build", [])
    base = build_variant(Candidate("ort-dynamic").spec("base"), ctx)
    feeds = {"x": np.random.default_rng(0).normal(size=(12, WIDTH)).astype(np.float32)}
    search = object.__new__(search_run._Search)
    search.ctx, search.built, search.root = SimpleNamespace(reference_path=tmp_path / "model.onnx"), {0: base}, tmp_path
    search.backend, search.screen = get_backend("onnxruntime-cpu"), SimpleNamespace(feeds=feeds)
    search.prepared = SimpleNamespace(recipe=SimpleNamespace(latency=SimpleNamespace(threads=1)), batch=None)
    search.budget = Budget(60, lambda: 0.0, 3)
    search.refusal = lambda what, seconds, **_: "time budget spent"  # no measuring past it, the static ranking's part
    search.ranking_notes = []
    assert search.base_ranking(0, ["head"], {"head"}) == (["head"], 2)
    search.refusal = lambda what, seconds, **_: None
    ranked, quantized = search.base_ranking(0, ["head"], {"head"})  # what the static build ranks: its one Gemm
    assert quantized == 2 and sorted(ranked) == ["head", "lstm"]
    keeping = build_variant(Candidate("ort-dynamic", keep_float=("lstm",)).spec("kept"), ctx)
    assert "DynamicQuantizeLSTM" not in {n.op_type for n in onnx.load(str(keeping.onnx_path)).graph.node}


def test_a_base_is_not_measured_again_for_a_node_the_ranked_build_quantized_but_could_not_measure(tmp_path):
    """The static build's own base, whose Gemm the ranking left out (its noise not measurable: NaN), quantizes nothing
    the ranked build did not: ranking it again would run both models over the screening rows for the same answer.
    Before, any base with a node missing from the ranking was measured again, that build's own included."""
    lstm_model(tmp_path / "model.onnx")
    batches = [{"x": np.random.default_rng(1).normal(size=(8, WIDTH)).astype(np.float32)}]
    static = build_variant(Candidate("ort-static").spec("static"), BuildContext(tmp_path / "model.onnx",
                                                                                tmp_path / "build", batches))
    search = object.__new__(search_run._Search)
    search.ctx, search.built = SimpleNamespace(reference_path=tmp_path / "model.onnx"), {0: static}
    measured, search.refusal = [], lambda what, seconds, **_: None
    search.budget = Budget(60, lambda: 0.0, 3)
    search._ranked = lambda built, work: measured.append(built.name) or ["head"]
    assert search.base_ranking(0, [], {"head"}) == ([], 1) and measured == []
    assert search.base_ranking(0, [], set()) == (["head"], 1) and measured == ["static"]  # nothing ranked: its own


def _amplifying_search(tmp_path, monkeypatch):
    """The INT8 search, ort-static only, at most one node kept float, over `amplifying_mlp` with the fragile project's
    data. The gate lies between the drops: agreement falls by about 0.2 with every node quantized or the head kept
    float, by about 0.02 with the first layer kept float."""
    path = write_fragile_project(tmp_path, [], gate={"metric": "agreement", "max_drop": 0.1, "max_slice_drop": 0.15})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "qbench_cache"))  # a search of its own, not a stored one
    amplifying_mlp(tmp_path / "model.onnx")
    raw = yaml.safe_load(path.read_text())
    raw["search"] = {"time_budget_s": SEARCH_BUDGET_S, "techniques": ["ort-static"], "max_keep_float": 1}
    raw["gate"]["unresolved"] = "note"  # its 48 selection rows resolve no share-of-rows tolerance (test_run.py)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return run_sweep(load_recipe(path), track=False).results.search


def test_keeping_the_node_whose_noise_the_head_amplifies_float_passes(tmp_path, monkeypatch):
    """Ranked by the noise each node adds where it computes, the head came first (it amplifies the first layer's noise,
    and keeping it float leaves that noise in place): the search said "unreachable". Ranked by the noise each causes at
    the outputs, the first layer comes first and keeping it float passes; the report says which ranking was used."""
    report = _amplifying_search(tmp_path / "outputs", monkeypatch)
    print([(c.label, c.keep_float, c.stage, c.verdict) for c in report.candidates], report.notes)
    assert report.outcome == "passed" and report.candidates[report.chosen].keep_float == ("first",)
    assert any("by the noise each causes at the model's outputs" in note for note in report.notes)
    monkeypatch.setattr(ranking, "OUTPUT_SHARE", 0.0)  # never affordable: the per-layer ranking, as before
    report = _amplifying_search(tmp_path / "local", monkeypatch)
    assert report.outcome == "unreachable"
    assert {c.keep_float for c in report.candidates if c.keep_float} == {("head",)}  # each base kept the head float
    assert any("per-layer SQNR): no time was left" in note for note in report.notes)
