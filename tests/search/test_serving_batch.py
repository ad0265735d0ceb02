"""`search.batch_sizes`: the search times and ranks its candidates at the batch sizes production serves at."""

from __future__ import annotations

import pytest
import yaml

from qbench.recipe.spec import load_recipe
from qbench.search import run as search_run
from qbench.sweep.runner import run_sweep
from tests.explain.test_sensitivity import SEARCH_BUDGET_S, write_fragile_project

# p50 ms by batch size (the project's latency batch sizes are 1 and 8): ORT dynamic (candidate 0) is the faster at
# batch 1 and the slower at batch 8; over both its geometric mean is the higher (2.5x and 1.25x: 1.77x, against
# 1.25x and 2.0x: 1.58x for ORT static, candidate 1)
P50_MS = {"fp32": {1: 10.0, 8: 80.0}, "int8-search-0": {1: 4.0, 8: 64.0}, "int8-search-1": {1: 8.0, 8: 40.0}}


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def _search(tmp_path, monkeypatch, **search):
    """The fragile project's search (nothing fragile: both candidates pass), timed by P50_MS at the batch sizes it ran;
    returns the search report and the batch sizes each timing ran at."""
    timed_at = []

    def p50s(result):
        sizes = [point.batch_size for point in result.latency.points] if result.latency else []
        timed_at.append(tuple(sizes))
        return {size: P50_MS[result.variant][size] for size in sizes}

    monkeypatch.setattr(search_run, "p50s", p50s)
    path = write_fragile_project(tmp_path, [], fragile=())
    raw = yaml.safe_load(path.read_text())
    raw["search"] = {"time_budget_s": SEARCH_BUDGET_S, "techniques": ["ort-dynamic", "ort-static"], "finalists": 2,
                     **search}  # fmt: skip
    raw["gate"]["unresolved"] = "note"  # a pass on a few dozen rows counts (test_resolved_pass.py is about that)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return run_sweep(load_recipe(path), track=False).results.search, timed_at


def test_by_default_the_search_ranks_by_the_geometric_mean_over_every_latency_batch_size(tmp_path, monkeypatch):
    report, timed_at = _search(tmp_path, monkeypatch)
    print([(c.label, c.stage, c.speedup, c.speedups) for c in report.candidates])
    assert report.outcome == "passed" and report.candidates[report.chosen].label == "ort-dynamic"
    assert set(timed_at) == {(1, 8)}


def test_with_a_serving_batch_size_the_search_times_and_ranks_at_that_batch_size_only(tmp_path, monkeypatch):
    """A user serving batches of 8 wants the fastest there: ORT static (2.0x at batch 8), not ORT dynamic, which
    the geometric mean over batch 1 and 8 ranks first; batch 1 is never timed."""
    report, timed_at = _search(tmp_path, monkeypatch, batch_sizes=[8])
    print([(c.label, c.stage, c.speedup, c.speedups) for c in report.candidates])
    assert report.outcome == "passed" and report.candidates[report.chosen].label == "ort-static"
    assert report.candidates[report.chosen].speedups == {"b8": pytest.approx(2.0)}
    assert set(timed_at) == {(8,)} and set(report.fp32_p50_ms) == {"b8"}
