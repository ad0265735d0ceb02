"""The simulated verdict at one rate (the budget's): whether its p99 is within the budget, with a stated risk of passing
a rate whose p99 is over it.

A p99 within a budget is at most TAIL_SHARE of the requests over it. Each replay begins on an idle model with no
request waiting, a regeneration (qbench.validate.tail), and the verdict's replays draw streams of their own, so the
regenerative cycles of all of them are one sample of independent cycles: they are pooled, and the share over the
budget is bounded over the pool (`Cycles.bound`). The replays grow GROWTH times at a time from the replay given up to
`max_requests`, then more replays of `max_requests` follow while the pool cannot tell, MAX_REPLAYS_AT_MOST in all; at
each look the pool is judged at confidence 1 - VERDICT_RISK / looks (Bonferroni over the looks the schedule allows), so
that a verdict passes a rate over its budget, or breaches one within it, with a probability of at most VERDICT_RISK, as
far as the regenerative central limit theorem holds. The pool at the most requests still unable to tell is UNDECIDED:
the gate cannot judge it (exit 2).

That theorem holds once the pool spans many of the queue's relaxation times (`relaxation_requests`: near capacity a
queue's excursions, in which the requests over a budget come, last about rho^2 (1 + b cv^2) / (1 - rho)^2 arrivals at
load rho, with cv the full batch's service-time variation); before it does, a pool is quiet by chance too often: it
holds no excursion at all, or a few short ones. So a pass needs a pool of at least MIN_RELAXATIONS relaxation times.
Batch 1 in 0.5 ms, 8 in 1 ms and 32 in 8 ms behind a batcher of 32 with a 2 ms delay, 20 ms budget, 3,950 of its
4,000 req/s (1.79 % of 171 million requests over the budget; 6,241 requests a relaxation time): 5,000 requests held
no request over it on 35 of 40 seeds, 25,000 on 27, and the bound over the pool passed 36 of 40 seeds; a pool of 1.7
million (273 relaxation times) held 30 excursions over the budget (the median seed) and still passed 1 of 40, one of
3.2 million or more none (3,900 req/s, 0.29 % over, passed 36-39 of 40 either way). tests/validate/
test_load_verdict.py holds the rule to VERDICT_RISK over many seeds.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from qbench.errors import QbenchError
from qbench.results.serving import LoadStats
from qbench.validate.load import LoadReplay, relaxation_requests
from qbench.validate.tail import Cycles, Verdict

VERDICT_RISK = 0.05  # the most a verdict's chance of passing a rate over its budget (or breaching one within it)
MIN_RELAXATIONS = 512  # a pass needs a pool spanning this many of the queue's relaxation times
GROWTH = 4  # each replay this many times the last one's requests, up to the most one replay may hold
# one replay may hold 4x the search's most requests (about 0.4 GB and 1 s of CPU at 1,280,000), and the verdict pool
# MAX_REPLAYS_AT_MOST replays of that size: one rate is cheap beside a search's dozens
JUDGE_MAX_REQUESTS = 1_280_000
MAX_REPLAYS_AT_MOST = 4


def judge_rate(
    replay: LoadReplay, rate_rps: float, budget_ms: float, *, overhead_ms: float = 0.0,
    max_requests: int = JUDGE_MAX_REQUESTS, at_most: int = MAX_REPLAYS_AT_MOST,
) -> tuple[LoadStats, Verdict]:  # fmt: skip
    """The figures at `rate_rps` and whether they show its p99 within `budget_ms` (see the module doc): PASS where the
    upper confidence bound of the share of the pooled requests over the budget is within TAIL_SHARE and the pool spans
    MIN_RELAXATIONS relaxation times, FAIL where the lower one is over it (or the rate is at or above capacity), else
    replayed on more requests (`replay_sizes`); UNDECIDED where the pool of them all, `at_most` replays of
    `max_requests` and the growing ones before them, cannot tell. The figures are the pool's (`pooled_stats`), so its
    p99 is on the verdict's side of the budget (one replay's may not be: a quiet last replay of a pool over it)."""
    first = replay.draws.requests  # draws given by hand cannot grow: judged on them alone
    schedule = replay_sizes(first, max_requests, at_most) if replay.draws.seed is not None else [first]
    confidence = 1 - VERDICT_RISK / len(schedule)
    needed = MIN_RELAXATIONS * relaxation_requests(replay.service, replay.batcher.max_batch_size, rate_rps)
    runs: list[tuple[LoadStats, np.ndarray]] = []
    pooled: Cycles | None = None
    for look, requests in enumerate(schedule):
        if look:
            replay = replay.with_requests(requests, independent=True, again=schedule[:look].count(requests))
        stats, latencies, cycles = replay.run(rate_rps, budget_ms, overhead_ms=overhead_ms)
        if stats.overloaded:  # no replay sustains a rate at or above capacity
            return stats, Verdict.FAIL
        runs.append((stats, latencies))
        pooled = cycles if pooled is None else pooled.joined(cycles)
        judged = pooled.bound(confidence).verdict()
        if judged is Verdict.FAIL or (judged is Verdict.PASS and pooled.requests >= needed):
            break
    else:
        judged = Verdict.UNDECIDED
    return pooled_stats(runs), judged


def pooled_stats(runs: list[tuple[LoadStats, np.ndarray]]) -> LoadStats:
    """The figures of independent replays at one rate taken together (each one's figures and its requests'
    latencies): percentiles over all their requests, means weighted by their requests, batches and spans summed."""
    if len(runs) == 1:
        return runs[0][0]
    latencies = np.concatenate([latencies for _, latencies in runs])
    requests = np.array([stats.requests for stats, _ in runs], dtype=np.float64)
    total = float(requests.sum())
    p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
    first = runs[0][0]
    return replace(
        first, requests=int(total), p50_ms=float(p50), p95_ms=float(p95), p99_ms=float(p99),
        mean_ms=float(np.dot(requests, [s.mean_ms for s, _ in runs]) / total),
        mean_wait_ms=float(np.dot(requests, [s.mean_wait_ms for s, _ in runs]) / total),
        mean_batch_size=total / float(np.sum(requests / [s.mean_batch_size for s, _ in runs])),
        achieved_rps=total / float(np.sum(requests / [s.achieved_rps for s, _ in runs])),
    )  # fmt: skip


def replay_sizes(first: int, max_requests: int, at_most: int = MAX_REPLAYS_AT_MOST) -> list[int]:
    """The requests of each replay a verdict may run: `first`, GROWTH times more each time up to `max_requests` (or
    `first`, if more), then more replays of that many until `at_most` of them."""
    if first <= 0 or at_most <= 0:
        raise QbenchError(f"a verdict's first replay and its replays at the most requests must be some, got {first} "
                          f"and {at_most}")  # fmt: skip
    largest, sizes = max(first, max_requests), [first]
    while sizes[-1] < largest:
        sizes.append(min(sizes[-1] * GROWTH, largest))
    return sizes + [largest] * (at_most - 1)
