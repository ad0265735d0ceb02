"""CSV dialects (`data.csv`: delimiter, decimal mark; `.tsv` files): read as declared, never guessed, and a CSV
whose numbers are written with decimal commas but not declared so is one clear line wherever a number is expected."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from qbench.data.filters import filter_mask
from qbench.data.load import load_table
from qbench.data.text_tables import CsvDialect, number_format_hint
from qbench.errors import RecipeError
from qbench.recipe.spec import load_recipe

RECIPE = Path("recipe.yaml")
SEMICOLON = CsvDialect(delimiter=";", decimal=",")


def test_a_semicolon_file_with_decimal_commas_reads_as_declared(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("x;vec;w;code;label\n0,5;[0.25, 1.5];NA;1,5;a\n-12,25;[1, 2];3;007;b\n7;[0.5, 0.5];1,75;;c\n")
    table = load_table(path, recipe_file=RECIPE, text_columns=["code", "label"], csv_dialect=SEMICOLON)
    assert table["x"].tolist() == [0.5, -12.25, 7.0]
    assert table["vec"].tolist() == [[0.25, 1.5], [1, 2], [0.5, 0.5]]  # JSON lists write points whatever the file
    assert table["w"].isna().tolist() == [True, False, False] and table["w"].tolist()[1:] == [3.0, 1.75]
    # a text column's number names what the same table in Parquet names (slice code=1.5); '007' stays a code
    assert table["code"].tolist()[:2] == ["1.5", "007"] and pd.isna(table["code"][2])
    assert table["label"].tolist() == ["a", "b", "c"]


def test_columns_fed_to_the_model_keep_their_text_as_written(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("size;y\n1,5;0\n2;1\n")
    table = load_table(path, recipe_file=RECIPE, text_columns=["size"], verbatim_columns=["size"],
                       csv_dialect=SEMICOLON)  # fmt: skip
    assert table["size"].tolist() == ["1,5", "2"]


def test_a_decimal_mark_is_never_guessed(tmp_path: Path) -> None:
    """'1,234' is 1234 in en-US and 1.234 in de-DE; '1.234' is 1.234 or (a thousands point) 1234: the file's declared
    decimal mark alone makes either a number."""
    path = tmp_path / "rows.csv"
    path.write_text('a,b\n"1,234",1\n"0,5",2\n')
    assert load_table(path, recipe_file=RECIPE)["a"].tolist() == ["1,234", "0,5"]
    path.write_text("a;b;c\n1.234;1;1.234\n2;2;NA\n")
    table = load_table(path, recipe_file=RECIPE, csv_dialect=SEMICOLON)
    assert table["a"].tolist() == ["1.234", "2"] and table["c"].tolist() == ["1.234", "NA"]


def test_a_comma_file_with_quoted_decimal_comma_cells_reads_when_declared(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text('a,b,vec\n"0,5",1,"[0.5, 1]"\n"-1,25",2,"[2, 3]"\n')
    table = load_table(path, recipe_file=RECIPE, csv_dialect=CsvDialect(delimiter=",", decimal=","))
    assert table["a"].tolist() == [0.5, -1.25] and table["vec"].tolist() == [[0.5, 1], [2, 3]]


@pytest.mark.parametrize("name", ["rows.tsv", "rows.tsv.gz"])
def test_a_tsv_file_is_tab_separated_unless_declared_otherwise(tmp_path: Path, name: str) -> None:
    text = "x\tvec\tcode\n0.5\t[1, 2]\t007\n1.5\t[3, 4]\t7\n"
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    table = load_table(path, recipe_file=RECIPE, text_columns=["code"])
    assert table["x"].tolist() == [0.5, 1.5] and table["vec"].tolist() == [[1, 2], [3, 4]]
    assert table["code"].tolist() == ["007", "7"]


@pytest.mark.parametrize(
    ("name", "text", "dialect", "problem"),
    [
        ("rows.csv", "x;y\n1,5;0\n", CsvDialect(),
         "the header is one column 'x;y': the file looks separated by ';'; expected comma-separated values (a file "
         "separated otherwise is declared so: data.csv: {delimiter: ';'})"),
        ("rows.tsv", "x,y\n1,0\n", CsvDialect(),
         "the header is one column 'x,y': the file looks separated by ','; expected tab-separated values (a file "
         "separated otherwise is declared so: data.csv: {delimiter: ','})"),
        ("rows.csv", "x;y;z\n1,5;0;1\n2;1\n", SEMICOLON,
         "line 3 has 2 fields, expected 3 like the header (x, y, z)"),
        ("rows.csv", "vec;y\n[0.5, 1.5];0\n[0,5, 1,5];1\n", SEMICOLON,
         "column 'vec': cell '[0,5, 1,5]' writes ',' between two digits in a file with decimal commas "
         "(data.csv.decimal), which a JSON list cannot tell from a decimal comma; expected a JSON list, its numbers "
         "written with points and ', ' between them"),
        ("rows.csv", "code;y\n1,5;0\n1.5;1\n", SEMICOLON,
         "column 'code' holds both '1,5' and '1.5'; expected numbers written with one decimal mark, the comma the file "
         "declares (data.csv.decimal)"),
    ],
    ids=["undeclared-semicolon", "tsv-with-commas", "ragged-semicolon-row", "list-with-decimal-commas", "two-marks"],
)
def test_a_file_not_as_declared_is_one_line(tmp_path: Path, name: str, text: str, dialect: CsvDialect,
                                            problem: str) -> None:  # fmt: skip
    (tmp_path / name).write_text(text)
    with pytest.raises(RecipeError) as caught:
        load_table(tmp_path / name, recipe_file=RECIPE, text_columns=["code"], csv_dialect=dialect)
    assert str(caught.value) == f"recipe.yaml: data.path: cannot read {name}: {problem}"


def test_filters_on_a_decimal_comma_file_compare_numbers(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("w;code\n0,5;0,5\n1,5;1,5\n2;2\n")
    table = load_table(path, recipe_file=RECIPE, text_columns=["code"], csv_dialect=SEMICOLON)
    for column in ("w", "code"):
        assert filter_mask(table, {column: {"lt": 1.5}}, field="f", recipe_file=RECIPE).tolist() == [True, False, False]
        assert filter_mask(table, {column: {"ne": 0.5}}, field="f", recipe_file=RECIPE).tolist() == [False, True, True]


@pytest.mark.parametrize("condition", [{"ne": 0.5}, {"in": [0.5, 2]}, {"lt": 1}])
def test_a_number_against_undeclared_decimal_comma_cells_is_one_line(tmp_path: Path, condition: dict) -> None:
    """`ne: 0.5` kept every '0,5' row (text equals no number), `in: [0.5, 2]` only the '2' rows."""
    path = tmp_path / "rows.csv"
    path.write_text('w,y\n"0,5",0\n2,1\n"1,5",0\n')
    table = load_table(path, recipe_file=RECIPE, text_columns=["w"])
    with pytest.raises(RecipeError) as caught:
        filter_mask(table, {"w": condition}, field="data.evaluation.filter", recipe_file=RECIPE)
    message = str(caught.value)
    assert message.startswith("recipe.yaml: data.evaluation.filter.w: ")
    assert "cells such as '0,5' write numbers with a decimal comma, read as numbers only where declared: " \
           "data.csv: {decimal: ','}" in message  # fmt: skip


def _regression_project(root: Path, tables: dict[str, str], csv: dict | None, **data: object) -> Path:
    """y = 2 v on a [N] float input; `tables`: file name -> text; a recipe over the first one."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Unsqueeze", ["v", "axes"], ["v2"]), helper.make_node("MatMul", ["v2", "w"], ["y"])], "reg",
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])],
        [numpy_helper.from_array(np.array([[2.0]], np.float32), "w"), numpy_helper.from_array(np.array([1]), "axes")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(root / "m.onnx"))
    for name, text in tables.items():
        (root / name).write_text(text)
    spec = {"path": next(iter(tables)), "inputs": {"v": "v"}, "label": "y", **data}
    if csv is not None:
        spec["csv"] = csv
    recipe = {"name": "reg", "task": "regression", "model": {"path": "m.onnx"}, "data": spec,
              "variants": [{"name": "fp16", "precision": "fp16"}], "output_dir": "reports"}  # fmt: skip
    (root / "r.yaml").write_text(yaml.safe_dump(recipe))
    return root / "r.yaml"


ROWS = [(0.5, 1.0, "nord", 0.25), (1.25, 2.5, "süd", 1.5), (2.0, 4.0, "nord", 0.75), (0.75, 1.5, "süd", 2.0)]


def _written(delimiter: str, decimal: str) -> str:
    lines = [delimiter.join(["v", "y", "region", "dose"])]
    for row in ROWS:
        lines.append(delimiter.join(str(cell).replace(".", decimal) for cell in row))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("name", "text", "csv"), [
    ("rows.csv", _written(";", ","), {"delimiter": ";", "decimal": ","}),
    ("rows.tsv", _written("\t", "."), None),
    ("rows.tsv", _written("\t", ","), {"decimal": ","}),
], ids=["semicolon-decimal-comma", "tsv", "tsv-decimal-comma"])  # fmt: skip
def test_the_same_table_in_each_dialect_prepares_as_parquet_does(tmp_path: Path, name: str, text: str,
                                                                 csv: dict | None) -> None:  # fmt: skip
    from qbench.preflight.prepare import prepare

    data = {"evaluation": {"filter": {"dose": {"lt": 1.9}}}, "slices": [{"by": "region"}, {"by": "dose"}]}
    (tmp_path / "pq").mkdir()
    (tmp_path / "csv").mkdir()
    parquet = _regression_project(tmp_path / "pq", {"rows.parquet": ""}, None, **data)
    pd.DataFrame(ROWS, columns=["v", "y", "region", "dose"]).to_parquet(tmp_path / "pq" / "rows.parquet")
    expected = prepare(load_recipe(parquet), track=False, destinations=False)
    got = prepare(load_recipe(_regression_project(tmp_path / "csv", {name: text}, csv, **data)), track=False,
                  destinations=False)  # fmt: skip
    assert got.evaluation_rows.tolist() == expected.evaluation_rows.tolist() == [0, 1, 2]
    np.testing.assert_array_equal(got.evaluation_feeds["v"], expected.evaluation_feeds["v"])
    np.testing.assert_array_equal(got.labels, expected.labels)
    assert {k: v.tolist() for k, v in got.slices.items()} == {k: v.tolist() for k, v in expected.slices.items()}
    assert "dose=0.25" in got.slices


@pytest.mark.parametrize(("column", "field"), [("v", "data.inputs"), ("y", "data.label")])
def test_a_number_column_of_undeclared_decimal_commas_is_one_line(tmp_path: Path, column: str, field: str) -> None:
    from qbench.preflight.prepare import prepare

    index = ("v", "y").index(column)  # that column's cells written '"0,5"', as a spreadsheet quotes them
    lines = ["v,y"] + [",".join(f'"{str(c).replace(".", ",")}"' if i == index else str(c)
                                for i, c in enumerate(row[:2]))
                       for row in ROWS]  # fmt: skip
    recipe = _regression_project(tmp_path, {"rows.csv": "\n".join(lines) + "\n"}, None)
    with pytest.raises(RecipeError) as caught:
        prepare(load_recipe(recipe), track=False, destinations=False)
    message = str(caught.value)
    assert message.startswith(f"{recipe}: {field}: ") and "\n" not in message
    first = str(ROWS[0][index]).replace(".", ",")
    assert message.endswith(f"; cells such as {first!r} write numbers with a decimal comma, read as numbers only "
                            "where declared: data.csv: {decimal: ','}")  # fmt: skip


def test_data_csv_is_typed(tmp_path: Path) -> None:
    recipe = _regression_project(tmp_path, {"rows.csv": "v,y\n1,2\n"}, {"delimiter": ":", "decimal": ","})
    with pytest.raises(RecipeError, match=r"data\.csv\.delimiter"):
        load_recipe(recipe)


# -- thousands separators (`data.csv.thousands`): declared, never guessed ---------------------------------------------

GROUPED = [1234.5, -2000.0, 7.25, 12345678.25]


@pytest.mark.parametrize(("header", "cells", "dialect"), [
    ("x,code", ['"1,234.5"', '"-2,000"', "7.25", '"12,345,678.25"'], CsvDialect(thousands=",")),
    ("x;code", ["1.234,5", "-2.000", "7,25", "12.345.678,25"], CsvDialect(";", ",", ".")),
    ("x;code", ["1 234,5", "-2 000", "7,25", "12 345 678,25"], CsvDialect(";", ",", " ")),
    ("x;code", ["1\u00a0234,5", "-2\u00a0000", "7,25", "12\u00a0345\u00a0678,25"], CsvDialect(";", ",", "\u00a0")),
    ("x;code", ["1\u202f234,5", "-2\u202f000", "7,25", "12\u202f345\u202f678,25"], CsvDialect(";", ",", "\u202f")),
    ("x,code", ["1'234.5", "-2'000", "7.25", "12'345'678.25"], CsvDialect(thousands="'")),
], ids=["comma", "point", "space", "no-break-space", "narrow-no-break-space", "apostrophe"])  # fmt: skip
def test_declared_thousands_separators_read_grouped_numbers(tmp_path: Path, header: str, cells: list[str],
                                                            dialect: CsvDialect) -> None:  # fmt: skip
    path = tmp_path / "rows.csv"
    delimiter = header[1]
    path.write_text("\n".join([header, *(f"{cell}{delimiter}c{i}" for i, cell in enumerate(cells))]) + "\n")
    table = load_table(path, recipe_file=RECIPE, csv_dialect=dialect)
    assert table["x"].tolist() == GROUPED and table["code"].tolist() == ["c0", "c1", "c2", "c3"]
    # '1.234' with '.' grouping thousands is 1234, not 1.234
    path.write_text(f"n{delimiter}code\n{cells[0].replace(dialect.decimal + '5', '')}{delimiter}a\n5{delimiter}b\n")
    assert load_table(path, recipe_file=RECIPE, csv_dialect=dialect)["n"].tolist() == [1234, 5]


@pytest.mark.parametrize("cell", ["1,5", "1,2345", "12,34,567", ",123", "0,123"])
def test_a_separator_not_grouping_three_digits_leaves_the_cell_text(tmp_path: Path, cell: str) -> None:
    """pandas' own `thousands` drops the separator wherever it stands: '1,5' read as 15, '12,34,567' as 1234567."""
    path = tmp_path / "rows.csv"
    path.write_text(f'x,y\n"{cell}",1\n"1,234",2\n')
    table = load_table(path, recipe_file=RECIPE, csv_dialect=CsvDialect(thousands=","))
    assert table["x"].tolist() == [cell, "1,234"]
    assert number_format_hint(table["x"]) == (f"; cell {cell!r} holds the thousands separator ',' (data.csv.thousands) "
                                              "without groups of three digits after it")  # fmt: skip


@pytest.mark.parametrize(("text", "dialect", "message"), [
    ("x;y\n1.234,5;1.234\n2.000,25;5.5\n", CsvDialect(";"),
     "column 'y': cell '1.234' reads as 1.234 with the decimal mark '.', but cell '1.234,5' of column 'x' groups "
     "thousands with '.'; expected the file's marks declared: data.csv: {decimal: ',', thousands: '.'}"),
    ('x;y\n"1,234.5";1,234\n2;5,5\n', SEMICOLON,
     "column 'y': cell '1,234' reads as 1.234 with the decimal mark ',', but cell '1,234.5' of column 'x' groups "
     "thousands with ','; expected the file's marks declared: data.csv: {decimal: '.', thousands: ','}"),
], ids=["point", "comma"])  # fmt: skip
def test_cells_grouped_like_the_rest_of_the_file_are_never_read_as_decimals(tmp_path: Path, text: str,
                                                                           dialect: CsvDialect, message: str) -> None:  # fmt: skip
    """'1.234' beside '1.234,5' was read as 1.234 where the file groups thousands with '.' (1234 a thousand times
    too small): a guess either way, so the file's marks must be declared."""
    path = tmp_path / "rows.csv"
    path.write_text(text)
    with pytest.raises(RecipeError) as caught:
        load_table(path, recipe_file=RECIPE, csv_dialect=dialect)
    assert str(caught.value).endswith(message) and "\n" not in str(caught.value)
    path.write_text(text.replace("1.234,5", "1,5").replace('"1,234.5"', "1.5").replace("2.000,25", "2"))
    assert load_table(path, recipe_file=RECIPE, csv_dialect=dialect)["y"].tolist() == [1.234, 5.5]  # nothing grouped


def test_grouped_cells_in_text_columns_name_what_parquet_names(tmp_path: Path) -> None:
    """A slice column's grouped number names the number (band=1234.5, as in Parquet); a column fed to the model keeps
    its text as written; a label of names keeps its text."""
    path = tmp_path / "rows.csv"
    path.write_text("band;text;label;w\n1.234,5;1.234,5;a;1.500\n7;7;b;2\n")
    table = load_table(path, recipe_file=RECIPE, text_columns=["band", "text", "label"], verbatim_columns=["text"],
                       csv_dialect=CsvDialect(";", ",", "."))  # fmt: skip
    assert table["band"].tolist() == ["1234.5", "7"] and table["text"].tolist() == ["1.234,5", "7"]
    assert table["label"].tolist() == ["a", "b"] and table["w"].tolist() == [1500, 2]
    for column in ("band", "w"):
        assert filter_mask(table, {column: {"gt": 100}}, field="f", recipe_file=RECIPE).tolist() == [True, False]


@pytest.mark.parametrize(("cells", "hint"), [
    (["1.234,5", "2"], "cells such as '1.234,5' group thousands with '.', read as numbers only where declared: "
                       "data.csv: {decimal: ',', thousands: '.'}"),
    (["1\u00a0234,5", "2"], "cells such as '1\\xa0234,5' group thousands with a no-break space (U+00A0), read as "
                            "numbers only where declared: data.csv: {decimal: ',', thousands: '\\xa0'}"),
    (["1,234", "2"], "cells such as '1,234' write numbers with a decimal comma or group thousands with ',', read as "
                     "numbers only where declared: data.csv: {decimal: "
                     "','} or data.csv: {decimal: '.', thousands: ','}"),
], ids=["point", "no-break-space", "comma"])  # fmt: skip
def test_a_number_column_of_undeclared_grouping_is_one_line(tmp_path: Path, cells: list[str], hint: str) -> None:
    from qbench.preflight.prepare import prepare

    text = "v;y\n" + "".join(f"{cell};1\n" for cell in cells)
    recipe = _regression_project(tmp_path, {"rows.csv": text}, {"delimiter": ";"})
    with pytest.raises(RecipeError) as caught:
        prepare(load_recipe(recipe), track=False, destinations=False)
    message = str(caught.value)
    assert message.startswith(f"{recipe}: data.inputs: ") and message.endswith(hint) and "\n" not in message


def test_a_table_grouping_thousands_prepares_as_parquet_does(tmp_path: Path) -> None:
    from qbench.preflight.prepare import prepare

    rows = [(1234.5, 2469.0, "nord"), (-2000.0, -4000.0, "süd"), (12345678.25, 24691356.5, "nord")]
    (tmp_path / "pq").mkdir()
    (tmp_path / "csv").mkdir()
    data = {"evaluation": {"filter": {"v": {"lt": 1e6}}}, "slices": [{"by": "region"}]}
    parquet = _regression_project(tmp_path / "pq", {"rows.parquet": ""}, None, **data)
    pd.DataFrame(rows, columns=["v", "y", "region"]).to_parquet(tmp_path / "pq" / "rows.parquet")
    text = "v;y;region\n1 234,5;2 469;nord\n-2 000;-4 000;süd\n12 345 678,25;24 691 356,5;nord\n"
    csv = {"delimiter": ";", "decimal": ",", "thousands": " "}
    expected = prepare(load_recipe(parquet), track=False, destinations=False)
    got = prepare(load_recipe(_regression_project(tmp_path / "csv", {"rows.csv": text}, csv, **data)), track=False,
                  destinations=False)  # fmt: skip
    assert got.evaluation_rows.tolist() == expected.evaluation_rows.tolist() == [0, 1]
    np.testing.assert_array_equal(got.evaluation_feeds["v"], expected.evaluation_feeds["v"])
    np.testing.assert_array_equal(got.labels, expected.labels)


@pytest.mark.parametrize(("csv", "message"), [
    ({"thousands": "."}, "data.csv.thousands: got '.', the decimal mark (data.csv.decimal, by default); expected a "
                         "separator other than the decimal mark, as a file grouping thousands with '.' declares: "
                         "data.csv: {decimal: ',', thousands: '.'}"),
    ({"decimal": ",", "thousands": ","}, "data.csv.thousands: got ',', the decimal mark (data.csv.decimal); expected "
                                         "a separator other than the decimal mark, as a file grouping thousands with "
                                         "',' declares: data.csv: {decimal: '.', thousands: ','}"),
    ({"thousands": "_"}, "data.csv.thousands: "),
], ids=["default-point", "comma", "unknown"])  # fmt: skip
def test_a_thousands_separator_that_is_the_decimal_mark_is_one_line(tmp_path: Path, csv: dict, message: str) -> None:
    recipe = _regression_project(tmp_path, {"rows.csv": "v,y\n1,2\n"}, csv)
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe)
    assert str(caught.value).startswith(f"{recipe}: {message}") and "\n" not in str(caught.value)
