"""Text cells mean the same thing whatever file holds them: a Parquet or JSON lines string column of JSON lists,
numbers or booleans that the recipe reads as values is read as the same cells in a CSV file are
(qbench.data.text_tables.parse_text_cells), and a malformed one is refused with the same line in every format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench.data.evaluation import load_data_table
from qbench.data.labels import label_cells
from qbench.errors import RecipeError
from qbench.recipe.data import DataSpec
from qbench.tasks.multilabel import MULTILABEL
from qbench.tasks.regression import REGRESSION

RECIPE = Path("recipe.yaml")
FORMATS = ("csv", "parquet", "jsonl")


def _write(frame: pd.DataFrame, root: Path, fmt: str) -> Path:
    """`frame` (text cells only) as a `fmt` file: the same text in each."""
    path = root / f"rows.{fmt}"
    if fmt == "csv":
        frame.to_csv(path, index=False)
    elif fmt == "parquet":
        frame.to_parquet(path)
    else:
        frame.to_json(path, orient="records", lines=True)
    return path


def _load(path: Path, **data: object) -> pd.DataFrame:
    spec = DataSpec.model_validate({"path": path.name, **data})
    return load_data_table(path, spec, label_names=False, recipe_file=RECIPE)


@pytest.mark.parametrize("fmt", FORMATS)
def test_multilabel_labels_written_as_json_list_text_are_lists_in_every_format(tmp_path: Path, fmt: str) -> None:
    rows = [[0, 1, 1], [1, 0, 0], [0, 0, 1]]
    text = pd.DataFrame({"x": [f"[{0.5 * i}, {i}.25]" for i in range(3)], "y": [str(row) for row in rows]})
    table = _load(_write(text, tmp_path, fmt), inputs={"x": "x"}, label="y")
    data = DataSpec.model_validate({"path": "rows", "inputs": {"x": "x"}, "label": "y"})
    positions = np.arange(3)
    labels = MULTILABEL.labels_from_values(label_cells(table, data, positions, recipe_file=RECIPE), positions)
    assert labels.tolist() == rows
    assert [list(cell) for cell in table["x"]] == [[0.0, 0.25], [0.5, 1.25], [1.0, 2.25]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_regression_targets_written_as_text_are_numbers_in_every_format(tmp_path: Path, fmt: str) -> None:
    targets = ["-1.552002", "2.5", "1e-3"]
    table = _load(_write(pd.DataFrame({"x": ["1", "2", "3"], "t": targets}), tmp_path, fmt), inputs={"x": "x"},
                  label="t")  # fmt: skip
    data = DataSpec.model_validate({"path": "rows", "inputs": {"x": "x"}, "label": "t"})
    positions = np.arange(3)
    labels = REGRESSION.labels_from_values(label_cells(table, data, positions, recipe_file=RECIPE), positions)
    assert labels.tolist() == [float(t) for t in targets]
    assert table["x"].tolist() == [1, 2, 3]


@pytest.mark.parametrize("fmt", FORMATS)
def test_boolean_text_reads_as_a_csv_file_reads_it(tmp_path: Path, fmt: str) -> None:
    text = pd.DataFrame({"flag": ["true", "False", "TRUE"], "gap": ["true", None, "false"], "y": ["0", "1", "0"]})
    table = _load(_write(text, tmp_path, fmt), inputs={"flag": "flag", "gap": "gap"}, label="y")
    assert table["flag"].dtype == bool and table["flag"].tolist() == [True, False, True]
    assert table["gap"].dtype == np.float64 and table["gap"].tolist()[::2] == [1.0, 0.0] and np.isnan(table["gap"][1])


@pytest.mark.parametrize("fmt", FORMATS)
def test_columns_the_recipe_does_not_read_as_values_keep_their_text(tmp_path: Path, fmt: str) -> None:
    text = pd.DataFrame({"x": ["1", "2"], "kind": ["007", "7"], "y": ["0", "1"]})
    table = _load(_write(text, tmp_path, fmt), inputs={"x": "x"}, label="y", slices=[{"by": "kind"}])
    assert table["kind"].tolist() == ["007", "7"] and table["y"].tolist() == [0, 1]


def test_a_malformed_json_list_is_refused_with_the_same_line_in_every_format(tmp_path: Path) -> None:
    text = pd.DataFrame({"x": ["[0.5, 1.0]", "[0.5, 1.0,]"], "y": ["0", "1"]})
    messages = set()
    for fmt in FORMATS:
        with pytest.raises(RecipeError) as caught:
            _load(_write(text, tmp_path, fmt), inputs={"x": "x"}, label="y")
        assert caught.value.field == "data.path" and "column 'x'" in str(caught.value)
        messages.add(str(caught.value).replace(f"rows.{fmt}", "rows"))
    assert len(messages) == 1
