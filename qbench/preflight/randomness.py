"""A reference that draws random numbers is refused before anything is measured: its figures would be noise.

Every figure qbench reports compares a variant's outputs with FP32's on the same rows. A graph that samples
(RandomNormalLike noise added as a VAE's sampler does, a Bernoulli or Multinomial draw, a Dropout exported in
training mode) gives other outputs for the same rows on every run, so a variant's agreement, its drops and the gate's
verdict measure that noise: the same sweep passed a variant once and failed it the next time. Running the reference
twice on a few rows cannot settle it (a draw that moves a class score by 0.05 changed no class among 8 rows about
half the time, and 2 % of 600), so the graph is read: a random node that an evaluated output is computed from is
refused, whatever the rows showed. A seed attribute does not help: ONNX Runtime seeds the node's generator once per
session and draws anew on every run.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from pathlib import Path

import onnx

from qbench.modelinfo.classes import each_once
from qbench.variants.onnx_utils import subgraphs_of

# Ops whose outputs are draws, whatever their inputs (Dropout draws only in training mode: `_draws`).
RANDOM_OPS = frozenset({"Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike", "RandomUniform",
                        "RandomUniformLike"})  # fmt: skip
EVAL_EXPORT = "export it in inference mode (PyTorch: model.eval(), and torch.onnx.export's training=TrainingMode.EVAL)"
_SHOWN = 3


def random_sources(path: Path, outputs: Collection[str]) -> dict[str, list[onnx.NodeProto]]:
    """Evaluated output -> the nodes it is computed from that draw random numbers (an If/Loop/Scan whose body draws
    counts as drawing; local functions are inlined first, so a draw in a layer's function is one of its nodes, named
    `<call site>/<node>`); outputs computed from none are left out, as is a graph that cannot be read."""
    from qbench.onnx_read import read_onnx

    try:
        graph = read_onnx(path).graph
    except Exception:  # noqa: BLE001 - an unreadable model is refused by the checks that load it
        return {}
    producers = {out: node for node in graph.node for out in node.output if out}
    fed = {tensor.name for tensor in graph.input} - {tensor.name for tensor in graph.initializer}
    off = _false_constants(graph) | fed  # a training_mode fed from the data: the rows run twice show what it does
    found = {}
    for output in outputs:
        drawing = []
        for tensor, waiting in each_once(output):
            node = producers.get(tensor)
            if node is None:
                continue
            if _draws(node, off) and node not in drawing:
                drawing.append(node)
            waiting.extend(name for name in node.input if name)
        if drawing:
            found[output] = drawing
    return found


def random_refusal(output: str, nodes: list[onnx.NodeProto], *, torch: bool = False) -> str:
    """"output 'y' is computed through nodes that draw random numbers on every run: ...; expected ...: <remedy>";
    `torch`: the graph is qbench's export of a module in eval mode, so a Dropout in it is forced on in forward()."""
    named = ", ".join(f"{node.op_type} {node.name!r}" if node.name else node.op_type for node in nodes[:_SHOWN])
    more = f" and {len(nodes) - _SHOWN} more" if len(nodes) > _SHOWN else ""
    remedies = []
    if any(node.op_type == "Dropout" for node in nodes):
        remedies.append("forward() keeps dropout on in eval mode (F.dropout(..., training=True)): pass "
                        "training=self.training; a torch.export program keeps the mode it was exported in: export "
                        "it from model.eval()" if torch else f"{EVAL_EXPORT}, where Dropout passes its input through")
    if any(node.op_type != "Dropout" for node in nodes):
        seeded = " (a seed attribute does not help: the runtime draws anew on every run)" if any(
            attribute.name == "seed" for node in nodes for attribute in node.attribute) else ""  # fmt: skip
        remedies.append(f"a sampler draws in inference mode too{seeded}: have the model return its deterministic "
                        f"part (a VAE's mean rather than its sample, the scores before sampling), or take the noise "
                        f"as a model input fed from a data column")  # fmt: skip
    return (f"output {output!r} is computed through nodes that draw random numbers on every run: {named}{more}, so "
            f"the same rows give other outputs each time and every figure compared with FP32 would measure that "
            f"noise; expected a deterministic model: {'; '.join(remedies)}")  # fmt: skip


def _draws(node: onnx.NodeProto, off: set[str]) -> bool:
    """Whether `node` draws random numbers: a random op, a Dropout whose training_mode input is not in `off` (a
    constant false, a graph input; opset 12 on: earlier Dropouts never draw at inference), or a node whose subgraph
    holds one of those."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in RANDOM_OPS:
        return True
    if node.op_type == "Dropout":
        return len(node.input) > 2 and bool(node.input[2]) and node.input[2] not in off
    return any(_draws(inner, off | _false_constants(body)) for body in subgraphs_of(node) for inner in body.node)


def _false_constants(graph: onnx.GraphProto) -> set[str]:
    """The names of `graph`'s constants (initializers, Constant nodes' values) that hold a single false value. Only
    one-element tensors stored in the file are read: a weight's values (in external data, or megabytes) never are."""
    from onnx import numpy_helper

    tensors = {tensor.name: tensor for tensor in graph.initializer}
    tensors.update({node.output[0]: attribute.t for node in graph.node if node.op_type == "Constant" and node.output
                    for attribute in node.attribute if attribute.name == "value"})  # fmt: skip
    scalars = {name: tensor for name, tensor in tensors.items()
               if math.prod(tensor.dims) == 1 and tensor.data_location != onnx.TensorProto.EXTERNAL}  # fmt: skip
    return {name for name, tensor in scalars.items() if not numpy_helper.to_array(tensor).any()}
