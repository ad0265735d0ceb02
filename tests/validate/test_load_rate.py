"""The simulated verdict at the budget's own rate (qbench.validate.load_search.judge_rate): shown within the budget by
the search's rule, confirmed on more requests, never the p99 of one short replay."""

from __future__ import annotations

from test_load import D_MS, md1_p99_response_ms

from qbench.validate.load import Batcher, Draws, FixedServiceTime, LoadReplay
from qbench.validate.load_search import judge_rate
from qbench.validate.tail import Verdict

SEEDS = range(10)
BUDGET_MS = md1_p99_response_ms(0.9 / D_MS, D_MS)  # M/D/1's p99 at 450 of its 500 req/s: 45.8 ms


def _judged(rate_rps: float, seed: int):
    return judge_rate(LoadReplay(FixedServiceTime(D_MS), Batcher(1, 0.0), Draws.make(5000, seed)), rate_rps, BUDGET_MS)


def test_a_rate_whose_true_p99_is_over_the_budget_never_passes_on_a_quiet_replay():
    """M/D/1 at 460 and 480 req/s (true p99 57.3 and 114.9 ms against 45.8): the p99 of 5,000 requests was within the
    budget on 5 and 1 of 10 seeds (the gate passed them), and one at 480 passed the upper confidence bound too."""
    for rate in (460.0, 480.0):
        assert md1_p99_response_ms(rate / 1000, D_MS) > BUDGET_MS
        assert [_judged(rate, seed)[1] for seed in SEEDS] == [Verdict.FAIL] * len(SEEDS)


def test_a_rate_well_within_the_budget_passes_confirmed_on_more_requests():
    """400 req/s (true p99 22.7 ms): a pass on 5,000 requests stands once 20,000 fresh ones pass too; the figures are
    those of the replay that confirmed it."""
    for seed in SEEDS:
        stats, verdict = _judged(400.0, seed)
        assert verdict is Verdict.PASS and stats.requests >= 20_000 and stats.p99_ms <= BUDGET_MS
