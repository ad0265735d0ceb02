"""Faithful emulation of narrow float formats on runtimes that compute them in FP32.

ONNX Runtime's CPU provider has few float16 kernels: it inserts Casts around the
ops it lacks, then removes the Cast pairs it considers redundant and fuses ops
(MatMul + Mul, MatMul + Add -> Gemm), so an FP16 graph largely runs in FP32 on
CPU. An activation of 3e5 then stays 3e5 where FP16 hardware gives inf, and a
model that overflows on one slice passes on CPU and fails on a GPU.

The emulation below restores the format's semantics at every tensor boundary:
each op computes in FP32 (as hardware that accumulates in FP32 does), and each
tensor the format stores is rounded to it by an explicit Cast to the format and
back. A recurrent layer (LSTM, GRU, RNN) runs step by step with its state rounded
after every step, as narrow-float hardware stores it (emulate_recurrent), and an
inference BatchNormalization is folded into the Conv before it, as ONNX Runtime
and TensorRT fold it, so that Conv's output is rounded once (emulate_fold). ORT's Cast kernel rounds to nearest even
with IEEE semantics: beyond 65504 a float16 is inf, below 2**-24 it is 0, in between the subnormals are
kept; bfloat16 has FP32's range and 8 bits of precision. ORT keeps these Cast
pairs at every optimisation level (ORT_ENABLE_ALL included; tested), and the
Casts also stop fusions that would skip a rounding.

- `emulate_float16(model)`: an FP16 graph (as built by `fp16.build_fp16`, or any
  graph with float16 tensors) rewritten as an FP32 graph in which every tensor
  that was float16 is rounded to float16. Tensors the FP16 graph keeps in FP32
  (ops on the converter's block list) stay FP32, as on hardware.
- `round_float_tensors(model, to)`: every FLOAT tensor of an FP32 graph (node
  outputs and graph inputs) rounded to `to`; the BF16 variant is built this way.

FP8 needs no pass here: its Q/DQ graph already rounds (and saturates) exactly the
tensors that are stored in FP8 (fp8.py).

`EMULATIONS` (qbench.variants) maps a precision to the function that gives the
model to score on a backend that cannot compute that precision
(qbench.validate.fidelity decides when).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qbench.errors import QbenchError
from qbench.onnx_read import all_graphs
from qbench.recipe.variants import EMULATED_TAG
from qbench.variants.base import BuiltVariant
from qbench.variants.emulate_fold import fold_conv_batch_norms
from qbench.variants.emulate_recurrent import step_recurrent
from qbench.variants.float_support import tensor_types
from qbench.variants.onnx_utils import (
    check_model_against,
    load_model,
    round_trip,
    save_model,
    topologically_sorted,
)

EMULATED_SUFFIX = f".{EMULATED_TAG}.onnx"
_TYPE_ATTRIBUTES = ("to", "dtype", "output_dtype")


def _holds_float16(graph: onnx.GraphProto) -> bool:
    """Whether a (sub)graph declares, stores or casts to a float16 tensor."""
    declared = [*graph.input, *graph.output, *graph.value_info]
    if any(info.type.tensor_type.elem_type == TensorProto.FLOAT16 for info in declared):
        return True
    if any(tensor.data_type == TensorProto.FLOAT16 for tensor in graph.initializer):
        return True
    return any(
        (a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT16)
        or (a.name in _TYPE_ATTRIBUTES and a.i == TensorProto.FLOAT16)
        for node in graph.node
        for a in node.attribute
    )


def _round_node_outputs(
    graph: onnx.GraphProto, rounded: set[str], to: int, *, graph_output_type: int
) -> tuple[list[onnx.NodeProto], int]:
    """Nodes in order, each output in `rounded` renamed `<t>_fp32` and rounded into `<t>`.

    A graph output keeps its declared type: when that is the format itself it gets
    only the Cast to the format.
    """
    outputs = {o.name for o in graph.output}
    nodes: list[onnx.NodeProto] = []
    count = 0
    for node in graph.node:
        casts: list[onnx.NodeProto] = []
        for index, name in enumerate(node.output):
            if name not in rounded:
                continue
            node.output[index] = f"{name}_fp32"
            stays_narrow = name in outputs and graph_output_type == to
            casts.extend(round_trip(node.output[index], name, to, back=not stays_narrow))
            count += 1
        nodes.append(node)
        nodes.extend(casts)
    return nodes, count


def round_float_tensors(model: onnx.ModelProto, to: int, keep: Collection[str] = ()) -> int:
    """Rewrite an FP32 `model` in place so every float node output and graph input is rounded to `to`.

    Consumers and graph outputs keep their tensor names; a float graph input gets a
    rounded copy that its consumers read instead. Nodes named in `keep` stay FP32
    (ai.onnx.ml operators, float_support): their outputs are not rounded, and they read
    the unrounded graph inputs; a node that is rounded reads a rounded copy of a kept
    node's output. Returns how many tensors are rounded.
    """
    graph = model.graph
    types = tensor_types(model)
    initializers = {t.name for t in graph.initializer}
    floats = {name for name, kind in types.items() if kind == TensorProto.FLOAT and name not in initializers}
    rounded_nodes = [node for node in graph.node if node.name not in keep]
    produced = {name for node in rounded_nodes for name in node.output} & floats
    copies = {
        name: f"{name}_rounded"
        for node in rounded_nodes
        for name in node.input
        if name in floats and name not in produced
    }
    for node in rounded_nodes:
        for index, name in enumerate(node.input):
            if name in copies:
                node.input[index] = copies[name]
    inputs = {i.name for i in graph.input}
    head = [cast for name, copy in copies.items() if name in inputs for cast in round_trip(name, copy, to)]
    nodes, count = _round_node_outputs(graph, produced, to, graph_output_type=TensorProto.FLOAT)
    ordered: list[onnx.NodeProto] = []
    for node in nodes:
        ordered.append(node)
        ordered.extend(cast for name in node.output if name in copies for cast in round_trip(name, copies[name], to))
    graph.ClearField("node")
    graph.node.extend(head + ordered)
    return count + len(copies)


def _widen_attributes(node: onnx.NodeProto) -> None:
    """float16 constants and dtype attributes of a node become float32 (exactly: every float16 is a float32)."""
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == TensorProto.FLOAT16:
            widened = numpy_helper.to_array(attribute.t).astype(np.float32)
            attribute.t.CopyFrom(numpy_helper.from_array(widened, attribute.t.name))
        elif attribute.name in _TYPE_ATTRIBUTES and attribute.i == TensorProto.FLOAT16 and node.op_type != "Cast":
            attribute.i = TensorProto.FLOAT


def emulate_float16(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """An FP32 copy of the FP16 graph `model` that rounds every float16 tensor to float16 (module docstring).

    Returns the model and the number of rounded tensors. Graph inputs and outputs keep
    their declared types. Control-flow subgraphs with float16 tensors are refused: a
    partial emulation would not be faithful (`build_fp16` keeps control-flow nodes FP32).
    The copy is made message to message (protobuf's CopyFrom): serialising the model to parse it again would hold
    its bytes twice more, and fails for a model over protobuf's 2 GiB.
    """
    emulated = onnx.ModelProto()
    emulated.CopyFrom(model)
    count = _emulate_in_place(emulated)
    check_model_against(emulated, model)
    return emulated, count


def _emulate_in_place(model: onnx.ModelProto) -> int:
    """Rewrite the FP16 graph `model` into its emulation (see `emulate_float16`); returns the rounded tensors."""
    graph = model.graph
    if any(_holds_float16(body) for body in all_graphs(graph) if body is not graph):
        raise QbenchError("FP16 emulation does not handle float16 tensors "
                          "inside control-flow subgraphs (If, Loop, Scan)")
    types = tensor_types(model)
    half = {name for name, kind in types.items() if kind == TensorProto.FLOAT16}
    for index, tensor in enumerate(graph.initializer):
        if tensor.data_type == TensorProto.FLOAT16:
            graph.initializer[index].CopyFrom(
                numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name)
            )
    fold_conv_batch_norms(model, _to_float16, eligible=lambda node: half.issuperset(node.output))
    widened_inputs = {i.name: f"{i.name}_fp32" for i in graph.input if i.name in half}
    head = [helper.make_node("Cast", [n], [w], to=TensorProto.FLOAT, name=f"{w}_cast")
            for n, w in widened_inputs.items()]  # fmt: skip
    exact: set[str] = set()  # float16 outputs that are float16 constants: exact in float32
    for node in graph.node:
        for index, name in enumerate(node.input):
            node.input[index] = widened_inputs.get(name, name)
        if node.op_type == "Constant":
            exact.update(node.output)
        _widen_attributes(node)
        if node.op_type == "Cast" and node.output[0] in half:
            node.ClearField("attribute")
            node.attribute.append(helper.make_attribute("to", TensorProto.FLOAT))  # the round trip below narrows it
    float32_nodes = {node.name for node in graph.node if not half.intersection(node.output)}  # kept FP32 by the build
    nodes, count = _round_node_outputs(graph, half - exact, TensorProto.FLOAT16, graph_output_type=TensorProto.FLOAT16)
    graph.ClearField("node")
    graph.node.extend(topologically_sorted(head + nodes))
    step_recurrent(model, TensorProto.FLOAT16, keep=float32_nodes)
    graph.ClearField("value_info")  # float16 annotations no longer hold
    return count


def _to_float16(values: np.ndarray) -> np.ndarray:
    """float32 values stored as float16, kept as float32 (the emulation computes in float32)."""
    with np.errstate(over="ignore"):
        return values.astype(np.float16).astype(np.float32)


def emulated_model_path(artifact: Path) -> Path:
    """Where the emulation of `artifact` is saved: next to it, `<name>.emulated.onnx`."""
    return artifact.with_name(artifact.name.removesuffix(".onnx") + EMULATED_SUFFIX)


def save_float16_emulation(artifact: Path) -> tuple[Path, int]:
    """Build and save the FP16 emulation of the model file `artifact`; returns its path and the rounded tensors."""
    model = load_model(artifact)
    count = _emulate_in_place(model)  # the loaded model is this function's own: no copy of it is needed
    path = save_model(model, emulated_model_path(artifact))
    del model
    check_model_against(path, artifact)  # by path: the checker reads a model over 2 GiB, and its external data
    return path, count



@dataclass(frozen=True)
class Emulation:
    """The model whose outputs stand for a variant's accuracy on a backend that cannot compute its format."""

    scored: BuiltVariant
    method: str


def float16_emulation(built: BuiltVariant) -> Emulation:
    """The FP16 artifact's emulation, saved next to it as `<name>.emulated.onnx`."""
    try:
        path, rounded = save_float16_emulation(built.onnx_path)
    except QbenchError as exc:  # its cause kept: a full disk is the machine's fault, which --resume runs again
        raise QbenchError(f"variant {built.name!r}: {exc}") from exc
    scored = dataclasses.replace(built, onnx_path=path, session_hints={})
    method = (f"FP16 emulated: FP32 compute, {rounded} float16 tensors rounded to float16 at every op boundary "
              "(IEEE: inf beyond 65504, 0 below 2**-24); LSTM/GRU/RNN state rounded at every step; "
              "BatchNorm folded into the Conv before it")  # fmt: skip
    return Emulation(scored, method)


def qdq_emulation(built: BuiltVariant) -> Emulation:
    """A Q/DQ graph is its own emulation: every stored tensor is quantized, the compute is FP32."""
    method = (f"{built.precision.upper()} emulated by its Q/DQ graph: stored tensors rounded (saturating) "
              "to the format, FP32 compute")  # fmt: skip
    return Emulation(built, method)
