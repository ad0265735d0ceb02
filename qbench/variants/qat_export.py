"""The converted QAT module, as torch backends run it and as ONNX Q/DQ (qbench.variants.qat builds it).

The export goes through the source's TorchScript exporter with symbolics for torchao's quantize/dequantize ops, then
checks what it wrote: that the graph holds the module's quantization, and that it follows the batch size.
"""

from __future__ import annotations

import warnings
from copy import deepcopy
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch.onnx import symbolic_helper

from qbench.errors import QbenchError
from qbench.sources.torch_outputs import flatten_outputs

QDQ_MIN_OPSET = 13  # per-channel DequantizeLinear
CHECK_BATCH = 3  # the exported QAT graph is run at this batch, unlike the export example's


class InferenceModule(torch.nn.Module):
    """The converted QAT graph for torch backends. train() / eval() do nothing: the graph is fixed in eval
    mode, and torchao's own switch re-traces patterns for seconds on every call."""

    def __init__(self, graph: torch.fx.GraphModule) -> None:
        super().__init__()
        self.graph = graph
        self.training = False

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.graph(*inputs)

    def train(self, mode: bool = True) -> InferenceModule:
        return self



def export_onnx(module: torch.fx.GraphModule, torch_model: Any, path: Path) -> Path:
    """Export with the source's own TorchScript exporter (the recipe's input/output names, opset, dynamic batch).

    The dynamo exporter knows torchao's Q/DQ ops but took 5-9 s per model here (it rebuilds its op
    registry on every call); the TorchScript exporter takes well under a second with these symbolics.
    """
    for name, symbolic in (
        ("quantize_per_tensor", _quantize_per_tensor),
        ("dequantize_per_tensor", _dequantize_per_tensor),
        ("dequantize_per_channel", _dequantize_per_channel),
    ):
        torch.onnx.register_custom_op_symbolic(f"quantized_decomposed::{name}", symbolic, QDQ_MIN_OPSET)  # idempotent
    with warnings.catch_warnings():
        # the tracer warns about torch.export's batch-size guard and about sizes it records as constants; the
        # batch check below finds the constants that matter
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        torch_model.export(InferenceModule(traceable_sizes(module)), path)
    lost = lost_quantization(path, module)
    if lost is not None:
        raise RuntimeError(lost)  # build_step names the variant and the step
    wrong = _batch_mismatch(path, module, torch_model)
    if wrong is not None:
        raise RuntimeError(  # build_step names the variant and the step
            f"the ONNX graph does not follow the batch size ({wrong}): the TorchScript exporter recorded "
            "a size of the QAT graph as a constant (an op reading the batch that torch has no Python binding "
            "for); INT8 PTQ variants of this model do not have this limit"
        )
    return path


def traceable_sizes(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of `module` whose tensor sizes the TorchScript tracer records as values of the graph, not constants.

    torch.export writes a dynamic size as `aten.sym_size.int(x, d)`, which the tracer records as the int it returns
    (the example's batch), and an op taking sizes (`aten.view.default(x, [b, -1])`, an RNN's initial state
    `aten.zeros.default([1, b, h])`) as an aten overload, whose sizes the tracer records as constants too: only
    the Python bindings (`Tensor.view`, `torch.zeros`) record a traced size inside a list. The copy reads each size
    with `Tensor.size` and calls every op that takes one, directly or through arithmetic on sizes, by its binding;
    an op without one keeps its overload (and the batch check after the export names what stayed fixed).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's pytree internals, while copying the graph
        copy = deepcopy(module)
    sizes: set[torch.fx.Node] = set()
    for node in copy.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.aten.sym_size.int:
            node.target = _size
            sizes.add(node)
        elif any(arg in sizes for arg in node.all_input_nodes):
            if not isinstance(node.target, torch._ops.OpOverload):
                sizes.add(node)  # arithmetic on sizes (operator.mul): a size itself
                continue
            name = node.target.overloadpacket.__name__
            node.target = getattr(torch, name, None) or getattr(torch.Tensor, name, node.target)
    copy.recompile()
    return copy


def _size(tensor: torch.Tensor, dim: int) -> Any:
    return tensor.size(dim)


def lost_quantization(path: Path, module: torch.fx.GraphModule) -> str | None:
    """Why the QAT variant would not compute quantized, or None: the converted module holds no quantize/dequantize op
    (torchao annotated nothing), or the exported graph holds none of the module's (an exporter that does not call the
    symbolics above drops them: torch 2.11 with torchao 0.18 wrote Conv, Relu, Gemm and nothing else). Either graph
    computes in float, and measured as this INT8 variant its accuracy would be float's."""
    from qbench.environment import package_version

    versions = f"torch {torch.__version__}, torchao {package_version('torchao')}"
    held = sum(node.op == "call_function" and "quantize_per_" in str(node.target) for node in module.graph.nodes)
    if held == 0:
        return f"convert_pt2e left no quantize/dequantize op in the model ({versions}): nothing of it runs in INT8"
    written = sum(node.op_type in ("QuantizeLinear", "DequantizeLinear")
                  for node in onnx.load(str(path), load_external_data=False).graph.node)  # fmt: skip
    if written > 0:
        return None
    return (f"the ONNX export holds none of the module's {held} quantize/dequantize ops ({versions}): the graph "
            "would compute in float; QAT export is tested with torch 2.13 and torchao 0.18")


def _batch_mismatch(path: Path, module: torch.fx.GraphModule, torch_model: Any) -> str | None:
    """How the exported graph's outputs at a batch other than the export example's differ in shape from the
    module's (a size traced as a constant: `x.view(x.size(0), -1)`, an RNN's initial state), or None."""
    import onnxruntime as ort

    inputs = torch_model.example_inputs(CHECK_BATCH)
    with torch.no_grad():
        expected = [tuple(t.shape) for t in flatten_outputs(module(*inputs))]
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {name: t.numpy() for name, t in zip(torch_model.input_names, inputs, strict=True)}
        got = [tuple(np.shape(o)) for o in session.run(None, feeds)]
    except Exception as exc:  # noqa: BLE001 - a graph that cannot run at another batch is the finding
        return f"at batch {CHECK_BATCH}: {str(exc).splitlines()[0][:200]}"
    if got != expected:
        return f"at batch {CHECK_BATCH} its outputs have shapes {got}, the module's {expected}"
    return None


# The TorchScript graph passes a dtype as its c10::ScalarType code (Byte = 0, Char = 1).
_QUANTIZED_TYPES = {0: (torch.uint8, onnx.TensorProto.UINT8), 1: (torch.int8, onnx.TensorProto.INT8)}


def _quantized_type(code: int) -> tuple[torch.dtype, int]:
    if code not in _QUANTIZED_TYPES:
        raise QbenchError(f"QAT export: torch scalar type {code} has no ONNX QuantizeLinear form (uint8 / int8 only)")
    return _QUANTIZED_TYPES[code]


def _constant_qparams(g: Any, scale: float, zero_point: int, code: int) -> tuple[Any, Any]:
    """Scale as a float32 constant, zero point as a constant of the quantized type (which sets the output type)."""
    return (
        g.op("Constant", value_t=torch.tensor(scale, dtype=torch.float32)),
        g.op("Constant", value_t=torch.tensor(zero_point, dtype=_quantized_type(code)[0])),
    )


@symbolic_helper.parse_args("v", "f", "i", "i", "i", "i")
def _quantize_per_tensor(g: Any, x: Any, scale: float, zero_point: int, quant_min: int, quant_max: int,
                         code: int) -> Any:
    info = torch.iinfo(_quantized_type(code)[0])
    if (quant_min, quant_max) != (info.min, info.max):  # QuantizeLinear clips to the type's full range
        raise QbenchError(f"QAT export: activation range {quant_min}..{quant_max} "
                          f"is not the full {info.min}..{info.max}")
    return g.op("QuantizeLinear", x, *_constant_qparams(g, scale, zero_point, code))


@symbolic_helper.parse_args("v", "f", "i", "i", "i", "i", "none")
def _dequantize_per_tensor(
    g: Any, x: Any, scale: float, zero_point: int, quant_min: int, quant_max: int, code: int, out_dtype: Any
) -> Any:
    return g.op("DequantizeLinear", x, *_constant_qparams(g, scale, zero_point, code))


@symbolic_helper.parse_args("v", "v", "v", "i", "i", "i", "i", "none")
def _dequantize_per_channel(
    g: Any, x: Any, scales: Any, zero_points: Any, axis: int, quant_min: int, quant_max: int, code: int, out_dtype: Any
) -> Any:
    """Weights: int8 constants with one scale per output channel (the zero points' cast is constant-folded)."""
    return g.op("DequantizeLinear", x, scales, g.op("Cast", zero_points, to_i=_quantized_type(code)[1]), axis_i=axis)
