"""Slices: named subsets of rows on which accuracy is reported and gated separately.

`by: column` makes one slice per distinct value, named `column=value`, and one
`column=<missing>` for the rows without a value (None/NaN), if any; a named
filter makes one slice with its name; `by_length: column` + `buckets: [16, 32, 64]`
makes one slice per token-length bucket of a text input (`text_tokens<=16`,
`text_tokens=17-32`, `text_tokens=33-64`, `text_tokens>64`), counting the tokens the
column's tokenizer makes without padding (of a pair, both texts). Masks cover every row of the table; the
caller restricts them to the rows it evaluates.
"""

from __future__ import annotations

import datetime
import itertools
import json
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from qbench.data.filters import (
    check_one_kind,
    distinct_values,
    empty_selection_error,
    filter_mask,
    format_value,
    printable,
    scalar_column,
)
from qbench.data.load import table_name
from qbench.data.text import check_pair_column, text_cells, token_counts
from qbench.errors import RecipeError
from qbench.recipe.data import InputTarget, SliceSpec, TextInputSpec

MAX_SLICES_PER_COLUMN = 50
CONTINUOUS_MIN_VALUES = 10  # a `by` column of numbers with more distinct values than this ...
CATEGORY_MIN_ROWS = 2  # ... and fewer rows than this per value on average is continuous, not categories
MISSING_VALUE = "<missing>"  # the value in the name of a `by` slice holding the rows where the column is empty


def slice_masks(
    df: pd.DataFrame,
    specs: Sequence[SliceSpec],
    *,
    recipe_file: Path,
    field: str = "data.slices",
    inputs: Mapping[str, InputTarget] | None = None,
    evaluation_rows: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Slice name -> boolean mask over all rows, in recipe order (values of a `by` column sorted).

    `inputs` (the recipe's data.inputs) names the tokenizer of each text column for `by_length` slices.
    With `evaluation_rows`, a slice holding none of them is an error: it would have no accuracy to gate.
    """
    masks: dict[str, np.ndarray] = {}
    made_by: dict[str, str] = {}
    for index, spec in enumerate(specs):
        spec_field = f"{field}[{index}]"
        if spec.by is not None:
            new = _masks_by_column(df, spec.by, field=f"{spec_field}.by", recipe_file=recipe_file,
                                   evaluation_rows=evaluation_rows)  # fmt: skip
        elif spec.by_length is not None:
            new = _masks_by_length(df, spec, inputs or {}, field=spec_field, recipe_file=recipe_file)
        else:
            new = {spec.name: _named_filter_mask(df, spec, field=f"{spec_field}.filter", recipe_file=recipe_file)}
        for name, mask in new.items():
            if evaluation_rows is not None and not mask[evaluation_rows].any():
                raise RecipeError(
                    recipe_file,
                    spec_field,
                    f"slice {name!r} has {int(mask.sum())} rows in {table_name(df)} but none among the "
                    f"{len(evaluation_rows)} evaluation rows; expected a slice of the evaluated rows "
                    "(check data.evaluation.filter / limit)",
                )
            if name in masks:
                raise RecipeError(
                    recipe_file, spec_field, f"duplicate slice name {name!r} (also made by {made_by[name]})"
                )
            masks[name] = mask
            made_by[name] = spec_field
    return masks


def _masks_by_column(
    df: pd.DataFrame, column: str, *, field: str, recipe_file: Path, evaluation_rows: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """One slice per distinct value among the evaluated rows (all rows without `evaluation_rows`): a value only
    calibration rows hold is no slice to judge. Masks cover every row of the table."""
    values = scalar_column(df, column, field=field, recipe_file=recipe_file)
    check_one_kind(values, column, field=field, recipe_file=recipe_file)
    judged = values if evaluation_rows is None else values.iloc[evaluation_rows]
    distinct = distinct_values(judged)
    _check_categorical(judged, distinct, column, field=field, recipe_file=recipe_file)
    _check_one_spelling(distinct, column, field=field, recipe_file=recipe_file)
    if len(distinct) > MAX_SLICES_PER_COLUMN:
        raise RecipeError(
            recipe_file,
            field,
            f"column {column!r} has {len(distinct)} distinct values "
            f"(at most {MAX_SLICES_PER_COLUMN} slices per column): "
            f"bucket it with named filters, e.g. {_bucket_example(column, distinct)}",
        )
    masks: dict[str, np.ndarray] = {}
    for value in distinct:
        name = f"{printable(str(column))}={format_value(value)}"
        if name in masks:
            raise RecipeError(
                recipe_file, field, f"values of column {column!r} give the slice name {name!r} twice (mixed types?)"
            )
        masks[name] = (values == value).to_numpy(dtype=bool, na_value=False)
    missing = values.isna().to_numpy(dtype=bool)
    judged_missing = missing if evaluation_rows is None else missing[evaluation_rows]
    if judged_missing.any():  # rows without a value are judged too: missing values often mark the unusual inputs
        name = f"{printable(str(column))}={MISSING_VALUE}"
        if name in masks:
            message = (f"column {column!r} holds the text {MISSING_VALUE!r} "
                       f"and empty cells: both would be slice {name!r}")
            raise RecipeError(recipe_file, field, message)
        masks[name] = missing
    return masks


def _bucket_example(column: str, distinct: list[object]) -> str:
    """A named slice grouping some of `column`'s values, as a recipe writes it: a range of numbers or dates (`lt`),
    or a list of the first values (`in`) for text and other values a comparison does not apply to ("Filters")."""
    ordered = (int, float, np.number, datetime.date, np.datetime64)  # a Timestamp is a datetime.date
    if all(isinstance(value, ordered) and not isinstance(value, bool) for value in distinct):
        return f"{{name: {column}-low, filter: {{{column}: {{lt: ...}}}}}}"
    first = ", ".join(format_value(value) for value in distinct[:3])
    return f"{{name: {column}-group-1, filter: {{{column}: {{in: [{first}, ...]}}}}}}"


def _check_categorical(
    judged: pd.Series, distinct: list[object], column: str, *, field: str, recipe_file: Path
) -> None:
    """Refuse a column of continuous numbers: one slice per value would make slices of a row or two, each judged
    (one changed row is a drop of 1.0). Continuous: more distinct numbers (or, in a CSV `by` column read as text,
    texts of numbers) than a category plausibly has among the rows: over CONTINUOUS_MIN_VALUES, and fewer than
    CATEGORY_MIN_ROWS rows per value on average. A few levels that are not whole numbers (doses 0.5 / 2.5,
    versions "2.1" / "2.10") are categories and pass, as do codes and words."""
    numbers = _as_numbers(distinct)
    if numbers is None:
        return
    rows = int(judged.notna().sum())
    if len(distinct) <= CONTINUOUS_MIN_VALUES or len(distinct) * CATEGORY_MIN_ROWS <= rows:
        return
    message = (
        f"column {column!r} holds continuous values ({len(distinct)} distinct among {rows} rows, fewer than "
        f"{CATEGORY_MIN_ROWS} rows a value): "
        "`by` makes one slice per distinct value; expected a column of categories: use named slices, e.g. "
        f"{{name: {column}-low, filter: {{{column}: {{lt: ...}}}}}}, "
        "or bin the column beforehand (a column of bin labels)"
    )
    raise RecipeError(recipe_file, field, message)


TRUE_TEXT = frozenset({"true", "t", "yes", "y", "on", "1", "1.0"})
FALSE_TEXT = frozenset({"false", "f", "no", "n", "off", "0", "0.0"})
"""How exports write true and false, case aside: a column of these alone is a true/false column."""


def _check_one_spelling(distinct: Sequence[object], column: str, *, field: str, recipe_file: Path) -> None:
    """Refuse a `by` column writing one value several ways: texts differing only in case, spaces around them or
    accents' composition ('Cooking', 'cooking ', ' cooking'), or, in a column of true/false texts alone (TRUE_TEXT,
    FALSE_TEXT), one truth written several ways ('true', 'yes', '1'). Each would be its own slice, judged
    apart: a slice of 3 rows that belongs to another passes or fails the gate on noise, and the slice it belongs to
    misses them. Refused, not warned about: the gate's verdict on either slice would be wrong whatever a report said,
    and the gate fails closed. The error names the spellings and a named slice that joins them."""
    texts = [value for value in distinct if isinstance(value, str)]
    keys = {text: _spelling_key(text) for text in texts}
    if texts and all(key in TRUE_TEXT | FALSE_TEXT for key in keys.values()):
        keys = {text: key in TRUE_TEXT for text, key in keys.items()}
    groups: dict[object, list[str]] = {}
    for text, key in keys.items():
        groups.setdefault(key, []).append(text)
    spellings = next((group for group in groups.values() if len(group) > 1), None)
    if spellings is None:
        return
    shown = ", ".join(_yaml_text(text) for text in spellings)
    name = printable(unicodedata.normalize("NFC", spellings[0].strip())) or column  # as a named slice's must be
    raise RecipeError(recipe_file, field, (
        f"column {column!r} writes one value {len(spellings)} ways ({shown}), each of which would be its own slice, "
        "judged apart; expected one spelling per value: clean the column, or join them in a named slice such as "
        f"{{name: {name}, filter: {{{column}: {{in: [{shown}]}}}}}}"))  # fmt: skip


def _yaml_text(text: str) -> str:
    """`text` as a YAML (and JSON) double-quoted string, escaped where it would print like another (accents not
    composed as NFC) or not print (a control character): 'caf\\u00e9' and 'cafe\\u0301' must read apart."""
    plain = text.isprintable() and unicodedata.normalize("NFC", text) == text
    return json.dumps(text, ensure_ascii=not plain)


def _spelling_key(text: str) -> str:
    """What two spellings of one value share: the text without spaces around it, case folded, accents composed
    (NFC). Numbers written differently are not one value: a text column names things ('2.1' and '2.10' are two
    versions, '007' and '7' two codes)."""
    return unicodedata.normalize("NFC", text.strip()).casefold()


def _as_numbers(values: Sequence[object]) -> list[float] | None:
    """`values` as numbers when every one is a number or the text of one (not a bool), else None."""
    numbers: list[float] = []
    for value in values:
        if isinstance(value, (bool, np.bool_)):
            return None
        if isinstance(value, (int, float, np.integer, np.floating)):
            numbers.append(float(value))
            continue
        try:
            numbers.append(float(str(value)))
        except ValueError:
            return None
    if not all(np.isfinite(numbers)):
        return None  # 'inf' / 'nan' written as words: not a measurement scale to bin
    return numbers


def _named_filter_mask(df: pd.DataFrame, spec: SliceSpec, *, field: str, recipe_file: Path) -> np.ndarray:
    """A named slice that matches no row of the whole table is a typo in its filter, not an empty slice."""
    mask = filter_mask(df, spec.filter, field=field, recipe_file=recipe_file)
    if not mask.any():
        raise empty_selection_error(df, spec.filter or {}, field=field, recipe_file=recipe_file)
    return mask


def _masks_by_length(
    df: pd.DataFrame,
    spec: SliceSpec,
    inputs: Mapping[str, InputTarget],
    *,
    field: str,
    recipe_file: Path,
) -> dict[str, np.ndarray]:
    """One mask per token-length bucket that holds rows; rows without text fall in no bucket. A text input encoded
    as a pair is bucketed by the pair's tokens (both texts and the special tokens: what the model is fed)."""
    column, bounds = str(spec.by_length), list(spec.buckets or [])
    target = inputs.get(column)
    if not isinstance(target, TextInputSpec):
        raise RecipeError(recipe_file, f"{field}.by_length", _not_a_text_input(column, inputs))
    if any(lower >= upper for lower, upper in itertools.pairwise(bounds)):
        raise RecipeError(recipe_file, f"{field}.buckets", f"got {bounds}, expected increasing token counts")
    check_pair_column(df, column, target.tokenizer, recipe_file=recipe_file)
    columns = [column] if target.tokenizer.pair is None else [column, target.tokenizer.pair]
    values = [scalar_column(df, name, field=f"{field}.by_length", recipe_file=recipe_file) for name in columns]
    present = np.logical_and.reduce([cells.notna().to_numpy() for cells in values])
    texts = [text_cells(cells[present], name, recipe_file=recipe_file, field=f"{field}.by_length")
             for name, cells in zip(columns, values, strict=True)]  # fmt: skip
    counts = np.full(len(df), -1, dtype=np.int64)
    pairs = texts[1] if len(texts) > 1 else None
    counts[present] = token_counts(texts[0], target.tokenizer, recipe_file=recipe_file, column=column, pairs=pairs)
    masks: dict[str, np.ndarray] = {}
    for name, lower, upper in length_buckets(column, bounds):
        mask = present & (counts >= lower) & (counts <= upper)
        if mask.any():
            masks[name] = mask
    return masks


def _not_a_text_input(column: str, inputs: Mapping[str, InputTarget]) -> str:
    """Why `by_length: column` counts nothing: the column is no text input (or only the second text of a pair)."""
    text_inputs = {name: value for name, value in inputs.items() if isinstance(value, TextInputSpec)}
    text_columns = list(text_inputs)
    paired = [name for name, value in text_inputs.items() if value.tokenizer.pair == column]
    if paired:
        return (f"column {column!r} is the second text of the pair of text input {paired[0]!r}; expected by_length: "
                f"{paired[0]} (it counts the pair's tokens, both texts)")  # fmt: skip
    shown = ", ".join(text_columns) or "none in this recipe"
    return (
        f"column {column!r} is not a text input with a tokenizer in data.inputs "
        f"(text inputs: {shown}); by_length counts the tokens of a text input"
    )


def length_buckets(column: str, bounds: Sequence[int]) -> list[tuple[str, int, float]]:
    """(slice name, lowest, highest token count) per bucket: [16, 32] -> <=16, 17-32, >32."""
    buckets: list[tuple[str, int, float]] = []
    lower = 0
    for upper in bounds:
        span = f"<={upper}" if lower == 0 else (f"={upper}" if lower == upper else f"={lower}-{upper}")
        buckets.append((f"{column}_tokens{span}", lower, upper))
        lower = upper + 1
    buckets.append((f"{column}_tokens>{bounds[-1]}", lower, np.inf))
    return buckets
