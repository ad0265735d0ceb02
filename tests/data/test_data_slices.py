"""slice_masks: per-value slices, named filter slices, and the recipe errors around them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench.data.slices import slice_masks
from qbench.errors import RecipeError
from qbench.recipe.data import SliceSpec

RECIPE = Path("recipe.yaml")


def _table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "region": ["south", "north", None, "north", "east", "south"],
            "digit": [3.0, 1.0, 10.0, np.nan, 3.0, 1.0],
            "ink": [0.1, 0.2, 0.3, 0.9, 0.8, 0.7],
        }
    )


def _masks(*specs: SliceSpec) -> dict[str, list[int]]:
    return {
        name: np.flatnonzero(mask).tolist() for name, mask in slice_masks(_table(), specs, recipe_file=RECIPE).items()
    }


def test_by_column_makes_one_sorted_slice_per_value_and_one_for_missing_values() -> None:
    """Rows without a value are a slice of their own (last): a variant that breaks only them must not go unjudged."""
    masks = _masks(SliceSpec(by="region"))
    assert list(masks) == ["region=east", "region=north", "region=south", "region=<missing>"]
    assert masks == {"region=east": [4], "region=north": [1, 3], "region=south": [0, 5], "region=<missing>": [2]}


def test_integral_floats_are_named_like_ints_and_sorted_numerically() -> None:
    masks = _masks(SliceSpec(by="digit"))
    assert masks == {"digit=1": [1, 5], "digit=3": [0, 4], "digit=10": [2], "digit=<missing>": [3]}


def test_control_characters_in_values_and_columns_are_escaped_in_slice_names() -> None:
    """A slice name is printed on one line of the gate's output: a newline in the data must not start a new line."""
    table = pd.DataFrame({"kind\r": ["hard\ngate: PASS", "naïve\tcase", "日本"]})
    masks = slice_masks(table, [SliceSpec(by="kind\r")], recipe_file=RECIPE)
    assert sorted(masks) == ["kind\\r=hard\\ngate: PASS", "kind\\r=naïve\\tcase", "kind\\r=日本"]
    assert all(name.isprintable() for name in masks)
    assert np.flatnonzero(masks["kind\\r=hard\\ngate: PASS"]).tolist() == [0]


def test_the_missing_values_slice_escapes_the_column_name_too() -> None:
    """Its name kept the column's raw newline, the one slice of the column that could forge a gate line."""
    table = pd.DataFrame({"kind\ngate: PASS": ["a", None, "b"]})
    masks = slice_masks(table, [SliceSpec(by="kind\ngate: PASS")], recipe_file=RECIPE)
    assert list(masks) == ["kind\\ngate: PASS=a", "kind\\ngate: PASS=b", "kind\\ngate: PASS=<missing>"]


def test_a_column_without_missing_values_has_no_missing_slice() -> None:
    table = pd.DataFrame({"level": ["hi", "lo", "hi"]})
    assert list(slice_masks(table, [SliceSpec(by="level")], recipe_file=RECIPE)) == ["level=hi", "level=lo"]


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ([0.1 * i + 0.05 for i in range(12)], "12 distinct among 12 rows"),
        ([f"{0.1 * i + 0.05:.2f}" for i in range(12)], "12 distinct among 12 rows"),  # a CSV column read as text
        (list(range(11)) * 2 + [11], "12 distinct among 23 rows"),
    ],
    ids=["measurements", "measurements-as-csv-text", "integers-nearly-one-per-row"],
)
def test_a_continuous_column_is_refused_as_a_by_slice_in_one_line(values: list[object], why: str) -> None:
    """`by: ink` on a column of measurements made one slice per value: 12 one-row slices, each judged, where a
    single changed row is a drop of 1.0."""
    with pytest.raises(RecipeError) as info:
        slice_masks(pd.DataFrame({"ink": values}), [SliceSpec(by="ink")], recipe_file=RECIPE)
    assert str(info.value) == (
        f"recipe.yaml: data.slices[0].by: column 'ink' holds continuous values ({why}, fewer than 2 rows a value): "
        "`by` makes one slice per "
        "distinct value; expected a column of categories: use named slices, e.g. "
        "{name: ink-low, filter: {ink: {lt: ...}}}, or bin the column beforehand (a column of bin labels)"
    )


@pytest.mark.parametrize(
    "values",
    [[3.0, 1.0, 10.0, np.nan, 3.0, 1.0], ["007", "7", "010"], list(range(11)) * 2, ["a", "b", "c", "d"],
     [0.5, 2.5, 0.5, 1.0, 2.5], ["2.1", "2.10", "2.1", "2.2"]],
    ids=["whole-floats", "csv-codes", "integer-codes", "words", "fractional-levels", "version-texts"],
)
def test_integer_and_text_codes_stay_by_slices(values: list[object]) -> None:
    masks = slice_masks(pd.DataFrame({"code": values}), [SliceSpec(by="code")], recipe_file=RECIPE)
    assert sum(int(mask.sum()) for mask in masks.values()) == len(values)


def test_named_filter_slices_follow_by_slices_in_recipe_order() -> None:
    masks = _masks(SliceSpec(by="region"), SliceSpec(name="faint", filter={"ink": {"lt": 0.5}}))
    assert list(masks)[-1] == "faint"
    assert masks["faint"] == [0, 1, 2]


def test_masks_cover_every_row_of_the_table() -> None:
    masks = slice_masks(_table(), [SliceSpec(by="region")], recipe_file=RECIPE)
    assert all(mask.dtype == bool and mask.shape == (6,) for mask in masks.values())


def test_duplicate_slice_name() -> None:
    specs = [SliceSpec(by="region"), SliceSpec(name="region=north", filter={"ink": {"gt": 0.5}})]
    with pytest.raises(RecipeError) as info:
        slice_masks(_table(), specs, recipe_file=RECIPE)
    assert (
        str(info.value)
        == "recipe.yaml: data.slices[1]: duplicate slice name 'region=north' (also made by data.slices[0])"
    )


def test_unknown_by_column() -> None:
    with pytest.raises(RecipeError) as info:
        slice_masks(_table(), [SliceSpec(by="regoin")], recipe_file=RECIPE)
    assert str(info.value) == (
        "recipe.yaml: data.slices[0].by: got 'regoin', expected one of digit, ink, region (did you mean 'region'?)"
    )


def test_column_with_too_many_values_suggests_buckets() -> None:
    table = pd.DataFrame({"length": np.tile(np.arange(51), 2)})
    with pytest.raises(RecipeError) as info:
        slice_masks(table, [SliceSpec(by="length")], recipe_file=RECIPE)
    assert str(info.value) == (
        "recipe.yaml: data.slices[0].by: column 'length' has 51 distinct values (at most 50 slices per column): "
        "bucket it with named filters, e.g. {name: length-low, filter: {length: {lt: ...}}}"
    )


def test_text_column_with_too_many_values_suggests_a_list_not_a_comparison() -> None:
    """A column of 300 shop ids was told to bucket itself with `{shop: {lt: ...}}`: comparisons apply to numbers and
    dates ("Filters"), so the example for text groups values with `in`."""
    table = pd.DataFrame({"shop": np.tile([f"shop{i:03d}" for i in range(300)], 2)})
    with pytest.raises(RecipeError) as info:
        slice_masks(table, [SliceSpec(by="shop")], recipe_file=RECIPE)
    assert str(info.value) == (
        "recipe.yaml: data.slices[0].by: column 'shop' has 300 distinct values (at most 50 slices per column): "
        "bucket it with named filters, e.g. {name: shop-group-1, "
        "filter: {shop: {in: [shop000, shop001, shop002, ...]}}}"
    )


@pytest.mark.parametrize("kind", ["timestamps", "calendar dates"])
def test_date_column_with_too_many_values_suggests_a_range(kind: str) -> None:
    """Comparisons apply to dates ("Filters"): 300 days were told to list three of them with `in`, where a range of
    days groups them; dates get the `lt` example numbers get."""
    days = pd.date_range("2026-01-01", periods=300, freq="D")
    table = pd.DataFrame({"day": np.tile(days if kind == "timestamps" else [d.date() for d in days], 2)})
    with pytest.raises(RecipeError) as info:
        slice_masks(table, [SliceSpec(by="day")], recipe_file=RECIPE)
    assert str(info.value) == (
        "recipe.yaml: data.slices[0].by: column 'day' has 300 distinct values (at most 50 slices per column): "
        "bucket it with named filters, e.g. {name: day-low, filter: {day: {lt: ...}}}"
    )


def test_named_filter_that_matches_no_row_is_an_error() -> None:
    specs = [SliceSpec(name="west", filter={"region": "west"})]
    with pytest.raises(RecipeError) as info:
        slice_masks(_table(), specs, recipe_file=RECIPE)
    assert str(info.value) == (
        "recipe.yaml: data.slices[0].filter: selects no rows (6 rows in the table; region has 'east', 'north', 'south')"
    )


def test_filter_errors_carry_the_slice_field() -> None:
    specs = [SliceSpec(by="digit"), SliceSpec(name="dark", filter={"inc": {"gt": 0.5}})]
    with pytest.raises(RecipeError, match=r"^recipe.yaml: data.slices\[1\].filter.inc: got 'inc'.*did you mean 'ink'"):
        slice_masks(_table(), specs, recipe_file=RECIPE)


def test_by_slices_are_the_values_of_the_evaluated_rows() -> None:
    """A value held only by rows outside the evaluation (calibration, say) is no slice: it blocked the recipe
    ("none among the evaluation rows") and the user could not leave one value of a `by` column out."""
    evaluated = np.array([0, 1, 3, 5])  # east (row 4) and the missing region (row 2) are not evaluated
    masks = slice_masks(_table(), [SliceSpec(by="region")], recipe_file=RECIPE, evaluation_rows=evaluated)
    assert {name: np.flatnonzero(mask).tolist() for name, mask in masks.items()} == {
        "region=north": [1, 3], "region=south": [0, 5]
    }  # fmt: skip
    with pytest.raises(RecipeError, match="slice 'east' has 1 rows in the table but none among the 4 evaluation"):
        slice_masks(_table(), [SliceSpec(name="east", filter={"region": "east"})], recipe_file=RECIPE,
                    evaluation_rows=evaluated)  # fmt: skip  (a named slice must still hold evaluated rows)


def test_true_and_one_in_one_column_are_refused_not_merged() -> None:
    """pandas hashes True and 1 alike: the rows holding 1 were counted under 'flag=True' without a word."""
    table = pd.DataFrame({"flag": pd.Series([True, 1, 0, False, 1], dtype=object)})
    with pytest.raises(RecipeError) as info:
        slice_masks(table, [SliceSpec(by="flag")], recipe_file=RECIPE)
    assert str(info.value) == ("recipe.yaml: data.slices[0].by: column 'flag' mixes true/false with numbers (e.g. 1), "
                               "which pandas takes as equal (True == 1); expected one kind of value")  # fmt: skip
    assert list(slice_masks(pd.DataFrame({"flag": [True, False, None]}), [SliceSpec(by="flag")], recipe_file=RECIPE)) == [
        "flag=False", "flag=True", "flag=<missing>"
    ]  # fmt: skip


def test_the_text_missing_beside_empty_cells_is_refused_not_overwritten() -> None:
    table = pd.DataFrame({"source": ["<missing>", "web", None]})
    with pytest.raises(RecipeError, match="holds the text '<missing>' and empty cells: both would be slice"):
        slice_masks(table, [SliceSpec(by="source")], recipe_file=RECIPE)


def test_csv_codes_that_read_as_one_number_are_slices_of_their_own(tmp_path: Path) -> None:
    """A CSV slice column of "007", "7" and "010" gave two slices, code=7 (holding "007" and "7") and code=10: the
    slice column is read as the file's text (qbench.data.evaluation.text_columns)."""
    from qbench.data import evaluation_rows, load_table, text_columns
    from qbench.recipe.data import DataSpec

    path = tmp_path / "rows.csv"
    path.write_text("x,code,length\n" + "".join(f'"[{i}]",{c},{i}\n' for i, c in enumerate(["007", "7", "010"] * 3)))
    data = DataSpec.model_validate({"path": "rows.csv", "inputs": {"x": "x"}, "slices": [{"by": "code"}],
                                    "evaluation": {"filter": {"length": {"ge": 1}}}})  # fmt: skip
    table = load_table(path, recipe_file=RECIPE, text_columns=text_columns(data, label_names=False))
    evaluated = evaluation_rows(table, data, recipe_file=RECIPE, calibrated=False)
    assert evaluated.rows.tolist() == list(range(1, 9))  # a number filter on another column still works
    assert evaluated.slice_sizes == {"code=007": 2, "code=010": 3, "code=7": 3}


def test_values_that_print_alike_give_slice_names_that_read_apart() -> None:
    """' a', 'a' and 'a ' (a sloppy export), or é composed and as e + accent, are different values, so different
    slices, but were named 'w= a', 'w=a', 'w=a ' and 'w=é' twice: which one breached could not be read off the
    gate's table. Such text is quoted with escapes; plain text keeps its plain name. (Two such spellings of one value
    in one column are refused: test_one_value_written_several_ways_is_refused_naming_the_spellings.)"""
    values = [" a", "b ", "\u00e9", "e\u0301x", "", "b c"]
    masks = slice_masks(pd.DataFrame({"w": values}), [SliceSpec(by="w")], recipe_file=RECIPE)
    names = {int(np.flatnonzero(mask)[0]): name for name, mask in masks.items()}
    assert names == {0: "w=' a'", 1: "w='b '", 2: "w=\u00e9", 3: "w='e\\u0301x'", 4: "w=''", 5: "w=b c"}


@pytest.mark.parametrize(("values", "shown"), [
    (["Cooking"] * 5 + ["cooking "] * 2 + [" cooking", "garden"], '" cooking", "Cooking", "cooking "'),
    (["caf\u00e9", "cafe\u0301", "garden"], '"cafe\\u0301", "café"'),
    (["true"] * 4 + ["yes", "1", "false", "false"], '"1", "true", "yes"'),
    (["TRUE", "true", "FALSE"], '"TRUE", "true"'),
])  # fmt: skip
def test_one_value_written_several_ways_is_refused_naming_the_spellings(values: list[str], shown: str) -> None:
    """Each spelling was its own slice: 'cooking ' a slice of 2 rows judged apart from the 5 'Cooking' rows, and a
    true/false column written true/yes/1 three slices of true."""
    with pytest.raises(RecipeError) as info:
        slice_masks(pd.DataFrame({"w": values}), [SliceSpec(by="w")], recipe_file=RECIPE)
    count = shown.count(",") + 1
    assert str(info.value).startswith(f"recipe.yaml: data.slices[0].by: column 'w' writes one value {count} ways "
                                      f"({shown}), each of which would be its own slice, judged apart; expected one "
                                      "spelling per value: clean the column, or "
                                      "join them in a named slice such as {name: ")


def test_values_alike_only_as_numbers_or_outside_a_true_false_column_stay_apart() -> None:
    """'2.1' and '2.10' are two versions, '1' and 'yes' two answers in a column that is not true/false alone."""
    for values in (["2.1", "2.10", "2.1"], ["1", "yes", "maybe", "0"], ["N", "S", "E"]):
        masks = slice_masks(pd.DataFrame({"w": values}), [SliceSpec(by="w")], recipe_file=RECIPE)
        assert len(masks) == len(set(values))


def test_the_named_slice_a_spelling_error_writes_selects_every_spelling_it_names() -> None:
    """Spellings '' and '  ' (two spaces) were shown as ("", " "): the error's message was flattened, every run of
    spaces made one, so the named slice it wrote, `in: ["", " "]`, missed the two-space rows. The filter it writes
    now selects exactly the rows of both spellings."""
    import yaml

    table = pd.DataFrame({"w": ["", "  ", "  ", "a", "b"]})
    with pytest.raises(RecipeError) as info:
        slice_masks(table, [SliceSpec(by="w")], recipe_file=RECIPE)
    message = str(info.value)
    assert '("", "  ")' in message
    written = yaml.safe_load(message[message.index("{name: "):])
    masks = slice_masks(table, [SliceSpec(**written)], recipe_file=RECIPE)
    assert list(np.flatnonzero(masks[written["name"]])) == [0, 1, 2]
