"""`keep_float`: the nodes a variant keeps in floating point BY RULE, never by node name.

A rule is an ONNX op type (every node of that type, e.g. Softmax) or a graph pattern:

- `attention_matmuls`: a MatMul/Gemm whose two inputs are both computed (neither is a
  constant, nor computed from constants only): attention scores (Q x K^T) and context
  (probabilities x V), as opposed to a Linear with a weight.
- `masks`: the float/bool tensors computed from non-float graph inputs (an attention mask:
  Unsqueeze, Cast, Sub, Mul...), the nodes that apply such a tensor to a computed one
  (the Add or Where on the scores), and the nodes reading what an additive application
  (Add, Sub, Where) wrote: that tensor holds the mask's fill (`(1 - mask) * -1e4`,
  `masked_fill(..., -1e9)`) beside the real scores, so a range calibrated on it (say
  [-1e4, 10]) rounds every real score to one value, in the Softmax's input as much as in the
  Add's output. The fill is followed through elementwise and data-movement nodes (a
  Reshape, another Add) up to the node that ends it (Softmax, Exp); other readers (a MatMul)
  are not matched, and a multiplicative mask (Mul by 0/1) leaves no fill and is not followed.
  Propagation stops at a lookup into a constant table (an embedding Gather, ONNX Runtime's
  fused EmbedLayerNormalization: its output is learned data, not a mask) and at Shape/Size.
  Two more sources count where their fill reaches a Softmax/Exp (`_reaching_an_end`): a causal
  mask computed from constants and shapes only (`_shape_sources`), and a float graph input only
  ever added to scores (`_float_input_sources`). A fill reaching the Softmax only through a MatMul
  or a reduction, and a float mask folded into an initializer, are not matched.

Static INT8 and FP8 apply `masks` by default when the recipe does not set `keep_float`
(`DEFAULT_RULES`), keeping only the matches on a path to a Softmax/Exp reading a fill: a graph without
a mask matches nothing and builds as before (a string or integer input's one-hot features joined by a
Concat are matched by an explicit `masks`, not by the default).
The rules run on the FP32 graph; builders add the matches to the nodes they leave unquantized
(unnamed matches are named first, so an exclusion list can hold them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import TensorProto

from qbench.onnx_read import infer_shapes
from qbench.variants.onnx_utils import name_unnamed_nodes
from qbench.variants.quant_scope import TABLE_INPUTS

_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE, TensorProto.BOOL}
_SHAPE_ONLY = ("Shape", "Size")
_ADDITIVE = ("Add", "Sub", "Where")  # applications that leave the fill in the scores (a Mul by 0/1 leaves none)
# readers whose output still holds the fill wherever their input did
_CARRIERS = ("Add", "Sub", "Mul", "Div", "Neg", "Where", "Max", "Min", "Clip", "LogSoftmax", "Cast", "Identity",
             "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Tile", "Slice",
             "Concat")  # fmt: skip
# readers that end the fill (it becomes 0); any other reader (a MatMul, a Conv, a reduction) is left to the quantizer
# and ends the rule's reach: a `masked_fill(x, 0)` in front of a Linear keeps the Linear quantized
_ENDS = ("Softmax", "Exp")
DEFAULT_RULES = ("masks",)
DEFAULT_WHY = (
    "kept float by default (static INT8 and FP8 apply keep_float: [masks] unless the recipe sets keep_float; "
    "keep_float: [] quantizes them): an attention mask's fill (e.g. -1e4) would set the range of the masked "
    "scores and round every real score to one value"
)


@dataclass(frozen=True)
class KeptFloat:
    """The nodes the rules matched: names in graph order, and per rule the names it matched."""

    names: tuple[str, ...] = ()
    by_rule: dict[str, list[str]] | None = None
    default: bool = False  # the rules are DEFAULT_RULES, the recipe having set none

    def params(self) -> dict[str, Any]:
        """What results record: nothing when the variant has no rule, or when the default rules matched nothing
        (a model without a mask records what it recorded before the default existed)."""
        if self.by_rule is None or (self.default and not self.names):
            return {}
        recorded = {
            "keep_float": {rule: len(names) for rule, names in self.by_rule.items()},
            "kept_float_nodes": list(self.names),
        }
        return {**recorded, "keep_float_default": DEFAULT_WHY} if self.default else recorded


def default_notes(params: dict[str, Any]) -> list[str]:
    """The note a variant (and `qbench explain`) carries when the default rules kept nodes float."""
    if "keep_float_default" not in params:
        return []
    return [f"{len(params['kept_float_nodes'])} attention-mask node(s) {params['keep_float_default']}"]


def float_rules(config: Any, *, static: bool) -> tuple[list[str], bool]:
    """The rules a technique config keeps float with, and whether they are the default: the recipe's `keep_float`
    where it set one (an explicit [] included), else DEFAULT_RULES for a build with calibrated static ranges."""
    if "keep_float" in config.model_fields_set or not static:
        return list(config.keep_float), False
    return list(DEFAULT_RULES), True


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        graph = model.graph
        self.nodes = list(graph.node)
        overridable = {value.name for value in graph.input}
        self.constants = {t.name for t in graph.initializer if t.name not in overridable}
        for node in self.nodes:  # tensors computed from constants only
            if all(not name or name in self.constants for name in node.input):
                self.constants.update(node.output)
        try:
            inferred = infer_shapes(model).graph
        except Exception:  # noqa: BLE001 (inference fails on odd graphs: dtypes stay unknown)
            inferred = onnx.GraphProto()
        values = [*graph.input, *inferred.value_info, *inferred.input, *inferred.output, *graph.output]
        self.dtypes = {t.name: t.data_type for t in graph.initializer}  # value_info does not list initializers
        self.dtypes |= {v.name: v.type.tensor_type.elem_type for v in values if v.type.HasField("tensor_type")}
        self.inputs = [value.name for value in graph.input if value.name not in self.constants]

    def computed(self, name: str) -> bool:
        return bool(name) and name not in self.constants


def _attention_matmuls(graph: _Graph) -> list[int]:
    return [
        index
        for index, node in enumerate(graph.nodes)
        if node.op_type in ("MatMul", "Gemm")
        and len(node.input) >= 2
        and all(graph.computed(n) for n in node.input[:2])
    ]


@dataclass
class _Spread:
    """What a mask source reaches: `matched` node indices, and those that `derived` (computed from the source alone)
    or `applied` it to another computed tensor."""

    matched: list[int]
    derived: list[int]
    applied: list[int]


def _spread(graph: _Graph, sources: set[str], *, additive_only: bool = False) -> _Spread:
    """Follow mask `sources` through the graph; `additive_only`: a non-additive application (a Div by a shape-derived
    scale, a rotary Mul) is not a match."""
    derived, filled = set(sources), set()  # filled: tensors holding a mask's fill beside real values
    spread = _Spread([], [], [])
    for index, node in enumerate(graph.nodes):
        computed = [name for name in node.input if graph.computed(name) or name in sources]
        from_mask = [name for name in computed if name in derived]
        if node.op_type in _SHAPE_ONLY:
            continue
        tables = TABLE_INPUTS.get(("" if node.domain == "ai.onnx" else node.domain, node.op_type), ())
        lookup = any(i < len(node.input) and node.input[i] in graph.constants for i in tables)
        reads_fill = bool(filled.intersection(node.input))
        if from_mask and len(from_mask) == len(computed) and not lookup:
            derived.update(node.output)
            spread.derived.append(index)
            if any(graph.dtypes.get(name) in _FLOATS for name in node.output):
                spread.matched.append(index)
        elif from_mask and any(graph.dtypes.get(name) in _FLOATS for name in from_mask) and not lookup:
            spread.applied.append(index)  # applies a float/bool mask to a computed tensor
            if node.op_type in _ADDITIVE or (reads_fill and node.op_type in _CARRIERS):
                filled.update(node.output)
                spread.matched.append(index)
            elif not additive_only:
                spread.matched.append(index)
        elif reads_fill and node.op_type in (*_CARRIERS, *_ENDS):
            spread.matched.append(index)  # reads the fill beside real values (the Softmax on the masked scores)
            if node.op_type in _CARRIERS:
                filled.update(node.output)
    return spread


def _reaching_an_end(graph: _Graph, matched: list[int]) -> list[int]:
    """The matches with a path through matches to a Softmax/Exp reading a fill: what a mask found by shape alone
    must show to be one (a sinusoidal position table added to the embeddings reaches none)."""
    kept: list[int] = []
    needed: set[str] = set()  # tensors read by a kept match
    for index in sorted(matched, reverse=True):
        node = graph.nodes[index]
        if node.op_type in _ENDS or needed.intersection(node.output):
            kept.append(index)
            needed.update(node.input)
    return sorted(kept)


def _shape_sources(graph: _Graph) -> set[str]:
    """Float/bool tensors computed from constants and shapes only (Shape/Size, Range, Trilu, ConstantOfShape,
    comparisons, a causal `bias` buffer sliced to the sequence length), and bool constants: a causal mask that never
    reads a graph input (constant folding can leave it as a bool initializer, the Where's condition)."""
    static = set(graph.constants)
    for node in graph.nodes:
        if node.op_type in _SHAPE_ONLY or all(not name or name in static for name in node.input):
            static.update(node.output)
    bools = {name for name in graph.constants if graph.dtypes.get(name) == TensorProto.BOOL}
    return bools | {name for name in static - graph.constants if graph.dtypes.get(name) in _FLOATS}


def _float_input_sources(graph: _Graph) -> set[str]:
    """Float graph inputs that are additive masks (an `attention_bias` of 0/-inf): reshaped or cast only, then only
    ever added (Add/Sub/Where) to computed scores whose fill reaches a Softmax/Exp. An input that meets a MatMul, a
    Conv or a normalization on the way (the model's features) is not one."""
    sources = set()
    for name in graph.inputs:
        if graph.dtypes.get(name) not in _FLOATS - {TensorProto.BOOL}:
            continue
        spread = _spread(graph, {name}, additive_only=True)
        applications = set(spread.applied)
        if (applications and applications <= set(_reaching_an_end(graph, spread.matched))
                and all(graph.nodes[i].op_type in _ADDITIVE for i in applications)
                and all(graph.nodes[i].op_type in _CARRIERS for i in spread.derived)):  # fmt: skip
            sources.add(name)
    return sources


def _masks(graph: _Graph) -> list[int]:
    from_inputs = {name for name in graph.inputs if graph.dtypes.get(name) not in _FLOATS}
    matched = set(_spread(graph, from_inputs).matched)
    others = _shape_sources(graph) | _float_input_sources(graph)
    if others:
        matched.update(_reaching_an_end(graph, _spread(graph, from_inputs | others, additive_only=True).matched))
    return sorted(matched)


# one entry per rule name of qbench.techniques.options.FLOAT_RULES (a test holds them equal)
PATTERNS: dict[str, Callable[[_Graph], list[int]]] = {"attention_matmuls": _attention_matmuls, "masks": _masks}


def kept_float_nodes(model: onnx.ModelProto, rules: Sequence[str], *, default: bool = False) -> KeptFloat:
    """The nodes of `model`'s main graph that `rules` keep in floating point (unnamed matches get names, in place);
    `default`: the rules are DEFAULT_RULES, not the recipe's."""
    if not rules:
        return KeptFloat()
    graph = _Graph(model)
    by_rule: dict[str, list[int]] = {}
    for rule in rules:
        if rule in PATTERNS:
            by_rule[rule] = PATTERNS[rule](graph)
            if default:  # unasked, only what carries a fill to a Softmax/Exp: a categorical input's one-hot is no mask
                by_rule[rule] = _reaching_an_end(graph, by_rule[rule])
        else:
            by_rule[rule] = [i for i, node in enumerate(graph.nodes) if node.op_type == rule]
    if any(not graph.nodes[i].name for indices in by_rule.values() for i in indices):
        name_unnamed_nodes(model)
    matched = sorted({i for indices in by_rule.values() for i in indices})
    names = {rule: [graph.nodes[i].name for i in indices] for rule, indices in by_rule.items()}
    return KeptFloat(tuple(graph.nodes[i].name for i in matched), names, default)


def restore_float_inputs(model: onnx.ModelProto, names: Sequence[str]) -> int:
    """Make the nodes `names` read their activations unquantized (in place); returns the inputs rewired.

    A QDQ quantizer that leaves a node unquantized can still put a QuantizeLinear ->
    DequantizeLinear pair on a tensor the node reads (ORT quantizes a quantized MatMul's output
    for its next reader): the node then computes in float on rounded values. Each such input is
    pointed back at the float tensor before the pair; pairs nobody reads any more are removed.
    Weights (a pair whose input is a constant) are left as they are.
    """
    if not names:
        return 0
    graph = model.graph
    producer = {output: node for node in graph.node for output in node.output}
    constants = {t.name for t in graph.initializer}
    kept, rewired = set(names), 0
    for node in graph.node:
        if node.name not in kept:
            continue
        for position, name in enumerate(node.input):
            dequantize = producer.get(name)
            quantize = (
                producer.get(dequantize.input[0])
                if dequantize is not None and dequantize.op_type == "DequantizeLinear"
                else None
            )
            if quantize is not None and quantize.op_type == "QuantizeLinear" and quantize.input[0] not in constants:
                node.input[position] = quantize.input[0]
                rewired += 1
    if rewired:
        _drop_unread_qdq(graph)
    return rewired


def _drop_unread_qdq(graph: onnx.GraphProto) -> None:
    """Remove QuantizeLinear/DequantizeLinear nodes whose outputs nothing reads (repeated: a Q feeds only its DQ)."""
    while True:
        read = {name for node in graph.node for name in node.input} | {value.name for value in graph.output}
        unread = [
            n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear") and not read & set(n.output)
        ]
        if not unread:
            return
        for node in unread:
            graph.node.remove(node)
