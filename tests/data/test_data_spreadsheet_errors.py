"""Spreadsheet error cells (#N/A, #DIV/0!, ...) in the columns a recipe reads: one error naming the file, row,
column."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest

from qbench.data.evaluation import load_data_table, read_columns
from qbench.data.text_tables import spreadsheet_error
from qbench.errors import RecipeError
from qbench.recipe.data import DataSpec

RECIPE = Path("qbench.yaml")
ROWS = "x,label,topic,split,notes\n1.5,0,garden,test,ok\n2.5,1,cooking,test,#REF!\n3.5,0,garden,calib,ok\n"


def _data(**fields: object) -> DataSpec:
    return DataSpec.model_validate({"path": "rows.csv", "inputs": {"x": "x"}, "label": "label", **fields})


@pytest.mark.parametrize(("row", "column", "cell"), [
    (1, "x", "#DIV/0!"),      # a feature: the column was text, refused as 'not numbers' without the row
    (2, "label", "#N/A"),     # a label: was read as a missing number, or a class named '#N/A'
    (0, "topic", " #VALUE!"),  # a slice: was a slice named '#VALUE!'
    (2, "split", "#NAME?"),   # a filter's column: `ne: calib` kept the row
])  # fmt: skip
def test_an_error_cell_in_a_column_the_recipe_reads_is_one_line_naming_file_row_and_column(
    tmp_path: Path, row: int, column: str, cell: str
) -> None:  # fmt: skip
    table = pd.read_csv(io.StringIO(ROWS), dtype=str)
    table.loc[row, column] = cell
    table.to_csv(tmp_path / "rows.csv", index=False)
    data = _data(slices=[{"by": "topic"}], evaluation={"filter": {"split": {"ne": "calib"}}})
    with pytest.raises(RecipeError) as info:
        load_data_table(tmp_path / "rows.csv", data, label_names=False, recipe_file=RECIPE)
    assert str(info.value) == (f"qbench.yaml: data.path: rows.csv row {row}, column {column!r}, holds {cell!r}, a "
                               "spreadsheet error (a formula that failed); expected a value: fix the formula, or "
                               "leave the cell empty for a missing value")  # fmt: skip


def test_an_error_cell_in_a_column_the_recipe_does_not_read_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "rows.csv").write_text(ROWS)
    table = load_data_table(tmp_path / "rows.csv", _data(), label_names=False, recipe_file=RECIPE)
    assert table["notes"].tolist() == ["ok", "#REF!", "ok"]


def test_the_first_error_cell_in_row_order_is_named_and_other_cells_are_no_errors() -> None:
    table = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": ["x", "#DIV/0", "#NUM!"], "c": ["#N/A", None, "y"],
                          "d": [[1], "#REF!", None]})  # fmt: skip
    assert spreadsheet_error(table, ["a", "b"]) == (2, "b", "#NUM!")  # '#DIV/0' lacks its '!': text
    assert spreadsheet_error(table, ["b", "c", "d"]) == (0, "c", "#N/A")
    assert spreadsheet_error(table, ["a", "missing"]) is None


def test_read_columns_names_inputs_label_slices_strata_and_filter_columns() -> None:
    data = _data(slices=[{"by": "topic"}, {"name": "big", "filter": {"size": {"gt": 3}}}],
                 calibration={"stratify_by": "band", "filter": {"split": "calib"}},
                 evaluation={"filter": {"day": {"ge": "2024-01-01"}}})  # fmt: skip
    assert read_columns(data) == ("x", "label", "topic", "band", "day", "split", "size")


class _CountedText(str):
    """Text that counts how often it is stripped (every cell of a column shares one counter)."""

    strips = 0

    def strip(self, chars: str | None = None) -> str:
        _CountedText.strips += 1
        return str.strip(self, chars)


def test_each_distinct_cell_is_looked_at_once_and_the_first_error_in_row_order_is_named() -> None:
    """Every cell was stripped and looked up: a 300,000-row table with 5 text columns spent 7 s of a 19 s sweep here.
    A column of splits or slices holds a few values in many rows."""
    cells = [_CountedText(v) for v in ("calib", "eval", " #N/A", "#REF!")]
    column = [cells[0], cells[1]] * 5_000
    column[7_001], column[9_000], column[3] = cells[2], cells[3], None
    _CountedText.strips = 0
    assert spreadsheet_error(pd.DataFrame({"split": pd.Series(column, dtype=object)}), ["split"]) == (7_001, "split", " #N/A")
    assert _CountedText.strips == 4
