"""Regression: float labels, per-slice errors and agreement with FP32, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qbench.modelinfo.signature import TensorMeta
from qbench.tasks import LabelError, get_task
from qbench.tasks.regression import agreeing_rows, agreement_tolerances

TASK = get_task("regression")


def test_labels_must_be_finite_numbers() -> None:
    assert TASK.labels_from_values([1, 2.5, -3], np.arange(3)).tolist() == [1.0, 2.5, -3.0]
    with pytest.raises(LabelError, match=r"2 rows, e.g. row 5: 'high' are not finite numbers"):
        TASK.labels_from_values([1.0, "high", float("nan")], np.array([4, 5, 6]))
    with pytest.raises(LabelError, match=r"1 target per row, but output 'y' has shape \[None, 2\]"):
        TASK.check_labels(np.zeros(3), TensorMeta("y", np.dtype("float32"), (None, 2)), np.arange(3))


def test_several_targets_per_row_are_a_list_per_row_judged_per_target() -> None:
    """Two targets per row: mae over every value, rmse and r2 per target averaged uniformly, r2_min the worst."""
    labels = TASK.labels_from_values([[1.0, 10.0], np.array([2.0, 20.0]), (3.0, 30.0)], np.arange(3))
    assert labels.tolist() == [[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]]
    TASK.check_labels(labels, TensorMeta("y", np.dtype("float32"), (None, 2)), np.arange(3))
    with pytest.raises(LabelError, match=r"2 targets per row, but output 'y' has shape \[None, 3\]"):
        TASK.check_labels(labels, TensorMeta("y", np.dtype("float32"), (None, 3)), np.arange(3))
    with pytest.raises(LabelError, match=r"1 row, e.g. row 8: \[3.0\] hold a different number of targets than the "
                                         r"first row \(2\)"):  # fmt: skip
        TASK.labels_from_values([[1.0, 10.0], [2.0, 20.0], [3.0]], np.array([6, 7, 8]))
    with pytest.raises(LabelError, match=r"1 row, e.g. row 1: \[2.0, nan\] are not finite numbers"):
        TASK.labels_from_values([[1.0, 10.0], [2.0, float("nan")]], np.arange(2))
    outputs = np.array([[1.5, 10.0], [2.0, 22.0], [3.0, 30.0]])
    overall = TASK.rows(outputs, outputs, labels).summarise("overall", np.ones(3, dtype=bool)).metrics
    assert overall["mae"] == pytest.approx((0.5 + 2.0) / 6)
    # target 0: SS_res 0.25, SS_tot 1+0+1 = 2; target 1: SS_res 4, SS_tot 100+0+100 = 200
    assert overall["rmse"] == pytest.approx((math.sqrt(0.25 / 3) + math.sqrt(4.0 / 3)) / 2)
    assert overall["r2"] == pytest.approx(((1 - 0.25 / 2) + (1 - 4.0 / 200)) / 2)
    assert overall["r2_min"] == pytest.approx(1 - 0.25 / 2)


def test_a_ruined_small_scale_target_is_not_hidden_by_a_large_one() -> None:
    """Target 0 in units, target 1 in thousands: a variant ruining target 0 shows in r2, r2_min and agreement."""
    reference = np.array([[1.0, 1000.0], [2.0, 2000.0], [3.0, 3000.0], [4.0, 4000.0]])
    ruined = reference.copy()
    ruined[:, 0] = [4.0, 3.0, 2.0, 1.0]  # R² of target 0 against FP32: 1 - 20/5 = -3
    mask = np.ones(4, dtype=bool)
    fp32 = TASK.rows(reference, reference, None).summarise("overall", mask).metrics
    variant = TASK.rows(ruined, reference, None).summarise("overall", mask).metrics
    assert fp32["r2"] == fp32["r2_min"] == 1.0
    assert variant["r2"] == pytest.approx((-3.0 + 1.0) / 2) and variant["r2_min"] == pytest.approx(-3.0)
    # tolerance per target: 1 % of std(1..4) = 0.0112 for target 0 (pooled, 14.8 let every row agree)
    assert variant["agreement"] == 0.0


def test_metrics_per_slice_by_hand() -> None:
    reference = np.array([[1.0], [2.0], [3.0], [4.0]], dtype=np.float32)
    outputs = np.array([[1.0], [2.5], [3.0], [2.0]], dtype=np.float32)
    labels = np.array([1.0, 2.0, 4.0, 4.0])
    rows = TASK.rows(outputs, reference, labels)
    overall = rows.summarise("overall", np.ones(4, dtype=bool)).metrics
    # errors vs labels 0, 0.5, 1, 2: MAE 0.875, RMSE sqrt(5.25/4), max 2; labels' mean 2.75, SS_tot 6.75
    assert overall["mae"] == pytest.approx(0.875)
    assert overall["rmse"] == pytest.approx(math.sqrt(5.25 / 4))
    assert overall["r2"] == pytest.approx(1 - 5.25 / 6.75)
    assert overall["max_error"] == pytest.approx(2.0)
    assert overall["max_abs_error"] == pytest.approx(2.0)  # vs FP32: row 3 moved 4 -> 2
    # tolerance 1 % of std(1, 2, 3, 4) = 0.0112: rows 0 and 2 agree
    assert overall["agreement"] == pytest.approx(0.5)
    first_two = rows.summarise("first", np.array([True, True, False, False])).metrics
    assert first_two["mae"] == pytest.approx(0.25) and first_two["agreement"] == pytest.approx(0.5)


def test_without_labels_errors_are_against_fp32() -> None:
    reference = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    overall = TASK.rows(reference + 1, reference, None).summarise("overall", np.ones(3, dtype=bool)).metrics
    assert overall["mae"] == pytest.approx(1.0) and overall["agreement"] == 0.0


def test_agreement_counts_nonfinite_rows_as_disagreeing() -> None:
    outputs = np.array([[1.0, np.nan], [2.0, 2.0]])
    assert agreeing_rows(outputs, np.array([[1.0, 1.0], [2.0, 2.05]]), 0.1).tolist() == [0.0, 1.0]


def test_a_value_fp32_holds_constant_is_judged_against_its_own_magnitude() -> None:
    """FP32's second value is 0.1 on every row (std 0). Its tolerance was 0, so FP16's rounding of it (0.0999756)
    disagreed on all 4 rows though the varying value agreed on all: agreement 0.0 for regression and structured.
    Now 1 % of 0.1 = 0.001: FP16 agrees on every row; a shift to 0.102 (2 %) on none; a constant 0 stays exact."""
    reference = np.array([[1.0, 0.1], [2.0, 0.1], [3.0, 0.1], [4.0, 0.1]], dtype=np.float32)
    assert agreement_tolerances(reference.astype(np.float64)) == pytest.approx(np.array([[0.01 * np.std([1, 2, 3, 4]), 0.001]] * 4))
    fp16 = reference.astype(np.float16).astype(np.float32)
    assert float(fp16[0, 1]) == pytest.approx(0.0999756, abs=1e-7)
    shifted = reference.copy()
    shifted[:, 1] = 0.102
    everything = np.ones(4, dtype=bool)
    for task in (TASK, get_task("structured")):
        assert task.rows(fp16, reference, None).summarise("overall", everything).metrics["agreement"] == 1.0
        assert task.rows(shifted, reference, None).summarise("overall", everything).metrics["agreement"] == 0.0
    zero = np.array([[1.0, 0.0], [2.0, 0.0]])
    assert agreement_tolerances(zero)[:, 1].tolist() == [0.0, 0.0]
    assert agreement_tolerances(np.array([[np.nan], [np.inf]])).tolist() == [[0.0], [0.0]]  # no finite value: no scale


def test_a_nearly_constant_output_agrees_within_fp16_rounding_at_its_magnitude() -> None:
    """A saturated sigmoid: FP32 gives 1 - 1e-9 x (1, 2, 3, 4), a spread of 1.1e-9. Its tolerance was 1 % of that
    std (1.1e-11), so a variant rounding it by 1e-4 disagreed on every row (agreement 0.0). The floor is 2 FP16 ULPs
    at each value's magnitude, 2 x 2**-10 x |value| (0.00195 at 1.0): rounding by 1e-4 agrees on every row, a shift
    by 0.01 (5 such floors) on none. Values near 100 that vary by more than FP16's ULP there (std 0.408 > 0.0625)
    keep 1 % of their std (0.00408) though it is under that ULP: FP16 not telling them apart is a disagreement."""
    reference = (1.0 - 1e-9 * np.arange(1, 5)).reshape(4, 1)
    tolerances = agreement_tolerances(reference)
    assert 0.01 * np.std(reference) == pytest.approx(1.118e-11, rel=1e-3)
    assert tolerances[:, 0].tolist() == pytest.approx([2 * 2**-10 * value for value in reference[:, 0]], rel=1e-12)
    assert tolerances[0, 0] == pytest.approx(0.001953125, rel=1e-8)
    everything = np.ones(4, dtype=bool)
    for task in (TASK, get_task("structured")):
        assert task.rows(reference - 1e-4, reference, None).summarise("overall", everything).metrics["agreement"] == 1.0
        assert task.rows(reference - 1e-2, reference, None).summarise("overall", everything).metrics["agreement"] == 0.0
    hundred = np.array([[99.5], [100.0], [100.5]])  # std 0.408: 1 % is 0.00408, under FP16's ULP at 100 (0.0625)
    assert agreement_tolerances(hundred)[:, 0].tolist() == pytest.approx([0.01 * np.std(hundred)] * 3)


def test_each_scope_records_the_paired_drop_interval_of_its_own_rows() -> None:
    """The rows of test_metrics_per_slice_by_hand: each row's change of absolute error from FP32's is [0, 0.5, 0, 2]
    (mean 0.625 = the MAE drop 0.875 - 0.25; sample sd 0.94648, half-width 1.96 x 0.94648 / 2 = 0.92755); on the
    first two rows [0, 0.5] (mean 0.25, sd 0.35355, half-width 1.96 x 0.35355 / sqrt(2) = 0.49)."""
    reference = np.array([[1.0], [2.0], [3.0], [4.0]])
    rows = TASK.rows(np.array([[1.0], [2.5], [3.0], [2.0]]), reference, np.array([1.0, 2.0, 4.0, 4.0]))
    overall = rows.summarise("overall", np.ones(4, dtype=bool)).drop_intervals
    assert overall["mae"] == pytest.approx((0.625 - 0.92755, 0.625 + 0.92755), abs=1e-5)
    assert rows.summarise("first", np.array([True, True, False, False])).drop_intervals["mae"] == pytest.approx(
        (0.25 - 0.49, 0.25 + 0.49), abs=1e-5)  # fmt: skip
    assert TASK.rows(reference, reference, None).summarise("overall", np.ones(4, dtype=bool)).drop_intervals == {
        "mae": (0.0, 0.0), "rmse": (0.0, 0.0), "r2": (0.0, 0.0), "r2_min": (0.0, 0.0)}  # fmt: skip


def test_drop_intervals_are_named_per_output_and_undefined_where_fp32_failed() -> None:
    from qbench.validate.accuracy import evaluate_accuracy

    rng = np.random.default_rng(0)
    labels = rng.normal(size=20)
    reference = {"a": labels + rng.normal(size=20), "b": labels + rng.normal(size=20)}
    reference["b"][3] = math.nan
    outputs = {name: values + 0.1 for name, values in reference.items()}
    scope = evaluate_accuracy("regression", outputs, reference, labels, {}).overall
    names = ("mae", "rmse", "r2", "r2_min")
    assert set(scope.drop_intervals) == {f"{output}/{name}" for output in "ab" for name in names}
    assert all(math.isfinite(bound) for name in names for bound in scope.drop_intervals[f"a/{name}"])
    assert all(math.isnan(bound) for name in names for bound in scope.drop_intervals[f"b/{name}"])
