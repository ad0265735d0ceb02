"""NaN/inf in input columns: which rows, per column and per slice; dropped rows are counted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench.data import build_feeds, load_table
from qbench.data.nonfinite import check_finite, drop_nonfinite, nonfinite_masks
from qbench.data.text_tables import CsvDialect
from qbench.errors import RecipeError
from qbench.modelinfo.signature import TensorMeta
from qbench.recipe.data import TextInputSpec, TokenizerSpec

RECIPE = Path("recipe.yaml")


def _table() -> pd.DataFrame:
    table = pd.DataFrame(
        {
            "pixels": [[0.0, 1.0], [np.nan, 1.0], [0.5, np.inf], [1.0, 1.0], [-np.inf, 0.0]],
            "scale": [1.0, 2.0, np.nan, 4.0, 5.0],
            "count": [1, 2, 3, 4, 5],
            "text": ["a", "nan", "inf", None, "b"],
            "region": ["n", "s", "n", "s", "n"],
        }
    )
    table.attrs["source"] = "rows.parquet"
    return table


INPUTS = {"pixels": "x", "scale": "s", "count": "c", "text": TextInputSpec(tokenizer=TokenizerSpec(path="tok"))}


def test_masks_mark_nan_and_inf_per_column_and_skip_integers_and_text() -> None:
    masks = nonfinite_masks(_table(), INPUTS)
    assert set(masks) == {"pixels", "scale"}
    assert masks["pixels"].tolist() == [False, True, True, False, True]
    assert masks["scale"].tolist() == [False, False, True, False, False]


def test_masks_read_arrays_of_arrays_from_parquet(tmp_path: Path) -> None:
    images = [[[1.0, 1.0], [1.0, 1.0]], [[1.0, np.nan], [0.0, 0.0]]]  # parquet gives arrays of arrays back
    pd.DataFrame({"img": images}).to_parquet(tmp_path / "t.parquet")
    table = pd.read_parquet(tmp_path / "t.parquet")
    assert nonfinite_masks(table, {"img": "x"})["img"].tolist() == [False, True]


def test_masks_find_nan_three_levels_deep_in_parquet_cells(tmp_path: Path) -> None:
    """An image of rows of pixels of channels: the NaN sits in the innermost arrays of parquet's object arrays."""
    clean = np.zeros((2, 2, 3)).tolist()
    dirty = np.zeros((2, 2, 3))
    dirty[1, 0, 2] = np.nan
    pd.DataFrame({"img": [clean, dirty.tolist(), clean]}).to_parquet(tmp_path / "t.parquet")
    table = pd.read_parquet(tmp_path / "t.parquet")
    assert nonfinite_masks(table, {"img": "x"})["img"].tolist() == [False, True, False]


def test_drop_counts_each_column_over_the_given_rows_only() -> None:
    masks = nonfinite_masks(_table(), INPUTS)
    kept, counts = drop_nonfinite(np.array([0, 1, 2, 3]), masks)
    assert kept.tolist() == [0, 3]
    assert counts == {"pixels": 2, "scale": 1}  # row 2 holds both; row 4 is not among the rows
    kept, counts = drop_nonfinite(np.array([3]), masks)
    assert kept.tolist() == [3] and counts == {}


def test_error_names_columns_counts_and_slices() -> None:
    table = _table()
    masks = nonfinite_masks(table, INPUTS)
    slices = {"region=n": (table["region"] == "n").to_numpy(), "region=s": (table["region"] == "s").to_numpy()}
    with pytest.raises(RecipeError) as caught:
        check_finite(table, np.array([0, 1, 2, 3, 4]), masks, slices, what="evaluation", recipe_file=RECIPE)
    assert str(caught.value) == (
        "recipe.yaml: data.inputs.pixels: evaluation rows of "
        "rows.parquet hold NaN, inf or an empty cell in input columns (column 'pixels': 3 rows, at rows 1, 2, 4 "
        "(slices: region=n 2, region=s 1); column 'scale': 1 row, at row 2 (slices: region=n 1)); "
        "expected a finite number or a text in every cell, or set data.nonfinite_inputs: drop to leave those rows out "
        "(keep: to feed them, for a model that reads NaN as missing)"
    )
    check_finite(table, np.array([0, 3]), masks, slices, what="evaluation", recipe_file=RECIPE)  # finite rows pass


def test_error_names_the_rows_a_spreadsheets_trailing_separator_rows_are(tmp_path: Path) -> None:
    """A spreadsheet export ending in rows of separators alone (`;;`) has empty records among 500 good ones: the
    error said '2 rows' and left them to be searched for."""
    lines = ["x;y;g"] + [f"{i / 10};{i % 3};{'ab'[i % 2]}" for i in range(500)] + [";;", ";;"]
    path = tmp_path / "rows.csv"
    path.write_text("\r\n".join(lines) + "\r\n")
    table = load_table(path, recipe_file=RECIPE, csv_dialect=CsvDialect(delimiter=";"))
    masks = nonfinite_masks(table, {"x": "x"})
    with pytest.raises(RecipeError) as caught:
        check_finite(table, np.arange(len(table)), masks, {}, what="evaluation", recipe_file=RECIPE)
    assert "(column 'x': 2 rows, at rows 500, 501); expected a finite number" in str(caught.value)
    masks["x"][:10] = True  # more rows than are listed
    with pytest.raises(RecipeError) as caught:
        check_finite(table, np.arange(len(table)), masks, {}, what="evaluation", recipe_file=RECIPE)
    assert "(column 'x': 12 rows, at rows 0, 1, 2, 3, ...); expected" in str(caught.value)


def test_json_lines_nan_inside_a_list_is_nonfinite_like_parquets(tmp_path: Path) -> None:
    """Python's json writes NaN; pandas' JSON reader gives it back as None inside a list: `nonfinite_inputs: drop`
    dropped those rows from Parquet but refused the same table as JSON lines ('non-numeric values such as None')."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"x": [1.0, 2.0]}\n{"x": [NaN, 2.0]}\n{"x": [3.0, null]}\n{"x": [4.0, 5.0]}\n')
    table = load_table(path, recipe_file=Path("recipe.yaml"))
    assert nonfinite_masks(table, {"x": "x"})["x"].tolist() == [False, True, True, False]
    meta = TensorMeta("x", np.dtype("float32"), (None, 2))
    feeds = build_feeds(table, np.array([0, 3]), {"x": "x"}, {"x": meta}, recipe_file=Path("recipe.yaml"))
    np.testing.assert_array_equal(feeds["x"], [[1.0, 2.0], [4.0, 5.0]])


@pytest.mark.parametrize("dtype", ["Int64", "boolean", "int64[pyarrow]"])
def test_a_parquet_null_in_a_nullable_integer_or_boolean_column_counts_as_nan(tmp_path: Path, dtype: str) -> None:
    """Parquet reads an integer column with nulls as Int64 (a float column's NaN, as a CSV's empty cell gives): the
    null reached a float input as NaN, past `nonfinite_inputs` (neither refused nor dropped)."""
    values = [1, None, 0, 1] if dtype != "boolean" else [True, None, False, True]
    pd.DataFrame({"x": pd.array(values, dtype=dtype)}).to_parquet(tmp_path / "t.parquet")
    table = load_table(tmp_path / "t.parquet", recipe_file=RECIPE)
    masks = nonfinite_masks(table, {"x": "x"})
    assert masks["x"].tolist() == [False, True, False, False]
    assert drop_nonfinite(np.arange(4), masks) == (pytest.approx(np.array([0, 2, 3])), {"x": 1})
    numpy_ints = pd.DataFrame({"x": np.array([1, 2], dtype=np.int64)})
    assert nonfinite_masks(numpy_ints, {"x": "x"}) == {}


def test_nonfinite_cells_of_a_parquet_list_column_are_found_per_row(tmp_path) -> None:
    """A list column of numeric arrays (checked stacked, in one pass) marks the rows a NaN or inf is in, as the
    cell-by-cell reading of other columns (lists of numbers with gaps) does."""
    cells = [np.array([0.0, 1.0]), np.array([np.nan, 1.0]), np.array([2.0, np.inf]), np.array([3.0, 4.0])]
    pd.DataFrame({"x": cells, "n": [np.array([1, 2])] * 4, "l": [[1.0, None], [1.0, 2.0]] * 2}).to_parquet(
        tmp_path / "t.parquet")  # fmt: skip
    table = load_table(tmp_path / "t.parquet", recipe_file=tmp_path / "r.yaml")
    masks = nonfinite_masks(table, {"x": "x", "n": "n"})
    assert list(masks) == ["x"] and masks["x"].tolist() == [False, True, True, False]
    lists = pd.DataFrame({"l": [[1.0, None], [1.0, 2.0], [np.array([np.inf])], "text"]})
    assert nonfinite_masks(lists, {"l": "l"})["l"].tolist() == [True, False, True, False]


def test_a_list_column_longer_than_one_block_is_checked_block_by_block(monkeypatch) -> None:
    import qbench.data.nonfinite as nonfinite

    monkeypatch.setattr(nonfinite, "_BLOCK_ROWS", 2)
    cells = [np.array([1.0, 2.0])] * 5
    cells[4] = np.array([np.nan, 0.0])
    assert nonfinite_masks(pd.DataFrame({"x": cells}), {"x": "x"})["x"].tolist() == [False] * 4 + [True]
