"""Every metric checked against an independent implementation (scikit-learn, scipy, or numpy written from the
metric's definition) on seeded random inputs and on edge cases (ties, one row, huge logits, float16, zero vectors)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats
from scipy.spatial import distance
from sklearn import metrics as skm

from qbench.tasks.span import NO_SPAN, best_spans, token_f1
from qbench.validate import metrics, metrics_targets, neighbours
from qbench.validate.catalogue import drop, within

TRIALS = 60


def _cases(seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(TRIALS):
        yield rng, int(rng.integers(1, 50)), int(rng.integers(2, 9))


def _true_kl_of_logits(reference: np.ndarray, outputs: np.ndarray) -> np.ndarray:
    log_p = special.log_softmax(reference.astype(np.float64), axis=1)
    log_q = special.log_softmax(outputs.astype(np.float64), axis=1)
    return (np.exp(log_p) * (log_p - log_q)).sum(axis=1)


def test_kl_of_logits_matches_scipy_on_random_outputs_float16_included():
    for rng, rows, classes in _cases(1):
        reference = (rng.normal(size=(rows, classes)) * rng.choice([1, 10, 60])).astype(np.float32)
        noise = rng.normal(size=(rows, classes)) * rng.choice([0.01, 1.0, 20.0])
        outputs = (reference + noise).astype(rng.choice([np.float32, np.float16]))
        np.testing.assert_allclose(metrics.kl_rows(reference, outputs), _true_kl_of_logits(reference, outputs),
                                   rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("reference", "outputs"), [
    ([[0.0, 0.0]], [[0.0, -100.0]]),  # half FP32's mass on a class the variant gives e^-100: 49.3 nats
    ([[1e4, 0.0, -1e4]], [[-1e4, 0.0, 1e4]]),  # saturated logits swapped: 20000 nats
    ([[3e38, -3e38]], [[-3e38, 3e38]]),  # float32's extremes
])
def test_kl_of_far_apart_logits_is_not_capped(reference, outputs):
    """A clip of the probabilities at 1e-12 capped each row's KL near 27.6 nats (49.3 read 13.1), so a few ruined
    rows moved kl_mean by a fraction of what they cost."""
    reference, outputs = np.array(reference, np.float32), np.array(outputs, np.float32)
    expected = _true_kl_of_logits(reference, outputs)
    assert expected[0] > 28
    np.testing.assert_allclose(metrics.kl_rows(reference, outputs), expected, rtol=1e-9)


def test_kl_of_one_binary_logit_matches_scipy():
    rng = np.random.default_rng(2)
    reference = rng.normal(size=(200, 1)) * 30
    outputs = reference + rng.normal(size=(200, 1)) * 10
    p = special.expit(reference[:, 0])
    log_p = np.stack([special.log_expit(-reference[:, 0]), special.log_expit(reference[:, 0])], axis=1)
    log_q = np.stack([special.log_expit(-outputs[:, 0]), special.log_expit(outputs[:, 0])], axis=1)
    expected = (np.stack([1 - p, p], axis=1) * (log_p - log_q)).sum(axis=1)
    np.testing.assert_allclose(metrics.kl_rows(reference, outputs, False), expected, rtol=1e-7, atol=1e-12)


def test_kl_of_probabilities_is_scipys_on_the_clipped_distributions_and_never_a_second_softmax():
    for rng, rows, classes in _cases(3):
        p = special.softmax(rng.normal(size=(rows, classes)) * 3, axis=1).astype(np.float32)
        q = special.softmax(rng.normal(size=(rows, classes)) * 3, axis=1).astype(np.float32)
        clipped_p, clipped_q = (np.clip(x / x.sum(axis=1, keepdims=True), 1e-12, 1)
                                for x in (p.astype(float), q.astype(float)))
        expected = special.rel_entr(clipped_p, clipped_q).sum(axis=1)
        np.testing.assert_allclose(metrics.kl_rows(p, q), expected, rtol=1e-6, atol=1e-12)


def test_kl_is_nan_on_a_row_where_either_side_is_not_finite():
    reference = np.array([[1.0, 2.0], [1.0, 2.0], [np.inf, 0.0]])
    outputs = np.array([[1.0, np.nan], [1.0, 2.0], [1.0, 2.0]])
    kl = metrics.kl_rows(reference, outputs)
    assert math.isnan(kl[0]) and kl[1] == 0.0 and math.isnan(kl[2])


def test_top1_accuracy_agreement_and_flip_rate_match_sklearn():
    for rng, rows, classes in _cases(4):
        reference = rng.integers(-3, 3, size=(rows, classes)).astype(np.float16)  # many ties between classes
        outputs = rng.integers(-3, 3, size=(rows, classes)).astype(np.float32)
        labels = rng.integers(0, classes, rows)
        predicted, reference_predicted = metrics.top1(outputs), metrics.top1(reference)
        np.testing.assert_array_equal(predicted, np.argmax(outputs, axis=1))  # ties: the first class, as numpy's
        assert metrics.accuracy(predicted, labels) == skm.accuracy_score(labels, np.argmax(outputs, axis=1))
        share = skm.accuracy_score(np.argmax(reference, axis=1), np.argmax(outputs, axis=1))
        assert metrics.agreement(predicted, reference_predicted) == pytest.approx(share, abs=1e-15)
        assert metrics.flip_rate(predicted, reference_predicted) == pytest.approx(1 - share, abs=1e-15)


def test_a_nonfinite_row_never_agrees_not_even_with_itself():
    outputs = np.array([[np.nan, 1.0], [np.inf, 0.0], [2.0, 1.0]], np.float16)
    predicted = metrics.top1(outputs)
    assert metrics.agreement(predicted, predicted) == pytest.approx(1 / 3)
    assert metrics.accuracy(predicted, np.array([0, 0, 0])) == pytest.approx(1 / 3)


def test_cosine_matches_scipy_and_zero_vectors_follow_their_rule():
    for rng, rows, features in _cases(5):
        a = rng.normal(size=(rows, features)).astype(np.float32)
        b = (a + rng.normal(size=(rows, features)) * rng.choice([0.01, 1.0])).astype(np.float16)
        expected = [1 - distance.cosine(x.astype(np.float64), y.astype(np.float64)) for x, y in zip(a, b)]
        np.testing.assert_allclose(metrics.cosine_rows(a, b), expected, atol=1e-12)
    zero, one = np.zeros((1, 3)), np.ones((1, 3))
    assert metrics.cosine_rows(zero, zero)[0] == 1.0 and metrics.cosine_rows(zero, one)[0] == 0.0


def test_regression_metrics_match_sklearns_uniform_average():
    for rng, rows, targets in _cases(6):
        target = rng.normal(size=(rows + 1, targets)) * rng.choice([1e-4, 1.0, 40.0])
        predicted = target + rng.normal(size=target.shape) * np.abs(target).mean()
        assert metrics_targets.mean_absolute_error(predicted, target) == pytest.approx(skm.mean_absolute_error(target, predicted))
        assert metrics_targets.root_mean_squared_error(predicted, target) == pytest.approx(
            skm.root_mean_squared_error(target, predicted))
        assert metrics_targets.r2_score(predicted, target) == pytest.approx(skm.r2_score(target, predicted))
        assert metrics_targets.r2_min(predicted, target) == pytest.approx(
            skm.r2_score(target, predicted, multioutput="raw_values").min())


def test_a_constant_target_has_no_r2_and_is_left_out_of_the_average():
    target = np.array([[1.0, 5.0], [2.0, 5.0], [3.0, 5.0]])
    predicted = np.array([[1.5, 4.0], [2.0, 6.0], [2.5, 5.0]])
    assert metrics_targets.r2_score(predicted, target) == pytest.approx(skm.r2_score(target[:, 0], predicted[:, 0]))
    assert math.isnan(metrics_targets.r2_score(predicted[:, 1], target[:, 1]))


def test_multilabel_f1_matches_sklearn_with_zero_division_one():
    for rng, rows, labels in _cases(7):
        truth = (rng.random((rows, labels)) < rng.random()).astype(np.int64)
        decided = (rng.random((rows, labels)) < rng.random()).astype(np.int64)
        assert metrics_targets.micro_f1(decided, truth) == pytest.approx(
            skm.f1_score(truth, decided, average="micro", zero_division=1))
        positive = (truth.sum(axis=0) + decided.sum(axis=0)) > 0  # documented: labels positive on neither side out
        expected = skm.f1_score(truth[:, positive], decided[:, positive], average="macro", zero_division=1) \
            if positive.any() else 1.0
        assert metrics_targets.macro_f1(decided, truth) == pytest.approx(expected)


def test_multilabel_decisions_of_a_nonfinite_row_are_wrong_on_every_label():
    decided = metrics_targets.multilabel_predictions(np.array([[np.nan, 0.9], [0.2, 0.8]]), True)
    truth = np.array([[0, 1], [0, 1]])
    # row 0 counts as a false positive on label 0 and a false negative on label 1
    assert metrics_targets.micro_f1(decided, truth) == pytest.approx(skm.f1_score(truth, [[1, 0], [0, 1]], average="micro"))


def test_intervals_match_scipy():
    z = stats.norm.ppf(0.975)
    rng = np.random.default_rng(8)
    for _ in range(TRIALS):
        n = int(rng.integers(1, 300))
        k = int(rng.integers(0, n + 1))
        interval = stats.binomtest(k, n).proportion_ci(method="wilson")
        np.testing.assert_allclose(metrics.wilson_interval(k, n, z), (interval.low, interval.high), atol=1e-12)
        values = rng.normal(size=n + 1)
        half = z * stats.sem(values)
        np.testing.assert_allclose(metrics.mean_interval(values, z), (values.mean() - half, values.mean() + half))


def _nn_brute_force(reference: np.ndarray, outputs: np.ndarray) -> np.ndarray:
    """From the definition: the rows tied nearest under `outputs` must all be tied nearest under `reference`."""
    def nearest(vectors, row):
        cos = np.array([-np.inf if j == row else 1 - distance.cosine(vectors[row], vectors[j])
                        for j in range(len(vectors))])
        return cos, set(np.flatnonzero(cos >= cos.max() - neighbours.NEIGHBOUR_TIE))
    result = []
    for row in range(len(reference)):
        expected = nearest(reference, row)[1]
        result.append(float(nearest(outputs, row)[1] <= expected))
    return np.array(result)


def test_nearest_neighbour_agreement_matches_a_brute_force_search_with_duplicate_rows():
    for rng, rows, features in _cases(9):
        if rows < 2:
            continue
        reference = rng.normal(size=(rows, features))
        reference[rows // 2] = reference[0]  # a copy: tied neighbours
        outputs = reference + rng.normal(size=reference.shape) * rng.choice([0.0, 0.05, 0.5])
        np.testing.assert_array_equal(neighbours.nearest_neighbour_matches(reference, outputs),
                                      _nn_brute_force(reference, outputs))


def test_best_span_and_its_f1_match_a_brute_force_search():
    for rng, rows, _ in _cases(10):
        tokens = int(rng.integers(1, 12))
        start = rng.integers(0, 4, size=(rows, tokens)).astype(np.float64)  # ties
        end = rng.integers(0, 4, size=(rows, tokens)).astype(np.float64)
        allowed = rng.random((rows, tokens)) < 0.8
        longest = int(rng.integers(1, 6))
        spans = best_spans(start, end, allowed, longest)
        for row in range(rows):
            candidates = [(-(start[row, s] + end[row, e]), e - s, s, e) for s in range(tokens) for e in range(tokens)
                          if s <= e < s + longest and allowed[row, s] and allowed[row, e]]
            assert tuple(spans[row]) == ((min(candidates)[2:]) if candidates else (NO_SPAN, NO_SPAN))
        targets = np.sort(rng.integers(0, tokens, size=(rows, 2)), axis=1)
        for row, f1 in enumerate(token_f1(spans, targets)):
            got, want = set(range(spans[row, 0], spans[row, 1] + 1)), set(range(targets[row, 0], targets[row, 1] + 1))
            shared = len(got & want) if spans[row, 0] != NO_SPAN else 0
            assert f1 == pytest.approx(2 * shared / (len(got) + len(want)) if shared else 0.0)


@pytest.mark.parametrize(("metric", "reference", "value", "worse_by"), [
    ("accuracy", 0.9, 0.85, 0.05), ("accuracy", 0.9, 0.95, -0.05), ("mae", 1.0, 1.5, 0.5), ("kl_mean", 0.0, 0.2, 0.2),
    ("cosine", 1.0, 0.99, 0.01), ("flip_rate", 0.0, 0.1, 0.1), ("r2", 0.8, 0.7, 0.1), ("max_abs_error", 0.0, 0.3, 0.3),
])
def test_drops_follow_each_metrics_direction(metric, reference, value, worse_by):
    assert drop(metric, reference, value) == pytest.approx(worse_by)


def test_a_drop_equal_to_its_tolerance_passes_and_one_just_over_fails():
    assert within(drop("accuracy", 0.91, 0.90), 0.01, 0.91, 0.90)  # 0.010000000000000009 in float64
    assert not within(drop("accuracy", 0.91, 0.8999), 0.01, 0.91, 0.8999)
    assert within(drop("mae", 100000.0, 100000.1), 0.1, 100000.0, 100000.1)
