"""Keeping chosen nodes of a Q/DQ graph in float: they read the float tensors their Q/DQ pairs were made from.

    model = bypass_qdq(quantized, reference, ["/fc/Gemm"])   # a copy; `quantized` is left as it is

A quantizer that leaves a node out (`exclude_nodes`) can still hand it a Q/DQ'd activation (the tensor is
quantized for another reader), and ONNX Runtime's QDQ quantizer folds a Relu/Clip into the QuantizeLinear
that follows it. A bypassed node reads the activation from before its QuantizeLinear, with the folded
Relu/Clip applied again, and its weights and attributes from the reference (the builder may have
rewritten them, e.g. a Gemm's alpha folded into its weight): what `exclude_nodes` promises, and what
`qbench explain` measures when it ranks nodes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import onnx
from onnx import helper

from qbench.variants.onnx_utils import drop_unused_initializers, names_read


def bypass_qdq(
    quantized: onnx.ModelProto, reference: onnx.ModelProto, names: Collection[str],
    quantized_op_types: Collection[str] | None = None, *, weights_of: Collection[str] = (),
) -> onnx.ModelProto:  # fmt: skip
    """A copy of `quantized` whose nodes in `names` read float inputs: activations from before their
    QuantizeLinear (re-applying a Relu/Clip the quantizer folded into it), weights from `reference`.

    Nodes in `weights_of` read their weights from `reference` only: a node no quantizer was handed that shares a
    constant with a quantized node (ONNX Runtime's quantizers rewire every reader of a quantized initializer to its
    DequantizeLinear); the activations it reads stay as built, so the Q/DQ pair that completes its producer's integer
    kernel (a QLinearMatMul's output) stays in place.

    With `quantized_op_types` (what the quantizer quantized), their outputs are left unrounded too where no
    quantized node reads them (a graph output, an Identity): the quantizer rounds a node's output for its own
    sake (a Softmax's, an ArgMax's input) and, the node left out, would not have (a classifier's scores)."""
    model = onnx.ModelProto()
    model.CopyFrom(quantized)
    producers = {o: n for n in model.graph.node for o in n.output}
    originals = {n.name: n for n in reference.graph.node}
    reference_producers = {o: n for n in reference.graph.node for o in n.output}
    weights = {t.name: t for t in reference.graph.initializer}
    nodes: list[onnx.NodeProto] = []
    restored: dict[str, str] = {}

    def float_source(source: str) -> str:
        """`source` as the reference computes it: with the Relu/Clip the quantizer folded into its Q applied again."""
        folded, here = reference_producers.get(source), producers.get(source)
        if folded is None or here is None or folded.name == here.name or folded.op_type not in ("Relu", "Clip"):
            return source
        if source not in restored:
            restored[source] = _restore_activation(model, folded, source, weights, nodes)
        return restored[source]

    unrounded = _unneeded_dequantizations(model, producers, names, quantized_op_types)
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.output[0] in unrounded:  # the kept node's output unrounded
            node = helper.make_node("Identity", [float_source(unrounded[node.output[0]])], [node.output[0]],
                                    name=f"{node.name or node.output[0]}/float")  # fmt: skip
        bypassed = node.name in names
        original = originals.get(node.name) if bypassed or node.name in weights_of else None
        as_written = original is not None and original.op_type == node.op_type  # the reference's own node
        for index, name in enumerate(node.input if bypassed or original is not None else ()):
            dequantized, source = dequantized_from(name, producers)
            if source is not None:  # an activation: read it before its QuantizeLinear
                if bypassed:
                    node.input[index] = float_source(source)
            elif original is not None and (dequantized or as_written):  # a weight: the reference's float initializer
                weight = original.input[index] if index < len(original.input) else ""
                if weight in weights and (dequantized or weight != name):
                    node.input[index] = _add_initializer(model, weights[weight])
        if as_written:  # with the reference's weights, its attributes (alpha, beta) too
            del node.attribute[:]
            node.attribute.extend(original.attribute)
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    prune_unread(model.graph)
    return model


def _unneeded_dequantizations(
    model: onnx.ModelProto, producers: Mapping[str, onnx.NodeProto], names: Collection[str],
    quantized_op_types: Collection[str] | None,
) -> dict[str, str]:  # fmt: skip
    """A DequantizeLinear's output -> the float tensor it stands for, where the Q/DQ pair is there for nodes in `names`
    only: one of them computes or reads the tensor, and no other node of `quantized_op_types` does (the others
    compute in float anyway, like an Identity, or it is a graph output)."""
    if quantized_op_types is None:
        return {}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    found = {}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        _, source = dequantized_from(node.output[0], producers)
        computed_by = producers.get(source) if source is not None else None
        if computed_by is None:
            continue
        users = [computed_by, *readers.get(node.output[0], [])]
        kept = any(user.name in names for user in users)
        if kept and not any(user.op_type in quantized_op_types and user.name not in names for user in users):
            found[node.output[0]] = source
    return found


def dequantized_from(tensor: str, producers: Mapping[str, onnx.NodeProto]) -> tuple[bool, str | None]:
    """Whether `tensor` comes out of a DequantizeLinear, and the float tensor its QuantizeLinear
    quantized (None for a quantized initializer, i.e. a weight or bias)."""
    dq = producers.get(tensor)
    if dq is None or dq.op_type != "DequantizeLinear":
        return False, None
    q = producers.get(dq.input[0])
    return True, q.input[0] if q is not None and q.op_type == "QuantizeLinear" else None


def _restore_activation(
    model: onnx.ModelProto, original: onnx.NodeProto, tensor: str, weights: Mapping[str, onnx.TensorProto],
    nodes: list[onnx.NodeProto],
) -> str:  # fmt: skip
    """Append (after `tensor`'s producer, already in `nodes`) a copy of `original` reading `tensor`."""
    extra = [_add_initializer(model, weights[i]) if i in weights else i for i in original.input[1:]]
    node = helper.make_node(original.op_type, [tensor, *extra], [f"{tensor}/float"], name=f"{original.name}/float")
    node.attribute.extend(original.attribute)
    nodes.append(node)
    return node.output[0]


def _add_initializer(model: onnx.ModelProto, tensor: onnx.TensorProto) -> str:
    """A copy of a reference weight under a name of its own ("<name>/float"); returns that name."""
    name = f"{tensor.name}/float"
    if not any(t.name == name for t in model.graph.initializer):
        copy = model.graph.initializer.add()
        copy.CopyFrom(tensor)
        copy.name = name
    return name


def prune_unread(graph: onnx.GraphProto) -> None:
    """Drop nodes whose outputs nobody reads (the bypassed Q/DQ), then initializers nobody reads (subgraphs
    included)."""
    while dead := [n for n in graph.node if not set(n.output) & names_read(graph)]:
        for node in dead:
            graph.node.remove(node)
    drop_unused_initializers(graph)
