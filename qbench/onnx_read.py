"""Reading an ONNX file into the one form qbench inspects and builds from: model-local functions inlined, and every
Constant's value a tensor.

Exporters wrap layers in ONNX local functions (`FunctionProto`: the TorchScript exporter's
`export_modules_as_functions`, onnxscript-authored models, graphs saved by onnx-ir based tools): the main graph
then holds a call node per block (`Block` in domain `__main__`) and the Conv/MatMul/Gemm it computes with sit in
the function's body. ONNX Runtime runs such a model, but every graph rewrite (ORT's quantizers and FP16 converter,
qbench's own BF16, FP8, Linear and SmoothQuant passes, the range analysis, explain) walks the main graph only: a
variant would quantize or convert the few nodes outside the functions and leave the rest FP32 while being reported
as that precision (the FP8 calibrator even fails: ORT's augmented copy calls a function it no longer declares).
Inlining once, where the model is read, gives every reader the graph that really computes.

An inlined node is named after its call site: `<call node's name>/<node's name in the function>`
(`/encoder/layer.3/Block/matmul`; an unnamed call node `<function>_<index in its graph>`, a nested call adds a
level), the path a user reads in the un-inlined model and the scope `explain --group layer` and `exclude_nodes`
work with. onnx's inliner alone names them after the function body with a counter (`matmul__7`), which says
nothing about the layer and changes when a call is added. The names are a function of the file alone, so every
read names them alike.

A Constant node may hold its value in `value` (a tensor) or in a scalar or list attribute (`value_float`,
`value_ints`, ...): torch.onnx's dynamo exporter without its optimizer writes most shapes as `value_ints` and
scalars as `value_float`. Every reader (the checks' constant shapes and tables, the builders' rewrites) and ORT's
converters read `value`: its FP16 converter narrowed a `value` tensor and declared the node's output float16, but
left a `value_float` float32 under that declaration, and ONNX Runtime refused the FP16 model (`Mul bound to
different types`). Each such attribute is read as the `value` tensor it stands for, in every subgraph too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import onnx

from qbench.errors import QbenchError, one_line

_CONSTANT_ATTRIBUTE_TYPES = {  # a Constant's value attribute other than `value`: the tensor type it stands for
    "value_float": onnx.TensorProto.FLOAT, "value_floats": onnx.TensorProto.FLOAT,
    "value_int": onnx.TensorProto.INT64, "value_ints": onnx.TensorProto.INT64,
    "value_string": onnx.TensorProto.STRING, "value_strings": onnx.TensorProto.STRING,
}  # fmt: skip


def read_onnx(path: Path, *, weights: bool = False) -> onnx.ModelProto:
    """The model at `path` with its local functions inlined and its Constants' values tensors; external tensors are
    read in only with `weights`.

    Inlining runs before the external data is loaded, so a model over protobuf's 2 GiB inlines too.
    """
    model = inline_functions(onnx.load(str(path), load_external_data=False), path)
    constant_values_as_tensors(model.graph)
    if weights:
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(model, str(Path(path).parent))
    return model


# Protobuf cannot serialise a message of 2 GiB or more; keep a margin for the graph itself.
PROTOBUF_SAFE_BYTES = 1_800_000_000
_WEIGHTLESS_BYTES = 1 << 20  # a tensor shape inference reads the values of (a Reshape's shape) is far smaller


def over_protobuf_limit(model: onnx.ModelProto) -> bool:
    """Whether `model`'s weights are too big to serialise it as one protobuf: such a model can only be written with
    external data, and whatever serialises it in memory (onnx's `infer_shapes`, `onnx.save` without external data,
    ORT's tools given the model rather than a path) fails with protobuf's "exceeds the size limit"."""
    return sum(held_bytes(t) for t in model.graph.initializer) > PROTOBUF_SAFE_BYTES


def file_over_protobuf_limit(path: Path | str) -> bool:
    """Whether the model saved at `path` holds more weight bytes, in its file and its external data together, than
    one protobuf can: whatever writes a model derived from it (ONNX Runtime's calibrator, its augmented copy) must
    write external data. Read without the external data."""
    header = onnx.load(str(path), load_external_data=False)
    return sum(stored_bytes(t) for t in header.graph.initializer) > PROTOBUF_SAFE_BYTES


def stored_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes of `tensor`'s values wherever they are stored (its raw_data or an external file), from its shape and
    element type; 0 for a type with no numpy form."""
    return _shaped_bytes(tensor) or 0


def held_bytes(tensor: onnx.TensorProto) -> int:
    """The length of `tensor`'s raw_data, told from its shape and element type: reading the field would copy its
    bytes (protobuf hands a bytes field out as a new object), the whole model's weights once per question. A 4-bit
    type, packed two values a byte, is counted a byte a value: a bound, for the size thresholds this serves."""
    if not tensor.HasField("raw_data"):
        return 0
    shaped = _shaped_bytes(tensor)
    return len(tensor.raw_data) if shaped is None else shaped  # a type with no numpy form: ask the field itself


def _shaped_bytes(tensor: onnx.TensorProto) -> int | None:
    """Its element count times its element type's size; None for a type with no numpy form."""
    try:
        return math.prod(tensor.dims) * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, ValueError):
        return None


def infer_shapes(model: onnx.ModelProto, **options: bool) -> onnx.ModelProto:
    """`onnx.shape_inference.infer_shapes(model, **options)` without serialising the weights: inference runs on the
    model's typing skeleton (its large weights are typed inputs there: their types and shapes are all it reads), and
    the result, a new model, gets `model`'s initializers back in their order. A model over protobuf's limit is
    inferred too, and a model of any size is held once more rather than four times (onnx serialises the model,
    parses it in C++, serialises the result and parses that). `model` is left as it was."""
    inferred = infer_types(model, **options)
    drop_standin_inputs(inferred.graph, standin_names(model))
    inferred.graph.ClearField("initializer")
    for tensor in model.graph.initializer:
        inferred.graph.initializer.add().CopyFrom(tensor)
    return inferred


def infer_types(model: onnx.ModelProto, **options: bool) -> onnx.ModelProto:
    """The typing skeleton of `model` (`typing_skeleton`) with onnx's shape inference run on it: every value's type
    and shape as `infer_shapes` gives them, and no copy of the large weights (typed graph inputs here), for readers of
    types and shapes only. `model` is left as it was."""
    return onnx.shape_inference.infer_shapes(typing_skeleton(model), **options)


def standin_names(model: onnx.ModelProto) -> set[str]:
    """The initializers `typing_skeleton` declares as graph inputs."""
    declared = {value.name for value in model.graph.input}
    return {t.name for t in model.graph.initializer if held_bytes(t) > _WEIGHTLESS_BYTES and t.name not in declared}


def drop_standin_inputs(graph: onnx.GraphProto, standins: set[str]) -> None:
    """Take out of `graph`, computed on a typing skeleton, the inputs standing in for the weights `standins` names,
    before those weights are put back as its initializers."""
    kept = [value for value in graph.input if value.name not in standins]
    graph.ClearField("input")
    graph.input.extend(kept)


def typing_skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """A new model with `model`'s graph and metadata in which every initializer whose values type inference never
    reads (over the weightless size) is a graph input of its type and shape instead: what ONNX Runtime needs to
    type every tensor when it loads a model, without a copy of the weights (and under protobuf's limit whatever
    their size). `model` is read, never changed."""
    skeleton = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            copy_field(skeleton, field, value)
    graph = model.graph
    for field, value in graph.ListFields():
        if field.name != "initializer":
            copy_field(skeleton.graph, field, value)
    standins = standin_names(model)
    for tensor in graph.initializer:
        if held_bytes(tensor) <= _WEIGHTLESS_BYTES:
            skeleton.graph.initializer.add().CopyFrom(tensor)
        elif tensor.name in standins:
            skeleton.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
    return skeleton


def copy_field(target: Any, field: Any, value: Any) -> None:
    """Set one field of `target` (a message of `field`'s type) to `value`, as ListFields gave them."""
    if field.is_repeated:
        getattr(target, field.name).extend(value)
    elif field.message_type is not None:
        getattr(target, field.name).CopyFrom(value)
    else:
        setattr(target, field.name, value)


def inline_functions(model: onnx.ModelProto, path: Path | str = "model") -> onnx.ModelProto:
    """`model` with every call to a model-local function replaced by the function's body (recursively, subgraphs
    too); the model itself when it has none. Opset imports only the functions' domains needed are dropped."""
    if not model.functions:
        return model
    import onnx.inliner

    function_domains = {function.domain for function in model.functions}
    model, scoped = _one_function_per_call(model)
    try:
        inlined = onnx.inliner.inline_local_functions(model, convert_version=True)
    except Exception as exc:  # noqa: BLE001 - the C++ inliner and the version converter raise several types
        raise QbenchError(one_line(f"{path}: cannot inline the model's local functions: {exc}")) from exc
    used = _domains_used(inlined.graph)
    kept = [o for o in inlined.opset_import if o.domain not in function_domains or o.domain in used]
    inlined.ClearField("opset_import")
    inlined.opset_import.extend(kept)
    _drop_inliner_suffixes(inlined.graph, scoped)
    return inlined


def subgraphs_of(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node holds (If's branches, Loop's and Scan's bodies), not those nested deeper."""
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else list(a.graphs))]


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every graph nested in its nodes, at any depth (each graph before those nested in it)."""
    yield graph
    for node in graph.node:
        for body in subgraphs_of(node):
            yield from all_graphs(body)


def constant_values_as_tensors(graph: onnx.GraphProto) -> None:
    """Every Constant node of `graph` and its subgraphs that holds its value in a scalar or list attribute holds it
    as the `value` tensor that attribute stands for (a single value: a scalar tensor; a list: a 1-D one), in place."""
    for node in graph.node:
        for body in subgraphs_of(node):
            constant_values_as_tensors(body)
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
            continue
        attribute = node.attribute[0]
        if attribute.name not in _CONSTANT_ATTRIBUTE_TYPES:
            continue
        value = onnx.helper.get_attribute_value(attribute)
        listed = attribute.type in (onnx.AttributeProto.FLOATS, onnx.AttributeProto.INTS, onnx.AttributeProto.STRINGS)
        tensor = onnx.helper.make_tensor(node.output[0], _CONSTANT_ATTRIBUTE_TYPES[attribute.name],
                                         [len(value)] if listed else [], value if listed else [value])  # fmt: skip
        node.ClearField("attribute")
        node.attribute.append(onnx.helper.make_attribute("value", tensor))


FunctionKey = tuple[str, str, str]


def _one_function_per_call(model: onnx.ModelProto) -> tuple[onnx.ModelProto, set[str]]:
    """A copy of `model` in which every call of a local function calls a copy of its own whose nodes are named
    `<call site>/<node>` (see the module docstring), and the set of names so given. Calls inside functions (nested
    layers) and inside subgraphs (If/Loop bodies) are specialised alike."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    functions: dict[FunctionKey, onnx.FunctionProto] = {(f.domain, f.name, f.overload): f for f in model.functions}
    specialised: list[onnx.FunctionProto] = []
    scoped: set[str] = set()

    def visit(nodes: list[onnx.NodeProto], prefix: str) -> None:
        for index, node in enumerate(nodes):
            node.name = f"{prefix}{node.name or f'{node.op_type}_{index}'}" if prefix or node.name else ""
            key = (node.domain, node.op_type, node.overload)
            if key in functions:
                site = node.name or f"{node.op_type}_{index}"
                body = onnx.FunctionProto()
                body.CopyFrom(functions[key])
                body.name = f"{body.name}__qbench_call{len(specialised)}"
                specialised.append(body)
                node.op_type = body.name
                visit(list(body.node), f"{site}/")
                scoped.update(n.name for n in body.node)
            for graph in subgraphs_of(node):
                visit(list(graph.node), prefix)

    visit(list(copy.graph.node), "")
    del copy.functions[:]
    copy.functions.extend(specialised)
    return copy, scoped


def _drop_inliner_suffixes(graph: onnx.GraphProto, scoped: set[str]) -> None:
    """The inliner appends `__<n>` to every node it copies: a scoped name is unique already, so it goes again."""
    taken = {n.name for n in graph.node}
    for node in graph.node:
        plain = re.sub(r"__\d+$", "", node.name)
        if plain != node.name and plain in scoped and plain not in taken:
            taken.add(plain)
            node.name = plain
        for body in subgraphs_of(node):
            _drop_inliner_suffixes(body, scoped)


def _domains_used(graph: onnx.GraphProto) -> set[str]:
    used = set()
    for node in graph.node:
        used.add(node.domain)
        for body in subgraphs_of(node):
            used |= _domains_used(body)
    return used


SHAPE_INPUTS = {"Reshape": 1, "Expand": 1, "ConstantOfShape": 0, "Tile": 1}
"""Ops whose input at that position is a shape (Tile: repeats per axis): where it is a constant, its first value is
the batch a graph fixes when it reshapes or broadcasts its rows to a constant size."""


def computed_from_constants(graph: onnx.GraphProto, varies: Callable[[onnx.NodeProto], bool] | None = None) -> set[str]:
    """The names of `graph`'s tensors that hold the same value on every run: initializers (a graph input of the same
    name included: quantizers treat it as a weight), Constant nodes' outputs, and what other nodes compute from those
    alone (a Cast or Transpose of a weight), in the graph's (topological) order. `varies`: nodes whose outputs never
    count, however constant their inputs (a random draw)."""
    constants = {tensor.name for tensor in graph.initializer}
    for node in graph.node:
        if varies is not None and varies(node):
            continue
        if node.op_type == "Constant" or (node.input and all(not name or name in constants for name in node.input)):
            constants.update(name for name in node.output if name)
    return constants


def constant_leading_sizes(model: onnx.ModelProto) -> set[int]:
    """The first values above 1 of the constant shapes the main graph's Reshape, Expand, ConstantOfShape and Tile
    nodes read (an initializer, or a Constant node's value): the batches a graph may fix that its inputs do not
    declare (a TorchScript export of `x.reshape(4, 16)` behind an input `['batch', 16]` reshapes to [4, 16])."""
    from onnx import numpy_helper

    constants = {tensor.name: tensor for tensor in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
    sizes = set()
    for node in model.graph.node:
        position = SHAPE_INPUTS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        tensor = constants.get(node.input[position]) if position is not None and len(node.input) > position else None
        if tensor is None or tensor.data_type not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            continue
        values = numpy_helper.to_array(tensor).reshape(-1)
        if values.size and int(values[0]) > 1:
            sizes.add(int(values[0]))
    return sizes
