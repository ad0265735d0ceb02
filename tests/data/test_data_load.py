"""load_table: formats, CSV JSON-list columns, and the errors for files qbench cannot use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench.data.load import load_table, table_name
from qbench.errors import MissingExtraError, RecipeError

RECIPE = Path("recipe.yaml")


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "pixels": [[0.0, 0.5, 1.0], [1.0, 0.5, 0.0], [0.25, 0.25, 0.25]],
            "region": ["north", "south", "north"],
            "label": [0, 1, 2],
        }
    )


def test_parquet_array_cells_come_back_as_arrays_with_a_clean_index(tmp_path: Path) -> None:
    path = tmp_path / "digits.parquet"
    _frame().set_axis([10, 20, 30]).to_parquet(path)
    table = load_table(path, recipe_file=RECIPE)
    assert isinstance(table.index, pd.RangeIndex) and list(table.index) == [0, 1, 2]
    np.testing.assert_allclose(np.asarray(table["pixels"][1]), [1.0, 0.5, 0.0])
    assert table["region"].tolist() == ["north", "south", "north"]
    assert table_name(table) == "digits.parquet"


def test_csv_json_list_columns_are_parsed_and_other_text_is_not(tmp_path: Path) -> None:
    path = tmp_path / "digits.csv"
    frame = _frame().assign(pixels=lambda f: f["pixels"].map(json.dumps), note=["[draft", "ok", "x]"])
    frame.to_csv(path, index=False)
    table = load_table(path, recipe_file=RECIPE)
    assert table["pixels"][0] == [0.0, 0.5, 1.0]
    assert table["note"].tolist() == ["[draft", "ok", "x]"]
    assert table["label"].dtype.kind == "i"


def test_csv_list_column_keeps_missing_cells_missing(tmp_path: Path) -> None:
    path = tmp_path / "gaps.csv"
    path.write_text('vec,label\n"[1, 2]",0\n,1\n')
    table = load_table(path, recipe_file=RECIPE)
    assert table["vec"][0] == [1, 2]
    assert pd.isna(table["vec"][1])


def test_csv_list_cell_that_is_not_json_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text('vec,label\n"[1, 2]",0\n"[1, 2,]",1\n')
    with pytest.raises(RecipeError) as info:
        load_table(path, recipe_file=RECIPE)
    message = str(info.value)
    assert message.startswith(
        "recipe.yaml: data.path: cannot read bad.csv: column 'vec': cell '[1, 2,]' in row 1 looks like a JSON list"
    )
    assert "\n" not in message


def test_a_csv_list_cell_that_is_not_json_names_its_row_among_many(tmp_path: Path) -> None:
    """One malformed cell among 1,000 was named by its text alone, which a thousand rows may share."""
    cells = ['"[1, 2]",0'] * 1000
    cells[700] = '"[1, 2,]",1'
    path = tmp_path / "bad.csv"
    path.write_text("vec,label\n" + "\n".join(cells) + "\n")
    with pytest.raises(RecipeError, match=r"column 'vec': cell '\[1, 2,\]' in row 700 looks like a JSON list"):
        load_table(path, recipe_file=RECIPE)


@pytest.mark.parametrize("suffix", [".jsonl", ".ndjson"])
def test_json_lines_keep_lists_and_leading_zero_strings(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"rows{suffix}"
    rows = [{"code": "007", "vec": [1.5, 2.5], "label": 1}, {"code": "010", "vec": [0.5, 0.0], "label": 0}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    table = load_table(path, recipe_file=RECIPE)
    assert table["code"].tolist() == ["007", "010"]
    assert list(table["vec"][0]) == [1.5, 2.5]
    assert table["label"].tolist() == [1, 0]


def test_unknown_suffix_lists_supported_formats(tmp_path: Path) -> None:
    path = tmp_path / "rows.txt"
    path.write_text("a\n1\n")
    with pytest.raises(RecipeError) as info:
        load_table(path, recipe_file=RECIPE, field="data.path")
    assert str(info.value) == (
        "recipe.yaml: data.path: unsupported data format '.txt' "
        "(rows.txt): expected .parquet, a folder of Parquet part files, .feather, .arrow (an Arrow IPC file), .csv, "
        ".tsv, .jsonl, .ndjson (these four also as .gz, .bz2 or .xz), .npz, .npy (a structured array), or a folder "
        "written by `datasets` save_to_disk"
    )


def test_an_npz_file_gives_a_column_per_array_and_a_row_per_entry_of_axis_0(tmp_path: Path) -> None:
    images = np.arange(3 * 2 * 2, dtype=np.float32).reshape(3, 2, 2)
    np.savez(tmp_path / "rows.npz", image=images, label=np.array([2, 0, 1]), region=np.array(["n", "s", "n"]))
    table = load_table(tmp_path / "rows.npz", recipe_file=RECIPE)
    assert list(table.columns) == ["image", "label", "region"] and len(table) == 3
    np.testing.assert_array_equal(table["image"][1], images[1])
    assert table["label"].tolist() == [2, 0, 1] and table["region"].tolist() == ["n", "s", "n"]
    records = np.zeros(3, dtype=[("image", "f4", (2, 2)), ("label", "i8")])
    records["image"], records["label"] = images, [2, 0, 1]
    np.save(tmp_path / "rows.npy", records)  # a structured .npy: one column per field
    table = load_table(tmp_path / "rows.npy", recipe_file=RECIPE)
    np.testing.assert_array_equal(table["image"][2], images[2])
    assert table["label"].tolist() == [2, 0, 1]


@pytest.mark.parametrize(
    ("write", "error"),
    [
        (lambda p: np.savez(p, x=np.zeros((3, 2)), y=np.zeros(2)),
         r"cannot read rows\.npz: its arrays hold different numbers of rows \(x: 3, y: 2\); expected the same length"),
        (lambda p: np.savez(p, x=np.array([[1.0], [2.0, 3.0]], dtype=object)),
         r"cannot read rows\.npz: Object arrays cannot be loaded when allow_pickle=False"),
        (lambda p: np.savez(p, x=np.float32(1)),
         r"array 'x' is a single value; expected one entry per row along axis 0"),
        (lambda p: p.write_bytes(b"PK\x03\x04 truncated"),
         r"cannot read rows\.npz: it is not a readable \.npz archive"),
    ],
)  # fmt: skip
def test_an_npz_file_that_is_no_table_is_one_line(tmp_path: Path, write, error: str) -> None:
    write(tmp_path / "rows.npz")
    with pytest.raises(RecipeError, match=r"^recipe\.yaml: data\.path: .*" + error):
        load_table(tmp_path / "rows.npz", recipe_file=RECIPE)


def test_a_plain_npy_array_names_no_column(tmp_path: Path) -> None:
    np.save(tmp_path / "rows.npy", np.zeros((4, 8), dtype=np.float32))
    with pytest.raises(RecipeError, match=r"cannot read rows\.npy: it holds one float32 array of shape \[4, 8\] that "
                                          r"names no column; expected a structured array"):
        load_table(tmp_path / "rows.npy", recipe_file=RECIPE)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"^recipe.yaml: data.path: file or folder not found: .*nope.parquet$"):
        load_table(tmp_path / "nope.parquet", recipe_file=RECIPE)


def test_corrupt_parquet_reports_the_readers_message(tmp_path: Path) -> None:
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"this is not parquet at all")
    with pytest.raises(RecipeError) as info:
        load_table(path, recipe_file=RECIPE)
    assert str(info.value).startswith("recipe.yaml: data.path: cannot read broken.parquet: ")
    assert len(str(info.value)) > len("recipe.yaml: data.path: cannot read broken.parquet: ") + 5


def test_header_only_csv_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("pixels,label\n")
    with pytest.raises(RecipeError) as info:
        load_table(path, recipe_file=RECIPE)
    assert str(info.value) == "recipe.yaml: data.path: empty.csv has no rows"


@pytest.mark.parametrize("text", ["", "\ufeff", "\n\n", "  \n"])
def test_a_csv_without_a_header_line_says_so(tmp_path: Path, text: str) -> None:
    path = tmp_path / "empty.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError) as info:
        load_table(path, recipe_file=RECIPE)
    assert str(info.value) == ("recipe.yaml: data.path: cannot read empty.csv: the file holds no header line; expected "
                               "a line naming the columns, then a line per row")  # fmt: skip


def test_blank_lines_before_a_csv_header_are_skipped_as_pandas_skips_them(tmp_path: Path) -> None:
    """The field-count check took the blank first line for a header of no columns: 'line 3 has 2 fields, expected 0'."""
    path = tmp_path / "rows.csv"
    path.write_text("\n\nx,y\n1,2\n")
    assert load_table(path, recipe_file=RECIPE).to_dict("list") == {"x": [1], "y": [2]}


def test_plain_folder_is_not_a_dataset(tmp_path: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    with pytest.raises(
        RecipeError, match=r"data.path: images is a folder without .parquet "
                           r"files or state.json \(not Parquet parts nor a `datasets` save_to_disk folder\)"
    ):
        load_table(folder, recipe_file=RECIPE)


def test_dataset_dict_folder_asks_for_one_split(tmp_path: Path) -> None:
    folder = tmp_path / "digits"
    folder.mkdir()
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(RecipeError) as info:
        load_table(folder, recipe_file=RECIPE)
    assert str(info.value) == (
        "recipe.yaml: data.path: digits is a DatasetDict folder with splits train, test: "
        "point data.path at one split folder, e.g. digits/train"
    )


def test_saved_dataset_without_the_datasets_package_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "split"
    folder.mkdir()
    (folder / "state.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(MissingExtraError) as info:
        load_table(folder, recipe_file=RECIPE)
    assert "pip install 'qbench[datasets]'" in str(info.value)


def test_saved_dataset_folder_loads(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    frame = _frame()
    dataset = datasets.Dataset.from_dict({column: frame[column].tolist() for column in frame.columns})
    dataset.save_to_disk(str(tmp_path / "train"))
    table = load_table(tmp_path / "train", recipe_file=RECIPE)
    assert table["label"].tolist() == [0, 1, 2]
    np.testing.assert_allclose(np.asarray(table["pixels"][2]), [0.25, 0.25, 0.25])
    assert table_name(table) == "train"


def test_importing_the_data_module_loads_no_heavy_sdk() -> None:
    code = "import sys, qbench.data; print(sorted(m for m in ('torch', 'onnxruntime', 'mlflow') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('a,b,c\n1,2,3\n\n"multi\nline",5,6\n7,8\n', "line 6 has 2 fields, expected 3 like the header (a, b, c)"),
        # pandas renamed the second 'y' to 'y.1' and qbench read the first, stale, one: FP32 0.33, gate pass
        ("x,y,half,y\n1,0,a,2\n2,0,b,1\n", "the header names column 'y' 2 times; expected each column once"),
        # a spreadsheet export with ';': one column, and every recipe column would be reported missing
        ("x;y;half\n1,5;0;a\n", "the header is one column 'x;y;half': the file looks separated by ';'; expected "
                                 "comma-separated values (a file separated otherwise is declared so: data.csv: "
                                 "{delimiter: ';'})"),
    ],
    ids=["ragged-row", "repeated-header-name", "semicolon-separated"],
)
def test_a_malformed_csv_is_an_error_naming_the_problem(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "rows.csv"
    path.write_text(text)
    with pytest.raises(RecipeError) as caught:
        load_table(path, recipe_file=RECIPE)
    assert str(caught.value) == f"recipe.yaml: data.path: cannot read rows.csv: {problem}"


def test_csv_with_blank_lines_and_quoted_newlines_is_not_ragged(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text('a,b,c\n1,2,3\n\n"multi\nline",5,6\n')
    table = load_table(path, recipe_file=RECIPE)
    assert table["b"].tolist() == [2, 5] and table["c"].tolist() == [3, 6]


def test_bracketed_text_that_is_no_json_stays_text(tmp_path: Path) -> None:
    """Labels such as '[en]' were refused as broken JSON lists."""
    path = tmp_path / "lang.csv"
    path.write_text("vec,lang\n\"[1, 2]\",[en]\n\"[3, 4]\",[fr]\n")
    table = load_table(path, recipe_file=RECIPE)
    assert table["lang"].tolist() == ["[en]", "[fr]"] and table["vec"].tolist() == [[1, 2], [3, 4]]


def test_json_lists_in_a_label_column_read_as_text_are_parsed_when_every_cell_is_one(tmp_path: Path) -> None:
    """Token labels in a CSV label column (read as text: it may name classes) stayed text, '[0, 1, -100]'."""
    path = tmp_path / "tokens.csv"
    path.write_text('lab,tag,names\n"[0, 1, -100]","[1, 2]",[en]\n"[2, -100, -100]","[3]",[fr]\n')
    table = load_table(path, recipe_file=RECIPE, text_columns=["lab", "tag", "names"], list_columns=["lab", "names"])
    assert table["lab"].tolist() == [[0, 1, -100], [2, -100, -100]]
    assert table["tag"].tolist() == ["[1, 2]", "[3]"]  # a slice code keeps the text the file holds
    assert table["names"].tolist() == ["[en]", "[fr]"]  # class names that are no JSON stay names


def test_a_json_line_naming_a_key_twice_is_refused(tmp_path: Path) -> None:
    """JSON parsers keep the last value of a repeated key: every row's second "label" was read, FP32 scored 0.0."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"x": [1, 2], "label": 1}\n{"x": [3, 4], "label": 0, "label": 2}\n')
    with pytest.raises(RecipeError, match=r"cannot read rows.jsonl: line 2 names column 'label' 2 times; expected"):
        load_table(path, recipe_file=tmp_path / "recipe.yaml")


@pytest.mark.parametrize(
    ("broken", "words"),
    [
        ('{"x": [7, 8], "label": 1}{"x": [9, 9], "label": 0}', "line 4 is not valid JSON (Extra data at character 26)"),
        ('{"x": [7, 8], "lab', "line 4 is not valid JSON (Unterminated string starting at character 15)"),
    ],
)
def test_a_broken_json_line_is_named_by_its_line_in_the_file(tmp_path: Path, broken: str, words: str) -> None:
    """json's own position counts lines within the one line parsed: two objects run together on line 4 of 5 were
    reported at 'line 1 column 26', a line of the file that is fine."""
    path = tmp_path / "rows.jsonl"
    good = ['{"x": [1, 2], "label": 1}', '{"x": [3, 4], "label": 0}', '{"x": [5, 6], "label": 1}']
    path.write_text("\n".join([*good, broken, good[0]]) + "\n")
    with pytest.raises(RecipeError) as info:
        load_table(path, recipe_file=tmp_path / "recipe.yaml")
    assert f"cannot read rows.jsonl: {words}" in str(info.value)


def test_a_parquet_file_naming_a_column_twice_is_refused_in_one_line(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table([[1, 2], [0, 1], [5, 6]], names=["grp", "label", "grp"]), path)
    with pytest.raises(RecipeError, match=r"cannot read rows.parquet: the schema names column 'grp' 2 times; expected"):
        load_table(path, recipe_file=tmp_path / "recipe.yaml")


@pytest.mark.parametrize("suffix", [".feather", ".arrow"])
def test_a_feather_file_naming_a_column_twice_is_refused_in_one_line(tmp_path: Path, suffix: str) -> None:
    """Arrow IPC files may repeat a name, and pandas keeps both columns: the sweep then stopped on
    "AttributeError: 'DataFrame' object has no attribute 'str'" (exit 2 with no line naming the file)."""
    import pyarrow as pa
    import pyarrow.feather as feather

    path = tmp_path / f"rows{suffix}"
    feather.write_feather(pa.table([[1.0, 2.0], [0, 1], [5.0, 6.0]], names=["x", "label", "x"]), path)
    with pytest.raises(RecipeError) as info:
        load_table(path, recipe_file=tmp_path / "recipe.yaml")
    assert str(info.value).endswith(f"recipe.yaml: data.path: cannot read rows{suffix}: the table names column 'x' 2 "
                                    "times; expected each column once")


def test_csv_text_cells_such_as_na_or_none_are_values_and_missing_numbers_are_nan(tmp_path: Path) -> None:
    """pandas' defaults read the country code "NA" (Namibia) and the categories "None" and "null" as missing: three
    slices merged into one '<missing>'. Only an empty cell is missing in a text column; in a column of numbers, R's
    "NA" and numpy's "nan" still are."""
    path = tmp_path / "rows.csv"
    path.write_text("country,x,y\nNA,1.5,NA\nNone,nan,2\nnull,inf,\nDE,,4\n,2,5\n")
    df = load_table(path, recipe_file=tmp_path / "recipe.yaml")
    assert df["country"].tolist()[:4] == ["NA", "None", "null", "DE"] and pd.isna(df["country"][4])
    assert df["x"].dtype == np.float64 and np.isnan(df["x"][1]) and np.isinf(df["x"][2]) and np.isnan(df["x"][3])
    assert df["y"].dtype == np.float64 and np.isnan(df["y"][0]) and np.isnan(df["y"][2]) and df["y"][4] == 5.0


def test_csv_text_columns_keep_the_text_their_file_holds(tmp_path: Path) -> None:
    """pandas read the codes "007" and "7" both as 7 (one slice, named 7) and the labels "01" and "1" as 1. Columns
    named as text keep their cells' text (an empty cell missing); the others are still numbers where every cell is."""
    path = tmp_path / "rows.csv"
    path.write_text("code,label,length,score\n007,01,12,0.5\n7,1,80,1.5\n010,2,,NA\n,1,3,2\n")
    df = load_table(path, recipe_file=RECIPE, text_columns=["code", "label", "not-a-column"])
    assert df["code"].tolist()[:3] == ["007", "7", "010"] and pd.isna(df["code"][3])
    assert df["label"].tolist() == ["01", "1", "2", "1"]
    assert df["length"].dtype == np.float64 and df["length"].tolist()[:2] == [12.0, 80.0] and np.isnan(df["length"][2])
    assert df["score"].dtype == np.float64 and np.isnan(df["score"][2])
    assert load_table(path, recipe_file=RECIPE)["code"].tolist()[:3] == [7, 7, 10]  # not named: numbers, as before


def test_typed_formats_keep_their_types_whatever_the_text_columns(tmp_path: Path) -> None:
    rows = [{"code": "007", "number": 7, "label": 1}, {"code": "7", "number": 10, "label": 0}]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pd.DataFrame(rows).to_parquet(tmp_path / "rows.parquet")
    for name in ("rows.jsonl", "rows.parquet"):
        df = load_table(tmp_path / name, recipe_file=RECIPE, text_columns=["code", "number", "label"])
        assert df["code"].tolist() == ["007", "7"] and df["number"].tolist() == [7, 10]
        assert df["label"].tolist() == [1, 0]


# -- the fast paths over a whole column give what the per-cell paths give ----------------------------------------

LIST_CELLS = {
    "flat-floats": ["[0.1, 2.5e-3, -1.0]", "[1e300, 0.0, 3.25]"],
    "ints-and-empty-cells": ["[1, 2]", None, "[3, 4]", None],
    "nested": ["[[1, 2], [3]]", "[[], [4, [5]]]"],
    "ragged": ["[1]", "[]", "[1, 2, 3, 4]"],
    "non-numeric": ["[true, null, {}]", "[false, NaN, -Infinity]"],
    "strings-with-commas-and-brackets": ['["a,b", "]"]', '["[", "c"]'],
    "unicode-strings": ['["é", "日本"]', '["ü"]'],
    "one-cell-two-lists": ["[1],[2]", "[3]"],  # invalid alone: the joined array must not hide it
    "two-cells-one-list": ["[[1]", "[2]]", "[5],[6]", "[7]"],  # four elements joined, but one cell is JSON alone
    "some-cells-no-json": ["[1, 2]", "[1, 2,]"],
    "no-cell-json": ["[en]", "[fr]"],
}


def _per_cell_json(column: pd.Series) -> pd.Series:
    """What parsing each list cell alone gives (the reference), or the text when no cell parses."""
    parsed = []
    for cell in column:
        try:
            parsed.append(json.loads(cell) if isinstance(cell, str) else cell)
        except ValueError:
            return column
    return pd.Series(parsed, dtype=object, name=column.name)


def _csv_text(cells: list[str | None]) -> str:
    quoted = ['"' + cell.replace('"', '""') + '"' if cell is not None else "" for cell in cells]
    return "vec,label\n" + "".join(f"{cell},{row}\n" for row, cell in enumerate(quoted))


@pytest.mark.parametrize("block", [1, 2, 20_000])
@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16"])
@pytest.mark.parametrize("name", list(LIST_CELLS))
def test_a_csv_list_column_reads_as_parsing_each_cell_alone_would(
    tmp_path: Path, monkeypatch, name: str, encoding: str, block: int
) -> None:  # fmt: skip
    """One json.loads over the joined cells (qbench.data.text_tables._parse_lists_at_once) against per-cell json.loads:
    the same lists, the same missing cells, the same text where no cell is JSON, the same error where some are,
    however the cells fall into blocks."""
    import qbench.data.text_tables as load

    monkeypatch.setattr(load, "LIST_BLOCK", block)
    cells = LIST_CELLS[name]
    path = tmp_path / "lists.csv"
    path.write_text(_csv_text(cells), encoding=encoding)
    expected_error = name in ("one-cell-two-lists", "two-cells-one-list", "some-cells-no-json")
    if expected_error:
        with pytest.raises(RecipeError, match="looks like a JSON list but is not valid JSON"):
            load_table(path, recipe_file=RECIPE)
        return
    table = load_table(path, recipe_file=RECIPE)
    expected = _per_cell_json(pd.Series(cells, dtype=object, name="vec"))
    assert len(table) == len(cells)
    for got, want in zip(table["vec"], expected, strict=True):
        if isinstance(want, (list, str)):
            assert type(got) is type(want) and json.dumps(got) == json.dumps(want)  # 1 stays int, 1.0 float
        else:
            assert pd.isna(got) and pd.isna(want)
    assert table["label"].tolist() == list(range(len(cells)))


def test_a_csv_list_column_is_parsed_by_one_json_loads_not_one_per_cell(tmp_path: Path, monkeypatch) -> None:
    """500k list cells took 2.5 s in a json.loads per cell."""
    path = tmp_path / "lists.csv"
    path.write_text(_csv_text([f"[{row}, {row / 3}]" for row in range(200)] + [None]))
    calls = []
    real = json.loads
    monkeypatch.setattr(json, "loads", lambda text, **kw: calls.append(1) or real(text, **kw))
    table = load_table(path, recipe_file=RECIPE)
    assert len(calls) == 1
    assert table["vec"][199] == [199, 199 / 3] and pd.isna(table["vec"][200])


def test_csv_field_counts_are_checked_without_a_python_loop_over_well_formed_records(
    tmp_path: Path, monkeypatch
) -> None:  # fmt: skip
    """Every record was checked in Python (0.9 s on 500k rows): now the per-record loop runs only for a file with a
    record whose field count differs from the header's (to tell a blank line from a ragged row, and name its line)."""
    import qbench.data.csv_records as load

    path = tmp_path / "rows.csv"
    path.write_text('a,b,c\n1,"x, y",3\n"multi\nline",5,6\n')
    monkeypatch.setattr(load, "_check_field_counts", lambda *args, **kwargs: pytest.fail("per-record loop ran"))
    table = load_table(path, recipe_file=RECIPE)
    assert table["b"].tolist() == ["x, y", "5"] and table["c"].tolist() == [3, 6]


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_compressed_csv_and_json_lines_read_as_the_plain_file(tmp_path: Path, suffix: str) -> None:
    """Before, `rows.csv.gz` was refused as the unsupported format '.gz'."""
    import bz2
    import gzip
    import lzma

    compress = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}[suffix]
    frame = _frame().assign(pixels=lambda f: f["pixels"].map(json.dumps), code=["007", "7", "NA"])
    frame.to_csv(tmp_path / "rows.csv", index=False, encoding="utf-8-sig", lineterminator="\r\n")
    (tmp_path / f"rows.csv{suffix}").write_bytes(compress((tmp_path / "rows.csv").read_bytes()))
    plain = load_table(tmp_path / "rows.csv", recipe_file=RECIPE, text_columns=["code"])
    packed = load_table(tmp_path / f"rows.csv{suffix}", recipe_file=RECIPE, text_columns=["code"])
    pd.testing.assert_frame_equal(packed, plain)
    assert packed["code"].tolist() == ["007", "7", "NA"] and packed["pixels"][1] == [1.0, 0.5, 0.0]
    lines = "".join(json.dumps(row) + "\n" for row in _frame().assign(pixels=_frame()["pixels"]).to_dict("records"))
    (tmp_path / "rows.jsonl").write_text(lines)
    (tmp_path / f"rows.jsonl{suffix}").write_bytes(compress(lines.encode()))
    pd.testing.assert_frame_equal(load_table(tmp_path / f"rows.jsonl{suffix}", recipe_file=RECIPE),
                                  load_table(tmp_path / "rows.jsonl", recipe_file=RECIPE))  # fmt: skip


def test_a_truncated_or_unsupported_compressed_file_is_one_line(tmp_path: Path) -> None:
    import gzip

    packed = gzip.compress(b"x,y\n" + b"1,2\n" * 5000)
    (tmp_path / "rows.csv.gz").write_bytes(packed[: len(packed) // 2])
    with pytest.raises(RecipeError, match=r"data.path: cannot read rows.csv.gz: it is not a complete .gz file"):
        load_table(tmp_path / "rows.csv.gz", recipe_file=RECIPE)
    (tmp_path / "rows.parquet.gz").write_bytes(gzip.compress(b"x"))
    with pytest.raises(RecipeError, match=r"data.path: unsupported data format '.parquet.gz' \(rows.parquet.gz\)"):
        load_table(tmp_path / "rows.parquet.gz", recipe_file=RECIPE)


def test_arrow_decimal_columns_are_numbers_by_their_scale(tmp_path: Path) -> None:
    """Before, pandas' Decimal objects reached the label check ('Decimal('0') are not integer class ids')."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({
        "label": pa.array([0, 2, 1], pa.decimal128(5, 0)),
        "price": pa.array([1, 2, 3], pa.decimal128(6, 2)),
        "gappy": pa.array([1, None, 3], pa.decimal128(5, 0)),
    }), tmp_path / "rows.parquet")  # fmt: skip
    table = load_table(tmp_path / "rows.parquet", recipe_file=RECIPE)
    assert table["label"].dtype == np.int64 and table["label"].tolist() == [0, 2, 1]
    assert table["price"].dtype == np.float64 and table["price"].tolist() == [1.0, 2.0, 3.0]
    assert table["gappy"].dtype == np.float64 and table["gappy"].tolist()[::2] == [1.0, 3.0]


def test_feather_and_arrow_ipc_files_read_as_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.feather as feather

    _frame().to_parquet(tmp_path / "rows.parquet")
    arrow = pa.Table.from_pandas(_frame(), preserve_index=False)
    feather.write_feather(arrow, tmp_path / "rows.feather")
    with pa.OSFile(str(tmp_path / "rows.arrow"), "wb") as sink, pa.ipc.new_file(sink, arrow.schema) as writer:
        writer.write_table(arrow)
    expected = load_table(tmp_path / "rows.parquet", recipe_file=RECIPE)
    for name in ("rows.feather", "rows.arrow"):
        table = load_table(tmp_path / name, recipe_file=RECIPE)
        assert table["pixels"].map(list).tolist() == expected["pixels"].map(list).tolist()
        pd.testing.assert_frame_equal(table.drop(columns="pixels"), expected.drop(columns="pixels"))
    with pa.OSFile(str(tmp_path / "stream.arrow"), "wb") as sink, pa.ipc.new_stream(sink, arrow.schema) as writer:
        writer.write_table(arrow)
    with pytest.raises(RecipeError, match=r"cannot read stream.arrow: .*expected a Feather file or an Arrow IPC file"):
        load_table(tmp_path / "stream.arrow", recipe_file=RECIPE)
