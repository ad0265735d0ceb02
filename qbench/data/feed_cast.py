"""Numeric cells -> the dtype of the model input they feed, refusing a cast that would change them: text where numbers
are expected, fractions or missing values into integers, values past the target's range (which would become inf or
wrap), and warning where a float input rounds large integer ids into one another (qbench.data.feeds casts every
numeric feed here).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from qbench.data.text_tables import shown_text
from qbench.errors import RecipeError
from qbench.modelinfo.signature import TensorMeta

logger = logging.getLogger(__name__)

INPUTS_FIELD = "data.inputs"


def cast_to_input(values: np.ndarray, column: str, meta: TensorMeta, *, recipe_file: Path,
                  rows: pd.Index | None = None) -> np.ndarray:
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
        return non_numeric(values)
    if target.kind == "f":
        return _float_overflow(values, target)
    if target.kind not in "iu":
        return None
    if values.dtype.kind == "f" and not np.all(np.isfinite(values) & (values == np.round(values))):
        return _non_integers(values, rows)
    limits = np.iinfo(target)
    if values.min() < limits.min or values.max() > limits.max:
        return _out_of_range(values, limits, rows)
    return None


def _per_row(values: np.ndarray) -> np.ndarray:
    """`values` as one line per row along axis 0 (a lone value as one row)."""
    return values.reshape(len(values), -1) if values.ndim else values.reshape(1, 1)


def _rows_with(bad: np.ndarray, rows: pd.Index | None) -> tuple[int, int, object]:
    """How many rows `bad` (one flag a row) flags, the first one's position, and that row as the table numbers it."""
    first = int(np.flatnonzero(bad)[0])
    return int(bad.sum()), first, rows[first] if rows is not None and len(rows) == len(bad) else first


def _non_integers(values: np.ndarray, rows: pd.Index | None) -> str:
    """Which values an integer input cannot take, by row: missing ones (NaN/inf, as a Parquet or CSV integer column
    with an empty cell reads: `nonfinite_inputs: keep` feeds them to float inputs only) apart from fractions."""
    per_row = _per_row(values)
    missing = ~np.isfinite(per_row).all(axis=1)
    fraction = ~missing & (per_row != np.round(per_row)).any(axis=1)
    found = []
    for kind, bad in (("NaN/inf (missing values)", missing), ("a fraction", fraction)):
        if bad.any():
            count, _, where = _rows_with(bad, rows)
            found.append(f"{count} row{'s' if count != 1 else ''} with {kind}, e.g. row {where}")
    return "non-integer values: " + "; ".join(found)


def _out_of_range(values: np.ndarray, limits: np.iinfo, rows: pd.Index | None) -> str:
    """Which rows hold integers the input's type cannot (the cast would wrap them: 40000 into int16 is -25536), with
    one such value and the range the column spans, which tells a wider encoding (24-bit samples, 16-bit pixels) from
    a stray value."""
    per_row = _per_row(values)
    past = (per_row < limits.min) | (per_row > limits.max)
    count, first, where = _rows_with(past.any(axis=1), rows)
    example = per_row[first][past[first]][0]
    return (f"{count} row{'s' if count != 1 else ''} with values outside {limits.dtype}'s range {limits.min} to "
            f"{limits.max}, e.g. row {where} holding {example} (values seen from {values.min()} to {values.max()})")


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
    return (f"{count} value{'s' if count != 1 else ''} beyond {target}'s "
            f"range (e.g. {finite.max():.3g}), which would become inf")


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


def non_numeric(values: np.ndarray) -> str:
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
