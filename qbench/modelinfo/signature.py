"""What an ONNX model expects and returns, read with onnx (no runtime needed).

Outputs need not be tensors: converters such as skl2onnx end classifiers with a ZipMap,
a sequence of {class: probability} maps (kind "map"). Anything else that is not a tensor
(a sequence of tensors, an optional) is kept with kind "other" so it can be named in
messages; only choosing it for evaluation is an error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from qbench.errors import QbenchError, plain_name
from qbench.modelinfo.classes import keys_are_columns

if TYPE_CHECKING:  # pragma: no cover
    import onnx

OutputKind = Literal["tensor", "map", "other"]
_COPY_OPS = ("Identity", "Cast")
# ONNX-ML regressors and the attribute stating how many values each row gets (their schemas: Y is [N, that many])
_TARGET_COUNTS = {"TreeEnsembleRegressor": "n_targets", "TreeEnsemble": "n_targets", "LinearRegressor": "targets"}


@dataclass(frozen=True)
class TensorMeta:
    """One model input or output. shape entries are ints for static dims, None for dynamic ones.

    kind "map": a sequence of per-row {class key: score} maps; dtype is the score type, shape
    (rows, classes) and class_keys the keys when the graph states them (a ZipMap's attributes).
    A score tensor's class_keys are its columns' classes in column order, a label tensor's (strings, or integers
    such as -1 / +1 or 3, 7, 9) the classes its values are one of, when the graph states them
    (qbench.modelinfo.classes).
    passthrough_of: the graph input this output merely copies (Identity/Cast chain), if any.
    off_label: set on a score tensor whose arg-max is not how the graph picks its label; lowest_wins when the graph
    picks it as their arg-min (KMeans' distances), which classification then decides by.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]
    kind: OutputKind = "tensor"
    type_name: str = "tensor"
    class_keys: tuple[int | str, ...] | None = None
    passthrough_of: str | None = None
    off_label: str | None = None  # why the highest of these scores is not the model's own label (modelinfo_classes)
    lowest_wins: bool = False  # the graph's label is the ArgMin of these scores
    decision_cut: tuple[float, bool] | None = None  # a single score column the graph splits at (value, tie is class 1)
    probabilities: bool | None = None  # the graph makes these scores as probabilities / as logits; None: unstated
    log_probabilities: bool = False  # the graph makes these scores as the log of probabilities (modelinfo_classes)
    class_count: int | None = None  # class ids an integer output can give, when the graph says (ArgMax over N scores)
    picks_from_table: bool = False  # a label output whose values the graph picks from a class table it states
    dim_names: tuple[str | None, ...] = ()  # per dim: its dim_param, None when static or unnamed
    scalar: bool = False  # the graph declares a shape of rank 0 (shape () alone may also mean no shape stated)
    constant: bool = False  # computed from no graph input (an initializer, a Constant): the same whatever the rows
    fixed: bool = False  # every axis static as the graph computes it (onnx's inference agrees with the declaration)
    declared_shape: tuple[int | None, ...] | None = None  # the graph's declaration, where shape is what it computes

    def declaration_note(self) -> str | None:
        """One line saying that the graph declares this output with other sizes than it computes, None where not."""
        if self.declared_shape is None:
            return None
        declared = dataclasses.replace(self, shape=self.declared_shape).shape_text()  # a dynamic axis keeps its name
        return (f"output {plain_name(self.name)!r} is declared {declared} but its operators compute "
                f"{self.shape_text()} (ONNX Runtime returns the computed shape, with a VerifyOutputSizes warning): "
                "read as computed")

    def shape_text(self) -> str:
        """The shape with dynamic dims by name where the graph names them: [8, 'batch', 6]."""
        names = self.dim_names or (None,) * len(self.shape)
        dims = [str(d) if d is not None else repr(n) if n else "None" for d, n in zip(self.shape, names)]
        return f"[{', '.join(dims)}]"

    def describe(self) -> str:
        """'name (float32, [None, 3])', 'name (float32, shape not stated)' (where [] would read as a scalar) or
        'name (seq(map(int64,float32)))'."""
        if self.kind == "tensor":
            dims = ", ".join("None" if d is None else str(d) for d in self.shape)
            shape = "shape not stated" if not self.shape and not self.scalar else f"[{dims}]"
            return f"{plain_name(self.name)} ({self.dtype}, {shape})"
        return f"{plain_name(self.name)} ({self.type_name})"


@dataclass(frozen=True)
class ModelInfo:
    inputs: dict[str, TensorMeta]
    outputs: dict[str, TensorMeta]
    opset: int
    inner: dict[str, str] = dataclasses.field(default_factory=dict)  # main graph tensor no output is -> its node's op
    defaulted: tuple[str, ...] = ()  # graph inputs with an initializer default: held constant, never fed

    @property
    def batch_dims(self) -> dict[str, int]:
        """Input name -> its static first dimension, for the inputs exported without a dynamic batch axis (a
        fixed batch: a session takes batches of exactly that many rows). A rank-1 input is left out: its one
        dimension may be a batch of scalars or a row without a batch; so is an input with no row axis at all
        (`shared_by_batch`)."""
        return {name: meta.shape[0] for name, meta in self.inputs.items()
                if len(meta.shape) > 1 and meta.shape[0] is not None and not shared_by_batch(meta, self.inputs)}


def shared_by_batch(meta: TensorMeta, inputs: dict[str, TensorMeta]) -> bool:
    """Whether model input `meta` has no row axis, one value per call that every row of a batch shares: a scalar, or
    a tensor whose every axis is fixed beside an input whose axis 0 is dynamic (a class-weight vector [4], a
    projection [6, 3] beside x ['batch', 6]), as that axis cannot then be the rows: every input would fix it. A fixed
    leading 1 is left out: a batch of one row fits it (a fixed batch of 1, or one scalar a row at a batch of 1)."""
    if meta.kind != "tensor":
        return False
    if meta.scalar:
        return True
    if not meta.shape or any(dim is None for dim in meta.shape) or meta.shape[0] == 1:
        return False
    return any(other.kind == "tensor" and other.shape and other.shape[0] is None for other in inputs.values())


def read_model_info(path: Path) -> ModelInfo:
    """Inputs (excluding initializers), outputs and the default-domain opset of an ONNX file."""
    from qbench.modelinfo.classes import score_facts
    from qbench.onnx_read import read_onnx

    model = read_onnx(path)  # local functions inlined: the producers read through are the ones computing
    if not model.graph.output:  # protobuf reads an empty file, or a few stray bytes, as an empty model
        raise QbenchError(f"{path} is not an ONNX model (its graph has no outputs); expected an ONNX file")
    initializers = {t.name for t in model.graph.initializer}
    inputs = {v.name: _meta(v) for v in model.graph.input if v.name not in initializers}
    producers = {out: node for node in model.graph.node for out in node.output}
    facts = score_facts(model)
    fed = _fed_by_inputs(model.graph, set(inputs))
    # a fixed-batch model (every input's axis 0 static) is not inferred: its exporter computed the declarations at that
    # shape, and the fixed-per-call case reads them only beside dynamic rows (0.33 s of 0.58 s of reading 4000 nodes)
    computed = _computed_shapes(model) if rows_input(inputs) is not None else {}
    fixed = _fixed_by_graph(model, computed)
    outputs = {}
    for value in model.graph.output:
        meta = _as_computed(_meta(value, producers.get(value.name)), computed.get(value.name),
                            _stated_targets(value.name, producers))
        if meta.kind == "map" or meta.dtype.kind == "f":  # scores, not labels
            meta = dataclasses.replace(meta, off_label=facts.off_label.get(value.name),
                                       lowest_wins=value.name in facts.lowest_wins,
                                       decision_cut=facts.cuts.get(value.name),
                                       probabilities=facts.probabilities.get(value.name))
        if meta.kind == "tensor":
            label_table = facts.labels.get(value.name)
            keys = label_table if _read_as_positions(meta, label_table) else facts.tables.get(value.name)
            meta = dataclasses.replace(meta, class_keys=keys, log_probabilities=value.name in facts.log_probabilities,
                                       class_count=facts.id_counts.get(value.name),
                                       picks_from_table=label_table is not None)  # fmt: skip
        source = _copied_input(value.name, producers, set(inputs))
        outputs[value.name] = dataclasses.replace(meta, passthrough_of=source, constant=value.name not in fed,
                                                  fixed=value.name in fixed)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    inner = {name: node.op_type for name, node in producers.items() if name and name not in outputs}
    defaulted = tuple(v.name for v in model.graph.input if v.name in initializers)
    return ModelInfo(inputs=inputs, outputs=outputs, opset=opset, inner=inner, defaulted=defaulted)


def rows_input(inputs: Mapping[str, TensorMeta]) -> str | None:
    """The first input taking its rows on a dynamic axis 0, where every input with a shape does (None for a model
    with a fixed batch: an input's axis 0 static): what an output fixed by the graph (TensorMeta.fixed) stays
    beside, whatever the rows."""
    if any(m.shape and m.shape[0] is not None for m in inputs.values()):
        return None
    return next((name for name, m in inputs.items() if m.shape and m.shape[0] is None), None)


def _computed_shapes(model: onnx.ModelProto) -> dict[str, tuple[int | None, ...]]:
    """Each tensor output's shape as onnx's inference computes it from the inputs and the operators alone, the graph's
    declarations set aside: a converter's declaration may be wrong (onnxmltools declares a LightGBM classifier's
    `label` [1], which runs one per row; a hand-edited or converted graph declares [None, 1] for an output its
    MatMul makes [None, 2]), and so may its value_info of the tensors inside (a trace at batch 1), which inference
    would take as given. An output inference gives no shape is left out; a graph it cannot infer gives none."""
    from onnx import shape_inference

    from qbench.onnx_read import typing_skeleton

    skeleton = typing_skeleton(model)
    del skeleton.graph.value_info[:]
    for value in skeleton.graph.output:
        if value.type.WhichOneof("value") == "tensor_type":
            value.type.tensor_type.ClearField("shape")
    try:
        inferred = shape_inference.infer_shapes(skeleton)
    except Exception:  # noqa: BLE001 - a graph onnx cannot infer states nothing: the run check judges its outputs
        return {}
    return {v.name: tuple(d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim)
            for v in inferred.graph.output
            if v.type.WhichOneof("value") == "tensor_type" and v.type.tensor_type.HasField("shape")}  # fmt: skip


def _fixed_by_graph(model: onnx.ModelProto, computed: Mapping[str, tuple[int | None, ...]]) -> set[str]:
    """The outputs declared with every axis static ([1], [1, 3]) whose shape onnx's inference computes the same from
    the graph, its declarations set aside (`_computed_shapes`)."""
    declared = {v.name: dims for v in model.graph.output if v.type.WhichOneof("value") == "tensor_type"
                and (dims := tuple(d.dim_value if d.HasField("dim_value") else None
                                   for d in v.type.tensor_type.shape.dim)) and None not in dims}  # fmt: skip
    return {name for name, dims in declared.items() if computed.get(name) == dims}


def _as_computed(meta: TensorMeta, computed: tuple[int | None, ...] | None, targets: int | None) -> TensorMeta:
    """`meta` with the sizes the graph computes where its declaration states other ones, the declaration kept in
    declared_shape: ONNX Runtime returns what the operators compute (and only warns), so labels, class counts and
    every check read the computed sizes. `computed`: onnx's inference of the output (`_computed_shapes`); `targets`:
    the values per row an ONNX-ML regressor's attribute states (`_stated_targets`), which inference does not compute.
    Only a static size contradicting a static one is replaced (a dynamic axis stays as declared), and a regressor's
    width whatever its declaration."""
    if meta.kind != "tensor":
        return meta
    shape = meta.shape
    if computed is not None and len(computed) == len(shape):
        shape = tuple(c if d is not None and c is not None else d for d, c in zip(shape, computed))
    if targets is not None and len(shape) == 2:
        shape = (shape[0], targets)
    if shape == meta.shape:
        return meta
    names = tuple(n if d == s else None for n, d, s in zip(meta.dim_names or (None,) * len(shape), meta.shape, shape))
    contradicted = any(d is not None and d != s for d, s in zip(meta.shape, shape))
    return dataclasses.replace(meta, shape=shape, dim_names=names, declared_shape=meta.shape if contradicted else None)


def _stated_targets(name: str, producers: Mapping[str, onnx.NodeProto]) -> int | None:
    """How many values per row the ONNX-ML regressor computing output `name` (directly or through Identity/Cast)
    states in its attributes, None where no such node does. Its operator returns that many whatever the output's
    declaration says: skl2onnx declares a two-target RandomForestRegressor's output [None, 1] (ONNX Runtime warns
    and returns 2 values per row), and labels of 2 targets were refused as not fitting it."""
    node = producers.get(_through_copies(name, producers))
    attribute = _TARGET_COUNTS.get(node.op_type) if node is not None and node.domain == "ai.onnx.ml" else None
    found = [a.i for a in node.attribute if a.name == attribute] if node is not None and attribute else []
    return int(found[0]) if found and found[0] > 0 else None


def _read_as_positions(meta: TensorMeta, table: tuple[int | str, ...] | None) -> bool:
    """Whether a label output's values are read as positions in the class table its graph states: string labels
    always; integer ones when they are no column numbers (-1 / +1), as a ZipMap's keys are read. Labels 3, 7, 9
    stay the values they are, as a ZipMap keyed 3, 7, 9 and the data's labels read them."""
    if meta.dtype == object:
        return True
    return meta.dtype.kind in "iu" and table is not None and not keys_are_columns(table)


def _elem_dtype(elem_type: int) -> np.dtype:
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)) if elem_type else np.dtype(object)


def _elem_name(elem_type: int) -> str:
    """An element type as a user reads it: NumPy's name, `string` for text (NumPy holds it as `object`)."""
    from onnx import TensorProto

    return "string" if elem_type == TensorProto.STRING else str(_elem_dtype(elem_type))


def _type_name(type_proto: onnx.TypeProto) -> str:
    """ONNX's spelling of a type, with NumPy's element names: tensor(float32), seq(map(int64,tensor(float32))),
    map(string,tensor(float32))."""
    field = type_proto.WhichOneof("value")
    if field == "tensor_type":
        return f"tensor({_elem_name(type_proto.tensor_type.elem_type)})"
    if field == "sequence_type":
        return f"seq({_type_name(type_proto.sequence_type.elem_type)})"
    if field == "map_type":
        return f"map({_elem_name(type_proto.map_type.key_type)},{_type_name(type_proto.map_type.value_type)})"
    if field == "optional_type":
        return f"optional({_type_name(type_proto.optional_type.elem_type)})"
    return field or "unknown"


def _meta(value_info: onnx.ValueInfoProto, producer: onnx.NodeProto | None = None) -> TensorMeta:
    type_proto = value_info.type
    if type_proto.WhichOneof("value") == "tensor_type":
        tensor_type = type_proto.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim)
        names = tuple(d.dim_param or None if d.HasField("dim_param") else None for d in tensor_type.shape.dim)
        scalar = tensor_type.HasField("shape") and not dims
        return TensorMeta(value_info.name, _elem_dtype(tensor_type.elem_type), dims, dim_names=names, scalar=scalar)
    name = _type_name(type_proto)
    element = type_proto.sequence_type.elem_type if type_proto.WhichOneof("value") == "sequence_type" else None
    if element is not None and element.WhichOneof("value") == "map_type":
        value_type = element.map_type.value_type
        tensor_values = value_type.WhichOneof("value") == "tensor_type"
        score = _elem_dtype(value_type.tensor_type.elem_type) if tensor_values else None
        keys = _zipmap_keys(producer)
        classes = len(keys) if keys is not None else None
        return TensorMeta(value_info.name, score or np.dtype(object), (None, classes), "map", name, keys)
    return TensorMeta(value_info.name, np.dtype(object), (), "other", name)


def _zipmap_keys(node: onnx.NodeProto | None) -> tuple[int | str, ...] | None:
    if node is None or node.op_type != "ZipMap":
        return None
    for attribute in node.attribute:
        if attribute.name == "classlabels_int64s":
            return tuple(int(k) for k in attribute.ints)
        if attribute.name == "classlabels_strings":
            return tuple(k.decode() for k in attribute.strings)
    return None


def _copied_input(name: str, producers: dict[str, onnx.NodeProto], inputs: set[str]) -> str | None:
    """The graph input `name` is a plain copy of (through Identity/Cast nodes only), else None."""
    origin = _through_copies(name, producers, inputs)
    return origin if origin in inputs else None


def _through_copies(name: str, producers: Mapping[str, onnx.NodeProto], stop: Set[str] = frozenset()) -> str:
    """The tensor `name` copies, followed back through Identity/Cast producers until a name in `stop`, a tensor no
    copy produces, or as many steps as the graph has nodes (a graph naming a tensor twice, `Identity(x) -> x`, has a
    copy reading its own output, and an unbounded walk never ends)."""
    current = name
    for _ in range(len(producers)):
        node = producers.get(current)
        if current in stop or node is None or node.op_type not in _COPY_OPS or not node.input:
            break
        current = node.input[0]
    return current


def _fed_by_inputs(graph: onnx.GraphProto, inputs: set[str]) -> set[str]:
    """The tensors computed from a graph input (nodes are in topological order, as a valid graph has them). A node
    holding a subgraph counts as fed: its body may read an input by name from the outer scope."""
    from qbench.onnx_read import subgraphs_of

    fed = set(inputs)
    for node in graph.node:
        if subgraphs_of(node) or fed.intersection(node.input):
            fed.update(node.output)
    return fed


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor `graph` and its subgraphs hold: initializers and tensor attributes (a Constant's value)."""
    from qbench.onnx_read import all_graphs

    for held in all_graphs(graph):
        yield from held.initializer
        for node in held.node:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    yield attribute.t
                yield from attribute.tensors


def external_data_files(path: Path) -> list[str]:
    """Relative locations of the files that hold the model's external tensors (big models), each once."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    model = onnx.load(str(path), load_external_data=False)
    locations = {ExternalDataInfo(t).location for t in _graph_tensors(model.graph) if uses_external_data(t)}
    for location in locations:
        if Path(location).is_absolute() or ".." in Path(location).parts:
            raise QbenchError(f"{path}: external data location {location!r} is outside the model's folder")
    return sorted(locations)
