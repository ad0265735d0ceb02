"""Whether a p99 is within a budget with confidence: the share of requests over the budget, bounded from above.

A p99 within a budget is the same as at most 1 % of requests over it. The share over the budget in a finite run is
an estimate, and near capacity a poor one: requests over the budget come in clusters (one long queue holds many),
so 5,000 requests hold few independent clusters and the share (and the p99) is often well below the truth. The
samples that are independent are the regenerative cycles: a cycle starts with a request that arrives on an empty
system (the model free, no request queued); Poisson arrivals are memoryless and each batch draws its service time
independently, so what happens from there on does not depend on what came before, and the cycles (each one's
requests, and how many of them are over the budget) are independent and identically distributed.

The share over the budget is then a ratio of two cycle means, sum(over) / sum(requests), whose variance the
regenerative central limit theorem gives from the cycles' spread: s^2 = sum((over_i - share * requests_i)^2) / (C -
1), standard error s / (mean requests per cycle * sqrt(C)) (Crane and Iglehart; Asmussen, Applied Probability and
Queues, ch. VI). The upper confidence bound is the share plus the one-sided normal quantile of `confidence` times it.
With fewer than MIN_CYCLES cycles the theorem says nothing useful and the bound is 1 (nothing is shown).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike

from qbench.errors import QbenchError

TAIL_SHARE = 0.01  # a p99: at most this share of requests over the budget
CONFIDENCE = 0.95  # one-sided: a rate is claimed only when the share over the budget is that surely within TAIL_SHARE
MIN_CYCLES = 30  # fewer independent cycles show nothing (the normal approximation of their mean fails)


class Verdict(str, Enum):
    PASS = "pass"  # the upper bound of the share over the budget is within TAIL_SHARE
    FAIL = "fail"  # the share itself is over TAIL_SHARE
    UNDECIDED = "undecided"  # the share is within, its upper bound is not: more requests could tell


@dataclass(frozen=True)
class TailBound:
    share: float  # requests over the threshold / requests
    upper: float  # one-sided upper confidence bound of the share (1.0: too few cycles to bound it)
    cycles: int

    def verdict(self, tail_share: float = TAIL_SHARE) -> Verdict:
        if self.share > tail_share:
            return Verdict.FAIL
        return Verdict.PASS if self.upper <= tail_share else Verdict.UNDECIDED


def regenerations(first: ArrayLike, counts: ArrayLike, starts_ms: ArrayLike, ends_ms: ArrayLike, arrivals_ms: ArrayLike) -> np.ndarray:
    """Where a dynamic batcher's run regenerates: the batches (their first request's index, `first`) that start with
    no request left waiting, of the one kind (size, and whether the model was idle) most of those are. From such a
    start on, what happens depends on the future arrivals (Poisson: memoryless) and fresh service draws (for that
    size and start) only, so the cycles between them are independent and identically distributed. Batch size 1
    without a queue delay: every request arriving on an idle model. The requests before the first one are left out
    (a cycle of another kind). Indices into the requests, ascending."""
    first, counts = np.asarray(first, dtype=np.int64), np.asarray(counts, dtype=np.int64)
    starts, ends, arrivals = (np.asarray(a, dtype=np.float64) for a in (starts_ms, ends_ms, arrivals_ms))
    idle = np.concatenate(([True], starts[1:] > ends[:-1]))
    following = first + counts
    alone = np.ones(first.size, dtype=bool)
    inside = following < arrivals.size
    alone[inside] = arrivals[following[inside]] > starts[inside]
    kinds = counts * 2 + idle  # one number per (size, idle)
    values, seen = np.unique(kinds[alone], return_counts=True)
    return first[alone & (kinds == values[np.argmax(seen)])]


def cycle_starts(arrivals_ms: ArrayLike, done_ms: ArrayLike) -> np.ndarray:
    """The requests that arrive on an empty system: the first, and each one arriving no earlier than every request
    before it was done (FIFO service: the one before it was done last). Their indices, ascending."""
    arrivals, done = np.asarray(arrivals_ms, dtype=np.float64), np.asarray(done_ms, dtype=np.float64)
    if arrivals.shape != done.shape or arrivals.ndim != 1 or arrivals.size == 0:
        raise QbenchError(f"arrivals and completions must be two equal, non-empty lists, got {arrivals.shape} and {done.shape}")
    empty = arrivals[1:] >= np.maximum.accumulate(done)[:-1]
    return np.concatenate(([0], np.flatnonzero(empty) + 1))


def tail_share_bound(
    arrivals_ms: ArrayLike, done_ms: ArrayLike, first: ArrayLike, threshold_ms: float, confidence: float = CONFIDENCE
) -> TailBound:
    """The share of requests whose latency (done - arrival) is over `threshold_ms`, and its upper confidence bound
    over the regenerative cycles that begin at the request indices `first` (`regenerations`, `cycle_starts`; see the
    module doc); requests before the first cycle are left out.

    The bound counts one cycle more than the run held: the one that could have put the most requests over the
    threshold, each of its requests counted over if it arrived more than `threshold_ms` before the cycle's last
    completion (its latency could not be longer). The rule of three's pseudo-count, in cycles: a run that holds
    none or few requests over the threshold (a quiet stretch near capacity) shows no certainty from that alone, while
    a threshold no cycle lasted long enough to reach adds nothing."""
    first = np.asarray(first, dtype=np.int64)
    arrivals = np.asarray(arrivals_ms, dtype=np.float64)
    done = np.asarray(done_ms, dtype=np.float64)
    if first.size == 0 or arrivals.shape != done.shape or np.any(np.diff(first) <= 0) or first[-1] >= arrivals.size:
        raise QbenchError("cycles must start at rising indices within as many arrivals as completions")
    if not 0.5 <= confidence < 1:
        raise QbenchError(f"confidence must be in [0.5, 1), got {confidence}")
    arrivals, done, first = arrivals[first[0] :], done[first[0] :], first - first[0]
    sizes = np.diff(np.append(first, arrivals.size))
    over = np.add.reduceat((done - arrivals > threshold_ms).astype(np.float64), first)
    share = float(over.sum() / sizes.sum())
    cycles = first.size
    if cycles < MIN_CYCLES:
        return TailBound(share, 1.0, cycles)
    ends = np.repeat(np.maximum.reduceat(done, first), sizes)
    could = np.add.reduceat((ends - arrivals > threshold_ms).astype(np.float64), first)
    worst = int(np.argmax(could))
    over, counted = np.append(over, could[worst]), np.append(sizes, sizes[worst]).astype(np.float64)
    bounded = float(over.sum() / counted.sum())
    spread = float(np.sum((over - bounded * counted) ** 2)) / cycles
    error = math.sqrt(spread / (cycles + 1)) / float(counted.mean())
    return TailBound(share, min(bounded + NormalDist().inv_cdf(confidence) * error, 1.0), cycles)
