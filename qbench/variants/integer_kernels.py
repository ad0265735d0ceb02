"""Which nodes of a built INT8 graph ONNX Runtime runs as integer arithmetic.

A Q/DQ graph says where values are rounded to INT8, not where INT8 arithmetic runs. ONNX Runtime's CPU
provider fuses DequantizeLinear -> op -> QuantizeLinear into an integer kernel only for ops that compute:
Conv (QLinearConv), MatMul (QLinearMatMul, or MatMulIntegerToFloat when its output stays float), Gemm
(QGemm), Add and Mul (QLinearAdd/Mul), the average pools, Sigmoid, LeakyRelu and Softmax (lookup tables).
Every other op either runs on the INT8 data only to move or select it (Concat, Reshape, Transpose,
Gather, Slice, MaxPool, ArgMax...: its values are values of its input, so INT8 saves no arithmetic there)
or runs in float on the dequantized values (LayerNormalization, ConvTranspose, Sub, ReduceMean...).
A graph whose Q/DQ pairs only sit around such ops rounds data and computes in FP32: it is counted here
as quantizing nothing, so it is flagged as the FP32 model (its pass says nothing about INT8) and no
search takes it for an INT8 win. Checked on the graph alone (no session), so it is cheap for any model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

import onnx

from qbench.variants.onnx_utils import INTEGER_KERNELS

# Fused with both operands dequantized, whether the output is re-quantized or left float.
_BOTH_OPERANDS = frozenset({"MatMul", "Gemm"})
# Fused only when their data inputs are dequantized and every reader of the output re-quantizes it;
# the number is how many leading inputs are data (Conv: X and W; a bias may stay float or int32).
_REQUANTIZED = {"Conv": 2, "Add": 2, "Mul": 2, "AveragePool": 1, "GlobalAveragePool": 1, "Sigmoid": 1,
                "LeakyRelu": 1, "Softmax": 1}  # fmt: skip
# Op types a quantizer may turn into an integer kernel: quantizing none of them lowers nothing.
COMPUTING_OP_TYPES = frozenset({*_BOTH_OPERANDS, *_REQUANTIZED, "Attention", "LSTM"})


def computing_op_types(op_types: Collection[str]) -> tuple[str, ...]:
    """The op types among `op_types` whose quantization can run integer arithmetic."""
    return tuple(op for op in op_types if op in COMPUTING_OP_TYPES)


def integer_kernel_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Op type -> main-graph nodes ONNX Runtime runs as integer kernels: Q/DQ patterns it fuses (see the module
    docstring) and the integer operators a dynamic quantizer writes (MatMulInteger, ConvInteger...)."""
    graph = model.graph
    dequantized = {node.output[0] for node in graph.node if node.op_type == "DequantizeLinear"}
    readers: dict[str, list[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.op_type)
    graph_outputs = {output.name for output in graph.output}

    def requantized(tensor: str) -> bool:
        ops = readers.get(tensor, [])
        return bool(ops) and tensor not in graph_outputs and all(op == "QuantizeLinear" for op in ops)

    counts: Counter[str] = Counter()
    for node in graph.node:
        if node.domain not in ("", "ai.onnx", "com.microsoft"):
            continue
        if node.op_type in INTEGER_KERNELS:
            counts[node.op_type] += 1
        elif node.op_type in _BOTH_OPERANDS:
            if len(node.input) >= 2 and all(name in dequantized for name in node.input[:2]):
                counts[node.op_type] += 1
        elif node.op_type in _REQUANTIZED:
            data = node.input[: _REQUANTIZED[node.op_type]]
            if len(data) == _REQUANTIZED[node.op_type] and all(name in dequantized for name in data):
                counts[node.op_type] += requantized(node.output[0])
    return {op: count for op, count in sorted(counts.items()) if count}


def rounded_only(model: onnx.ModelProto) -> dict[str, int]:
    """Op type -> main-graph nodes (besides Q/DQ) that read a dequantized tensor: where a graph with no integer
    kernel rounds data (the note names them)."""
    dequantized = {node.output[0] for node in model.graph.node if node.op_type == "DequantizeLinear"}
    counts = Counter(node.op_type for node in model.graph.node
                     if node.op_type not in ("QuantizeLinear", "DequantizeLinear") and dequantized.intersection(node.input))  # fmt: skip
    return dict(sorted(counts.items()))
