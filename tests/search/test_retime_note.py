"""The search's method note says how the passing candidates' speed-ups were measured, never re-timing that did not run."""

from __future__ import annotations

import pytest
from test_run import _searched


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def _method(report):
    return next(note for note in report.notes if note.startswith("screening on "))


def test_a_pick_chosen_after_the_budget_was_spent_is_said_not_re_timed(tmp_path):
    """A budget smaller than one candidate: the lone pick is never re-timed (no step starts past the budget), and the
    note claimed "finalists: medians of 3 interleaved rounds"; its speed-up is one screening estimate."""
    _, outcome = _searched(tmp_path, {"time_budget_s": 0.001}, fragile=())
    report = outcome.results.search
    assert report.chosen == 0 and report.budget_exhausted
    method = _method(report)
    assert "medians of" not in method
    assert "no finalist re-timed: the time budget was spent first" in method


def test_an_unreachable_gate_is_said_to_have_had_no_finalist(tmp_path):
    _, outcome = _searched(tmp_path, {"time_budget_s": 60, "techniques": ["ort-dynamic"], "max_keep_float": 0},
                           gate={"metric": "agreement", "max_drop": 0.0, "max_slice_drop": 0.0})  # fmt: skip
    report = outcome.results.search
    assert report.outcome == "unreachable"
    assert "no finalist re-timed: none passed" in _method(report)


def test_re_timed_finalists_are_said_with_their_rounds(tmp_path):
    _, outcome = _searched(tmp_path, {"time_budget_s": 60, "techniques": ["ort-dynamic"]}, fragile=())
    report = outcome.results.search
    assert report.outcome == "passed"
    assert "finalists: medians of " in _method(report) and "interleaved rounds" in _method(report)
