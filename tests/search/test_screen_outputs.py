"""The search takes the screening rows' outputs instead of running those rows again, with the same verdicts."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

from qbench.recipe.spec import load_recipe
from qbench.search import run as search_run
from qbench.search.screen import ScreenOutputs
from qbench.sweep.runner import run_sweep
from qbench.validate import measure as measure_module
from qbench.validate.outputs import row_count
from tests.explain.test_sensitivity import SEARCH_BUDGET_S, write_fragile_project


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def _search(root, monkeypatch, *, reuse):
    """The fragile project's search (ORT dynamic: its rows follow their batch; ORT static: they do not), timings
    fixed by the candidate's name; returns its report and the rows the model was run on for outputs."""
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(root / "cache"))  # its own build store: no stored search served
    monkeypatch.setattr(ScreenOutputs, "enabled", reuse)
    rows = []
    real_run = measure_module.run_outputs

    def counted(runner, feeds, *args, **kwargs):
        rows.append(row_count(feeds))
        return real_run(runner, feeds, *args, **kwargs)

    monkeypatch.setattr(measure_module, "run_outputs", counted)
    # deterministic speed-ups: FP32 at 4 ms, each candidate by its variant name's number
    monkeypatch.setattr(search_run, "p50s", lambda result: {1: 4.0 if result.variant == "fp32" else
                                                           1.0 + len(result.variant) % 3, 8: 4.0})  # fmt: skip
    path = write_fragile_project(root, [])
    raw = yaml.safe_load(path.read_text())
    # 16 screening rows of the 48 selection rows: an evaluation takes some rows and runs the others
    raw["search"] = {"time_budget_s": SEARCH_BUDGET_S, "techniques": ["ort-dynamic", "ort-static"], "screen_rows": 16}
    raw["gate"]["unresolved"] = "note"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    report = run_sweep(load_recipe(path), track=False).results.search
    timed = [dataclasses.replace(c, build_seconds=None) for c in report.candidates]
    notes = tuple(re.sub(r"[\d.]+ s\)", "s)", note) for note in report.notes)  # the keep-float ranking's seconds
    return dataclasses.replace(report, seconds=0.0, candidates=tuple(timed), notes=notes), sum(rows)


def test_taking_screened_outputs_runs_fewer_rows_and_changes_no_record(tmp_path, monkeypatch):
    taken, taken_rows = _search(tmp_path / "taken", monkeypatch, reuse=True)
    monkeypatch.undo()
    run_all, all_rows = _search(tmp_path / "all", monkeypatch, reuse=False)
    print(f"rows run for outputs: {all_rows} -> {taken_rows}")
    print([(c.label, c.stage) for c in taken.candidates])
    assert [c.stage for c in taken.candidates].count("evaluated") >= 2  # evaluations that could take screened rows
    assert taken == run_all
    assert taken_rows < all_rows
