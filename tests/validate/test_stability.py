"""The stopping rule and spread statistics on hand-made duration sequences (values worked out by hand)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qbench.errors import QbenchError
from qbench.validate.stability import StabilityRule, iqr_ratio, relative_spread, run_until_stable


def test_relative_spread_by_hand() -> None:
    assert relative_spread([10.0, 12.0, 11.0]) == pytest.approx(2 / 11)  # (12 - 10) / median 11
    assert relative_spread([4.0, 4.0]) == 0.0
    assert relative_spread([7.0]) == 0.0
    assert math.isnan(relative_spread([]))
    assert math.isnan(relative_spread([0.0, 0.0, 1.0]))  # median 0: no relative spread


def test_iqr_ratio_by_hand() -> None:
    assert iqr_ratio([1, 2, 3, 4, 5]) == pytest.approx((4 - 2) / 3)
    assert iqr_ratio([4, 1, 3, 2]) == pytest.approx((3.25 - 1.75) / 2.5)  # linear quartiles of 1..4
    assert iqr_ratio([5, 5, 5]) == 0.0
    assert math.isnan(iqr_ratio([]))


# windows of 2 runs, p50s 200, 150, 100, 100, 102: the last three agree first at window 5,
# (102 - 100) / 100 = 0.02 <= 0.05, after 10 runs; window 6 (p50 102) keeps them in agreement.
SETTLING = [100, 300, 150, 150, 100, 100, 101, 99, 102, 102, 103, 101, 500, 900, 100, 100]


def _rule(**overrides: int | float) -> StabilityRule:
    settings: dict = {"min_runs": 4, "max_runs": 100, "windows": 3, "threshold": 0.05, "window_runs": 2}
    return StabilityRule(**(settings | overrides))


def test_stops_at_the_first_window_where_the_last_three_agree() -> None:
    state = run_until_stable(SETTLING, _rule())
    assert len(state.durations) == 10
    assert state.window_p50s == [200, 150, 100, 100, 102]
    assert state.stable
    assert state.spread == pytest.approx(0.02)


def test_the_minimum_run_count_holds_even_when_stable_earlier() -> None:
    state = run_until_stable(SETTLING, _rule(min_runs=13))
    # stable from run 10 on; stops at run 13, one run into window 7 (not counted as a window)
    assert len(state.durations) == 13
    assert state.window_p50s == [200, 150, 100, 100, 102, 102]
    assert state.stable and state.spread == pytest.approx(2 / 102)


def test_never_stable_stops_at_the_maximum_and_is_flagged() -> None:
    alternating = [100, 100, 200, 200] * 10
    state = run_until_stable(alternating, _rule(max_runs=12))
    assert len(state.durations) == 12
    assert state.window_p50s == [100, 200, 100, 200, 100, 200]
    assert not state.stable
    assert state.spread == pytest.approx((200 - 100) / 200)


def test_fewer_windows_than_required_is_not_stable() -> None:
    state = run_until_stable([100] * 5, _rule(min_runs=1))
    assert state.window_p50s == [100, 100] and not state.stable  # two windows closed, three needed


def test_a_window_also_lasts_a_minimum_run_time() -> None:
    state = run_until_stable([100, 100, 100, 300, 50, 200], _rule(window_runs=1, window_time=250))
    # windows close at summed time >= 250: [100, 100, 100] [300] [50, 200]
    assert state.window_p50s == [100, 300, 125]


def test_window_p99_only_for_windows_of_a_hundred_runs() -> None:
    hundred = run_until_stable(list(range(1, 101)), _rule(window_runs=100))
    assert hundred.window_p50s == [50.5]
    assert hundred.window_p99s == pytest.approx([99.01])  # linear: 99 + 0.01 * (100 - 99)
    ten = run_until_stable([1] * 20, _rule(window_runs=10))
    assert ten.window_p50s == [1, 1] and ten.window_p99s == []


def test_rule_rejects_inconsistent_bounds() -> None:
    with pytest.raises(QbenchError, match="min_runs"):
        _rule(min_runs=200)
    with pytest.raises(QbenchError, match="windows"):
        _rule(windows=1)
    with pytest.raises(QbenchError, match="threshold"):
        _rule(threshold=0.0)


def test_spread_of_numpy_arrays() -> None:
    assert relative_spread(np.array([9.0, 10.0, 11.0])) == pytest.approx(0.2)
