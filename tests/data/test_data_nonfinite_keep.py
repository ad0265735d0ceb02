"""`data.nonfinite_inputs: keep`: rows with NaN/inf inputs are fed, counted per column and per slice, and each such
column makes a `missing:<column>` slice, which the sweep measures and the gate re-derives like any other."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench.data.evaluation import evaluation_rows
from qbench.data.nonfinite import check_finite, missing_slices, nonfinite_counts, nonfinite_masks
from qbench.errors import RecipeError
from qbench.recipe.data import DataSpec

RECIPE = Path("recipe.yaml")


def _table() -> pd.DataFrame:
    """Six rows: `a` missing in rows 1, 2, 4; `b` in row 4; `kind` alternates."""
    table = pd.DataFrame({"a": [0.0, np.nan, np.nan, 3.0, np.inf, 5.0], "b": [1.0, 1.0, 1.0, 1.0, np.nan, 1.0],
                          "c": [1.0] * 6, "kind": ["p", "q"] * 3})  # fmt: skip
    table.attrs["source"] = "rows.parquet"
    return table


def _spec(**fields: object) -> DataSpec:
    return DataSpec(path=Path("rows.parquet"), inputs={"a": "a", "b": "b", "c": "c"}, **fields)


def test_keep_feeds_the_rows_and_makes_a_missing_slice_per_column() -> None:
    table = _table()
    spec = _spec(nonfinite_inputs="keep", slices=[{"by": "kind"}])
    evaluated = evaluation_rows(table, spec, recipe_file=RECIPE, calibrated=False)
    assert evaluated.rows.tolist() == list(range(6)) and evaluated.dropped == {}
    assert list(evaluated.slices) == ["kind=p", "kind=q", "missing:a", "missing:b"]  # none for the finite column c
    assert evaluated.slice_sizes["missing:a"] == 3 and evaluated.slice_sizes["missing:b"] == 1
    assert np.flatnonzero(evaluated.slices["missing:a"]).tolist() == [1, 2, 4]


def test_the_other_policies_still_refuse_or_drop_and_make_no_missing_slice() -> None:
    with pytest.raises(RecipeError, match="data.inputs.a"):
        evaluation_rows(_table(), _spec(), recipe_file=RECIPE, calibrated=False)
    dropped = evaluation_rows(_table(), _spec(nonfinite_inputs="drop"), recipe_file=RECIPE, calibrated=False)
    assert dropped.rows.tolist() == [0, 3, 5] and not any(name.startswith("missing:") for name in dropped.slices)


def test_a_recipe_slice_named_as_a_missing_slice_is_refused() -> None:
    spec = _spec(nonfinite_inputs="keep", slices=[{"name": "missing:a", "filter": {"kind": "p"}}])
    with pytest.raises(RecipeError, match=r"data\.slices.*'missing:a'.*expected another name"):
        evaluation_rows(_table(), spec, recipe_file=RECIPE, calibrated=False)


def test_counts_per_column_overall_and_per_slice() -> None:
    table = _table()
    masks = nonfinite_masks(table, {"a": "a", "b": "b", "c": "c"})
    slices = {"kind=p": (table["kind"] == "p").to_numpy(), **missing_slices(np.arange(6), masks)}
    counts = nonfinite_counts(np.arange(6), masks, slices, what="evaluation")
    assert counts == {"evaluation": {"a": 3, "b": 1}, "slice:kind=p": {"a": 2, "b": 1},
                      "slice:missing:a": {"a": 3, "b": 1}, "slice:missing:b": {"a": 1, "b": 1}}  # fmt: skip
    # rows 0 and 3 hold no NaN/inf: no count, and no missing slice for a column finite there
    assert nonfinite_counts(np.array([0, 3]), masks, {}, what="calibration") == {}
    assert missing_slices(np.array([0, 3]), masks) == {}
    check_finite(table, np.arange(6), masks, {}, what="calibration", recipe_file=RECIPE, policy="keep")  # no error


def test_kept_counts_cover_the_selection_rows_fed_as_well() -> None:
    """Rows candidates are chosen on (calibrator: auto, the INT8 search) are fed too: counted under `selection`, apart
    from the calibration rows fitted on."""
    from qbench.data.nonfinite import kept_nonfinite

    x = np.arange(20, dtype=np.float64).reshape(10, 2)
    x[[1, 4, 6, 8], 0] = np.nan
    table = pd.DataFrame({"x": list(x)})
    data = DataSpec.model_validate({"path": "t.parquet", "inputs": {"x": "x"}, "nonfinite_inputs": "keep"})
    masks = nonfinite_masks(table, data.inputs)
    kept = kept_nonfinite(data, (np.array([0, 1, 2]), masks, {}), (np.array([3, 4]), masks), np.array([5, 6, 7, 8]))
    assert kept == {"evaluation": {"x": 1}, "calibration": {"x": 1}, "selection": {"x": 2}}
