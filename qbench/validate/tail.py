"""Whether a p99 is within a budget with confidence: the share of requests over the budget, bounded from above.

A p99 within a budget is the same as at most 1 % of requests over it. The share over the budget in a finite run is
an estimate, and near capacity a poor one: requests over the budget come in clusters (one long queue holds many),
so 5,000 requests hold few independent clusters and the share (and the p99) is often well below the truth. The
samples that are independent are the regenerative cycles: a cycle starts with a batch that leaves no request
waiting (`regenerations`); Poisson arrivals are memoryless and each batch draws its service time independently, so
what happens from there on does not depend on what came before.

The share over the budget is then a ratio of two cycle means, sum(over) / sum(requests), whose variance the
regenerative central limit theorem gives from the cycles' spread: s^2 = sum((over_i - share * requests_i)^2) / (C -
1), standard error s / (mean requests per cycle * sqrt(C)) (Crane and Iglehart; Asmussen, Applied Probability and
Queues, ch. VI). The upper confidence bound is the share plus the one-sided normal quantile of CONFIDENCE times it.
The theorem is asymptotic, and near capacity a sample can be quiet by chance (few long queues, or none): so the
cycle with the most requests over the budget is counted again, as often as it takes for MIN_CLUSTERS cycles to hold
some (at least once: the worst cluster seen could come twice); with fewer than MIN_CYCLES cycles the bound is 1
(nothing is shown).

A breach is shown the same way from below: the lower confidence bound of the share over the budget, over the cycles
left when the one with the most requests over it is taken out (the worst cluster seen might not have come at all),
and none (0) where fewer than MIN_CLUSTERS cycles hold any. A share over 1 % on one replay is not a breach shown:
near a capacity full batches set, the requests over a budget come in rare excursions hundreds of requests long, and
one of them in a replay of 80,000 requests put 1 % over a 20 ms budget that the server meets (0.03 % over it in 2
million requests; tests/validate/test_load_verdict.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike

from qbench.errors import QbenchError

TAIL_SHARE = 0.01  # a p99: at most this share of requests over the budget
CONFIDENCE = 0.99  # one-sided, per rate tried: a search decides about 8 rates near its edge (CRN: strongly alike)
MIN_CYCLES = 30  # fewer independent cycles show nothing (the normal approximation of their mean fails)
# the normal approximation of a count wants about ten events, and near capacity the requests over the budget come in
# a few long queues: with fewer cycles holding any, the worst of them is counted again until ten do (at least once)
MIN_CLUSTERS = 10


class Verdict(str, Enum):
    PASS = "pass"  # the upper bound of the share over the budget is within TAIL_SHARE
    FAIL = "fail"  # the lower bound of the share is over TAIL_SHARE
    UNDECIDED = "undecided"  # neither bound is on one side of TAIL_SHARE: more requests could tell


@dataclass(frozen=True)
class TailBound:
    share: float  # requests over the threshold / requests
    upper: float  # one-sided upper confidence bound of the share (1.0: too few cycles to bound it)
    cycles: int
    lower: float = 0.0  # one-sided lower confidence bound of the share (0.0: too few cycles or clusters to bound it)

    def verdict(self, tail_share: float = TAIL_SHARE) -> Verdict:
        if self.lower > tail_share:
            return Verdict.FAIL
        return Verdict.PASS if self.upper <= tail_share else Verdict.UNDECIDED


def regenerations(first: ArrayLike, counts: ArrayLike, starts_ms: ArrayLike, arrivals_ms: ArrayLike) -> np.ndarray:
    """Where a dynamic batcher's run regenerates: the batches (their first request's index, `first`) that start with
    no request left waiting. From such a start on, what happens depends on the future arrivals (Poisson: memoryless)
    and fresh service draws only, given the starting batch's size and whether it started on an idle model; so the
    cycles between them are independent given those, and identically distributed where they agree (exactly so at
    batch size 1 without a queue delay: every request arriving on an idle model). Cycles of every kind are counted
    together: the kinds near capacity (full batches) and well below it (batches of one from idle) each dominate, and
    keeping one kind alone leaves few, long cycles near capacity. Indices into the requests, ascending."""
    first, counts = np.asarray(first, dtype=np.int64), np.asarray(counts, dtype=np.int64)
    starts, arrivals = np.asarray(starts_ms, dtype=np.float64), np.asarray(arrivals_ms, dtype=np.float64)
    following = first + counts
    alone = np.ones(first.size, dtype=bool)
    inside = following < arrivals.size
    alone[inside] = arrivals[following[inside]] > starts[inside]
    return first[alone]


@dataclass(frozen=True)
class Cycles:
    """The regenerative cycles of one or more runs: each cycle's requests over a threshold and its requests. Runs that
    each begin at a regeneration (an idle model, no request waiting: every replay of a simulation does) and draw
    independently of each other give independent cycles of one distribution, so their cycles pool (`joined`) into
    one sample, as one longer run's would."""

    over: np.ndarray
    sizes: np.ndarray

    @classmethod
    def of(cls, latencies_ms: ArrayLike, first: ArrayLike, threshold_ms: float) -> Cycles:
        """The cycles beginning at the request indices `first` (`regenerations`); requests before the first cycle are
        left out."""
        first = np.asarray(first, dtype=np.int64)
        latencies = np.asarray(latencies_ms, dtype=np.float64)
        if latencies.ndim != 1 or latencies.size == 0 or np.any(np.diff(first) <= 0) or np.any(first >= latencies.size):
            raise QbenchError("cycles must start at rising indices within the latencies")
        if first.size == 0:
            return cls(np.zeros(0), np.zeros(0, dtype=np.int64))
        latencies, first = latencies[first[0] :], first - first[0]
        over = np.add.reduceat((latencies > threshold_ms).astype(np.float64), first)
        return cls(over, np.diff(np.append(first, latencies.size)))

    def joined(self, other: Cycles) -> Cycles:
        return Cycles(np.concatenate([self.over, other.over]), np.concatenate([self.sizes, other.sizes]))

    @property
    def requests(self) -> int:
        return int(self.sizes.sum())

    def bound(self, confidence: float = CONFIDENCE) -> TailBound:
        """The share of the requests over the threshold, with its confidence bounds (see the module doc)."""
        if not 0.5 <= confidence < 1:
            raise QbenchError(f"confidence must be in [0.5, 1), got {confidence}")
        over, sizes, cycles = self.over, self.sizes, self.over.size
        share = float(over.sum() / sizes.sum()) if cycles else math.nan
        if cycles < MIN_CYCLES:
            return TailBound(share, 1.0, cycles)
        z, worst, clusters = NormalDist().inv_cdf(confidence), int(np.argmax(over)), int(np.count_nonzero(over))
        copies = max(MIN_CLUSTERS - clusters, 1)
        upper = _ratio_bound(np.append(over, np.full(copies, over[worst])),
                             np.append(sizes, np.full(copies, sizes[worst])), z)
        lower = 0.0
        if clusters > MIN_CLUSTERS:  # MIN_CLUSTERS holding some once the worst is out
            lower = max(_ratio_bound(np.delete(over, worst), np.delete(sizes, worst), -z), 0.0)
        return TailBound(share, min(upper, 1.0), cycles, lower)


def tail_share_bound(
    latencies_ms: ArrayLike, first: ArrayLike, threshold_ms: float, confidence: float = CONFIDENCE
) -> TailBound:
    """The share of `latencies_ms` over `threshold_ms`, and its confidence bounds over the regenerative cycles that
    begin at the request indices `first` (`Cycles.of`; see the module doc); no regeneration at all: the share of them
    all, shown neither within nor over."""
    cycles = Cycles.of(latencies_ms, first, threshold_ms)
    bound = cycles.bound(confidence)
    return bound if cycles.over.size else replace(bound, share=float(np.mean(np.asarray(latencies_ms) > threshold_ms)))


def _ratio_bound(over: np.ndarray, sizes: np.ndarray, z: float) -> float:
    """sum(over) / sum(sizes) plus `z` standard errors of that ratio of cycle means (the regenerative CLT)."""
    sizes = sizes.astype(np.float64)
    ratio = float(over.sum() / sizes.sum())
    spread = float(np.sum((over - ratio * sizes) ** 2)) / (over.size - 1)
    return ratio + z * math.sqrt(spread / over.size) / float(sizes.mean())


class ShareOver:
    """The requests over `threshold_ms` from a run's first regeneration on, counted as its batches are formed: the
    share `tail_share_bound` measures is decided over `tail_share` once they are more than that share of all the
    run's requests from there (it only grows: the verdict is FAIL whatever the rest of the run does). The same float
    operations as the whole run's latencies (end - arrival + overhead), so the count is theirs to the bit."""

    def __init__(self, arrivals_ms: np.ndarray, threshold_ms: float, overhead_ms: float = 0.0,
                 tail_share: float = TAIL_SHARE) -> None:  # fmt: skip
        self._arrivals, self._threshold = arrivals_ms, threshold_ms
        self._overhead, self._share = overhead_ms, tail_share
        self._batches = self._requests = self._over = 0
        self._first: int | None = None  # the first regeneration's request

    def decided(self, starts: list[float], counts: list[int], ends: list[float]) -> bool:
        """Take the batches formed since the last call (each one's start, size and end); whether the share is
        decided over `tail_share`."""
        sizes = np.asarray(counts[self._batches :], dtype=np.int64)
        begun = self._requests + np.cumsum(sizes) - sizes
        if self._first is None:
            cycles = regenerations(begun, sizes, starts[self._batches :], self._arrivals)
            self._first = int(cycles[0]) if cycles.size else None
        done = self._requests + int(sizes.sum())
        if self._first is not None:
            latencies = np.repeat(ends[self._batches :], sizes) - self._arrivals[self._requests : done] + self._overhead
            self._over += int(np.count_nonzero(latencies[max(self._first - self._requests, 0) :] > self._threshold))
        self._batches, self._requests = len(counts), done
        return self._first is not None and self._over / (self._arrivals.size - self._first) > self._share

    @property
    def batches(self) -> int:
        """The batches taken so far (the run's, when it stopped as decided)."""
        return self._batches
