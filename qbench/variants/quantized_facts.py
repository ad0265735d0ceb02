"""What a built INT8 graph's quantized layers hold, read from the graph itself, not from the recipe's options.

A quantizer applies the recipe's options (`weight_type`, `per_channel`, `reduce_range`, symmetric ranges) through a
handler per op type, and a handler may follow rules of its own: ONNX Runtime's dynamic quantizer writes an LSTM's
weights (DynamicQuantizeLSTM) as int8 whatever `weight_type` says, and its ConvInteger per tensor whatever
`per_channel` says. So after every INT8 build (`with_quantized_facts`, where a build is finalised, whichever technique
built it) each node with a quantized weight is read, and its weights and activations are described as stored:
- weights: element type; bits used (7 when every value lies in a 7-bit range, as `reduce_range` writes them: within
  64 of a symmetric zero point, or a span of at most 127 steps, zero points included); per tensor or per channel (a
  scale or zero point with more than one value per weight matrix) and the axis; `centred` when every zero point is the
  type's midpoint (0 when signed), as a symmetric range puts it, otherwise `asymmetric`;
- activations: a static scale (QuantizeLinear with its zero point's type, centred or not), quantized per batch at
  run time (DynamicQuantizeLinear, or a kernel that quantizes its float input itself), or float.
The params count nodes per op kind and description (`weights_as_built`, `activations_as_built`); where a description
contradicts an option the builder recorded as asked, a note says so. Only what the graph proves is noted: an
asymmetric range calibrated on data centred on zero gets a centred zero point too, so `centred` never contradicts a
recipe's `symmetric_activations: false` (nor `asymmetric` a true one: it does). Subgraphs (If/Loop/Scan bodies) are
read too. FP8 builds are described alike: their weights' type (float8_e4m3fn) and granularity, no bit count.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qbench.variants.base import BuiltVariant
from qbench.variants.onnx_utils import subgraphs_of


@dataclass(frozen=True)
class _Kernel:
    """Where an integer kernel ONNX Runtime's quantizers write holds what: `weights` are (weight, scale, zero point)
    input positions (-1: none), `groups` leading weight dims that are not channels (an LSTM's directions)."""

    kind: str
    weights: tuple[tuple[int, int, int], ...]
    groups: int = 0
    quantizes_itself: bool = False  # reads a float input and quantizes it per run


_KERNELS = {
    "MatMulInteger": _Kernel("MatMul", ((1, -1, 3),)),
    "ConvInteger": _Kernel("Conv", ((1, -1, 3),)),
    "MatMulIntegerToFloat": _Kernel("MatMul", ((1, 3, 5),)),
    "DynamicQuantizeMatMul": _Kernel("MatMul", ((1, 2, 3),), quantizes_itself=True),
    "DynamicQuantizeLSTM": _Kernel("LSTM", ((1, 8, 9), (2, 10, 11)), groups=1, quantizes_itself=True),
    "QAttention": _Kernel("Attention", ((1, 4, 7),)),
    "QLinearConv": _Kernel("Conv", ((3, 4, 5),)),
    "QLinearMatMul": _Kernel("MatMul", ((3, 4, 5),)),
    "QGemm": _Kernel("Gemm", ((3, 4, 5),)),
    # its five constant tables (word, position, segment embeddings, gamma, beta): (table, scale, zero point)
    "QEmbedLayerNormalization": _Kernel("EmbedLayerNormalization",
                                        ((2, 8, 13), (3, 9, 14), (4, 10, 15), (5, 11, 16), (6, 12, 17))),
}  # fmt: skip
_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
_BIAS_TYPES = frozenset({np.dtype(np.int32), np.dtype(np.int64)})  # a quantized bias is no weight matrix


@dataclass(frozen=True)
class WeightFacts:
    """One quantized weight as stored."""

    element_type: str  # "int8", "uint8"...
    bits: int | None  # None: every value at its zero point, nothing to tell
    per_channel: bool
    axis: int | None
    symmetric: bool
    channels: int  # the weight's output channels (per-tensor or not): 1 means per-channel cannot differ

    def label(self) -> str:
        granularity = f"per-channel (axis {self.axis})" if self.per_channel else "per-tensor"
        bits = "" if self.bits is None else f", {self.bits}-bit"
        return f"{self.element_type}{bits}, {granularity}, {'centred' if self.symmetric else 'asymmetric'}"


@dataclass(frozen=True)
class ActivationFacts:
    mode: str  # "static", "dynamic" or "float"
    element_type: str | None = None  # static only
    symmetric: bool | None = None  # static only

    def label(self) -> str:
        if self.mode != "static":
            return "dynamic (quantized per batch at run time)" if self.mode == "dynamic" else "float"
        return f"static {self.element_type}, {'centred' if self.symmetric else 'asymmetric'}"


@dataclass(frozen=True)
class NodeFacts:
    kind: str  # the op the node computes: LSTM for DynamicQuantizeLSTM, MatMul for MatMulInteger
    weights: tuple[WeightFacts, ...]
    activations: ActivationFacts


def quantized_facts(model: onnx.ModelProto, base_dir: Path | None = None) -> list[NodeFacts]:
    """Each node of `model` (subgraphs' included) that computes with a quantized weight, described as stored
    (`base_dir`: where its external data lies)."""
    found: list[NodeFacts] = []
    _graph_facts(model.graph, _Reader(model.graph, base_dir), found)
    return found


def _graph_facts(model_graph: onnx.GraphProto, graph: _Reader, found: list[NodeFacts]) -> None:
    """Append the facts of `model_graph`'s nodes (read by `graph`) and of its subgraphs' to `found`."""
    for node in model_graph.node:
        for body in subgraphs_of(node):
            _graph_facts(body, _Reader(body, None, graph), found)
        if node.op_type in _QDQ:
            continue
        kernel = _KERNELS.get(node.op_type) if node.domain in ("", "ai.onnx", "com.microsoft") else None
        if kernel is not None:
            weights = [graph.kernel_weight(node, positions, kernel.groups) for positions in kernel.weights]
            activation = graph.activation(node.input[0], quantizes_itself=kernel.quantizes_itself)
            kind = kernel.kind
        else:
            weights = [graph.dequantized_weight(node, position) for position in range(len(node.input))]
            data = [name for name, weight in zip(node.input, weights, strict=True) if weight is None and name]
            activation = graph.activation(data[0]) if data else ActivationFacts("float")
            kind = node.op_type
        held = tuple(weight for weight in weights if weight is not None)
        if held:
            found.append(NodeFacts(kind, held, activation))


class _Reader:
    """Constants, producers and quantized values of one graph."""

    def __init__(self, graph: onnx.GraphProto, base_dir: Path | None, outer: _Reader | None = None) -> None:
        """`outer`: the reader of the graph enclosing `graph` (a subgraph), whose values it may read by name."""
        self.base_dir = outer.base_dir if outer is not None else str(base_dir) if base_dir is not None else ""
        self.constants: dict[str, onnx.TensorProto] = {} if outer is None else dict(outer.constants)
        self.constants.update({tensor.name: tensor for tensor in graph.initializer})
        self.producers: dict[str, onnx.NodeProto] = {} if outer is None else dict(outer.producers)
        for node in graph.node:
            for output in node.output:
                self.producers[output] = node
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = node.attribute[0].t

    def array(self, name: str) -> np.ndarray | None:
        tensor = self.constants.get(name) if name else None
        return None if tensor is None else numpy_helper.to_array(tensor, self.base_dir)

    def kernel_weight(self, node: onnx.NodeProto, positions: tuple[int, int, int], groups: int) -> WeightFacts | None:
        weight, scale, zero_point = (node.input[i] if 0 <= i < len(node.input) else "" for i in positions)
        values = self.array(weight)
        if values is None or values.dtype.kind not in "iu":
            return None
        zeros, scales = self.array(zero_point), self.array(scale)
        size = (scales if scales is not None else zeros if zeros is not None else np.zeros(1)).size
        per_group = size // max(1, int(np.prod(values.shape[:groups])))
        axis = _channel_axis(values.shape, per_group, groups, _default_axis(node, values.ndim))
        return _facts(values, zeros, axis if per_group > 1 else None, groups, _default_axis(node, values.ndim))

    def dequantized_weight(self, node: onnx.NodeProto, position: int) -> WeightFacts | None:
        """The facts of input `position` when a DequantizeLinear writes it from constant integer values (stored so, or
        a QuantizeLinear of a float constant: quantized when the session runs, to the same values)."""
        dequantize = self.producers.get(node.input[position])
        if dequantize is None or dequantize.op_type != "DequantizeLinear":
            return None
        values, scales, zeros = (self.array(name) for name in [*dequantize.input[:3], "", ""][:3])
        if values is None:
            values = self._quantized_constant(dequantize.input[0])
        if values is None or values.dtype in _BIAS_TYPES or not (values.dtype.kind in "iu" or _is_float8(values.dtype)):
            return None
        attributes = {a.name: helper.get_attribute_value(a) for a in dequantize.attribute}
        per_channel = scales is not None and scales.size > 1
        axis = int(attributes.get("axis", 1)) % max(values.ndim, 1) if per_channel else None
        channel_axis = _default_axis(node, values.ndim)
        if _is_float8(values.dtype):  # FP8: a scale per tensor or channel, its zero point always 0; no bit count
            channels = values.shape[channel_axis] if values.ndim > channel_axis else 1
            return WeightFacts(values.dtype.name, None, per_channel, axis, True, channels)
        return _facts(values, zeros, axis, 0, channel_axis)

    def _quantized_constant(self, name: str) -> np.ndarray | None:
        quantize = self.producers.get(name)
        if quantize is None or quantize.op_type != "QuantizeLinear":
            return None
        floats, scales, zeros = (self.array(name) for name in [*quantize.input[:3], "", ""][:3])
        if floats is None or scales is None:
            return None
        dtype = zeros.dtype if zeros is not None else np.dtype(np.uint8)
        shape = [1] * floats.ndim
        if scales.size > 1:
            axis = int(next((helper.get_attribute_value(a) for a in quantize.attribute if a.name == "axis"), 1))
            shape[axis % floats.ndim] = scales.size
        zero = np.zeros(1) if zeros is None else zeros.astype(np.float64).reshape(shape)
        limits = np.iinfo(dtype)
        scaled = np.rint(floats / scales.astype(np.float64).reshape(shape)) + zero
        return np.clip(scaled, limits.min, limits.max).astype(dtype)

    def activation(self, name: str, *, quantizes_itself: bool = False) -> ActivationFacts:
        """How the activation `name` a quantized node reads was quantized."""
        producer = self.producers.get(name)
        if producer is not None and producer.op_type == "DequantizeLinear":
            producer = self.producers.get(producer.input[0])
        if producer is not None and producer.op_type == "DynamicQuantizeLinear":
            return ActivationFacts("dynamic")
        if producer is not None and producer.op_type == "QuantizeLinear" and self.array(producer.input[1]) is not None:
            zeros = self.array(producer.input[2]) if len(producer.input) > 2 and producer.input[2] else None
            dtype = zeros.dtype if zeros is not None else _output_dtype(producer)
            if _is_float8(dtype):  # an FP8 zero point is always 0: centred
                return ActivationFacts("static", dtype.name, True)
            zeros = np.zeros(1, dtype) if zeros is None else zeros
            return ActivationFacts("static", dtype.name, _symmetric(zeros, 8))
        return ActivationFacts("dynamic" if quantizes_itself else "float")


def _output_dtype(quantize: onnx.NodeProto) -> np.dtype:
    """The type a QuantizeLinear without a zero point writes: its `output_dtype` attribute (opset 21; how FP8 builds
    write float8_e4m3fn), else uint8 as the operator defines."""
    code = next((a.i for a in quantize.attribute if a.name == "output_dtype" and a.i), onnx.TensorProto.UINT8)
    return np.dtype(helper.tensor_dtype_to_np_dtype(code))


def _is_float8(dtype: np.dtype) -> bool:
    """Whether `dtype` is one of ONNX's 8-bit float types (float8_e4m3fn..., as numpy_helper reads them)."""
    return dtype.name.startswith("float8")


def _default_axis(node: onnx.NodeProto, rank: int) -> int:
    """The output-channel axis of a weight read by `node`: a Conv's first, a Gemm's by transB, otherwise the last."""
    if node.op_type in ("Conv", "ConvInteger", "QLinearConv"):
        return 0
    if node.op_type in ("Gemm", "QGemm"):
        return 0 if any(a.name == "transB" and a.i for a in node.attribute) else max(rank - 1, 0)
    return max(rank - 1, 0)


def _channel_axis(shape: tuple[int, ...], per_group: int, groups: int, default: int) -> int:
    """The weight axis a kernel's per-channel scale runs along: the default one when its length fits, otherwise the
    last that does."""
    if len(shape) > default and shape[default] == per_group:
        return default
    return next((axis for axis in range(len(shape) - 1, groups - 1, -1) if shape[axis] == per_group), default)


def _facts(values: np.ndarray, zeros: np.ndarray | None, axis: int | None, groups: int,
           channel_axis: int) -> WeightFacts:
    """`values` (a quantized weight) described: zero points `zeros` run along `axis` (None: per tensor) below the
    `groups` leading dims; `channel_axis` is where its output channels lie."""
    zeros = np.zeros(1, values.dtype) if zeros is None else zeros
    centred = values.astype(np.int64) - _broadcast(zeros, values.shape, axis, groups)
    symmetric = _symmetric(zeros, 8) or _symmetric(zeros, 7)
    if not centred.size or not np.any(centred):
        bits = None
    elif symmetric:
        bits = 7 if int(np.abs(centred).max()) <= 64 else 8
    else:
        # a quantizer's range holds 0, so the steps it spans reach the zero point: a lone 0 at zero point 255 is 8-bit
        bits = 7 if max(int(values.max()), int(zeros.max())) - min(int(values.min()), int(zeros.min())) <= 127 else 8
    channels = values.shape[channel_axis] if values.ndim > channel_axis else 1
    return WeightFacts(values.dtype.name, bits, axis is not None, axis, _symmetric(zeros, bits or 8), channels)


def _broadcast(zeros: np.ndarray, shape: tuple[int, ...], axis: int | None, groups: int) -> np.ndarray:
    if zeros.size == 1:
        return zeros.astype(np.int64).reshape(())
    target = [shape[d] if d < groups or d == axis else 1 for d in range(len(shape))]
    return zeros.astype(np.int64).reshape(target)


def _symmetric(zeros: np.ndarray, bits: int) -> bool:
    """Whether every zero point is its type's midpoint at `bits` bits (0 when signed)."""
    middle = 0 if zeros.dtype.kind == "i" else 2 ** (bits - 1)
    return bool(np.all(zeros.astype(np.int64) == middle))


def with_quantized_facts(built: BuiltVariant, model: onnx.ModelProto) -> BuiltVariant:
    """`built` (an INT8 or FP8 build saved as `model`) with its quantized layers described as stored, in its params,
    and a note for each option the builder recorded (`weight_type`, `per_channel`, `reduce_range`, `weight_symmetric`,
    `activation_type`, `symmetric_activations`) that the graph does not hold for some op kind."""
    facts = quantized_facts(model, built.onnx_path.parent)
    if not facts:
        return built
    weights: dict[str, Counter[str]] = defaultdict(Counter)
    activations: dict[str, Counter[str]] = defaultdict(Counter)
    for node in facts:
        weights[node.kind][" + ".join(sorted({weight.label() for weight in node.weights}))] += 1
        activations[node.kind][node.activations.label()] += 1
    params = {**built.params,
              "weights_as_built": {kind: dict(sorted(counts.items())) for kind, counts in sorted(weights.items())},
              "activations_as_built": {kind: dict(sorted(counts.items()))
                                       for kind, counts in sorted(activations.items())}}  # fmt: skip
    notes = (*built.notes, *_contradictions(facts, built.params))
    return dataclasses.replace(built, params=params, notes=notes)


def _contradictions(facts: list[NodeFacts], asked: dict[str, Any]) -> list[str]:
    """One note per op kind and option asked that some of its nodes do not hold."""
    by_kind: dict[str, list[NodeFacts]] = defaultdict(list)
    for node in facts:
        by_kind[node.kind].append(node)
    notes = []
    for kind, nodes in sorted(by_kind.items()):
        for option, held in _held(nodes, asked):
            count = sum(1 for node in nodes if node in held)
            if count:
                notes.append(f"{kind}: {count} of {len(nodes)} node(s) hold {held[next(iter(held))]}, though the "
                             f"variant's options say {option}: {_yaml(asked[option])} "
                             f"(the quantizer's own rule for {kind} decided)")  # fmt: skip
    return notes


def _held(nodes: list[NodeFacts], asked: dict[str, Any]) -> list[tuple[str, dict[NodeFacts, str]]]:
    """(option, node -> what it holds instead) for each option in `asked` that some of `nodes` do not hold."""
    found = []

    def differ(option: str, described: Any) -> None:
        if option in asked:
            held = {node: text for node in nodes if (text := described(node, asked[option]))}
            if held:
                found.append((option, held))

    def weights(check: Any) -> Any:
        return lambda node, value: next((text for weight in node.weights if (text := check(weight, value))), "")

    differ("weight_type", weights(lambda w, v: f"{w.element_type} weights" if w.element_type != v else ""))
    differ("per_channel", weights(lambda w, v: f"{'per-channel' if w.per_channel else 'per-tensor'} weights"
                                  if w.per_channel != v and w.channels > 1 else ""))  # fmt: skip
    differ("reduce_range",
           weights(lambda w, v: f"{w.bits}-bit weights" if w.bits is not None and (w.bits == 7) != v else ""))
    differ("weight_symmetric", weights(lambda w, v: "asymmetric weights" if v is True and not w.symmetric else ""))
    static = [node for node in nodes if node.activations.mode == "static"]
    if static and asked.get("activation_type") in ("int8", "uint8"):
        differ("activation_type", lambda n, v: f"{n.activations.element_type} activations"
               if n.activations.mode == "static" and n.activations.element_type != v else "")  # fmt: skip
    if static and isinstance(asked.get("symmetric_activations"), bool):
        differ("symmetric_activations", lambda n, v: "asymmetric activations"
               if v is True and n.activations.mode == "static" and not n.activations.symmetric else "")  # fmt: skip
    return found


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
