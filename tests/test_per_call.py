"""Inputs of one value per call ([1] beside an input whose axis 0 is dynamic): fed their rows' one value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.errors import QbenchError
from qbench.per_call import fed_per_call, per_call_inputs, per_call_value

WEIGHT = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)


def test_an_input_of_shape_1_beside_dynamic_rows_is_one_value_per_call() -> None:
    """ONNX Runtime names a dynamic dim ('batch') or gives None, ModelInfo None; a model whose inputs all fix axis 0
    (a fixed batch of 1) has none: its [1] is the rows."""
    assert per_call_inputs({"x": ["batch", 4], "t": [1], "n": [1, 4], "s": []}) == {"t"}
    assert per_call_inputs({"x": (None, 4), "t": (1,)}) == {"t"}
    assert per_call_inputs({"x": [1, 4], "t": [1]}) == frozenset()


def test_a_call_is_fed_its_rows_one_value_and_rows_of_two_values_are_refused() -> None:
    feeds = {"x": np.zeros((3, 4), np.float32), "t": np.full(3, 2.0, np.float32)}
    fed = fed_per_call(feeds, {"t"})
    assert fed["t"].shape == (1,) and fed["t"][0] == 2.0 and fed["x"] is feeds["x"]
    assert fed_per_call(feeds, ()) is feeds
    with pytest.raises(QbenchError, match=r"'t' \[1\] .* the 3 rows of this call hold 2 different values \(1.0, 2.0\)"):
        per_call_value("t", np.array([2.0, 1.0, 2.0]))


def _temperature_project(tmp_path: Path) -> Path:
    """probs = Softmax((x @ W) / t), t [1] beside x ['batch', 4]; labels are probs at t = 2, a regression target."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Div", ["h", "t"], ["z"]),
         helper.make_node("Softmax", ["z"], ["probs"], axis=-1)], "temperature",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("t", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(WEIGHT, "w")])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "model.onnx"))
    x = np.random.default_rng(1).normal(size=(96, 4)).astype(np.float32)
    z = x @ WEIGHT / 2.0
    probs = np.exp(z - z.max(axis=1, keepdims=True))
    np.savez(tmp_path / "rows.npz", x=x, t=np.full(96, 2.0, np.float32), y=probs / probs.sum(axis=1, keepdims=True))
    recipe = {"name": "temperature", "task": "regression", "model": {"path": "model.onnx"},
              "data": {"path": "rows.npz", "inputs": {"x": "x", "t": "t"}, "label": "y",
                       "calibration": {"samples": 16}, "evaluation": {"batch_size": 32}},
              "variants": [{"name": "fp16", "precision": "fp16"},
                           {"name": "int8", "precision": "int8", "calibrator": "minmax"}],
              "latency": {"batch_sizes": [1, 8], "warmup": 1, "iterations": 3}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return tmp_path / "recipe.yaml"


def test_a_model_with_a_temperature_of_one_value_per_call_sweeps_at_every_batch_size(tmp_path: Path) -> None:
    """The dry run failed at a batch of 64 ('Got: 64 Expected: 1', exit 2) and the line said to set every batch size to
    1; the sweep now runs batches of 32 and 8, each fed t once, FP32 matching the labels computed at t = 2."""
    from qbench import run_sweep

    outcome = run_sweep(_temperature_project(tmp_path), track=False)
    by_name = {v.variant: v for v in outcome.results.variants}
    assert {name: v.status for name, v in by_name.items()} == {"fp32": "ok", "fp16": "ok", "int8": "ok"}
    assert by_name["fp32"].accuracy.overall.metrics["max_error"] < 1e-6
    assert [p.batch_size for p in by_name["int8"].latency.points] == [1, 8]


def test_rows_all_nan_are_one_value_per_call() -> None:
    fed = per_call_value("t", np.full((4, 1), np.nan, dtype=np.float32))
    assert fed.shape == (1, 1) and np.isnan(fed).all()
    with pytest.raises(QbenchError, match="hold 2 different values"):
        per_call_value("t", np.array([[np.nan], [1.0]], dtype=np.float32))
