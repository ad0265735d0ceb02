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

from qbench.cli.app import main
from qbench.errors import RecipeError
from qbench.modelinfo.signature import read_model_info
from qbench.preflight.lengths import unfixed_length
from qbench.preflight.rows import check_row_independence
from qbench.recipe.spec import load_recipe

BOXES, FEATURES, ROWS = 20, 8, 40
RNG = np.random.default_rng(0)
WEIGHT = numpy_helper.from_array(RNG.normal(size=(FEATURES, 5)).astype(np.float32), "w")
ROWS_FED = RNG.normal(size=(ROWS, BOXES, FEATURES)).astype(np.float32)
REMEDY = ("qbench compares outputs row by row and value by value, so an output whose length depends on the data "
          "(detections kept by NonMaxSuppression, NonZero, Compress, a TopK whose K is computed) cannot be judged: "
          "evaluate the tensors before that step (the raw boxes and scores: save the model with them among its outputs "
          "and name them in model.outputs), or export a fixed "
          "number per row (the top K, padded, with a count output)")  # fmt: skip


def _constants(**values: list) -> list:
    return [numpy_helper.from_array(np.array(v, np.float32 if isinstance(v[0], float) else np.int64), n)
            for n, v in values.items()]  # fmt: skip


def _scored(batch: int | str, nodes: list, output: onnx.ValueInfoProto, constants: list) -> onnx.ModelProto:
    """x [batch, BOXES, FEATURES] @ w -> p [batch, BOXES, 5]: 4 box coordinates and a logit, then `nodes`."""
    big = np.iinfo(np.int64).max
    head = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Slice", ["p", "s0", "e4"], ["boxes"]),
            helper.make_node("Slice", ["p", "s4", "e5"], ["logit"]), helper.make_node("Sigmoid", ["logit"], ["sc"])]
    weights = [WEIGHT, *_constants(s0=[0, 0, 0], e4=[big, big, 4], s4=[0, 0, 4], e5=[big, big, 5]),
               *constants]  # fmt: skip
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
    nodes = [helper.make_node("Reshape", ["sc", "row"], ["flat"]),
             helper.make_node("Greater", ["flat", "half"], ["kept"]),
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
    check_row_independence(load_recipe(tmp_path / "recipe.yaml"), tmp_path / "m.onnx",
                           read_model_info(tmp_path / "m.onnx"),
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
    (root / "metrics.py").write_text("import numpy as np\n\ndef mean(outputs, labels):\n    return "
                                     "float(np.mean(outputs))\n")
    recipe = {"name": "top", "task": "structured", "model": {"path": "m.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "calibration": {"samples": 8}},
              "metrics": [{"name": "mean", "function": "metrics:mean", "higher_is_better": True}],
              "variants": [{"name": "fp16", "precision": "fp16"}], "output_dir": "reports"}  # fmt: skip
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return root / "recipe.yaml"


def test_a_per_row_length_computed_from_the_scores_is_refused_not_zero_filled(tmp_path: Path, capsys) -> None:
    """A fixed batch of 1 whose TopK keeps the boxes scoring above 0.5: each row's width is its own count. Its rows
    were zero-filled to the widest, so index 0 padded a missing box and validate said OK; then refused as the rows were
    joined; now from the graph, naming the TopK, before any row is scored. A constant K passes."""
    session = ort.InferenceSession(_top("computed").SerializeToString(), providers=["CPUExecutionProvider"])
    widths = {session.run(None, {"x": row[None]})[0].shape[1] for row in ROWS_FED[:8]}
    assert len(widths) > 1  # the widths do differ between the rows validate runs
    recipe = _project(tmp_path / "computed", _top("computed"))
    assert main(["validate", str(recipe)]) == 2
    error = capsys.readouterr().err
    assert ("output 'indices' is computed through TopK node making "
            "'values' (its count, 'computed', is computed), whose output length is neither a constant nor a length of the inputs") in error and error.rstrip().endswith(REMEDY)
    assert main(["validate", str(_project(tmp_path / "constant", _top("constant")))]) == 0


def _top_of_batch() -> onnx.ModelProto:
    """x [batch, 20] -> the top K values of each row [batch, K], K = min(10, the positive values of the whole batch):
    a K the data sets, which a batch whose rows hold 10 positives each keeps at 10."""
    nodes = [helper.make_node("Greater", ["x", "zero"], ["positive"]),
             helper.make_node("Cast", ["positive"], ["ones"], to=TensorProto.INT64),
             helper.make_node("ReduceSum", ["ones"], ["count"], keepdims=0),
             helper.make_node("Reshape", ["count", "one"], ["counted"]),
             helper.make_node("Min", ["ten", "counted"], ["k"]),
             helper.make_node("TopK", ["x", "k"], ["top", "where"], axis=1, name="keep_top")]  # fmt: skip
    graph = helper.make_graph(nodes, "top_of_batch",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 20])],
                              [helper.make_tensor_value_info("top", TensorProto.FLOAT, ["batch", "K"])],
                              [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                               *_constants(one=[1], ten=[10])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_a_top_k_whose_k_the_dry_run_rows_do_not_expose_is_refused_from_the_graph(tmp_path: Path) -> None:
    """The 8 rows checked hold 10 positives each, so K is 10 for them in any order and alone, and the check passed;
    rows without positives later in the data give K 0, and the sweep stopped once every variant was built. The graph
    says K is computed and the output's length unknown: refused in one line naming the TopK node."""
    rows = np.abs(RNG.normal(size=(16, 20))).astype(np.float32) + 0.1
    rows[8:] *= -1  # no positive value
    session = ort.InferenceSession(_top_of_batch().SerializeToString(), providers=["CPUExecutionProvider"])
    widths = [session.run(None, {"x": rows[start:start + 8]})[0].shape[1] for start in (0, 8)]
    assert widths == [10, 0] and {session.run(None, {"x": row[None]})[0].shape[1] for row in rows[:8]} == {10}
    onnx.save(_top_of_batch(), str(tmp_path / "m.onnx"))
    (tmp_path / "rows.parquet").write_bytes(b"")
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump({"name": "rows", "model": {"path": "m.onnx"}, "variants": [
        {"name": "fp16", "precision": "fp16"}], "data": {"path": "rows.parquet", "inputs": {"x": "x"}}}))  # fmt: skip
    with pytest.raises(RecipeError) as caught:
        check_row_independence(load_recipe(tmp_path / "recipe.yaml"), tmp_path / "m.onnx",
                               read_model_info(tmp_path / "m.onnx"), {"x": rows[:8]}, {"top": 0}, None)  # fmt: skip
    message = str(caught.value)
    assert "\n" not in message
    assert message.endswith("model.path: model input x ['batch', 20]: output 'top' is computed through TopK 'keep_top' "
                            "(its count, 'k', is computed), whose output "
                            "length is neither a constant nor a length of "
                            "the inputs (the batch, a padded sequence), so "
                            "it may change from row to row or batch to batch "
                            f"however the dry run's rows came out: {REMEDY}")  # fmt: skip


def test_a_top_k_of_a_constant_k_and_a_count_reduced_away_pass(tmp_path: Path) -> None:
    """What the graph rule leaves alone: a constant K, and a computed K whose values are summed per row, [batch]."""
    constant = _top_of_batch()
    constant.graph.node[-1].input[1] = "ten"
    summed = _top_of_batch()
    summed.graph.node.append(helper.make_node("ReduceSum", ["top", "one"], ["total"], keepdims=0))
    summed.graph.output.pop()
    summed.graph.output.append(helper.make_tensor_value_info("total", TensorProto.FLOAT, ["batch"]))
    for name, model, output in (("constant", constant, "top"), ("summed", summed, "total")):
        (tmp_path / name).mkdir()
        onnx.save(model, str(tmp_path / name / "m.onnx"))
        assert unfixed_length(tmp_path / name / "m.onnx", [output]) is None
    assert unfixed_length(tmp_path / "summed" / "m.onnx", ["top"]) is not None  # the TopK's own output does vary


def test_an_output_of_the_inputs_shape_passes_whatever_its_exporter_named_its_dims(tmp_path: Path) -> None:
    """y = x with its positive values square-rooted in place, through NonZero, GatherND and ScatterND (tf2onnx's
    boolean_mask update): [N, 4] whatever the data, each row its own. Declared [unk__7, 4] (tf2onnx names each dim it
    does not know so), a name no input has, it was refused as a length the data sets; inferred from the inputs, its
    length is the batch's. The NonZero's own output is still refused."""
    nodes = [helper.make_node("Greater", ["x", "zero"], ["positive"]),
             helper.make_node("NonZero", ["positive"], ["where"], name="nonzero"),
             helper.make_node("Transpose", ["where"], ["index"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "index"], ["picked"]),
             helper.make_node("Sqrt", ["picked"], ["rooted"]),
             helper.make_node("ScatterND", ["x", "index", "rooted"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["unk__7", 4]),
                               helper.make_tensor_value_info("where", TensorProto.INT64, [2, "unk__8"])],
                              [numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp_path / "m.onnx"))
    x = np.array([[1, -4, 9, 0], [4, 16, -1, 25]], np.float32)
    y = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    assert y.tolist() == [[1, -4, 3, 0], [2, 4, -1, 5]]
    assert unfixed_length(tmp_path / "m.onnx", ["y"]) is None
    assert unfixed_length(tmp_path / "m.onnx", ["where"]).startswith("output 'where' is computed "
                                                                     "through NonZero 'nonzero'")


def test_a_count_reduced_away_passes_where_the_export_left_its_length_unnamed(tmp_path: Path) -> None:
    """torch.onnx.export with dynamic_axes on the input alone names the output's axis 'ReduceSums_dim_0', and onnx's
    inference drops every axis of a TopK whose K is computed, the batch included: a [batch] output was refused as of
    a length the data sets. A TopK keeps every axis of its input but its own, so the sum per row is [batch]."""
    summed = _top_of_batch()
    summed.graph.node.append(helper.make_node("ReduceSum", ["top", "one"], ["total"], keepdims=0))
    summed.graph.output.pop()
    summed.graph.output.append(helper.make_tensor_value_info("total", TensorProto.FLOAT, ["ReduceSums_dim_0"]))
    kept = _top_of_batch()
    kept.graph.node.append(helper.make_node("ReduceSum", ["top", "zero_axis"], ["total"], keepdims=0))
    kept.graph.initializer.extend(_constants(zero_axis=[0]))
    kept.graph.output.pop()
    kept.graph.output.append(helper.make_tensor_value_info("total", TensorProto.FLOAT, ["ReduceSums_dim_0"]))
    for name, model in (("summed", summed), ("kept", kept)):
        (tmp_path / name).mkdir()
        onnx.save(model, str(tmp_path / name / "m.onnx"))
    assert unfixed_length(tmp_path / "summed" / "m.onnx", ["total"]) is None
    assert unfixed_length(tmp_path / "summed" / "m.onnx", ["top"]) is not None  # the TopK's own output does vary
    # summed over the rows instead, the K values remain: still refused
    assert unfixed_length(tmp_path / "kept" / "m.onnx", ["total"]).startswith("output 'total' is computed through TopK")


def _top_of_shape(axis: int) -> onnx.ModelProto:
    """x [batch, 20] -> TopK of K = min(10, x's length on `axis`), through Shape, Slice and Min as exporters write
    K = min(k, x.size(axis)): 10 for the 20 columns (onnx's own inference does not fold the Min), the batch's rows
    for axis 0."""
    model = _top_of_batch()
    del model.graph.node[:]
    model.graph.initializer.extend(_constants(start=[axis], stop=[axis + 1]))
    model.graph.node.extend([helper.make_node("Shape", ["x"], ["shape"]),
                             helper.make_node("Slice", ["shape", "start", "stop"], ["length"]),
                             helper.make_node("Min", ["ten", "length"], ["k"]),
                             helper.make_node("TopK", ["x", "k"], ["top", "where"], axis=1,
                                              name="keep_top")])  # fmt: skip
    onnx.checker.check_model(model)
    return model


def test_a_top_k_of_min_k_and_the_batch_is_refused_and_of_a_static_width_passes(tmp_path: Path) -> None:
    """K = min(10, rows): 8 on the dry run's 8 rows, 10 on a batch of 32, fewer on a last short batch; refused. K =
    min(10, the 20 columns) is 10 whatever the rows: computed from the shapes with every input length set to 7, then
    11, it is one value."""
    session = ort.InferenceSession(_top_of_shape(0).SerializeToString(), providers=["CPUExecutionProvider"])
    assert [session.run(None, {"x": np.zeros((n, 20), np.float32)})[0].shape[1] for n in (8, 32, 3)] == [8, 10, 3]
    for axis in (0, 1):
        onnx.save(_top_of_shape(axis), str(tmp_path / f"{axis}.onnx"))
    assert unfixed_length(tmp_path / "0.onnx", ["top"]).startswith(
        "output 'top' is computed through TopK 'keep_top' (its "
        "count, 'k', is computed), whose output length is neither")
    assert unfixed_length(tmp_path / "1.onnx", ["top"]) is None
