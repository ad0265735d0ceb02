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


def bypass_qdq(quantized: onnx.ModelProto, reference: onnx.ModelProto, names: Collection[str]) -> onnx.ModelProto:
    """A copy of `quantized` whose nodes in `names` read float inputs: activations from before their
    QuantizeLinear (re-applying a Relu/Clip the quantizer folded into it), weights from `reference`."""
    model = onnx.ModelProto()
    model.CopyFrom(quantized)
    producers = {o: n for n in model.graph.node for o in n.output}
    originals = {n.name: n for n in reference.graph.node}
    reference_producers = {o: n for n in reference.graph.node for o in n.output}
    weights = {t.name: t for t in reference.graph.initializer}
    nodes: list[onnx.NodeProto] = []
    restored: dict[str, str] = {}
    for node in model.graph.node:
        original = originals.get(node.name) if node.name in names else None
        as_written = original is not None and original.op_type == node.op_type  # the reference's own node
        for index, name in enumerate(node.input if node.name in names else ()):
            dequantized, source = dequantized_from(name, producers)
            if source is not None:  # an activation: read it before its QuantizeLinear
                folded, here = reference_producers.get(source), producers.get(source)
                if (
                    folded is not None
                    and here is not None
                    and folded.name != here.name
                    and folded.op_type in ("Relu", "Clip")
                ):
                    if source not in restored:
                        restored[source] = _restore_activation(model, folded, source, weights, nodes)
                    source = restored[source]
                node.input[index] = source
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
    """Drop nodes whose outputs nobody reads (the bypassed Q/DQ), then initializers nobody reads (subgraphs included)."""
    while dead := [n for n in graph.node if not set(n.output) & names_read(graph)]:
        for node in dead:
            graph.node.remove(node)
    drop_unused_initializers(graph)
