"""Metric functions against values worked out by hand in the comments."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qbench.errors import QbenchError
from qbench.tasks import gate_metric_names
from qbench.validate import catalogue, metrics, metrics_targets

NAN = float("nan")


# -- top1 -----------------------------------------------------------------------------------------


def test_top1_argmax_and_nonfinite_rows_get_invalid_class() -> None:
    outputs = np.array([[0.1, 0.7, 0.2], [2.0, 1.0, 0.0], [NAN, 1.0, 0.0], [0.0, np.inf, 1.0]])
    # argmax: row 0 -> 1, row 1 -> 0; rows 2 and 3 hold NaN / inf -> -1
    assert metrics.top1(outputs).tolist() == [1, 0, -1, -1]


def test_top1_single_probability_column_thresholds_at_half() -> None:
    # every score in [0, 1] -> probabilities: 0.2 -> 0, 0.7 -> 1, 0.5 -> 0 (strictly greater)
    assert metrics.top1(np.array([[0.2], [0.7], [0.5]])).tolist() == [0, 1, 0]


def test_top1_single_logit_column_thresholds_at_zero() -> None:
    # 2.0 is outside [0, 1] -> logits: -1 -> 0, 2 -> 1, 0.3 -> 1 (would be 0 as a probability)
    assert metrics.top1(np.array([[-1.0], [2.0], [0.3]])).tolist() == [0, 1, 1]
    assert metrics.top1(np.array([-1.0, 2.0, 0.3])).tolist() == [0, 1, 1]  # 1-D: one score per row


def test_top1_squeezes_unit_middle_axes_and_rejects_others() -> None:
    assert metrics.top1(np.array([[[0.0, 3.0]], [[5.0, 1.0]]])).tolist() == [1, 0]
    with pytest.raises(QbenchError, match="rows, classes"):
        metrics.top1(np.zeros((2, 3, 4)))


# -- accuracy / agreement / flip rate -------------------------------------------------------------


def test_accuracy_counts_invalid_rows_as_wrong_even_against_label_minus_one() -> None:
    # row 0 right, row 1 wrong, row 2 invalid (-1 == label -1 must not count) -> 1/3
    assert metrics.accuracy(np.array([1, 0, -1]), np.array([1, 1, -1])) == pytest.approx(1 / 3)


def test_agreement_and_flip_rate() -> None:
    a, b = np.array([1, 0, -1]), np.array([1, 0, -1])
    # rows 0 and 1 agree; row 2 is -1 on both sides and never agrees -> 2/3, flips 1/3
    assert metrics.agreement(a, b) == pytest.approx(2 / 3)
    assert metrics.flip_rate(a, b) == pytest.approx(1 / 3)
    assert metrics.agreement(np.array([0, 1, 2, 3]), np.array([0, 2, 2, 0])) == 0.5


def test_prediction_length_mismatch_is_an_error() -> None:
    with pytest.raises(QbenchError):
        metrics.agreement(np.array([0, 1]), np.array([0, 1, 2]))


# -- softmax / probabilities -----------------------------------------------------------------------


def test_softmax_values_and_stability() -> None:
    # exp(0), exp(ln 2), exp(ln 3) = 1, 2, 3 -> 1/6, 2/6, 3/6
    got = metrics.softmax(np.array([[0.0, math.log(2), math.log(3)]]))
    np.testing.assert_allclose(got, [[1 / 6, 2 / 6, 3 / 6]])
    np.testing.assert_allclose(metrics.softmax(np.array([[1000.0, 1000.0]])), [[0.5, 0.5]])
    assert np.isnan(metrics.softmax(np.array([[NAN, 1.0]]))).all()


def test_softmax_of_an_overflowed_row_is_nan_without_a_warning() -> None:
    """FP16 overflow gives inf logits; the sweep log must not carry numpy's RuntimeWarning for it."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = metrics.softmax(np.array([[math.inf, 1.0], [0.0, 0.0]]))
    assert np.isnan(got[0]).all()
    np.testing.assert_allclose(got[1], [0.5, 0.5])


def test_to_probabilities_keeps_probabilities_and_softmaxes_logits() -> None:
    np.testing.assert_allclose(metrics.to_probabilities(np.array([[0.25, 0.75]])), [[0.25, 0.75]])
    # [0, 0] does not sum to 1 -> logits -> softmax [0.5, 0.5]
    np.testing.assert_allclose(metrics.to_probabilities(np.array([[0.0, 0.0]])), [[0.5, 0.5]])
    # one binary column: probability 0.8 -> [0.2, 0.8]; logit 0 -> sigmoid 0.5; logit -2 -> 1/(1+e^2)
    np.testing.assert_allclose(metrics.to_probabilities(np.array([[0.8]])), [[0.2, 0.8]])
    p = 1 / (1 + math.e**2)
    np.testing.assert_allclose(metrics.to_probabilities(np.array([[0.0], [-2.0]])), [[0.5, 0.5], [1 - p, p]])


# -- kl / cosine / max abs error ---------------------------------------------------------------------


def test_kl_rows_on_probabilities() -> None:
    reference = np.array([[0.5, 0.5], [0.2, 0.8]])
    outputs = np.array([[0.25, 0.75], [0.2, 0.8]])
    # row 0: 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 ln(4/3); row 1: identical -> 0
    np.testing.assert_allclose(metrics.kl_rows(reference, outputs), [0.5 * math.log(4 / 3), 0.0], atol=1e-12)


def test_kl_rows_on_logits_matches_the_same_distributions() -> None:
    # softmax [0, 0] = [0.5, 0.5]; softmax [0, ln 3] = [0.25, 0.75] -> 0.5 ln(4/3) as above
    got = metrics.kl_rows(np.array([[0.0, 0.0]]), np.array([[0.0, math.log(3)]]))
    np.testing.assert_allclose(got, [0.5 * math.log(4 / 3)])


def test_kl_reads_the_variant_as_the_reference_is_read() -> None:
    # the variant's row sums to 0.9984 (off 1 by more than 1e-3): it is still read as probabilities
    # because the reference is, and renormalised to [0.25, 0.75] -> 0.5 ln(4/3)
    got = metrics.kl_rows(np.array([[0.5, 0.5]]), np.array([[0.2496, 0.7488]]))
    np.testing.assert_allclose(got, [0.5 * math.log(4 / 3)])


def test_kl_zero_in_variant_stays_finite() -> None:
    # Q = [1, 0] clipped to [1, 1e-12]: 0.5 ln(0.5) + 0.5 ln(0.5 / 1e-12) = 0.5 ln(0.25e12)
    got = metrics.kl_rows(np.array([[0.5, 0.5]]), np.array([[1.0, 0.0]]))
    np.testing.assert_allclose(got, [0.5 * math.log(0.25e12)], rtol=1e-9)


def test_kl_of_a_variant_row_with_no_probability_mass_is_large_not_nan() -> None:
    # the reference row [0.5, 0.3, 0.2] is probabilities, so the variant's [0, 0, 0] (INT8 rounding every
    # probability to 0) is read as probabilities too: no mass anywhere, each class clipped to 1e-12, so
    # KL = sum p ln(p / 1e-12); the other row is untouched
    reference = np.array([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]])
    got = metrics.kl_rows(reference, np.array([[0.0, 0.0, 0.0], [0.5, 0.3, 0.2]]))
    expected = sum(p * math.log(p / 1e-12) for p in (0.5, 0.3, 0.2))
    np.testing.assert_allclose(got, [expected, 0.0], rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(metrics.to_probabilities(np.array([[0.0, 0.0, 0.0]]), True), [[0.0, 0.0, 0.0]])


def test_cosine_rows_including_zero_vectors() -> None:
    a = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [3.0, 4.0]])
    b = np.array([[0.0, 1.0], [2.0, 2.0], [0.0, 0.0], [1.0, 0.0], [4.0, 3.0]])
    # orthogonal 0; parallel 1; both zero 1; one zero 0; (3*4 + 4*3) / (5*5) = 0.96
    np.testing.assert_allclose(metrics.cosine_rows(a, b), [0.0, 1.0, 1.0, 0.0, 0.96])


def test_cosine_rows_flattens_non_batch_axes() -> None:
    a = np.array([[[3.0, 0.0], [0.0, 4.0]]])
    b = np.array([[[4.0, 0.0], [0.0, 3.0]]])
    np.testing.assert_allclose(metrics.cosine_rows(a, b), [0.96])


def test_max_abs_error() -> None:
    # |2 - 2.5| = 0.5, |3 - 2| = 1 -> 1
    assert metrics.max_abs_error(np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([[1.0, 2.5], [2.0, 4.0]])) == 1.0
    with pytest.raises(QbenchError, match="shapes"):
        metrics.max_abs_error(np.zeros((2, 2)), np.zeros((2, 3)))


def test_float16_outputs_are_compared_in_float64() -> None:
    a = np.array([[1.0, 2.0]], dtype=np.float16)
    b = np.array([[1.0, 2.001953125]], dtype=np.float16)  # the next float16 after 2
    assert metrics.max_abs_error(a, b) == 2**-9


# -- intervals --------------------------------------------------------------------------------------


def test_wilson_interval_hand_computed() -> None:
    # p = 0.8, n = 10, z^2 = 3.8416, denominator 1.38416
    # centre = (0.8 + 0.19208) / 1.38416 = 0.716738; half = 1.96 sqrt(0.016 + 0.009604) / 1.38416 = 0.226581
    low, high = metrics.wilson_interval(8, 10)
    assert low == pytest.approx(0.490157, abs=1e-5)
    assert high == pytest.approx(0.943319, abs=1e-5)


def test_wilson_interval_edges() -> None:
    low, high = metrics.wilson_interval(0, 10)
    assert low == 0.0 and 0.0 < high < 0.35
    low, high = metrics.wilson_interval(10, 10)
    assert high == 1.0 and 0.65 < low < 1.0
    assert all(math.isnan(v) for v in metrics.wilson_interval(0, 0))
    with pytest.raises(ValueError):
        metrics.wilson_interval(11, 10)


def test_mean_interval() -> None:
    # mean 2, sample std 1, half width 1.96 / sqrt(3) = 1.131607
    low, high = metrics.mean_interval(np.array([1.0, 2.0, 3.0]))
    assert low == pytest.approx(2 - 1.131607, abs=1e-6)
    assert high == pytest.approx(2 + 1.131607, abs=1e-6)
    assert metrics.mean_interval(np.array([5.0])) == (5.0, 5.0)
    assert all(math.isnan(v) for v in metrics.mean_interval(np.array([])))


# -- empty input and NaN ----------------------------------------------------------------------------


def test_empty_input_gives_nan_everywhere() -> None:
    no_classes = np.zeros(0, dtype=np.int64)
    no_rows = np.zeros((0, 3))
    assert metrics.top1(no_rows).shape == (0,)
    assert math.isnan(metrics.accuracy(no_classes, no_classes))
    assert math.isnan(metrics.agreement(no_classes, no_classes))
    assert math.isnan(metrics.flip_rate(no_classes, no_classes))
    assert math.isnan(metrics.max_abs_error(no_rows, no_rows))
    assert metrics.kl_rows(no_rows, no_rows).shape == (0,)
    assert metrics.cosine_rows(no_rows, no_rows).shape == (0,)
    assert metrics.cosine_rows(np.zeros(0), np.zeros(0)).shape == (0,)


def test_nan_propagates() -> None:
    reference = np.array([[1.0, 0.0], [0.0, 1.0]])
    outputs = np.array([[1.0, 0.0], [NAN, 1.0]])
    assert math.isnan(metrics.max_abs_error(reference, outputs))
    kl = metrics.kl_rows(reference, outputs)
    assert kl[0] == pytest.approx(0.0) and math.isnan(kl[1])
    cosine = metrics.cosine_rows(reference, outputs)
    assert cosine[0] == pytest.approx(1.0) and math.isnan(cosine[1])
    assert math.isnan(metrics.mean_interval(np.array([1.0, NAN]))[0])


def test_nonfinite_rows() -> None:
    assert metrics.nonfinite_rows(np.array([[1.0, 2.0], [NAN, 0.0], [0.0, -np.inf]])).tolist() == [False, True, True]


def test_gate_metrics_per_task_and_drop_direction() -> None:
    assert gate_metric_names("embedding") == ["cosine", "cosine_min", "nn_agreement", "max_abs_error"]
    assert catalogue.drop("flip_rate", 0.01, 0.03) == pytest.approx(0.02)
    assert catalogue.drop("accuracy", 0.9, 0.95) == pytest.approx(-0.05)


# -- regression and multilabel (hand-computed) ----------------------------------------------------


def test_regression_errors_by_hand() -> None:
    predicted, target = np.array([1.0, 2.0, 4.0]), np.array([1.0, 3.0, 2.0])
    # errors 0, 1, 2: MAE 1, RMSE sqrt(5/3); target mean 2, SS_tot 1+1+0 = 2, SS_res 5 -> R² = -1.5
    assert metrics_targets.mean_absolute_error(predicted, target) == pytest.approx(1.0)
    assert metrics_targets.root_mean_squared_error(predicted, target) == pytest.approx(math.sqrt(5 / 3))
    assert metrics_targets.r2_score(predicted, target) == pytest.approx(-1.5)
    assert metrics_targets.r2_score(target, target) == pytest.approx(1.0)
    assert math.isnan(metrics_targets.r2_score(np.array([1.0, 2.0]), np.array([3.0, 3.0])))  # constant target
    assert math.isnan(metrics_targets.mean_absolute_error(np.array([]), np.array([])))
    assert metrics_targets.r2_min(predicted, target) == pytest.approx(-1.5)  # one target: the worst is the only one


def test_several_targets_are_judged_one_by_one_and_averaged_uniformly() -> None:
    """A small-scale target ruined beside a large-scale one that is kept: the average and the worst show it."""
    target = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    predicted = np.array([[1.0, 10.0], [2.0, 22.0], [0.0, 30.0]])
    # target 0: errors 0, 0, 3: SS_res 9, SS_tot 2 -> R² -3.5, RMSE sqrt(3)
    # target 1: errors 0, 2, 0: SS_res 4, SS_tot 200 -> R² 0.98, RMSE sqrt(4/3)
    # (pooled, the old figures: R² 1 - 13/202 = 0.936, RMSE sqrt(13/6): the large target hid the small one)
    assert metrics_targets._r2_columns(predicted, target)[0].tolist() == pytest.approx([-3.5, 0.98])
    assert metrics_targets.r2_score(predicted, target) == pytest.approx((-3.5 + 0.98) / 2)
    assert metrics_targets.r2_min(predicted, target) == pytest.approx(-3.5)
    assert metrics_targets.root_mean_squared_error(predicted, target) == pytest.approx((math.sqrt(3) + math.sqrt(4 / 3)) / 2)
    assert metrics_targets.mean_absolute_error(predicted, target) == pytest.approx(5 / 6)  # = (3/3 + 2/3) / 2


def test_r2_leaves_out_constant_targets_and_propagates_nan() -> None:
    target = np.array([[1.0, 5.0], [2.0, 5.0], [3.0, 5.0]])
    predicted = np.array([[1.0, 5.0], [2.0, 6.0], [4.0, 5.0]])
    # target 1 is constant (no R²): only target 0 counts, SS_res 1, SS_tot 2 -> 0.5
    assert metrics_targets.r2_score(predicted, target) == pytest.approx(0.5)
    assert metrics_targets.r2_min(predicted, target) == pytest.approx(0.5)
    assert math.isnan(metrics_targets.r2_score(np.full((3, 2), 5.0), np.full((3, 2), 5.0)))  # every target constant
    # 0.1 three times: its float mean is not exactly 0.1, yet the column is constant and has no R²
    assert math.isnan(metrics_targets._r2_columns(np.full((3, 1), 0.2), np.full((3, 1), 0.1))[0][0])
    predicted[1, 0] = NAN
    assert math.isnan(metrics_targets.r2_score(predicted, target)) and math.isnan(metrics_targets.r2_min(predicted, target))
    assert math.isnan(metrics_targets.r2_min(np.zeros((0, 2)), np.zeros((0, 2))))


def test_f1_by_hand() -> None:
    target = np.array([[1, 0, 0], [1, 1, 0], [0, 1, 0]])
    predicted = np.array([[1, 1, 0], [0, 1, 0], [0, 1, 0]])
    # pooled: tp 3 (r0l0, r1l1, r2l1), fp 1 (r0l1), fn 1 (r1l0) -> 6/8
    assert metrics_targets.micro_f1(predicted, target) == pytest.approx(0.75)
    # label 0: tp 1 fn 1 -> 2/3; label 1: tp 2 fp 1 -> 4/5; label 2: no positives anywhere -> left out
    assert metrics_targets.macro_f1(predicted, target) == pytest.approx((2 / 3 + 4 / 5) / 2)


def test_f1_without_any_positive_is_perfect_and_a_spurious_positive_drops_it() -> None:
    """A slice whose rows have no positive label, predicted all negative: every decision is right (F1 1, as
    scikit-learn's zero_division=1), not NaN; one spurious positive makes both F1s 0 (tp 0, fp 1)."""
    negatives, spurious = np.zeros((3, 2)), np.array([[0, 1], [0, 0], [0, 0]])
    assert metrics_targets.micro_f1(negatives, negatives) == metrics_targets.NO_POSITIVES_F1 == 1.0
    assert metrics_targets.macro_f1(negatives, negatives) == 1.0
    assert metrics_targets.micro_f1(spurious, negatives) == 0.0
    assert metrics_targets.macro_f1(spurious, negatives) == 0.0  # label 0 has no positive anywhere: left out
    assert catalogue.drop("macro_f1", 1.0, metrics_targets.macro_f1(spurious, negatives)) == 1.0
    assert math.isnan(metrics_targets.micro_f1(np.zeros((0, 2)), np.zeros((0, 2))))  # no rows
    assert math.isnan(metrics_targets.macro_f1(np.zeros((0, 2)), np.zeros((0, 2))))


def test_a_missing_multilabel_decision_is_wrong_whatever_the_truth() -> None:
    """A row without decisions (NaN/inf outputs) counts as a false negative on each positive label and a false
    positive on each negative one, and agrees with nothing, itself included."""
    target = np.array([[1, 0], [1, 0]])
    predicted = np.array([[1, 0], [-1, -1]])
    # label 0: tp 1, fn 1 -> 2/3; label 1: fp 1 -> 0; pooled: tp 1, fp 1, fn 1 -> 2/4
    assert metrics_targets.micro_f1(predicted, target) == pytest.approx(0.5)
    assert metrics_targets.macro_f1(predicted, target) == pytest.approx((2 / 3 + 0.0) / 2)
    assert metrics_targets.micro_f1(np.array([[-1, -1]]), np.array([[0, 0]])) == 0.0  # not NO_POSITIVES_F1
    assert metrics.same_decisions(predicted, predicted).tolist() == [[True, True], [False, False]]


def test_unscored_where_reference_is_makes_fp32_nan_rows_misses_for_the_variant() -> None:
    assert metrics.unscored_where_reference_is(np.array([0, 1, 2]), np.array([0, -1, 1])).tolist() == [0, -1, 2]
    decisions = metrics.unscored_where_reference_is(np.array([[1, 0], [1, 1]]), np.array([[1, 0], [-1, -1]]))
    assert decisions.tolist() == [[1, 0], [-1, -1]]


def test_kl_reads_the_scale_from_fp32s_finite_rows() -> None:
    """FP32 probabilities with one NaN row were read as logits (the NaN failed the 'every row sums to 1' test), so
    every other row went through a second softmax: KL([0.99, 0.01] || [0.5, 0.5]) came out 0.107, not 0.637."""
    reference = np.array([[0.99, 0.01], [NAN, NAN]])
    outputs = np.array([[0.5, 0.5], [0.5, 0.5]])
    by_hand = 0.99 * math.log(0.99 / 0.5) + 0.01 * math.log(0.01 / 0.5)
    got = metrics.kl_rows(reference, outputs)
    assert got[0] == pytest.approx(by_hand, abs=1e-12) and math.isnan(got[1])
    assert metrics.looks_like_probabilities(reference)
    assert not metrics.looks_like_probabilities(np.array([[NAN, NAN]]))


def test_kl_of_one_score_column_follows_the_scale_it_is_given() -> None:
    """A logit column whose FP32 values happen to lie in [0, 1]: read as logits (the graph's word), KL compares the
    sigmoids; without the word, the values are read as probabilities."""

    def bernoulli_kl(p: float, q: float) -> float:
        return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))

    def sigmoid(x: float) -> float:
        return 1 / (1 + math.exp(-x))

    reference, outputs = np.array([[0.4]]), np.array([[0.3]])
    as_logits = metrics.kl_rows(reference, outputs, as_probabilities=False)
    assert as_logits[0] == pytest.approx(bernoulli_kl(sigmoid(0.4), sigmoid(0.3)), abs=1e-12)  # 0.00121
    assert metrics.kl_rows(reference, outputs)[0] == pytest.approx(bernoulli_kl(0.4, 0.3), abs=1e-12)  # 0.0226


def test_within_allows_float_rounding_at_every_scale() -> None:
    assert catalogue.within(100000.1 - 100000.0, 0.1, 100000.0, 100000.1)
    assert catalogue.within((0.1 + 0.2) - 0.2, 0.1, 0.2, 0.1 + 0.2)
    assert not catalogue.within(0.1001, 0.1, 100000.0, 100000.1001)
    assert not catalogue.within(1e-11, 0.0, 0.5, 0.5)  # a zero tolerance allows rounding only
    assert not catalogue.within(math.inf, 0.1, 0.5)


def test_within_has_no_absolute_floor_on_tiny_figures() -> None:
    """MAEs of 1e-13 and 2e-13 (targets in 1e-12 units): a drop of 1e-13 against a tolerance of 1e-15 is a breach.
    A slack floored at 1e-12 (ROUNDING x 1.0) passed it, and any drop under 1e-12 whatever the tolerance."""
    assert not catalogue.within(2e-13 - 1e-13, 1e-15, 1e-13, 2e-13)
    assert not catalogue.within(1e-13, 0.0)  # a zero tolerance between no figures: not even 1e-13 passes
    assert catalogue.within((3e-13 + 1e-13) - 3e-13, 1e-13, 3e-13, 3e-13 + 1e-13)  # rounding at that scale still does
    assert catalogue.within(0.0, 0.0, 0.0, 0.0)


def test_multilabel_thresholds() -> None:
    # a row holding NaN has no decision (as top1 gives it no class), not a run of negatives
    assert metrics_targets.multilabel_predictions(np.array([[0.2, 0.7], [NAN, 0.5]]), True).tolist() == [[0, 1], [-1, -1]]
    assert metrics_targets.multilabel_predictions(np.array([[-0.1, 0.3]]), False).tolist() == [[0, 1]]
    assert metrics.looks_like_sigmoid(np.array([[0.0, 1.0], [NAN, 0.4]]))
    assert not metrics.looks_like_sigmoid(np.array([[-2.0, 1.0]]))


def test_catalogue_resolves_output_prefixes_and_refuses_unknown_directions() -> None:
    assert catalogue.METRICS["probabilities/kl_mean"].higher_is_better is False
    assert catalogue.drop("logits/accuracy", 0.9, 0.8) == pytest.approx(0.1)
    assert catalogue.drop("mae", 1.0, 1.5) == pytest.approx(0.5)
    with pytest.raises(QbenchError, match="unknown metric 'no_such_metric'"):
        catalogue.drop("no_such_metric", 1.0, 1.0)
    with pytest.raises(QbenchError, match="another direction or range"):
        catalogue.METRICS.add(catalogue.MetricInfo("accuracy", False, "wrong way round"))


def test_kl_of_a_row_holding_inf_is_nan_even_where_its_distribution_would_be_finite() -> None:
    """-inf logits softmax to a finite distribution, and a +inf score's sigmoid is 1: such a row, FP32's or the
    variant's, still holds no value to compare, so its KL is NaN (a 0 there would dilute every result's mean)."""
    fp32_side = metrics.kl_rows(np.array([[-np.inf, 1.0], [0.0, 1.0]]), np.array([[0.0, 1.0], [0.0, 1.0]]))
    assert math.isnan(fp32_side[0]) and fp32_side[1] == 0.0
    variant_side = metrics.kl_rows(np.array([[0.0, 1.0]]), np.array([[-np.inf, 1.0]]))
    assert math.isnan(variant_side[0])
    score = metrics.kl_rows(np.array([[np.inf], [2.0]]), np.array([[30.0], [2.0]]), as_probabilities=False)
    assert math.isnan(score[0]) and score[1] == 0.0


# -- spread ---------------------------------------------------------------------------------------


def test_spread_is_the_rms_distance_of_the_finite_rows_from_their_mean_row(monkeypatch) -> None:
    # rows [0, 0], [2, 0], [NaN, 5] -> the finite rows' mean [1, 0]; distances 1 and 1 -> sqrt((1 + 1) / 2) = 1
    assert metrics.spread(np.array([[0.0, 0.0], [2.0, 0.0], [NAN, 5.0]])) == 1.0
    monkeypatch.setattr(metrics, "ROW_BLOCK_ELEMENTS", 2)  # one row a block: the same figure
    assert metrics.spread(np.array([[0.0, 0.0], [2.0, 0.0], [NAN, 5.0]])) == 1.0
    assert metrics.spread(np.tile(np.float32([1e4, -3.0]), (5, 1))) == 0.0  # a constant output spreads 0
    assert metrics.spread(np.array([3, 1, 3, 1])) == 1.0  # class ids: numbers too
    assert math.isnan(metrics.spread(np.array([[NAN], [np.inf]])))
    assert math.isnan(metrics.spread(np.array(["a", "b"])))


def test_spread_of_a_slice_is_that_of_its_rows_alone(monkeypatch) -> None:
    values = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    values[::2] = [1.0, 2.0, 3.0]  # the even rows: one vector
    values[1] = NAN
    odd = np.arange(50) % 2 == 1
    assert metrics.spread(values, ~odd) == 0.0
    expected = metrics.spread(values[odd])
    assert expected > 0 and metrics.spread(values, odd) == expected
    monkeypatch.setattr(metrics, "ROW_BLOCK_ELEMENTS", 7)  # blocks of 2 rows: the same figure
    assert metrics.spread(values, odd) == pytest.approx(expected, rel=1e-12)
    assert math.isnan(metrics.spread(values, np.arange(50) == 1))  # the slice's only row holds NaN


def test_spread_over_the_values_read_varies_each_value_over_the_rows_it_is_read_on() -> None:
    """(rows, tokens, classes) with a (rows, tokens) mask. By hand: token 0 is read on rows 0-2 (0, 2, 4: variance
    8/3), token 1 on rows 0, 1, 3 (1, 3, 5: variance 8/3); row 2's unread token 1 (1000) moves nothing, and row 3's
    NaN on its unread token 0 keeps the row (its read token is finite)."""
    values = np.array([[[0.0], [1.0]], [[2.0], [3.0]], [[4.0], [1000.0]], [[NAN], [5.0]]])
    read = np.array([[True, True], [True, True], [True, False], [False, True]])
    assert metrics.spread(values, read=read) == pytest.approx(math.sqrt(16 / 3))
    assert metrics.spread(values, np.array([True, True, False, False]), read) == pytest.approx(math.sqrt(2.0))
    # every value read: the spread without a mask
    assert metrics.spread(values[:3], read=np.ones((3, 2), dtype=bool)) == pytest.approx(metrics.spread(values[:3]))
    assert math.isnan(metrics.spread(values, read=np.zeros((4, 2), dtype=bool)))


def test_changed_together_weighs_each_rows_changed_decisions_by_themselves():
    # rows 0, 0, 0, 1, 1, 2: decisions 0, 1 (row 0) and 3 (row 1) changed, INVALID_CLASS never agreeing:
    # (2^2 + 1^2) / 3 = 5 / 3
    reference = np.array([1, 2, 3, 4, 5, 6])
    predicted = np.array([0, metrics.INVALID_CLASS, 3, 0, 5, 6])
    rows = np.array([0, 0, 0, 1, 1, 2])
    assert metrics.changed_together(predicted, reference, rows) == pytest.approx(5 / 3)
    assert metrics.changed_together(reference, reference, rows) == 1.0  # nothing changed
    assert metrics.changed_together(np.zeros(6, dtype=np.int64), reference, np.arange(6)) == 1.0  # one a row
