"""A Relu or Clip that would cost the quantized MatMul/Gemm before it its integer kernel, written as Max/Min.

    rewritten = keep_integer_kernels(model)   # in place; called by the static Q/DQ builders before saving

ONNX Runtime fuses a Relu or Clip into the float MatMul/Gemm it reads when nothing it can fold follows (the
activation read by one float node, or a Relu before QuantizeLinears whose zero point does not clamp at 0: see
qbench.variants.integer_kernels, output form "blocked"). The fused FusedGemm no longer matches the Q/DQ pattern of
QGemm or MatMulIntegerToFloat, so the layer runs in float and dequantizes its 8-bit weights on every call: slower
than FP32. A static build leaves that pattern wherever a Linear + ReLU feeds a node kept float: a keep-float candidate
of the INT8 search whose kept Gemm follows a Linear + ReLU (a 3-layer MLP's head: 0.42x FP32 at batch 1, its
producer run that way, where the same graph with the ReLU as Max ran at 1.57x) or a Linear + ReLU before a
LayerNormalization. Max(x, 0) and Min(Max(x, low), high) compute what Relu and Clip do and are no activations ONNX
Runtime fuses into a Gemm, so the layer keeps its integer kernel with a float output and the activation runs after it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qbench.variants.integer_kernels import blocking_activations


def keep_integer_kernels(model: onnx.ModelProto) -> int:
    """Rewrite, in `model`'s main graph, each Relu or Clip that blocks a quantized MatMul/Gemm's integer kernel as
    Max / Min nodes computing the same values; returns how many were rewritten."""
    blocking = blocking_activations(model)  # activation's output -> the float type its values are in
    if not blocking:
        return 0
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        dtype = blocking.get(node.output[0]) if node.op_type in ("Relu", "Clip") else None
        nodes += [node] if dtype is None else _as_max_min(model, node, dtype)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return len(blocking)


def _as_max_min(model: onnx.ModelProto, node: onnx.NodeProto, dtype: np.dtype) -> list[onnx.NodeProto]:
    """`node` (a Relu or Clip) as Max(x, low) then Min(., high), each only where its bound is given (constant bounds
    in `dtype`, the type of its input); an unbounded Clip becomes an Identity."""
    if node.op_type == "Relu":
        bounds: list[str | float | None] = [0.0, None]
    elif node.input[1:]:  # Clip from opset 11: optional min and max inputs
        bounds = [name or None for name in [*node.input[1:3], ""][:2]]
    else:  # an older Clip: attributes, unbounded when absent
        given = {a.name: a.f for a in node.attribute}
        bounds = [given.get("min"), given.get("max")]
    name = node.name or node.output[0]
    source = node.input[0]
    steps = [(op, bound) for op, bound in (("Max", bounds[0]), ("Min", bounds[1])) if bound is not None]
    if not steps:
        return [helper.make_node("Identity", [source], list(node.output), name=name)]
    out: list[onnx.NodeProto] = []
    for index, (op, value) in enumerate(steps):
        bound = value if isinstance(value, str) else f"{name}/{op.lower()}_bound"
        if not isinstance(value, str):
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype), bound))
        last = index == len(steps) - 1
        output = node.output[0] if last else f"{name}/{op.lower()}"
        out.append(helper.make_node(op, [source, bound], [output], name=node.name if last else f"{name}/{op}"))
        source = output
    return out

