"""Lengths the data does not set, as models ship them, are not refused by the graph rule (qbench.preflight.lengths):
a count computed from constants alone (a TopK's K read off a weight's shape, NonZero of a constant mask picking
columns) and a TopK over a padded sequence's whole length. Each was refused (exit 2) by the rule merged with it,
though onnxruntime gives every row, alone or in any batch, the same width; a K the batch sets is still refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from qbench.preflight.lengths import unfixed_length

FEATURES = 8
WEIGHT = numpy_helper.from_array(np.random.default_rng(0).normal(size=(FEATURES, 5)).astype(np.float32), "w")


def _int64(name: str, values: object) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _saved(path: Path, nodes: list, dims: list, constants: list) -> Path:
    """x [batch, dims...] -> `nodes` -> v [batch, ?] (its width left unnamed, as exporters often leave it)."""
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", *dims])],
                              [helper.make_tensor_value_info("v", TensorProto.FLOAT, ["batch", None])],
                              constants)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _widths(path: Path, shapes: list[tuple[int, ...]]) -> set[int]:
    """The output widths onnxruntime gives for random inputs of `shapes`."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    return {session.run(None, {"x": rng.normal(size=shape).astype(np.float32)})[0].shape[1] for shape in shapes}


def _weight_top_k(tmp_path: Path) -> Path:
    """TopK of x @ w with K = w's second dimension (5), read through Shape and Gather."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["s"]), helper.make_node("Shape", ["w"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["width"], axis=0),
             helper.make_node("Unsqueeze", ["width", "axes"], ["k"]),
             helper.make_node("TopK", ["s", "k"], ["v", "where"], axis=1, name="top")]  # fmt: skip
    return _saved(tmp_path / "top.onnx", nodes, [FEATURES], [WEIGHT, _int64("one", 1), _int64("axes", [0])])


def _picked_columns(tmp_path: Path, mask: str) -> Path:
    """x @ w's columns where `mask` is nonzero: a constant [1, 0, 1, 1, 0] or the first row of x @ w above 0."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["first"], axis=0),
             helper.make_node("Greater", ["first", "nought"], ["row_mask"]),
             helper.make_node("NonZero", [mask], ["nonzero"]),
             helper.make_node("Squeeze", ["nonzero", "axes"], ["picked"]),
             helper.make_node("Gather", ["s", "picked"], ["v"], axis=1)]  # fmt: skip
    constants = [WEIGHT, numpy_helper.from_array(np.array([1, 0, 1, 1, 0], np.bool_), "mask"), _int64("zero", 0),
                 _int64("axes", [0]), numpy_helper.from_array(np.array(0.0, np.float32), "nought")]  # fmt: skip
    return _saved(tmp_path / f"{mask}.onnx", nodes, [FEATURES], constants)


def test_a_length_computed_from_constants_alone_passes_and_from_the_rows_is_refused(tmp_path: Path) -> None:
    """K = w.shape[1] (5) and NonZero of a constant 5-value mask (3 columns): refused as lengths the data sets, though
    onnxruntime gives 5 and 3 columns for batches of 1, 8 and 32. NonZero of the first row's positive scores does
    vary (2 to 5 columns here), and is still refused."""
    top, constant = _weight_top_k(tmp_path), _picked_columns(tmp_path, "mask")
    rows = _picked_columns(tmp_path, "row_mask")
    batches = [(1, FEATURES), (8, FEATURES), (32, FEATURES)]
    assert _widths(top, batches) == {5} and _widths(constant, batches) == {3}
    assert len(_widths(rows, [(1, FEATURES)] * 20)) > 1
    assert unfixed_length(top, ["v"]) is None
    assert unfixed_length(constant, ["v"]) is None
    assert unfixed_length(rows, ["v"]).startswith("output 'v' is computed through NonZero node making 'nonzero', whose "
                                                  "output length is neither a constant nor a length of the inputs")


def _sorted_by(tmp_path: Path, axis: int) -> Path:
    """x [batch, seq] -> TopK over axis 1 of K = x's length on `axis`: each row sorted, its padded length (1) or the
    batch's rows (0)."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Slice", ["shape", "start", "stop"], ["k"]),
             helper.make_node("TopK", ["x", "k"], ["v", "where"], axis=1, name="sort")]  # fmt: skip
    return _saved(tmp_path / f"{axis}.onnx", nodes, ["seq"], [_int64("start", [axis]), _int64("stop", [axis + 1])])


def test_a_sort_over_the_padded_sequence_passes_and_over_the_batch_is_refused(tmp_path: Path) -> None:
    """K = the sequence's length: a row of 6 gives 6 values alone or among 8 or 32 rows; it was refused (K differs
    at lengths 7 and 11, and the output's width is unnamed). K = the batch's rows is a length the batch sets."""
    sequence, batch = _sorted_by(tmp_path, 1), _sorted_by(tmp_path, 0)
    assert _widths(sequence, [(1, 6), (8, 6), (32, 6)]) == {6} and _widths(batch, [(1, 6), (4, 6)]) == {1, 4}
    assert unfixed_length(sequence, ["v"]) is None
    assert unfixed_length(batch, ["v"]).startswith("output 'v' is computed through TopK 'sort' (its count, 'k', is "
                                                   "computed), whose output length is neither a constant nor a length")


def _loop(tmp_path: Path, kind: str) -> Path:
    """A Loop of a constant 5 iterations scanning each row's sum times the iteration, [batch, iterations]; its body's
    condition, `kind`: 'stops' (iteration < the batch's largest value: stop once converged), 'cin' (its input passed
    on) or 'true' (the graph's constant true passed on, as torch exports `for i in range(n)`)."""
    at = helper.make_node("Cast", ["it"], ["at"], to=TensorProto.FLOAT)
    condition = [at, helper.make_node("ReduceMax", ["x"], ["largest"], keepdims=0),
                 helper.make_node("Less", ["at", "largest"], ["cout"])] if kind == "stops" else [
                 helper.make_node("Identity", [kind], ["cout"]), at]  # fmt: skip
    body = helper.make_graph([*condition, helper.make_node("Mul", ["x", "at"], ["scaled"]),
                              helper.make_node("ReduceSum", ["scaled", "axes"], ["scan"], keepdims=0)], "body",
                             [helper.make_tensor_value_info("it", TensorProto.INT64, []),
                              helper.make_tensor_value_info("cin", TensorProto.BOOL, [])],
                             [helper.make_tensor_value_info("cout", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("scan", TensorProto.FLOAT, ["batch"])],
                             [_int64("axes", [1])])  # fmt: skip
    nodes = [helper.make_node("Loop", ["five", "true"], ["scans"], body=body, name="steps"),
             helper.make_node("Transpose", ["scans"], ["v"], perm=[1, 0])]  # fmt: skip
    return _saved(tmp_path / f"loop_{kind}.onnx", nodes, [4], [_int64("five", 5),
                  numpy_helper.from_array(np.array(True), "true")])  # fmt: skip


def test_a_loop_of_a_constant_count_that_its_condition_stops_sooner_is_refused(tmp_path: Path) -> None:
    """Its count is the constant 5, so the rule took its length for a constant: onnxruntime gives 2, 4 and 5
    iterations for batches whose largest value is 0.5, 2.5 and 10. Refused now, naming the Loop; the same Loop whose
    condition is passed on (its own, or a constant of the graph) runs 5 every time and passes."""
    stops, runs, torch_like = _loop(tmp_path, "stops"), _loop(tmp_path, "cin"), _loop(tmp_path, "true")
    session = ort.InferenceSession(str(stops), providers=["CPUExecutionProvider"])
    assert [session.run(None, {"x": np.full((2, 4), v, np.float32)})[0].shape[1] for v in (0.5, 2.5, 10)] == [2, 4, 5]
    assert _widths(runs, [(1, 4), (8, 4)]) == _widths(torch_like, [(1, 4), (8, 4)]) == {5}
    assert unfixed_length(stops, ["v"]).startswith(
        "output 'v' is computed through Loop 'steps' (its count, 'five', is a constant, but its condition may stop it "
        "sooner), whose output length is neither a constant nor a length of the inputs")
    assert unfixed_length(runs, ["v"]) is None and unfixed_length(torch_like, ["v"]) is None
