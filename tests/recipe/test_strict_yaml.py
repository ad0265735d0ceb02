"""The recipe's YAML as qbench reads it: a row filter's values as YAML 1.2 reads them, so each selects the rows its
text names (PyYAML's YAML 1.1 turned NO into false, 010 into 8 and 12:30 into 750, and left 1e3 text)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench.data.filters import filter_mask
from qbench.errors import RecipeError
from qbench.recipe.spec import load_recipe
from qbench.recipe.strict_yaml import read_recipe_yaml

TABLE = pd.DataFrame({
    "country": ["NO", "SE", "DK", "NO", None],
    "code": ["007", "7", "010", "8", "12:30"],
    "amount": [7.0, 10.0, 8.0, 1000.0, 750.0],
    "answer": ["yes", "no", "on", "off", "yes"],
    "flag": [True, False, True, False, True],
})  # fmt: skip


def _recipe(tmp_path: Path, evaluation_filter: str, slice_filter: str = "{answer: 'yes'}") -> Path:
    (tmp_path / "model.onnx").write_bytes(b"model")
    (tmp_path / "rows.parquet").write_bytes(b"rows")
    path = tmp_path / "recipe.yaml"
    path.write_text(f"""\
name: toy
model: {{path: model.onnx}}
data:
  path: rows.parquet
  inputs: {{x: input}}
  evaluation: {{filter: {evaluation_filter}}}
  slices: [{{name: s, filter: {slice_filter}}}]
""")
    return path


def _rows(tmp_path: Path, evaluation_filter: str, slice_filter: str = "{answer: 'yes'}") -> tuple[list[int], list[int]]:
    data = load_recipe(_recipe(tmp_path, evaluation_filter, slice_filter)).data
    def rows(flt: dict) -> list[int]:
        return np.flatnonzero(filter_mask(TABLE, flt, field="f", recipe_file=Path("r.yaml"))).tolist()
    return rows(data.evaluation.filter), rows(data.slices[0].filter)


@pytest.mark.parametrize(("written", "expected"), [
    ("{country: {in: [NO, SE]}}", [0, 1, 3]),  # YAML 1.1: [false, SE], the SE row alone
    ("{country: {not_in: [NO]}}", [1, 2]),  # YAML 1.1: not_in [false] kept the NO rows
    ("{country: NO, answer: yes}", [0]),
    ("{answer: {in: [on, off]}}", [2, 3]),
    ("{code: 007}", [0]),  # YAML 1.1: 7, the row of '7'
    ("{code: {in: [010]}}", [2]),  # YAML 1.1: octal 8, the row of '8'
    ("{code: 12:30}", [4]),  # YAML 1.1: 750 (base 60)
    ("{amount: 1e3}", [3]),  # YAML 1.1: the text '1e3', no row
    ("{amount: {in: [1.0e+3, 7]}}", [0, 3]),
    ("{flag: true}", [0, 2, 4]),
])  # fmt: skip
def test_filter_values_select_the_rows_their_text_names(tmp_path: Path, written: str, expected: list[int]) -> None:
    evaluation, named_slice = _rows(tmp_path, written, written)
    assert evaluation == expected and named_slice == expected


def test_a_code_written_with_a_leading_zero_against_numbers_is_refused_naming_the_field(tmp_path: Path) -> None:
    """`amount: 010` selected the rows of 8 (octal) under YAML 1.1."""
    data = load_recipe(_recipe(tmp_path, "{amount: {in: [010, 7]}}")).data
    with pytest.raises(RecipeError) as info:
        filter_mask(TABLE, data.evaluation.filter, field="data.evaluation.filter", recipe_file=Path("r.yaml"))
    assert str(info.value) == ("r.yaml: data.evaluation.filter.amount: got '010': column 'amount' holds numbers; "
                               "expected a number (unquoted, no leading zero)")  # fmt: skip


def test_values_outside_filters_keep_their_yaml_types(tmp_path: Path) -> None:
    """Elsewhere a typed field refuses what YAML 1.1 made of a value (data.classes: [no, yes] is a one-line error)."""
    path = _recipe(tmp_path, "{answer: 'yes'}")
    path.write_text(path.read_text() + "  classes: [no, yes]\n")
    with pytest.raises(RecipeError, match=r"data\.classes\[0\]: expected a string or a whole number, got False"):
        load_recipe(path)


def test_every_filter_of_the_recipe_is_read_alike_and_nothing_else(tmp_path: Path) -> None:
    """A variant's training rows are a filter too (`qat: {train: {filter: ...}}`)."""
    path = tmp_path / "recipe.yaml"
    path.write_text("variants: [{qat: {train: {filter: {country: [NO, 010, on, 1e3, true, ~]}}}}]\nother: [NO, 010]\n")
    document, _ = read_recipe_yaml(path)
    assert document["variants"][0]["qat"]["train"]["filter"]["country"] == ["NO", "010", "on", 1000.0, True, None]
    assert document["other"] == [False, 8]


def test_a_number_with_an_exponent_and_no_dot_is_a_number_everywhere(tmp_path: Path) -> None:
    """The probe: `gate.max_drop: 1e-2` (0.01 as most people write it, and as YAML 1.2, JSON and Python read it) was
    refused, `gate.max_drop: expected a number, got '1e-2'` (YAML 1.1 wants a dot). Now it is 0.01; quoted, it is the
    text written (refused there as before), and a key stays the text it is."""
    path = _recipe(tmp_path, "{answer: 'yes'}")
    path.write_text(path.read_text() + "gate: {metric: accuracy, max_drop: 1e-2, max_slice_drop: 2E-2}\n")
    gate = load_recipe(path).gate
    assert (gate.max_drop, gate.max_slice_drop) == (0.01, 0.02)
    path.write_text(path.read_text().replace("max_drop: 1e-2", "max_drop: '1e-2'"))
    with pytest.raises(RecipeError, match=r"gate\.max_drop: expected a number, got '1e-2'"):
        load_recipe(path)
    path.write_text("other: {1e3: 1e3, text: '1e3', list: [+1e3, 1.0e3, 10]}\n")
    document, _ = read_recipe_yaml(path)
    assert document["other"] == {"1e3": 1000.0, "text": "1e3", "list": [1000.0, 1000.0, 10]}
