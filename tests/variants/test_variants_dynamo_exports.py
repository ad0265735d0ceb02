"""Models as torch.onnx's dynamo exporter writes them (`dynamo=True`, the default since torch 2.9)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from qbench.recipe.spec import VariantSpec
from qbench.variants.base import BuildContext
from qbench.variants.fp16 import build_bf16, build_fp16


def _constant_scaled_mlp(graph, path: Path, **value) -> Path:
    """x @ w, times a Constant node holding its value in the attribute `value` names."""
    w = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    nodes = [helper.make_node("Constant", [], ["scale"], **value), helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Mul", ["h", "scale"], ["y"])]  # fmt: skip
    return graph(path, nodes, {"w": w}, {"x": 4}, {"y": 4}, opset=18)


@pytest.mark.parametrize("value", [{"value_float": 2.0}, {"value_floats": [1.0, -2.0, 0.5, 3.0]}])
def test_fp16_of_a_constant_held_as_a_float_attribute_loads_and_computes_the_model(graph, run, tmp_path, value):
    """The dynamo exporter, without its optimizer, writes scalars as Constant(value_float): ORT's FP16 converter
    declared the Constant's output float16 but left its value float32, and ONNX Runtime refused the FP16 model."""
    path = _constant_scaled_mlp(graph, tmp_path / "scaled.onnx", **value)
    feeds = {"x": np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)}
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for build in (build_fp16, build_bf16):
        spec = VariantSpec(name=build.__name__, precision=build.__name__.removeprefix("build_"))
        built = build(spec, BuildContext(reference_path=path, workdir=tmp_path / build.__name__))
        error = np.abs(run(built, feeds) - reference).max() / np.abs(reference).max()
        print(f"{build.__name__}: max relative error {error:.2e}")
        assert error < 0.02


def test_fp16_of_a_dynamo_export_without_its_optimizer_matches_torch(tmp_path):
    """`torch.onnx.export(..., dynamo=True, optimize=False)` of a module that scales by a Python float and adds
    `new_ones`: every Constant of the file a scalar attribute or a tensor, the FP16 build loads and computes torch's
    outputs to FP16's precision."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(6, 3)

        def forward(self, x):
            return self.fc(x) * 2.0 + x.new_ones(x.shape[0], 3)

    torch.manual_seed(0)
    module = Scaled().eval()
    path = tmp_path / "scaled.onnx"
    batch = torch.export.Dim("batch", min=1, max=64)
    torch.onnx.export(module, (torch.randn(2, 6),), str(path), dynamo=True, optimize=False, input_names=["x"],
                      dynamic_shapes={"x": {0: batch}})  # fmt: skip
    exported = onnx.load(str(path))
    assert any(a.name == "value_float" for node in exported.graph.node if node.op_type == "Constant"
               for a in node.attribute), ("the export no longer writes a "
                                          "value_float Constant: the case is gone")  # fmt: skip
    x = torch.randn(5, 6)
    with torch.no_grad():
        expected = module(x).numpy()
    built = build_fp16(VariantSpec(name="half", precision="fp16"),
                       BuildContext(reference_path=path, workdir=tmp_path / "w"))
    session = ort.InferenceSession(str(built.onnx_path), providers=["CPUExecutionProvider"])
    output = session.run(None, {"x": x.numpy()})[0]
    error = np.abs(output - expected).max() / np.abs(expected).max()
    print(f"fp16 vs torch: max relative error {error:.2e}")
    assert error < 0.01
