"""The simulated verdict at the budget's own rate (qbench.validate.load_verdict.judge_rate): the share over the budget
bounded over the pooled cycles of independent replays, a pass only on a pool spanning many relaxation times, and a
false pass at most VERDICT_RISK of the time, held over many seeds against a known truth."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_load import D_MS, md1_p99_response_ms, md1_wait_cdf

from qbench.results.serving import LoadStats
from qbench.validate.load import Batcher, Draws, FixedServiceTime, LoadReplay, MeasuredServiceTimes
from qbench.validate.load_verdict import VERDICT_RISK, judge_rate, pooled_stats, replay_sizes
from qbench.validate.tail import TAIL_SHARE, Cycles, Verdict

SEEDS = range(10)
BUDGET_MS = md1_p99_response_ms(0.9 / D_MS, D_MS)  # M/D/1's p99 at 450 of its 500 req/s: 45.8 ms
# batch 1 in 0.5 ms, 8 in 1 ms, 32 in 8 ms: 4,000 req/s at full batches, 8,000 at batches of 8 (the requests over a
# budget near 4,000 req/s come in rare excursions into full batches, thousands of requests long)
FALLING = {1: np.full(200, 0.5), 8: np.full(200, 1.0), 32: np.full(200, 8.0)}


def _md1(rate_rps: float, seed: int, first: int = 5000, **limits: int) -> tuple[LoadStats, Verdict]:
    replay = LoadReplay(FixedServiceTime(D_MS), Batcher(1, 0.0), Draws.make(first, seed))
    return judge_rate(replay, rate_rps, BUDGET_MS, **limits)


def _most_false_passes(seeds: int) -> int:
    """The most passes of a rate over its budget that `seeds` verdicts may give if each passes it with probability
    VERDICT_RISK: the binomial's 99.9th percentile (a rule within its risk fails the test one time in a thousand)."""
    tail, k = 1.0, -1
    while tail > 0.001:
        k += 1
        tail -= math.comb(seeds, k) * VERDICT_RISK**k * (1 - VERDICT_RISK) ** (seeds - k)
    return k


def test_the_binomial_margin_by_hand():
    # 40 seeds at 5 %: P(X <= 6) = 0.99661, P(X <= 7) = 0.99929
    assert _most_false_passes(40) == 7


def test_a_rate_whose_true_p99_is_over_the_budget_never_passes_on_a_quiet_replay():
    """M/D/1 at 460 and 480 req/s (true p99 57.3 and 114.9 ms against 45.8): the p99 of 5,000 requests was within the
    budget on 5 and 1 of 10 seeds (the gate passed them), and one at 480 passed the upper confidence bound too."""
    for rate in (460.0, 480.0):
        assert md1_p99_response_ms(rate / 1000, D_MS) > BUDGET_MS
        assert [_md1(rate, seed)[1] for seed in SEEDS] == [Verdict.FAIL] * len(SEEDS)


def test_md1_just_over_its_budget_passes_within_the_stated_risk_and_far_below_is_decided():
    """M/D/1, budget its p99 at 450 of 500 req/s: at 455 req/s 1.6 % of requests are over it (Erlang's formula), a
    rate that a replay quiet by chance shows within it; over 40 seeds, with replays of at most 32,000 requests, it
    passes no more often than VERDICT_RISK allows. At 250 req/s (p99 5.8 ms) every verdict passes; at capacity every
    one fails."""
    over = 1 - md1_wait_cdf(BUDGET_MS - D_MS, 0.455, D_MS)
    assert over > 1.5 * TAIL_SHARE
    seeds = range(40)
    passes = sum(_md1(455.0, seed, 1000, max_requests=32_000, at_most=2)[1] is Verdict.PASS for seed in seeds)
    assert passes <= _most_false_passes(len(seeds))
    assert {_md1(250.0, seed, 1000, max_requests=32_000, at_most=2)[1] for seed in seeds} == {Verdict.PASS}
    assert {_md1(500.0, seed, 1000)[1] for seed in SEEDS} == {Verdict.FAIL}


@pytest.fixture(scope="module")
def falling_truth() -> dict[float, float]:
    """The share of requests over a 20 ms budget at each rate, over 4 independent replays of 500,000 requests."""
    service, truth = MeasuredServiceTimes(FALLING), {}
    for rate in (3000.0, 3980.0):
        pooled = None
        for stream in range(4):
            cycles = LoadReplay(service, Batcher(32, 2.0), Draws.make(500_000, 99, stream=(stream,))).run(rate, 20.0)[2]
            pooled = cycles if pooled is None else pooled.joined(cycles)
        truth[rate] = float(pooled.over.sum() / pooled.requests)
    return truth


def test_near_a_capacity_full_batches_set_a_rate_over_its_budget_passes_within_the_stated_risk(falling_truth):
    """3,980 of the 4,000 req/s full batches sustain: a replay of 16,000 requests held no request over the budget on
    most seeds, and a pass standing on the most requests (16,000 here) passed 29 of 40 seeds; a pass now needs a pool
    of MIN_RELAXATIONS relaxation times (at 3,980 req/s about 40,000 requests each), so the verdict cannot tell
    rather than pass. 3,000 req/s, far within, passes on every seed."""
    service = MeasuredServiceTimes(FALLING)
    assert falling_truth[3980.0] > 2 * TAIL_SHARE and falling_truth[3000.0] < TAIL_SHARE / 10
    seeds = range(40)

    def verdicts(rate: float) -> list[Verdict]:
        return [judge_rate(LoadReplay(service, Batcher(32, 2.0), Draws.make(1000, seed)), rate, 20.0,
                           max_requests=16_000)[1] for seed in seeds]  # fmt: skip

    assert verdicts(3980.0).count(Verdict.PASS) <= _most_false_passes(len(seeds))
    assert set(verdicts(3000.0)) == {Verdict.PASS}


def test_a_rate_well_within_the_budget_passes_on_figures_within_it():
    """400 req/s (true p99 22.7 ms): a pass on every seed, its figures the pool's, their p99 within the budget."""
    for seed in SEEDS:
        stats, verdict = _md1(400.0, seed)
        assert verdict is Verdict.PASS and stats.p99_ms <= BUDGET_MS


def test_a_rate_the_server_meets_near_a_capacity_full_batches_set_never_reads_as_a_breach():
    """3,900 of the batch 1/8/32 model's 4,000 req/s: 0.29 % of requests over a 20 ms budget in 20 million. On these
    seeds one replay of 20,000-320,000 requests held an excursion into full batches that put its p99 over the budget
    (20.0-36.9 ms), and the gate said breach."""
    service = MeasuredServiceTimes(FALLING)
    for seed in (8, 10, 12, 16, 19, 22, 24):
        replay = LoadReplay(service, Batcher(32, 2.0), Draws.make(5000, seed))
        assert judge_rate(replay, 3900.0, 20.0, max_requests=320_000, at_most=1)[1] is not Verdict.FAIL


def test_a_replay_on_more_requests_is_independent_of_the_first_where_asked():
    """A search's rounds extend the seed's first draws (their arrivals begin with the first round's); the verdict's
    replays draw streams of their own, one for each replay of as many requests too."""
    replay = LoadReplay(FixedServiceTime(D_MS), Batcher(1, 0.0), Draws.make(5000, 3))
    first = replay.draws.unit_gaps
    assert np.array_equal(replay.with_requests(20_000).draws.unit_gaps[:5000], first)
    independent = replay.with_requests(20_000, independent=True).draws.unit_gaps
    assert independent.size == 20_000 and not np.any(independent[:5000] == first)
    assert np.array_equal(replay.with_requests(20_000, independent=True).draws.unit_gaps, independent)  # reproducible
    again = replay.with_requests(20_000, independent=True, again=1).draws.unit_gaps
    assert not np.any(again == independent)


def test_the_replays_grow_to_the_most_requests_then_repeat():
    assert replay_sizes(5000, 80_000, 3) == [5000, 20_000, 80_000, 80_000, 80_000]
    assert replay_sizes(1000, 3000, 1) == [1000, 3000]
    assert replay_sizes(100_000, 80_000, 2) == [100_000, 100_000]  # a first replay above the most: its size repeats


def test_the_verdict_rests_on_the_pool_not_on_the_last_replay(monkeypatch):
    """A first replay with 1.6 % of its requests over the budget in 20 of its 1,000 cycles (not shown over it: the
    bound is wide), then one with none over it: the last one alone is shown within the budget (and its pass stood
    where the replay before it could not tell), the two pooled are not, and the figures are both replays'."""
    loud = Cycles(np.where(np.arange(1000) < 20, 8.0, 0.0), np.full(1000, 10))
    quiet = Cycles(np.zeros(1000), np.full(1000, 10))
    assert loud.bound().verdict() is Verdict.UNDECIDED and quiet.bound().verdict() is Verdict.PASS
    assert loud.joined(quiet).bound(1 - VERDICT_RISK / 2).verdict() is Verdict.UNDECIDED
    given = iter([loud, quiet])
    real = LoadReplay.run

    def run(self, rate_rps, budget_ms, **options):
        stats, latencies, _ = real(self, rate_rps, budget_ms, **options)
        return stats, latencies, next(given)

    monkeypatch.setattr(LoadReplay, "run", run)
    replay = LoadReplay(FixedServiceTime(D_MS), Batcher(1, 0.0), Draws.make(1000, 0))
    stats, verdict = judge_rate(replay, 100.0, BUDGET_MS, max_requests=1000, at_most=2)
    assert verdict is Verdict.UNDECIDED and stats.requests == 2000


def test_pooled_figures_by_hand():
    a = LoadStats(100.0, 2, 1.0, 2.0, 2.0, 1.5, 0.5, 1.0, 100.0)
    b = LoadStats(100.0, 6, 3.0, 4.0, 4.0, 3.5, 1.5, 2.0, 50.0)
    pooled = pooled_stats([(a, np.array([1.0, 2.0])), (b, np.array([3.0, 3.0, 4.0, 4.0, 4.0, 3.0]))])
    assert pooled.requests == 8
    assert pooled.p50_ms == pytest.approx(3.0)  # the median of 1, 2, 3, 3, 3, 4, 4, 4
    assert pooled.mean_ms == pytest.approx((2 * 1.5 + 6 * 3.5) / 8)
    assert pooled.mean_wait_ms == pytest.approx((2 * 0.5 + 6 * 1.5) / 8)
    assert pooled.mean_batch_size == pytest.approx(8 / (2 / 1.0 + 6 / 2.0))  # 8 requests in 5 batches
    assert pooled.achieved_rps == pytest.approx(8 / (2 / 100.0 + 6 / 50.0))  # over both spans
