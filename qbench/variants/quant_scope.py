"""Where static INT8 Q/DQ does not go: the preprocessing in front of a network, and the steps on an ONNX-ML
predictor's output.

Preprocessing is what computes before any layer with weights, whatever the model is or where it
came from: feature scaling, one-hot encoding and the concatenation of raw input columns in a
converted scikit-learn pipeline, an input normalisation. An ONNX-ML predictor (a linear model, an SVM,
a tree ensemble) is such a layer too, though its weights are attributes: ONNX Runtime runs it in float
whatever surrounds it, so Q/DQ on the features in front of it would only round them. No integer kernel runs there, so
quantizing it saves nothing, and rounding raw features can erase one before the network sees
it: a quantized Concat writes all its inputs on its output's one scale, and an age of 18..80
beside incomes of 2e3..2e5 keeps none of the 256 levels. The network's first layers still
quantize their own inputs, each on its own range.

The steps after an ONNX-ML predictor that no standard-domain layer with weights computes through (onnxmltools'
Mul of a LightGBM classifier's probabilities by 1, a Cast of a regressor's prediction) read that predictor's float
output: Q/DQ there only rounds its scores, and a static build of a tree ensemble quantized that Mul and was reported
as an INT8 model, though every tree ran in FP32.

Nor does it go on a node whose output an If/Loop/Scan body reads by name (`quantizable.unquantizable_nodes`);
`subgraph_read_kept_float` names those a build leaves float for it, as nothing else would.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

import onnx

from qbench.onnx_read import computed_from_constants
from qbench.variants.onnx_utils import name_unnamed_nodes
from qbench.variants.quantizable import ML_PREDICTOR_OP_TYPES, WEIGHTED_OP_TYPES, subgraph_read_producers

# Layers whose weight is a constant operand; Gather-like lookups count when their table is a constant.
_WEIGHTED_OP_TYPES = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "Einsum", "LSTM", "GRU", "RNN"})
_LOOKUP_OP_TYPES = frozenset({"Gather", "GatherElements", "GatherND", "Embedding"})

def _has_weights(node: onnx.NodeProto, constants: set[str]) -> bool:
    if node.domain == "ai.onnx.ml":
        return node.op_type in ML_PREDICTOR_OP_TYPES
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in _LOOKUP_OP_TYPES:
        return bool(node.input) and node.input[0] in constants
    computed = [name for name in node.input if name and name not in constants]
    return node.op_type in _WEIGHTED_OP_TYPES and bool(computed) and len(computed) < len([n for n in node.input if n])


def preprocessing_nodes(model: onnx.ModelProto) -> list[str]:
    """Names of the main graph's nodes that compute before any layer with weights (see the module docstring);
    nodes computed from constants only are not counted. Unnamed matches are named first (in place)."""
    return _float_scope(model)[0]


def predictor_output_nodes(model: onnx.ModelProto) -> list[str]:
    """Names of the main graph's nodes that compute on ONNX-ML predictors' outputs with no standard-domain layer with
    weights on the way (see the module docstring). Unnamed matches are named first (in place)."""
    return _float_scope(model)[1]


def _float_scope(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """(preprocessing_nodes, predictor_output_nodes), found in one walk of the main graph in order."""
    graph = model.graph
    constants = computed_from_constants(graph)
    network: set[str] = set()  # tensors a standard-domain layer with weights has contributed to
    predicted: set[str] = set()  # tensors an ONNX-ML predictor has contributed to, and no such layer
    before: list[int] = []
    after: list[int] = []
    weighted = False
    for index, node in enumerate(graph.node):
        computed = [name for name in node.input if name and name not in constants]
        if not computed:
            continue
        if _has_weights(node, constants):
            weighted = True
            (predicted if node.domain == "ai.onnx.ml" else network).update(node.output)
        elif network.intersection(computed):
            network.update(node.output)
        elif predicted.intersection(computed):
            predicted.update(node.output)
            after.append(index)
        else:
            before.append(index)
    if not weighted:  # no layer with weights at all: nothing is "before" the network
        return [], []
    if any(not graph.node[i].name for i in before + after):
        name_unnamed_nodes(model)
    return [graph.node[i].name for i in before], [graph.node[i].name for i in after]


# (domain, op type) -> the inputs that are tables whose rows the op reads at integer ids: an embedding `Gather`, and
# ONNX Runtime's fused BERT embedding (its word, position and segment tables).
TABLE_INPUTS = {("", "Gather"): (0,), ("", "GatherElements"): (0,), ("", "GatherND"): (0,),
                 ("com.microsoft", "EmbedLayerNormalization"): (2, 3, 4)}  # fmt: skip


def table_lookups(model: onnx.ModelProto, op_types: tuple[str, ...]) -> dict[str, str]:
    """Name -> op type of the main graph's `op_types` nodes that look rows up in a constant table (an embedding).

    Such an op computes nothing with its table: it copies rows out. No integer kernel runs there, so quantizing the
    table only stores it in 8 bits and rounds every row read (ONNX Runtime's dynamic quantizer does so for Gather and
    EmbedLayerNormalization: a quarter more output error on an optimised BERT, no time saved)."""
    constants = computed_from_constants(model.graph)
    found = {}
    for node in model.graph.node:
        domain = "" if node.domain == "ai.onnx" else node.domain
        tables = [node.input[i] for i in TABLE_INPUTS.get((domain, node.op_type), ()) if i < len(node.input)]
        if node.op_type in op_types and any(table and table in constants for table in tables):
            found[node.name] = node.op_type
    return found


def subgraph_read_kept_float(model: onnx.ModelProto, op_types: Collection[str]) -> tuple[list[str], list[str]]:
    """The `op_types` nodes kept float because a subgraph reads their output (`unquantizable_nodes`), and a note
    naming the weighted ones: a MatMul whose output an If/Loop/Scan body reads is a main-graph layer left FP32,
    which neither the quantized counts nor the subgraph note (`nested_nodes_note`) would otherwise say."""
    kept = [node for node in subgraph_read_producers(model)
            if node.op_type in op_types and node.domain in ("", "ai.onnx")]  # fmt: skip
    weighted = [node for node in kept if node.op_type in WEIGHTED_OP_TYPES]
    if not weighted:
        return [node.name for node in kept], []
    counts = Counter(node.op_type for node in weighted)
    listed = ", ".join(f"{count} {op}" for op, count in sorted(counts.items()))
    named = ", ".join(node.name or "<unnamed>" for node in weighted[:5]) + (", ..." if len(weighted) > 5 else "")
    return [node.name for node in kept], [
        f"{listed} of the main graph kept float ({named}): a control-flow subgraph (If/Loop/Scan) reads each one's "
        "output by name, a reader the quantizers do not see"]


def nothing_quantized_note(params: dict) -> str:
    """The note of a build that quantized no node, naming what kept its layers float where the build knows it (a
    subgraph reading their outputs) rather than only the recipe fields that could have."""
    read = params.get("subgraph_read_kept_float") or []
    check = "check op_types, exclude_nodes and keep_float"
    why = (f"{len(read)} node(s) a control-flow subgraph reads ({', '.join(read[:5])}) stay float; else {check}"
           if read else check)
    return f"no node was quantized: this variant computes in FP32 ({why})"
