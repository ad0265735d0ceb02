"""Declarative filters: every operator, SQL-like missing values, and the errors users see."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench.data.filters import distinct_values, filter_mask, format_value, select_rows
from qbench.data.load import load_table
from qbench.errors import RecipeError

RECIPE = Path("recipe.yaml")
FIELD = "data.evaluation.filter"


def _table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "label": [0, 1, 2, 3, 4],
            "pixels": [[0.0, 1.0]] * 5,
            "region": ["north", "south", "east", None, "north"],
            "split": ["train", "test", "test", "test", "train"],
            "ink": [0.1, 0.5, 0.9, np.nan, 0.7],
        }
    )


def _rows(flt: dict | None) -> list[int]:
    return np.flatnonzero(filter_mask(_table(), flt, field=FIELD, recipe_file=RECIPE)).tolist()


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (None, [0, 1, 2, 3, 4]),
        ({"split": "test"}, [1, 2, 3]),
        ({"region": {"eq": "north"}}, [0, 4]),
        ({"region": {"in": ["north", "east"]}}, [0, 2, 4]),
        ({"label": {"ge": 1, "lt": 4}}, [1, 2, 3]),
        ({"ink": {"gt": 0.5}}, [2, 4]),
        ({"ink": {"le": 0.5}}, [0, 1]),
        ({"split": "test", "ink": {"lt": 1.0}}, [1, 2]),
        ({"label": {"ne": 2, "not_in": [0, 4]}}, [1, 3]),
    ],
)
def test_operators_and_conjunctions(flt: dict | None, expected: list[int]) -> None:
    assert _rows(flt) == expected


def test_missing_values_match_only_conditions_that_name_null() -> None:
    assert _rows({"region": {"ne": "north"}}) == [1, 2]
    assert _rows({"region": {"not_in": ["south"]}}) == [0, 2, 4]
    assert _rows({"region": None}) == [3]
    assert _rows({"region": {"ne": None}}) == [0, 1, 2, 4]
    assert _rows({"region": {"in": ["east", None]}}) == [2, 3]
    assert _rows({"region": {"not_in": ["north", None]}}) == [1, 2]
    assert _rows({"ink": {"lt": 10}}) == [0, 1, 2, 4]
    assert _rows({"ink": {"ge": -10}}) == [0, 1, 2, 4]


def test_a_value_of_another_type_simply_matches_nothing() -> None:
    assert _rows({"split": 3}) == []
    assert _rows({"label": "3"}) == []


def test_misspelt_column_names_the_field_and_suggests() -> None:
    with pytest.raises(RecipeError) as info:
        filter_mask(
            _table().drop(columns="ink"), {"regoin": "north"}, field="data.slices[1].filter", recipe_file=RECIPE
        )
    assert str(info.value) == (
        "recipe.yaml: data.slices[1].filter.regoin: got 'regoin', expected one of label, pixels, region, split "
        "(did you mean 'region'?)"
    )


def test_comparison_on_text_is_an_error() -> None:
    with pytest.raises(RecipeError) as info:
        filter_mask(_table(), {"region": {"lt": 3}}, field="data.slices[1].filter", recipe_file=RECIPE)
    assert (
        str(info.value)
        == "recipe.yaml: data.slices[1].filter.region: 'lt' compares numbers, but column 'region' holds text values"
    )


def test_filter_on_a_list_column_is_an_error() -> None:
    with pytest.raises(RecipeError) as info:
        filter_mask(_table(), {"pixels": 1.0}, field=FIELD, recipe_file=RECIPE)
    assert str(info.value) == (
        "recipe.yaml: data.evaluation.filter.pixels: column 'pixels' holds lists or arrays; "
        "expected a column of single values"
    )


def test_select_rows_returns_sorted_int_positions() -> None:
    positions = select_rows(_table(), {"split": "test"}, field=FIELD, recipe_file=RECIPE)
    assert positions.dtype == np.int64
    assert positions.tolist() == [1, 2, 3]


def test_empty_selection_lists_the_values_it_could_have_matched(tmp_path: Path) -> None:
    path = tmp_path / "digits.parquet"
    _table().to_parquet(path)
    table = load_table(path, recipe_file=RECIPE)
    with pytest.raises(RecipeError) as info:
        select_rows(table, {"region": "nroth", "label": {"gt": 1}}, field=FIELD, recipe_file=RECIPE)
    assert str(info.value) == (
        "recipe.yaml: data.evaluation.filter: selects no rows (5 rows in digits.parquet; "
        "region has 'east', 'north', 'south'; label has 0, 1, 2, 3, 4)"
    )


def test_empty_selection_on_a_many_valued_column_gives_its_range() -> None:
    table = pd.DataFrame({"score": np.linspace(0.5, 3.0, 26), "name": [f"n{i}" for i in range(26)]})
    with pytest.raises(RecipeError) as info:
        select_rows(table, {"score": {"gt": 5}, "name": "x"}, field=FIELD, recipe_file=RECIPE)
    assert str(info.value).endswith(
        "selects no rows (26 rows in the table; score ranges 0.5..3; name has 26 distinct values)"
    )


def test_distinct_values_sort_numbers_numerically_and_drop_missing() -> None:
    assert distinct_values(pd.Series([10, 2, None, 2, 1])) == [1.0, 2.0, 10.0]
    assert distinct_values(pd.Series(["b", None, "a"])) == ["a", "b"]


@pytest.mark.parametrize(
    ("value", "text"),
    [(3.0, "3"), (np.float32(2.5), "2.5"), (np.int64(7), "7"), (True, "True"), ("north", "north"), (0.1, "0.1")],
)
def test_format_value_writes_values_as_people_do(value: object, text: str) -> None:
    assert format_value(value) == text


def test_a_text_column_of_codes_compares_as_numbers_and_equals_the_number_it_writes() -> None:
    """A CSV column read as text (a slice column: "007" and "7" are two codes) still serves `gt` and the like, as
    numbers; a number equals the cells that write it plainly (7 is "7", not "007")."""
    codes = pd.DataFrame({"code": ["007", "7", "010", None, "12"]})

    def rows(flt: dict) -> list[int]:
        return np.flatnonzero(filter_mask(codes, flt, field=FIELD, recipe_file=RECIPE)).tolist()

    assert rows({"code": {"gt": 7}}) == [2, 4]
    assert rows({"code": {"le": 7}}) == [0, 1]
    assert rows({"code": 7}) == [1]
    assert rows({"code": "007"}) == [0]
    assert rows({"code": {"in": [12, "010"]}}) == [2, 4]
    assert rows({"code": {"ne": 7}}) == [0, 2, 4]
    flags = pd.DataFrame({"flag": ["True", "false", "TRUE", None]})
    assert np.flatnonzero(filter_mask(flags, {"flag": True}, field=FIELD, recipe_file=RECIPE)).tolist() == [0, 2]
