"""Re-timing the finalists: more interleaved rounds while the budget has room and the rounds disagree, never past it."""

from __future__ import annotations

import itertools

import pytest

from qbench.results.search import CandidateRecord
from qbench.search import select
from qbench.search.budget import Budget
from qbench.search.retime import MAX_RETIME_ROUNDS, RETIME_ROUNDS, retime_rounds, settled, uncertainty

# p50 ms per round on a loaded machine: FP32 steady at 2.0; `lucky` (truly as fast as FP32) had three lucky rounds
# first, `steady` (truly 1.25x) three unlucky ones; then the rounds show what each really is
FP32 = [2.0] * MAX_RETIME_ROUNDS
LUCKY = [1.2, 1.5, 1.3, *itertools.islice(itertools.cycle([2.0, 2.2, 1.8, 2.1, 1.9, 2.0]), MAX_RETIME_ROUNDS - 3)]
STEADY = [2.0, 1.9, 2.2, *itertools.islice(itertools.cycle([1.6, 1.5, 1.7, 1.6, 1.65, 1.55]), MAX_RETIME_ROUNDS - 3)]


class FakeTimer:
    """Times by the tables above, one second of clock per timing."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, {None: 0, "lucky": 0, "steady": 0}

    def time_one(self, key):
        table = {None: FP32, "lucky": LUCKY, "steady": STEADY}[key]
        value = table[self.calls[key]]
        self.calls[key] += 1
        self.seconds += 1.0
        return {1: value, 32: value * 20}

    def clock(self) -> float:
        return self.seconds


def _retimed(budget_s: float):
    timer = FakeTimer()
    medians, rounds = retime_rounds(timer.time_one, ["lucky", "steady"], tie=select.TIE,
                                    room=lambda s: timer.seconds + s <= budget_s, clock=timer.clock)  # fmt: skip
    return medians, rounds, timer


def test_rounds_that_disagree_are_retimed_while_the_budget_has_room_and_the_pick_follows_the_timings():
    """Three rounds ranked the truly slower finalist first (a ViT's search kept ORT static at 1.30x over ORT dynamic
    at 1.06x with 40 s of its budget unused; side by side they ran 0.9-1.0x and 1.25x): with room left, more rounds
    run and the truly faster one is chosen."""
    medians, rounds, _ = _retimed(budget_s=1000)
    assert rounds > RETIME_ROUNDS
    records = [CandidateRecord(key, "ort-static", passed=True, excess=0.5,
                               speedup=select.speedup(medians[None], medians[key]))
                               for key in ("lucky", "steady")]  # fmt: skip
    assert records[1].speedup > 1.15 and records[0].speedup < 1.1
    assert select.choose(records) == 1


def test_no_round_starts_that_the_budget_has_no_room_for():
    """Each round takes 3 s here; a budget of 10 s has room for the three rounds every re-timing runs, not a fourth."""
    _, rounds, timer = _retimed(budget_s=10)
    assert rounds == RETIME_ROUNDS and timer.seconds == 9
    _, rounds, timer = _retimed(budget_s=13)
    assert rounds == RETIME_ROUNDS + 1 and timer.seconds <= 13


def test_rounds_that_agree_stop_at_the_minimum():
    """No time is spent re-timing finalists whose rounds already fix their speed-ups."""
    timer = FakeTimer()
    medians, rounds = retime_rounds(lambda key: {1: 2.0 if key is None else 1.0}, ["a"], tie=select.TIE,
                                    room=lambda s: True, clock=timer.clock)  # fmt: skip
    assert rounds == RETIME_ROUNDS and medians == {None: {1: 2.0}, "a": {1: 1.0}}


@pytest.mark.parametrize(("ratios", "fixed"), [([1.0, 1.0, 1.0], True), ([1.0, 1.0, 1.01, 0.99, 3.0], True),
                                               ([1.6, 1.3, 1.5], False)])  # fmt: skip
def test_one_outlying_round_is_not_disagreement(ratios, fixed):
    timings = {None: [{1: 2.0}] * len(ratios), "a": [{1: 2.0 / r} for r in ratios]}
    assert settled(timings, select.TIE) is fixed
    assert uncertainty([1.0]) == float("inf")


def test_the_search_keeps_the_finalist_its_retiming_finds_faster(monkeypatch):
    """Through the search itself: the finalist screened faster on lucky runs is not kept over the truly faster one
    while the budget had room to tell them apart."""
    from types import SimpleNamespace

    from qbench.results.schema import LatencyPoint, LatencyResult
    from qbench.search import run

    timer = FakeTimer()

    def fake_measure(backend, built, prepared, **kwargs):
        p50s = timer.time_one(None if built == "fp32" else built)
        points = tuple(LatencyPoint(batch_size=b, warmup=1, iterations=5, p50_ms=p, p95_ms=p, p99_ms=p, mean_ms=p,
                                    items_per_s=b * 1e3 / p) for b, p in p50s.items())  # fmt: skip
        latency = LatencyResult(threads=1, session_create_ms=1.0, first_run_ms=1.0, points=points)
        return SimpleNamespace(result=SimpleNamespace(latency=latency))

    monkeypatch.setattr(run, "measure", fake_measure)
    search = object.__new__(run._Search)
    search.records = [CandidateRecord("lucky", "ort-static", speedup=1.30, passed=True, excess=0.5),
                      CandidateRecord("steady", "ort-dynamic", speedup=1.06, passed=True, excess=0.5)]  # fmt: skip
    search.spec = SimpleNamespace(finalists=3, time_budget_s=75)
    search.budget = Budget(75, timer.clock, 3)  # its __init__, which sets it, is not run
    search.now, search.tie = timer.clock, (lambda: 0.3)  # screening noise: no looser rounds
    search.fp32_built, search.built = "fp32", {0: "lucky", 1: "steady"}
    search.backend = search.prepared = search.screen = search.timing = search.clock = None
    search.retime_finalists()
    assert select.choose(search.records) == 1
    assert search.retime_count > RETIME_ROUNDS and timer.seconds <= 75
