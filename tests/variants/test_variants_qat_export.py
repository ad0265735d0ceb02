"""The QAT module's ONNX export is checked: a graph that lost the module's quantization is never measured as INT8."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")
import onnx
from onnx import TensorProto, helper

from qbench.variants import qat  # noqa: F401 - registers torchao's quantized_decomposed ops
from qbench.variants.qat_export import export_onnx, lost_quantization


def _fake_quant_module() -> torch.fx.GraphModule:
    """x -> quantize -> dequantize, as convert_pt2e writes an activation's fake quantization."""
    ops = torch.ops.quantized_decomposed
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    q = graph.call_function(ops.quantize_per_tensor.default, (x, 0.1, 0, -128, 127, torch.int8))
    graph.output(graph.call_function(ops.dequantize_per_tensor.default, (q, 0.1, 0, -128, 127, torch.int8)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _save(path: Path, nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto] = ()) -> Path:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])],
                              list(initializers))  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_graph_without_the_modules_quantize_ops_is_named_as_lost(tmp_path: Path) -> None:
    module = _fake_quant_module()
    float_graph = _save(tmp_path / "float.onnx", [helper.make_node("Relu", ["x"], ["y"])])
    qparams = [helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]),
               helper.make_tensor("z", TensorProto.INT8, [], [0])]  # fmt: skip
    qdq_graph = _save(tmp_path / "qdq.onnx", [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                                              helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
                                              qparams)  # fmt: skip
    lost = lost_quantization(float_graph, module)
    assert lost is not None and "holds none of the module's 2 quantize/dequantize ops" in lost
    assert f"torch {torch.__version__}" in lost
    assert lost_quantization(qdq_graph, module) is None
    nothing_quantized = lost_quantization(qdq_graph, torch.fx.symbolic_trace(torch.nn.ReLU()))
    assert nothing_quantized is not None and "no quantize/dequantize op in the model" in nothing_quantized


class _DroppingExporter:
    """A model source whose exporter writes the float graph, as one that ignores the Q/DQ symbolics does."""

    def export(self, module: torch.nn.Module, path: Path) -> None:
        _save(path, [helper.make_node("Identity", ["x"], ["y"])])


def test_export_refuses_a_graph_that_lost_the_quantization(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="would compute in float"):
        export_onnx(_fake_quant_module(), _DroppingExporter(), tmp_path / "qat.onnx")


class _FixedBatchExporter:
    """A model source whose exporter keeps the module's Q/DQ but reshapes to the example's batch of 2."""

    input_names = ("x",)

    def example_inputs(self, batch: int = 2) -> tuple[torch.Tensor, ...]:
        return (torch.rand(batch, 4),)

    def export(self, module: torch.nn.Module, path: Path) -> None:
        qparams = [helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]),
                   helper.make_tensor("z", TensorProto.INT8, [], [0]),
                   helper.make_tensor("shape", TensorProto.INT64, [2], [2, 4])]  # fmt: skip
        _save(path, [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                     helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
                     helper.make_node("Reshape", ["d", "shape"], ["y"])], qparams)  # fmt: skip


def test_export_refuses_a_graph_fixed_to_the_example_batch(tmp_path: Path) -> None:
    """What traceable_sizes cannot make dynamic (an op without a Python binding) is still caught, not measured."""
    with pytest.raises(RuntimeError, match=r"the ONNX graph does not follow the batch size \(at batch 3"):
        export_onnx(_fake_quant_module(), _FixedBatchExporter(), tmp_path / "qat.onnx")
