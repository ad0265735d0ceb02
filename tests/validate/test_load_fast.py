"""The batcher replay's stretches replayed whole (LoadReplay._batches) against the plain loop it replaced, kept here
as the reference: the same batches, figures, regenerations and rate searches, to the bit."""

from __future__ import annotations

from bisect import bisect_right

import numpy as np
import pytest

from qbench.validate.load import (
    CHECK_EVERY,
    RUN_AFTER,
    Batcher,
    Draws,
    LoadReplay,
    MeasuredServiceTimes,
)
from qbench.validate.load_search import search_max_rate
from qbench.validate.tail import ShareOver, Verdict


class ReferenceReplay(LoadReplay):
    """LoadReplay with the plain loop, one batch at a time (the code before the stretches were replayed whole)."""

    def _batches(self, arrivals: np.ndarray, over: object = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every batch, one at a time, to the end of the run (`over` is not asked)."""
        arrivals = arrivals.tolist()
        n, size, delay = len(arrivals), self.batcher.max_batch_size, self.batcher.max_queue_delay_ms
        starts: list[float] = []
        counts: list[int] = []
        ends: list[float] = []
        free, i = 0.0, 0
        while i < n:
            first = arrivals[i]
            earliest = free if free > first else first
            deadline = max(earliest, first + delay)
            last = i + size - 1
            if last < n and arrivals[last] <= deadline:
                start = arrivals[last] if arrivals[last] > earliest else earliest
            else:
                start = deadline
            count = bisect_right(arrivals, start, i, min(i + size, n)) - i
            free = start + self._whole_column(count, start > free)[len(counts)]
            starts.append(start)
            counts.append(count)
            ends.append(free)
            i += count
        return np.asarray(starts), np.asarray(counts, dtype=np.int64), np.asarray(ends)

    def _whole_column(self, batch_size: int, idle: bool) -> list[float]:
        """Every batch's service time at `batch_size`, looked up at once."""
        cache = self.__dict__.setdefault("_whole", {})
        if (batch_size, idle) not in cache:
            cache[batch_size, idle] = self.service.service_ms(batch_size, self.draws.quantiles, idle=idle).tolist()
        return cache[batch_size, idle]


def heavy_tailed(rng: np.random.Generator, largest: int, runs: int = 400) -> MeasuredServiceTimes:
    """Timings of a shared CPU: affine in the batch size plus a Pareto tail (shape 1.5: a finite mean, an infinite
    variance; a run now and then preempted for many times the median), idle starts 0.12 ms slower."""
    sizes = sorted({1, largest, *(s for s in (2, 4, 8, 16, 32, 64) if s < largest)})
    busy = {bs: 0.2 + 0.03 * bs + rng.pareto(1.5, runs) * 0.1 for bs in sizes}
    return MeasuredServiceTimes(busy, {bs: values + 0.12 for bs, values in busy.items()})


def _cases(count: int):
    rng = np.random.default_rng(2024)
    for case in range(count):
        largest = int(rng.choice([1, 2, 3, 8, 16, 32, 64])) if case % 4 else 1
        service = heavy_tailed(rng, largest, runs=int(rng.integers(1, 300)))
        delay = float(rng.choice([0.0, 0.001, float(rng.uniform(0, 10)), 10.0]))
        draws = Draws.make(int(rng.integers(1, 3000)), seed=int(rng.integers(1 << 30)))
        replay = LoadReplay(service, Batcher(largest, delay), draws)
        yield replay, ReferenceReplay(service, Batcher(largest, delay), draws), float(replay.capacity_rps * 2 ** rng.uniform(-12, 1.5))


CASES = 600


def test_the_stretches_replay_every_batch_as_the_plain_loop_does():
    """Rates from capacity / 4096 (each request alone) to 2.8 x capacity (overloaded: full batches back to back),
    batch sizes 1 to 64, queue delays 0 to 10 ms, heavy-tailed idle and busy columns: every start, size and end, the
    figures and the regenerations are the loop's, bit for bit."""
    regimes = {"alone": 0, "queued": 0, "overloaded": 0}
    for replay, reference, rate in _cases(CASES):
        arrivals = replay._unit_arrivals * (1000.0 / rate)
        for new, old in zip(replay._batches(arrivals), reference._batches(arrivals), strict=True):
            assert new.dtype == old.dtype and np.array_equal(new, old)
        stats, latencies, first = replay._replay(rate, 0.25)
        expected = reference._replay(rate, 0.25)
        assert stats == expected[0] and np.array_equal(latencies, expected[1]) and np.array_equal(first, expected[2])
        regimes["alone"] += stats.mean_batch_size < 1.05
        regimes["queued"] += stats.mean_wait_ms > replay.batcher.max_queue_delay_ms and not stats.overloaded
        regimes["overloaded"] += stats.overloaded
    assert min(regimes.values()) >= CASES // 20  # each regime met often


@pytest.mark.parametrize("seed", range(6))
def test_a_rate_search_finds_what_the_plain_loop_finds(seed):
    """search_max_rate over heavy-tailed timings, its requests extended (fresh replays of the same class): the same
    RateSearch, its figures to the bit."""
    rng = np.random.default_rng(seed)
    largest = [1, 4, 32, 8, 64, 16][seed]
    service, batcher = heavy_tailed(rng, largest), Batcher(largest, [0.0, 0.5, 2.0, 1.0, 10.0, 0.001][seed])
    draws, budget = Draws.make(2000, seed=seed), float(rng.uniform(2.0, 30.0))
    new = search_max_rate(LoadReplay(service, batcher, draws), budget, max_requests=32_000)
    assert new == search_max_rate(ReferenceReplay(service, batcher, draws), budget, max_requests=32_000)


def test_a_run_over_the_budget_stops_once_its_share_is_decided(monkeypatch):
    """Heavy-tailed timings at a quarter of capacity, a 5 ms budget: 2.6 % of the requests are over it (6,047
    batches), more than 1 % of the whole run already within the first CHECK_EVERY batches; the run stops there (no
    figures) and fails, as the whole run does."""
    service, batcher = heavy_tailed(np.random.default_rng(0), 32), Batcher(32, 2.0)
    replay = LoadReplay(service, batcher, Draws.make(80_000, seed=0))
    rate = replay.capacity_rps / 4
    stats, bound = replay.within(rate, 5.0)
    assert bound.share > 0.02 and bound.verdict() is Verdict.FAIL
    formed, decided = [], ShareOver.decided

    def counted(self, starts, counts, ends):
        formed.append(len(counts))
        return decided(self, starts, counts, ends)

    monkeypatch.setattr(ShareOver, "decided", counted)
    assert replay.verdict(rate, 5.0) == (Verdict.FAIL, None)
    assert formed == [CHECK_EVERY]  # stopped at the first look
    assert replay.verdict(replay.capacity_rps / 4096, 5.0)[1] == replay.at(replay.capacity_rps / 4096)  # a pass: whole


def test_full_batches_back_to_back_are_replayed_whole():
    """At twice capacity the model is never idle and every batch is full: after RUN_AFTER of them one at a time,
    `_full_run` replays the rest whole, in stretches doubling from RUN_AFTER."""
    service, batcher = heavy_tailed(np.random.default_rng(1), 16), Batcher(16, 1.0)
    replay = LoadReplay(service, batcher, Draws.make(16_000, seed=1))
    run, taken = replay._full_run, []

    def counted(*args):
        taken.append(run(*args))
        return taken[-1]

    replay._full_run = counted
    stats = replay.at(2 * replay.capacity_rps)
    assert stats.mean_batch_size == 16 and sum(taken) >= 1000 - RUN_AFTER - len(taken)
    assert taken[:3] == [RUN_AFTER, 2 * RUN_AFTER, 4 * RUN_AFTER]


def test_service_times_are_looked_up_a_block_at_a_time_where_a_batch_size_occurs():
    """At a quarter of capacity, with heavy-tailed timings, 30 batch sizes occur among 6,047 batches (two blocks of
    draws): their service times are looked up for the blocks of draws where they occur, not for every one of the
    80,000 draws (at least 30 x 80,000 lookups)."""

    class Counting(MeasuredServiceTimes):
        def service_ms(self, batch_size, quantiles, idle=False):
            looked_up[0] += np.size(quantiles)
            return super().service_ms(batch_size, quantiles, idle)

    looked_up = [0]
    timed = heavy_tailed(np.random.default_rng(0), 32)
    service = Counting({bs: timed._busy._samples[bs] for bs in timed._busy.sizes},
                       {bs: timed._idle._samples[bs] for bs in timed._idle.sizes})  # fmt: skip
    replay = LoadReplay(service, Batcher(32, 2.0), Draws.make(80_000, seed=0))
    stats = replay.at(replay.capacity_rps / 4)
    sizes = np.unique(replay._batches(replay._unit_arrivals * (4000 / replay.capacity_rps))[1]).size
    assert sizes == 30 and looked_up[0] < sizes * 80_000 / 2
    assert stats == ReferenceReplay(timed, Batcher(32, 2.0), Draws.make(80_000, seed=0)).at(replay.capacity_rps / 4)


class _CountingArrivals(np.ndarray):
    """Arrivals that count the values converted to Python floats (a view of them, and what is computed from it,
    counts into the same list)."""

    converted: list[int] = []

    def tolist(self):
        _CountingArrivals.converted.append(self.size)
        return super().tolist()


def test_a_run_stopped_early_converts_only_the_arrivals_its_batches_reach(monkeypatch):
    """The batcher loop reads the arrivals as floats; a run over the budget stops within its first CHECK_EVERY
    batches (heavy-tailed timings at a quarter of capacity, 80,000 requests) and converts up to a block or two past the
    requests they hold (54,107), not all 80,000; a run to the end converts each arrival once."""
    monkeypatch.setattr(_CountingArrivals, "converted", [])
    service, batcher = heavy_tailed(np.random.default_rng(0), 32), Batcher(32, 2.0)
    replay = LoadReplay(service, batcher, Draws.make(80_000, seed=0))
    replay._unit_arrivals = replay._unit_arrivals.view(_CountingArrivals)
    assert replay.verdict(replay.capacity_rps / 4, 5.0) == (Verdict.FAIL, None)
    early = sum(_CountingArrivals.converted)
    _CountingArrivals.converted.clear()
    held = int(replay._batches(replay._unit_arrivals * (4000 / replay.capacity_rps))[1][:CHECK_EVERY].sum())
    assert sum(_CountingArrivals.converted) == 80_000  # the whole run: each arrival once
    assert held <= early <= held + 2 * 4096 < 80_000
