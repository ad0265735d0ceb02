"""CSV files as spreadsheets and databases export them: trailing delimiters (columns with no name) and a header
repeated mid-file (exports joined into one file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qbench.data.load import load_table
from qbench.data.text_tables import CsvDialect
from qbench.errors import RecipeError

RECIPE = Path("recipe.yaml")
SEMICOLON = CsvDialect(delimiter=";", decimal=",")


def test_empty_columns_a_trailing_delimiter_adds_are_left_out(tmp_path: Path) -> None:
    """Two trailing delimiters were refused as "the header names column '' 2 times"."""
    path = tmp_path / "rows.csv"
    path.write_bytes("\ufeffid;x;y;;\r\n1;0,5;0;;\r\n2;1,5;1;;\r\n\r\n".encode())
    table = load_table(path, recipe_file=RECIPE, csv_dialect=SEMICOLON)
    assert table.columns.tolist() == ["id", "x", "y"]
    assert table["x"].tolist() == [0.5, 1.5] and table["id"].tolist() == [1, 2]


def test_an_unnamed_column_holding_values_keeps_the_name_pandas_gives_an_unnamed_index(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text(",x,y,\n0,0.5,0,\n1,1.5,1,\n")
    table = load_table(path, recipe_file=RECIPE)
    assert table.columns.tolist() == ["Unnamed: 0", "x", "y"] and table["Unnamed: 0"].tolist() == [0, 1]


@pytest.mark.parametrize("repeated", ["x,y,g", "\ufeffx,y,g"])
def test_a_header_repeated_mid_file_is_refused_naming_its_row(tmp_path: Path, repeated: str) -> None:
    """Read as data, it made every column text and its cells a slice (g=g) and a label ('y')."""
    path = tmp_path / "rows.csv"
    path.write_text(f"x,y,g\n0.5,0,a\n1.5,1,b\n{repeated}\n2.5,1,a\n", encoding="utf-8")
    with pytest.raises(RecipeError) as caught:
        load_table(path, recipe_file=RECIPE, text_columns=["g"])
    assert str(caught.value) == (
        "recipe.yaml: data.path: cannot read rows.csv: row 2 repeats the header (x, y, g), as exports joined into one "
        "file do; expected the header once, on the first line (remove the repeated header lines)"
    )


def test_a_row_equal_to_the_header_in_some_columns_only_is_data(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("kind,note\nkind,x\nnote,note\n")
    assert load_table(path, recipe_file=RECIPE)["kind"].tolist() == ["kind", "note"]
