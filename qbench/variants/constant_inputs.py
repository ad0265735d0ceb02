"""Weights computed from constants, folded into initializers before quantization.

Exporters often leave a weight behind a small constant computation: `MatMul(x, Transpose(W))` (large weights are
past the exporters' constant-folding size limits), a `Constant` node, a `Reshape` or `Cast` of an initializer. A
quantizer that takes only initializers for weights then quantizes such a weight as an activation: with the
calibrator's range (an entropy or percentile range clips the weight's largest values), per tensor whatever
`per_channel` asks, and stored in float32. TensorRT and ModelOpt fold these computations first and quantize the
result as a weight, so the emulation has to as well, or its figures are those of a different model.

`fold_constant_inputs` evaluates every such input with ONNX Runtime (what the FP32 reference computes) and stores
it as an initializer of the same name; the nodes that computed it go where nothing else reads them. A
`DequantizeLinear` of a weight stored in 8 bits or fewer ends the search: its output is a weight the model stores
quantized (a weight-only quantized model), which folding would widen back to float32 and quantize a second time. One
of a weight stored in 16 or 32 bits (an int16 weight, an int32 bias: a reference the preflight accepts as FP32, see
qbench.preflight.precision) is folded like a Cast of a float16 weight: left in place, the quantizer took it for an
activation, kept the int16 weight and only rounded what the layer read, so an "INT8" variant computed in FP32.
"""

from __future__ import annotations

from collections.abc import Collection

import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from qbench.preflight.randomness import RANDOM_OPS
from qbench.variants.float_support import tensor_types
from qbench.variants.onnx_utils import names_read, subgraphs_of

# Operators whose output is not a function of their inputs: never folded.
_NOT_FOLDED = RANDOM_OPS
# the stored types a DequantizeLinear of a weight is folded from (wider than the 8 bits a variant quantizes to)
_WIDE_STORED = {TensorProto.INT16, TensorProto.UINT16, TensorProto.INT32}


def _foldable(node: onnx.NodeProto, constant: set[str], stored: dict[str, int]) -> bool:
    """Whether `node` computes from constants only: a deterministic standard node without subgraphs, a
    DequantizeLinear only of an initializer stored in 16 or 32 bits (`stored`: initializer -> type), whose inputs
    are all in `constant`."""
    if node.op_type == "DequantizeLinear" and stored.get(node.input[0]) not in _WIDE_STORED:
        return False
    return node.domain in ("", "ai.onnx") and node.op_type not in _NOT_FOLDED and not subgraphs_of(node) \
        and all(name in constant for name in node.input if name)


def _constant_tensors(graph: onnx.GraphProto, constants: set[str]) -> set[str]:
    """The tensors computed from `constants` only: one pass over the (topologically sorted) nodes, no recursion, so a
    graph thousands of nodes deep costs what a shallow one does."""
    constant = set(constants)
    stored = {t.name: t.data_type for t in graph.initializer if t.name in constants}
    for node in graph.node:
        if _foldable(node, constant, stored):
            constant.update(name for name in node.output if name)
    return constant


def _cone(names: Collection[str], producers: dict[str, onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes that compute the constant tensors `names`, in graph order (walked back from them)."""
    needed: dict[int, onnx.NodeProto] = {}
    stack = list(names)
    while stack:
        node = producers.get(stack.pop())
        if node is not None and id(node) not in needed:
            needed[id(node)] = node
            stack.extend(name for name in node.input if name)
    return list(needed.values())


def fold_constant_inputs(model: onnx.ModelProto, reads: Collection[tuple[onnx.NodeProto, int]]) -> list[str]:
    """Make each float32 input in `reads` (node, input index) that is computed from constants only an initializer,
    in place; returns the names folded. Graph inputs are never constants (an initializer that is also a graph input
    can be overridden at run time)."""
    graph = model.graph
    overridable = {i.name for i in graph.input}
    constants = {t.name for t in graph.initializer} - overridable
    producers = {out: node for node in graph.node for out in node.output}
    computed = _constant_tensors(graph, constants) - constants
    candidates = {node.input[index] for node, index in reads if index < len(node.input)} & computed
    if not candidates:
        return []
    types = tensor_types(model)
    names = sorted(name for name in candidates if types.get(name) == TensorProto.FLOAT)
    if not names:
        return []
    order = {id(node): position for position, node in enumerate(graph.node)}
    cone = sorted(_cone(names, producers), key=lambda node: order[id(node)])
    read = {name for node in cone for name in node.input}
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in names]
    weights = [t for t in graph.initializer if t.name in constants and t.name in read]
    sub_model = helper.make_model(helper.make_graph(cone, "constants", [], outputs, weights),
                                  opset_imports=model.opset_import, ir_version=model.ir_version)  # fmt: skip
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(sub_model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    values = dict(zip(names, session.run(names, {}), strict=True))
    for name in names:
        node = producers[name]
        node.output[list(node.output).index(name)] = f"{name}/folded"  # an output no one reads: dropped below
        graph.initializer.append(numpy_helper.from_array(values[name], name))
    _drop_dead(graph, {out for node in cone for out in node.output}, read & constants)
    return names


def _drop_dead(graph: onnx.GraphProto, candidates: set[str], weights: set[str]) -> None:
    """Remove the nodes writing `candidates` whose outputs nothing reads any more, then the initializers among
    `weights` nothing reads (a Transposed weight's original: ONNX Runtime warns about it and it would weigh in the
    variant's size)."""
    while True:
        read = names_read(graph)
        dead = [n for n in graph.node if set(n.output) & candidates and not any(out in read for out in n.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    unread = [t for t in graph.initializer if t.name in weights and t.name not in read]
    for tensor in unread:
        graph.initializer.remove(tensor)
