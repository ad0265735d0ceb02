"""Raising a model's opset (`ensure_opset`) without changing what it computes or takes.

onnx's version converter does the work; what it gets wrong is put right or refused here, for every variant that
raises the opset (ONNX Runtime's quantization pre-processing to 11, per-channel INT8, BF16 and linear INT8 to 13,
FP8 to 21): an Upsample or Resize-10 becomes a Resize-11 sampling other pixels unless given the old sampling, and an
adapter that changes the graph's inputs or outputs (Scan 8 -> 9 drops the batch axis) is a one-line error. A
Hardmax before opset 13 (which flattens its input to 2-D at `axis`) is given that flattening as nodes of its own, as
the converter does for Softmax and LogSoftmax but not for Hardmax (it kept the node, which then took the maximum along
one axis alone: every output of a [2, 3, 4] input's axis-1 Hardmax differed). A BatchNormalization before opset 9
with `spatial: 0` (statistics per element, not per channel), which the converter refuses with an assertion, is
written as the arithmetic it computes. ONNX Runtime's own operators in the ONNX domain (`_set_aside`), which the
converter has no schema for, are left as they are. A model importing no ONNX-domain opset (CatBoost's export:
`ai.onnx.ml` alone), which the converter read as opset 0 and refused, gets that import at the new opset.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
import onnx.numpy_helper
import onnx.version_converter
from onnx import helper

from qbench.errors import QbenchError
from qbench.onnx_read import drop_standin_inputs, standin_names, typing_skeleton
from qbench.variants.onnx_utils import all_nodes, check_model_against, default_opset, subgraphs_of


def ensure_opset(model: onnx.ModelProto, minimum: int) -> onnx.ModelProto:
    """The model at opset >= `minimum`, converted and checked if it was lower.

    onnx's version converter leaves the IR version as it was, which ORT rejects for
    the new opset, so the IR version is raised to what the opset needs. Each Upsample and Resize-10 it converts gets
    its old sampling (`_pre_11_resizes`); a conversion changing the graph's inputs or outputs is refused.
    """
    if default_opset(model) >= minimum:
        return model
    if not any(o.domain in ("", "ai.onnx") for o in model.opset_import):
        return _importing_onnx(model, minimum)
    model = _set_aside(model)
    if default_opset(model) < 9 <= minimum:
        model = _per_element_batchnorms(model)
    if default_opset(model) < 13 <= minimum:
        model = _hardmax_on_two_dims(model)
    resizes = _pre_11_resizes(model) if default_opset(model) < 11 <= minimum else []
    converted = _convert_version(model, minimum)
    if resizes:  # the converter renames an Upsample's output and drops its name, but keeps the nodes in order
        converted_resizes = [node for node in all_nodes(converted.graph) if _is_resize(node)]
        if len(converted_resizes) != len(resizes):
            raise QbenchError(f"raising opset {default_opset(model)} to {minimum} turned {len(resizes)} Upsample/"
                              f"Resize node(s) into {len(converted_resizes)} Resize node(s); expected one each")
        for node, (name, attributes) in zip(converted_resizes, resizes, strict=True):
            node.name = node.name or name
            node.attribute.extend(helper.make_attribute(key, value) for key, value in attributes.items())
    _check_interface_kept(model, converted, minimum)
    needed = helper.find_min_ir_version_for(list(converted.opset_import), ignore_unknown=True)  # com.microsoft etc.
    converted.ir_version = max(converted.ir_version, needed)
    check_model_against(converted, model)
    return _put_back(converted)


def _importing_onnx(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """A copy of `model`, which imports no ONNX-domain opset, importing it at `opset`. Such a model (CatBoost's
    export: a TreeEnsembleClassifier and a ZipMap under `ai.onnx.ml` alone) holds no ONNX-domain node to convert
    (the checker refuses a node of a domain the model does not import); the import is for the nodes a build adds.
    onnx's version converter read the missing import as opset 0 and stopped on an assertion ('invalid version (must
    be between 1 and 28)'), so every per-channel INT8, SmoothQuant and `linear` build of such a model failed, and
    the INT8 search reported that failure instead of there being nothing to quantize."""
    converted = onnx.ModelProto()
    converted.CopyFrom(model)
    converted.opset_import.append(helper.make_opsetid("", opset))
    needed = helper.find_min_ir_version_for(list(converted.opset_import), ignore_unknown=True)
    converted.ir_version = max(converted.ir_version, needed)
    return converted


def _convert_version(model: onnx.ModelProto, minimum: int) -> onnx.ModelProto:
    """onnx's version converter run on `model`'s typing skeleton (qbench.onnx_read: its large weights are typed graph
    inputs there), with those weights put back, in their places, into the converted model. The converter serialises
    what it is given and parses its result: given the weights, it held them three times more and failed on a model
    over protobuf's 2 GiB ("Unable to parse proto from the given bytes"), so an FP8 build of such a model failed.
    No adapter reads a weight's values (those it reads, a Reshape's shape or a Resize's scales, are small and stay
    in the skeleton); one that dropped or retyped a stand-in is a one-line error. `model` is left as it was."""
    standins = {t.name: t for t in model.graph.initializer if t.name in standin_names(model)}
    converted = onnx.version_converter.convert_version(typing_skeleton(model), minimum)
    inputs = {value.name: value for value in converted.graph.input}
    for name, tensor in standins.items():
        kind = inputs[name].type.tensor_type if name in inputs else None
        if (kind is None or kind.elem_type != tensor.data_type
                or [d.dim_value for d in kind.shape.dim] != list(tensor.dims)):
            raise QbenchError(f"raising opset {default_opset(model)} to {minimum} (onnx's version converter) changed "
                              f"weight {name!r}; export the model at opset {minimum} or later")  # fmt: skip
    drop_standin_inputs(converted.graph, set(standins))
    small = {tensor.name: tensor for tensor in converted.graph.initializer}
    ordered = [standins.get(tensor.name) or small.pop(tensor.name, None) for tensor in model.graph.initializer]
    converted.graph.ClearField("initializer")
    for tensor in [*filter(None, ordered), *small.values()]:
        converted.graph.initializer.add().CopyFrom(tensor)
    return converted


# ONNX Runtime registers some of its own operators in the ONNX domain: SimplifiedLayerNormalization (the RMSNorm its
# transformer optimizer fuses in T5 and Llama graphs) at every opset, LayerNormalization before opset 17 (which its
# optimizers fuse whatever the opset). onnx's version converter has no schema for them at the model's opset and fails
# on an assertion ("Op has no registered schema", "No Adapter"), so an FP8 or BF16 build of such a graph failed. They
# wait in a domain of their own while it runs (it leaves other domains' nodes as they are) and go back after:
# ONNX Runtime runs them at any opset (LayerNormalization from 17 as ONNX's, which computes the same).
_SET_ASIDE = "qbench.unconverted"


def _set_aside(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model`, or a copy of it whose ONNX-domain nodes ONNX has no schema for at its opset are in `_SET_ASIDE`."""
    opset = default_opset(model)

    def unknown(node: onnx.NodeProto) -> bool:
        if node.domain not in ("", "ai.onnx"):
            return False
        try:
            onnx.defs.get_schema(node.op_type, opset, "")
        except onnx.defs.SchemaError:
            return True
        return False

    if not any(unknown(node) for node in all_nodes(model.graph)):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in filter(unknown, all_nodes(copy.graph)):
        node.domain = _SET_ASIDE
    copy.opset_import.append(helper.make_opsetid(_SET_ASIDE, 1))
    return copy


def _put_back(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (in place) with the nodes `_set_aside` moved back to the ONNX domain."""
    for node in all_nodes(model.graph):
        if node.domain == _SET_ASIDE:
            node.domain = ""
    imports = [opset for opset in model.opset_import if opset.domain != _SET_ASIDE]
    del model.opset_import[:]
    model.opset_import.extend(imports)
    return model


def _check_interface_kept(model: onnx.ModelProto, converted: onnx.ModelProto, opset: int) -> None:
    """Raise a one-line QbenchError where raising `model` to `opset` changed a graph input's or output's name, type or
    shape: onnx's Scan 8 -> 9 adapter drops the batch axis from the graph's inputs and outputs, and the variant built
    from it refused FP32's feeds ('Invalid rank for input: x Got: 3 Expected: 2')."""
    def interface(graph: onnx.GraphProto) -> list[tuple[str, str, onnx.TypeProto]]:
        return [(kind, value.name, value.type) for kind, values in (("input", graph.input), ("output", graph.output))
                for value in values]  # fmt: skip

    for (kind, name, before), (_, renamed, after) in zip(interface(model.graph), interface(converted.graph),
                                                         strict=False):  # fmt: skip
        if renamed != name:
            raise QbenchError(f"raising opset {default_opset(model)} to {opset} (onnx's version converter) renamed "
                              f"graph {kind} {name!r} to {renamed!r}; export the model at opset {opset} or later")
        if not _same_interface(before, after):
            raise QbenchError(f"raising opset {default_opset(model)} to {opset} (onnx's version converter) changed "
                              f"graph {kind} {name!r} from {_described(before)} to {_described(after)}; export the "
                              f"model at opset {opset} or later")  # fmt: skip
    if len(interface(model.graph)) != len(interface(converted.graph)):
        raise QbenchError(f"raising opset {default_opset(model)} to {opset} (onnx's version converter) changed the "
                          f"graph's inputs or outputs; export the model at opset {opset} or later")


# the types holding one other type, as ONNX writes them
_HOLDERS = {"sequence_type": "seq", "optional_type": "optional"}


def _same_interface(before: onnx.TypeProto, after: onnx.TypeProto) -> bool:
    """Whether a graph input or output typed `after` takes what one typed `before` took: the same element type and
    rank, fixed sizes kept (the converter's shape inference may fix a symbolic size, or state a rank left open); in
    a sequence, map or optional, the same of what it holds (a ZipMap's `seq(map(int64, float))` becomes
    `seq(map(int64, float[]))` at opset 21, a scalar stated where no shape was: the same values)."""
    kind = before.WhichOneof("value")
    if kind != after.WhichOneof("value"):
        return False
    if kind in _HOLDERS:
        return _same_interface(getattr(before, kind).elem_type, getattr(after, kind).elem_type)
    if kind == "map_type":
        return (before.map_type.key_type == after.map_type.key_type
                and _same_interface(before.map_type.value_type, after.map_type.value_type))  # fmt: skip
    if kind != "tensor_type":
        return before == after
    old, new = before.tensor_type, after.tensor_type
    if old.elem_type != new.elem_type:
        return False
    if not (old.HasField("shape") and new.HasField("shape")):  # a rank only one of them states
        return True
    if len(old.shape.dim) != len(new.shape.dim):
        return False
    return all(not (a.HasField("dim_value") and b.HasField("dim_value")) or a.dim_value == b.dim_value
               for a, b in zip(old.shape.dim, new.shape.dim, strict=True))  # fmt: skip


def _described(kind: onnx.TypeProto) -> str:
    """'float32[2, 5, 6]', 'seq(map(int64, float32[any rank]))' (or the type's own text for another kind)."""
    which = kind.WhichOneof("value")
    if which in _HOLDERS:
        return f"{_HOLDERS[which]}({_described(getattr(kind, which).elem_type)})"
    if which == "map_type":
        key = helper.tensor_dtype_to_np_dtype(kind.map_type.key_type)
        return f"map({'string' if key.kind == 'O' else key.name}, {_described(kind.map_type.value_type)})"
    if which != "tensor_type":
        return str(kind).replace("\n", " ").strip()
    tensor = kind.tensor_type
    dims = [d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?") for d in tensor.shape.dim]
    shape = f"[{', '.join(dims)}]" if tensor.HasField("shape") else "[any rank]"
    return helper.tensor_dtype_to_np_dtype(tensor.elem_type).name + shape if tensor.elem_type else "untyped" + shape


def _is_resize(node: onnx.NodeProto) -> bool:
    return node.op_type in ("Upsample", "Resize") and node.domain in ("", "ai.onnx")


def _pre_11_resizes(model: onnx.ModelProto) -> list[tuple[str, dict[str, str]]]:
    """The name of each Upsample (opset 7-9) or Resize-10 node of `model` (subgraphs too, in `all_nodes` order) and
    the Resize-11 attributes that compute what it computes. Before opset 11 they map output pixel x to input pixel
    x / scale (`asymmetric`) and, in nearest mode, take its floor where the scale is at least 1 and its ceiling where
    it is below (ONNX Runtime's reading); onnx's version converter writes a Resize-11 with neither attribute, whose
    defaults are `half_pixel` and `round_prefer_floor`: a bilinear x2 Upsample's outputs moved by up to 1.2 on inputs
    drawn from N(0, 1). A nearest Resize-10 whose scales are not constants, or mix up- and downsampling axes, has no
    Resize-11 twin: refused (QbenchError)."""
    graphs = [model.graph, *(body for node in all_nodes(model.graph) for body in subgraphs_of(node))]
    constants = {t.name: t for graph in graphs for t in graph.initializer}
    constants |= {n.output[0]: n.attribute[0].t for n in all_nodes(model.graph) if n.op_type == "Constant"
                  and n.attribute and n.attribute[0].name == "value"}  # fmt: skip
    found: list[tuple[str, dict[str, str]]] = []
    for node in filter(_is_resize, all_nodes(model.graph)):
        found.append((node.name, {"coordinate_transformation_mode": "asymmetric"}))
        if next((a.s for a in node.attribute if a.name == "mode"), b"nearest") != b"nearest":
            continue
        if node.op_type == "Upsample":  # its scales are at least 1 (the operator's definition)
            found[-1][1]["nearest_mode"] = "floor"
            continue
        scales = node.input[1] if len(node.input) > 1 else ""
        moved = {float(s) >= 1 for s in onnx.numpy_helper.to_array(constants[scales]).ravel() if s != 1} \
            if scales in constants else None  # fmt: skip
        if moved is None or len(moved) > 1:
            how = "are not constants" if moved is None else "mix up- and downsampling axes"
            raise QbenchError(f"Resize node {node.name or node.output[0]!r} (opset 10, nearest): its scales {how}, "
                              "so it has no opset-11 form computing the same pixels; export the model at opset 11 or "
                              "later")
        found[-1][1]["nearest_mode"] = "floor" if moved != {False} else "ceil"
    return found


def _rewritten(model: onnx.ModelProto, matches: Callable[[onnx.NodeProto], bool],
               rewrite: Callable[[onnx.NodeProto], list[onnx.NodeProto]]) -> onnx.ModelProto:
    """A copy of `model` in which every node `matches` picks (subgraphs too) is replaced by the nodes `rewrite` gives
    for it; `model` itself where none matches."""
    if not any(matches(node) for node in all_nodes(model.graph)):
        return model
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    graphs = [rewritten.graph, *(body for node in all_nodes(rewritten.graph) for body in subgraphs_of(node))]
    for graph in reversed(graphs):  # a body before the graph holding it, which copies it with its node
        nodes: list[onnx.NodeProto] = []
        for node in graph.node:
            if matches(node):
                nodes += rewrite(node)
            else:
                nodes.append(onnx.NodeProto())
                nodes[-1].CopyFrom(node)
        del graph.node[:]
        graph.node.extend(nodes)
    return rewritten


def _standard(op_type: str) -> Callable[[onnx.NodeProto], bool]:
    return lambda node: node.op_type == op_type and node.domain in ("", "ai.onnx")


def _per_element_batchnorms(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` in which each inference BatchNormalization with `spatial: 0` (before opset 9: scale, bias,
    mean and variance per element of a row, broadcast over the batch) is the arithmetic it computes, (x - mean) /
    sqrt(variance + epsilon) * scale + bias; `model` itself where it has none."""

    def per_element(node: onnx.NodeProto) -> bool:
        spatial = next((a.i for a in node.attribute if a.name == "spatial"), 1)
        return _standard("BatchNormalization")(node) and spatial == 0 and len([o for o in node.output if o]) == 1

    def arithmetic(node: onnx.NodeProto) -> list[onnx.NodeProto]:
        x, scale, bias, mean, variance = node.input[:5]
        epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        part = [f"{node.output[0]}/qbench_bn_{name}"
                for name in ("eps", "shifted", "var_eps", "std", "normed", "scaled")]
        return [helper.make_node("Constant", [], [part[0]], name=f"{node.name}/epsilon",
                                 value=helper.make_tensor(part[0], onnx.TensorProto.FLOAT, [], [epsilon])),
                helper.make_node("Sub", [x, mean], [part[1]], name=f"{node.name}/centre"),
                helper.make_node("Add", [variance, part[0]], [part[2]], name=f"{node.name}/variance"),
                helper.make_node("Sqrt", [part[2]], [part[3]], name=f"{node.name}/std"),
                helper.make_node("Div", [part[1], part[3]], [part[4]], name=f"{node.name}/normalise"),
                helper.make_node("Mul", [part[4], scale], [part[5]], name=f"{node.name}/scale"),
                helper.make_node("Add", [part[5], bias], [node.output[0]], name=node.name)]  # fmt: skip

    return _rewritten(model, per_element, arithmetic)


def _hardmax_on_two_dims(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` in which each Hardmax (opset < 13: the maximum over all axes from `axis` on, the input
    flattened to 2-D there) runs on that 2-D flattening, Flatten -> Hardmax(axis=1) -> Reshape to the input's shape,
    which every opset computes alike; `model` itself where it has no Hardmax."""

    def two_dims(node: onnx.NodeProto) -> list[onnx.NodeProto]:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        source, result = node.input[0], node.output[0]
        shape, flat, hard = (f"{result}/qbench_hardmax_{part}" for part in ("shape", "flat", "2d"))
        return [helper.make_node("Shape", [source], [shape], name=f"{node.name}/shape"),
                helper.make_node("Flatten", [source], [flat], name=f"{node.name}/flatten", axis=axis),
                helper.make_node("Hardmax", [flat], [hard], name=node.name, axis=1),
                helper.make_node("Reshape", [hard, shape], [result], name=f"{node.name}/reshape")]  # fmt: skip

    return _rewritten(model, _standard("Hardmax"), two_dims)
