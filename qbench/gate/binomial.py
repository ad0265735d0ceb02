"""Sums of binomial probabilities, as the gate's rules count rows lost by chance (qbench.gate.resolution) and the
kept-decisions check counts a class's rows lost by chance (qbench.validate.kept)."""

from __future__ import annotations

import math

import numpy as np


def binomial_tail(at_least: int, draws: int, rate: float) -> float:
    """P(X >= at_least) for X ~ Binomial(draws, rate) (a class's rows lost by chance: qbench.validate.kept)."""
    if at_least <= 0 or rate >= 1:
        return 1.0
    return _binomial_sum(range(at_least, draws + 1), draws, rate)


def at_most(lost: int, rows: int, share: float) -> float:
    """P(X <= lost) for X ~ Binomial(rows, share), summed over the few terms up to `lost` (rows may be millions)."""
    return _binomial_sum(range(lost + 1), rows, share)


def _binomial_sum(counts: range, draws: int, rate: float) -> float:
    """The Binomial(draws, rate) probabilities of `counts` summed in log space: the first term's logarithm from
    lgamma, each next one from the last by the ratio (draws - k) / (k + 1) x rate / (1 - rate), in numpy, so that a
    sum over a million counts takes milliseconds (a scope of a million rows losing 5,000: 0.45 s a bound with lgamma
    per term, and an upper bound takes 60 sums)."""
    if rate <= 0:
        return 1.0 if counts.start == 0 else 0.0
    if rate >= 1:
        return 1.0 if draws in counts else 0.0
    if not len(counts):
        return 0.0
    first = counts.start
    head = (math.lgamma(draws + 1) - math.lgamma(first + 1) - math.lgamma(draws - first + 1) + first * math.log(rate)
            + (draws - first) * math.log1p(-rate))  # fmt: skip
    k = np.arange(first, counts.stop - 1, dtype=np.float64)
    steps = np.log((draws - k) / (k + 1)) + (math.log(rate) - math.log1p(-rate))
    logs = np.concatenate(([head], head + np.cumsum(steps)))
    top = float(logs.max())
    return min(1.0, math.exp(top) * float(np.sum(np.exp(logs - top))))
