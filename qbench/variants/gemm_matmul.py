"""Gemm nodes rewritten as MatMul (+ Add) so ONNX Runtime's dynamic INT8 quantizer sees them.

`quantize_dynamic` quantizes only the op types of its IntegerOps registry: MatMul, but not
Gemm. A PyTorch `nn.Linear` on a 2-D input exports as a Gemm, so without this rewrite dynamic
INT8 of an MLP quantizes nothing and the "INT8" variant is the FP32 model. Y = alpha * A @ op(B) +
beta * C equals MatMul(A, alpha * op(B)) + beta * C when A is 2-D (Gemm's rule) and not
transposed and B is a constant; other Gemms are left as they are. The MatMul keeps the Gemm's
name, so `exclude_nodes` still names it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qbench.variants.linear_graph import node_attribute
from qbench.variants.onnx_utils import drop_unused_initializers


def gemms_as_matmul(model: onnx.ModelProto) -> list[str]:
    """Rewrite (in place) each standard-domain Gemm with a constant B and no transA; returns their names."""
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    rewritten: list[str] = []
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(graph.node):
        weight = (
            initializers.get(node.input[1])
            if node.op_type == "Gemm" and len(node.input) > 1
            else None
        )
        if (
            weight is None
            or node.domain not in ("", "ai.onnx")
            or node_attribute(node, "transA", 0)
        ):
            nodes.append(node)
            continue
        nodes.extend(_as_matmul(graph, node, numpy_helper.to_array(weight), index))
        rewritten.append(node.name)
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)
        drop_unused_initializers(graph)
    return rewritten


def _as_matmul(
    graph: onnx.GraphProto, node: onnx.NodeProto, weight: np.ndarray, index: int
) -> list[onnx.NodeProto]:
    alpha = float(node_attribute(node, "alpha", 1.0))
    beta = float(node_attribute(node, "beta", 1.0))
    matrix = weight.T if node_attribute(node, "transB", 0) else weight
    prefix = f"{node.name or 'gemm'}_{index}"
    weight_name = f"{prefix}_matmul_weight"
    graph.initializer.append(
        numpy_helper.from_array((alpha * matrix).astype(weight.dtype), weight_name)
    )
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if bias is None:
        return [
            helper.make_node(
                "MatMul", [node.input[0], weight_name], [node.output[0]], name=node.name
            )
        ]
    if beta != 1.0:
        constants = {tensor.name: tensor for tensor in graph.initializer}
        if bias in constants:
            scaled = numpy_helper.to_array(constants[bias]) * beta
            bias = f"{prefix}_bias"
            graph.initializer.append(
                numpy_helper.from_array(scaled.astype(weight.dtype), bias)
            )
        else:
            factor = f"{prefix}_beta"
            graph.initializer.append(
                numpy_helper.from_array(np.array(beta, dtype=weight.dtype), factor)
            )
            scaled_bias = f"{prefix}_scaled_bias"
            product = f"{prefix}_product"
            return [
                helper.make_node(
                    "MatMul", [node.input[0], weight_name], [product], name=node.name
                ),
                helper.make_node(
                    "Mul",
                    [node.input[2], factor],
                    [scaled_bias],
                    name=f"{prefix}_beta_mul",
                ),
                helper.make_node(
                    "Add",
                    [product, scaled_bias],
                    [node.output[0]],
                    name=f"{prefix}_bias_add",
                ),
            ]
    product = f"{prefix}_product"
    return [
        helper.make_node(
            "MatMul", [node.input[0], weight_name], [product], name=node.name
        ),
        helper.make_node(
            "Add", [product, bias], [node.output[0]], name=f"{prefix}_bias_add"
        ),
    ]
