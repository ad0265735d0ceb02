"""Multilabel: 0/1 label rows, F1 and per-label agreement, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qbench.modelinfo.signature import TensorMeta
from qbench.tasks import LabelError, get_task
from qbench.validate.accuracy import evaluate_accuracy
from tests.tasks.test_classification import _judged

TASK = get_task("multilabel")


def test_labels_are_zero_one_rows_of_one_width() -> None:
    assert TASK.labels_from_values([[0, 1], [1, 1]], np.arange(2)).tolist() == [[0, 1], [1, 1]]
    with pytest.raises(LabelError, match=r"1 row, e.g. row 8: \[0, 2\] are not lists of 0/1 per label"):
        TASK.labels_from_values([[0, 1], [0, 2]], np.array([7, 8]))
    with pytest.raises(LabelError, match=r"e.g. row 1: \[0, 1, 1\] have another label count than the first row's 2"):
        TASK.labels_from_values([[0, 1], [0, 1, 1]], np.arange(2))
    with pytest.raises(LabelError, match="rows have 2 labels but output 'p' scores 3"):
        TASK.check_labels(np.zeros((2, 2)), TensorMeta("p", np.dtype("float32"), (None, 3)), np.arange(2))


def test_metrics_by_hand() -> None:
    reference = np.array([[0.9, 0.1, 0.2], [0.8, 0.7, 0.1], [0.2, 0.6, 0.3]], dtype=np.float32)
    outputs = np.array([[0.9, 0.6, 0.2], [0.4, 0.7, 0.1], [0.2, 0.6, 0.3]], dtype=np.float32)
    labels = np.array([[1, 0, 0], [1, 1, 0], [0, 1, 0]])
    overall = TASK.rows(outputs, reference, labels).summarise("overall", np.ones(3, dtype=bool)).metrics
    # decisions [[1,1,0],[0,1,0],[0,1,0]]: the F1 case of test_f1_by_hand
    assert overall["micro_f1"] == pytest.approx(0.75)
    assert overall["macro_f1"] == pytest.approx((2 / 3 + 4 / 5) / 2)
    assert overall["label_agreement"] == pytest.approx(7 / 9)  # two of nine decisions moved
    assert overall["row_agreement"] == pytest.approx(1 / 3)
    assert overall["max_abs_error"] == pytest.approx(0.5, abs=1e-6)


def test_logits_are_thresholded_at_zero_like_fp32() -> None:
    reference = np.array([[-1.0, 2.0], [3.0, -2.0]])
    overall = TASK.rows(reference, reference, None).summarise("overall", np.ones(2, dtype=bool)).metrics
    assert overall["micro_f1"] == 1.0 and overall["row_agreement"] == 1.0


def test_a_slice_without_positives_has_f1_one_and_a_spurious_positive_drops_it() -> None:
    """Rows with no positive label, which FP32 predicts all negative: F1 1 (not NaN), so the gate can judge the
    slice; a variant predicting one spurious positive there drops to 0."""
    reference = np.array([[0.1, 0.2], [0.3, 0.1], [0.9, 0.8]], dtype=np.float32)
    outputs = np.array([[0.1, 0.7], [0.3, 0.1], [0.9, 0.8]], dtype=np.float32)
    labels = np.array([[0, 0], [0, 0], [1, 1]])
    negatives = np.array([True, True, False])
    fp32 = TASK.rows(reference, reference, labels).summarise("negatives", negatives).metrics
    variant = TASK.rows(outputs, reference, labels).summarise("negatives", negatives).metrics
    assert fp32["micro_f1"] == fp32["macro_f1"] == 1.0
    assert variant["micro_f1"] == variant["macro_f1"] == 0.0
    assert variant["row_agreement"] == 0.5


def test_f1_is_nan_on_scopes_holding_rows_fp32_gives_nan_on_and_agreement_counts_them_as_misses() -> None:
    """FP32 NaN on 10 of 100 rows (slice 'hot'); an INT8 variant finite there, missing label 0 on 5 rows FP32 gets
    right (slice 'cold'). F1 left FP32's NaN rows out, finite on 'hot' and overall though README's gate rule makes
    such a row a miss or the metric NaN; as misses F1 would be 0 for every result on a scope without positives. Now
    F1 is NaN on every scope holding such a row, for FP32 and the variant alike, and the gate says so, naming the
    agreements; on 'cold' it is judged by hand: FP32 1.0, the variant 170/175 (tp 85, fn 5)."""
    labels = np.zeros((100, 3), dtype=np.int64)
    labels[:, 0] = 1
    reference = np.tile([[3.0, -3.0, -3.0]], (100, 1))
    reference[:10] = np.nan
    outputs = reference.copy()
    outputs[:10] = [3.0, -3.0, -3.0]
    outputs[10:15] = [-3.0, -3.0, -3.0]
    slices = {"hot": np.arange(100) < 10, "cold": np.arange(100) >= 10}
    fp32 = evaluate_accuracy("multilabel", reference, reference, labels, slices)
    variant = evaluate_accuracy("multilabel", outputs, reference, labels, slices)
    for result in (fp32, variant):
        for scope in (result.overall, result.slice("hot")):
            assert math.isnan(scope.metrics["micro_f1"]) and math.isnan(scope.metrics["macro_f1"])
    assert fp32.slice("cold").metrics["micro_f1"] == fp32.slice("cold").metrics["macro_f1"] == 1.0
    assert variant.slice("cold").metrics["micro_f1"] == pytest.approx(170 / 175)
    assert variant.slice("cold").metrics["macro_f1"] == pytest.approx(170 / 175)
    assert fp32.overall.metrics["label_agreement"] == fp32.overall.metrics["row_agreement"] == pytest.approx(0.9)
    assert variant.overall.metrics["label_agreement"] == pytest.approx(1 - 35 / 300)
    assert variant.overall.metrics["row_agreement"] == pytest.approx(0.85)
    verdict = _judged("multilabel", reference, outputs, labels, "micro_f1")
    assert verdict.exit_code == 2
    assert "gate on a metric that counts such rows: label_agreement, row_agreement" in verdict.problems[0]


def test_a_single_label_per_row_is_scored() -> None:
    """Labels [[1], [0], [1]] for a (rows, 1) output reach the task as (rows,) (evaluate_accuracy flattens one value
    per row), and were refused: 'labels have shape (3,), the output (3, 1)'."""
    labels = TASK.labels_from_values([[1], [0], [1]], np.arange(3))
    outputs = np.array([[0.9], [0.2], [0.4]])
    overall = evaluate_accuracy("multilabel", outputs, outputs, labels, {}).overall.metrics
    assert overall["micro_f1"] == pytest.approx(2 / 3)  # tp 1, fn 1: 2 / (2 + 1)
