"""Integer inputs that index a constant table (token ids into an embedding) must stay within it.

ONNX Runtime refuses an index past the table (`indices element out of data bounds, idx=150 must be within the
inclusive range [-100,99]`) on the batch holding it: a row that `qbench validate`'s few FP32 rows did not reach
would fail every variant of the sweep, with a message naming a node rather than the column and row. So the ids
each input feeds into a `Gather` on a constant table (directly, or through casts and reshapes), or into an operator
that looks rows up the same way (`_TABLE_READERS`: ONNX Runtime's fused `EmbedLayerNormalization`, which its
transformer optimizer writes in place of a BERT's embedding Gathers), are checked against the table's size on every
evaluation and calibration row, every QAT training row and every selection row a search chooses on, before anything
runs, inside If/Loop/Scan bodies too (a Scan looking up one token a step).
Ids that reach a table only through a selection of them (a Slice or a Gather of the ids, as torch exports
`nn.EmbeddingBag`: each bag's ids sliced inside a Loop) are followed too; such a table may see only some of them, so
an input that reaches every table it indexes only so is checked against the largest of them.

A category table is checked the same way: an ONNX-ML `OneHotEncoder` with `zeros = 0` (scikit-learn's
`handle_unknown='error'`, as skl2onnx converts it) fails the whole batch on a value it does not know (`Unknown Category
and zeros = 0`), which `qbench validate` blamed on the model; each value an input feeds it, directly, through
value-preserving ops or as a column a constant Gather or ArrayFeatureExtractor picks (skl2onnx's column selection
before each encoder of a pipeline or ColumnTransformer), must be among its categories; each encoder of an input is
checked on the columns it reads.

A negative id is refused too, though ONNX's Gather reads it from the table's end (-1 as the last row): torch's
`nn.Embedding` and `nn.EmbeddingBag` refuse it (`index out of range`), so an exported embedding never meant it, and a
sentinel such as -1 for an unknown id would silently read another id's row in FP32 and every variant alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qbench.errors import RecipeError
from qbench.modelinfo.classes import each_once
from qbench.onnx_read import all_graphs
from qbench.recipe.spec import Recipe

if TYPE_CHECKING:
    import onnx

_SHOWN_ROWS = 3
# ops whose output holds the same integer values as their first input, rearranged or re-typed
_VALUE_PRESERVING = {"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Expand", "Tile"}
# ops whose output holds every value of any of their inputs, beside others
_VALUE_JOINING = {"Concat"}
# of those, ops that keep every value at its place (an axis read after them is the input's)
_VALUE_KEEPING_LAYOUT = {"Cast", "Identity"}
# ops whose output holds some of the values of their first input (a selection of them)
_VALUE_SELECTING = {"Slice", "Gather", "GatherElements", "GatherND", "Split", "Compress"}
# (domain, op type) -> (index input, table input) pairs of ops that read rows of a constant table (along axis 0 unless
# an `axis` attribute says otherwise) at an integer input's values, and whether a negative id counts from the end.
# EmbedLayerNormalization (inputs: input_ids, segment_ids, word, position and segment embeddings, ..., position_ids)
# refuses any id outside [0, size) ("input index out of range"); Gather reads -size..-1 from the table's end, and
# such ids are refused all the same (the module's docstring says why).
_TABLE_READERS: dict[tuple[str, str], tuple[tuple[tuple[int, int], ...], bool]] = {
    ("", "Gather"): (((1, 0),), True),
    ("com.microsoft", "EmbedLayerNormalization"): (((0, 2), (1, 4), (8, 3)), False),
}


@dataclass(frozen=True)
class Lookup:
    """A Gather node that reads a constant table of `size` entries along its axis at an input's values."""

    node: str
    size: int
    negative: bool = True  # whether the node reads ids from -size to -1 from the table's end (Gather does): said when
    # such an id is refused, as the reason a run would not have failed on it
    partial: bool = False  # reached through a selection of the ids (a Slice, a Gather of them): some may not reach it
    encoders: tuple[Encoder, ...] = ()  # category tables (OneHotEncoder, zeros = 0) reading the input, not ids


@dataclass(frozen=True)
class Encoder:
    """A OneHotEncoder refusing values outside `categories` (zeros = 0), and what it reads of an input: the values
    left by `picks`, each the (axis, indices) of a constant-index Gather along a non-batch axis on the way, in order."""

    node: str
    categories: tuple[str | int, ...]
    picks: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def read(self, values: np.ndarray) -> np.ndarray:
        """The values of an input's feed (rows on axis 0) that reach the encoder."""
        for axis, indices in self.picks:
            values = np.take(values, list(indices), axis=axis)
        return values


def constant_lookups(model_path: Path) -> dict[str, Lookup]:
    """Graph input name -> the smallest constant table its integer values index (inputs that index none are absent)."""
    from qbench.onnx_read import read_onnx

    model = read_onnx(model_path)  # an embedding inside a local function indexes a table too
    graph = model.graph
    graphs = list(all_graphs(graph))  # an embedding inside an If/Loop/Scan body indexes a table too
    tables = {t.name: list(t.dims) for body in graphs for t in body.initializer}
    nodes = [node for body in graphs for node in body.node]
    constants = {t.name: t for body in graphs for t in body.initializer}
    for node in nodes:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            tables[node.output[0]] = list(node.attribute[0].t.dims)
            constants[node.output[0]] = node.attribute[0].t
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:  # a body reads an outer value under the outer name, so its nodes are consumers of that name
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found: dict[str, Lookup] = {}
    for value in graph.input:
        if value.name in tables or value.type.tensor_type.elem_type not in _INTEGER_TYPES:
            continue
        lookups = _lookups_of(value.name, consumers, tables)
        every = [lookup for lookup in lookups if not lookup.partial]
        if every:  # every id reaches each of these: the smallest table
            found[value.name] = min(every, key=lambda lookup: lookup.size)
        elif lookups:  # each table sees some of the ids: an id past the largest is past every table it could reach
            found[value.name] = max(lookups, key=lambda lookup: lookup.size)
    for value in graph.input:
        if value.name not in found and (encoders := _category_tables(value.name, consumers, constants)):
            found[value.name] = Lookup(encoders[0].node, len(encoders[0].categories), False, encoders=encoders)
    return found


def _category_tables(
    name: str, consumers: Mapping[str, list], constants: Mapping[str, onnx.TensorProto]
) -> tuple[Encoder, ...]:
    """The OneHotEncoders refusing values outside their categories (zeros = 0) that read `name`'s values, directly,
    through value-preserving ops, or as columns a constant-index Gather picks on the input's own layout (before any
    op that rearranges it, so the Gather's axis is the input's)."""
    encoders = []
    pending: list[tuple[str, tuple[tuple[int, tuple[int, ...]], ...], bool]] = [(name, (), False)]
    seen = {name}
    while pending:
        current, picks, rearranged = pending.pop(0)
        for node in consumers.get(current, []):
            if not node.input or node.input[0] != current:
                continue
            if node.op_type == "OneHotEncoder" and node.domain == "ai.onnx.ml":
                attributes = {a.name: a for a in node.attribute}
                zeros = attributes["zeros"].i if "zeros" in attributes else 1
                known = (list(attributes["cats_strings"].strings) if "cats_strings" in attributes
                         else list(attributes["cats_int64s"].ints) if "cats_int64s" in attributes
                         else None)  # fmt: skip
                if zeros == 0 and known:
                    categories = tuple(c.decode() if isinstance(c, bytes) else int(c) for c in known)
                    encoders.append(Encoder(node.name or node.output[0], categories, picks))
                continue
            if node.op_type in _VALUE_PRESERVING:
                step = (picks, rearranged or node.op_type not in _VALUE_KEEPING_LAYOUT)
            elif not rearranged and (pick := _column_pick(node, constants)) is not None:
                step = ((*picks, pick), rearranged)
            else:
                continue
            for output in node.output:
                if output not in seen:
                    seen.add(output)
                    pending.append((output, *step))
    return tuple(encoders)


def _column_pick(node: onnx.NodeProto, constants: Mapping[str, onnx.TensorProto]) -> tuple[int, tuple[int, ...]] | None:
    """The (axis, indices) of a node picking values along a non-batch axis at constant indices (a Gather; ONNX-ML's
    ArrayFeatureExtractor, along the last axis, as skl2onnx selects a ColumnTransformer's columns), else None."""
    from onnx import numpy_helper

    if node.op_type == "Gather" and node.domain in ("", "ai.onnx"):
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    elif node.op_type == "ArrayFeatureExtractor" and node.domain == "ai.onnx.ml":
        axis = -1
    else:
        return None
    indices = constants.get(node.input[1]) if len(node.input) > 1 else None
    if axis == 0 or indices is None:
        return None
    return axis, tuple(int(i) for i in numpy_helper.to_array(indices).ravel())


def _lookups_of(name: str, consumers: Mapping[str, list], tables: Mapping[str, list[int]]) -> list[Lookup]:
    """The nodes reading a constant table at `name`'s values (`_TABLE_READERS`), following value-preserving ops."""
    lookups = []
    whole = {name}  # values holding every id (the others hold a selection of them)
    for current, pending in each_once(name):
        for node in consumers.get(current, []):
            kept = node.op_type in _VALUE_PRESERVING | _VALUE_SELECTING and node.input[0] == current
            if kept or node.op_type in _VALUE_JOINING:
                if current in whole and node.op_type not in _VALUE_SELECTING:
                    whole.update(node.output)
                pending += list(node.output)
                continue
            if node.op_type in ("Loop", "Scan") and node.domain in ("", "ai.onnx"):
                # the body's input in the same place holds the values: a Loop's carried value, a Scan's slices
                body = next(a.g for a in node.attribute if a.name == "body")
                inner = [body.input[i].name for i, name in enumerate(node.input)
                         if name == current and i < len(body.input) and (node.op_type == "Scan" or i >= 2)]  # fmt: skip
                if current in whole:
                    whole.update(inner)
                pending += inner
                continue
            domain = "" if node.domain == "ai.onnx" else node.domain
            pairs, negative = _TABLE_READERS.get((domain, node.op_type), ((), True))
            for index, table in pairs:
                if len(node.input) <= max(index, table) or node.input[index] != current:
                    continue
                dims = tables.get(node.input[table])
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                if dims and -len(dims) <= axis < len(dims) and dims[axis] > 0:
                    lookups.append(Lookup(node.name or node.output[0], int(dims[axis]), negative, current not in whole))
    return lookups


def check_lookup_indices(
    recipe: Recipe, lookups: Mapping[str, Lookup], feeds: Mapping[str, np.ndarray], rows: np.ndarray, what: str
) -> None:
    """Every row's values of an input that indexes a constant table lie within it (a RecipeError naming the column,
    the rows and the table otherwise). `rows`: the table rows the feeds hold, in order; `what`: whose rows they are."""
    columns = {name: column for column, name in recipe.data.inputs.items() if isinstance(name, str)}
    for name, lookup in lookups.items():
        values = feeds.get(name)
        if values is not None and values.size and lookup.encoders:
            for encoder in lookup.encoders:
                _check_categories(recipe, columns, name, encoder, values, rows, what)
            continue
        if values is None or values.dtype.kind not in "iu" or not values.size:
            continue
        flat = values.reshape(len(values), -1)
        outside = np.flatnonzero(((flat < 0) | (flat >= lookup.size)).any(axis=1))
        if not outside.size:
            continue
        examples = ", ".join(f"row {rows[i]}: {_first_outside(flat[i], lookup)}" for i in outside[:_SHOWN_ROWS])
        source = f"column {columns[name]!r} (model input {name!r})" if name in columns else f"model input {name!r}"
        count = f"{outside.size} {what} row{'s hold' if outside.size > 1 else ' holds'}"
        message = (f"{source}: {count} ids outside the table node {lookup.node!r} looks them up in "
                   f"({lookup.size} entries), e.g. {examples}; expected ids from 0 to {lookup.size - 1}")  # fmt: skip
        if lookup.negative and (flat[outside] < 0).any():
            message += (f" (ONNX's Gather would read a negative id from the table's end, -1 as row {lookup.size - 1}, "
                        "where torch's nn.Embedding refuses it: give unknown ids a row of their own, or write the row "
                        "meant)")  # fmt: skip
        raise RecipeError(recipe.source, "data.inputs", message)


def _check_categories(
    recipe: Recipe, columns: Mapping[str, str], name: str, encoder: Encoder, values: np.ndarray, rows: np.ndarray,
    what: str,
) -> None:
    """Every row's values of input `name` that `encoder` reads are among its categories (a RecipeError naming them
    otherwise)."""
    known = set(encoder.categories)
    flat = encoder.read(values).reshape(len(values), -1)
    unknown = np.flatnonzero([any(_category(v) not in known for v in row) for row in flat])
    if not unknown.size:
        return
    examples = ", ".join(f"row {rows[i]}: {next(_category(v) for v in flat[i] if _category(v) not in known)!r}"
                         for i in unknown[:_SHOWN_ROWS])  # fmt: skip
    size = len(encoder.categories)
    listed = ", ".join(str(c) for c in encoder.categories[:12]) + (", ..." if size > 12 else "")
    source = f"column {columns[name]!r} (model input {name!r})" if name in columns else f"model input {name!r}"
    count = f"{unknown.size} {what} row{'s hold' if unknown.size > 1 else ' holds'}"
    raise RecipeError(recipe.source, "data.inputs", (
        f"{source}: {count} categories the OneHotEncoder {encoder.node!r} does not know, e.g. {examples}; expected one "
        f"of its {size} categories ({listed}): converted with zeros = 0 (scikit-learn's handle_unknown="
        "'error'), the graph fails on any other; leave those rows out with a filter, or convert the encoder with "
        "handle_unknown='ignore' (an all-zero encoding)"))  # fmt: skip


def _category(value: object) -> object:
    return value.decode() if isinstance(value, bytes) else value.item() if isinstance(value, np.generic) else value



def _first_outside(values: np.ndarray, lookup: Lookup) -> int:
    return int(values[(values < 0) | (values >= lookup.size)][0])


_INTEGER_TYPES = {2, 3, 4, 5, 6, 7, 12, 13}  # onnx.TensorProto: UINT8 INT8 UINT16 INT16 INT32 INT64 UINT32 UINT64
