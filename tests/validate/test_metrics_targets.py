"""metrics_targets.drop_intervals: the paired interval of a regression metric's drop, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qbench.validate import metrics_targets

# four rows, errors FP32 [1, -1, 2, 0] and variant [1.5, -1, 1, 0.5] around targets [0, 1, 2, 3] (SST 5)
TARGET = np.array([0.0, 1.0, 2.0, 3.0])
REFERENCE = TARGET + np.array([1.0, -1.0, 2.0, 0.0])
OUTPUTS = TARGET + np.array([1.5, -1.0, 1.0, 0.5])


def test_the_drop_intervals_are_the_paired_row_changes_by_hand():
    """By hand (z 1.96, sample sd):
    mae: |e'| - |e| = [0.5, 0, -1, 0.5], mean 0, sd sqrt(1.5 / 3) = 0.70711, half-width 1.96 x 0.70711 / 2 = 0.69296.
    rmse: e'^2 - e^2 = [1.25, 0, -3, 0.25], mean -0.375, sd sqrt(10.0625 / 3) = 1.83144, half-width 1.79481, so the
    MSE difference lies in [-2.16981, 1.41981]; FP32's MSE 1.5: sqrt(max(1.5 - 2.16981, 0)) - sqrt(1.5) = -1.22474,
    sqrt(2.91981) - sqrt(1.5) = 0.48400.
    r2: 4 x [1.25, 0, -3, 0.25] / 5 = [1, 0, -2.4, 0.2], mean -0.3 (SSE 4.5 against FP32's 6, over SST 5), half-width
    0.8 x 1.79481 = 1.43585."""
    drops = metrics_targets.drop_intervals(OUTPUTS, REFERENCE, TARGET)
    assert drops["mae"] == pytest.approx((-0.69296, 0.69296), abs=1e-5)
    assert drops["rmse"] == pytest.approx((-1.22474, 0.48400), abs=1e-5)
    assert drops["r2"] == drops["r2_min"] == pytest.approx((-0.3 - 1.43585, -0.3 + 1.43585), abs=1e-5)
    # each holds the drop of the figures themselves (mae: its midpoint)
    mae = metrics_targets.mean_absolute_error(OUTPUTS, TARGET) - metrics_targets.mean_absolute_error(REFERENCE, TARGET)
    rmse = metrics_targets.root_mean_squared_error(OUTPUTS, TARGET) - metrics_targets.root_mean_squared_error(REFERENCE, TARGET)
    r2 = metrics_targets.r2_score(REFERENCE, TARGET) - metrics_targets.r2_score(OUTPUTS, TARGET)
    assert (mae, r2) == pytest.approx((0.0, -0.3))
    assert sum(drops["mae"]) / 2 == pytest.approx(mae, abs=1e-12)
    assert sum(drops["r2"]) / 2 == pytest.approx(r2, abs=1e-12)
    assert drops["rmse"][0] < rmse < drops["rmse"][1]


def test_fp32_against_itself_is_a_point_at_zero():
    assert metrics_targets.drop_intervals(REFERENCE, REFERENCE, TARGET) == {"mae": (0.0, 0.0), "rmse": (0.0, 0.0),
                                                                             "r2": (0.0, 0.0), "r2_min": (0.0, 0.0)}  # fmt: skip


def test_several_targets_average_mae_per_row_and_r2_over_the_varying_ones():
    """Two targets, the second constant (no R²): mae averages each row's two changes; r2 and r2_min are the first
    target's alone (one varying target: no Bonferroni widening)."""
    target = np.stack([TARGET, np.full(4, 7.0)], axis=1)
    reference = np.stack([REFERENCE, np.full(4, 7.0)], axis=1)
    outputs = np.stack([OUTPUTS, np.array([7.0, 7.0, 7.0, 9.0])], axis=1)
    drops = metrics_targets.drop_intervals(outputs, reference, target)
    # each row's change: ([0.5, 0, -1, 0.5] + [0, 0, 0, 2]) / 2 = [0.25, 0, -0.5, 1.25], mean 0.25
    changes = np.array([0.25, 0.0, -0.5, 1.25])
    half = 1.96 * math.sqrt(np.sum((changes - 0.25) ** 2) / 3) / 2
    assert drops["mae"] == pytest.approx((0.25 - half, 0.25 + half))
    assert drops["r2"] == drops["r2_min"] == pytest.approx((-0.3 - 1.43585, -0.3 + 1.43585), abs=1e-5)


def test_several_targets_rmse_is_each_rows_squared_changes_over_each_targets_rmse_sum():
    """Two targets: FP32's errors [1, -1, 2, 0] and [0, 0, 0, 0.1], the variant's [1.5, -1, 1, 0.5] and
    [0.1, 0, 0, 1]. Target 1: MSEs 1.5 and 1.125 (RMSEs 1.224745 and 1.060660, sum 2.285405), squared changes
    [1.25, 0, -3, 0.25]; target 2: MSEs 0.0025 and 0.2525 (RMSEs 0.05, 0.502494, sum 0.552494), changes
    [0.01, 0, 0, 0.99]. Each row: (c1 / 2.285405 + c2 / 0.552494) / 2 = [0.282524, 0, -0.656339, 0.950633], mean
    0.144205 = the drop of the mean RMSE ((1.060660 - 1.224745) + (0.502494 - 0.05)) / 2; sample sd 0.666114,
    half-width 1.96 x 0.666114 / 2 = 0.652792. Before, several targets recorded no rmse interval, so a pass rested on
    two rows."""
    target = np.stack([TARGET, np.zeros(4)], axis=1)
    reference = target + np.array([[1.0, 0.0], [-1.0, 0.0], [2.0, 0.0], [0.0, 0.1]])
    outputs = target + np.array([[1.5, 0.1], [-1.0, 0.0], [1.0, 0.0], [0.5, 1.0]])
    low, high = metrics_targets.drop_intervals(outputs, reference, target)["rmse"]
    rmse = metrics_targets.root_mean_squared_error(outputs, target) - metrics_targets.root_mean_squared_error(
        reference, target)  # fmt: skip
    assert rmse == pytest.approx(0.144205, abs=1e-6)
    assert (low + high) / 2 == pytest.approx(rmse, abs=1e-12)
    assert (low, high) == pytest.approx((0.144205 - 0.652792, 0.144205 + 0.652792), abs=1e-5)


def test_r2_min_spans_each_targets_r2_interval_at_bonferroni_confidence():
    """Two varying targets: r2_min's interval runs from the lower end of the smaller target drop's interval to the
    upper end of the larger's, each at z = 2.3940 (1 - 0.05 / 6 two-sided: the two drops and FP32's worst target's
    R² less the other's for the variant), not 1.96. Target 1's per-row changes
    4 x [1.25, 0, -3, 0.25] / 5 (mean -0.3, sd 1.46515); target 2 here the same errors doubled around [0, 2, 4, 6]
    (SST 20): 4 x [5, 0, -12, 1] / 20, the same changes, so both intervals are -0.3 +- 2.3940 x 1.46515 / 2."""
    target = np.stack([TARGET, 2 * TARGET], axis=1)
    reference = target + np.stack([REFERENCE - TARGET, 2 * (REFERENCE - TARGET)], axis=1)
    outputs = target + np.stack([OUTPUTS - TARGET, 2 * (OUTPUTS - TARGET)], axis=1)
    drops = metrics_targets.drop_intervals(outputs, reference, target)
    half = 2.3940 * 1.46515 / 2
    assert drops["r2_min"] == pytest.approx((-0.3 - half, -0.3 + half), abs=1e-4)
    assert drops["r2"] == pytest.approx((-0.3 - 1.43585, -0.3 + 1.43585), abs=1e-5)


def test_a_nan_output_gives_nan_bounds():
    outputs = OUTPUTS.copy()
    outputs[2] = math.nan
    drops = metrics_targets.drop_intervals(outputs, REFERENCE, TARGET)
    assert all(math.isnan(bound) for interval in drops.values() for bound in interval)


def test_r2_min_counts_a_target_fp32_fits_better_than_its_worst_only_past_that_gap():
    """Two targets by hand. A: labels [0, 1, 2, 3] (SST 5), FP32 and the variant both off by [1, -1, 1, -1]: R² 0.2
    each, FP32's worst target, unchanged (every row's change 0). B: labels [0, 10, 20, 30] (SST 500), FP32 off by
    [1, -1, 1, -1] (R² 0.992), the variant by [3, -3, 3, -3] (R² 0.928): every row's change 4 x 8 / 500 = 0.064, a
    point. r2_min is 0.2 for both (drop 0). Before, its interval ran to B's drop, (0, 0.064): a tolerance of 0.01
    left the pass unresolved (exit 2) though the worst target did not move. B lies 0.792 above the worst, so its
    0.064 cannot reach r2_min: the interval is (0, 0)."""
    signs = np.array([1.0, -1.0, 1.0, -1.0])
    target = np.stack([TARGET, 10 * TARGET], axis=1)
    reference = target + np.stack([signs, signs], axis=1)
    outputs = target + np.stack([signs, 3 * signs], axis=1)
    assert metrics_targets._r2_columns(reference, target)[0] == pytest.approx([0.2, 0.992])
    assert metrics_targets._r2_columns(outputs, target)[0] == pytest.approx([0.2, 0.928])
    drops = metrics_targets.drop_intervals(outputs, reference, target)
    assert drops["r2_min"] == pytest.approx((0.0, 0.0), abs=1e-12)
    assert drops["r2"] == pytest.approx((0.032, 0.032))  # the mean R² does move: (0 + 0.064) / 2
    # B's drop past its gap (the variant off by 21 on B: R² 1 - 4 x 441 / 500 = -2.528) moves r2_min by the excess,
    # 0.2 + 2.528 = 2.728: the upper end, under B's own drop 4 x 440 / 500 = 3.52; the lower end A's drop, 0
    worse = target + np.stack([signs, 21 * signs], axis=1)
    r2_min = metrics_targets.r2_min(reference, target) - metrics_targets.r2_min(worse, target)
    assert r2_min == pytest.approx(2.728)
    assert metrics_targets.drop_intervals(worse, reference, target)["r2_min"] == pytest.approx((0.0, 2.728))


def test_r2_min_of_several_targets_gives_nan_bounds_for_a_nan_output_on_any_target():
    target = np.stack([TARGET, 10 * TARGET, 3 * TARGET], axis=1)
    outputs = target + 1.0
    outputs[1, 2] = math.nan  # the last target's: a max over the targets must not step past it
    assert all(math.isnan(b) for b in metrics_targets.drop_intervals(outputs, target + 0.5, target)["r2_min"])
