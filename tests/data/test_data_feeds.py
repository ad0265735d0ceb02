"""build_feeds / labels_array / iter_batches: table cells to the model's shapes and dtypes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench.data.feeds import build_feeds, iter_batches, labels_array
from qbench.data.load import load_table
from qbench.errors import QbenchError, RecipeError
from qbench.modelinfo.signature import TensorMeta, read_model_info

RECIPE = Path("recipe.yaml")


def _meta(name: str, shape: tuple[int | None, ...], dtype: str = "float32") -> dict[str, TensorMeta]:
    return {name: TensorMeta(name, np.dtype(dtype), shape)}


def _digits(rows: int = 5) -> pd.DataFrame:
    pixels = np.arange(rows * 64, dtype=np.float64).reshape(rows, 64) / 100
    return pd.DataFrame({"pixels": list(pixels), "label": np.arange(rows) % 3, "ink": np.linspace(0, 1, rows)})


def _feed(
    table: pd.DataFrame, column: str, meta: dict[str, TensorMeta], positions: list[int] | None = None
) -> np.ndarray:
    rows = np.arange(len(table)) if positions is None else np.array(positions)
    (array,) = build_feeds(table, rows, {column: next(iter(meta))}, meta, recipe_file=RECIPE).values()
    return array


def test_64_pixels_are_reshaped_to_an_image_input_in_row_order() -> None:
    table = _digits()
    image = _feed(table, "pixels", _meta("image", (None, 1, 8, 8)), positions=[4, 0])
    assert image.shape == (2, 1, 8, 8) and image.dtype == np.float32
    np.testing.assert_allclose(image[0].ravel(), np.asarray(table["pixels"][4]), rtol=1e-6)
    np.testing.assert_allclose(image[1].ravel(), np.asarray(table["pixels"][0]), rtol=1e-6)


@pytest.mark.parametrize(
    ("shape", "expected"),
    [((None,), (5,)), ((None, 1), (5, 1)), ((None, None), (5, 1)), ((), (5,))],
)
def test_scalar_column_takes_the_rank_the_model_needs(shape: tuple[int | None, ...], expected: tuple[int, ...]) -> None:
    feed = _feed(_digits(), "ink", _meta("x", shape))
    assert feed.shape == expected
    np.testing.assert_allclose(feed.ravel(), np.linspace(0, 1, 5), rtol=1e-6)


def test_one_dynamic_dim_takes_what_the_static_dims_leave() -> None:
    assert _feed(_digits(), "pixels", _meta("x", (None, 4, None))).shape == (5, 4, 16)


def test_nested_cells_from_parquet_stack_to_their_shape(tmp_path: Path) -> None:
    path = tmp_path / "grids.parquet"
    pd.DataFrame({"grid": [np.arange(6.0).reshape(2, 3).tolist()] * 3}).to_parquet(path)
    table = load_table(path, recipe_file=RECIPE)
    feed = _feed(table, "grid", _meta("g", (None, 2, 3)))
    assert feed.shape == (3, 2, 3)
    np.testing.assert_array_equal(feed[2], np.arange(6.0).reshape(2, 3))


def test_images_stored_as_nested_lists_in_parquet_stack_at_every_level(tmp_path: Path) -> None:
    """An HWC uint8 image per row, written as lists of rows of pixels of channels: parquet reads it back as object
    arrays of object arrays of uint8 arrays, which must stack to (rows, H, W, C), not to (rows, H, W) of objects."""
    path = tmp_path / "images.parquet"
    images = np.arange(4 * 2 * 3 * 3, dtype=np.uint8).reshape(4, 2, 3, 3)
    pd.DataFrame({"image": [image.tolist() for image in images]}).to_parquet(path)
    table = load_table(path, recipe_file=RECIPE)
    feed = _feed(table, "image", _meta("input_1:0", (None, 2, 3, 3), "uint8"))
    assert feed.dtype == np.uint8
    np.testing.assert_array_equal(feed, images)


def test_ragged_lists_inside_a_cell_name_the_row(tmp_path: Path) -> None:
    path = tmp_path / "ragged.parquet"
    pd.DataFrame({"grid": [[[1, 2], [3, 4]], [[1, 2], [3, 4]], [[1, 2], [3]]]}).to_parquet(path)
    table = load_table(path, recipe_file=RECIPE)
    with pytest.raises(RecipeError) as info:
        _feed(table, "grid", _meta("g", (None, 2, 2), "int64"))
    assert str(info.value) == (
        "recipe.yaml: data.inputs: column 'grid': row 2 holds nested lists of different lengths; "
        "expected one block of values"
    )


def test_ragged_lists_name_the_lengths_seen() -> None:
    table = pd.DataFrame({"tokens": [[1, 2, 3], [1, 2], [4, 5, 6], [7]]})
    with pytest.raises(RecipeError) as info:
        _feed(table, "tokens", _meta("ids", (None, None), "int64"))
    assert str(info.value) == (
        "recipe.yaml: data.inputs: column 'tokens' holds cells of different lengths (seen 1, 2, 3): 2 of 4 rows "
        "differ from the most common length 3 (2 rows), first at row 1 (length 2); pad them to one size"
    )


def test_one_row_of_another_length_among_many_is_named_by_its_row(tmp_path: Path) -> None:
    rows = np.random.default_rng(0).normal(size=(2000, 4)).astype(np.float32)
    cells = list(rows)
    cells[1500] = rows[1500, :3]
    path = tmp_path / "rows.parquet"
    pd.DataFrame({"x": cells}).to_parquet(path)
    table = load_table(path, recipe_file=RECIPE)
    with pytest.raises(RecipeError) as info:
        _feed(table, "x", _meta("x", (None, 4)))
    assert str(info.value) == (
        "recipe.yaml: data.inputs: column 'x' holds cells of different lengths (seen 3, 4): 1 of 2000 rows differ "
        "from the most common length 4 (1999 rows), first at row 1500 (length 3); pad them to one size"
    )


def test_one_cell_of_another_shape_in_json_lines_names_its_row(tmp_path: Path) -> None:
    lines = ['{"x": [1.0, 2.0, 3.0, 4.0]}'] * 6
    lines[4] = '{"x": [[1.0, 2.0], [3.0, 4.0]]}'
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    table = load_table(path, recipe_file=RECIPE)
    with pytest.raises(RecipeError) as info:
        _feed(table, "x", _meta("x", (None, 4)))
    assert str(info.value) == (
        "recipe.yaml: data.inputs: column 'x' holds cells of different shapes (seen (2, 2), (4,)): 1 of 6 rows differ "
        "from the most common length 4 (5 rows), first at row 4 (shape (2, 2)); pad them to one size"
    )


def test_cell_size_that_does_not_fit_the_input_shape() -> None:
    with pytest.raises(RecipeError) as info:
        _feed(_digits(), "pixels", _meta("image", (None, 1, 8, 9)))
    assert str(info.value) == (
        "recipe.yaml: data.inputs: column 'pixels' holds cells of 64 values (shape (64,)), "
        "but model input 'image' expects shape (batch, 1, 8, 9)"
    )


def test_one_feature_column_for_an_input_of_several_features_says_how_to_feed_them(tmp_path: Path) -> None:
    """A CSV export with one column per feature beside skl2onnx's one input X [N, 13]: the error named the shapes and
    not the way out (one list column per input); now it says so, and the list column it names feeds X. A text column
    (NumPy-printed arrays) gets its own hint, not this one."""
    values = np.arange(26.0).reshape(2, 13) / 4
    table = pd.DataFrame(values, columns=[f"f{i}" for i in range(13)])
    table["features"] = [json.dumps(row) for row in values.tolist()]
    table.to_csv(tmp_path / "rows.csv", index=False)
    table = load_table(tmp_path / "rows.csv", recipe_file=RECIPE)
    with pytest.raises(RecipeError) as info:
        _feed(table, "f0", _meta("X", (None, 13)))
    assert str(info.value) == (
        "recipe.yaml: data.inputs: column 'f0' holds cells of 1 value (shape ()), but model input 'X' expects shape "
        "(batch, 13); one column feeds one input: put each row's values, in the model's feature order, in one list "
        "column (a Parquet list column, or a JSON list per CSV cell as json.dumps(row) writes it)"
    )
    np.testing.assert_array_equal(_feed(table, "features", _meta("X", (None, 13))), values.astype(np.float32))


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"pixel": "image"}, "recipe.yaml: data.inputs: column 'pixel' is not in the table; expected one of ink, "
                             "label, pixels (did you mean 'pixels'?)"),
        ({"pixels": "imgae"}, "recipe.yaml: data.inputs.pixels: 'imgae' is not an input of the model; expected one of "
                              "image (did you mean 'image'?)"),
    ],
    ids=["an unknown column suggests the closest", "an unknown input name lists the model's inputs"],
)  # fmt: skip
def test_a_misspelt_column_or_input_is_named_with_the_closest(inputs: dict[str, str], message: str) -> None:
    with pytest.raises(RecipeError) as info:
        build_feeds(_digits(), np.arange(2), inputs, _meta("image", (None, 64)), recipe_file=RECIPE)
    assert str(info.value) == message


def test_every_model_input_needs_exactly_one_column() -> None:
    model_inputs = {**_meta("image", (None, 64)), **_meta("scale", (None, 1))}
    with pytest.raises(RecipeError, match=r"^recipe.yaml: data.inputs: model input 'scale' is fed by no column"):
        build_feeds(_digits(), np.arange(2), {"pixels": "image"}, model_inputs, recipe_file=RECIPE)
    with pytest.raises(
        RecipeError, match=r"^recipe.yaml: data.inputs.ink: model input 'scale' is already fed by column 'label'"
    ):
        build_feeds(_digits(), np.arange(2), {"label": "scale", "ink": "scale"}, model_inputs, recipe_file=RECIPE)


def test_integral_floats_feed_an_integer_input_and_fractions_do_not() -> None:
    table = pd.DataFrame({"ids": [[1.0, 2.0], [3.0, 4.0]], "soft": [[1.0, 2.5], [3.0, 4.0]]})
    ids = _feed(table, "ids", _meta("input_ids", (None, 2), "int64"))
    assert ids.dtype == np.int64 and ids.tolist() == [[1, 2], [3, 4]]
    with pytest.raises(RecipeError) as info:
        _feed(table, "soft", _meta("input_ids", (None, 2), "int64"))
    assert str(info.value) == ("recipe.yaml: data.inputs: column 'soft' holds non-integer values: 1 row with a "
                               "fraction, e.g. row 0, but model input 'input_ids' expects int64")  # fmt: skip


def test_missing_cells_of_an_integer_column_are_named_by_row_apart_from_fractions() -> None:
    """An integer column with empty cells (skl2onnx's int64 inputs) reads as float with NaN: fed to an int64 input
    under nonfinite_inputs: keep, it was 'non-integer values', with neither the rows nor that they are missing."""
    table = pd.DataFrame({"k": [1.0, np.nan, 2.0, 0.5, np.nan]}, index=[10, 11, 12, 13, 14])
    with pytest.raises(RecipeError) as info:
        build_feeds(table, np.arange(5), {"k": "k"}, _meta("k", (None, 1), "int64"), recipe_file=RECIPE)
    assert str(info.value) == ("recipe.yaml: data.inputs: column 'k' holds non-integer values: 2 rows with NaN/inf "
                               "(missing values), e.g. row 11; 1 row with a fraction, e.g. row 13, but model input 'k' "
                               "expects int64")  # fmt: skip


def test_values_outside_an_integer_inputs_range_are_rejected_naming_the_rows_a_value_and_the_range() -> None:
    """PCM samples of a wider format (int32, 24-bit) fed to an int16 input: the line said 'values outside the range
    of int16' with no row, no value and no range, where the user must tell a wider encoding from a stray value."""
    table = pd.DataFrame({"level": [3, 300]})
    with pytest.raises(RecipeError) as info:
        _feed(table, "level", _meta("level", (None,), "uint8"))
    assert str(info.value) == ("recipe.yaml: data.inputs: column 'level' holds 1 row with values outside uint8's range "
                               "0 to 255, e.g. row 1 holding 300 (values seen from 3 to 300), but model input 'level' "
                               "expects uint8")  # fmt: skip
    assert _feed(table, "level", _meta("level", (None,), "int16")).tolist() == [3, 300]
    pcm = pd.DataFrame({"pcm": [np.array([3, 4], np.int32), np.array([-5, 40000], np.int32),
                                np.array([-40001, 1], np.int32)]}, index=[10, 11, 12])  # fmt: skip
    with pytest.raises(RecipeError) as info:
        _feed(pcm, "pcm", _meta("pcm", (None, 2), "int16"))
    assert str(info.value) == ("recipe.yaml: data.inputs: column 'pcm' holds 2 rows with values outside int16's range "
                               "-32768 to 32767, e.g. row 11 holding 40000 (values seen from -40001 to 40000), but "
                               "model input 'pcm' expects int16")  # fmt: skip


def test_values_too_large_for_a_float_input_are_rejected_not_fed_as_inf() -> None:
    """1e39 is finite in the float64 table (past the NaN/inf check) but inf as float32."""
    table = pd.DataFrame({"reading": [1.5, 1e39, -2e39, np.inf]})
    with pytest.raises(RecipeError) as info:
        _feed(table, "reading", _meta("x", (None,)))
    assert str(info.value) == ("recipe.yaml: data.inputs: column 'reading' holds 2 values beyond float32's range "
                               "(e.g. 2e+39), which would become inf, but model input 'x' expects float32")  # fmt: skip
    # an inf the file holds itself is fed as it is: the NaN/inf check judges it
    assert _feed(table.iloc[[0, 3]], "reading", _meta("x", (None,))).tolist() == [1.5, np.inf]
    with pytest.raises(RecipeError, match=r"holds 1 value beyond float16's range \(e.g. 7e\+04\)"):
        _feed(pd.DataFrame({"reading": [1.0, 70000.0]}), "reading", _meta("x", (None,), "float16"))


def test_integers_a_float_input_cannot_hold_exactly_are_fed_rounded_with_a_warning(caplog) -> None:
    """float32 holds every integer up to 2**24 only: ids 16777216 and 16777217 reach the model as one value. A
    service casts them alike, so they are fed (what the figures describe), with a warning naming the column."""
    table = pd.DataFrame({"item": np.array([16777216, 16777217, -16777219, 3], dtype=np.int64)})
    with caplog.at_level("WARNING", logger="qbench"):
        assert _feed(table, "item", _meta("x", (None,))).tolist() == [16777216.0, 16777216.0, -16777220.0, 3.0]
    assert caplog.messages == ["column 'item': 2 of 4 values are integers beyond float32's exact range (e.g. 16777217 "
                               "becomes 16777216), so model input 'x' gets them rounded: distinct ids or codes may "
                               "merge into one (the figures describe the rounded values, as a service casting them to "
                               "float32 would)"]  # fmt: skip
    caplog.clear()
    with caplog.at_level("WARNING", logger="qbench"):  # exact: 2**24 itself, 2**25 (even), anything float64 holds
        exact = pd.DataFrame({"item": np.array([16777216, 2**25, -(2**24), 7], dtype=np.int64)})
        _feed(exact, "item", _meta("x", (None,)))
        _feed(table, "item", _meta("x", (None,), "float64"))
    assert caplog.messages == []
    with caplog.at_level("WARNING", logger="qbench"):
        _feed(pd.DataFrame({"item": np.array([2**53 + 1], dtype=np.uint64)}), "item", _meta("x", (None,), "float64"))
    assert "1 of 1 values are integers beyond float64's exact range (e.g. 9007199254740993 becomes" in caplog.text


def test_text_cannot_feed_a_float_input() -> None:
    table = pd.DataFrame({"caption": ["a cat", "a dog"]})
    with pytest.raises(
        RecipeError,
        match=r"column 'caption' holds non-numeric values such as 'a cat', but model input 'x' expects float32",
    ):
        _feed(table, "caption", _meta("x", (None, 1)))


@pytest.mark.parametrize(("shape", "first"), [((None, 2, 3), "column 'x' holds cells of 1 value (shape ()), but model "
                                                "input 'x' expects shape (batch, 2, 3)"),
                                               ((None,), "column 'x' holds non-numeric values such as '[0.  "
                                                         "       0.14285714 0.28571429 0.4285...', but model input "
                                                         "'x' expects float32")])  # the cell's spaces as they are
def test_arrays_pandas_wrote_to_csv_as_numpy_prints_them_are_named_so(tmp_path: Path, shape, first) -> None:
    """pandas' to_csv writes an array cell as NumPy prints it ('[ 0.5 -1.25  3. ]', wrapped over lines when long): no
    JSON list, so the column stays text, and the error named only the shape (or the whole text, hundreds of
    characters for a long array) without saying why."""
    cells = [np.array([0.5, -1.25, 3.0, 4e-05, 1.0, 2.0]) * (row + 1) for row in range(3)]
    if shape == (None,):
        cells = [np.arange(40, dtype=np.float64) / 7] * 3  # printed over several lines
    pd.DataFrame({"x": cells}).to_csv(tmp_path / "rows.csv", index=False)
    table = load_table(tmp_path / "rows.csv", recipe_file=RECIPE)
    with pytest.raises(RecipeError) as info:
        _feed(table, "x", _meta("x", shape))
    message = str(info.value)
    assert message.startswith(f"recipe.yaml: data.inputs: {first}")
    assert "\n" not in message
    assert message.endswith(
        "are arrays as NumPy prints them (pandas' to_csv writes array cells so): expected a JSON list per cell "
        "('[42, 32, 26]', as json.dumps(cell.tolist()) writes it) or a Parquet list column"
    )
    assert "; cells such as '[" in message
    # the same cells written as JSON lists feed the input
    pd.DataFrame({"x": [json.dumps(c.tolist()) for c in cells]}).to_csv(tmp_path / "rows.csv", index=False)
    fed = _feed(load_table(tmp_path / "rows.csv", recipe_file=RECIPE), "x", _meta("x", (None, *[len(cells[0])])))
    np.testing.assert_array_equal(fed, np.stack(cells).astype(np.float32))


def test_a_bracketed_text_that_is_no_printed_array_gets_no_array_hint() -> None:
    table = pd.DataFrame({"x": ["[en]", "[de]"]})
    with pytest.raises(RecipeError) as info:
        _feed(table, "x", _meta("x", (None,)))
    assert str(info.value) == (
        "recipe.yaml: data.inputs: column 'x' holds non-numeric values such as '[en]', but model input 'x' expects "
        "float32"
    )


def test_durations_and_dates_cannot_feed_a_float_input_and_are_named_so(tmp_path: Path) -> None:
    """NumPy counts timedelta64 among its integers: a duration column was refused as 'numbers written as text'."""
    path = tmp_path / "times.parquet"
    pd.DataFrame({"waited": pd.to_timedelta([90, 30], unit="s"),
                  "seen": pd.to_datetime(["2024-01-31", "2024-02-01"])}).to_parquet(path)  # fmt: skip
    table = load_table(path, recipe_file=RECIPE)
    with pytest.raises(RecipeError) as info:
        _feed(table, "waited", _meta("x", (None, 1)))
    assert str(info.value) == (
        "recipe.yaml: data.inputs: column 'waited' holds durations, not numbers (e.g. 90000000 microseconds), "
        "but model input 'x' expects float32"
    )
    with pytest.raises(RecipeError) as info:
        _feed(table, "seen", _meta("x", (None, 1)))
    assert str(info.value) == (
        "recipe.yaml: data.inputs: column 'seen' holds dates or times, not numbers (e.g. 2024-01-31T00:00:00.000000), "
        "but model input 'x' expects float32"
    )


def test_missing_list_cells_are_reported_with_their_row() -> None:
    table = pd.DataFrame({"vec": [[1.0, 2.0], None, [3.0, 4.0]]})
    with pytest.raises(RecipeError) as info:
        _feed(table, "vec", _meta("x", (None, 2)))
    assert str(info.value) == "recipe.yaml: data.inputs: column 'vec': 1 rows have no value (first at row 1)"


def test_labels_are_int64_class_indices() -> None:
    table = pd.DataFrame({"label": [2.0, 0.0, 1.0], "name": ["cat", "dog", "cat"], "gap": [1.0, np.nan, 0.0]})
    labels = labels_array(table, np.array([2, 0]), "label", recipe_file=RECIPE)
    assert labels.dtype == np.int64 and labels.tolist() == [1, 2]
    with pytest.raises(RecipeError) as info:
        labels_array(table, np.arange(3), "name", recipe_file=RECIPE)
    assert str(info.value) == "recipe.yaml: data.label: column 'name' holds 'cat'; expected integer class indices"
    with pytest.raises(RecipeError) as info:
        labels_array(table, np.arange(3), "gap", recipe_file=RECIPE)
    assert str(info.value) == (
        "recipe.yaml: data.label: column 'gap': 1 rows have no label (first at row 1); expected integer class indices"
    )


def test_boolean_labels_count_as_zero_and_one() -> None:
    table = pd.DataFrame({"is_cat": [True, False, True]})
    assert labels_array(table, np.arange(3), "is_cat", recipe_file=RECIPE).tolist() == [1, 0, 1]


def test_fractional_and_negative_labels_are_rejected() -> None:
    table = pd.DataFrame({"soft": [0.0, 0.5], "neg": [1, -1]})
    with pytest.raises(RecipeError, match=r"column 'soft' holds 0.5; expected integer class indices"):
        labels_array(table, np.arange(2), "soft", recipe_file=RECIPE)
    with pytest.raises(RecipeError, match=r"column 'neg' holds -1; expected class indices >= 0"):
        labels_array(table, np.arange(2), "neg", recipe_file=RECIPE)


def test_unknown_label_column() -> None:
    with pytest.raises(RecipeError) as info:
        labels_array(_digits(), np.arange(2), "lable", recipe_file=RECIPE)
    assert (
        str(info.value)
        == "recipe.yaml: data.label: got 'lable', expected one of ink, label, pixels (did you mean 'label'?)"
    )


def test_iter_batches_covers_every_row_once() -> None:
    feeds = {"a": np.arange(7), "b": np.arange(14).reshape(7, 2)}
    batches = list(iter_batches(feeds, 3))
    assert [len(batch["a"]) for batch in batches] == [3, 3, 1]
    np.testing.assert_array_equal(np.concatenate([batch["b"] for batch in batches]), feeds["b"])
    with pytest.raises(QbenchError, match="positive"):
        list(iter_batches(feeds, 0))
    with pytest.raises(QbenchError, match="different row counts"):
        list(iter_batches({"a": np.arange(3), "b": np.arange(4)}, 2))


def test_whole_batches_fill_the_last_one_with_its_own_rows() -> None:
    """A model with a fixed batch: every batch has that many rows; the last repeats its own rows (rows 6, 7, 6, 7)."""
    feeds = {"a": np.arange(8), "b": np.arange(16).reshape(8, 2)}
    batches = list(iter_batches(feeds, 3, whole=True))
    assert [batch["a"].tolist() for batch in batches] == [[0, 1, 2], [3, 4, 5], [6, 7, 6]]
    assert batches[2]["b"].tolist() == [[12, 13], [14, 15], [12, 13]]
    assert [batch["a"].tolist() for batch in iter_batches(feeds, 4, whole=True)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_feeds_run_through_a_real_onnx_model(tmp_path: Path) -> None:
    """Table -> feeds -> onnxruntime, against the same sum computed with numpy."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["image"], ["total"], keepdims=0, axes=[1, 2, 3])],
        "sum_pixels",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, ["batch"])],
    )
    model_path = tmp_path / "sum.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7), str(model_path))
    data_path = tmp_path / "digits.parquet"
    _digits(7).to_parquet(data_path)

    table = load_table(data_path, recipe_file=RECIPE)
    info = read_model_info(model_path)
    feeds = build_feeds(table, np.arange(7), {"pixels": "image"}, info.inputs, recipe_file=RECIPE)
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    totals = np.concatenate([session.run(None, batch)[0] for batch in iter_batches(feeds, 3)])
    expected = np.stack(table["pixels"].to_numpy()).sum(axis=1)
    np.testing.assert_allclose(totals, expected, rtol=1e-5)


def test_one_text_cell_among_number_lists_is_named_with_its_row() -> None:
    """Stacked, one text cell would make every number text: the error names that cell, not row 0's numbers."""
    table = pd.DataFrame({"x": [[0.5, 1.5], [1.0, "a"], [2.0, 3.0], ["4", "5"]]}, index=[10, 11, 12, 13])
    with pytest.raises(
        RecipeError,
        match=r"column 'x': 2 rows among numeric ones hold non-numeric values such as 'a' \(first at row 11\)",
    ):
        _feed(table, "x", _meta("x", (None, 2)))
    quoted = pd.DataFrame({"x": [[0.5, 1.5], ["4", "5"]]}, index=[0, 7])
    with pytest.raises(RecipeError, match=r"1 row among numeric ones holds numbers written as text such as '4' "
                                          r"\(first at row 7\)"):  # fmt: skip
        _feed(quoted, "x", _meta("x", (None, 2)))


def test_a_text_column_feeds_a_string_input_of_a_real_model(tmp_path: Path) -> None:
    """skl2onnx pipelines take categorical columns as tensor(string) [N, 1]: the cells go in as text, in row order."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    encode = helper.make_node(
        "LabelEncoder", ["city"], ["code"], domain="ai.onnx.ml", keys_strings=["lima", "paris", "tokyo"],
        values_int64s=[0, 1, 2], default_int64=-1,
    )  # fmt: skip
    graph = helper.make_graph(
        [encode],
        "encode_city",
        [helper.make_tensor_value_info("city", TensorProto.STRING, [None, 1])],
        [helper.make_tensor_value_info("code", TensorProto.INT64, [None, 1])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    model_path = tmp_path / "encode.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), str(model_path))
    table = pd.DataFrame({"town": ["tokyo", "lima", "paris", "rome"]})
    table.to_parquet(tmp_path / "towns.parquet")
    table = load_table(tmp_path / "towns.parquet", recipe_file=RECIPE)

    info = read_model_info(model_path)
    feeds = build_feeds(table, np.array([3, 0, 1, 2]), {"town": "city"}, info.inputs, recipe_file=RECIPE)
    assert feeds["city"].shape == (4, 1) and feeds["city"].dtype == object
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, feeds)[0].ravel(), [-1, 2, 0, 1])


def test_a_missing_or_numeric_cell_for_a_string_input_is_named_with_its_row() -> None:
    meta = _meta("city", (None, 1), "object")
    with pytest.raises(RecipeError, match=r"column 'town' holds no value at row 1; expected text for the string "
                                          r"input 'city'"):  # fmt: skip
        _feed(pd.DataFrame({"town": ["lima", None]}), "town", meta)
    with pytest.raises(RecipeError, match=r"column 'town' holds 3 at row 0; expected text for the string input 'city' "
                                          r"\(the file stores this column as numbers, '007' as 7: store"):
        _feed(pd.DataFrame({"town": [3, 4]}), "town", meta)


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint64"])
@pytest.mark.parametrize("target", ["float16", "float32", "float64"])
def test_integers_changed_by_a_float_cast_match_a_value_by_value_check(dtype: str, target: str) -> None:
    """The vectorized check agrees with casting each integer alone, at the edges too: the type's extremes (int64's
    largest rounds up to 2**63, outside int64) and odd values just past the float's exact range."""
    from qbench.data.feed_cast import _changed_by_cast

    info, dtype_, target_ = np.iinfo(dtype), np.dtype(dtype), np.dtype(target)
    exact = 2 ** (np.finfo(target_).nmant + 1)
    candidates = [info.max, info.max - 1, info.min, info.min + 1, exact + 1, exact + 2, exact * 4 + 3, -(exact + 1),
                  2**31 - 1, 2**53 + 1, 2**62 + 1, 0]  # fmt: skip
    integers = np.array([v for v in candidates if info.min <= v <= info.max and abs(v) > min(exact, 65504)], dtype_)
    with np.errstate(over="ignore"):
        expected = [not np.isfinite(target_.type(v)) or int(target_.type(v)) != v for v in integers.tolist()]
    assert _changed_by_cast(integers, target_).tolist() == expected


def test_integers_beyond_a_float16_inputs_range_are_rejected_not_fed_as_inf() -> None:
    with pytest.raises(RecipeError, match=r"column 'reading' holds 1 value beyond float16's range \(e.g. 7e\+04\)"):
        beyond = pd.DataFrame({"reading": np.array([1, 70000], dtype=np.int64)})
        _feed(beyond, "reading", _meta("x", (None,), "float16"))


def test_a_parquet_list_column_stacks_in_one_call_as_cell_by_cell(tmp_path: Path) -> None:
    """Numeric arrays of one shape are stacked whole; anything else (ragged, text, lists) goes cell by cell."""
    from qbench.data.nonfinite import cell_array, stacked_numeric_cells

    rows = np.arange(12, dtype=np.float32).reshape(6, 2)
    pd.DataFrame({"x": list(rows), "n": list(rows.astype(np.int64))}).to_parquet(tmp_path / "t.parquet")
    table = load_table(tmp_path / "t.parquet", recipe_file=RECIPE)
    for column in ("x", "n"):
        stacked = stacked_numeric_cells(table[column].to_numpy())
        expected = np.stack([cell_array(cell) for cell in table[column]])
        assert stacked is not None and stacked.dtype == expected.dtype and np.array_equal(stacked, expected)
    assert np.array_equal(_feed(table, "x", _meta("x", (None, 2))), rows)
    ragged = np.empty(2, dtype=object)
    ragged[:] = [np.zeros(2), np.zeros(3)]
    text = np.empty(2, dtype=object)
    text[:] = [np.array(["a"]), np.array(["b"])]
    lists = np.empty(2, dtype=object)
    lists[:] = [[1.0], [2.0]]
    for cells in (ragged, text, lists, np.empty(0, dtype=object)):
        assert stacked_numeric_cells(cells) is None


def test_a_scalar_model_input_is_refused_fed_or_not_naming_how_to_hold_it_constant() -> None:
    """A rank-0 input (a temperature) is one value per call: fed from a column it was given one value per row and
    failed at the first batch of 2 as 'its graph fixes a batch of 1'; unfed it was told to add a column."""
    model_inputs = {**_meta("x", (None, 64)), "t": TensorMeta("t", np.dtype("float32"), (), scalar=True)}
    expected = ("model input 't' is a scalar (shape []): one value per call, where qbench feeds a column one value per "
                "row along axis 0; expected an input with a row axis, or give 't' a default in the graph (an "
                "initializer named 't' at the value to judge")  # fmt: skip
    for inputs, field in (({"pixels": "x", "ink": "t"}, "data.inputs.ink"), ({"pixels": "x"}, "data.inputs")):
        with pytest.raises(RecipeError) as caught:
            build_feeds(_digits(), np.arange(2), inputs, model_inputs, recipe_file=RECIPE)
        assert str(caught.value).startswith(f"recipe.yaml: {field}: {expected}")


@pytest.mark.parametrize(("shape", "first"), [((None, 4, 3), "column 'x' holds cells of 1 value (shape ()), but model "
                                                "input 'x' expects shape (batch, 4, 3)"),
                                               ((None,), "column 'x' holds non-numeric values such as 'sets/row0.npy', "
                                                         "but model input 'x' expects float32")])
def test_cells_naming_numpy_files_are_named_so(tmp_path: Path, shape, first) -> None:
    """A set or point cloud saved one .npy per row, the table naming each row's file: the error named only a shape
    of () (the path fed as one text value) without saying that qbench reads no file a cell names."""
    (tmp_path / "sets").mkdir()
    for row in range(3):
        np.save(tmp_path / "sets" / f"row{row}.npy", np.full((4, 3), row, np.float32))
    pd.DataFrame({"x": [f"sets/row{row}.npy" for row in range(3)]}).to_csv(tmp_path / "rows.csv", index=False)
    with pytest.raises(RecipeError) as info:
        _feed(load_table(tmp_path / "rows.csv", recipe_file=RECIPE), "x", _meta("x", shape))
    assert str(info.value) == (
        f"recipe.yaml: data.inputs: {first}; cells such as 'sets/row0.npy' name NumPy files, which qbench does not "
        "read (it feeds the arrays the table holds): expected the arrays themselves, as a Parquet list column "
        "(np.load(path).tolist() per row) or one .npz of the stacked rows (np.savez(path, x=np.stack(arrays), "
        "label=labels))"
    )
    # the arrays themselves, as the message says, feed the input
    arrays = [np.load(tmp_path / "sets" / f"row{row}.npy") for row in range(3)]
    np.savez(tmp_path / "rows.npz", x=np.stack(arrays))
    fed = _feed(load_table(tmp_path / "rows.npz", recipe_file=RECIPE), "x", _meta("x", (None, 4, 3)))
    np.testing.assert_array_equal(fed, np.stack(arrays))


def test_a_missing_column_lists_names_with_spaces_at_an_end_quoted() -> None:
    """A spreadsheet's header ` Mean Radius ;...`: listed plainly, ' Mean Radius ' read as 'Mean Radius', which the
    recipe then named in vain."""
    table = pd.DataFrame({" Mean Radius ": [1.0, 2.0], "label": [0, 1]})
    with pytest.raises(RecipeError) as info:
        build_feeds(table, np.arange(2), {"mean_radius": "x"}, _meta("x", (None,)), recipe_file=RECIPE)
    assert str(info.value) == (
        "recipe.yaml: data.inputs: column 'mean_radius' is not in the table; expected one of ' Mean Radius ', label "
        "(did you mean ' Mean Radius '?)"
    )
