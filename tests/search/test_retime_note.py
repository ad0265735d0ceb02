"""The search's method note says how the passing candidates' speed-ups were measured, never re-timing that did not
run."""

from __future__ import annotations

import logging

import pytest
from test_run import _searched

import qbench.search.run as search_run
from qbench.search.retime import RETIME_ROUNDS


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def _method(report):
    return next(note for note in report.notes if note.startswith("screening on "))


def test_a_pick_chosen_after_the_budget_was_spent_is_still_re_timed_and_said_so(tmp_path, caplog):
    """A budget smaller than one candidate: the lone pick was never re-timed (no step started past the budget), so its
    speed-up was its one screening estimate (a 2-layer BERT's pick at 0.74x FP32 at batch 1, which the sweep then
    timed at 1.15x), while the note claimed "finalists: medians of 3 interleaved rounds"."""
    timed = []
    real = search_run.measure

    def counted(backend, built, prepared, **kwargs):
        if kwargs.get("score") is False:
            timed.append(built.name)
        return real(backend, built, prepared, **kwargs)

    with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.WARNING, logger="qbench"):
        patch.setattr(search_run, "measure", counted)
        _, outcome = _searched(tmp_path, {"time_budget_s": 0.001}, fragile=())
    report = outcome.results.search
    assert report.chosen == 0 and report.budget_exhausted
    picked = [name for name in timed if name != "fp32"]
    assert len(picked) == RETIME_ROUNDS  # the pick timed beside FP32 in each round, past the budget
    assert f"finalists: medians of {RETIME_ROUNDS} interleaved rounds, run past the time budget" in _method(report)
    assert any("re-timed anyway" in r.getMessage() for r in caplog.records)


def test_an_unreachable_gate_is_said_to_have_had_no_finalist(tmp_path):
    _, outcome = _searched(tmp_path, {"techniques": ["ort-dynamic"], "max_keep_float": 0},
                           gate={"metric": "agreement", "max_drop": 0.0, "max_slice_drop": 0.0})  # fmt: skip
    report = outcome.results.search
    assert report.outcome == "unreachable"
    assert "no finalist re-timed: none passed" in _method(report)


def test_re_timed_finalists_are_said_with_their_rounds(tmp_path):
    _, outcome = _searched(tmp_path, {"techniques": ["ort-dynamic"]}, fragile=())
    report = outcome.results.search
    assert report.outcome == "passed"
    assert "finalists: medians of " in _method(report) and "interleaved rounds" in _method(report)
