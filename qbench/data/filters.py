"""Declarative row filters, evaluated with pandas and never as code.

A filter maps a column to a value (equality) or to `{op: value}` with ops
eq, ne, in, not_in, lt, le, gt, ge (the schema is checked by `qbench.recipe`).
Several columns AND together; several ops on one column AND together.

A column of text (a CSV column read as text, qbench.data.text_tables) compares as numbers when every
cell is one, and equals a number where its text is that number written plainly (7 matches "7"
and "7.0", not "007"), and true or false as pandas would have read it ("True", "true", "TRUE").
A column of dates or timestamps equals, and compares with, a text operand read as a date or time ('2024-01-31'),
as does a text column every cell of which is an ISO 8601 date or time (a CSV's: '2024-01-31T00:00:00'; its times
with UTC offsets compared as instants in UTC). Dates are ISO 8601 only: '03/01/2026' is refused, never guessed.

Missing cells (None / NaN) follow SQL: they match only a condition that names
null (`eq: null`, `in: [..., null]`); `ne: x`, `not_in: [x]` and the comparisons
never match them, while `ne: null` and `not_in: [..., null]` match every
non-missing cell.
"""

from __future__ import annotations

import logging
import operator
import re
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from qbench.data.load import table_name
from qbench.data.text_tables import number_format_hint, text_as_numbers, text_decimal
from qbench.errors import RecipeError, expected_one_of, short_repr

logger = logging.getLogger(__name__)

_COMPARISONS: dict[str, Callable[[pd.Series, Any], pd.Series]] = {
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}
_HINT_MAX_VALUES = 20


def filter_mask(df: pd.DataFrame, flt: dict[str, Any] | None, *, field: str, recipe_file: Path) -> np.ndarray:
    """Boolean mask over all rows of `df`; no filter selects every row."""
    mask = np.ones(len(df), dtype=bool)
    for column, condition in (flt or {}).items():
        column_field = f"{field}.{column}"
        values = scalar_column(df, column, field=column_field, recipe_file=recipe_file)
        operations = condition if isinstance(condition, dict) else {"eq": condition}
        for op, operand in operations.items():
            mask &= _condition_mask(values, op, operand, field=column_field, recipe_file=recipe_file)
    return mask


def select_rows(df: pd.DataFrame, flt: dict[str, Any] | None, *, field: str, recipe_file: Path) -> np.ndarray:
    """Row positions (ascending int64) that pass the filter; a filter that selects nothing is an error."""
    mask = filter_mask(df, flt, field=field, recipe_file=recipe_file)
    if not mask.any():
        raise empty_selection_error(df, flt or {}, field=field, recipe_file=recipe_file)
    return np.flatnonzero(mask).astype(np.int64)


def empty_selection_error(df: pd.DataFrame, flt: dict[str, Any], *, field: str, recipe_file: Path) -> RecipeError:
    """'selects no rows (N rows in <file>; <what the filtered columns hold>)'."""
    hints = [_column_hint(df[column], column) for column in flt]
    details = "; ".join([f"{len(df)} rows in {table_name(df)}", *hints])
    return RecipeError(recipe_file, field, f"selects no rows ({details})")


def scalar_column(df: pd.DataFrame, column: str, *, field: str, recipe_file: Path) -> pd.Series:
    """The column `column`, which must exist and hold scalars (filters, slices and strata compare values)."""
    if column not in df.columns:
        raise RecipeError(recipe_file, field, expected_one_of(column, [str(c) for c in df.columns]))
    values = df[column]
    nested = values[values.map(_is_array_like)] if pd.api.types.is_object_dtype(values) else values.iloc[:0]
    if nested.empty:
        return values
    fields = next((list(cell) for cell in nested if isinstance(cell, dict)), None)
    if fields is None:
        raise RecipeError(recipe_file, field, f"column {column!r} holds lists or arrays; expected a column of single "
                          "values")  # fmt: skip
    shown = ", ".join(repr(str(name)) for name in fields[:4]) + (", ..." if len(fields) > 4 else "")
    flattened = f"{column}.{fields[0] if fields else '<field>'}"
    raise RecipeError(recipe_file, field, (
        f"column {column!r} holds structs (nested fields {shown}), as Spark and pyarrow write nested columns and JSON "
        f"lines nested objects; expected a column of single values: each field is a column of its own, named as "
        f"pyarrow's Table.flatten() names it ({flattened!r})"))  # fmt: skip


def check_one_kind(values: pd.Series, column: str, *, field: str, recipe_file: Path) -> None:
    """A column mixing true/false with numbers is refused: True equals 1 to pandas, so a `by` slice of 1 would hold
    the true rows, and a filter `m: 1` selected them too."""
    if not pd.api.types.is_object_dtype(values):
        return
    cells = values.dropna()
    flags = cells.map(lambda v: isinstance(v, (bool, np.bool_)))
    numbers = cells.map(lambda v: isinstance(v, (int, float, np.integer, np.floating))
                        and not isinstance(v, (bool, np.bool_)))
    if flags.any() and numbers.any():
        example = cells[numbers].iloc[0]
        message = (f"column {column!r} mixes true/false with numbers (e.g. {format_value(example)}), which pandas "
                   "takes as equal (True == 1); expected one kind of value")  # fmt: skip
        raise RecipeError(recipe_file, field, message)


def distinct_values(values: pd.Series) -> list[Any]:
    """Distinct non-missing values: numbers in numeric order, then everything else in text order."""
    return sorted(values.dropna().unique().tolist(), key=_sort_key)


def format_value(value: Any) -> str:
    """A cell value as people write it: 3 (not 3.0, even from a float column), 0.25, north, True. Text that would
    print like other text (empty, spaces around it, accents not composed as NFC) is quoted with escapes: ' a',
    'e\\u0301'. Slice names are made of these, and two slices must never read alike in the gate's table."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        number = float(value)
        return str(int(number)) if number.is_integer() else repr(number)
    text = str(value)
    if not text or text != text.strip() or unicodedata.normalize("NFC", text) != text:
        return ascii(text)  # ' a' and 'a', or é as one code point and as e + accent, would print alike
    return printable(text)


def printable(text: str) -> str:
    """`text` with each control or other non-printable character escaped ('a\\nb' for a newline): data values
    become slice names printed in the gate's one-line-per-check output, where a raw newline could forge a line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _condition_mask(values: pd.Series, op: str, operand: Any, *, field: str, recipe_file: Path) -> np.ndarray:
    if op in _COMPARISONS:
        dates = _date_kind(values)
        if dates is None and isinstance(operand, str):  # a CSV keeps dates as text
            if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
                raise RecipeError(recipe_file, field, f"{op!r} got {operand!r}, a text, but column {values.name!r} "
                                                      "holds numbers; expected a number (unquoted)")  # fmt: skip
            _check_date_operand(values, op, operand, field=field, recipe_file=recipe_file)
            values, dates = _text_as_times(values, op, field=field, recipe_file=recipe_file), "datetime"
        if dates is not None:  # a date range: `day: {ge: '2024-01-01', lt: '2024-02-01'}`
            bound = _as_date(values, operand, dates, field=field, recipe_file=recipe_file)
            times = pd.to_datetime(values) if dates == "date" else values  # date cells as midnights, None as NaT
            return _COMPARISONS[op](times, pd.Timestamp(bound)).to_numpy(dtype=bool, na_value=False)
        numbers = values if pd.api.types.is_numeric_dtype(values) else text_as_numbers(values, text_decimal(values))
        if numbers is None:
            raise RecipeError(
                recipe_file,
                field,
                f"{op!r} compares numbers, but column {values.name!r} holds {_kind_of(values)} values"
                f"{number_format_hint(values)}",
            )
        return _COMPARISONS[op](numbers, operand).to_numpy(dtype=bool, na_value=False)
    operands: Sequence[Any] = operand if op in ("in", "not_in") else [operand]
    matched = _matches_any(values, operands, field=field, recipe_file=recipe_file)
    if op in ("eq", "in"):
        return matched
    if any(v is None for v in operands):
        return ~matched
    missing = ~matched & values.isna().to_numpy()
    if missing.any():  # SQL's rule, which a user reading `ne: x` as "all but x" does not expect: say what it left out
        count = int(missing.sum())
        logger.warning("%s: %s: %s leaves out the %d row%s with no %r (a missing cell is never unequal, as in SQL); to "
                       "keep them, list the values to keep with null among them: {in: [..., null]}", recipe_file, field,
                       op, count, "s" * (count != 1), values.name)  # fmt: skip
    return ~matched & ~missing


def _matches_any(values: pd.Series, operands: Sequence[Any], *, field: str, recipe_file: Path) -> np.ndarray:
    wanted = [v for v in operands if v is not None]
    _check_operand_types(values, wanted, field=field, recipe_file=recipe_file)
    if any(isinstance(v, (int, float)) for v in wanted):
        check_one_kind(values, str(values.name), field=field, recipe_file=recipe_file)
    dates = _date_kind(values)
    numbers_as_text = np.zeros(len(values), dtype=bool)
    if dates is not None:
        wanted = [_as_date(values, v, dates, field=field, recipe_file=recipe_file) for v in wanted]
    elif pd.api.types.is_object_dtype(values) or pd.api.types.is_string_dtype(values):
        numbers = [v for v in wanted if isinstance(v, (int, float)) and not isinstance(v, bool)]
        hint = number_format_hint(values) if numbers else ""
        if hint:  # '0,5' is no number here: `ne: 0.5` kept every such row, `eq: 0.5` selected none of them
            raise RecipeError(recipe_file, field, f"got {numbers[0]!r}: column {values.name!r} holds text, not numbers"
                                                  f"{hint}, or compare the text as the file writes it")  # fmt: skip
        wanted += [text for v in wanted if isinstance(v, (int, float)) for text in _cell_texts(v)]
        numbers_as_text = _plain_numbers_in(values, numbers)
        numbers_as_text |= _dates_in_text(values, wanted, field=field, recipe_file=recipe_file)
    matched = values.isin(wanted).to_numpy(dtype=bool, na_value=False) & values.notna().to_numpy()
    matched |= numbers_as_text
    if len(wanted) < len(operands):
        matched |= values.isna().to_numpy()
    return matched


def _check_operand_types(values: pd.Series, wanted: Sequence[Any], *, field: str, recipe_file: Path) -> None:
    """A RecipeError for a value no cell of a typed column can equal. A number against a true/false column, or
    true/false against a numeric one: pandas compares them as Python does (True == 1), so `b: 1` selected the true
    rows and `ne: 0` on a 0/1 column kept the false ones of `ne: false` silently; which one the recipe meant cannot
    be told. Text against either (`n: '7'`, `flag: 'yes'`, also where the column is categorical with such
    categories): it equalled no cell, so `in: ['7', 8]` silently selected the 8s alone and `not_in` kept every row."""
    typed = values.cat.categories if isinstance(values.dtype, pd.CategoricalDtype) else values
    truths = pd.api.types.is_bool_dtype(typed)
    numbers = pd.api.types.is_numeric_dtype(typed) and not truths
    if not (truths or numbers):
        return
    kind, expected = ("true/false", "true or false") if truths else ("numbers", "a number (unquoted, no leading zero)")
    for operand in wanted:
        is_truth = isinstance(operand, (bool, np.bool_))
        is_number = isinstance(operand, (int, float, np.integer, np.floating)) and not is_truth
        if (truths and not is_truth) or (numbers and not is_number):
            raise RecipeError(recipe_file, field, f"got {operand!r}: column {values.name!r} holds {kind}; expected "
                                                  f"{expected}")  # fmt: skip


PLAIN_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?"
"""A number as a table writes it plainly: no leading zero ('007' is a code), no '+', no exponent, no spaces."""


def _plain_numbers_in(values: pd.Series, numbers: Sequence[float]) -> np.ndarray:
    """Which text cells write one of `numbers` plainly: '1.0' and '1' both write 1. A CSV `by` column keeps its text,
    and pandas writes a float column with gaps as '1.0', '2.0', '': matching only the text '1' left `ne: 1` keeping
    every '1.0' row, and `eq: 1` selecting none, where the same table as Parquet selects by the number."""
    if not numbers or pd.api.types.infer_dtype(values, skipna=True) not in ("string", "mixed", "mixed-integer"):
        return np.zeros(len(values), dtype=bool)
    plain = values.astype(object).str.fullmatch(PLAIN_NUMBER).to_numpy(dtype=bool, na_value=False)
    written = pd.to_numeric(values.where(plain), errors="coerce")
    return written.isin(numbers).to_numpy(dtype=bool, na_value=False) & plain


def _date_kind(values: pd.Series) -> str | None:
    """'datetime' for a column of timestamps (datetime64, with or without a time zone), 'date' for one of calendar
    dates (Parquet's date32 reads as datetime.date cells), else None."""
    if pd.api.types.is_datetime64_any_dtype(values):
        return "datetime"
    if pd.api.types.is_object_dtype(values) and pd.api.types.infer_dtype(values, skipna=True) == "date":
        return "date"
    return None


def _check_date_operand(values: pd.Series, op: str, operand: str, *, field: str, recipe_file: Path) -> None:
    """A text operand of a comparison must be a date: `lt: 'b'` on a column of names compares nothing qbench orders
    (text is never compared letter by letter), and was refused as if 'b' were a date."""
    if _iso_time(operand) is not None:
        return
    _check_not_a_local_date(operand, field=field, recipe_file=recipe_file)
    raise RecipeError(recipe_file, field, (
        f"{op!r} got {operand!r}, which is neither a number nor a date; {op!r} compares numbers and dates, "
        f"never text: expected a number (unquoted) or a date such as '2024-01-31', or select values of column "
        f"{values.name!r} with in / not_in"))  # fmt: skip


def _text_as_times(values: pd.Series, op: str, *, field: str, recipe_file: Path) -> pd.Series:
    """A text column every cell of which is an ISO 8601 date or time ('2024-01-31', '2024-01-31 12:30:00'), as
    timestamps; anything else is a RecipeError (a date compared with other text would compare letters)."""
    times = _iso_times(values, field=field, recipe_file=recipe_file)
    if times is None:
        cells = values.dropna().astype(str)
        other = cells[~cells.str.fullmatch(ISO_TIME.pattern)]
        example = f" (e.g. {short_repr(other.iloc[0])})" if len(other) else ""
        raise RecipeError(recipe_file, field, f"{op!r} with a date or time compares dates, but column {values.name!r} "
                                              f"holds {_kind_of(values)} values that are not all ISO 8601 dates "
                                              "such as '2024-01-31' or "
                                              f"'2024-01-31T12:30:00+02:00'{example}")  # fmt: skip
    return times


def _iso_times(values: pd.Series, *, field: str, recipe_file: Path) -> pd.Series | None:
    """A text column every cell of which is an ISO 8601 date or time (ISO_TIME), as timestamps; else None. Times
    with UTC offsets are instants, read in UTC whatever offsets they state (an export spanning a daylight-saving change
    writes +01:00 and +02:00; a 'Z' is +00:00). A column mixing times with an offset and times without is a
    RecipeError: a time without one names no instant, so no comparison of the two is right."""
    if not (pd.api.types.is_object_dtype(values) or pd.api.types.is_string_dtype(values)):
        return None
    cells = values.dropna()
    if pd.api.types.infer_dtype(cells, skipna=True) not in ("string", "empty"):
        return None
    distinct = pd.Series(cells.unique()).astype(str)  # in order of first appearance; a few in a million rows
    parts = distinct.str.extract(f"^(?P<time>{ISO_TIME.pattern})$")
    if parts["time"].isna().any():
        return None
    zoned = parts["zone"].notna().to_numpy()
    if zoned.any() and not zoned.all():
        raise RecipeError(recipe_file, field, (
            f"column {values.name!r} mixes times with a UTC offset ({short_repr(distinct[zoned].iloc[0])}) and "
            f"without ({short_repr(distinct[~zoned].iloc[0])}); a time without an offset names no instant, "
            "so they cannot be compared: expected every cell with its offset, or none"))  # fmt: skip
    try:
        return pd.to_datetime(values, format="ISO8601", utc=bool(zoned.any()))
    except (ValueError, OverflowError):  # '2024-02-30' matches the pattern but is no date
        return None


ISO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?P<zone>Z|[+-]\d{2}(?::?\d{2})?)?)?")
"""An ISO 8601 date or time as filters and text date columns are written: '2024-01-31', '2024-01-31 12:30',
'2024-01-31T12:30:00.5+02:00', '...Z'. Dates in other forms are refused rather than guessed: '03/01/2026' is 1 March
in one locale and 3 January in another."""


def _iso_time(text: str) -> pd.Timestamp | None:
    """`text` as a timestamp when it is an ISO 8601 date or time (ISO_TIME), else None."""
    if not ISO_TIME.fullmatch(text):
        return None
    try:
        return pd.Timestamp(text)
    except ValueError:
        return None


def _check_not_a_local_date(operand: str, *, field: str, recipe_file: Path) -> None:
    """A RecipeError for a date written in a local form ('03/01/2026', '1 March 2026'): compared with dates, it was
    read as pandas guesses (month first); compared with a text column of ISO dates, it equalled no cell."""
    try:
        pd.Timestamp(operand)
    except (ValueError, OverflowError):
        return
    raise RecipeError(recipe_file, field, f"got {operand!r}, a date not written as ISO 8601; expected a date such as "
                                          "'2024-01-31' or a time such as '2024-01-31T12:30:00+02:00' (day and month "
                                          "orders differ between locales, so other forms are not guessed)")  # fmt: skip


def _dates_in_text(values: pd.Series, wanted: Sequence[Any], *, field: str, recipe_file: Path) -> np.ndarray:
    """Which cells of a text column of ISO 8601 dates or times (a CSV's) are the time of a wanted date: `day:
    2024-01-31` matched no cell written '2024-01-31T00:00:00', though `{ge: 2024-01-31, le: 2024-01-31}` selected
    them, and `not_in` kept them. A time zone must be stated on both sides or neither, as for a timestamp column. A
    text operand that is no ISO 8601 date equals no cell of such a column and is a RecipeError (a date in a local
    form, '03/01/2026', selected nothing, and `ne` kept every row)."""
    texts = [v for v in wanted if isinstance(v, str)]
    times = _iso_times(values, field=field, recipe_file=recipe_file) if texts else None
    if times is None:
        return np.zeros(len(values), dtype=bool)
    dates = [v for v in texts if _iso_time(v) is not None]
    if len(dates) < len(texts):
        other = next(v for v in texts if _iso_time(v) is None)
        _check_not_a_local_date(other, field=field, recipe_file=recipe_file)
        raise RecipeError(recipe_file, field, f"got {other!r}: column {values.name!r} holds ISO 8601 dates or times; "
                                              "expected a date such as '2024-01-31'")  # fmt: skip
    stamps = [_as_date(times, v, "datetime", field=field, recipe_file=recipe_file) for v in dates]
    return times.isin(stamps).to_numpy(dtype=bool, na_value=False)


def _as_date(values: pd.Series, operand: Any, kind: str, *, field: str, recipe_file: Path) -> Any:
    """A filter's text operand as a value of a date or time column, so `eq: '2024-01-31'` selects that day's cells
    (a text never equals a timestamp cell: every such filter selected nothing). Anything else is a RecipeError."""
    example = "'2024-01-31'" if kind == "date" else "'2024-01-31' or '2024-01-31 12:30:00'"
    expected = f"column {values.name!r} holds {kind}s; expected a {kind} written as text such as {example}"
    if not isinstance(operand, str):
        raise RecipeError(recipe_file, field, f"got {operand!r}: {expected}")
    parsed = _iso_time(operand)
    if parsed is None:
        _check_not_a_local_date(operand, field=field, recipe_file=recipe_file)
        raise RecipeError(recipe_file, field, f"got {operand!r}: {expected}")
    if kind == "date":
        if parsed != parsed.normalize() or parsed.tz is not None:
            raise RecipeError(recipe_file, field, f"got {operand!r}: {expected}, without a time")
        return parsed.date()
    zone = values.dt.tz
    if (zone is None) != (parsed.tz is None):
        wanted = f"with its UTC offset, like '{parsed}+00:00' ({values.name!r} is in {zone})" if zone is not None \
            else f"without a UTC offset ({values.name!r} holds times without a time zone)"
        raise RecipeError(recipe_file, field, f"got {operand!r}: expected a time {wanted}")
    return parsed


def _cell_texts(value: float) -> tuple[str, ...]:
    """The cells of a text column that write number or truth value `value`: 7 as "7"; true as "True", "true" or
    "TRUE" (what pandas reads as a boolean)."""
    if isinstance(value, bool):
        return (str(value), str(value).lower(), str(value).upper())
    return (format_value(value),)


def _column_hint(values: pd.Series, column: str) -> str:
    distinct = distinct_values(values)
    if not distinct:
        return f"{column} is empty in every row"
    if len(distinct) <= _HINT_MAX_VALUES:
        return f"{column} has {', '.join(_show(v) for v in distinct)}"
    if pd.api.types.is_numeric_dtype(values):
        return f"{column} ranges {format_value(distinct[0])}..{format_value(distinct[-1])}"
    return f"{column} has {len(distinct)} distinct values"


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else format_value(value)


def _kind_of(values: pd.Series) -> str:
    if pd.api.types.is_string_dtype(values):
        return "text"
    return str(values.dtype)


def _is_array_like(cell: Any) -> bool:
    return isinstance(cell, (list, tuple, dict, np.ndarray))


def _sort_key(value: Any) -> tuple[int, Any]:
    if isinstance(value, (int, float, np.integer, np.floating, np.bool_)):
        return (0, float(value))
    return (1, str(value))
