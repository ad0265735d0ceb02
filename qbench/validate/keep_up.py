"""Whether a real run shows that its server keeps up with the offered rate, from the batches' own work.

A dynamic batcher that takes up to B queued requests each time the model falls free is a bulk-service queue, stable
at a Poisson rate λ exactly when λ E[w(B)] < B, w(B) being the server's work per full batch: the model's run plus
the server's own work before it takes the next batch (assembly, stamping, hand-off, its client's share of the
process). Keeping up is so a question of capacity, μ = B / E[w(B)], not of how far the run's queue got: at a rate 1 %
over capacity the backlog of n requests grows by 0.01 n, within the arrivals' Poisson noise (sqrt n) until n is
about 10^4 z^2 (40,000 requests for z = 2), so a quarter-second run cannot show it from its queue or its completions.
The batches' work has the model's timing noise only, not the arrivals': hundreds of batches bound μ within a few %.

Below capacity: batching never lowers throughput (b / E[w(b)] does not fall as b grows, as a fixed per-call cost
plus a per-row cost gives; the simulation's capacity rests on it too), so μ >= sum(b_k) / sum(E[w(b_k)]) over any
batches chosen by their sizes. The run's largest batches are chosen (a quarter of them by size, at least
MIN_BATCHES): a run well below capacity forms small batches and idles, and their throughput shows the headroom; near
capacity they are the full batches. Their ratio's one-sided lower confidence bound (delta method: standard error
sqrt(sum((b_k - r w_k)^2) / (m (m - 1))) / mean w) above λ: the server keeps up.

Above capacity: the full batches taken without the model idling first (a backlogged server takes nothing else) give
μ itself; the ratio's upper bound below λ, every request not served, or completions spread over more than 1 / KEEP_UP
of the arrivals' span where the batches bound no capacity (neither bound above λ): the server falls behind. Where one
does, that spread is a slow batch near the run's end (a server with 5 % of its batches twenty times slower: a
2,500-request run with 30 % headroom spread that far on 16 of 40 simulated seeds, 200,000 kept up): it cannot tell.

Neither shown: the run cannot tell (fewer than MIN_BATCHES batches to bound μ with, or λ within the bounds), nor
when its batches contradict the premise above (the line fitted to their work against their size meets size 0 below
zero: throughput falling with the batch, which its small batches then overstate). A run
whose latencies grow over it (the slope of its ten blocks' mean latency against their mean arrival, one-sided t-test)
is not shown to keep up either, whatever the bound says: something outside the bound's premises is filling a queue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from qbench.validate.tail import CONFIDENCE, Verdict

MIN_BATCHES = 30  # fewer batches bound no mean (the normal approximation of their ratio fails)
KEEP_UP = 0.95  # completions spread over more than the arrivals' span / KEEP_UP: gross falling behind, shown
TREND_BLOCKS = 10  # consecutive blocks of requests whose mean latencies the trend is fitted to
T_TREND = 4.501  # Student's t, one-sided 99.9 %, TREND_BLOCKS - 2 = 8 degrees of freedom (see _latency_grows)


@dataclass(frozen=True)
class KeepUp:
    """A run's verdict on keeping up at `rate_rps` (PASS: shown, FAIL: shown falling behind, UNDECIDED: the run
    cannot tell), the capacity's confidence bounds it rests on (req/s; nan / inf: not bounded) and why, in one line
    ('' for PASS)."""

    verdict: Verdict
    rate_rps: float
    capacity_low_rps: float
    capacity_high_rps: float
    reason: str = ""


def keep_up(
    rate_rps: float, sizes: np.ndarray, work_ms: np.ndarray, idle_before: np.ndarray, max_batch_size: int,
    arrivals_ms: np.ndarray, done_ms: np.ndarray, completed: int, confidence: float = CONFIDENCE,
) -> KeepUp:  # fmt: skip
    """The verdict on a run at `rate_rps` (see the module doc): per batch its size, the server's work on it (ms) and
    whether the model idled before it was taken; per request its scheduled arrival and completion (ms, from the first
    arrival; requests past `completed` were not served)."""
    sizes, work = np.asarray(sizes, dtype=np.float64), np.asarray(work_ms, dtype=np.float64)
    z = NormalDist().inv_cdf(confidence)
    largest = _largest(sizes)
    low = max(_ratio_bound(sizes[largest], work[largest], -z), 0.0)
    backlogged = (sizes == max_batch_size) & ~np.asarray(idle_before, dtype=bool)
    high = _ratio_bound(sizes[backlogged], work[backlogged], z)
    low_rps, high_rps = low * 1000.0, high * 1000.0
    figures = f"capacity {_rps(low_rps)} to {_rps(high_rps)} at {confidence:.0%}"
    if completed < done_ms.size:
        return KeepUp(Verdict.FAIL, rate_rps, low_rps, high_rps, f"{done_ms.size - completed:,} requests not served")
    if high_rps < rate_rps:
        return KeepUp(Verdict.FAIL, rate_rps, low_rps, high_rps, f"{figures}, below the rate")
    offered, served = arrivals_ms[-1] - arrivals_ms[0], done_ms.max() - done_ms.min()
    if offered > 0 and served > offered / KEEP_UP:
        spread = f"completions took {served / offered:.3g}x the arrivals' span"
        if math.isfinite(high_rps) or low_rps > rate_rps:  # its batches bound no shortfall: slow ones near the end
            return KeepUp(Verdict.UNDECIDED, rate_rps, low_rps, high_rps, f"{spread}, yet {figures}")
        return KeepUp(Verdict.FAIL, rate_rps, low_rps, high_rps, spread)
    if not low_rps > rate_rps:
        count = int(np.count_nonzero(largest))
        short = f"{count} batches, expected at least {MIN_BATCHES} to bound its capacity" if count < MIN_BATCHES else ""
        return KeepUp(Verdict.UNDECIDED, rate_rps, low_rps, high_rps, short or f"{figures}, not above the rate")
    if _throughput_falls(sizes, work, z):
        return KeepUp(Verdict.UNDECIDED, rate_rps, low_rps, high_rps,
                      f"{figures}, yet its largest batches served fewer requests a ms than its smaller ones: a server "
                      "whose throughput falls with batch size has no capacity its small batches bound")  # fmt: skip
    if _latency_grows(arrivals_ms, done_ms - arrivals_ms):
        return KeepUp(Verdict.UNDECIDED, rate_rps, low_rps, high_rps, f"{figures}, yet its latencies grew over the run")
    return KeepUp(Verdict.PASS, rate_rps, low_rps, high_rps)


def _largest(sizes: np.ndarray) -> np.ndarray:
    """The batches of the largest sizes: a quarter of them, at least MIN_BATCHES (all, when fewer), with every batch
    of the smallest size taken (chosen by size alone, never by work)."""
    if sizes.size == 0:
        return np.zeros(0, dtype=bool)
    count = min(max(MIN_BATCHES, math.ceil(sizes.size / 4)), sizes.size)
    return sizes >= np.sort(sizes)[::-1][count - 1]


def _throughput_falls(sizes: np.ndarray, work_ms: np.ndarray, z: float) -> bool:
    """Whether the run contradicts the capacity bound's premise that batching never lowers throughput: the line
    fitted to each batch's work against its size meets size 0 below zero (its upper bound), so that b / w(b) falls as
    b grows. A server whose per-row cost grows with the batch (memory spilling, padding to the longest row) keeps up
    while its batches stay small and, once a burst fills them, serves ever fewer requests a ms: a simulated one whose
    full batches serve half of 5,000 req/s passed 18 of 18 runs of 1,250 requests on the bound of its batches of
    1-4, and fell behind in runs of 40,000. A run of one batch size cannot show it."""
    if sizes.size < MIN_BATCHES or np.ptp(sizes) == 0 or not np.all(np.isfinite(work_ms)):
        return False
    line = _fit_line(sizes, work_ms)
    return line.intercept + z * line.intercept_error < 0


@dataclass(frozen=True)
class _Line:
    """A least-squares line y = intercept + slope x and the standard errors of both."""

    slope: float
    intercept: float
    slope_error: float
    intercept_error: float


def _fit_line(x: np.ndarray, y: np.ndarray) -> _Line:
    dx = x - x.mean()
    sxx = float(np.sum(dx**2))
    slope = float(np.sum(dx * (y - y.mean())) / sxx)
    intercept = float(y.mean() - slope * x.mean())
    residual = float(np.sum((y - y.mean() - slope * dx) ** 2)) / (x.size - 2)
    return _Line(slope, intercept, math.sqrt(residual / sxx),
                 math.sqrt(residual * (1.0 / x.size + x.mean() ** 2 / sxx)))  # fmt: skip


def _ratio_bound(sizes: np.ndarray, work_ms: np.ndarray, z: float) -> float:
    """sum(sizes) / sum(work) (requests per ms) moved by z standard errors (delta method); with fewer than
    MIN_BATCHES batches nan for a lower bound (z < 0), inf for an upper one."""
    if sizes.size < MIN_BATCHES or not np.all(np.isfinite(work_ms)):
        return math.nan if z < 0 else math.inf
    ratio = sizes.sum() / work_ms.sum()
    spread = float(np.sum((sizes - ratio * work_ms) ** 2)) / (sizes.size * (sizes.size - 1))
    return float(ratio + z * math.sqrt(spread) / work_ms.mean())


def _latency_grows(arrivals_ms: np.ndarray, latencies_ms: np.ndarray) -> bool:
    """The mean latency of TREND_BLOCKS consecutive blocks of requests rises with their mean arrival, the slope's
    one-sided t-test at T_TREND (block means: a queue's latencies are correlated, blocks far less). The first tenth of
    the requests is left out: the run starts on an empty queue, whose latencies rise to their steady level first. At
    99 % the test fired on 3.5 % of simulated runs of 1,250 requests at a third of a server's capacity (skewed,
    still correlated block means), at 99.9 % on 1 in 800 runs at 1.2-3x capacity: a guard against what the capacity
    bound does not see, not a second estimate of it."""
    if latencies_ms.size < 10 * TREND_BLOCKS:
        return False
    blocks = np.array_split(np.arange(latencies_ms.size // 10, latencies_ms.size), TREND_BLOCKS)
    line = _fit_line(np.array([arrivals_ms[b].mean() for b in blocks]),
                     np.array([latencies_ms[b].mean() for b in blocks]))  # fmt: skip
    return line.slope > T_TREND * line.slope_error


def _rps(value: float) -> str:
    return "unbounded" if not math.isfinite(value) else f"{value:,.0f} req/s"
