"""Folding inputs computed from constants into initializers (constant_inputs)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.variants.constant_inputs import fold_constant_inputs


def _model(nodes, initializers, inputs, outputs):
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["rows", "width"]) for name in outputs],
        [numpy_helper.from_array(value, name) for name, value in initializers.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_a_split_constant_is_folded_output_by_output_and_the_graph_computes_the_same():
    rng = np.random.default_rng(0)
    fused = rng.normal(size=(4, 6)).astype(np.float32)
    nodes = [
        helper.make_node("Split", ["fused", "sizes"], ["wa", "wb"], axis=1, name="split"),
        helper.make_node("MatMul", ["x", "wa"], ["ya"], name="mma"),
        helper.make_node("Relu", ["wb"], ["rb"], name="relu"),  # wb is read by a non-quantized node only
        helper.make_node("MatMul", ["x", "rb"], ["yb"], name="mmb"),
    ]
    model = _model(nodes, {"fused": fused, "sizes": np.array([3, 3], np.int64)}, {"x": [2, 4]}, ["ya", "yb"])
    x = rng.normal(size=(2, 4)).astype(np.float32)
    before = _run(model, {"x": x})
    mma, mmb = model.graph.node[1], model.graph.node[3]
    assert fold_constant_inputs(model, [(mma, 0), (mma, 1), (mmb, 1)]) == ["rb", "wa"]
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_array_equal(initializers["wa"], fused[:, :3])
    np.testing.assert_array_equal(initializers["rb"], np.maximum(fused[:, 3:], 0))
    assert [n.op_type for n in model.graph.node] == ["MatMul", "MatMul"]  # Split and Relu fed only folded tensors
    onnx.checker.check_model(model)
    for got, want in zip(_run(model, {"x": x}), before, strict=True):
        np.testing.assert_array_equal(got, want)


def test_inputs_reached_from_graph_inputs_or_overridable_initializers_are_not_folded():
    w = np.ones((4, 4), np.float32)
    nodes = [
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0], name="t"),
        helper.make_node("MatMul", ["x", "wt"], ["y"], name="mm"),
        helper.make_node("Mul", ["x", "x"], ["x2"], name="sq"),
        helper.make_node("MatMul", ["x2", "wt"], ["z"], name="mm2"),
    ]
    model = _model(nodes, {"w": w}, {"x": [2, 4], "w": [4, 4]}, ["y", "z"])  # w is a graph input too
    assert fold_constant_inputs(model, [(model.graph.node[1], 1), (model.graph.node[3], 0)]) == []
    assert len(model.graph.node) == 4


def test_a_split_output_read_alone_is_folded_with_the_split_computing_the_others():
    """Only one output of a Split is a quantized node's input: the Split was left out of the constant sub-graph (it
    counted only when every output was requested), which then could not compute that output."""
    rng = np.random.default_rng(1)
    fused = rng.normal(size=(4, 6)).astype(np.float32)
    nodes = [
        helper.make_node("Split", ["fused", "sizes"], ["wa", "wb"], axis=1, name="split"),
        helper.make_node("MatMul", ["x", "wa"], ["ya"], name="mma"),
        helper.make_node("MatMul", ["x", "wb"], ["yb"], name="mmb"),  # wb: read by a node not asked about
    ]
    model = _model(nodes, {"fused": fused, "sizes": np.array([3, 3], np.int64)}, {"x": [2, 4]}, ["ya", "yb"])
    x = rng.normal(size=(2, 4)).astype(np.float32)
    before = _run(model, {"x": x})
    assert fold_constant_inputs(model, [(model.graph.node[1], 1)]) == ["wa"]
    np.testing.assert_array_equal({t.name: numpy_helper.to_array(t) for t in model.graph.initializer}["wa"],
                                  fused[:, :3])  # fmt: skip
    assert [n.op_type for n in model.graph.node] == ["Split", "MatMul", "MatMul"]  # wb is still read
    for got, want in zip(_run(model, {"x": x}), before, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("stored", "folded"),
                         [(np.int8, False), (np.uint8, False), (np.int16, True), (np.int32, True)])  # fmt: skip
def test_a_dequantized_stored_weight_is_folded_only_when_wider_than_8_bits(stored, folded: bool):
    """A DequantizeLinear of an int8 weight is the model's own quantized weight (weight-only quantization): folding
    it would widen it to float32 and let the variant quantize it a second time. One of an int16 weight (a reference
    the preflight accepts as FP32) was left too: the quantizer then took the weight for an activation, kept it in
    int16 and rounded only the layer's input, so the "INT8" variant computed in FP32."""
    nodes = [
        helper.make_node("DequantizeLinear", ["wq", "scale"], ["w"], name="dq"),
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0], name="t"),
        helper.make_node("MatMul", ["x", "wt"], ["y"], name="mm"),
    ]
    weights = {"wq": np.arange(16, dtype=stored).reshape(4, 4), "scale": np.array(0.1, np.float32)}
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)  # int16: opset 21
    x = np.random.default_rng(2).normal(size=(2, 4)).astype(np.float32)
    before = _run(model, {"x": x})
    assert fold_constant_inputs(model, [(model.graph.node[2], 1)]) == (["wt"] if folded else [])
    expected = ["MatMul"] if folded else ["DequantizeLinear", "Transpose", "MatMul"]
    assert [n.op_type for n in model.graph.node] == expected
    np.testing.assert_allclose(_run(model, {"x": x})[0], before[0], rtol=1e-6)


def test_a_graph_thousands_of_nodes_deep_folds_without_recursion():
    """Whether an activation input was constant was decided by recursing back through its producers: a chain deeper
    than Python's recursion limit (a large transformer) raised RecursionError."""
    depth = 3000
    nodes = [helper.make_node("Relu", [f"h{i}"], [f"h{i + 1}"], name=f"relu{i}") for i in range(depth)]
    nodes += [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0], name="t"),
              helper.make_node("MatMul", [f"h{depth}", "wt"], ["y"], name="mm")]  # fmt: skip
    model = _model(nodes, {"w": np.eye(4, dtype=np.float32)}, {"h0": [2, 4]}, ["y"])
    assert fold_constant_inputs(model, [(model.graph.node[-1], 0), (model.graph.node[-1], 1)]) == ["wt"]
    assert "w" not in {t.name for t in model.graph.initializer}  # the Transposed original is dropped with its Transpose
