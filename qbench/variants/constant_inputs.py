"""Weights computed from constants, folded into initializers before quantization.

Exporters often leave a weight behind a small constant computation: `MatMul(x, Transpose(W))` (large weights are
past the exporters' constant-folding size limits), a `Constant` node, a `Reshape` or `Cast` of an initializer. A
quantizer that takes only initializers for weights then quantizes such a weight as an activation: with the
calibrator's range (an entropy or percentile range clips the weight's largest values), per tensor whatever
`per_channel` asks, and stored in float32. TensorRT and ModelOpt fold these computations first and quantize the
result as a weight, so the emulation has to as well, or its figures are those of a different model.

`fold_constant_inputs` evaluates every such input with ONNX Runtime (what the FP32 reference computes) and stores
it as an initializer of the same name; the nodes that computed it go where nothing else reads them.
"""

from __future__ import annotations

from collections.abc import Collection

import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from qbench.variants.float_support import tensor_types
from qbench.variants.onnx_utils import names_read, subgraphs_of

# Operators whose output is not a function of their inputs: never folded.
_NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}


def _cone(name: str, producers: dict[str, onnx.NodeProto], constants: set[str], seen: dict[str, bool]) -> bool:
    """Whether tensor `name` depends on constants only (initializers, deterministic standard nodes without
    subgraphs); memoised in `seen`."""
    if name in seen:
        return seen[name]
    seen[name] = False  # a cycle (impossible in a valid graph) is not constant
    node = producers.get(name)
    if name in constants:
        seen[name] = True
    elif node is not None and node.domain in ("", "ai.onnx") and node.op_type not in _NONDETERMINISTIC \
            and not subgraphs_of(node):
        seen[name] = all(_cone(i, producers, constants, seen) for i in node.input if i)
    return seen[name]


def fold_constant_inputs(model: onnx.ModelProto, reads: Collection[tuple[onnx.NodeProto, int]]) -> list[str]:
    """Make each float32 input in `reads` (node, input index) that is computed from constants only an initializer,
    in place; returns the names folded. Graph inputs are never constants (an initializer that is also a graph input
    can be overridden at run time)."""
    graph = model.graph
    overridable = {i.name for i in graph.input}
    constants = {t.name for t in graph.initializer} - overridable
    producers = {out: node for node in graph.node for out in node.output}
    seen: dict[str, bool] = {}
    types = tensor_types(model)
    names = sorted({node.input[index] for node, index in reads
                    if index < len(node.input) and node.input[index] in producers
                    and types.get(node.input[index]) == TensorProto.FLOAT
                    and _cone(node.input[index], producers, constants, seen)})  # fmt: skip
    if not names:
        return []
    cone = [node for node in graph.node if all(seen.get(out, False) for out in node.output if out)]
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
    _drop_dead(graph, {out for node in cone for out in node.output})
    return names


def _drop_dead(graph: onnx.GraphProto, candidates: set[str]) -> None:
    """Remove the nodes writing `candidates` whose outputs nothing reads any more."""
    while True:
        read = names_read(graph)
        dead = [n for n in graph.node if set(n.output) & candidates and not any(out in read for out in n.output)]
        if not dead:
            return
        for node in dead:
            graph.node.remove(node)
