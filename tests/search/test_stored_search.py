"""A sweep repeated with the build store holding its INT8 search's build: the stored search is reused, not run again."""

from __future__ import annotations

import logging

import pytest
import yaml

import qbench.search.run as search_run
from qbench.gate.evaluate import EXIT_PASS
from qbench.recipe.spec import load_recipe
from qbench.sweep.runner import run_sweep
from tests.explain.test_sensitivity import SEARCH_BUDGET_S, write_fragile_project


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the build store is the test's own (conftest.py)


def test_a_repeated_sweep_reuses_the_stored_search_instead_of_searching_again(tmp_path, monkeypatch, caplog):
    """Publishing keeps the build already in the store, so a second search was run (its time spent, its steps
    printed) and then the first search reported: the run it printed was not the run it reported."""
    path = write_fragile_project(tmp_path, [], fragile=())
    raw = yaml.safe_load(path.read_text())
    raw["search"] = {"time_budget_s": SEARCH_BUDGET_S, "techniques": ["ort-dynamic"]}
    raw["gate"]["unresolved"] = "note"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    calls = []
    real = search_run.run_search

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(search_run, "run_search", counted)
    first = run_sweep(load_recipe(path), track=False)
    assert len(calls) == 1 and first.results.search is not None
    with caplog.at_level(logging.WARNING, logger="qbench"):
        second = run_sweep(load_recipe(path), track=False)
    assert len(calls) == 1  # not searched again
    assert second.results.search == first.results.search  # the search reported is the stored one, as before
    assert second.gate.exit_code == EXIT_PASS
    said = [r.getMessage() for r in caplog.records if "already holds this build and its search" in r.getMessage()]
    assert len(said) == 1 and "int8-search" in said[0] and "remove that entry to search again" in said[0]
