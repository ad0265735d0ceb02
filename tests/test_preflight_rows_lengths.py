"""Outputs whose length depends on the data (NonMaxSuppression's detections, a TopK whose K is computed from the
scores), as detectors ship them: qbench reads one output row per input row and compares values one to one, so such
outputs are refused before anything is scored, with the op that makes them and what to evaluate instead; never
zero-filled to a common width, where padding would pass for values and a missing detection for agreement."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.cli_app import main
from qbench.errors import RecipeError
from qbench.modelinfo import read_model_info
from qbench.preflight_rows import check_row_independence
from qbench.recipe import load_recipe

BOXES, FEATURES, ROWS = 20, 8, 40
RNG = np.random.default_rng(0)
WEIGHT = numpy_helper.from_array(RNG.normal(size=(FEATURES, 5)).astype(np.float32), "w")
ROWS_FED = RNG.normal(size=(ROWS, BOXES, FEATURES)).astype(np.float32)
REMEDY = ("qbench compares outputs row by row and value by value, so an output whose length depends on the data "
          "(detections kept by NonMaxSuppression, NonZero, Compress, a TopK whose K is computed) cannot be judged: "
          "evaluate the tensors before that step (the raw boxes and scores: save the model with them among its outputs "
          "and name them in model.outputs), or export a fixed number per row (the top K, padded, with a count output)")  # fmt: skip


def _constants(**values: list) -> list:
    return [numpy_helper.from_array(np.array(v, np.float32 if isinstance(v[0], float) else np.int64), n)
            for n, v in values.items()]  # fmt: skip


def _scored(batch: int | str, nodes: list, output: onnx.ValueInfoProto, constants: list) -> onnx.ModelProto:
    """x [batch, BOXES, FEATURES] @ w -> p [batch, BOXES, 5]: 4 box coordinates and a logit, then `nodes`."""
    big = np.iinfo(np.int64).max
    head = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Slice", ["p", "s0", "e4"], ["boxes"]),
            helper.make_node("Slice", ["p", "s4", "e5"], ["logit"]), helper.make_node("Sigmoid", ["logit"], ["sc"])]
    weights = [WEIGHT, *_constants(s0=[0, 0, 0], e4=[big, big, 4], s4=[0, 0, 4], e5=[big, big, 5]), *constants]  # fmt: skip
    graph = helper.make_graph(head + nodes, "detector",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, BOXES, FEATURES])],
                              [output], weights)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _nms(batch: int | str) -> onnx.ModelProto:
    """NonMaxSuppression over the batch: selected [N, 3] (batch index, class, box) for the whole batch."""
    nodes = [helper.make_node("Transpose", ["sc"], ["scores"], perm=[0, 2, 1]),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "most", "iou", "threshold"], ["selected"])]
    return _scored(batch, nodes, helper.make_tensor_value_info("selected", TensorProto.INT64, ["N", 3]),
                   _constants(most=[100], iou=[0.5], threshold=[0.5]))  # fmt: skip


def _top(k: str) -> onnx.ModelProto:
    """Fixed batch 1: the indices of the top K scores [1, K]; K computed (the count above 0.5) or a constant 3."""
    nodes = [helper.make_node("Reshape", ["sc", "row"], ["flat"]), helper.make_node("Greater", ["flat", "half"], ["kept"]),
             helper.make_node("Cast", ["kept"], ["ones"], to=TensorProto.INT64),
             helper.make_node("ReduceSum", ["ones"], ["count"], keepdims=0),
             helper.make_node("Reshape", ["count", "one"], ["computed"]),
             helper.make_node("TopK", ["flat", k], ["values", "indices"], axis=1)]  # fmt: skip
    return _scored(1, nodes, helper.make_tensor_value_info("indices", TensorProto.INT64, [1, "K"]),
                   _constants(row=[1, BOXES], half=[0.5], one=[1], constant=[3]))  # fmt: skip


def _check(tmp_path: Path, model: onnx.ModelProto, batch: int | None) -> None:
    onnx.save(model, str(tmp_path / "m.onnx"))
    (tmp_path / "rows.parquet").write_bytes(b"")
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump({"name": "rows", "model": {"path": "m.onnx"}, "variants": [
        {"name": "fp16", "precision": "fp16"}], "data": {"path": "rows.parquet", "inputs": {"x": "x"}}}))  # fmt: skip
    feeds = {"x": ROWS_FED[:8]}
    output = model.graph.output[0].name
    check_row_independence(load_recipe(tmp_path / "recipe.yaml"), tmp_path / "m.onnx", read_model_info(tmp_path / "m.onnx"),
                           feeds, {output: 0}, batch)  # fmt: skip


@pytest.mark.parametrize("batch", ["batch", 1])
def test_detections_of_the_whole_batch_are_refused_naming_non_max_suppression(tmp_path: Path, batch: int | str) -> None:
    """[N, 3] detections for the batch: with a dynamic batch the error advised exporting 'batch-first'; with a fixed
    batch of 1 the check was skipped (one row cannot be reordered) and the first image's detections read as rows."""
    with pytest.raises(RecipeError) as caught:
        _check(tmp_path, _nms(batch), None if batch == "batch" else batch)
    message = str(caught.value)
    assert "\n" not in message and "output 'selected' had shape [" in message
    assert message.endswith(f"qbench reads axis 0 of every output as the batch, output 'selected' is computed "
                            f"through NonMaxSuppression: {REMEDY}")  # fmt: skip


def _project(root: Path, model: onnx.ModelProto) -> Path:
    root.mkdir()
    onnx.save(model, str(root / "m.onnx"))
    pd.DataFrame({"x": [row.ravel() for row in ROWS_FED]}).to_parquet(root / "rows.parquet")
    (root / "metrics.py").write_text("import numpy as np\n\ndef mean(outputs, labels):\n    return float(np.mean(outputs))\n")
    recipe = {"name": "top", "task": "structured", "model": {"path": "m.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "calibration": {"samples": 8}},
              "metrics": [{"name": "mean", "function": "metrics:mean", "higher_is_better": True}],
              "variants": [{"name": "fp16", "precision": "fp16"}], "output_dir": "reports"}  # fmt: skip
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return root / "recipe.yaml"


def test_a_per_row_length_computed_from_the_scores_is_refused_not_zero_filled(tmp_path: Path, capsys) -> None:
    """A fixed batch of 1 whose TopK keeps the boxes scoring above 0.5: each row's width is its own count. Its rows
    were zero-filled to the widest, so index 0 padded a missing box and validate said OK; a constant K passes."""
    session = ort.InferenceSession(_top("computed").SerializeToString(), providers=["CPUExecutionProvider"])
    widths = {session.run(None, {"x": row[None]})[0].shape[1] for row in ROWS_FED[:8]}
    assert len(widths) > 1  # the widths do differ between the rows validate runs
    recipe = _project(tmp_path / "computed", _top("computed"))
    assert main(["validate", str(recipe)]) == 2
    error = capsys.readouterr().err
    assert "output 'indices' gave rows of shape [" in error and "its rows must have one shape; " + REMEDY in error
    assert main(["validate", str(_project(tmp_path / "constant", _top("constant")))]) == 0
