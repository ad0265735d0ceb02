"""Randomised Q/DQ graphs: qbench's integer-kernel count equals the count in ONNX Runtime's optimised graph.

Each seed draws one layer (MatMul on a 2-D or 3-D input, Gemm, Conv), per-tensor or per-channel weights, a bias
(none, in the op, or an Add after it; float or dequantized), an activation (none, Relu, Clip), what reads the
result (re-quantized, a float node, the graph output, two readers) and whether the batch is symbolic.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.variants.base import BuiltVariant
from qbench.variants.integer_kernels import with_integer_kernels
from tests.variants.conftest import ORT_IR_VERSION, ort_integer_kernels


def _random_layer(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    op = rng.choice(["MatMul", "MatMul3d", "Gemm", "Conv"])
    batch = "batch" if rng.random() < 0.5 else 2
    out_channels = 4
    if op == "Conv":
        shape, weight_shape, axis, out_shape = [batch, 3, 6, 6], (4, 3, 3, 3), 0, [batch, 4, 4, 4]
    elif op == "MatMul3d":
        shape, weight_shape, axis, out_shape = [batch, 5, 8], (8, 4), 1, [batch, 5, 4]
    else:
        shape, weight_shape, axis, out_shape = [batch, 8], (8, 4), 1, [batch, 4]
    transposed = op == "Gemm" and rng.random() < 0.5
    if transposed:
        weight_shape, axis = (4, 8), 0
    per_channel = rng.random() < 0.5
    x_zero = rng.choice([128, 0])
    constants = {
        "s": np.array(0.05, np.float32), "z": np.array(x_zero, np.uint8), "zr": np.array(0, np.uint8),
        "w_i8": rng.integers(-60, 60, weight_shape).astype(np.int8),
        "ws": (rng.uniform(0.01, 0.03, out_channels) if per_channel else np.array(0.02)).astype(np.float32),
        "wz": np.zeros(out_channels if per_channel else (), np.int8),
        "b": rng.normal(size=out_channels).astype(np.float32),
        "b_i32": rng.integers(-100, 100, out_channels).astype(np.int32),
        "bs": np.array(0.001, np.float32), "lo": np.array(0, np.float32), "hi": np.array(6, np.float32),
    }  # fmt: skip
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w_i8", "ws", "wz"], ["w"],
                              **({"axis": axis} if per_channel else {}))]  # fmt: skip
    bias = rng.choice(["none", "float", "dequantized"])
    bias_tensor = "b"
    if bias == "dequantized":
        nodes.append(helper.make_node("DequantizeLinear", ["b_i32", "bs"], ["bd"]))
        bias_tensor = "bd"
    in_op = bias != "none" and op in ("Gemm", "Conv") and rng.random() < 0.5
    inputs = ["xd", "w", *([bias_tensor] if in_op else [])]
    attributes = {"transB": 1} if transposed else {}
    nodes.append(helper.make_node("MatMul" if op == "MatMul3d" else op, inputs, ["o"], **attributes))
    last = "o"
    if bias != "none" and not in_op:
        if op == "Conv":
            constants["b"] = constants["b"].reshape(4, 1, 1)
            nodes.append(helper.make_node("Reshape", [bias_tensor, "bias_shape"], ["br"]))
            constants["bias_shape"] = np.array([4, 1, 1], np.int64)
            bias_tensor = "br"
        nodes.append(helper.make_node("Add", [last, bias_tensor], ["a"]))
        last = "a"
    activation = rng.choice(["none", "Relu", "Clip"])
    if activation != "none":
        nodes.append(helper.make_node(activation, [last, *(["lo", "hi"] if activation == "Clip" else [])], ["act"]))
        last = "act"
    reader = rng.choice(["requantized", "requantized_at_zero", "float", "output", "two"])
    if reader.startswith("requantized"):
        zero = "zr" if reader == "requantized_at_zero" else "z"
        nodes += [helper.make_node("QuantizeLinear", [last, "s", zero], ["yq"]),
                  helper.make_node("DequantizeLinear", ["yq", "s", zero], ["y"])]  # fmt: skip
    elif reader == "float":
        nodes.append(helper.make_node("Tanh", [last], ["y"]))
    elif reader == "two":
        nodes += [helper.make_node("Tanh", [last], ["t"]), helper.make_node("Sigmoid", [last], ["g"]),
                  helper.make_node("Add", ["t", "g"], ["y"])]  # fmt: skip
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    used = {name for node in nodes for name in node.input}
    graph = helper.make_graph(
        nodes, f"random{seed}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(value, name) for name, value in constants.items() if name in used],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ORT_IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("seed", range(80))
def test_a_random_qdq_layer_is_counted_as_onnx_runtime_runs_it(tmp_path, seed):
    model = _random_layer(seed)
    path = tmp_path / "layer.onnx"
    onnx.save(model, str(path))
    built = with_integer_kernels(BuiltVariant(name="int8", precision="int8", onnx_path=path), model)
    assert built.params["integer_kernels_from"] == "onnxruntime"
    assert built.params["quantized_nodes"] == ort_integer_kernels(path, tmp_path)
    layer = next(node.op_type for node in model.graph.node if node.op_type in ("MatMul", "Gemm", "Conv"))
    assert set(built.params["quantized_op_types"]) <= {layer}  # counted under the op it runs, not ORT's kernel
