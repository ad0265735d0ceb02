"""A reduce_range twin runs its base's kernels: screened for accuracy, it takes its base's speed-up, not timed again."""

from __future__ import annotations

import pytest

from qbench.search import run as search_run
from tests.search.test_run import _searched


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_a_twin_with_its_bases_kernels_is_scored_on_the_screen_but_takes_its_bases_speed_up(tmp_path, monkeypatch):
    """ORT dynamic fails on the fragile node, so its 7-bit twin is screened: its outputs are measured on the screening
    rows, but neither it nor FP32 beside it is timed (the same kernels as its base: the same speed)."""
    calls: list[tuple[str, bool, bool]] = []  # (model, timed, scored) of each measurement
    real_measure = search_run.measure

    def recording(backend, built, prepared, **options):
        calls.append((built.name, options.get("timing") is not None, options.get("score", True)))
        return real_measure(backend, built, prepared, **options)

    monkeypatch.setattr(search_run, "measure", recording)
    _, outcome = _searched(tmp_path, {"techniques": ["ort-dynamic"], "max_keep_float": 0})
    records = outcome.results.search.candidates
    labels = [c.label for c in records]
    base, twin = records[labels.index("ort-dynamic")], records[labels.index("ort-dynamic rr")]
    assert twin.stage in ("screened", "evaluated") and twin.screen_metric is not None  # scored on the screen
    assert (twin.speedup, twin.speedups) == (base.speedup, base.speedups)
    twin_name = f"int8-search-{labels.index('ort-dynamic rr')}"
    assert [timed for name, timed, _ in calls if name == twin_name][0] is False  # its screen: scored, not timed
    fp32_timings = [name for name, timed, scored in calls if name == "fp32" and timed and not scored]
    assert len(fp32_timings) == 1  # FP32 timed again beside the base only, not beside its twin
