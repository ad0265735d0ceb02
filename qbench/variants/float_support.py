"""Which nodes can compute in a narrower float type, decided from the operators' own schemas.

A node stays in float32 (with casts at its boundary) when it lies outside the default
ONNX domain and ONNX Runtime's contrib domain (ai.onnx.ml's tree ensembles, scalers, ZipMap, label encoders... and
any custom domain), when its schema cannot be found, when it reads or writes a sequence, map
or optional value (the converters type tensors only), or when the schema does not accept the
target type (float16, bfloat16) for one of its float inputs or outputs. The rule reads
`onnx.defs.get_schema`, and for ONNX Runtime's contrib operators (com.microsoft Attention, SkipLayerNormalization...)
the schemas the installed ONNX Runtime registers (runtime_schemas), so it covers operators nobody listed here.

ONNX shape inference does not type the outputs of ai.onnx.ml operators; `tensor_types`
completes it from the schemas (a fixed output type, or a type variable bound by an
input), which the converters need to place their casts.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

from qbench.onnx_read import infer_types, typing_skeleton
from qbench.variants.onnx_utils import all_nodes, names_read, outer_scope_reads, rename_reads, subgraphs_of
from qbench.variants.runtime_schemas import NARROWED_DOMAINS, runtime_schema

DEFAULT_DOMAINS = ("", "ai.onnx")
SHAPE_ONLY_OPS = ("Shape", "Size")  # read a tensor's shape, never its values
_TYPE_STRINGS = {TensorProto.FLOAT16: "tensor(float16)", TensorProto.BFLOAT16: "tensor(bfloat16)"}


@dataclass(frozen=True)
class KeptNodes:
    """Nodes that stay float32 under a narrower float type, and why (node name -> reason)."""

    reasons: dict[str, str]

    @property
    def names(self) -> list[str]:
        return list(self.reasons)

    def described(self, model: onnx.ModelProto) -> str:
        """Each distinct reason with the op types kept for it, shortest reason first, for a note: 'Imputer, Scaler
        (operator domain ai.onnx.ml); Concat (only moves values between FP32 nodes ...)'. One list of every op type
        before every reason left a reader to guess which op was out of FP16's range and which had no kernel."""
        op_types = {node.name: node.op_type for node in model.graph.node}
        grouped: dict[str, set[str]] = {}
        for name, reason in self.reasons.items():
            if name in op_types:
                grouped.setdefault(reason, set()).add(op_types[name])
        return "; ".join(f"{', '.join(sorted(ops))} ({reason})" for reason, ops in sorted(grouped.items(),
                                                                                     key=lambda item: len(item[0])))

    def op_types(self, model: onnx.ModelProto) -> list[str]:
        """The op types of the kept nodes, sorted, each once (for notes)."""
        return sorted({node.op_type for node in model.graph.node if node.name in self.reasons})


def _opset_versions(model: onnx.ModelProto) -> dict[str, int]:
    versions = {o.domain: o.version for o in model.opset_import}
    if "ai.onnx" in versions and "" not in versions:
        versions[""] = versions["ai.onnx"]
    return versions


def _schema(node: onnx.NodeProto, versions: dict[str, int]) -> onnx.defs.OpSchema | None:
    domain = "" if node.domain == "ai.onnx" else node.domain
    if domain in NARROWED_DOMAINS:
        return runtime_schema(node.op_type, domain, versions.get(domain, 1))
    try:
        return onnx.defs.get_schema(node.op_type, versions.get(domain, onnx.defs.onnx_opset_version()), domain)
    except onnx.defs.SchemaError:
        return None


def _formal(params: list[onnx.defs.OpSchema.FormalParameter], index: int) -> onnx.defs.OpSchema.FormalParameter | None:
    """The formal parameter behind actual input/output `index` (the last one repeats when variadic)."""
    if index < len(params):
        return params[index]
    if params and params[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        return params[-1]
    return None


def _allowed(schema: onnx.defs.OpSchema, type_str: str) -> set[str]:
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    return constraints.get(type_str, {type_str})


def tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor ONNX shape inference or the operator schemas can tell (name -> TensorProto type)."""
    try:
        inferred = infer_types(model)  # large initializers are typed graph inputs there
    except Exception:  # noqa: BLE001 (inference fails on some custom graphs; the schemas still help)
        inferred = model
    graph = inferred.graph
    types = {t.name: t.data_type for t in graph.initializer}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            types.setdefault(info.name, info.type.tensor_type.elem_type)
    versions = _opset_versions(model)
    for node in graph.node:
        schema = _schema(node, versions)
        if schema is None:
            continue
        bound: dict[str, int] = {}
        for index, name in enumerate(node.input):
            formal = _formal(list(schema.inputs), index)
            if formal is not None and name in types:
                bound.setdefault(formal.type_str, types[name])
        for index, name in enumerate(node.output):
            formal = _formal(list(schema.outputs), index)
            if not name or name in types or formal is None:
                continue
            if formal.type_str in bound:
                types[name] = bound[formal.type_str]
                continue
            allowed = _allowed(schema, formal.type_str)
            if len(allowed) == 1:
                fixed = next(iter(allowed))
                elem = next((k for k, v in _STRING_TYPES.items() if v == fixed), None)
                if elem is not None:
                    types[name] = elem
    untyped = [name for node in graph.node for name in node.output if name and name not in types]
    if untyped:
        types.update(_runtime_types(model, untyped))
    return types


def _runtime_types(model: onnx.ModelProto, names: list[str]) -> dict[str, int]:
    """Element types ONNX Runtime gives `names` when it loads the model, for tensors neither ONNX shape inference
    nor the schemas can type: what follows its contrib operators (com.microsoft Attention, SkipLayerNormalization,
    FastGelu... in graphs its transformer optimiser wrote), where ONNX's inference stops. Empty if the model does not
    load. ORT is given the model's typing skeleton (qbench.onnx_read): a model over protobuf's 2 GiB is typed too."""
    import onnxruntime as ort

    skeleton = typing_skeleton(model)  # types need no weights: a model of any size, and no second copy of its weights
    skeleton.graph.ClearField("output")
    skeleton.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names)
    serialized = skeleton.SerializeToString()
    del skeleton
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(serialized, options, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - a graph ORT cannot load has no runtime types to offer
        return {}
    elements = {string: elem for elem, string in _TENSOR_TYPE_STRINGS.items()}
    return {out.name: elements[out.type] for out in session.get_outputs() if out.type in elements}


_TENSOR_TYPE_STRINGS = {  # TensorProto element type -> "tensor(float)", as schemas and ONNX Runtime spell them
    elem: f"tensor({helper.tensor_dtype_to_string(elem).removeprefix('TensorProto.').lower()})"
    for elem in TensorProto.DataType.values()
    if elem != TensorProto.UNDEFINED
}
_STRING_TYPES = {
    elem: _TENSOR_TYPE_STRINGS[elem]
    for elem in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT32, TensorProto.STRING)
}


_NON_TENSOR_TYPES = ("sequence_type", "map_type", "optional_type")  # TypeProto kinds the converters cannot narrow
_NON_TENSOR_PREFIXES = ("seq(", "map(", "optional(")  # the same kinds as schemas spell them
NON_TENSOR_REASON = "reads or writes a sequence, map or optional value"


def non_tensor_values(model: onnx.ModelProto) -> set[str]:
    """Names of the main graph's values that are sequences, maps or optionals rather than tensors.

    From ONNX shape inference (and the declared types where it fails), completed by the schemas: a formal
    parameter that admits only such types, or a type variable an input of such a type binds.
    """
    try:
        inferred = infer_types(model).graph
    except Exception:  # noqa: BLE001 (inference fails on some custom graphs; the declarations and schemas still help)
        inferred = model.graph
    declared = [*inferred.input, *inferred.value_info, *inferred.output]
    found = {info.name for info in declared if info.type.WhichOneof("value") in _NON_TENSOR_TYPES}
    versions = _opset_versions(model)
    for node in model.graph.node:
        schema = _schema(node, versions)
        if schema is None:
            continue
        bound: set[str] = set()
        for names, params in ((node.input, list(schema.inputs)), (node.output, list(schema.outputs))):
            for index, name in enumerate(names):
                formal = _formal(params, index)
                if not name or formal is None:
                    continue
                allowed = _allowed(schema, formal.type_str)
                if formal.type_str in bound or (allowed and all(t.startswith(_NON_TENSOR_PREFIXES) for t in allowed)):
                    found.add(name)
                if name in found:
                    bound.add(formal.type_str)
    return found


def kept_in_float32(
    model: onnx.ModelProto, target: int, types: dict[str, int] | None = None, non_tensor: set[str] | None = None
) -> KeptNodes:
    """Nodes that must stay float32 when the graph's float tensors become `target` (FLOAT16 or BFLOAT16).

    Nodes are identified by name: load the model with `load_model`, which names them. `types` and `non_tensor`
    (`tensor_types`, `non_tensor_values`) are worked out when not given.
    """
    wanted = _TYPE_STRINGS[target]
    types = tensor_types(model) if types is None else types
    versions = _opset_versions(model)
    non_tensor = non_tensor_values(model) if non_tensor is None else non_tensor
    reasons: dict[str, str] = {}
    for node in model.graph.node:
        if node.domain not in (*DEFAULT_DOMAINS, *NARROWED_DOMAINS):
            reasons[node.name] = f"operator domain {node.domain}"
            continue
        if subgraphs_of(node):  # the converters cannot narrow a body faithfully, nor emulate it: it stays whole
            reasons[node.name] = "control flow (its subgraph stays FP32)"
            continue
        if non_tensor.intersection([*node.input, *node.output]):  # the converters type tensors only
            reasons[node.name] = NON_TENSOR_REASON
            continue
        schema = _schema(node, versions)
        if schema is None:
            reasons[node.name] = "no schema for this operator in ONNX or the installed ONNX Runtime"
            continue
        if (typed_by := _float_output_typed_by_attribute(node, schema, types)) is not None:
            reasons[node.name] = f"its float output's type is set by its {typed_by!r} attribute, not by its inputs"
            continue
        for kind, names, params in (("input", node.input, schema.inputs), ("output", node.output, schema.outputs)):
            for index, name in enumerate(names):
                formal = _formal(list(params), index)
                if name and formal is not None and types.get(name) == TensorProto.FLOAT:
                    if wanted not in _allowed(schema, formal.type_str):
                        reasons[node.name] = f"its schema does not accept {wanted} for {kind} {formal.name!r}"
                        break
            if node.name in reasons:
                break
    return KeptNodes(reasons)


_DATA_TYPE_ATTRIBUTES = ("dtype", "output_datatype")  # the attributes ONNX operators name their output's type by


def _float_output_typed_by_attribute(node: onnx.NodeProto, schema: onnx.defs.OpSchema,
                                     types: dict[str, int]) -> str | None:
    """The attribute of the schema naming the element type of a float32 output of `node` whose type no input
    binds (a MelWeightMatrix's or HannWindow's `output_datatype`, RandomNormal's `dtype`), or None.

    A float16 converter retypes such an output without rewriting the attribute, so ONNX Runtime refused the whole
    graph ('Type (tensor(float16)) of output arg (mel) of node (MelWeightMatrix) does not match expected type');
    computed in float32 and cast for its readers, it is the same value."""
    bound = {formal.type_str for formal in schema.inputs}
    held = [name for name in _DATA_TYPE_ATTRIBUTES if name in schema.attributes]  # set on the node or defaulted
    for index, name in enumerate(node.output):
        formal = _formal(list(schema.outputs), index)
        if held and formal is not None and formal.type_str not in bound and types.get(name) == TensorProto.FLOAT:
            return held[0]
    return None


def kept_in_rounding_simulation(model: onnx.ModelProto) -> KeptNodes:
    """Nodes a rounding simulation leaves unrounded: ai.onnx.ml operators (tree ensembles, scalers, encoders: no
    deployment runs them in a narrow float), control flow (its subgraph is not rewritten) and nodes reading or
    writing sequences, maps or optionals (the simulation rounds tensors only).

    Unlike `kept_in_float32`, the operators' schemas do not matter: the simulated graph still computes in float32,
    which every operator accepts (Conv before opset 22 has no bfloat16, ORT's contrib operators have no ONNX
    schema, yet a BF16 engine computes them in BF16).
    """
    non_tensor = non_tensor_values(model)
    reasons = {}
    for node in model.graph.node:
        if node.domain == "ai.onnx.ml":
            reasons[node.name] = "operator domain ai.onnx.ml"
        elif subgraphs_of(node):
            reasons[node.name] = "control flow (its subgraph stays FP32)"
        elif non_tensor.intersection([*node.input, *node.output]):
            reasons[node.name] = NON_TENSOR_REASON
    return KeptNodes(reasons)


def cast_subgraph_reads_to_float32(model: onnx.ModelProto, kept: KeptNodes, before: dict[str, int]) -> int:
    """After a conversion, let each kept control-flow node's subgraphs read float32 again, in place; how many casts.

    A subgraph reads tensors of the main graph by name, not through its node's inputs, so a converter casting a
    kept node's inputs back to float32 misses them: the subgraph (left float32) would read a tensor converted to the
    narrow type. Such a tensor (float32 in `before`, the types ahead of the conversion) is read through a Cast to
    float32 placed right after its producer (`<name>/float32`).
    """
    graph = model.graph
    reads_of = {node.name: [name for name in outer_scope_reads(node) if before.get(name) == TensorProto.FLOAT]
                for node in graph.node if node.name in kept.reasons}  # fmt: skip
    if not any(reads_of.values()):
        return 0  # nothing read by name: no need to type the converted graph (an ORT session on contrib-op graphs)
    now = tensor_types(model)
    renamed: dict[str, str] = {}
    for node in graph.node:
        if reads_of.get(node.name):
            narrowed = {name: f"{name}/float32" for name in reads_of[node.name] if now.get(name) != TensorProto.FLOAT}
            for body in subgraphs_of(node):
                rename_reads(body, narrowed)
            renamed |= narrowed
    if not renamed:
        return 0
    casts = {name: helper.make_node("Cast", [name], [cast], name=f"{cast}_cast", to=TensorProto.FLOAT)
             for name, cast in renamed.items()}  # fmt: skip
    produced = {out for node in graph.node for out in node.output}
    nodes = [casts[name] for name in renamed if name not in produced]
    for node in graph.node:
        nodes += [node, *(casts[out] for out in node.output if out in casts)]
    graph.ClearField("node")
    graph.node.extend(nodes)
    return len(casts)


def restore_non_tensor_values(model: onnx.ModelProto, non_tensor: set[str], io_types: dict[str, onnx.TypeProto]) -> int:
    """After ORT's FP16 conversion, give the sequence values back their float32 type and drop the Casts around them,
    in place; how many Casts went.

    The converter narrows every seq(tensor(float)) it sees declared, graph inputs and outputs included, and puts a
    Cast on the boundary of each node it leaves float32, which is invalid on a sequence (Cast takes tensors only).
    Nodes reading or writing such values stay float32 (`kept_in_float32`), so each of those Casts joins two names
    of one float32 value: the original name (in `non_tensor`) is kept, and the graph's non-tensor inputs and
    outputs get their declared types (`io_types`, read before the conversion) back.
    """
    graph = model.graph
    merged: dict[str, str] = {}
    nodes = []
    for node in graph.node:
        ends = [node.input[0], node.output[0]] if node.op_type == "Cast" and node.domain in DEFAULT_DOMAINS else []
        original = next((name for name in ends if name in non_tensor), None)
        if original is None:
            nodes.append(node)
        else:
            merged[next(name for name in ends if name != original)] = original
    if merged:
        for node in nodes:
            node.input[:] = [merged.get(name, name) for name in node.input]
            node.output[:] = [merged.get(name, name) for name in node.output]
            for body in subgraphs_of(node):
                rename_reads(body, merged)
        graph.ClearField("node")
        graph.node.extend(nodes)
    stale = [info for info in graph.value_info if info.name in non_tensor or info.name in merged]
    for info in stale:
        graph.value_info.remove(info)
    for info in [*graph.input, *graph.output]:
        if info.name in io_types:
            info.type.CopyFrom(io_types[info.name])
    return len(merged)


def add_missing_float_value_info(model: onnx.ModelProto, types: dict[str, int]) -> None:
    """Declare float tensors that shape inference left untyped (ai.onnx.ml outputs), in place.

    Converters only cast tensors whose type they know; an untyped float output of a kept
    node would otherwise reach a converted node without a cast.
    """
    graph = model.graph
    declared = {i.name for i in [*graph.input, *graph.output, *graph.value_info]} | {t.name for t in graph.initializer}
    for node in graph.node:
        for name in node.output:
            if name and name not in declared and types.get(name) == TensorProto.FLOAT:
                graph.value_info.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
                declared.add(name)


def drop_float_round_trips(model: onnx.ModelProto, narrow: int) -> int:
    """Let float32 readers read the float32 source instead of a float32 -> `narrow` -> float32 round trip.

    Converters cast a float32 tensor to the narrow type and back when a node that stays in
    float32 reads a graph input or another kept node's output; that rounds its input for
    nothing. The outer Cast becomes an Identity of the source (ORT removes it at load),
    and Casts nobody reads any more are dropped. Returns how many round trips went.
    """
    graph = model.graph
    types = tensor_types(model)
    producer = {out: node for node in graph.node for out in node.output}

    def cast_to(node: onnx.NodeProto | None) -> int | None:
        if node is None or node.op_type != "Cast" or node.domain not in DEFAULT_DOMAINS:
            return None
        return next((a.i for a in node.attribute if a.name == "to"), None)

    dropped = 0
    for node in graph.node:
        if cast_to(node) != TensorProto.FLOAT:
            continue
        inner = producer.get(node.input[0])
        if cast_to(inner) == narrow and types.get(inner.input[0]) == TensorProto.FLOAT:
            node.op_type, node.input[0] = "Identity", inner.input[0]
            del node.attribute[:]
            dropped += 1
    _drop_dead_casts(graph)
    return dropped


def _drop_dead_casts(graph: onnx.GraphProto) -> None:
    while True:
        read = names_read(graph)
        dead = [n for n in graph.node if n.op_type == "Cast" and not any(out in read for out in n.output)]
        if not dead:
            return
        for node in dead:
            graph.node.remove(node)


def narrowed_nodes(model: onnx.ModelProto, kept: KeptNodes, types: dict[str, int]) -> list[str]:
    """Names of the nodes a conversion would change: not kept, reading or writing a float32 tensor, and computing on
    its values (Shape and Size read only a tensor's shape: a graph whose only such nodes are these computes as FP32)."""
    return [
        node.name
        for node in model.graph.node
        if node.name not in kept.reasons and node.op_type not in SHAPE_ONLY_OPS
        and any(types.get(n) == TensorProto.FLOAT for n in [*node.input, *node.output])
    ]  # fmt: skip


# Contractions (sums of products over a weight or another activation: ORT's fused contrib forms included): the
# compute a narrower float is for. A comparison, reduction or elementwise step on the way is not.
CONTRACTION_OP_TYPES = frozenset({
    "MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "LSTM", "GRU", "RNN", "Attention", "MultiHeadAttention",
    "GroupQueryAttention", "FusedMatMul", "FusedGemm", "FusedConv",
})  # fmt: skip


def contractions_held(node: onnx.NodeProto) -> int:
    """How many contractions the node is or holds: itself, and the nodes of its subgraphs (If's branches, Loop's and
    Scan's bodies) at any depth. An If computing two MatMul branches weighs 2, the Greater choosing between them 0."""
    inside = (inner for body in subgraphs_of(node) for inner in all_nodes(body))
    return sum(1 for n in (node, *inside) if n.op_type in CONTRACTION_OP_TYPES)


# Operators that only move, select or reshape values: no arithmetic a narrower type would speed up.
DATA_MOVEMENT_OPS = frozenset({
    "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split", "Slice", "Gather",
    "GatherElements", "GatherND", "Expand", "Tile", "Cast", "CastLike", "Pad", "Compress", "DepthToSpace",
    "SpaceToDepth",
})  # fmt: skip
BETWEEN_FP32_REASON = "only moves values between FP32 nodes (narrowing it would round them, nothing else)"


def with_data_movement_between_kept(model: onnx.ModelProto, kept: KeptNodes, types: dict[str, int]) -> KeptNodes:
    """`kept` plus the data-movement nodes (Concat, Reshape, Cast...) whose float values come only from float32
    (graph inputs, constants, kept nodes) and go only to float32 (kept nodes, graph outputs, which stay float32).

    Narrowed, such a node computes nothing in the narrow type: it only rounds what a float32 node reads next. A
    scikit-learn pipeline's Concat of raw columns in front of a tree ensemble is one: rounded to FP16 (spacing 8
    near 1e4), the features cross the trees' thresholds, though no deployment computes the trees in FP16. Chains of
    such nodes (Concat -> Reshape) are found together: the largest set meeting the condition.
    """
    graph = model.graph
    producer = {out: node.name for node in graph.node for out in node.output if out}
    readers: dict[str, list[str]] = {}
    for node in graph.node:
        if node.op_type not in SHAPE_ONLY_OPS:
            for name in {*node.input, *outer_scope_reads(node)}:
                readers.setdefault(name, []).append(node.name)
    candidates = {node.name: node for node in graph.node
                  if node.name not in kept.reasons and node.op_type in DATA_MOVEMENT_OPS
                  and node.domain in DEFAULT_DOMAINS
                  and any(types.get(n) == TensorProto.FLOAT for n in [*node.input, *node.output])}  # fmt: skip

    def fp32_side(name: str | None) -> bool:
        return name is None or name in kept.reasons or name in candidates

    changed = True
    while changed:
        changed = False
        for name, node in list(candidates.items()):
            floats_in = [n for n in node.input if n and types.get(n) == TensorProto.FLOAT]
            floats_out = [n for n in node.output if n and types.get(n) == TensorProto.FLOAT]
            if not (all(fp32_side(producer.get(n)) for n in floats_in)
                    and all(fp32_side(r) for n in floats_out for r in readers.get(n, []))):  # fmt: skip
                del candidates[name]
                changed = True
    return KeptNodes({**kept.reasons, **dict.fromkeys(candidates, BETWEEN_FP32_REASON)})
