"""NaN / ±inf in the model's input columns: found per column and per slice, then an error or dropped rows.

A non-finite input makes the FP32 reference and every variant produce garbage for
that row, and a quantized variant may saturate where FP32 propagates NaN, so the
accuracy comparison says nothing. By default such rows are a recipe error naming
the column, the row count and the slices they fall in; `data.nonfinite_inputs: drop`
removes them instead, and the sweep records how many rows each column cost.

Some models read NaN as "missing" (gradient-boosted trees' missing-value branches, an
Imputer in the graph): there the rows holding NaN are often most of the real data, and
judging the model on the complete rows alone judges another population. `keep` feeds
them as they are, counts them per column, and makes each such column a slice
(`missing_slices`) that the gate judges like any other; FP32 must give finite outputs
on them (qbench.validate.measure refuses a model that does not read NaN).
Text columns (tokenized) and missing cells (reported by `build_feeds`) are not counted here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from qbench.data.load import table_name
from qbench.errors import RecipeError
from qbench.recipe.data import DataSpec, InputTarget

logger = logging.getLogger(__name__)

_SHOWN = 4  # columns / slices named in one message
MISSING_SLICE = "missing:"  # the prefix of the slice of the rows whose cell of an input column is NaN/inf (keep)
_BLOCK_ROWS = 65_536  # rows of a list column checked at once

NonfiniteMasks = Mapping[str, np.ndarray]
"""Input column -> boolean mask over all rows of a table whose cell holds NaN or ±inf."""


def nonfinite_masks(df: pd.DataFrame, inputs: Mapping[str, InputTarget]) -> dict[str, np.ndarray]:
    """Input column -> boolean mask over all rows whose cell holds NaN or ±inf (only columns that have some)."""
    masks: dict[str, np.ndarray] = {}
    for column, target in inputs.items():
        if not isinstance(target, str) or column not in df.columns:  # text and images: no numbers to check
            continue
        mask = _nonfinite_cells(df[column])
        if mask.any():
            masks[column] = mask
    return masks


def drop_nonfinite(rows: np.ndarray, masks: NonfiniteMasks) -> tuple[np.ndarray, dict[str, int]]:
    """`rows` without those any mask marks, and how many of `rows` each column marked."""
    counts = {column: int(mask[rows].sum()) for column, mask in masks.items()}
    bad = np.zeros(len(rows), dtype=bool)
    for mask in masks.values():
        bad |= mask[rows]
    return rows[~bad], {column: n for column, n in counts.items() if n}


def missing_slices(rows: np.ndarray, masks: NonfiniteMasks) -> dict[str, np.ndarray]:
    """`missing:<column>` -> mask over all rows, for each input column with NaN/inf among `rows`
    (`data.nonfinite_inputs: keep`): the rows with a missing value are judged apart from the others."""
    return {f"{MISSING_SLICE}{column}": mask for column, mask in masks.items() if mask[rows].any()}


def nonfinite_counts(
    rows: np.ndarray, masks: NonfiniteMasks, slices: Mapping[str, np.ndarray], *, what: str
) -> dict[str, dict[str, int]]:
    """Rows kept with NaN/inf inputs (`data.nonfinite_inputs: keep`) per input column: `what` -> {column: rows} over
    `rows`, and `slice:<name>` -> {column: rows} over the rows of each slice (`slices`: masks over all rows)."""
    counts = {what: drop_nonfinite(rows, masks)[1]}
    for name, mask in slices.items():
        counts[f"slice:{name}"] = drop_nonfinite(rows[mask[rows]], masks)[1]
    return {key: value for key, value in counts.items() if value}


def check_finite(
    df: pd.DataFrame,
    rows: np.ndarray,
    masks: NonfiniteMasks,
    slices: Mapping[str, np.ndarray],
    *,
    what: str,
    recipe_file: Path,
    field: str = "data.inputs",
    policy: str = "error",
) -> None:
    """Raise a RecipeError when any of `rows` (the `what` rows) holds NaN/inf in an input column, unless `policy`
    (data.nonfinite_inputs) is keep.

    The message names each column with its row count and the slices those rows fall in.
    """
    if policy == "keep":
        return
    _, counts = drop_nonfinite(rows, masks)
    if not counts:
        return
    parts = []
    for column, count in list(counts.items())[:_SHOWN]:
        in_rows = masks[column] & np.isin(np.arange(len(df)), rows)
        parts.append(f"column {column!r}: {_row_note(in_rows, count)}{_slice_note(in_rows, slices)}")
    more = f"; and {len(counts) - _SHOWN} more columns" if len(counts) > _SHOWN else ""
    first = next(iter(counts))
    raise RecipeError(
        recipe_file,
        f"{field}.{first}" if field == "data.inputs" else field,
        f"{what} rows of {table_name(df)} hold NaN, inf or an empty cell in input columns ({'; '.join(parts)}{more}); "
        "expected a finite number or a text in every cell, or set data.nonfinite_inputs: drop to leave those rows out "
        "(keep: to feed them, for a model that reads NaN as missing)",
    )


def qat_refuses_nonfinite(
    recipe_file: Path, name: str, index: int, training: tuple[np.ndarray, NonfiniteMasks],
    calibration: tuple[np.ndarray, NonfiniteMasks],
) -> None:
    """Under data.nonfinite_inputs: keep, a RecipeError naming QAT variant `name` (variants[`index`]) when its
    training rows or the calibration rows its observers start from (each: rows, masks over their table) hold NaN/inf:
    fake quantization would turn NaN into a number, so the model would learn on values it reads as present, and a
    NaN in an observer's range breaks its scale."""
    for what, field, (rows, masks) in (("training", f"variants[{index}].qat.train.filter", training),
                                       ("calibration", "data.calibration", calibration)):  # fmt: skip
        counts = drop_nonfinite(rows, masks)[1]
        if counts:
            shown = ", ".join(f"{column!r}: {n} row{'s' if n != 1 else ''}" for column, n in counts.items())
            raise RecipeError(recipe_file, field, (
                f"QAT variant {name!r} would {'train' if what == 'training' else 'calibrate'} on {what} rows holding "
                f"NaN/inf ({shown}), which fake quantization turns into numbers; data.nonfinite_inputs: keep does not "
                f"extend to QAT: expected {what} rows without NaN/inf ({field} selecting complete rows), or "
                "data.nonfinite_inputs: drop, or no QAT variant"))  # fmt: skip


def _row_note(mask: np.ndarray, count: int) -> str:
    """'3 rows, at rows 1, 2, 4': the rows themselves, so a few bad records among a million can be found (an export's
    trailing row of separators alone, `;;;`, reads as a row of empty cells)."""
    where = np.flatnonzero(mask)
    shown = ", ".join(str(row) for row in where[:_SHOWN]) + (", ..." if where.size > _SHOWN else "")
    return f"{count} row{'s' if count != 1 else ''}, at row{'s' if where.size != 1 else ''} {shown}"


def _slice_note(mask: np.ndarray, slices: Mapping[str, np.ndarray]) -> str:
    hits = [(name, int((mask & slice_mask).sum())) for name, slice_mask in slices.items()]
    hits = [(name, n) for name, n in hits if n]
    if not hits:
        return ""
    shown = ", ".join(f"{name} {n}" for name, n in hits[:_SHOWN])
    return f" (slices: {shown}{', ...' if len(hits) > _SHOWN else ''})"


def _nonfinite_cells(values: pd.Series) -> np.ndarray:
    """A nullable integer or boolean column's missing cell (pandas' Int64 / boolean / int64[pyarrow] NA, as Parquet
    reads a null) counts as NaN does in a float column: it reaches a float input as NaN, and an integer input
    cannot hold it. NumPy integers and booleans have no missing cell."""
    if pd.api.types.is_bool_dtype(values) or pd.api.types.is_integer_dtype(values):
        return values.isna().to_numpy(dtype=bool)
    if pd.api.types.is_numeric_dtype(values):
        array = values.to_numpy(dtype=np.float64, na_value=np.nan)
        return ~np.isfinite(array)
    cells = values.to_numpy()
    if uniform_numeric_cells(cells):  # stacked a block of rows at a time: no copy of a whole column of images
        blocks = (np.stack(cells[start : start + _BLOCK_ROWS]) for start in range(0, len(cells), _BLOCK_ROWS))
        return np.concatenate([~np.isfinite(block).all(axis=tuple(range(1, block.ndim))) for block in blocks])
    return np.fromiter((_cell_is_nonfinite(cell) for cell in values), dtype=bool, count=len(values))


def stacked_numeric_cells(cells: np.ndarray) -> np.ndarray | None:
    """(N, *cell_shape) when every cell is a numeric ndarray of one shape (a Parquet list column, one array per row),
    stacked in one call; else None, and the caller reads the cells one by one. A table of a million rows has a
    million cells: looking at each through cell_array costs seconds, their types and shapes alone milliseconds.
    The result is what stacking cell_array(cell) of each cell gives, since cell_array returns such a cell as it is."""
    return np.stack(cells) if uniform_numeric_cells(cells) else None


def uniform_numeric_cells(cells: np.ndarray) -> bool:
    """Whether every cell (at least one) is a numeric ndarray, all of one shape."""
    if len(cells) == 0 or not all(type(cell) is np.ndarray for cell in cells):
        return False
    return not ({cell.dtype.kind for cell in cells} - set("biuf")) and len({cell.shape for cell in cells}) == 1


def _cell_is_nonfinite(cell: object) -> bool:
    """A cell (a number, a list, an array, or an array of arrays) holding NaN or ±inf; text and None never do."""
    if cell is None or isinstance(cell, (str, bytes)):
        return False
    try:
        array = cell_array(cell)
    except (ValueError, TypeError):  # ragged lists: build_feeds reports their shapes
        return False
    if array.dtype.kind not in "fc":
        return False
    return not bool(np.isfinite(array).all())


def cell_array(cell: object) -> np.ndarray:
    """A cell as an ndarray. Nested arrays (parquet's object arrays of arrays) become one block, and numbers with
    gaps (JSON null, or a NaN that pandas' JSON reader gives back as None) a float array with NaN in the gaps, so
    `data.nonfinite_inputs` treats them as it treats NaN from any other format."""
    array = np.asarray(_unnested(cell) if isinstance(cell, np.ndarray) and cell.dtype == object else cell)
    if array.dtype == object and array.size and all(_number_or_gap(v) for v in array.flat):
        array = np.array([np.nan if v is None else v for v in array.flat], dtype=np.float64).reshape(array.shape)
    return array


def _unnested(value: object) -> object:
    """Parquet reads a list of lists of any depth (an image's rows of pixels of channels) as object arrays of object
    arrays, one per level: plain nested lists, down to the numeric arrays, so np.asarray stacks every level."""
    if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.dtype == object):
        return [_unnested(v) for v in value]
    return value


def _number_or_gap(value: object) -> bool:
    return value is None or (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool))


def kept_nonfinite(
    data: DataSpec,
    evaluation: tuple[np.ndarray, NonfiniteMasks, dict[str, np.ndarray]],
    calibration: tuple[np.ndarray, NonfiniteMasks],
    selection: np.ndarray,
) -> dict[str, dict[str, int]]:
    """With `data.nonfinite_inputs: keep`, the rows fed with NaN/inf per input column (nonfinite_counts), said in the
    log: the evaluation rows (overall and per slice), the calibration rows fitted on, and the `selection` rows
    candidates are chosen on (positions in the calibration table, under its masks): every row fed is counted once,
    in the one place it is fed; else nothing."""
    if data.nonfinite_inputs != "keep":
        return {}
    rows, nonfinite, masks = evaluation
    kept = nonfinite_counts(rows, nonfinite, masks, what="evaluation")
    kept |= nonfinite_counts(calibration[0], calibration[1], {}, what="calibration")
    kept |= nonfinite_counts(selection, calibration[1], {}, what="selection")
    for what in ("evaluation", "calibration", "selection"):
        if what in kept:
            shown = ", ".join(f"{column}: {n}" for column, n in kept[what].items())
            logger.info("%s rows fed with NaN/inf inputs (data.nonfinite_inputs: keep): %s", what, shown)
    return kept
