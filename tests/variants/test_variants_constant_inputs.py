"""Folding inputs computed from constants into initializers (constant_inputs)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
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
