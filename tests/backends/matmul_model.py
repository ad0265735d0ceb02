"""The one-node ONNX model the GPU backend tests load: y = x @ WEIGHT, x: (batch, 3) float32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

WEIGHT = np.arange(6, dtype=np.float32).reshape(3, 2) / 4


def save_onnx(graph: onnx.GraphProto, path: Path, opset: int = 17) -> Path:
    """`graph` as a checked model (IR 8, default domain at `opset`) saved at `path`."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def save_matmul_model(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor("w", TensorProto.FLOAT, [3, 2], WEIGHT.ravel())],
    )
    return save_onnx(graph, path)
