"""A searched model whose weights are all in layers no technique lowers (a recurrent layer): the search keeps no
variant and says where the weights are, not that the graph has none."""

from __future__ import annotations

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.gate.evaluate import EXIT_UNUSABLE
from qbench.recipe.spec import load_recipe
from qbench.sweep.runner import run_sweep
from tests.explain.test_sensitivity import SEARCH_BUDGET_S, WIDTH, write_fragile_project

HIDDEN = 4


def gru_model(path):
    """x [batch, WIDTH] as a sequence of one step -> GRU -> its last hidden state [batch, 4]: every weight is the
    GRU's, and no quantizer the search uses lowers a GRU."""
    rng = np.random.default_rng(3)
    weights = {"w": rng.normal(size=(1, 3 * HIDDEN, WIDTH)) / 4, "r": rng.normal(size=(1, 3 * HIDDEN, HIDDEN)) / 4,
               "b": rng.normal(size=(1, 6 * HIDDEN)) / 10}  # fmt: skip
    nodes = [helper.make_node("Unsqueeze", ["x", "axis0"], ["seq"], name="to_seq"),
             helper.make_node("GRU", ["seq", "w", "r", "b"], ["", "h"], name="gru", hidden_size=HIDDEN),
             helper.make_node("Squeeze", ["h", "axis0"], ["y"], name="last")]  # fmt: skip
    initializers = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    initializers.append(numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0"))
    graph = helper.make_graph(nodes, "gru", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", HIDDEN])],
                              initializer=initializers)  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def test_a_model_whose_weights_are_all_in_a_gru_is_told_where_its_weights_are(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_fragile_project(tmp_path, [])
    gru_model(tmp_path / "model.onnx")
    raw = yaml.safe_load(path.read_text())
    raw["search"] = {"time_budget_s": SEARCH_BUDGET_S}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    outcome = run_sweep(load_recipe(path), track=False)
    report = outcome.results.search
    assert report.outcome == "nothing built" and {c.stage for c in report.candidates} == {"not applicable"}
    error = outcome.results.find("int8-search", "onnxruntime-cpu").error
    assert "found nothing to quantize" in error and "its weights are in 1 GRU" in error
    assert "no MatMul, Gemm or Conv with constant weights" not in error
    assert outcome.gate.exit_code == EXIT_UNUSABLE
