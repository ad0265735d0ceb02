"""Whether a real run shows its server keeping up (qbench.validate.keep_up), on simulated batch servers whose
capacity the test sets: no clock, no thread, the same verdict on every machine."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qbench.validate.keep_up import MIN_BATCHES, keep_up
from qbench.validate.tail import Verdict

Z99 = 2.3263479  # the one-sided 99 % normal quantile (CONFIDENCE)
SEEDS = range(18)


def simulated_run(rate_rps: float, capacity_share: float, seed: int, *, max_batch: int = 32, delay_ms: float = 1.0,
                  requests: int = 20_000, cv: float = 0.05, power: float | None = None):  # fmt: skip
    """A dynamic batcher (up to `max_batch` requests, waiting at most `delay_ms` for the oldest) in front of a model
    whose full batch's mean work serves `capacity_share` x `rate_rps` (a batch of b rows: 0.4 + 0.6 b / max_batch of
    a full batch's, or (b / max_batch) ** `power` where given, times lognormal noise of coefficient of variation
    `cv`), fed Poisson arrivals at `rate_rps`.
    What `keep_up` takes: per batch its size, work and whether the model idled before it; per request its arrival and
    completion (ms)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1000.0 / rate_rps, requests))
    full_ms = max_batch * 1000.0 / (capacity_share * rate_rps)
    sigma = math.sqrt(math.log(1 + cv**2))
    done = np.empty(requests)
    sizes, works, idle = [], [], []
    free, i = 0.0, 0
    while i < requests:
        earliest = max(free, arrivals[i])
        deadline = max(arrivals[i] + delay_ms, earliest)
        last = i + max_batch - 1
        start = max(arrivals[last], earliest) if last < requests and arrivals[last] <= deadline else deadline
        size = min(max(int(np.searchsorted(arrivals, start, side="right")) - i, 1), max_batch)
        share = (0.4 + 0.6 * size / max_batch) if power is None else (size / max_batch) ** power
        work = full_ms * share * rng.lognormal(-(sigma**2) / 2, sigma)
        idle.append(start > free)
        free = start + work
        done[i : i + size] = free
        sizes.append(size)
        works.append(work)
        i += size
    return np.array(sizes), np.array(works), np.array(idle), max_batch, arrivals - arrivals[0], done - arrivals[0]


def verdict_of(rate_rps: float, capacity_share: float, seed: int, **kwargs):
    sizes, works, idle, max_batch, arrivals, done = simulated_run(rate_rps, capacity_share, seed, **kwargs)
    return keep_up(rate_rps, sizes, works, idle, max_batch, arrivals, done, done.size)


@pytest.mark.parametrize("capacity_share", [0.90, 0.97, 0.99])
def test_a_server_short_of_the_rate_is_shown_falling_behind_on_every_seed(capacity_share):
    """77,233 req/s onto full batches of 32 that serve 1-10 % less, 20,000 requests (0.26 s): its queue grows without
    bound. Completions within 5 % of the arrivals' span (what kept up before) on every seed 1-3 % short; the batches'
    work bounds the capacity below the rate on every seed."""
    for seed in SEEDS:
        sizes, works, idle, max_batch, arrivals, done = simulated_run(77_233.0, capacity_share, seed)
        if capacity_share > 0.95:
            assert done.max() - done.min() <= (arrivals[-1] - arrivals[0]) / 0.95  # the old rule's pass
        judged = keep_up(77_233.0, sizes, works, idle, max_batch, arrivals, done, done.size)
        assert judged.verdict is Verdict.FAIL, (seed, judged)
        assert judged.capacity_high_rps < 77_233.0 or "completions took" in judged.reason


@pytest.mark.parametrize("rate_rps, requests, max_batch, delay_ms", [(77_233.0, 20_000, 32, 1.0),
                                                                      (5_000.0, 1_250, 8, 2.0)])  # fmt: skip
def test_a_server_exactly_at_capacity_is_never_shown_keeping_up(rate_rps, requests, max_batch, delay_ms):
    """At capacity (utilisation 1) a queue grows without bound too (as the square root of time): no seed passes."""
    for seed in SEEDS:
        judged = verdict_of(rate_rps, 1.0, seed, requests=requests, max_batch=max_batch, delay_ms=delay_ms)
        assert judged.verdict is not Verdict.PASS, (seed, judged)
        assert judged.capacity_low_rps <= rate_rps


@pytest.mark.parametrize("rate_rps, requests, max_batch, delay_ms", [(77_233.0, 20_000, 32, 1.0),
                                                                      (10_000.0, 2_500, 32, 1.0),
                                                                      (5_000.0, 1_250, 8, 2.0)])  # fmt: skip
def test_a_server_with_20_percent_headroom_is_shown_keeping_up_on_every_seed(rate_rps, requests, max_batch, delay_ms):
    for seed in SEEDS:
        judged = verdict_of(rate_rps, 1.2, seed, requests=requests, max_batch=max_batch, delay_ms=delay_ms)
        assert judged.verdict is Verdict.PASS, (seed, judged)
        assert rate_rps < judged.capacity_low_rps < 1.2 * rate_rps * 1.05


def test_a_server_far_below_capacity_forming_small_batches_is_shown_keeping_up_by_them():
    """At a third of capacity the batcher rarely fills a batch: the throughput of the run's largest batches (a lower
    bound of the full batch's, as batching never lowers throughput) is what shows the headroom."""
    sizes, works, idle, max_batch, arrivals, done = simulated_run(5_000.0, 3.0, 0, requests=1_250)
    assert np.count_nonzero(sizes == max_batch) < MIN_BATCHES
    judged = keep_up(5_000.0, sizes, works, idle, max_batch, arrivals, done, done.size)
    assert judged.verdict is Verdict.PASS and math.isinf(judged.capacity_high_rps)


def test_a_server_whose_throughput_falls_with_batch_size_is_not_shown_keeping_up_by_its_small_batches():
    """Work (b / 32)^1.5 of a full batch that serves half the rate, no batching delay: at 5,000 req/s its batches of
    1-4 serve requests about three times as fast as the rate, and 1,250 requests kept up by that bound on all 18
    seeds, yet 40,000 fill its batches and it falls behind. Its small batches bound no capacity: not a pass."""
    for seed in SEEDS:
        judged = verdict_of(5_000.0, 0.5, seed, requests=1_250, delay_ms=0.0, power=1.5)
        assert judged.capacity_low_rps > 5_000.0, (seed, judged)  # what the old rule passed on
        assert judged.verdict is Verdict.UNDECIDED and "fewer requests a ms" in judged.reason, (seed, judged)
    assert verdict_of(5_000.0, 0.5, 0, requests=40_000, delay_ms=0.0, power=1.5).verdict is Verdict.FAIL


@pytest.mark.parametrize(("per_batch_ms", "verdict"), [(0.2, Verdict.PASS), (-0.2, Verdict.UNDECIDED)])
def test_batch_work_fitted_by_hand_says_whether_throughput_falls(per_batch_ms, verdict):
    """40 batches of 1-4 rows whose work is 0.5 ms a row plus `per_batch_ms`, exactly: the line fitted to it meets
    size 0 at `per_batch_ms` with no residual. 0.2 ms: 1.43, 1.67, 1.76, 1.82 rows a ms for batches of 1-4 (b / (0.2
    + 0.5 b)), rising; -0.2 ms: 3.33, 2.5, 2.31, 2.22, falling."""
    sizes = np.tile(np.arange(1, 5), 10)
    arrivals = np.arange(100) * 10.0
    judged = keep_up(100.0, sizes, 0.5 * sizes + per_batch_ms, np.ones(40, dtype=bool), 4, arrivals, arrivals + 1.0,
                     100)  # fmt: skip
    assert judged.verdict is verdict and judged.capacity_low_rps > 100.0


def test_a_slow_batch_at_the_end_of_a_run_its_batches_bound_above_the_rate_is_no_falling_behind():
    """100 batches of 4 requests arriving 1 ms apart (1,000 req/s), each served in 1 ms but the last in 30 ms (a
    server whose batches are now and then ten times slower): completions span 1.08x the arrivals', which the old rule
    called falling behind, a breach; the batches' work bounds the capacity above the rate, so the run cannot tell.
    A server 11 % short whose batches bound nothing (each taken after an idle model, none back to back) still falls
    behind by its completions' spread."""
    sizes, idle = np.full(100, 4), np.zeros(100, dtype=bool)
    works = np.r_[np.ones(99), 30.0]
    arrivals = np.arange(400) * 1.0
    done = np.r_[arrivals[:396] + 1.0, np.full(4, arrivals[-1] + 31.0)]
    judged = keep_up(1_000.0, sizes, works, idle, 4, arrivals, done, 400)
    assert (done.max() - done.min()) / 399 == pytest.approx(429 / 399)  # 1.075 > 1 / 0.95
    assert judged.verdict is Verdict.UNDECIDED and judged.capacity_high_rps > 1_000.0
    assert judged.reason.startswith("completions took 1.08x the arrivals' span, yet capacity")
    short = np.repeat(4.5 * np.arange(1, 101), 4)  # batch k done at 4.5 (k + 1) ms: 889 req/s
    behind = keep_up(1_000.0, sizes, np.full(100, 4.5), np.ones(100, dtype=bool), 4, arrivals, short, 400)
    assert behind.verdict is Verdict.FAIL and behind.reason == "completions took 1.12x the arrivals' span"


def test_the_capacity_bounds_by_hand():
    """40 batches: 30 of 4 rows in 2 ms and 10 of 2 rows in 1.5 ms. The largest 30 (4 rows) bound it from below: 120
    rows in 60 ms, every residual 4 - 2 x 2 = 0, so exactly 2 rows per ms, 2,000 req/s; the full batches (4 rows) taken
    without idling, the same from above."""
    sizes = np.array([4] * 30 + [2] * 10)
    works = np.array([2.0] * 30 + [1.5] * 10)
    arrivals = np.arange(100) * 0.5
    judged = keep_up(1_900.0, sizes, works, np.zeros(40, dtype=bool), 4, arrivals, arrivals + 1.0, 100)
    assert judged.verdict is Verdict.PASS
    assert judged.capacity_low_rps == pytest.approx(2000.0) and judged.capacity_high_rps == pytest.approx(2000.0)
    noisy = np.array([2.0, 2.5] * 15 + [1.5] * 10)  # 120 rows in 67.5 ms; residuals 4 - r w
    ratio = 120 / 67.5
    spread = 15 * ((4 - ratio * 2.0) ** 2 + (4 - ratio * 2.5) ** 2) / (30 * 29)
    bound = ratio - Z99 * math.sqrt(spread) / 2.25
    judged = keep_up(1_700.0, sizes, noisy, np.zeros(40, dtype=bool), 4, arrivals, arrivals + 1.0, 100)
    assert judged.capacity_low_rps == pytest.approx(1000 * bound)  # 1,692 req/s: 1,700 is not shown
    assert judged.verdict is Verdict.UNDECIDED and "not above the rate" in judged.reason


def test_too_few_batches_cannot_tell_and_say_so():
    sizes, works = np.full(20, 4), np.full(20, 1.0)
    arrivals = np.arange(80) * 1.0
    judged = keep_up(100.0, sizes, works, np.zeros(20, dtype=bool), 4, arrivals, arrivals + 1.0, 80)
    assert judged.verdict is Verdict.UNDECIDED
    assert judged.reason == f"20 batches, expected at least {MIN_BATCHES} to bound its capacity"


def test_latencies_growing_over_the_run_are_not_shown_keeping_up_whatever_the_batches_say():
    """Batches four times faster than the rate needs, yet each request waits 0.1 ms longer than the one before:
    something the capacity bound does not see (a client falling behind) fills a queue."""
    sizes, works = np.full(100, 4), np.full(100, 1.0)
    arrivals = np.arange(400) * 4.0
    judged = keep_up(250.0, sizes, works, np.zeros(100, dtype=bool), 4, arrivals, arrivals + 1.0 + 0.1 * np.arange(400),
                     400)  # fmt: skip
    assert judged.verdict is Verdict.UNDECIDED and "latencies grew" in judged.reason
    steady = keep_up(250.0, sizes, works, np.zeros(100, dtype=bool), 4, arrivals, arrivals + 1.0, 400)
    assert steady.verdict is Verdict.PASS


def test_a_run_given_up_with_requests_unserved_falls_behind():
    sizes, works = np.full(40, 4), np.full(40, 1.0)
    arrivals = np.arange(200) * 1.0
    judged = keep_up(1000.0, sizes, works, np.zeros(40, dtype=bool), 4, arrivals, arrivals + 1.0, 160)
    assert judged.verdict is Verdict.FAIL and judged.reason == "40 requests not served"
