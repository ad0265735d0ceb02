"""Metrics against target values, pure functions over numpy arrays as in qbench.validate.metrics: regression errors
(MAE, RMSE, R² averaged over targets and the worst target's) and multi-label decisions and F1.

Conventions as there: axis 0 is the row axis, float64 arithmetic, empty input gives NaN and NaN propagates.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from qbench.validate.metrics import INVALID_CLASS, _float_rows, _mean, _same_shape, mean_interval, nonfinite_rows

# -- regression ---------------------------------------------------------------------------------


def mean_absolute_error(predicted: np.ndarray, target: np.ndarray) -> float:
    """Mean |predicted - target| over all elements (= each target's MAE averaged uniformly); NaN for none."""
    predicted, target = _same_shape(predicted, target)
    return _mean(np.abs(predicted - target))


def _target_columns(predicted: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both as (rows, targets) float64: a 1-D array is one target; the shapes must match."""
    predicted, target = _same_shape(predicted, target)
    return _float_rows(predicted), _float_rows(target)


def root_mean_squared_error(predicted: np.ndarray, target: np.ndarray) -> float:
    """sqrt(mean((predicted - target)^2)) of each target column, averaged uniformly over the targets
    (scikit-learn's default 'uniform_average'); a single target is the plain RMSE. NaN for no rows."""
    predicted_rows, target_rows = _target_columns(predicted, target)
    if predicted_rows.size == 0:
        return math.nan
    return _mean(np.sqrt(np.mean((predicted_rows - target_rows) ** 2, axis=0)))


def _r2_columns(predicted: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """1 - SS_res / SS_tot of each target column (SS_tot around that column's mean), and which columns' targets vary
    (a constant one has no R²; a NaN from NaN outputs or targets is kept, so it propagates). No columns for no rows."""
    predicted_rows, target_rows = _target_columns(predicted, target)
    if predicted_rows.shape[0] == 0:
        return np.zeros(0), np.zeros(0, dtype=bool)
    varies = ~(np.ptp(target_rows, axis=0) == 0)
    total = np.sum((target_rows - target_rows.mean(axis=0)) ** 2, axis=0)
    residual = np.sum((target_rows - predicted_rows) ** 2, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(varies, 1.0 - residual / np.where(varies, total, 1.0), math.nan), varies


def _defined_r2(predicted: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The R² of the target columns whose target varies."""
    per_target, varies = _r2_columns(predicted, target)
    return per_target[varies]


def r2_score(predicted: np.ndarray, target: np.ndarray) -> float:
    """R² of each target column averaged uniformly (scikit-learn's default 'uniform_average', not the pooled
    'variance_weighted'), over the columns whose target varies; a single target is the plain R².
    NaN for no rows or when every target column is constant."""
    return _mean(_defined_r2(predicted, target))


def r2_min(predicted: np.ndarray, target: np.ndarray) -> float:
    """The worst target column's R² (over the columns whose target varies): a target the variant
    destroys shows here even when the others keep the average up. NaN as for `r2_score`."""
    defined = _defined_r2(predicted, target)
    return float(np.min(defined)) if defined.size else math.nan


def drop_intervals(predicted: np.ndarray, reference: np.ndarray, target: np.ndarray) -> dict[str, tuple[float, float]]:
    """The paired 95 % interval of the drop (worse minus FP32's, positive = worse) of mae, rmse, r2 and r2_min from
    FP32's outputs `reference` to `predicted`, both against `target` on the same rows: each row's own change of error,
    so the noise both share (a hard row is hard for both) cancels. mae: mean_interval of each row's mean over targets
    of |predicted - target| - |reference - target|. rmse, one target: the interval of the MSE difference mapped through
    sqrt against FP32's MSE (monotone); several: each target's drop is its MSE difference over the sum of the two
    RMSEs (sqrt(a) - sqrt(b) = (a - b) / (sqrt(a) + sqrt(b)), exactly), so the drop of their mean is the mean over rows
    of each row's squared-error changes, each over its target's sum, averaged over the targets: the interval of that
    mean (the sums taken as measured, a delta-method interval). A pooled sum of squared changes would let a
    large-scale target hide a small one, as the mean of RMSEs does not. r2: the SSE difference over each varying
    target's SST, averaged over them (linear: a mean over rows); none where no target varies. r2_min: the worst
    target's R² drops by no less than the smallest of the targets' drops and no more than the largest, nor than the
    largest of FP32's worst target's R² less each target's for the variant (_worst_target_interval), each a paired
    interval at 1 - 5 % / (2 targets - 1) (Bonferroni: all hold together with 95 %). A NaN in
    either error gives NaN bounds, as the figures themselves are NaN."""
    predicted_rows, target_rows = _target_columns(predicted, target)
    reference_rows = _target_columns(reference, target)[0]
    ours, theirs = predicted_rows - target_rows, reference_rows - target_rows
    rows, targets = ours.shape
    intervals = {"mae": mean_interval((np.abs(ours) - np.abs(theirs)).mean(axis=1))}
    squared = ours**2 - theirs**2
    if targets == 1 and rows:
        reference_mse = float(np.mean(theirs**2))
        mse_ends = reference_mse + np.array(mean_interval(squared[:, 0]))
        ends = np.sqrt(np.maximum(mse_ends, 0.0)) - math.sqrt(reference_mse)
        intervals["rmse"] = (float(ends[0]), float(ends[1]))
    elif rows:
        both = np.sqrt(np.mean(ours**2, axis=0)) + np.sqrt(np.mean(theirs**2, axis=0))
        with np.errstate(invalid="ignore", divide="ignore"):  # a target both fit exactly: no change, 0
            per_target = np.where(both > 0, squared / np.where(both > 0, both, 1.0), squared)
        intervals["rmse"] = mean_interval(per_target.mean(axis=1))
    varies = ~(np.ptp(target_rows, axis=0) == 0) if rows else np.zeros(targets, dtype=bool)
    if varies.any():
        total = np.sum((target_rows - target_rows.mean(axis=0)) ** 2, axis=0)[varies]
        intervals["r2"] = mean_interval((rows * squared[:, varies] / total).mean(axis=1))
        intervals["r2_min"] = _worst_target_interval(rows * ours[:, varies] ** 2 / total,
                                                     rows * theirs[:, varies] ** 2 / total)  # fmt: skip
    return intervals


def _worst_target_interval(ours: np.ndarray, theirs: np.ndarray) -> tuple[float, float]:
    """The interval of the drop of the worst target's R² from each varying target's per-row squared errors over its
    SST / rows (rows, targets; the variant's `ours`, FP32's `theirs`: a target's R² is 1 less their mean). With R_j
    FP32's R², R'_j the variant's and d_j = R_j - R'_j, min_j R'_j >= min_j R_j - max_j d_j, and at FP32's worst
    target k it is at most R_k - d_k, so the drop lies in [min_j d_j, max_j d_j]. It is also at most
    R_k - min_j R'_j = max_j (R_k - R'_j): a target FP32 fits far better than its worst moves r2_min only past that
    gap, which the paired mean of j's squared error (ours) less k's (theirs) measures on the same rows as the change
    (with ten targets, max_j d_j alone left a variant unresolved where its best target's R² moved past the
    tolerance and its worst by none; and d_j's own interval, paired within a target, is the narrower where the
    targets are alike). Every interval at 1 - 5 % / (2 targets - 1) (Bonferroni: all hold together with 95 %; one
    target: r2's own interval)."""
    if ours.shape[1] == 1:
        return mean_interval(ours[:, 0] - theirs[:, 0])
    z = NormalDist().inv_cdf(1 - 0.05 / (2 * (2 * ours.shape[1] - 1)))
    drops = np.array([mean_interval(ours[:, j] - theirs[:, j], z) for j in range(ours.shape[1])])
    with np.errstate(invalid="ignore"):  # a NaN error: NaN bounds
        k = int(np.argmax(np.mean(theirs, axis=0)))
    past = [mean_interval(ours[:, j] - theirs[:, k], z)[1] for j in range(ours.shape[1]) if j != k]
    return float(np.min(drops[:, 0])), float(min(np.max(drops[:, 1]), np.max(np.maximum(past, drops[k, 1]))))


# -- multilabel -------------------------------------------------------------------------------


def multilabel_predictions(outputs: np.ndarray, as_probabilities: bool) -> np.ndarray:
    """(rows, labels) 0/1 decisions: score > 0.5 for probabilities, > 0 for logits. A row holding NaN/inf has no
    decision (INVALID_CLASS on every label, as top1 gives such a row no class): a miss against every label and
    every other result, never a run of correct negatives."""
    scores = _float_rows(outputs)
    threshold = 0.5 if as_probabilities else 0.0
    with np.errstate(invalid="ignore"):
        decisions = (scores > threshold).astype(np.int64)
    decisions[nonfinite_rows(scores)] = INVALID_CLASS
    return decisions


def _f1(true_positive: np.ndarray, false_positive: np.ndarray, false_negative: np.ndarray) -> np.ndarray:
    """2tp / (2tp + fp + fn); NaN where there is no positive in prediction or truth (F1 is 0/0 there)."""
    denominator = 2 * true_positive + false_positive + false_negative
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, 2 * true_positive / np.maximum(denominator, 1), np.nan)


def _confusion(predicted: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per label (tp, fp, fn). A missing decision (INVALID_CLASS) is wrong whatever the truth: a false negative
    on a positive, a false positive on a negative."""
    predicted, target = _same_shape(predicted, target)
    decided = _float_rows(predicted)
    p, t, missing = decided > 0.5, _float_rows(target) > 0.5, decided == INVALID_CLASS
    return (p & t).sum(axis=0), ((p | missing) & ~t).sum(axis=0), (~p & t).sum(axis=0)


NO_POSITIVES_F1 = 1.0
"""F1 where neither prediction nor truth holds a positive: every decision is right (scikit-learn's zero_division=1)."""


def micro_f1(predicted: np.ndarray, target: np.ndarray) -> float:
    """F1 over all (row, label) decisions pooled; NO_POSITIVES_F1 when neither side has a positive; NaN for no rows."""
    if _float_rows(predicted).shape[0] == 0:
        return math.nan
    tp, fp, fn = _confusion(predicted, target)
    pooled = float(_f1(np.array(tp.sum()), np.array(fp.sum()), np.array(fn.sum())))
    return NO_POSITIVES_F1 if math.isnan(pooled) else pooled


def macro_f1(predicted: np.ndarray, target: np.ndarray) -> float:
    """Mean of the per-label F1 over labels positive in the prediction or the target (a label with no positive
    on either side has no F1 and is left out); NO_POSITIVES_F1 when no label is; NaN for no rows."""
    if _float_rows(predicted).shape[0] == 0:
        return math.nan
    per_label = _f1(*_confusion(predicted, target))
    defined = per_label[~np.isnan(per_label)]
    return _mean(defined) if defined.size else NO_POSITIVES_F1
