"""Gemm nodes rewritten for ONNX Runtime's INT8 quantizers: as MatMul (+ Add) for the dynamic one
(`gemms_as_matmul`), with plain factors and a 1-D bias for the static one (`plain_gemm_factors`).

`quantize_dynamic` quantizes only the op types of its IntegerOps registry: MatMul, but not
Gemm. A PyTorch `nn.Linear` on a 2-D input exports as a Gemm, so without this rewrite dynamic
INT8 of an MLP quantizes nothing and the "INT8" variant is the FP32 model. Y = alpha * A @ op(B) +
beta * C equals MatMul(A, alpha * op(B)) + beta * C when A is 2-D (Gemm's rule) and not
transposed and B is a constant; other Gemms are left as they are. The MatMul keeps the Gemm's
name, so `exclude_nodes` still names it.

ORT's static (Q/DQ) quantizer reads a Gemm's C as one value per output column: any other shape
((1, N), (1,), or a full (M, N) of a fixed-batch model) makes it fail with numpy's own message, and
it quantizes C without its beta (beta = 2 gave 30 % error). `plain_gemm_factors` therefore folds
alpha into a constant B and beta into a constant C, stores a C that broadcasts from one value per
column as (N,), and moves any other constant C into an Add after the Gemm: the same computation.
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
        _replace_nodes(graph, nodes)
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
    scaling: list[onnx.NodeProto] = []  # a Mul by beta, where the bias is not a constant to fold it into
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
            bias = f"{prefix}_scaled_bias"
            scaling = [helper.make_node("Mul", [node.input[2], factor], [bias], name=f"{prefix}_beta_mul")]
    product = f"{prefix}_product"
    return [
        helper.make_node("MatMul", [node.input[0], weight_name], [product], name=node.name),
        *scaling,
        helper.make_node("Add", [product, bias], [node.output[0]], name=f"{prefix}_bias_add"),
    ]


def plain_gemm_factors(model: onnx.ModelProto) -> list[str]:
    """Rewrite (in place) each standard-domain Gemm with a constant B: alpha folded into B, beta into a constant C,
    a constant C of one value per output column ((1, N), (1,), a scalar) stored as (N,), any other constant C added
    after the Gemm. New initializers are written (a weight may be shared by other nodes); returns the names of the
    Gemms changed."""
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    changed: list[str] = []
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(graph.node):
        nodes.append(node)
        if node.op_type != "Gemm" or node.domain not in ("", "ai.onnx") or node.input[1] not in initializers:
            continue
        prefix = f"{node.name or 'gemm'}_{index}"
        alpha, beta = float(node_attribute(node, "alpha", 1.0)), float(node_attribute(node, "beta", 1.0))
        weight = numpy_helper.to_array(initializers[node.input[1]])
        columns = weight.shape[0] if node_attribute(node, "transB", 0) else weight.shape[1]
        folded: dict[str, float] = {}
        if alpha != 1.0:
            node.input[1] = _add_constant(graph, f"{prefix}_B_alpha", (weight * alpha).astype(weight.dtype))
            folded["alpha"] = alpha
        bias = node.input[2] if len(node.input) > 2 and node.input[2] in initializers else None
        if bias is not None:
            c = numpy_helper.to_array(initializers[bias])
            per_column = c.size in (1, columns) and (c.ndim == 0 or c.shape[-1] == c.size)
            if beta != 1.0 or c.shape != (columns,):
                plain = np.broadcast_to(c.reshape(-1), (columns,)) if per_column else c
                added = _add_constant(graph, f"{prefix}_C_plain", (plain * beta).astype(c.dtype))
                folded["beta"] = beta
                if per_column:
                    node.input[2] = added
                else:  # Gemm(A, B) + C, C broadcast as Gemm's own rule does
                    product, output = f"{prefix}_product", node.output[0]
                    del node.input[2:]
                    node.output[0] = product
                    nodes.append(helper.make_node("Add", [product, added], [output], name=f"{prefix}_bias_add"))
        if not folded:
            continue
        kept = [a for a in node.attribute if a.name not in folded]
        del node.attribute[:]
        node.attribute.extend(kept)
        changed.append(node.name)
    if changed:
        _replace_nodes(graph, nodes)
    return changed


def _add_constant(graph: onnx.GraphProto, name: str, value: np.ndarray) -> str:
    taken = {tensor.name for tensor in graph.initializer}
    unique, n = name, 0
    while unique in taken:
        n += 1
        unique = f"{name}_{n}"
    graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value), unique))
    return unique


def _replace_nodes(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    """Make `nodes` the graph's nodes, dropping the initializers only the nodes taken out read."""
    del graph.node[:]
    graph.node.extend(nodes)
    drop_unused_initializers(graph)
