"""Rows fitted on and judged on: the evaluation rows hold out the calibration sample, and rows are matched by the
inputs they feed (qbench.data.evaluation, qbench.data.leakage, qbench.preflight)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from qbench.data import evaluation_rows
from qbench.data.evaluation import calibration_sample
from qbench.data.leakage import row_digests, shared_rows
from qbench.errors import RecipeError
from qbench.preflight.prepare import prepare
from qbench.recipe.data import DataSpec
from qbench.recipe.spec import load_recipe

RECIPE = Path("recipe.yaml")


def _table(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    return pd.DataFrame({"x": list(x), "part": ["a" if i % 2 else "b" for i in range(rows)]})


def _data(**sections) -> DataSpec:
    return DataSpec(path=Path("d.parquet"), inputs={"x": "x"}, **sections)


def test_one_table_without_filters_evaluates_only_rows_it_did_not_calibrate_on():
    table = _table(120)
    data = _data(calibration={"samples": 40, "seed": 3})
    evaluated = evaluation_rows(table, data, recipe_file=RECIPE, calibrated=True)
    calibration, _, _ = calibration_sample(table, data, evaluated.nonfinite, recipe_file=RECIPE)
    assert len(calibration) == 40
    assert np.intersect1d(evaluated.rows, calibration).size == 0
    assert len(evaluated.rows) == 80 and evaluated.held_out == 40


def test_filters_that_overlap_partly_hold_out_only_the_shared_rows_and_limit_counts_after():
    table = _table(100)
    data = _data(calibration={"filter": {"part": "a"}, "samples": 20}, evaluation={"limit": 60})
    evaluated = evaluation_rows(table, data, recipe_file=RECIPE, calibrated=True)
    assert evaluated.held_out == 20
    assert len(evaluated.rows) == 60  # the limit is filled from rows not calibrated on
    calibration, _, _ = calibration_sample(table, data, evaluated.nonfinite, recipe_file=RECIPE)
    assert np.intersect1d(evaluated.rows, calibration).size == 0


def test_overlap_allow_and_recipes_without_calibrated_variants_keep_every_evaluation_row():
    table = _table(50)
    assert len(evaluation_rows(table, _data(calibration={"samples": 10, "overlap": "allow"}), recipe_file=RECIPE,
                               calibrated=True).rows) == 50  # fmt: skip
    assert len(evaluation_rows(table, _data(calibration={"samples": 10}), recipe_file=RECIPE, calibrated=False).rows) == 50


def test_at_most_half_the_candidates_are_drawn_where_they_are_evaluation_rows_too():
    table = _table(30)
    evaluated = evaluation_rows(table, _data(), recipe_file=RECIPE, calibrated=True)  # samples 256 by default
    assert evaluated.held_out == 15 and len(evaluated.rows) == 15
    calibration, _, _ = calibration_sample(table, _data(), evaluated.nonfinite, recipe_file=RECIPE, hold_out=True)
    assert len(calibration) == 15 and np.intersect1d(evaluated.rows, calibration).size == 0
    separate = _data(calibration={"filter": {"part": "a"}}, evaluation={"filter": {"part": "b"}})
    assert len(calibration_sample(table, separate, {}, recipe_file=RECIPE, hold_out=True)[0]) == 15  # all of part a


def test_a_calibration_sample_taking_every_evaluation_row_is_refused():
    table = _table(30).assign(only=lambda t: np.arange(len(t)) == 0)  # one evaluation row: row 0
    seed = next(seed for seed in range(100) if 0 in calibration_sample(
        table, _data(calibration={"seed": seed}), {}, recipe_file=RECIPE, hold_out=True)[0])  # fmt: skip
    data = _data(calibration={"seed": seed}, evaluation={"filter": {"only": True}})
    with pytest.raises(RecipeError, match=r"data\.calibration: every one of the 1 evaluation rows"):
        evaluation_rows(table, data, recipe_file=RECIPE, calibrated=True)


def test_shared_rows_finds_the_same_inputs_across_tables_whatever_the_cell_type():
    table = _table(20)
    copy = pd.DataFrame({"x": [cell.astype(np.float64).tolist() for cell in table["x"]][5:12]})
    # rows 8..11
    assert shared_rows(copy, np.arange(len(copy)), row_digests(table, np.arange(8, 20), ["x"]), ["x"]) == 4
    assert shared_rows(table, np.arange(8), row_digests(table, np.arange(8, 20), ["x"]), ["x"]) == 0


def test_whole_columns_and_cell_by_cell_encode_alike(monkeypatch):
    """A column of numbers or same-shaped arrays is digested whole, any other cell by cell: one encoding."""
    from qbench.data import leakage

    cells: list[object] = []
    cell = leakage._cell
    monkeypatch.setattr(leakage, "_cell", lambda value: cells.append(value) or cell(value))
    whole = pd.DataFrame({"x": [np.array([1.0, 2.5], np.float32), np.array([np.nan, -0.0], np.float32),
                                np.array([3.0, 4.0], np.float32)],
                          "n": np.array([7, 8, 9], np.int32), "s": ["a", "b", "c"]})  # fmt: skip
    assert len(set(leakage.row_digests(whole, np.arange(3), ["x", "n"]))) == 3 and cells == []  # no cell at a time
    # the same inputs as Python lists and numbers, a ragged column beside them: encoded a cell at a time
    mixed = pd.DataFrame({"x": [[1, 2.5], [float("nan"), -0.0], [3, 4, 5], [0.0, 0.0]],
                          "n": pd.Series([7, 8, 9, 9], dtype=object), "s": ["a", "b", "c", "d"]})  # fmt: skip
    # rows 0 and 1
    assert shared_rows(mixed, np.arange(4), row_digests(whole, np.arange(3), ["x", "n", "s"]), ["x", "n", "s"]) == 2
    assert len(cells) > 0
    # kind still tells cells apart, an integer 7 from 7.0; a zero's sign does not: 0.0 and -0.0 are one input
    floats = pd.DataFrame({"x": [np.array([np.nan, 0.0])], "n": [7.0]})
    assert shared_rows(floats, np.arange(1), row_digests(whole, np.arange(3), ["x"]), ["x"]) == 1
    assert shared_rows(floats, np.arange(1), row_digests(whole, np.arange(3), ["n"]), ["n"]) == 0
    words = pd.DataFrame({"t": [np.array(["a", "b"]), ("a", "b"), ["a", "c"]]})
    # an array, a tuple and a list of strings alike
    assert len(set(leakage.row_digests(words, np.arange(3), ["t"]))) == 2


def _project(root: Path, calibration: dict, calibrator: str = "minmax") -> Path:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])], [weight])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(root / "m.onnx"))
    table = _table(90)
    table.to_parquet(root / "d.parquet")
    table.to_parquet(root / "copy.parquet")
    recipe = {"name": "leak", "task": "classification", "model": {"path": "m.onnx"},
              "data": {"path": "d.parquet", "inputs": {"x": "x"}, "calibration": {"samples": 30, **calibration}},
              "variants": [{"name": "int8", "precision": "int8", "calibrator": calibrator}]}  # fmt: skip
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return root / "recipe.yaml"


def test_a_sweep_of_one_table_records_the_rows_held_out(tmp_path: Path):
    prepared = prepare(load_recipe(_project(tmp_path, {})), track=False, destinations=False, backends=False)
    assert len(prepared.evaluation_rows) == 60
    assert (prepared.calibration.overlap, prepared.calibration.held_out_rows) == ("hold_out", 30)
    assert prepared.calibration.evaluation_overlap_rows == 0 == prepared.calibration_overlap


def test_a_calibration_file_copying_the_data_is_counted_and_warned_about(tmp_path: Path, caplog):
    with caplog.at_level(logging.WARNING):
        prepared = prepare(load_recipe(_project(tmp_path, {"path": "copy.parquet"})), track=False,
                           destinations=False, backends=False)  # fmt: skip
    assert len(prepared.evaluation_rows) == 90  # another file: nothing is held out by position
    assert prepared.calibration.evaluation_overlap_rows == 30 == prepared.calibration_overlap
    assert "30 of the 30 calibration rows feed the model what evaluation rows feed it" in caplog.text
    assert prepared.calibration.selection_overlap_rows is None  # nothing is chosen among candidates


def test_selection_rows_copying_evaluation_inputs_are_counted_and_warned_about(tmp_path: Path, caplog):
    """calibrator: auto chooses on the calibration file's rows not drawn; that file copying the data, every one of
    them is an evaluation input: the choice was said to be made on rows none of which are evaluated."""
    with caplog.at_level(logging.WARNING):
        prepared = prepare(load_recipe(_project(tmp_path, {"path": "copy.parquet"}, calibrator="auto")), track=False,
                           destinations=False, backends=False)  # fmt: skip
    selected = prepared.calibration.selection_rows
    assert selected and prepared.calibration.selection_overlap_rows == selected
    assert f"{selected} of the {selected} selection rows feed the model what evaluation rows feed it" in caplog.text


def test_row_digests_hold_memory_of_a_block_of_rows_not_of_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The digests of every evaluation row widened the whole input column to float64 (twice) and kept every row's
    encoding at once: on a million rows of 64 floats the sweep peaked at 2.3 GB there, 1.4 GB reading the table."""
    import tracemalloc

    from qbench.data import leakage

    rows = 100_000
    features = np.random.default_rng(0).normal(size=(rows, 64)).astype(np.float32)
    table = pd.DataFrame({"x": list(features), "y": np.arange(rows) % 7})
    tracemalloc.start()
    try:
        digests = leakage.row_digests(table, np.arange(rows), ["x", "y"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * features.nbytes  # the digests themselves and one block; the widened column alone is 2x
    monkeypatch.setattr(leakage, "_BLOCK_ROWS", rows)  # one block: the encodings do not depend on the blocks
    assert np.array_equal(leakage.row_digests(table, np.arange(rows), ["x", "y"]), digests)


def test_a_table_of_many_scalar_feature_columns_is_digested_a_byte_row_per_table_row_as_before() -> None:
    """Warehouse exports hold one column per feature: 200,000 rows x 100 float columns spent about 17 of the
    sweep's 20 s of preparation building 20 million cell encodings per pass. Each block's numeric columns now form
    one byte row per table row (8.9 s instead of 19.6 s, measured side by side), hashed exactly as each cell's
    encoding joined was."""
    import hashlib

    from qbench.data import leakage

    features = np.random.default_rng(0).normal(size=(20, 100))
    wide = pd.DataFrame(features, columns=[f"f {i}" for i in range(100)])
    wide["n"] = np.arange(len(wide)) % 7
    # the encoding is unchanged: each cell's kind, shape and bytes, each followed by a zero byte
    cells = b"".join(b"f()" + struct + b"\0" for struct in (np.float64(v).tobytes() for v in features[3]))
    expected = hashlib.sha256(cells + b"i()" + np.int64(3).tobytes() + b"\0").digest()
    assert leakage._digests(wide, np.array([3]), list(wide.columns)) == [expected]
    mixed = wide.assign(s=["a"] * len(wide))  # a text column beside them: the cells joined one row at a time
    assert leakage._digests(mixed, np.array([3]), [*wide.columns, "s"]) == [
        hashlib.sha256(cells + b"i()" + np.int64(3).tobytes() + b"\0" + b"r'a'\0").digest()]


@pytest.mark.parametrize("column,cells,expected", [
    ("x", lambda rng: list(rng.normal(size=(30, 5)).astype(np.float32)), "column 'x' holds cells of 5 values"),
    ("x", lambda rng: [f"v{i}" for i in range(30)], "column 'x' holds"),
    ("features", lambda rng: list(rng.normal(size=(30, 4)).astype(np.float32)), "column 'x' is not in other.parquet"),
])  # fmt: skip
def test_a_calibration_file_whose_cells_do_not_fit_the_model_is_named(tmp_path: Path, column, cells, expected):
    """A calibration file exported apart from the evaluation table, with 5 features where the model (and data.path)
    has 4, text where it has numbers, or its column named otherwise: the error named data.inputs alone, as if
    data.path's column were wrong, and not the file at fault."""
    recipe = _project(tmp_path, {"path": "other.parquet"})
    pd.DataFrame({column: cells(np.random.default_rng(2))}).to_parquet(tmp_path / "other.parquet")
    with pytest.raises(RecipeError) as raised:
        prepare(load_recipe(recipe), track=False, destinations=False, backends=False)
    assert raised.value.field == "data.calibration.path"
    assert raised.value.detail.startswith("other.parquet: data.inputs: " + expected)
