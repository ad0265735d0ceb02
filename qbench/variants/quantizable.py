"""Which nodes of a graph ONNX Runtime's quantizers may change, which they must never be handed, and why a graph has
nothing to quantize (nodes of other domains, float64 arithmetic, nodes only inside control-flow subgraphs)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable

import onnx

from qbench.onnx_read import infer_shapes
from qbench.variants.onnx_utils import outer_scope_reads, subgraphs_of


def quantizable_nodes(
    model: onnx.ModelProto, op_types: Collection[str], exclude: Collection[str], handed: Collection[str] = ()
) -> list[str]:
    """Names of the nodes a quantizer may change: standard-domain `op_types` on float32/float16 tensors, not excluded,
    and the contrib nodes named in `handed` (those ONNX Runtime's quantizer lowers to an integer kernel, see
    `int8.contrib_nodes`) whose op type is among `op_types`.

    Other nodes of other domains (ai.onnx.ml tree ensembles, scalers, ZipMap...) are never
    quantized, whatever their op type is called; nor are nodes computing in float64, nor standard nodes that
    ONNX Runtime's quantizers would take for one of its own operators (ORT_CONTRIB_QUANTIZERS).
    """
    doubles = set(float64_nodes(model))
    return [
        node.name
        for node in model.graph.node
        if node.op_type in op_types and node.name not in exclude and node.name not in doubles
        and (node.name in handed or node.domain in ("", "ai.onnx") and node.op_type not in ORT_CONTRIB_QUANTIZERS)
    ]  # fmt: skip


# ONNX Runtime's quantizers choose a node's handler by op type alone, whatever its domain. These handlers are written
# for ONNX Runtime's own com.microsoft operators of that name: given a standard-domain node of the same op type (ONNX's
# Attention since opset 23, which torch.onnx's exporter writes for scaled_dot_product_attention) they rewrite it into
# a contrib operator it does not fit (a QAttention that ONNX Runtime refuses to load: 'Unrecognized attribute:
# is_causal'). Such standard nodes are never handed to the quantizers.
ORT_CONTRIB_QUANTIZERS = frozenset({"Attention", "EmbedLayerNormalization"})


def unquantizable_nodes(model: onnx.ModelProto, handed: Collection[str] = ()) -> list[str]:
    """Names of the nodes kept out of quantization whatever the recipe asks: those outside the standard ONNX domain
    (but the contrib nodes named in `handed`, which the quantizer lowers to integer kernels), standard nodes whose op
    type ONNX Runtime's quantizers read as one of its own operators, those computing in float64 (ONNX Runtime's
    quantizers handle float32 and float16 tensors only), and those whose output a subgraph reads by name (the
    quantizers do not see that reader: ORT's folds a Relu into the next quantization when it thinks a QuantizeLinear is
    its only reader, and the subgraph then reads the Relu's input)."""
    names = [
        node.name for node in model.graph.node
        if (node.domain not in ("", "ai.onnx") or node.op_type in ORT_CONTRIB_QUANTIZERS) and node.name
        and node.name not in handed
    ]  # fmt: skip
    names += [node.name for node in subgraph_read_producers(model)]
    return list(dict.fromkeys([*names, *float64_nodes(model)]))


def subgraph_read_producers(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The main-graph nodes whose output a control-flow subgraph reads by name (kept out of quantization)."""
    captured = {name for node in model.graph.node for name in outer_scope_reads(node)}
    return [node for node in model.graph.node if captured.intersection(node.output)]



def nested_nodes(model: onnx.ModelProto, op_types: Collection[str]) -> Counter[str]:
    """`op_types` nodes inside subgraphs, by op type: the quantizers rewrite the main graph only, so these stay
    float."""
    found: Counter[str] = Counter()

    def visit(nodes: Iterable[onnx.NodeProto], nested: bool) -> None:
        for node in nodes:
            if nested and node.op_type in op_types and node.domain in ("", "ai.onnx"):
                found[node.op_type] += 1
            for body in subgraphs_of(node):
                visit(body.node, True)

    visit(model.graph.node, False)
    return found


WEIGHTED_OP_TYPES = ("Conv", "ConvTranspose", "Gather", "Gemm", "MatMul")  # where quantization saves the most
# ONNX-ML predictors: their weights (coefficients, support vectors, trees) are attributes, not inputs; ONNX Runtime
# runs them in float whatever surrounds them
ML_PREDICTOR_OP_TYPES = frozenset({
    "LinearClassifier", "LinearRegressor", "SVMClassifier", "SVMRegressor",
    "TreeEnsemble", "TreeEnsembleClassifier", "TreeEnsembleRegressor",
})  # fmt: skip


def nested_nodes_note(model: onnx.ModelProto, op_types: Collection[str]) -> list[str]:
    """A note naming the weighted `op_types` nodes left float inside subgraphs, if any (a Slice or Unsqueeze left
    float there is not worth a line)."""
    found = nested_nodes(model, set(op_types) & set(WEIGHTED_OP_TYPES))
    if not found:
        return []
    listed = ", ".join(f"{count} {op}" for op, count in sorted(found.items()))
    return [f"{listed} inside control-flow subgraphs (If/Loop/Scan) "
            "stay float: quantization rewrites the main graph only"]


def float64_nodes(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes with a float64 input or output (a scikit-learn model converted with double inputs)."""
    return [node.name for node in computing_in_float64(model) if node.name]


def computing_in_float64(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The main graph's nodes with a float64 input or output, named or not."""
    graph = model.graph
    declared = [*graph.input, *graph.output, *graph.value_info]
    casts = any(a.name == "to" and a.i == onnx.TensorProto.DOUBLE for n in graph.node for a in n.attribute)
    if not casts and all(t.data_type != onnx.TensorProto.DOUBLE for t in graph.initializer) and all(
        v.type.tensor_type.elem_type != onnx.TensorProto.DOUBLE for v in declared
    ):
        return []  # no float64 anywhere: the common case costs no shape inference
    try:
        declared = [*declared, *infer_shapes(model).graph.value_info]
    except Exception:  # noqa: BLE001 - inference is a refinement; the declared types still count
        pass
    types = {v.name: v.type.tensor_type.elem_type for v in declared} | {t.name: t.data_type for t in graph.initializer}
    return [node for node in graph.node
            if any(types.get(t) == onnx.TensorProto.DOUBLE for t in (*node.input, *node.output))]  # fmt: skip


def reference_arithmetic(model: onnx.ModelProto) -> str | None:
    """What a float reference computes in where that is not FP32 alone: 'float64' where every node of its main graph
    has a float64 input or output, 'fp32 and float64 (2 of 5 nodes in float64)' where some do; None where none do.
    A variant left as the reference computes as it does, so a note saying it 'computes in fp32' was untrue there."""
    doubles, total = len(computing_in_float64(model)), len(model.graph.node)
    if not doubles:
        return None
    return "float64" if doubles == total else f"fp32 and float64 ({doubles} of {total} nodes in float64)"


def nothing_to_quantize(op_types: Collection[str], model: onnx.ModelProto) -> str:
    """The 'nothing to quantize' reason for a graph without quantizable nodes."""
    others = sorted({node.op_type for node in model.graph.node if node.domain not in ("", "ai.onnx")})
    kept = f"; {', '.join(others)} stay FP32" if others else ""
    named = ", ".join(sorted(op_types)) if len(op_types) <= 6 else "quantizable"
    where = "computing in float32" if _float64_layers(model, op_types) else "in the standard ONNX domain"
    clauses = f"{kept}{float64_clause(model, op_types)}{nested_clause(model, op_types)}"
    return f"nothing to quantize (no {named} node {where}{clauses})"


def float64_clause(model: onnx.ModelProto, op_types: Collection[str]) -> str:
    """'; 2 MatMul compute in float64, which ONNX Runtime's quantizers leave as they are' for a 'nothing to quantize'
    reason ('; the graph computes in float64, ...' where no node of `op_types` does; '' in a graph without float64):
    a double MLP was said to hold 'no MatMul node' though two held its weights."""
    if not computing_in_float64(model):
        return ""
    wide = _float64_layers(model, op_types)
    if not wide:
        return "; the graph computes in float64, which ONNX Runtime's quantizers leave as it is"
    listed = ", ".join(f"{count} {op}" for op, count in sorted(wide.items()))
    return f"; {listed} compute in float64, which ONNX Runtime's quantizers leave as they are"


def _float64_layers(model: onnx.ModelProto, op_types: Collection[str]) -> Counter[str]:
    """The main graph's standard nodes of `op_types` that compute in float64, by op type."""
    return Counter(node.op_type for node in computing_in_float64(model)
                   if node.domain in ("", "ai.onnx") and node.op_type in op_types)  # fmt: skip


def nested_clause(model: onnx.ModelProto, op_types: Collection[str]) -> str:
    """'; 4 MatMul only inside control-flow subgraphs ...' for a 'nothing to quantize' reason, '' with none there: a
    graph whose layers all sit in If/Loop/Scan bodies quantizes nothing whatever else its main graph holds."""
    inside = ", ".join(f"{count} {op}" for op, count in sorted(nested_nodes(model, op_types).items()))
    if not inside:
        return ""
    return f"; {inside} only inside control-flow subgraphs (If/Loop/Scan), which quantization leaves float"
