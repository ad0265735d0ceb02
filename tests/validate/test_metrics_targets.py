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
    assert drops["r2"] == pytest.approx((-0.3 - 1.43585, -0.3 + 1.43585), abs=1e-5)
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
                                                                             "r2": (0.0, 0.0)}  # fmt: skip


def test_several_targets_average_per_row_and_have_no_rmse_interval():
    """Two targets, the second constant (no R²): mae averages each row's two changes; r2 is the first target's alone;
    rmse, a mean of two square roots, has none."""
    target = np.stack([TARGET, np.full(4, 7.0)], axis=1)
    reference = np.stack([REFERENCE, np.full(4, 7.0)], axis=1)
    outputs = np.stack([OUTPUTS, np.array([7.0, 7.0, 7.0, 9.0])], axis=1)
    drops = metrics_targets.drop_intervals(outputs, reference, target)
    assert set(drops) == {"mae", "r2"}
    # each row's change: ([0.5, 0, -1, 0.5] + [0, 0, 0, 2]) / 2 = [0.25, 0, -0.5, 1.25], mean 0.25
    changes = np.array([0.25, 0.0, -0.5, 1.25])
    half = 1.96 * math.sqrt(np.sum((changes - 0.25) ** 2) / 3) / 2
    assert drops["mae"] == pytest.approx((0.25 - half, 0.25 + half))
    assert drops["r2"] == pytest.approx((-0.3 - 1.43585, -0.3 + 1.43585), abs=1e-5)


def test_a_nan_output_gives_nan_bounds():
    outputs = OUTPUTS.copy()
    outputs[2] = math.nan
    drops = metrics_targets.drop_intervals(outputs, REFERENCE, TARGET)
    assert all(math.isnan(bound) for interval in drops.values() for bound in interval)
