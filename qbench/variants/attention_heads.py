"""An attention context traced back to the V tensor it is linear in, for SmoothQuant's fold (variants.smoothquant).

Multi-head attention computes context = merge(A @ split(V)): split reshapes V's last axis into (heads, head_dim)
and moves heads before the tokens, A (softmax(Q K^T)) mixes tokens, never channels, and merge moves heads back
and flattens (heads, head_dim). So context is LINEAR in V's channels: dividing context channel c by s_c equals
dividing V's channel c by s_c, PROVIDED merge puts (head h, dim d) back on the channel split took it from,
h * head_dim + d. That is proven here from the graph, by rule, never from node names:

    v --Reshape--> y --Transpose(p)--> vh;   a @ vh (MatMul) --> ctx --Transpose(q)--> x --Reshape--> context

- split: y ends in two known dims (H, D) with H * D = width, so y[..., h, d] = v[..., h * D + d];
- p keeps D last and moves H to a batch axis of the MatMul (not one of its last two, which it contracts);
- vh is the MatMul's second input, once (its last axis is kept, its second-to-last contracted over tokens);
- q keeps D last and puts the same batch axis (counted from the right, as MatMul broadcasts) just before it;
- merge: the context's last axis is known to be width, so in row-major order it flattens x's last two axes
  (H * D = width; with H = 1 broadcast over A's heads, D = width itself), channel h * D + d.
Dims come from ONNX Runtime's symbolic shape inference (`GraphView.symbolic_dims`), which resolves the -1 and the
run-time shapes exporters write. Every tensor from v to context has no other reader (Shape/Size aside), so nothing
else sees V rescaled. Any other chain is not proven, and SmoothQuant keeps its Mul there.
"""

from __future__ import annotations

from qbench.variants.linear_graph import GraphView, node_attribute


def head_merge_source(view: GraphView, context: str, width: int) -> tuple[list[int], str] | None:
    """The nodes from `context`'s producer back to the split Reshape (merge, Transpose, MatMul, Transpose, split, and
    any Reshape between them that keeps its input's shape), and the tensor v whose channel c is `context`'s channel
    c (its own producer is for the caller to fold into); None when the graph does not prove it (module docstring)."""
    chain: list[int] = []
    steps: list[int] = []  # the chain's merge, Transpose, MatMul, Transpose and split, without identity Reshapes
    tensor, reader = context, None
    for op_type in ("Reshape", "Transpose", "MatMul", "Transpose", "Reshape"):
        index = _produced_by(view, tensor, op_type, reader)
        while index is None and (same := _same_shape_reshape(view, tensor, reader)) is not None:
            chain.append(same)  # torch's SDPA export reshapes the context to the shape it has: an identity
            tensor, reader = view.nodes[same].input[0], same
            index = _produced_by(view, tensor, op_type, reader)
        if index is None:
            return None
        node = view.nodes[index]
        tensor = node.input[1] if op_type == "MatMul" else node.input[0]  # the MatMul's values are its second input
        if list(node.input).count(tensor) != 1:
            return None
        chain.append(index)
        steps.append(index)
        reader = index
    _, transpose_out, _, transpose_values, split = (view.nodes[index] for index in steps)
    heads, head_dim = _last_dims(view, split.output[0], 2) or (0, 0)
    if heads * head_dim != width or _last_dims(view, context, 1) != [width]:
        return None
    if not view.read_only_by(tensor, [chain[-1]], shape_readers=True):
        return None
    p = list(node_attribute(transpose_values, "perm", []))
    q = list(node_attribute(transpose_out, "perm", []))
    if len(p) < 3 or len(q) < 3 or p[-1] != len(p) - 1 or q[-1] != len(q) - 1 or len(p) - 2 not in p:
        return None
    head_axis = p.index(len(p) - 2) - len(p)  # where vh holds y's heads, counted from the right
    if head_axis > -3 or q[-2] - len(q) != head_axis:
        return None
    return chain, tensor


def _produced_by(view: GraphView, tensor: str, op_type: str, reader: int | None) -> int | None:
    """The index of the ONNX-domain `op_type` node producing `tensor`, when `reader` (if given) alone reads it."""
    index = view.producer.get(tensor)
    if index is None or view.nodes[index].op_type != op_type or view.nodes[index].domain not in ("", "ai.onnx"):
        return None
    if reader is not None and not view.read_only_by(tensor, [reader], shape_readers=True):
        return None
    return index


def _same_shape_reshape(view: GraphView, tensor: str, reader: int | None) -> int | None:
    """The Reshape producing `tensor` (read by `reader` alone) when its output's dims are its input's, each known
    (a number, or a symbol shape inference proved equal): it moves no element."""
    index = _produced_by(view, tensor, "Reshape", reader)
    if index is None or view.nodes[index].input[0] == view.nodes[index].input[1]:
        return None
    before, after = view.symbolic_dims(view.nodes[index].input[0]), view.symbolic_dims(tensor)
    return index if before is not None and before == after and None not in before else None


def _last_dims(view: GraphView, tensor: str, count: int) -> list[int] | None:
    """`tensor`'s last `count` dims when all are known positive numbers, else None."""
    dims = view.symbolic_dims(tensor)
    if dims is None or len(dims) < count:
        return None
    last = dims[len(dims) - count :]
    return [int(d) for d in last] if all(isinstance(d, int) and d > 0 for d in last) else None
