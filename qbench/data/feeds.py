"""Table rows -> model inputs: stack the cells, fit them to the input's shape, cast to its dtype.

A column of single values becomes (N,) or (N, 1, ...) as the input's rank needs;
a column of lists/arrays becomes (N, *cell_shape) and is then reshaped to the
input's shape when the sizes agree (64 pixels -> (N, 1, 8, 8)). The first dim
of every model input is the batch (`qbench.preflight.rows` checks that each row's outputs
follow it). A text column with a tokenizer (`qbench.data.text`) feeds every model input
named like one of the tokenizer's outputs (input_ids, ...); with `tokenizer.pair`, each row's two texts are
encoded together as one pair.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from qbench.data.feed_cast import INPUTS_FIELD, cast_to_input, non_numeric
from qbench.data.filters import scalar_column
from qbench.data.images import image_feed, image_input_name
from qbench.data.load import table_name
from qbench.data.nonfinite import cell_array, stacked_numeric_cells
from qbench.data.text import (
    check_pair_column,
    load_tokenizer,
    pair_sequence_ids,
    text_cells,
    tokenize,
    tokenizer_field,
    tokenizer_input_names,
)
from qbench.data.text_tables import text_cells_hint
from qbench.errors import QbenchError, RecipeError, did_you_mean, names_listed
from qbench.modelinfo.signature import TensorMeta, shared_by_batch
from qbench.recipe.data import ImageInputSpec, InputTarget, TextInputSpec

logger = logging.getLogger(__name__)

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
    defaulted: Collection[str] = (),
) -> dict[str, np.ndarray]:
    """Model input name -> array of the rows at `positions` (at least one), for every `column -> input` pair.

    A text column (`column -> TextInputSpec`) is tokenized once over all `positions`, so
    `padding: longest` gives every row of this set the same length. `table_field`: the recipe field naming `df`'s
    file where that is not `data.path` (`data.calibration.path`): a problem with a cell is then reported under that
    field with the file's name, not as one of `data.path`'s (whose columns may be fine). `defaulted`: the model's
    graph inputs with an initializer default (ModelInfo.defaulted), which a column may not feed.
    """
    try:
        return _feeds(df, positions, inputs, model_inputs, recipe_file=recipe_file, defaulted=defaulted)
    except RecipeError as exc:
        if table_field is None:
            raise
        raise RecipeError(exc.file, table_field, f"{table_name(df)}: {exc.field}: {exc.detail}") from None


def _feeds(
    df: pd.DataFrame, positions: np.ndarray, inputs: Mapping[str, InputTarget], model_inputs: dict[str, TensorMeta],
    *, recipe_file: Path, defaulted: Collection[str] = (),
) -> dict[str, np.ndarray]:  # fmt: skip
    if len(positions) == 0:
        raise ValueError("build_feeds needs at least one row position")
    fed = _check_mapping(df, inputs, model_inputs, recipe_file=recipe_file, defaulted=defaulted)
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
            feeds[target] = cast_to_input(shaped, column, meta, recipe_file=recipe_file, rows=cells.index)
        except RecipeError as exc:  # text: '0,5' cells in a CSV not declaring decimal commas, NumPy-printed arrays
            hint = text_cells_hint(cells)
            if not hint:
                raise
            raise RecipeError(exc.file, exc.field, exc.detail + hint) from None
    return feeds


def sequence_ids(
    df: pd.DataFrame, positions: np.ndarray, inputs: Mapping[str, InputTarget], *, recipe_file: Path
) -> np.ndarray | None:
    """The tokenizer's sequence ids (qbench.data.text.pair_sequence_ids) of the rows at `positions` as `build_feeds`
    encodes them, where one text input encodes (text, pair) pairs: which tokens are the pair's second text (a QA
    model's context), whatever inputs the model takes. None without such an input, with several (which one a task
    reads is unknown), or with a tokenizer that cannot say. Call it on rows `build_feeds` has accepted."""
    paired = [(column, spec) for column, spec in inputs.items()
              if isinstance(spec, TextInputSpec) and spec.tokenizer.pair is not None]  # fmt: skip
    if len(paired) != 1 or len(positions) == 0:
        return None
    column, spec = paired[0]
    field = f"{INPUTS_FIELD}.{column}"
    texts = text_cells(df[column].iloc[positions], column, recipe_file=recipe_file, field=field)
    pairs = text_cells(df[str(spec.tokenizer.pair)].iloc[positions], str(spec.tokenizer.pair), recipe_file=recipe_file,
                       field=tokenizer_field(column, "pair"))  # fmt: skip
    return pair_sequence_ids(texts, pairs, spec.tokenizer, recipe_file=recipe_file, column=column)


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
    df: pd.DataFrame, inputs: Mapping[str, InputTarget], model_inputs: dict[str, TensorMeta], *, recipe_file: Path,
    defaulted: Collection[str] = (),
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
        elif target in defaulted:
            message = (f"model input {target!r} has a default (an initializer of the same name, as older exporters "
                       "write), which qbench holds constant in every variant and never feeds; expected it left out of "
                       "data.inputs, or the model saved without that initializer to feed it per row")
            raise RecipeError(recipe_file, field, message)
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
    for name, meta in model_inputs.items():
        why = _container_input(meta) or _per_call_input(meta, model_inputs)
        if why:
            field = f"{INPUTS_FIELD}.{fed_by[name]}" if name in fed_by else INPUTS_FIELD
            raise RecipeError(recipe_file, field, why)
    unfed = [name for name in model_inputs if name not in fed_by]
    if unfed:
        message = f"model input {unfed[0]!r} is fed by no column; add `<column>: {unfed[0]}`"
        raise RecipeError(recipe_file, INPUTS_FIELD, message)
    return fed


def _container_input(meta: TensorMeta) -> str | None:
    """Why a model input that is no tensor (a map, a sequence, an optional: scikit-learn's DictVectorizer takes a
    map(string, float)) cannot be fed from a column, None for a tensor. Fed the column as a tensor, ONNX Runtime
    refused every batch, which read as a model that does not run."""
    if meta.kind == "tensor":
        return None
    return (f"model input {meta.name!r} takes a {meta.type_name}, not a tensor, where qbench feeds a column as a "
            "tensor, one value per row along axis 0; expected a model whose inputs are tensors (convert or export it "
            "from the step that turns each row's values into a tensor on, fed from list or number columns)")


def _per_call_input(meta: TensorMeta, model_inputs: dict[str, TensorMeta]) -> str | None:
    """Why a model input with no row axis (`shared_by_batch`) cannot be fed from a column, and how to feed it; None
    for one with a row axis. A column of one value a row fits a fixed-length vector at that one batch size alone."""
    if not shared_by_batch(meta, model_inputs):
        return None
    if meta.scalar:
        what = "is a scalar (shape []): one value per call"
    else:
        batched = next(other for other in model_inputs.values() if other.shape and other.shape[0] is None)
        what = (f"{meta.shape_text()} has no row axis: every axis is fixed while {batched.name} "
                f"{batched.shape_text()} leaves axis 0 dynamic for the rows, so it is one tensor per call, shared by "
                "the batch")
    return (f"model input {meta.name!r} {what}, where qbench feeds a column one value per row along axis 0; expected "
            f"an input with a row axis, or give {meta.name!r} a default in the graph (an initializer named "
            f"{meta.name!r} at the value to judge: qbench then feeds it never and holds it constant in every variant; "
            "docs/recipe-reference.md: Graphs as tools write them)")


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
        feeds[meta.name] = cast_to_input(array, column, meta, recipe_file=recipe_file)
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
    return f"expected one of {names_listed(options)}{did_you_mean(got, options)}"


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
            f"{non_numeric(arrays[first])} (first at row {cells.index[first]})"
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


def _is_integral(value: object) -> bool:
    if isinstance(value, (bool, int, np.integer, np.bool_)):
        return True
    return isinstance(value, (float, np.floating)) and float(value).is_integer()
