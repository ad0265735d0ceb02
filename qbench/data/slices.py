"""Slices: named subsets of rows on which accuracy is reported and gated separately.

`by: column` makes one slice per distinct value, named `column=value`; a named
filter makes one slice with its name. Masks cover every row of the table; the
caller restricts them to the rows it evaluates.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from qbench.data.filters import distinct_values, empty_selection_error, filter_mask, format_value, scalar_column
from qbench.errors import RecipeError
from qbench.recipe import SliceSpec

MAX_SLICES_PER_COLUMN = 50


def slice_masks(
    df: pd.DataFrame, specs: Sequence[SliceSpec], *, recipe_file: Path, field: str = "data.slices"
) -> dict[str, np.ndarray]:
    """Slice name -> boolean mask over all rows, in recipe order (values of a `by` column sorted)."""
    masks: dict[str, np.ndarray] = {}
    made_by: dict[str, str] = {}
    for index, spec in enumerate(specs):
        spec_field = f"{field}[{index}]"
        if spec.by is not None:
            new = _masks_by_column(df, spec.by, field=f"{spec_field}.by", recipe_file=recipe_file)
        else:
            new = {spec.name: _named_filter_mask(df, spec, field=f"{spec_field}.filter", recipe_file=recipe_file)}
        for name, mask in new.items():
            if name in masks:
                raise RecipeError(
                    recipe_file, spec_field, f"duplicate slice name {name!r} (also made by {made_by[name]})"
                )
            masks[name] = mask
            made_by[name] = spec_field
    return masks


def _masks_by_column(df: pd.DataFrame, column: str, *, field: str, recipe_file: Path) -> dict[str, np.ndarray]:
    values = scalar_column(df, column, field=field, recipe_file=recipe_file)
    distinct = distinct_values(values)
    if len(distinct) > MAX_SLICES_PER_COLUMN:
        raise RecipeError(
            recipe_file,
            field,
            f"column {column!r} has {len(distinct)} distinct values "
            f"(at most {MAX_SLICES_PER_COLUMN} slices per column): "
            f"bucket it with named filters, e.g. {{name: {column}-low, filter: {{{column}: {{lt: ...}}}}}}",
        )
    masks: dict[str, np.ndarray] = {}
    for value in distinct:
        name = f"{column}={format_value(value)}"
        if name in masks:
            raise RecipeError(
                recipe_file, field, f"values of column {column!r} give the slice name {name!r} twice (mixed types?)"
            )
        masks[name] = (values == value).to_numpy(dtype=bool, na_value=False)
    return masks


def _named_filter_mask(df: pd.DataFrame, spec: SliceSpec, *, field: str, recipe_file: Path) -> np.ndarray:
    """A named slice that matches no row of the whole table is a typo in its filter, not an empty slice."""
    mask = filter_mask(df, spec.filter, field=field, recipe_file=recipe_file)
    if not mask.any():
        raise empty_selection_error(df, spec.filter or {}, field=field, recipe_file=recipe_file)
    return mask
