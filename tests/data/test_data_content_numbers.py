"""Rows feeding the model the same numbers, told by what the model input's type takes (qbench.data.content.as_fed):
values written apart in the table but fed alike are one input for the gate and for the leakage check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from qbench.data import evaluation_rows
from qbench.data.content import content_table, numeric_dtypes
from qbench.data.leakage import row_digests, shared_rows
from qbench.modelinfo.signature import TensorMeta
from qbench.recipe.data import DataSpec

RECIPE = Path("recipe.yaml")
DATA = DataSpec(path=Path("d.parquet"), inputs={"x": "x"}, label="y")
FLOAT32 = {"x": np.dtype(np.float32)}


def _distinct(table: pd.DataFrame, dtypes: dict[str, np.dtype] | None) -> dict[str, int]:
    return evaluation_rows(table, DATA, recipe_file=RECIPE, calibrated=False, dtypes=dtypes).distinct_inputs


def test_float64_values_one_float32_holds_are_one_input_of_a_float32_input() -> None:
    """0.1 + 0.2 and 0.3 differ in float64 and are one float32; 0.5 is another input."""
    table = pd.DataFrame({"x": [0.1 + 0.2, 0.3, 0.5], "y": [0, 0, 1]})
    assert table["x"][0] != table["x"][1]
    assert _distinct(table, FLOAT32) == {"overall": 2}
    assert _distinct(table, {"x": np.dtype(np.float64)}) == {}  # a float64 input gets them apart: every row its own


def test_list_cells_are_cast_whole() -> None:
    """Feature rows (a Parquet list column) scaled by 1 + 1e-12: the same float32 row, twice."""
    base = np.array([0.25, -1.5, 3.0e5, 7.0e-4])
    table = pd.DataFrame({"x": [base, base * (1 + 1e-12), base + 1.0], "y": [0, 0, 1]})
    assert _distinct(table, FLOAT32) == {"overall": 2}


def test_ids_past_float32s_integers_fed_to_a_float32_input_are_one_input() -> None:
    """2**24 and 2**24 + 1 are one float32: fed to a float32 input they are one input; to an int64 input two."""
    table = pd.DataFrame({"x": np.array([2**24, 2**24 + 1, 5], dtype=np.int64), "y": [0, 0, 1]})
    assert _distinct(table, FLOAT32) == {"overall": 2}
    assert _distinct(table, {"x": np.dtype(np.int64)}) == {}


def test_calibration_rows_repeating_evaluation_rows_below_float32s_precision_are_counted() -> None:
    evaluated = pd.DataFrame({"x": [0.3, 1.7], "y": [0, 1]})
    calibration = pd.DataFrame({"x": [0.1 + 0.2, 2.5, 1.7 * (1 + 1e-13)], "y": [0, 1, 1]})
    judged = row_digests(content_table(evaluated, DATA, recipe_file=RECIPE, dtypes=FLOAT32), np.arange(2), ["x"])
    rows = np.arange(3)
    assert shared_rows(content_table(calibration, DATA, recipe_file=RECIPE, dtypes=FLOAT32), rows, judged, ["x"]) == 2
    assert shared_rows(calibration, rows, judged, ["x"]) == 0  # as written, no row repeats one


def test_numeric_dtypes_keeps_the_inputs_fed_numbers() -> None:
    types = {"x": TensorMeta("x", np.dtype(np.float32), (None, 4)),
             "words": TensorMeta("words", np.dtype(object), (None,)),
             "ids": "int64", "mask": "bool", "half": "bfloat16"}  # fmt: skip
    assert numeric_dtypes(types) == {"x": np.dtype(np.float32), "ids": np.dtype(np.int64), "mask": np.dtype(bool)}


def test_text_cells_are_left_as_written() -> None:
    """A column of words fed to a numeric input is the feed's to refuse; its digest reads the words."""
    table = pd.DataFrame({"x": ["a", "b"], "y": [0, 1]})
    assert content_table(table, DATA, recipe_file=RECIPE, dtypes=FLOAT32)["x"].tolist() == ["a", "b"]


def test_a_column_of_arrays_is_cast_on_the_rows_digested_alone() -> None:
    table = pd.DataFrame({"x": [np.array([0.1 + 0.2, 1.0]), np.array([0.3, 1.0]), np.array([0.5, 2.0])],
                          "y": [0, 0, 1]})  # fmt: skip
    content = content_table(table, DATA, recipe_file=RECIPE, rows=np.array([0, 1]), dtypes=FLOAT32)
    assert [cell.dtype for cell in content["x"]] == [np.dtype(np.float32)] * 2 + [np.dtype(np.float64)]
    assert row_digests(content, np.array([0, 1]), ["x"]).tolist() == [row_digests(content, np.array([1]), ["x"])[0]] * 2
