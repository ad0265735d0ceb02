"""INT8 on the inputs and weights of every Linear only; every output and every other op stays float.

Static: each Linear input gets one QuantizeLinear (per-tensor scale from calibrated
ranges, shared by every Linear that reads the tensor) and a DequantizeLinear per
reader; each weight is stored as int8 with a DequantizeLinear (per output channel
or per tensor, symmetric), a Gemm's bias as int32. ONNX Runtime's CPU provider fuses
DQ -> MatMul with a float output into MatMulIntegerToFloat and DQ -> Gemm into QGemm:
integer GEMM, float output, no run-time activation quantization.

Dynamic: each Linear input gets one DynamicQuantizeLinear (uint8, scale computed
per batch at run time) and each Linear becomes MatMulInteger -> Cast -> Mul by the
product of the scales, the pattern ORT fuses into DynamicQuantizeMatMul /
MatMulIntegerToFloat.

Which nodes are Linears is decided by rule in `qbench.variants.linear_graph`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper

from qbench.variants.linear_graph import GraphView, Linear, node_attribute

ActivationType = Literal["uint8", "int8"]
_QRANGE = {"uint8": (0, 255), "int8": (-128, 127)}
_NUMPY = {"uint8": np.uint8, "int8": np.int8}


@dataclass(frozen=True)
class LinearQuantSettings:
    """How Linear inputs and weights are quantized.

    reduce_range: 7-bit weights (|q| <= 63), which keeps u8 x s8 pair sums inside int16 on
        x86 CPUs without VNNI (trials pitfall 2).
    """

    activations: Literal["static", "dynamic"] = "static"
    activation_type: ActivationType = "uint8"
    symmetric_activations: bool = False
    per_channel: bool = True
    reduce_range: bool = False

    @property
    def weight_qmax(self) -> int:
        return 63 if self.reduce_range else 127


def activation_qparams(low: float, high: float, activation_type: ActivationType, symmetric: bool) -> tuple[float, int]:
    """Scale and zero point of a per-tensor affine quantization covering [low, high] (and 0)."""
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    qmin, qmax = _QRANGE[activation_type]
    if symmetric:
        absmax = max(-low, high)
        scale = absmax / 127.0
        zero_point = 0 if activation_type == "int8" else 128
    else:
        scale = (high - low) / (qmax - qmin)
        zero_point = int(np.clip(round(qmin - low / scale), qmin, qmax)) if scale > 0 else 0
    return (scale if scale > 0 else 1.0), zero_point


def quantize_weight(weight: np.ndarray, output_axis: int, per_channel: bool,
                    qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weight and its scale (one per output channel, or one scalar)."""
    absmax = np.abs(weight).max(axis=1 - output_axis) if per_channel else np.abs(weight).max()
    scale = np.where(absmax > 0, absmax / qmax, 1.0).astype(np.float32)
    broadcast = np.expand_dims(scale, 1 - output_axis) if per_channel else scale
    quantized = np.clip(np.rint(weight / broadcast), -qmax, qmax).astype(np.int8)
    return quantized, scale


def fake_quantize_activation(values: np.ndarray, low: float, high: float, settings: LinearQuantSettings) -> np.ndarray:
    """`values` quantized per tensor for the range [low, high] and dequantized again, as QuantizeLinear would."""
    scale, zero_point = activation_qparams(low, high, settings.activation_type, settings.symmetric_activations)
    qmin, qmax = _QRANGE[settings.activation_type]
    return (np.clip(np.rint(values / scale) + zero_point, qmin, qmax) - zero_point) * scale


def fake_quantize_weight(weight: np.ndarray, settings: LinearQuantSettings) -> np.ndarray:
    """An (input, output) weight quantized as `quantize_linears` stores it, and dequantized again."""
    quantized, scale = quantize_weight(weight, 1, settings.per_channel, settings.weight_qmax)
    return quantized * (scale[None, :] if settings.per_channel else scale)


def quantize_linears(
    view: GraphView,
    linears: Sequence[Linear],
    ranges: Mapping[str, tuple[float, float]],
    settings: LinearQuantSettings,
) -> int:
    """Rewrite `linears` in `view` to INT8 inputs and weights; returns how many activation tensors were quantized.

    `ranges` maps each Linear input tensor to its calibrated (min, max); static quantization needs one per input.
    """
    readers: dict[str, list[Linear]] = defaultdict(list)
    for linear in linears:
        readers[linear.node.input[0]].append(linear)
    # found on the graph before any edit (shape inference needs a consistent graph)
    biases = {linear.index: _bias_input(view, linear) for linear in linears} if settings.activations == "static" else {}
    for tensor, group in readers.items():
        first = min(linear.index for linear in group)
        if settings.activations == "static":
            if tensor not in ranges:
                reader = group[0].node.name or group[0].node.op_type
                raise ValueError(f"no calibrated range for {tensor!r}, the input of {reader!r}")
            _static(view, tensor, group, first, ranges[tensor], settings, biases)
        else:
            _dynamic(view, tensor, group, first, settings)
    return len(readers)


def _static(
    view: GraphView,
    tensor: str,
    group: list[Linear],
    first: int,
    value_range: tuple[float, float],
    settings: LinearQuantSettings,
    biases: dict[int, tuple[int, int] | None],
) -> None:
    scale, zero_point = activation_qparams(*value_range, settings.activation_type, settings.symmetric_activations)
    scale_name = view.add_constant(f"{tensor}_scale", np.array(scale, dtype=np.float32))
    zero_name = view.add_constant(f"{tensor}_zero_point", np.array(zero_point, dtype=_NUMPY[settings.activation_type]))
    quantized = view.fresh_name(f"{tensor}_quantized")
    view.insert_before(first, [_node(view, "QuantizeLinear", [tensor, scale_name, zero_name], [quantized])])
    for linear in group:
        node = linear.node
        # one DequantizeLinear per reader: each MatMul then forms its own Q/DQ unit for ORT's fusion
        dequantized = view.fresh_name(f"{tensor}_dequantized")
        weight, weight_scale, weight_zero = _weight_constants(view, linear, settings, transpose=False)
        weight_dequantized = view.fresh_name(f"{node.input[1]}_dequantized")
        axis = {"axis": linear.weight_output_axis} if settings.per_channel else {}
        view.insert_before(linear.index, [
            _node(view, "DequantizeLinear", [quantized, scale_name, zero_name], [dequantized]),
            _node(view, "DequantizeLinear", [weight, weight_scale, weight_zero], [weight_dequantized], **axis),
        ])  # fmt: skip
        node.input[0], node.input[1] = dequantized, weight_dequantized
        if node.op_type == "Gemm":
            _drop_gemm_factors(view, linear)
        bias = biases[linear.index]
        if bias is not None:
            width = view.constants[weight].shape[linear.weight_output_axis]
            _quantize_bias(view, *bias, width, scale * view.constants[weight_scale], settings.per_channel)


def _bias_input(view: GraphView, linear: Linear) -> tuple[int, int] | None:
    """(node index, input position) of the Linear's constant bias, when ORT fuses better with it quantized.

    A Gemm's C; or the constant of the only Add after a MatMul with a 2-D output, which ORT turns
    into a Gemm that it fuses into QGemm only with an int32 C. (After a 3-D MatMul the Add stays
    apart from MatMulIntegerToFloat, so its bias stays float.)
    """
    node = linear.node
    if node.op_type == "Gemm":
        return (linear.index, 2) if len(node.input) > 2 and node.input[2] else None
    readers = view.consumers.get(node.output[0], [])
    if len(readers) != 1 or view.rank(node.output[0]) != 2 or not view.read_only_by(node.output[0], readers):
        return None
    add = view.nodes[readers[0]]
    constants = [i for i, name in enumerate(add.input) if view.is_constant(name)]
    return (readers[0], constants[0]) if add.op_type == "Add" and len(add.input) == 2 and len(constants) == 1 else None


def _drop_gemm_factors(view: GraphView, linear: Linear) -> None:
    """Set a Gemm's alpha and beta to 1: alpha is already in the weight scale, beta goes into C.

    ORT fuses only a plain Gemm (alpha = beta = 1) with dequantized inputs into QGemm.
    """
    node = linear.node
    beta = _float_attribute(node, "beta")
    if len(node.input) > 2 and node.input[2] and beta != 1.0:
        name = view.own_constant(linear.index, 2)
        view.set_constant(name, (view.constants[name] * beta).astype(np.float32))
    kept = [a for a in node.attribute if a.name not in ("alpha", "beta")]
    del node.attribute[:]
    node.attribute.extend(kept)


def _quantize_bias(view: GraphView, index: int, position: int, width: int, bias_scale: np.ndarray,
                   per_channel: bool) -> None:
    """Store the bias at input `position` of node `index` as int32 with scale input_scale * weight_scale,
    behind a DequantizeLinear.

    ORT fuses DQ -> Gemm into QGemm (integer GEMM, float output) only when C is dequantized int32 too;
    a bias that is not one value per output channel, or does not fit int32, stays float (correct, unfused).
    """
    node = view.nodes[index]
    name = node.input[position]
    bias = view.constants[name]
    if bias.size not in (1, width) or (bias.ndim and bias.shape[-1] != bias.size):
        return
    bias_scale = np.broadcast_to(bias_scale, (width,)) if per_channel else np.asarray(bias_scale)
    quantized = np.rint(np.broadcast_to(bias.reshape(-1), (width,)) / bias_scale)
    if not np.all(np.abs(quantized) < 2**31 - 1):
        return
    names = [
        view.add_constant(f"{name}_quantized", quantized.astype(np.int32)),
        view.add_constant(f"{name}_scale", bias_scale.astype(np.float32)),
        view.add_constant(f"{name}_zero_point", np.zeros_like(bias_scale, dtype=np.int32)),
    ]
    dequantized = view.fresh_name(f"{name}_dequantized")
    axis = {"axis": 0} if per_channel else {}
    view.insert_before(index, [_node(view, "DequantizeLinear", names, [dequantized], **axis)])
    node.input[position] = dequantized


def _dynamic(view: GraphView, tensor: str, group: list[Linear], first: int, settings: LinearQuantSettings) -> None:
    quantized, scale, zero_point = (view.fresh_name(f"{tensor}_{part}")
                                    for part in ("quantized", "scale", "zero_point"))
    view.insert_before(first, [_node(view, "DynamicQuantizeLinear", [tensor], [quantized, scale, zero_point])])
    for linear in group:
        node = linear.node
        weight, weight_scale, weight_zero = _weight_constants(view, linear, settings, transpose=True)
        integer, as_float, scales = (view.fresh_name(f"{node.output[0]}_{part}")
                                     for part in ("int32", "float", "scales"))
        product, bias = _product_and_bias(view, node)
        view.replace(linear.index, [
            _node(view, "MatMulInteger", [quantized, weight, zero_point, weight_zero], [integer]),
            _node(view, "Cast", [integer], [as_float], to=TensorProto.FLOAT),
            _node(view, "Mul", [scale, weight_scale], [scales]),
            _node(view, "Mul", [as_float, scales], [product]),
            *bias,
        ])  # fmt: skip


def _product_and_bias(view: GraphView, node: onnx.NodeProto) -> tuple[str, list[onnx.NodeProto]]:
    """The tensor the Linear's product goes to, and for a Gemm with C the Add of beta * C after it."""
    if node.op_type != "Gemm" or len(node.input) < 3 or not node.input[2]:
        return node.output[0], []
    product = view.fresh_name(f"{node.output[0]}_unbiased")
    beta = _float_attribute(node, "beta")
    bias = view.add_constant(f"{node.input[2]}_scaled", (view.constants[node.input[2]] * beta).astype(np.float32))
    return product, [_node(view, "Add", [product, bias], [node.output[0]])]


def _weight_constants(
    view: GraphView, linear: Linear, settings: LinearQuantSettings, transpose: bool
) -> tuple[str, str, str]:
    """Initializers of the int8 weight, its scale (times a Gemm's alpha) and zero point.

    transpose: store a Gemm transB weight as (in, out), for MatMulInteger.
    """
    name = linear.node.input[1]
    weight = view.constants[name]
    quantized, scale = quantize_weight(weight, linear.weight_output_axis, settings.per_channel, settings.weight_qmax)
    if transpose and linear.weight_output_axis == 0:
        quantized = np.ascontiguousarray(quantized.T)
    gemm_alpha = _float_attribute(linear.node, "alpha") if linear.node.op_type == "Gemm" else 1.0
    return (
        view.add_constant(f"{name}_quantized", quantized),
        view.add_constant(f"{name}_scale", (scale * gemm_alpha).astype(np.float32)),
        view.add_constant(f"{name}_zero_point", np.zeros_like(scale, dtype=np.int8)),
    )


def _node(view: GraphView, op_type: str, inputs: list[str], outputs: list[str], **attributes: int) -> onnx.NodeProto:
    return helper.make_node(op_type, inputs, outputs, name=view.fresh_name(f"{outputs[0]}_{op_type}"), **attributes)


def _float_attribute(node: onnx.NodeProto, name: str) -> float:
    return float(node_attribute(node, name, 1))
