"""Searches choose on selection rows (qbench.selection_rows) and the gate judges the pick on the evaluation rows only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from test_explain import write_fragile_project

from qbench.recipe import load_recipe
from qbench.sweep import run_sweep

CALIBRATION_ROWS, EVALUATION_ROWS = 96, 200  # write_fragile_project's splits, apart by their filters


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def _recorded(monkeypatch, module):
    """Every `measure` call `module` makes: (variant name, rows fed) where `rows` was given, else the evaluation rows."""
    calls = []
    real = module.measure

    def recording(backend, built, prepared, *args, **kwargs):
        rows = kwargs.get("rows")
        if not kwargs.get("serving"):  # the sweep's own measurement of the chosen variant, on the evaluation rows
            calls.append((built.name, rows.count if rows is not None else len(prepared.evaluation_rows)))
        return real(backend, built, prepared, *args, **kwargs)

    monkeypatch.setattr(module, "measure", recording)
    return calls


def _sweep(path, **changes):
    raw = yaml.safe_load(path.read_text())
    raw.update(changes)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return run_sweep(load_recipe(path), track=False)


def test_the_int8_search_chooses_on_rows_the_gate_does_not_judge(tmp_path, monkeypatch):
    """Every candidate is screened and evaluated on the calibration rows (not evaluated); the searched variant's
    figures, which the gate judges, come from the evaluation rows alone."""
    import qbench.search.run

    calls = _recorded(monkeypatch, qbench.search.run)
    path = write_fragile_project(tmp_path, [])
    outcome = _sweep(path, search={"time_budget_s": 60, "techniques": ["ort-dynamic", "ort-static"]})
    report = outcome.results.search
    assert calls and all(rows <= CALIBRATION_ROWS for _, rows in calls)  # no candidate ran on the evaluation rows
    assert any(rows == CALIBRATION_ROWS for name, rows in calls if name != "fp32")  # evaluated on every selection row
    assert report.selection_rows == CALIBRATION_ROWS
    assert report.notes[0].startswith(f"chosen on {CALIBRATION_ROWS} calibration rows not evaluated")
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
    assert tries and set(tries) == {CALIBRATION_ROWS}
    result = outcome.results.find("int8-auto", "onnxruntime-cpu")
    assert result.params["search.chosen_on"] == "selection" and result.accuracy.rows == EVALUATION_ROWS
    assert any(note.startswith(f"chosen on {CALIBRATION_ROWS} calibration rows") for note in result.notes)


def test_without_rows_apart_from_the_evaluation_the_choice_and_the_gate_say_so(tmp_path):
    """Calibration rows that are all evaluated (overlap: allow, one filter): nothing is left to choose on, so the
    search chooses on the evaluation rows, and the report, the variant and the gate say the pass is optimistic."""
    path = write_fragile_project(tmp_path, [], fragile=())
    raw = yaml.safe_load(path.read_text())
    raw["data"]["calibration"] = {"filter": {"split": "eval"}, "samples": 64, "overlap": "allow"}
    outcome = _sweep(path, data=raw["data"], search={"time_budget_s": 60, "techniques": ["ort-dynamic"]})
    report = outcome.results.search
    assert report.selection_rows is None and "also judge it" in report.notes[0]
    variant = outcome.results.find("int8-search", "onnxruntime-cpu")
    assert variant.params["search.chosen_on"] == "evaluation"
    assert any(note.startswith("int8-search@onnxruntime-cpu was chosen among candidates on the evaluation rows")
               for note in outcome.gate.notes)  # fmt: skip


def test_selection_rows_leave_out_evaluated_rows_and_keep_labels_and_slices():
    import pandas as pd

    from qbench.modelinfo import TensorMeta
    from qbench.recipe_data import DataSpec
    from qbench.selection_rows import selection_rows

    table = pd.DataFrame({"x": list(np.arange(12, dtype=np.float32).reshape(6, 2)), "label": [0, 1, 0, 1, 0, 1],
                          "kind": ["a", "a", "b", "b", "a", "b"]})  # fmt: skip
    data = DataSpec.model_validate({"path": "t.parquet", "inputs": {"x": "x"}, "label": "label", "slices": [{"by": "kind"}]})
    meta = {"x": TensorMeta(name="x", dtype=np.dtype("float32"), shape=(None, 2))}
    got = selection_rows(data, table, np.array([5, 0, 2, 3]), np.array([2, 4]), judged=["kind=b"], model_inputs=meta,
                         labels=lambda t, rows: t["label"].to_numpy()[rows], recipe_file=Path("r.yaml"))  # fmt: skip
    assert got is not None and got.count == 3 and got.labels.tolist() == [0, 1, 1]
    assert got.feeds["x"][:, 0].tolist() == [0, 6, 10] and got.slices == {"kind=b": got.slices["kind=b"]} and got.slices["kind=b"].tolist() == [False, True, True]
    assert selection_rows(data, table, np.array([2, 4]), np.array([2, 4]), judged=[], model_inputs=meta, labels=lambda t, r: None,
                          recipe_file=Path("r.yaml")) is None  # fmt: skip
