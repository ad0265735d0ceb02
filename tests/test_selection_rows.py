"""Searches choose on selection rows (qbench.selection_rows) and the gate judges the pick on the evaluation rows
only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from qbench.recipe.spec import load_recipe
from qbench.sweep.runner import run_sweep
from tests.explain.test_sensitivity import SEARCH_BUDGET_S, write_fragile_project

CALIBRATION_ROWS, EVALUATION_ROWS = 96, 200  # write_fragile_project's splits, apart by their filters
# no row is left beyond the two splits, so half the calibration sample is kept apart from fitting to choose on
SELECTION_ROWS = FITTED_ROWS = CALIBRATION_ROWS // 2


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def _recorded(monkeypatch, module):
    """Every `measure` call `module` makes: (variant name, rows fed) where `rows` was given, else the evaluation
    rows."""
    calls = []
    real = module.measure

    def recording(backend, built, prepared, *args, **kwargs):
        rows = kwargs.get("rows")
        if not kwargs.get("serving"):  # the sweep's own measurement of the chosen variant, on the evaluation rows
            calls.append((built.name, rows.count if rows is not None else len(prepared.evaluation_rows)))
        return real(backend, built, prepared, *args, **kwargs)

    monkeypatch.setattr(module, "measure", recording)
    return calls


def _changed(path, **changes):
    raw = yaml.safe_load(path.read_text())
    raw.update(changes)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_recipe(path)


def _sweep(path, **changes):
    return run_sweep(_changed(path, **changes), track=False)


def test_the_int8_search_chooses_on_rows_the_gate_does_not_judge(tmp_path, monkeypatch):
    """Every candidate is screened and evaluated on selection rows (not evaluated, not calibrated on); the searched
    variant's figures, which the gate judges, come from the evaluation rows alone."""
    import qbench.search.run

    calls = _recorded(monkeypatch, qbench.search.run)
    path = write_fragile_project(tmp_path, [])
    outcome = _sweep(path, search={"time_budget_s": SEARCH_BUDGET_S, "techniques": ["ort-dynamic", "ort-static"]})
    report = outcome.results.search
    assert calls and all(rows <= CALIBRATION_ROWS for _, rows in calls)  # no candidate ran on the evaluation rows
    assert any(rows == SELECTION_ROWS for name, rows in calls if name != "fp32")  # evaluated on every selection row
    assert report.selection_rows == SELECTION_ROWS
    assert report.notes[0].startswith(f"chosen on {SELECTION_ROWS} rows no candidate "
                                      "was calibrated on and none evaluated")
    assert (outcome.results.calibration.size, outcome.results.calibration.selection_rows) == (FITTED_ROWS, SELECTION_ROWS)
    variant = outcome.results.find("int8-search", "onnxruntime-cpu")
    assert variant.params["search.chosen_on"] == "selection" and variant.accuracy.rows == EVALUATION_ROWS
    assert not any("chosen among candidates" in note for note in outcome.gate.notes)


def test_calibrator_auto_and_fallback_choose_on_rows_the_gate_does_not_judge(tmp_path, monkeypatch):
    import qbench.execute.jobs

    calls = _recorded(monkeypatch, qbench.execute.jobs)
    variant = {"name": "int8-auto", "precision": "int8", "calibrator": "auto", "op_types": ["MatMul"],
               "fallback": {"max_excluded": 2}}  # fmt: skip
    outcome = _sweep(write_fragile_project(tmp_path, [variant]))
    tries = [rows for name, rows in calls if name.startswith("int8-auto")]
    assert tries and set(tries) == {SELECTION_ROWS}
    result = outcome.results.find("int8-auto", "onnxruntime-cpu")
    assert result.params["search.chosen_on"] == "selection" and result.accuracy.rows == EVALUATION_ROWS
    assert any(note.startswith(f"chosen on {SELECTION_ROWS} rows no candidate") for note in result.notes)
    fitted = 0 if result.params["calibrator"] == "dynamic" else FITTED_ROWS  # built as screened: on the rows fitted on
    assert result.params["calibration_rows"] == fitted
    assert result.params["search.selection_rows"] == SELECTION_ROWS


def test_without_rows_apart_from_the_evaluation_the_choice_and_the_gate_say_so(tmp_path):
    """Calibration rows that are all evaluated (overlap: allow, one filter): nothing is left to choose on, so the
    search chooses on the evaluation rows, and the report, the variant and the gate say the pass is optimistic."""
    path = write_fragile_project(tmp_path, [], fragile=())
    raw = yaml.safe_load(path.read_text())
    raw["data"]["calibration"] = {"filter": {"split": "eval"}, "samples": 64, "overlap": "allow"}
    # the pick loses 2 of the 200 rows, a pass its upper bound does not resolve: noted, so that the verdict has notes
    gate = {**raw["gate"], "unresolved": "note"}
    search = {"time_budget_s": SEARCH_BUDGET_S, "techniques": ["ort-dynamic"]}
    outcome = _sweep(path, data=raw["data"], search=search, gate=gate)
    report = outcome.results.search
    assert report.selection_rows is None and "also judge it" in report.notes[0]
    variant = outcome.results.find("int8-search", "onnxruntime-cpu")
    assert variant.params["search.chosen_on"] == "evaluation"
    assert any(note.startswith("int8-search@onnxruntime-cpu was chosen among candidates on the evaluation rows")
               for note in outcome.gate.notes)  # fmt: skip


def _rows(feeds):
    return {row.tobytes() for row in np.concatenate([batch["x"] for batch in feeds])}


def test_candidates_are_chosen_on_rows_no_candidate_was_calibrated_on(tmp_path):
    """A static candidate screened on its own calibration rows looks better than on fresh rows (MinMax covers
    exactly their extremes), which dynamic candidates never saw: no selection row is a row calibrated on."""
    from qbench.preflight.prepare import prepare

    path = write_fragile_project(tmp_path, [])
    search = {"time_budget_s": SEARCH_BUDGET_S, "techniques": ["ort-static"]}
    prepared = prepare(_changed(path, search=search), track=False)
    fitted, selected = _rows(prepared.calibration_batches), _rows([prepared.selection.feeds])
    assert len(fitted) == FITTED_ROWS and len(selected) == SELECTION_ROWS and not fitted & selected
    assert prepared.selection.from_sample == SELECTION_ROWS


def test_rows_left_out_only_by_the_evaluation_limit_choose_and_the_sample_stays_whole(tmp_path):
    """Rows the evaluation filter selects but its limit leaves out are neither evaluated nor calibrated on: the
    candidates are chosen on them, and every drawn calibration row is still fitted on."""
    from qbench.preflight.prepare import prepare

    path = write_fragile_project(tmp_path, [{"name": "int8-auto", "precision": "int8", "calibrator": "auto"}])
    raw = yaml.safe_load(path.read_text())
    raw["data"]["evaluation"]["limit"] = 120
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    prepared = prepare(load_recipe(path), track=False)
    beyond = EVALUATION_ROWS - 120
    assert prepared.selection.count == beyond and prepared.selection.from_sample == 0
    assert (prepared.calibration.size, prepared.calibration.selection_rows) == (CALIBRATION_ROWS, beyond)
    assert not _rows(prepared.calibration_batches) & _rows([prepared.selection.feeds])
    assert not _rows([prepared.evaluation_feeds]) & _rows([prepared.selection.feeds])


def test_split_calibration_takes_the_pool_first_then_half_the_sample_seeded_and_by_slice():
    from qbench.selection_rows import split_calibration

    drawn, evaluated = np.arange(0, 40), np.arange(60, 100)
    masks = {"a": np.arange(100) % 4 == 0}
    thin = split_calibration(drawn, np.arange(40, 45), evaluated, masks, seed=3)  # 5 spare rows: 15 from the sample
    assert len(thin.selection) == 20 and thin.from_sample == 15 and len(thin.fitted) == 25
    assert not np.intersect1d(thin.fitted, thin.selection).size and set(range(40, 45)) <= set(thin.selection)
    assert not np.intersect1d(thin.selection, evaluated).size
    assert masks["a"][np.setdiff1d(thin.selection, np.arange(40, 45))].sum() == round(15 * 10 / 40)  # a's share
    again = split_calibration(drawn, np.arange(40, 45), evaluated, masks, seed=3)
    other = split_calibration(drawn, np.arange(40, 45), evaluated, masks, seed=4)
    assert np.array_equal(again.selection, thin.selection) and not np.array_equal(other.selection, thin.selection)
    wide = split_calibration(drawn, np.arange(0, 60), evaluated, masks, seed=3)  # the pool holds enough
    assert np.array_equal(wide.fitted, drawn) and np.array_equal(wide.selection, np.arange(40, 60))
    assert wide.from_sample == 0


def test_split_calibration_with_groups_chooses_on_whole_groups():
    """With data.calibration.group_by, the selection rows drawn from the pool and those kept apart from the sample
    are whole groups (queries), so a metric over groups chooses on whole queries."""
    from qbench.selection_rows import split_calibration

    groups = np.repeat(np.arange(50), 10)  # 50 queries of 10 rows; 0-99 drawn, 400-499 evaluated
    masks = {"a": groups % 3 == 0}
    wide = split_calibration(np.arange(100), np.arange(100, 400), np.arange(400, 500), masks, seed=3, groups=groups)
    assert 200 <= len(wide.selection) <= 256 and np.array_equal(wide.fitted, np.arange(100))  # from the pool alone
    thin = split_calibration(np.arange(100), np.arange(100, 130), np.arange(400, 500), masks, seed=3, groups=groups)
    assert set(range(100, 130)) <= set(thin.selection) and thin.from_sample == 20  # 2 queries kept apart from fitting
    for rows in (wide.selection, thin.selection, thin.fitted):
        assert (np.bincount(groups[rows]) % 10 == 0).all()  # each query all in, or all out
    plain = split_calibration(np.arange(100), np.arange(100, 400), np.arange(400, 500), masks, seed=3)
    assert (np.bincount(groups[plain.selection]) % 10 != 0).any()  # row by row, queries are split


def test_selection_rows_keep_labels_and_slices():
    import pandas as pd

    from qbench.modelinfo.signature import TensorMeta
    from qbench.recipe.data import DataSpec
    from qbench.selection_rows import CalibrationSplit, selection_rows

    table = pd.DataFrame({"x": list(np.arange(12, dtype=np.float32).reshape(6, 2)), "label": [0, 1, 0, 1, 0, 1],
                          "kind": ["a", "a", "b", "b", "a", "b"]})  # fmt: skip
    data = DataSpec.model_validate({"path": "t.parquet", "inputs": {"x": "x"}, "label": "label",
                                    "slices": [{"by": "kind"}]})  # fmt: skip
    meta = {"x": TensorMeta(name="x", dtype=np.dtype("float32"), shape=(None, 2))}
    split = CalibrationSplit(np.array([1]), np.array([0, 3, 5]), 2)
    got = selection_rows(data, table, split, {}, judged=["kind=b"], model_inputs=meta,
                         labels=lambda t, rows: t["label"].to_numpy()[rows], recipe_file=Path("r.yaml"))  # fmt: skip
    assert got is not None and got.count == 3 and got.labels.tolist() == [0, 1, 1] and got.from_sample == 2
    assert got.feeds["x"][:, 0].tolist() == [0, 6, 10] and list(got.slices) == ["kind=b"]
    assert got.slices["kind=b"].tolist() == [False, True, True]
    empty = CalibrationSplit(np.array([2, 4]), np.array([], dtype=np.int64), 0)
    assert selection_rows(data, table, empty, {}, judged=[], model_inputs=meta, labels=lambda t, r: None,
                          recipe_file=Path("r.yaml")) is None  # fmt: skip


def _nan_table():
    import pandas as pd

    x = np.arange(24, dtype=np.float32).reshape(12, 2)
    x[[2, 5, 7], 1] = np.nan
    return pd.DataFrame({"x": list(x), "label": [0, 1] * 6})


def test_under_keep_the_selection_rows_judge_the_missing_slices_the_gate_judges():
    """`data.nonfinite_inputs: keep` makes a `missing:<column>` slice the gate judges; the candidates are chosen on
    it too, with the same rows in it."""
    from qbench.data import nonfinite_masks
    from qbench.modelinfo.signature import TensorMeta
    from qbench.recipe.data import DataSpec
    from qbench.selection_rows import CalibrationSplit, selection_rows

    table = _nan_table()
    data = DataSpec.model_validate({"path": "t.parquet", "inputs": {"x": "x"}, "label": "label",
                                    "nonfinite_inputs": "keep"})  # fmt: skip
    meta = {"x": TensorMeta(name="x", dtype=np.dtype("float32"), shape=(None, 2))}
    rows = np.array([1, 2, 4, 5, 9])
    got = selection_rows(data, table, CalibrationSplit(np.array([0]), rows, 0), nonfinite_masks(table, data.inputs),
                         judged=["missing:x"], model_inputs=meta,
                         labels=lambda t, r: t["label"].to_numpy()[r], recipe_file=Path("r.yaml"))  # fmt: skip
    assert got is not None and list(got.slices) == ["missing:x"]
    assert got.slices["missing:x"].tolist() == nonfinite_masks(table, data.inputs)["x"][rows].tolist()
    assert got.slices["missing:x"].sum() == 2 and np.isnan(got.feeds["x"][got.slices["missing:x"]]).any(axis=1).all()


def test_under_error_no_row_with_nan_inputs_is_chosen_on():
    """Rows holding NaN/inf that are neither evaluated nor calibrated on are never refused under `error`: nor are they
    fed to the candidates as selection rows."""
    from types import SimpleNamespace

    from qbench.data import nonfinite_masks
    from qbench.recipe.data import DataSpec
    from qbench.selection_rows import calibration_split

    table = _nan_table()
    for policy in ("error", "drop", "keep"):
        data = DataSpec.model_validate({"path": "t.parquet", "inputs": {"x": "x"}, "label": "label",
                                        "nonfinite_inputs": policy})  # fmt: skip
        recipe = SimpleNamespace(search=object(), variants=[], data=data, source=Path("r.yaml"))
        nonfinite = nonfinite_masks(table, data.inputs)
        split = calibration_split(recipe, table, np.array([0, 1]), nonfinite, None)
        chosen_nan = np.isin(split.selection, [2, 5, 7]).sum()
        assert len(split.selection) and (chosen_nan == 3 if policy == "keep" else chosen_nan == 0), policy


def test_under_error_no_row_past_the_evaluation_limit_with_nan_inputs_is_chosen_on():
    """The rows an evaluation limit leaves out join the selection pool; under `error` a row among them holding NaN was
    chosen on (fed to every candidate) though no check had seen it: only the calibration candidates were cleaned."""
    from types import SimpleNamespace

    from qbench.data import nonfinite_masks
    from qbench.data.evaluation import EvaluationRows
    from qbench.recipe.data import DataSpec
    from qbench.selection_rows import calibration_split

    table = _nan_table()
    data = DataSpec.model_validate({"path": "t.parquet", "inputs": {"x": "x"}, "label": "label",
                                    "calibration": {"filter": {"label": 0}}})  # fmt: skip
    recipe = SimpleNamespace(search=object(), variants=[], data=data, source=Path("r.yaml"))
    nonfinite = nonfinite_masks(table, data.inputs)
    odd = np.arange(1, 12, 2)  # rows 5 and 7 (NaN) are evaluation rows past a limit of 2
    evaluation = EvaluationRows(rows=odd[:2], masks={}, nonfinite=nonfinite, dropped={}, left_out=0, held_out=0,
                                beyond_limit=odd[2:])  # fmt: skip
    split = calibration_split(recipe, table, np.array([0, 4]), nonfinite, evaluation)
    assert set(split.selection) >= {9, 11} and not np.isin(split.selection, [2, 5, 7]).any()


def test_selection_rows_read_the_missing_slices_from_the_masks_given_without_scanning_the_table_again(monkeypatch):
    """The table's NaN/inf scan is done once (preflight); building the selection rows reuses it."""
    import qbench.data.nonfinite as nonfinite
    from qbench.modelinfo.signature import TensorMeta
    from qbench.recipe.data import DataSpec
    from qbench.selection_rows import CalibrationSplit, selection_rows

    table = _nan_table()
    data = DataSpec.model_validate({"path": "t.parquet", "inputs": {"x": "x"}, "label": "label",
                                    "nonfinite_inputs": "keep"})  # fmt: skip
    meta = {"x": TensorMeta(name="x", dtype=np.dtype("float32"), shape=(None, 2))}
    masks = nonfinite.nonfinite_masks(table, data.inputs)
    scans = []
    monkeypatch.setattr(nonfinite, "_nonfinite_cells", lambda values: scans.append(values.name))
    rows = np.array([1, 2, 4, 5, 9])
    got = selection_rows(data, table, CalibrationSplit(np.array([0]), rows, 0), masks, judged=["missing:x"],
                         model_inputs=meta, labels=lambda t, r: t["label"].to_numpy()[r], recipe_file=Path("r.yaml"))
    assert got is not None and got.slices["missing:x"].tolist() == masks["x"][rows].tolist() and scans == []


def test_calibration_rows_without_labels_are_not_recorded_as_the_rows_chosen_on(tmp_path, caplog):
    """A labelled evaluation table and a calibration file without the label column: the candidates could not be
    judged on the calibration rows kept apart, so `calibrator: auto` chose on the evaluation rows (and said so), yet
    results' calibration.selection_rows and the report said 48 other rows had chosen. The record says 0, a warning
    says why, and the gate says the pass is optimistic."""
    import logging

    import pandas as pd

    path = write_fragile_project(tmp_path, [{"name": "int8-auto", "precision": "int8", "calibrator": "auto"}])
    table = pd.read_parquet(tmp_path / "data.parquet")
    table["y"] = np.arange(len(table)) % 4
    table.to_parquet(tmp_path / "data.parquet")
    table[table.split == "calib"][["x"]].to_parquet(tmp_path / "calib.parquet")
    raw = yaml.safe_load(path.read_text())
    raw["data"] |= {"label": "y", "calibration": {"path": "calib.parquet", "samples": 96}}
    with caplog.at_level(logging.WARNING):
        outcome = _sweep(path, data=raw["data"])
    assert (outcome.results.calibration.selection_rows, outcome.results.calibration.selection_from_sample) == (0, 0)
    assert "candidates are chosen on the evaluation rows, not on the" in caplog.text and "label" in caplog.text
    result = outcome.results.find("int8-auto", "onnxruntime-cpu")
    assert result.params["search.chosen_on"] == "evaluation"
    assert any("was chosen among candidates on the evaluation rows" in note for note in outcome.gate.notes)


def test_a_judged_slice_none_of_the_selection_rows_fall_in_is_named_where_the_choice_is():
    """The gate judges kind=a and kind=b; the selection rows hold kind=b only: kind=a is `unjudged`, and the words
    every record of the choice carries (`chosen_on`) say so. A slice they do hold is not named."""
    import pandas as pd

    from qbench.modelinfo.signature import TensorMeta
    from qbench.recipe.data import DataSpec
    from qbench.selection_rows import CalibrationSplit, chosen_on, selection_rows

    table = pd.DataFrame({"x": list(np.arange(12, dtype=np.float32).reshape(6, 2)), "label": [0, 1, 0, 1, 0, 1],
                          "kind": ["a", "a", "b", "b", "a", "b"]})  # fmt: skip
    data = DataSpec.model_validate({"path": "t.parquet", "inputs": {"x": "x"}, "label": "label",
                                    "slices": [{"by": "kind"}]})  # fmt: skip
    meta = {"x": TensorMeta(name="x", dtype=np.dtype("float32"), shape=(None, 2))}
    got = selection_rows(data, table, CalibrationSplit(np.array([0]), np.array([2, 3, 5]), 0), {},
                         judged=["kind=a", "kind=b"], model_inputs=meta,
                         labels=lambda t, rows: t["label"].to_numpy()[rows],
                         recipe_file=Path("r.yaml"))  # fmt: skip
    assert got is not None and list(got.slices) == ["kind=b"] and got.unjudged == ("kind=a",)
    said = chosen_on(got, 100)
    assert "none of them in kind=a (the choice could not weigh a candidate there)" in said and "kind=b" not in said
    small = chosen_on(got, 100, ["kind=b"])
    assert "none of them in kind=a and fewer than gate.min_slice_size of them in kind=b (the choice could" in small
