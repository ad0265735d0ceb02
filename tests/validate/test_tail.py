"""The upper confidence bound of the share of requests over a budget, over regenerative cycles, by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qbench.errors import QbenchError
from qbench.validate.tail import MIN_CYCLES, Verdict, cycle_starts, regenerations, tail_share_bound

Z95 = 1.6448536  # the one-sided 95 % normal quantile


def test_the_bound_over_cycles_of_one_request_by_hand():
    """40 requests 100 ms apart, each its own cycle; the first two take 8 ms, the rest 2 ms; threshold 5 ms. Share
    2 / 40. The pseudo-cycle: the cycle that could put the most over (a request of 8 ms: 1 over, 1 request), so 3 over
    in 41; spread sum((over_i - 3/41 size_i)^2) / 40 = (3 (38/41)^2 + 38 (3/41)^2) / 40; standard error
    sqrt(spread / 41) / mean size (1)."""
    arrivals = np.arange(40) * 100.0
    done = arrivals + np.where(np.arange(40) < 2, 8.0, 2.0)
    bound = tail_share_bound(arrivals, done, cycle_starts(arrivals, done), 5.0)
    assert bound.cycles == 40
    assert bound.share == pytest.approx(2 / 40)
    spread = (3 * (38 / 41) ** 2 + 38 * (3 / 41) ** 2) / 40
    assert bound.upper == pytest.approx(3 / 41 + Z95 * math.sqrt(spread / 41), rel=1e-6)  # 0.1409
    assert bound.verdict(0.2) is Verdict.PASS and bound.verdict(0.1) is Verdict.UNDECIDED
    assert bound.verdict(0.01) is Verdict.FAIL


def test_a_quiet_run_is_no_proof_when_a_cycle_lasted_past_the_threshold():
    """No request over 5 ms, but one cycle of 3 requests (arrivals 0, 1, 2 ms, done 4, 5.5, 6.9 ms after the first)
    lasted long enough that its first two could have been (they arrived more than 5 ms before its end at 6.9):
    the pseudo-cycle holds 2 over in 3, so the bound is not 0; with a threshold of 10 ms nothing could be over."""
    arrivals = np.concatenate(([0.0, 1.0, 2.0], 100.0 + np.arange(39) * 100.0))
    done = np.concatenate(([4.0, 5.5, 6.9], arrivals[3:] + 1.0))
    first = cycle_starts(arrivals, done)
    assert first.tolist() == [0, *range(3, 42)]
    bound = tail_share_bound(arrivals, done, first, 5.0)
    assert bound.share == 0.0
    sizes = np.array([3] + [1] * 39 + [3], dtype=float)
    over = np.array([0] * 40 + [2], dtype=float)
    ratio = 2 / sizes.sum()
    spread = np.sum((over - ratio * sizes) ** 2) / 40
    assert bound.upper == pytest.approx(ratio + Z95 * math.sqrt(spread / 41) / sizes.mean(), rel=1e-6)
    assert tail_share_bound(arrivals, done, first, 10.0).upper == 0.0


def test_too_few_cycles_show_nothing():
    arrivals = np.arange(MIN_CYCLES - 1) * 100.0
    bound = tail_share_bound(arrivals, arrivals + 1.0, cycle_starts(arrivals, arrivals + 1.0), 5.0)
    assert bound.share == 0.0 and bound.upper == 1.0 and bound.verdict() is Verdict.UNDECIDED


def test_regenerations_are_batches_leaving_no_request_waiting_of_the_commonest_kind():
    """Six batches of at most 2 (first request, size, start, end): #0 (1 req, 0 -> 1, idle), #1 (2 req, 2 -> 3, idle;
    #3 arrived at 2 too and waits), #3 (1 req, 3 -> 4, busy), #4 (1 req, 10 -> 11, idle), #5 (1 req, 20 -> 21, idle),
    #6 (1 req, 21 -> 22, busy, last). Leaving none waiting: all but #1; kinds (1, idle) 3 times, (1, busy) twice:
    the regenerations are #0, #4, #5."""
    arrivals = np.array([0.0, 1.5, 2.0, 2.0, 10.0, 20.0, 20.5])
    first = np.array([0, 1, 3, 4, 5, 6])
    counts = np.array([1, 2, 1, 1, 1, 1])
    starts = np.array([0.0, 2.0, 3.0, 10.0, 20.0, 21.0])
    ends = np.array([1.0, 3.0, 4.0, 11.0, 21.0, 22.0])
    assert regenerations(first, counts, starts, ends, arrivals).tolist() == [0, 4, 5]


def test_bad_cycles_are_errors():
    arrivals = np.arange(40.0)
    with pytest.raises(QbenchError, match="rising indices"):
        tail_share_bound(arrivals, arrivals + 1, np.array([0, 5, 5]), 1.0)
    with pytest.raises(QbenchError, match="confidence"):
        tail_share_bound(arrivals, arrivals + 1, np.array([0]), 1.0, confidence=1.0)
