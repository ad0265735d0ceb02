"""Outputs whose length depends on the data, told from the graph: what the dry run's rows cannot be relied on to show.

qbench reads one output row per input row and compares values one to one, so an output whose length the data sets
(NonMaxSuppression's detections, NonZero, Compress, Unique, a TopK whose K is computed) cannot be judged. The rows
check (qbench.preflight.rows) sees such an output where its 8 rows give other lengths; `unfixed_length` refuses it
from the graph where they happen not to: a TopK of K = min(10, the batch's positive values) keeps 10 on rows holding
10 positives each, alone or together, and fewer on later rows, which stopped the sweep once every variant was built.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qbench.modelinfo.classes import each_once
from qbench.onnx_read import computed_from_constants, infer_shapes, read_onnx
from qbench.preflight.randomness import RANDOM_OPS
from qbench.validate.outputs import VARIABLE_SHAPE

# Ops whose output length depends on the values fed (TopK and Loop only where their count is not a constant).
_VARIABLE_OPS = frozenset({"Compress", "NonMaxSuppression", "NonZero", "Unique"})
_COUNTED_OPS = {"TopK": 1, "Loop": 0}  # op -> the input holding its count
# op -> the inputs its output length is computed from, where not all of them (Compress keeps what its condition says)
_LENGTH_INPUTS = {**{op: (index,) for op, index in _COUNTED_OPS.items()}, "Compress": (1,)}
_SHAPE_OPS = frozenset({"Shape", "Size"})
_TRIED_LENGTHS = (7, 11)  # what each input length a count is computed from is set to, in turn
_HELD = 13  # what a per-row input length (a padded sequence's) is held at meanwhile
# Ops a count computed from shapes goes through (a Shape's length picked, bounded, combined).
_SHAPE_ARITHMETIC = frozenset({"Constant", "Identity", "Cast", "Gather", "Slice", "Concat", "Squeeze", "Unsqueeze",
                               "Reshape", "Add", "Sub", "Mul", "Div", "Mod", "Min", "Max", "Neg", "Abs", "Floor",
                               "Ceil", "Clip", "ReduceMin", "ReduceMax", "ReduceProd", "ReduceSum"})


def length_varying_nodes(graph: Any, output: str) -> list[Any]:
    """The nodes `output` is computed through (nearest first) whose output length may depend on the values fed:
    Compress, NonMaxSuppression, NonZero, Unique, a TopK or Loop whose count is not a constant, and a Loop whose
    condition may stop it before its count."""
    producers = {out: node for node in graph.node for out in node.output}
    constants = {node.output[0] for node in graph.node if node.op_type == "Constant" and node.output}
    constants |= {tensor.name for tensor in graph.initializer}
    found = []
    for tensor, waiting in each_once(output):
        node = producers.get(tensor)
        if node is None:
            continue
        counted = _COUNTED_OPS.get(node.op_type)
        if node.op_type in _VARIABLE_OPS or (counted is not None and (len(node.input) <= counted or node.input[counted]
                                                                        not in constants)) or (  # fmt: skip
                node.op_type == "Loop" and not _runs_its_count(node, constants)):
            found.append(node)
        waiting.extend(name for name in node.input if name)
    return found


def variable_length(graph: Any, output: str) -> str:
    """'output 'dets' is computed through NonMaxSuppression: <what to do>' when `graph` (None: unread) computes
    `output` through an op whose output length depends on the values fed, else '': the rows check's hint."""
    found = [] if graph is None else length_varying_nodes(graph, output)
    if not found:
        return ""
    ops = ", ".join(sorted({node.op_type for node in found}))
    return f"output {output!r} is computed through {ops}: {VARIABLE_SHAPE}"


def unfixed_length(path: Path, outputs: Sequence[str]) -> str | None:
    """Why one of `outputs` of the model at `path` has a length the data sets, one phrase naming the node, or None.

    Such an output is computed through a node of `length_varying_nodes` whose own output length, as onnx's shape
    inference (with data propagation) gives it, is neither a constant nor a length of the inputs (the batch, a padded
    sequence), and its own shape has such a length too (a count summed away per row leaves it fixed), as the model
    declares it and as inferred from the inputs (a dim its exporter named as no input's, tf2onnx's unk__7, is
    inferred). A count computed
    from input shapes alone (a Shape and arithmetic, which onnx does not fold past Min or Div) is computed here with
    every input length set to 7 and then 11: one value both times is a constant; K = min(10, the batch) is not."""
    try:
        read = read_onnx(path)
        # an output's shape as its exporter declared it, and as inferred from the inputs: a name the exporter gave
        # its dims (tf2onnx's unk__N, torch's ReduceSums_dim_0, another name for the batch) says nothing of where
        # their length comes from
        declared = {value.name: _copied(value.type.tensor_type) for value in read.graph.output}
        for value in read.graph.output:
            value.type.tensor_type.ClearField("shape")
        model = _kept_axes(read, infer_shapes(read, data_prop=True))
    except Exception:  # noqa: BLE001 - a graph onnx cannot infer: the rows check still compares the rows' lengths
        return None
    graph = model.graph
    initializers = {tensor.name for tensor in graph.initializer}
    fed = [value.type.tensor_type.shape.dim for value in graph.input if value.name not in initializers]
    named = {dim.dim_param for dims in fed for dim in dims if dim.dim_param}
    batch = {dims[0].dim_param for dims in fed if dims and dims[0].dim_param}
    shapes = {value.name: value.type.tensor_type for value in (*graph.value_info, *graph.output, *graph.input)}
    constant = computed_from_constants(graph, _varies)

    def fixed_type(typed: Any) -> bool:
        return typed is not None and typed.HasField("shape") and all(
            dim.HasField("dim_value") or dim.dim_param in named for dim in typed.shape.dim)

    def fixed(name: str) -> bool:
        return fixed_type(shapes.get(name)) or fixed_type(declared.get(name))

    def varies(node: Any) -> bool:
        if node.op_type == "Loop" and not _runs_its_count(node, constant):  # it may stop early: its count bounds it
            return not fixed(node.output[0])
        # a length computed from constants alone is one (NonZero of a constant mask picks the same columns every
        # row); a Loop without a count is not
        indices = _LENGTH_INPUTS.get(node.op_type, range(len(node.input)))
        if all(i < len(node.input) and node.input[i] in constant for i in indices):
            return False
        counted = _COUNTED_OPS.get(node.op_type)
        if counted is not None and len(node.input) > counted and _constant_count(model, node.input[counted], shapes,
                                                                                  named - batch):  # fmt: skip
            return False
        return not fixed(node.output[0])

    found = ((output, node) for output in outputs if not fixed(output)
             for node in length_varying_nodes(graph, output) if varies(node))  # fmt: skip
    output, node = next(found, (None, None))
    if node is None:
        return None
    counted = _COUNTED_OPS.get(node.op_type)
    count = node.input[counted] if counted is not None and len(node.input) > counted else "unset"
    how = "" if counted is None else f" (its count, {count!r}, is computed)"
    if node.op_type == "Loop" and count in constant:
        how = f" (its count, {count!r}, is a constant, but its condition may stop it sooner)"
    which = repr(node.name) if node.name else f"node making {node.output[0]!r}"
    return (f"output {output!r} is computed through {node.op_type} {which}{how}, whose output length is neither a "
            "constant nor a length of the inputs (the batch, a padded sequence), so it may change from row to row or "
            f"batch to batch however the dry run's rows came out: {VARIABLE_SHAPE}")


def _copied(typed: Any) -> Any:
    """A copy of a tensor type (onnx.TypeProto.Tensor)."""
    copy = type(typed)()
    copy.CopyFrom(typed)
    return copy


def _kept_axes(read: Any, inferred: Any) -> Any:
    """`inferred` (onnx's inference of the model `read`) again, told that a TopK keeps every axis of its input but its
    own, which onnx's inference drops where K is computed (the batch included): a TopK's values summed per row are
    then [batch]. `inferred` itself where the graph has no such TopK. `read`'s outputs carry no shape (the caller
    cleared them), so the inference gives theirs."""
    import onnx

    types = {value.name: value.type.tensor_type for value in (*inferred.graph.value_info, *inferred.graph.input)}
    told = []
    for node in inferred.graph.node:
        source = types.get(node.input[0]) if node.op_type == "TopK" and node.input else None
        if source is None or not source.HasField("shape"):
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1) % max(len(source.shape.dim), 1)
        dims = [None if index == axis else dim.dim_value if dim.HasField("dim_value") else dim.dim_param or None
                for index, dim in enumerate(source.shape.dim)]  # fmt: skip
        told += [onnx.helper.make_tensor_value_info(name, elem, dims)
                 for name, elem in zip(node.output, (source.elem_type, onnx.TensorProto.INT64)) if name]  # fmt: skip
    if not told:
        return inferred
    model = onnx.ModelProto()
    model.CopyFrom(read)
    del model.graph.value_info[:]
    model.graph.value_info.extend(told)
    return infer_shapes(model, data_prop=True)


def _varies(node: Any) -> bool:
    """A node whose outputs are no constants however constant its inputs: a random draw (other on every run), or one
    holding a subgraph (an If's branch, a Loop's body), whose values this check does not follow."""
    from onnx import AttributeProto

    return node.op_type in RANDOM_OPS or any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS)
                                             for a in node.attribute)  # fmt: skip


def _runs_its_count(loop: Any, constant: set[str]) -> bool:
    """Whether the Loop runs as many iterations as the same inputs' shapes give it every batch: its first condition
    unset or a constant, and its body's condition its input passed on (through Identity or Cast) or a constant of the
    body or of the graph around it (as torch's export writes `for i in range(n)`). A condition the body computes from
    values (stop once converged) ends it after as many iterations as the data sets."""
    if len(loop.input) > 1 and loop.input[1] and loop.input[1] not in constant:
        return False
    body = next((a.g for a in loop.attribute if a.name == "body"), None)
    if body is None or len(body.input) < 2 or not body.output:
        return False
    producers = {out: node for node in body.node for out in node.output}
    kept = body.output[0].name
    while kept in producers and producers[kept].op_type in ("Identity", "Cast"):
        kept = producers[kept].input[0]
    return kept == body.input[1].name or kept in constant or kept in computed_from_constants(body, _varies)


def _constant_count(model: Any, count: str, shapes: dict[str, Any], per_row: set[str] = frozenset()) -> bool:
    """Whether the tensor `count` is computed from constants and the shapes of tensors alone, and comes out the same
    with every length not in the graph (an unknown dimension, or a named one not in `per_row`) set to each of
    _TRIED_LENGTHS: then it is a constant the graph writes as arithmetic on shapes. `per_row`: named input lengths
    other than the batch's (a padded sequence's), held at one value: a row's length there is its input's, so a count
    of them (a sort of the sequence, K = its length) is no length the batch sets. False where it reads values, or
    cannot be computed here."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    values = {node.output[0]: a.t for node in graph.node if node.op_type == "Constant" and node.output
              for a in node.attribute if a.name == "value"}  # fmt: skip
    used, read, shaped = set(), [], {}
    for tensor, waiting in each_once(count):
        node = producers.get(tensor)
        if tensor in initializers or node is None:
            if tensor not in initializers:  # a graph input's values
                return False
            read.append(initializers[tensor])
            continue
        if node.op_type in _SHAPE_OPS:
            constant = initializers.get(node.input[0], values.get(node.input[0]))
            typed = shapes.get(node.input[0])
            if constant is not None:  # an initializer's or a Constant's dims
                dims = list(constant.dims)
            elif typed is None or not typed.HasField("shape"):
                return False
            else:
                dims = [d.dim_value if d.HasField("dim_value") else _HELD if d.dim_param in per_row else None
                        for d in typed.shape.dim]  # fmt: skip
            bounds = {a.name: a.i for a in node.attribute}  # Shape's start and end (opset 15)
            shaped[tensor] = (node.op_type, dims[bounds.get("start", 0):bounds.get("end", len(dims))])
            continue
        if node.op_type not in _SHAPE_ARITHMETIC or node.domain not in ("", "ai.onnx"):
            return False
        used.add(id(node))
        waiting.extend(name for name in node.input if name)
    nodes = [node for node in graph.node if id(node) in used]  # in the graph's (topological) order
    values = []
    for length in _TRIED_LENGTHS:
        feeds = {}
        for name, (op, dims) in shaped.items():
            filled = np.array([length if d is None else d for d in dims], dtype=np.int64)
            feeds[name] = filled if op == "Shape" else np.array(np.prod(filled), dtype=np.int64)
        inputs = [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.INT64, None) for name in feeds]
        outputs = [onnx.helper.make_tensor_value_info(count, onnx.TensorProto.UNDEFINED, None)]
        sub = onnx.helper.make_model(onnx.helper.make_graph(nodes, "count", inputs, outputs, read),
                                     opset_imports=list(model.opset_import))  # fmt: skip
        try:
            values.append(np.asarray(ReferenceEvaluator(sub).run(None, feeds)[0]))
        except Exception:  # noqa: BLE001 - what the reference cannot compute (external data): not shown constant
            return False
    return all(np.array_equal(values[0], value) for value in values[1:])
