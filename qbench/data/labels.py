"""The label cells of chosen rows, however `data.label` lays them out: the one place labels are read from the table.

`data.label` names one column (a class, a number or a list per row, as the task reads it), or, for task
multilabel, one column per label (`[toxic, obscene, insult, threat]`: the wide table most multilabel data
comes as). Each such column holds 0/1 or true/false (a boolean column, numbers, or the text of a CSV column
read as text because it is also a slice or stratify_by column: `0`, `1`, `1.0`, `true`, `False`), and its row
is read as the list of 0/1 a list column would hold, in the recipe's column order: the task then reads both
forms alike, so every figure is the same. A column missing, a missing cell or a cell that is not 0/1 is a
RecipeError naming the column and the row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from qbench.data.load import table_name
from qbench.errors import RecipeError, expected_one_of, short_repr
from qbench.recipe.data import DataSpec

FIELD = "data.label"
ZERO_ONE_TEXT = {"0": 0, "1": 1, "0.0": 0, "1.0": 1, "false": 0, "true": 1}  # a CSV cell's text, case aside
EXPECTED = "expected 0/1 or true/false in every row (one column per label)"


def unlabelled_hint(table: pd.DataFrame, column: str, rows: np.ndarray) -> str:
    """For an error about the labels of `rows`: how to judge only the labelled ones, where some have no label (an empty
    cell, a null: a warehouse's nullable Int64 column); else ''. Never guessed away: which rows a verdict rests on is
    the recipe's choice."""
    missing = int(table[column].iloc[np.asarray(rows)].isna().sum())
    if not missing:
        return ""
    return (f"; to judge only the labelled rows, add {{{column}: {{ne: null}}}} to data.evaluation.filter ({missing} "
            f"evaluation rows of {table_name(table)} have no label)")


def label_cells(table: pd.DataFrame, data: DataSpec, rows: np.ndarray, *, recipe_file: Path) -> list[Any] | None:
    """The label of each of `rows` (positions in `table`): the label column's cells, or with one column per label
    a list of 0/1 per row; None without `data.label`."""
    columns = data.label_columns
    for index, column in enumerate(columns):
        if column not in table.columns:
            field = FIELD if isinstance(data.label, str) else f"{FIELD}[{index}]"
            raise RecipeError(recipe_file, field, expected_one_of(column, [str(c) for c in table.columns]))
    if not columns:
        return None
    positions = np.asarray(rows)
    if isinstance(data.label, str):
        return table[data.label].iloc[positions].tolist()
    bits = [_zero_one(table, column, positions, field=f"{FIELD}[{i}]", recipe_file=recipe_file)
            for i, column in enumerate(columns)]  # fmt: skip
    return np.stack(bits, axis=1).tolist()


def _zero_one(table: pd.DataFrame, column: str, positions: np.ndarray, *, field: str, recipe_file: Path) -> np.ndarray:
    """One label column's cells on `positions` as 0/1 (int64)."""
    cells = table[column].iloc[positions]
    missing = cells.isna().to_numpy()
    if missing.any():
        raise RecipeError(recipe_file, field, f"column {column!r} has no value in {_rows(missing, positions)} "
                          f"of {table_name(table)}; {EXPECTED}")  # fmt: skip
    if pd.api.types.is_bool_dtype(cells.dtype):
        return cells.to_numpy(dtype=np.int64)
    if pd.api.types.is_numeric_dtype(cells.dtype):
        values = cells.to_numpy(dtype=np.float64)
        bad = ~np.isin(values, (0.0, 1.0))
        ones = values == 1.0
    else:
        read = [_cell_bit(cell) for cell in cells.tolist()]
        bad = np.array([bit is None for bit in read], dtype=bool)
        ones = np.array([bit == 1 for bit in read], dtype=bool)
    if bad.any():
        raise RecipeError(recipe_file, field, f"column {column!r} is not 0/1 in {_rows(bad, positions, cells)} of "
                          f"{table_name(table)}; {EXPECTED}")  # fmt: skip
    return ones.astype(np.int64)


def _cell_bit(cell: Any) -> int | None:
    """0 or 1 for a cell of an object or text column that writes one (True, 1, '1', 'true', 'False'), else None."""
    if isinstance(cell, (bool, np.bool_)):
        return int(cell)
    if isinstance(cell, (int, float, np.integer, np.floating)):
        return int(cell) if cell in (0, 1) else None
    if isinstance(cell, str):
        return ZERO_ONE_TEXT.get(cell.strip().lower())
    return None


def _rows(flags: np.ndarray, positions: np.ndarray, cells: pd.Series | None = None) -> str:
    """'3 rows, e.g. row 17 (2.5)' for the flagged cells (their value shown when `cells` are given); rows are the
    data file's row numbers."""
    where = np.flatnonzero(flags)
    first = int(where[0])
    cell = None if cells is None else cells.iloc[first]
    value = "" if cells is None else f" ({short_repr(cell.item() if isinstance(cell, np.generic) else cell)})"
    return f"{where.size} row{'s' if where.size != 1 else ''}, e.g. row {int(positions[first])}{value}"
