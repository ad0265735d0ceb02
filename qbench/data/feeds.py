"""Table rows -> model inputs: stack the cells, fit them to the input's shape, cast to its dtype.

A column of single values becomes (N,) or (N, 1, ...) as the input's rank needs;
a column of lists/arrays becomes (N, *cell_shape) and is then reshaped to the
input's shape when the sizes agree (64 pixels -> (N, 1, 8, 8)). The first dim
of every model input is the batch (`qbench.preflight_rows` checks that each row's outputs
follow it). A text column with a tokenizer (`qbench.data.text`) feeds every model input
named like one of the tokenizer's outputs (input_ids, ...); with `tokenizer.pair`, each row's two texts are
encoded together as one pair.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from qbench.data.filters import scalar_column
from qbench.data.images import image_feed, image_input_name
from qbench.data.load import table_name
from qbench.data.nonfinite import cell_array, stacked_numeric_cells
from qbench.data.text import (
    check_pair_column,
    load_tokenizer,
    text_cells,
    tokenize,
    tokenizer_field,
    tokenizer_input_names,
)
from qbench.data.text_tables import shown_text, text_cells_hint
from qbench.errors import QbenchError, RecipeError, did_you_mean
from qbench.modelinfo import TensorMeta
from qbench.recipe_data import ImageInputSpec, InputTarget, TextInputSpec

logger = logging.getLogger(__name__)

INPUTS_FIELD = "data.inputs"
LABEL_FIELD = "data.label"
_SHOWN_SHAPES = 5
_CLASS_INDICES = "expected integer class indices"
TOKEN_TYPES = "token_type_ids"


def build_feeds(
    df: pd.DataFrame,
    positions: np.ndarray,
    inputs: Mapping[str, InputTarget],
    model_inputs: dict[str, TensorMeta],
    *,
    recipe_file: Path,
    table_field: str | None = None,
) -> dict[str, np.ndarray]:
    """Model input name -> array of the rows at `positions` (at least one), for every `column -> input` pair.

    A text column (`column -> TextInputSpec`) is tokenized once over all `positions`, so
    `padding: longest` gives every row of this set the same length. `table_field`: the recipe field naming `df`'s
    file where that is not `data.path` (`data.calibration.path`): a problem with a cell is then reported under that
    field with the file's name, not as one of `data.path`'s (whose columns may be fine).
    """
    try:
        return _feeds(df, positions, inputs, model_inputs, recipe_file=recipe_file)
    except RecipeError as exc:
        if table_field is None:
            raise
        raise RecipeError(exc.file, table_field, f"{table_name(df)}: {exc.field}: {exc.detail}") from None


def _feeds(
    df: pd.DataFrame, positions: np.ndarray, inputs: Mapping[str, InputTarget], model_inputs: dict[str, TensorMeta],
    *, recipe_file: Path,
) -> dict[str, np.ndarray]:  # fmt: skip
    if len(positions) == 0:
        raise ValueError("build_feeds needs at least one row position")
    fed = _check_mapping(df, inputs, model_inputs, recipe_file=recipe_file)
    feeds: dict[str, np.ndarray] = {}
    for column, target in inputs.items():
        cells = df[column].iloc[positions]
        if isinstance(target, TextInputSpec):
            metas = [model_inputs[name] for name in fed[column]]
            pair = target.tokenizer.pair
            pairs = None if pair is None else df[pair].iloc[positions]
            feeds.update(_text_feeds(cells, column, target, metas, pairs=pairs, recipe_file=recipe_file))
            continue
        if isinstance(target, ImageInputSpec):
            name = fed[column][0]
            feeds[name] = image_feed(cells, column, target.image, model_inputs[name], recipe_file=recipe_file)
            continue
        meta = model_inputs[target]
        if meta.dtype == np.dtype(object):  # an ONNX string input (skl2onnx's categorical columns)
            feeds[target] = _string_feed(cells, column, meta, recipe_file=recipe_file)
            continue
        try:
            stacked = _stack_cells(cells, column, recipe_file=recipe_file)
            shaped = _fit_shape(stacked, column, meta, recipe_file=recipe_file)
            feeds[target] = _cast(shaped, column, meta, recipe_file=recipe_file, rows=cells.index)
        except RecipeError as exc:  # text: '0,5' cells in a CSV not declaring decimal commas, NumPy-printed arrays
            hint = text_cells_hint(cells)
            if not hint:
                raise
            raise RecipeError(exc.file, exc.field, exc.detail + hint) from None
    return feeds


def labels_array(df: pd.DataFrame, positions: np.ndarray, column: str, *, recipe_file: Path) -> np.ndarray:
    """Integer class indices (int64) of the rows at `positions`; booleans count as 0/1."""
    values = scalar_column(df, column, field=LABEL_FIELD, recipe_file=recipe_file).iloc[positions]
    missing = np.flatnonzero(values.isna().to_numpy())
    if missing.size:
        first = positions[missing[0]]
        message = f"column {column!r}: {missing.size} rows have no label (first at row {first}); {_CLASS_INDICES}"
        raise RecipeError(recipe_file, LABEL_FIELD, message)
    array = np.array(values.tolist())
    if array.dtype.kind not in "biu":
        not_integral = [v for v in array.tolist() if not _is_integral(v)]
        if not_integral:
            raise RecipeError(
                recipe_file, LABEL_FIELD, f"column {column!r} holds {not_integral[0]!r}; {_CLASS_INDICES}"
            )
    labels = array.astype(np.int64)
    if labels.size and labels.min() < 0:
        message = f"column {column!r} holds {labels.min()}; expected class indices >= 0"
        raise RecipeError(recipe_file, LABEL_FIELD, message)
    return labels


def iter_batches(
    feeds: Mapping[str, np.ndarray], batch_size: int, *, whole: bool = False
) -> Iterator[dict[str, np.ndarray]]:
    """Consecutive row batches of every feed. The last one may be shorter, unless `whole` (a model with a
    fixed batch takes no other size): it is then filled up to `batch_size` by repeating its own rows
    (`take_batch`), which leaves per-batch statistics such as dynamic INT8's activation ranges unchanged.
    The caller drops what the filler rows give: batch k holds rows k * batch_size onwards."""
    rows = _rows(feeds, batch_size)
    for start in range(0, rows, batch_size):
        batch = {name: array[start : start + batch_size] for name, array in feeds.items()}
        yield take_batch(batch, batch_size) if whole and rows - start < batch_size else batch


def take_batch(feeds: Mapping[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
    """The first `batch_size` rows of every input, repeating the rows from the top if there are fewer."""
    rows = _rows(feeds, batch_size)
    if rows == 0:
        raise QbenchError("no rows to run: the evaluation set is empty")
    picks = np.arange(batch_size) % rows
    return {name: np.ascontiguousarray(np.take(array, picks, axis=0)) for name, array in feeds.items()}


def _rows(feeds: Mapping[str, np.ndarray], batch_size: int) -> int:
    """The row count shared by every feed (0 without feeds), for batches of a positive `batch_size`."""
    if batch_size <= 0:
        raise QbenchError(f"batch_size must be positive, got {batch_size}")
    lengths = {len(array) for array in feeds.values()}
    if len(lengths) > 1:
        raise QbenchError(f"feeds have different row counts: {sorted(lengths)}")
    return lengths.pop() if lengths else 0


def _check_mapping(
    df: pd.DataFrame, inputs: Mapping[str, InputTarget], model_inputs: dict[str, TensorMeta], *, recipe_file: Path
) -> dict[str, list[str]]:
    """Every column exists, every input name is the model's, and each model input is fed exactly once.

    Returns column -> the model inputs it feeds (one name, or a text column's tokenizer outputs).
    """
    fed_by: dict[str, str] = {}
    fed: dict[str, list[str]] = {}
    for column, target in inputs.items():
        if column not in df.columns:
            columns = [str(c) for c in df.columns]
            message = f"column {column!r} is not in {table_name(df)}; {_expected(column, columns)}"
            raise RecipeError(recipe_file, INPUTS_FIELD, message)
        field = f"{INPUTS_FIELD}.{column}"
        if isinstance(target, TextInputSpec):
            check_pair_column(df, column, target.tokenizer, recipe_file=recipe_file)
            fed[column] = _tokenized_inputs(column, target, model_inputs, recipe_file=recipe_file)
        elif isinstance(target, ImageInputSpec):
            fed[column] = [image_input_name(column, target, inputs, model_inputs, recipe_file=recipe_file)]
        elif target not in model_inputs:
            message = f"{target!r} is not an input of the model; {_expected(target, model_inputs)}"
            raise RecipeError(recipe_file, field, message)
        else:
            fed[column] = [target]
        for input_name in fed[column]:
            if input_name in fed_by:
                message = f"model input {input_name!r} is already fed by column {fed_by[input_name]!r}"
                raise RecipeError(recipe_file, field, message)
            fed_by[input_name] = column
    unfed = [name for name in model_inputs if name not in fed_by]
    if unfed:
        message = f"model input {unfed[0]!r} is fed by no column; add `<column>: {unfed[0]}`"
        raise RecipeError(recipe_file, INPUTS_FIELD, message)
    return fed


def text_feed_notes(
    df: pd.DataFrame, rows: np.ndarray, inputs: Mapping[str, InputTarget], model_inputs: dict[str, TensorMeta], *,
    recipe_file: Path,
) -> list[tuple[int, str]]:  # fmt: skip
    """(logging level, line) about what the text inputs feed, for the evaluation `rows`: per pair, which model inputs
    it feeds and what it leaves out (a model without token_type_ids tells the texts apart by [SEP] alone); a warning
    for a single text column whose cells hold the tokenizer's separator while the model reads token_type_ids: two
    texts joined by hand, fed as one text with token_type_ids 0 throughout, where the tokenizer encodes a pair's
    second text as 1 (every figure would be of inputs the model was not trained on)."""
    notes: list[tuple[int, str]] = []
    for column, target in inputs.items():
        if not isinstance(target, TextInputSpec):
            continue
        tokenizer = load_tokenizer(target.tokenizer, recipe_file=recipe_file, column=column)
        produced = list(tokenizer.model_input_names)
        fed = [name for name in produced if name in model_inputs]
        if target.tokenizer.pair is not None:
            note = (f"{INPUTS_FIELD}.{column}: each row's ({column}, {target.tokenizer.pair}) pair is encoded together "
                    f"(truncation: {target.tokenizer.truncation}) and feeds {', '.join(fed)}")  # fmt: skip
            unused = [name for name in produced if name not in model_inputs]
            if unused:
                verb = "is" if len(unused) == 1 else "are"
                note += f"; the tokenizer's {', '.join(unused)} {verb} not fed (not an input of the model)"
            notes.append((logging.INFO, note))
            continue
        separator = tokenizer.sep_token
        if TOKEN_TYPES not in fed or not separator:
            continue
        joined = sum(isinstance(cell, str) and separator in cell for cell in df[column].iloc[rows])
        if joined:
            notes.append((logging.WARNING, (
                f"{INPUTS_FIELD}.{column}: {joined} of {len(rows)} evaluation rows hold the tokenizer's separator "
                f"{separator!r} but are encoded as one text, so {TOKEN_TYPES} is 0 throughout; if the column joins "
                f"two texts, give the second its own column and set {tokenizer_field(column, 'pair')} (the tokenizer "
                f"encodes a pair's second text with {TOKEN_TYPES} 1)")))  # fmt: skip
    return notes


def _tokenized_inputs(
    column: str, spec: TextInputSpec, model_inputs: dict[str, TensorMeta], *, recipe_file: Path
) -> list[str]:
    """The model inputs a text column feeds: the tokenizer's outputs that the model has (at least one)."""
    produced = tokenizer_input_names(spec.tokenizer, recipe_file=recipe_file, column=column)
    names = [name for name in produced if name in model_inputs]
    if not names:
        message = (
            f"the tokenizer's outputs ({', '.join(produced)}) match no input of the model "
            f"(its inputs: {', '.join(model_inputs)})"
        )
        raise RecipeError(recipe_file, f"{INPUTS_FIELD}.{column}", message)
    return names


def _string_feed(cells: pd.Series, column: str, meta: TensorMeta, *, recipe_file: Path) -> np.ndarray:
    """A text column for a tensor(string) input: one string per row, shaped like the input ((N,) or (N, 1))."""
    purpose = f"for the string input {meta.name!r}"
    texts = text_cells(cells, column, recipe_file=recipe_file, field=f"{INPUTS_FIELD}.{column}", purpose=purpose)
    return _fit_shape(np.array(texts, dtype=object), column, meta, recipe_file=recipe_file)


def _text_feeds(
    cells: pd.Series, column: str, spec: TextInputSpec, metas: list[TensorMeta], *, pairs: pd.Series | None,
    recipe_file: Path,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Tokenize a text column once (with `pairs`, the pair column's cells, as pairs); each model input gets the
    tokenizer output of its name, checked and cast."""
    texts = text_cells(cells, column, recipe_file=recipe_file, field=f"{INPUTS_FIELD}.{column}")
    second = None
    if pairs is not None:
        pair_field = tokenizer_field(column, "pair")
        second = text_cells(pairs, str(spec.tokenizer.pair), recipe_file=recipe_file, field=pair_field)
    encoded = tokenize(texts, spec.tokenizer, recipe_file=recipe_file, column=column, pairs=second)
    feeds: dict[str, np.ndarray] = {}
    for meta in metas:
        array = encoded[meta.name]
        _check_token_shape(array, column, spec, meta, recipe_file=recipe_file)
        feeds[meta.name] = _cast(array, column, meta, recipe_file=recipe_file)
    return feeds


def _check_token_shape(
    array: np.ndarray, column: str, spec: TextInputSpec, meta: TensorMeta, *, recipe_file: Path
) -> None:
    """A (rows, tokens) feed must fit the input: rank 2, and its static sequence length if it has one."""
    if not meta.shape:
        return
    if len(meta.shape) != 2:
        message = f"tokens are (batch, sequence), but model input {meta.name!r} has rank {len(meta.shape)}"
        raise RecipeError(recipe_file, f"{INPUTS_FIELD}.{column}", message)
    expected = meta.shape[1]
    if expected is not None and expected != array.shape[1]:
        tokenizer = spec.tokenizer
        message = (
            f"the tokenizer gives {array.shape[1]} tokens per row (padding: {tokenizer.padding}, "
            f"max_length: {tokenizer.max_length}), but model input {meta.name!r} expects {expected}: "
            f"use padding: max_length with max_length: {expected}"
        )
        raise RecipeError(recipe_file, tokenizer_field(column, "max_length"), message)


def _expected(got: str, choices: Iterable[str]) -> str:
    options = sorted(str(choice) for choice in choices)
    return f"expected one of {', '.join(options)}{did_you_mean(got, options)}"


def _stack_cells(cells: pd.Series, column: str, *, recipe_file: Path) -> np.ndarray:
    """(N,) for a column of single values, (N, *cell_shape) for a column of lists or arrays."""
    if not pd.api.types.is_object_dtype(cells):
        return cells.to_numpy()
    missing = np.flatnonzero(cells.isna().to_numpy())
    if missing.size:
        message = f"column {column!r}: {missing.size} rows have no value (first at row {cells.index[missing[0]]})"
        raise RecipeError(recipe_file, INPUTS_FIELD, message)
    stacked = stacked_numeric_cells(cells.to_numpy())
    if stacked is not None:
        return stacked
    arrays = [_cell_block(cell, row, column, recipe_file=recipe_file) for row, cell in cells.items()]
    shapes = [a.shape for a in arrays]
    if len(set(shapes)) > 1:
        raise RecipeError(recipe_file, INPUTS_FIELD, _mixed_shapes(shapes, cells.index, column))
    text = [index for index, array in enumerate(arrays) if array.dtype.kind not in "biuf"]
    if text and len(text) < len(arrays):  # stacked, one text cell would turn every number into text
        first = text[0]
        message = (
            f"column {column!r}: {len(text)} {'rows' if len(text) > 1 else 'row'} among numeric ones "
            f"{'hold' if len(text) > 1 else 'holds'} "
            f"{_non_numeric(arrays[first])} (first at row {cells.index[first]})"
        )
        raise RecipeError(recipe_file, INPUTS_FIELD, message)
    return np.stack(arrays)


def _cell_block(cell: object, row: object, column: str, *, recipe_file: Path) -> np.ndarray:
    try:
        return cell_array(cell)
    except ValueError:  # numpy refuses lists of different lengths inside one cell
        message = f"column {column!r}: row {row} holds nested lists of different lengths; expected one block of values"
        raise RecipeError(recipe_file, INPUTS_FIELD, message) from None


def _mixed_shapes(shapes: list[tuple[int, ...]], rows: pd.Index, column: str) -> str:
    """Why cells of several shapes cannot be stacked, naming the first row that differs from the most common shape:
    one bad row among a million is found by its number, not by searching the file for its length."""
    counts = Counter(shapes)
    common, common_rows = counts.most_common(1)[0]  # a tie keeps the shape seen first
    odd = [index for index, shape in enumerate(shapes) if shape != common]
    first = odd[0]
    return (
        f"column {column!r} holds cells of different {_describe_shapes(sorted(counts))}: {len(odd)} of "
        f"{len(shapes)} rows differ from the most common {_describe_shape(common)} ({common_rows} rows), first "
        f"at row {rows[first]} ({_describe_shape(shapes[first])}); pad them to one size"
    )


def _describe_shape(shape: tuple[int, ...]) -> str:
    return f"length {shape[0]}" if len(shape) == 1 else f"shape {shape}"


def _describe_shapes(shapes: list[tuple[int, ...]]) -> str:
    shown = shapes[:_SHOWN_SHAPES]
    more = f", ... ({len(shapes)} in all)" if len(shapes) > _SHOWN_SHAPES else ""
    if all(len(shape) == 1 for shape in shown):
        return f"lengths (seen {', '.join(str(s[0]) for s in shown)}{more})"
    return f"shapes (seen {', '.join(str(s) for s in shown)}{more})"


def _fit_shape(stacked: np.ndarray, column: str, meta: TensorMeta, *, recipe_file: Path) -> np.ndarray:
    """Reshape (N, *cell_shape) to the input's (N, *dims); a shapeless input takes the cells as they are."""
    if not meta.shape:
        return stacked
    rows, cell_shape, dims = stacked.shape[0], stacked.shape[1:], meta.shape[1:]
    cell_size = math.prod(cell_shape)
    if len(cell_shape) == len(dims) and all(d is None or d == c for d, c in zip(dims, cell_shape, strict=True)):
        return stacked
    static_size = math.prod(d for d in dims if d is not None)
    dynamic = sum(d is None for d in dims)
    if (dynamic == 0 and static_size == cell_size) or (dynamic == 1 and static_size and cell_size % static_size == 0):
        free = cell_size // static_size
        return stacked.reshape((rows, *(free if d is None else d for d in dims)))
    expected = ", ".join(["batch", *("?" if d is None else str(d) for d in dims)])
    columns = stacked.dtype.kind in "biuf" and cell_size == 1 and static_size > 1
    raise RecipeError(
        recipe_file,
        INPUTS_FIELD,
        f"column {column!r} holds cells of {cell_size} value{'s' if cell_size != 1 else ''} (shape {cell_shape}), "
        f"but model input {meta.name!r} expects shape ({expected})"
        + ("; one column feeds one input: put each row's values, in the model's feature order, in one list column (a "
           "Parquet list column, or a JSON list per CSV cell as json.dumps(row) writes it)" if columns else ""),
    )


def _cast(values: np.ndarray, column: str, meta: TensorMeta, *, recipe_file: Path, rows: pd.Index | None = None) -> np.ndarray:
    """`values` as the input's dtype; a RecipeError where that would change them. `rows`: the table's row of each
    value along axis 0, to name where a problem is."""
    target = np.dtype(meta.dtype)
    problem = _cast_problem(values, target, rows)
    if problem:
        message = f"column {column!r} holds {problem}, but model input {meta.name!r} expects {target}"
        raise RecipeError(recipe_file, INPUTS_FIELD, message)
    rounded = _inexact_integers(values, target) if target.kind == "f" else None
    if rounded:
        logger.warning("column %r: %s, so model input %r gets them rounded: distinct ids or codes may merge into one "
                       "(the figures describe the rounded values, as a service casting them to %s would)", column,
                       rounded, meta.name, target)  # fmt: skip
    return np.ascontiguousarray(values.astype(target, copy=False))


def _cast_problem(values: np.ndarray, target: np.dtype, rows: pd.Index | None = None) -> str | None:
    """Why casting `values` to `target` would change them (text, fractions or overflow into integers), or None."""
    if values.size == 0:
        return None
    if values.dtype.kind not in "biuf":
        return _non_numeric(values)
    if target.kind == "f":
        return _float_overflow(values, target)
    if target.kind not in "iu":
        return None
    if values.dtype.kind == "f" and not np.all(np.isfinite(values) & (values == np.round(values))):
        return _non_integers(values, rows)
    limits = np.iinfo(target)
    if values.min() < limits.min or values.max() > limits.max:
        return f"values outside the range of {target}"
    return None


def _non_integers(values: np.ndarray, rows: pd.Index | None) -> str:
    """Which values an integer input cannot take, by row: missing ones (NaN/inf, as a Parquet or CSV integer column
    with an empty cell reads: `nonfinite_inputs: keep` feeds them to float inputs only) apart from fractions."""
    per_row = values.reshape(len(values), -1) if values.ndim else values.reshape(1, 1)
    missing = ~np.isfinite(per_row).all(axis=1)
    fraction = ~missing & (per_row != np.round(per_row)).any(axis=1)
    found = []
    for kind, bad in (("NaN/inf (missing values)", missing), ("a fraction", fraction)):
        count = int(bad.sum())
        if count:
            first = int(np.flatnonzero(bad)[0])
            where = rows[first] if rows is not None and len(rows) == len(per_row) else first
            found.append(f"{count} row{'s' if count != 1 else ''} with {kind}, e.g. row {where}")
    return "non-integer values: " + "; ".join(found)


def _float_overflow(values: np.ndarray, target: np.dtype) -> str | None:
    """Finite values too large for `target` (1e39 for float32, 70000 for float16): the cast would feed inf, past the
    NaN/inf check."""
    if values.dtype.kind in "iu":
        finite = np.abs(values.astype(np.float64))
    elif values.dtype.kind != "f" or np.finfo(values.dtype).max <= np.finfo(target).max:
        return None
    else:
        finite = np.abs(values[np.isfinite(values)])
    if finite.size == 0 or finite.max() <= np.finfo(target).max:
        return None
    count = int((finite > np.finfo(target).max).sum())
    return f"{count} value{'s' if count != 1 else ''} beyond {target}'s range (e.g. {finite.max():.3g}), which would become inf"


def _inexact_integers(values: np.ndarray, target: np.dtype) -> str | None:
    """Integers the float `target` cannot hold (float32 holds every integer up to 2**24 only), which reach the model
    as their neighbours (16777217 as 16777216): a warning, not an error, since a service feeding the model casts
    them alike (large counts and timestamps lose nothing that matters), but two ids become one."""
    if values.dtype.kind not in "iu":
        return None
    exact = 2 ** (np.finfo(target).nmant + 1)
    large = values[(values > exact) | (values < -exact)].ravel()
    changed = large[_changed_by_cast(large, target)]
    if not changed.size:
        return None
    first = int(changed[0])
    rounded = target.type(first)
    example = f"{first} becomes {int(rounded) if np.isfinite(rounded) else rounded}"
    return f"{changed.size} of {values.size} values are integers beyond {target}'s exact range (e.g. {example})"


def _changed_by_cast(integers: np.ndarray, target: np.dtype) -> np.ndarray:
    """Which `integers` the float `target` does not hold exactly, in one vectorized pass (a table of a million ids
    has a million large integers). A float that an integer rounds to is itself an integer, so casting it back is exact
    unless it left the integer type's range: rounded up to 2**63 (2**64 unsigned) or, for float16, to inf."""
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = integers.astype(target)
        beyond = ~np.isfinite(rounded) | (rounded >= float(np.iinfo(integers.dtype).max) + 1.0)
    back = np.where(beyond, 0, rounded).astype(integers.dtype)
    return beyond | (back != integers)


def _non_numeric(values: np.ndarray) -> str:
    """The first value that is not a number, as the user wrote it (one text cell turns a whole list into text).
    Dates and durations are named as such: NumPy counts a timedelta64 among its integers."""
    if values.dtype.kind in "mM":
        kind = "dates or times" if values.dtype.kind == "M" else "durations"
        return f"{kind}, not numbers (e.g. {values.flat[0]})"
    for value in values.flat:
        if isinstance(value, (str, bytes)):
            try:
                float(value)
            except ValueError:
                return f"non-numeric values such as {shown_text(value) if isinstance(value, str) else bytes(value)!r}"
        elif not isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating)):
            return f"non-numeric values such as {value!r}"
    first = values.flat[0]
    return f"numbers written as text such as {str(first) if isinstance(first, str) else first!r}"


def _is_integral(value: object) -> bool:
    if isinstance(value, (bool, int, np.integer, np.bool_)):
        return True
    return isinstance(value, (float, np.floating)) and float(value).is_integer()
