"""Metrics: pure functions over numpy arrays (their names, directions and ranges: qbench.validate.catalogue).

Every function takes plain arrays and returns floats; empty input gives NaN
(never an exception and never a silent 0), and NaN propagates.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from qbench.errors import QbenchError

# -- pure functions over model outputs ------------------------------------------------------------
#
# Conventions: axis 0 is the row (batch) axis; classification outputs are (rows, classes) or
# (rows,) / (rows, 1) for a single binary score. Arithmetic is done in float64 whatever the
# model's output dtype, so FP16 outputs are compared exactly.

INVALID_CLASS = -1
"""The class of a row whose output holds NaN or inf: it never matches a label or another row."""

_PROBABILITY_TOLERANCE = 1e-3
_KL_EPS = 1e-12

ROW_BLOCK_ELEMENTS = 1 << 21
"""Values (rows x features) a row-wise function widens to float64 at once. Evaluation outputs can be rows x 1,000
classes over a million rows: widened whole, with a softmax's temporaries, that is tens of GB. Every row-wise figure
is computed block by block of rows instead (each row's arithmetic unchanged, so the figures are the same to the bit),
which bounds each temporary to about 16 MB whatever the row count."""


def row_blocks(rows: int, features: int, budget: int | None = None) -> list[slice]:
    """Consecutive slices covering `rows` rows, each holding at most `budget` values (ROW_BLOCK_ELEMENTS unless
    given; one row at least)."""
    step = max(1, (ROW_BLOCK_ELEMENTS if budget is None else budget) // max(features, 1))
    return [slice(start, min(start + step, rows)) for start in range(0, rows, step)]


def _features(values: np.ndarray) -> int:
    return int(np.prod(np.shape(values)[1:], dtype=np.int64))


def _float_rows(values: np.ndarray) -> np.ndarray:
    """`values` as float64, shaped (rows, features); a 1-D array is one feature per row."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 0:
        raise QbenchError(f"expected an array with a row axis, got a scalar ({array!r})")
    features = int(np.prod(array.shape[1:], dtype=np.int64))
    return array.reshape(array.shape[0], features)


def _same_shape(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both as float64; a shape mismatch is an error (broadcasting would silently compare wrong rows)."""
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a64.shape != b64.shape:
        raise QbenchError(f"outputs have different shapes: {a64.shape} vs {b64.shape}")
    return a64, b64


def _mean(values: np.ndarray) -> float:
    """Mean; NaN for no values (without numpy's empty-slice warning); NaN propagates."""
    return float(np.mean(values)) if np.size(values) else math.nan


def nonfinite_rows(outputs: np.ndarray, read: np.ndarray | None = None, masked: bool = False) -> np.ndarray:
    """Boolean mask of the rows holding any NaN or inf; `read`: (rows, n), the entries along axis 1 looked at (a
    token's scores: Task.values_read), None for every value (one entry: the row). `masked`: -inf is a value ruled out
    (a class a mask makes impossible, Task.masks_with_neginf), no failure, unless every value of an entry is -inf
    (nothing left to decide among)."""
    outputs = np.asarray(outputs)
    if outputs.ndim == 0:
        _float_rows(outputs)  # the error a scalar gets
    bad = np.zeros(outputs.shape[0], dtype=bool)
    for block in row_blocks(outputs.shape[0], _features(outputs)):
        part = _float_rows(outputs[block])
        read_here = np.ones((part.shape[0], 1), dtype=bool) if read is None else np.asarray(read[block], dtype=bool)
        values = part.reshape(read_here.shape + (-1,))
        finite = np.isfinite(values)
        if masked:  # per entry: -inf allowed, some value finite
            finite = (finite | np.isneginf(values)).all(axis=2) & finite.any(axis=2)
        else:
            finite = finite.all(axis=2)
        bad[block] = ~(finite | ~read_here).all(axis=1)
    return bad


def mask_changed_rows(outputs: np.ndarray, reference: np.ndarray, read: np.ndarray | None = None) -> np.ndarray:
    """Boolean mask of the rows where `outputs` are -inf at other positions than `reference` (among the entries
    `read` marks, as nonfinite_rows reads them): a class the variant rules out that FP32 scores, or the reverse."""
    outputs, reference = np.asarray(outputs), np.asarray(reference)
    if outputs.shape != reference.shape:
        raise QbenchError(f"outputs have different shapes: {outputs.shape} vs {reference.shape}")
    changed = np.zeros(outputs.shape[0] if outputs.ndim else 0, dtype=bool)
    for block in row_blocks(changed.size, _features(outputs)):
        differs = np.isneginf(_float_rows(outputs[block])) != np.isneginf(_float_rows(reference[block]))
        if read is not None:
            read_here = np.asarray(read[block], dtype=bool)
            differs = differs.reshape(read_here.shape + (-1,)).any(axis=2) & read_here
        changed[block] = differs.any(axis=1)
    return changed


def _class_scores(outputs: np.ndarray) -> np.ndarray:
    """(rows, classes) from (rows,), (rows, classes) or (rows, 1, ..., classes) with unit middle axes."""
    array = np.asarray(outputs)
    if array.ndim == 1:
        return array.reshape(-1, 1)
    if array.ndim > 2:
        if any(size != 1 for size in array.shape[1:-1]):
            raise QbenchError(f"classification outputs must be (rows, classes), got shape {array.shape}")
        return array.reshape(array.shape[0], array.shape[-1])
    return array


def looks_like_sigmoid(outputs: np.ndarray) -> bool:
    """True when every finite score lies in [0, 1] (sigmoid probabilities rather than logits)."""
    scores = _float_rows(outputs)
    finite = scores[np.isfinite(scores)]
    return bool(finite.size and finite.min() >= 0.0 and finite.max() <= 1.0)


@dataclasses.dataclass(frozen=True)
class BinaryCut:
    """Where the graph itself splits a single score column into its two classes: class 1 from `at` up, `at` itself
    included or not (an IsolationForest's label is Less(score, 0): a score of exactly 0 is an inlier). Quantized
    scores land on a grid that holds the cut exactly, so the side a tie falls on decides rows."""

    at: float
    inclusive: bool


def top1(outputs: np.ndarray, binary_probabilities: bool | BinaryCut | None = None, masked: bool = False) -> np.ndarray:
    """The predicted class of every row (int64); INVALID_CLASS for rows with NaN/inf (`masked`: as nonfinite_rows
    reads -inf; several columns are then decided among those not -inf).

    A single output column is a binary score: class 1 when score > 0.5 if every finite
    score lies in [0, 1] (a probability), else when score > 0 (a logit).
    `binary_probabilities` overrides that detection, so that a variant is read as its reference is; a BinaryCut
    decides as the graph's own comparison does.
    """
    scores = _class_scores(outputs)
    if scores.shape[1] == 1:
        scores = scores.astype(np.float64)
        if isinstance(binary_probabilities, BinaryCut):
            cut = binary_probabilities
            above = scores[:, 0] >= cut.at if cut.inclusive else scores[:, 0] > cut.at
        else:
            probabilities = looks_like_sigmoid(scores) if binary_probabilities is None else binary_probabilities
            above = scores[:, 0] > (0.5 if probabilities else 0.0)
        classes = above.astype(np.int64)
        classes[nonfinite_rows(scores)] = INVALID_CLASS
        return classes
    classes = np.empty(scores.shape[0], dtype=np.int64)
    for block in row_blocks(*scores.shape):
        part = scores[block].astype(np.float64)
        bad = nonfinite_rows(part, masked=masked)
        classes[block] = np.argmax(np.where(bad[:, None], 0.0, part), axis=1)
        classes[block][bad] = INVALID_CLASS
    return classes


def _matches(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise equality in which INVALID_CLASS matches nothing, not even itself."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise QbenchError(f"cannot compare predictions of shape {a.shape} with {b.shape}")
    return (a == b) & (a != INVALID_CLASS) & (b != INVALID_CLASS)


def accuracy(predicted: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of rows whose predicted class equals the label; NaN for no rows."""
    return _mean(_matches(predicted, labels))


def same_decisions(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise equality of two decision arrays (class ids, 0/1 label decisions) in which INVALID_CLASS
    matches nothing, not even itself."""
    return _matches(a, b)


def unscored_where_reference_is(predicted: np.ndarray, reference_predicted: np.ndarray) -> np.ndarray:
    """`predicted` with INVALID_CLASS wherever the reference's decision is INVALID_CLASS (FP32 gave NaN/inf there).

    Such a row has nothing a variant can be compared with, so it is a miss for every result, FP32 included: against
    the labels too, not only in agreement. Otherwise a variant finite where FP32 overflows (INT8 clamps) would be
    credited with those rows against the labels, and that credit would hide what it lost on the rows FP32 scores.
    """
    predicted = np.array(predicted, copy=True)
    predicted[np.asarray(reference_predicted) == INVALID_CLASS] = INVALID_CLASS
    return predicted


def agreement(pred_a: np.ndarray, pred_b: np.ndarray) -> float:
    """Fraction of rows predicted the same by both; an INVALID_CLASS row never agrees."""
    return _mean(_matches(pred_a, pred_b))


def flip_rate(pred_a: np.ndarray, pred_b: np.ndarray) -> float:
    """Fraction of rows predicted differently (1 - agreement); NaN for no rows."""
    return _mean(~_matches(pred_a, pred_b))


def changed_together(pred_a: np.ndarray, pred_b: np.ndarray, rows: np.ndarray) -> float:
    """How many changed decisions (those `flip_rate` counts) a changed decision shares its row (`rows`: each
    decision's) with, weighted by changes: sum over rows of c^2 / sum of c, c a row's changed decisions; 1 where no
    row holds two (or none changed). The variance of a share's drop over decisions grouped in rows is at most this
    times the one of independent decisions."""
    counts = np.bincount(np.asarray(rows)[~_matches(pred_a, pred_b)]).astype(np.float64)
    total = float(counts.sum())
    return float(np.sum(counts**2)) / total if total else 1.0


IGNORE_LABEL = -100
"""The label of a token not to score (padding, special tokens, a word's later sub-tokens): Hugging Face's convention."""


def scored_tokens(labels: np.ndarray, ignore_label: int = IGNORE_LABEL) -> np.ndarray:
    """(rows, tokens) boolean mask of the tokens whose label is not `ignore_label`."""
    return np.asarray(labels) != ignore_label


def token_scores(outputs: np.ndarray, scored: np.ndarray) -> np.ndarray:
    """The class scores of the scored tokens of (rows, tokens, classes) outputs, as (scored tokens, classes) in row
    order: each scored token becomes one row of the row-level metrics (top1, accuracy, kl_rows, max_abs_error)."""
    array, mask = np.asarray(outputs), np.asarray(scored, dtype=bool)
    if array.ndim != 3 or array.shape[:2] != mask.shape:
        raise QbenchError(f"token outputs must be (rows, tokens, classes) over a {mask.shape} mask, got {array.shape}")
    return array[mask]


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax (the max is subtracted first); NaN/inf rows give NaN."""
    values = np.asarray(logits, dtype=np.float64)
    if values.size == 0:
        return values.copy()
    with np.errstate(invalid="ignore"):  # inf - inf in a row holding inf: NaN, as documented
        shifted = values - np.max(values, axis=axis, keepdims=True)
        exp = np.exp(shifted)
        return exp / np.sum(exp, axis=axis, keepdims=True)


def _sigmoid(logits: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x), without overflow warnings for large |x|."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.where(logits >= 0, 1.0 / (1.0 + np.exp(-logits)), np.exp(logits) / (1.0 + np.exp(logits)))


def probability_tolerance(dtype: np.dtype) -> float:
    """How far from 1 a row of probabilities of `dtype` may sum: 1e-3, or 4 units in the last place of a narrower
    float (a float16 softmax's row sums are only good to a few 1e-3)."""
    dtype = np.dtype(dtype)
    return max(_PROBABILITY_TOLERANCE, 4 * float(np.finfo(dtype).eps)) if dtype.kind == "f" else _PROBABILITY_TOLERANCE


@dataclasses.dataclass(frozen=True)
class DistributionRows:
    """How many rows of several score columns read as probability distributions (non-negative, summing to 1 within
    `tolerance`) among the `informative` ones: finite and not all zero (a masked row, an empty one: no scale)."""

    distributions: int
    informative: int
    tolerance: float

    @property
    def probabilities(self) -> bool:
        """A majority of the informative rows: logits are a distribution by chance on almost no row, so a few odd
        rows (a temperature, a clip, a masked row) never turn the reading of all the others (a second softmax
        flattens probabilities: kl_mean far too small)."""
        return self.informative > 0 and 2 * self.distributions > self.informative


def distribution_rows(outputs: np.ndarray) -> DistributionRows:
    """Count the rows of (rows, classes) scores that are probability distributions (see DistributionRows)."""
    scores = _class_scores(outputs)
    tolerance = probability_tolerance(scores.dtype)
    distributions = informative = 0
    for block in row_blocks(*scores.shape):
        part = scores[block].astype(np.float64)
        part = part[np.isfinite(part).all(axis=1) & (part != 0.0).any(axis=1)]
        informative += part.shape[0]
        distributions += int(np.count_nonzero((part.min(axis=1, initial=0.0) >= -tolerance)
                                              & (np.abs(part.sum(axis=1) - 1.0) <= tolerance)))  # fmt: skip
    return DistributionRows(distributions, informative, tolerance)


def looks_like_probabilities(outputs: np.ndarray) -> bool:
    """Whether scores read as probabilities: one column when every finite value lies in [0, 1]; several when most
    informative rows are distributions (DistributionRows.probabilities). Rows holding NaN/inf say nothing about
    the scale. False when no row is finite."""
    scores = _class_scores(outputs)
    return looks_like_sigmoid(scores) if scores.shape[1] == 1 else distribution_rows(scores).probabilities


def to_probabilities(outputs: np.ndarray, already_probabilities: bool | None = None) -> np.ndarray:
    """(rows, classes) probabilities: outputs that already are probabilities are used as they are
    (negatives clipped, rows renormalised; a row summing to 0 stays 0), anything else goes through softmax.

    A single binary-score column becomes two columns [1 - p, p] (p = the score, or its sigmoid
    for logits). `already_probabilities` overrides the detection, so that a variant is read the
    same way as its reference even when quantisation moved its row sums off 1.
    """
    scores = _class_scores(outputs).astype(np.float64)
    if already_probabilities is None:
        already_probabilities = looks_like_probabilities(scores)
    if scores.shape[1] == 1:
        positive = np.clip(scores[:, 0], 0.0, 1.0) if already_probabilities else _sigmoid(scores[:, 0])
        return np.stack([1.0 - positive, positive], axis=1)
    if not already_probabilities:
        return softmax(scores, axis=1)
    clipped = np.clip(scores, 0.0, None)
    sums = clipped.sum(axis=1, keepdims=True)
    # a row with no probability mass left (INT8 rounding every small probability to 0) stays all zeros: a broken
    # distribution, far from any reference (KL clips it to 1e-12 per class), not 0/0 = NaN on finite outputs
    return np.divide(clipped, sums, out=np.zeros_like(clipped), where=sums != 0)  # NaN rows stay NaN


def _log_probabilities(logits: np.ndarray) -> np.ndarray:
    """(rows, classes) log-probabilities of float64 logits, computed in log space: a log-softmax, or for one binary
    column [log(1 - sigmoid(x)), log(sigmoid(x))]. Finite for any finite logits, however far apart: a probability
    that underflows to 0 keeps its exact log, so a KL is never capped by a clip."""
    if logits.shape[1] == 1:
        return -np.logaddexp(0.0, np.concatenate([logits, -logits], axis=1))  # log sigmoid(-x), log sigmoid(x)
    with np.errstate(invalid="ignore"):  # inf - inf in a row holding inf: NaN (such rows are NaN in kl_rows anyway)
        shifted = logits - np.max(logits, axis=1, keepdims=True)
        return shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))


def _kl_block(reference: np.ndarray, outputs: np.ndarray, as_probabilities: bool) -> np.ndarray:
    """KL of each row of one block of float64 outputs. Logits are compared in log space (exact: a variant whose
    logits moved a class FP32 gives half the mass to 1e-40 is 45 nats away, not the 13 a clip at 1e-12 leaves);
    probabilities are clipped to [1e-12, 1], so a class a variant rounds to exactly 0 costs a large finite KL."""
    if as_probabilities:
        p = np.clip(to_probabilities(reference, True), _KL_EPS, 1.0)
        q = np.clip(to_probabilities(outputs, True), _KL_EPS, 1.0)
        return np.sum(p * np.log(p / q), axis=1)
    log_p = _log_probabilities(_class_scores(reference))
    log_q = _log_probabilities(_class_scores(outputs))
    p = np.exp(log_p)
    with np.errstate(invalid="ignore"):  # a class both rule out (-inf - -inf) weighs p = 0: nothing, as 0 log 0 = 0
        return np.sum(np.where(p > 0, p * (log_p - log_q), 0.0), axis=1)


def kl_rows(
    reference_outputs: np.ndarray, outputs: np.ndarray, as_probabilities: bool | None = None, masked: bool = False
) -> np.ndarray:
    """KL(P_ref || Q) of every row, in nats: of the softmax (sigmoid) of logits computed exactly in log space; of
    probabilities clipped to [1e-12, 1] so a zero in Q stays finite.

    Whether the outputs are probabilities or logits is `as_probabilities` when the caller knows (a binary score
    is read as its decisions are), else decided on the reference's finite rows; either way it applies to both.
    A row holding NaN/inf on either side is NaN: a softmax of -inf logits or a sigmoid of a +inf score is a finite
    distribution, but FP32's such row is no value to compare with (for FP32 itself too, a KL of 0 there would
    dilute every result's mean, hiding what a variant lost on the rows FP32 scores), and a variant's is its failure.
    `masked`: -inf logits are classes ruled out (nonfinite_rows), whose probability 0 the softmax gives; a row whose
    -inf positions differ between the two is NaN, the variant's failure (mask_changed_rows)."""
    reference_outputs, outputs = np.asarray(reference_outputs), np.asarray(outputs)
    if reference_outputs.shape != outputs.shape:
        raise QbenchError(f"outputs have different shapes: {reference_outputs.shape} vs {outputs.shape}")
    if as_probabilities is None:
        as_probabilities = looks_like_probabilities(reference_outputs)
    kl = np.empty(reference_outputs.shape[0] if reference_outputs.ndim else 0, dtype=np.float64)
    for block in row_blocks(kl.size, _features(reference_outputs)):
        reference_block, block_outputs = _same_shape(reference_outputs[block], outputs[block])
        # rounding (or the clip) can leave -1e-17; NaN passes
        kl[block] = np.maximum(_kl_block(reference_block, block_outputs, as_probabilities), 0.0)
    bad = nonfinite_rows(reference_outputs, masked=masked) | nonfinite_rows(outputs, masked=masked)
    kl[bad | (mask_changed_rows(outputs, reference_outputs) if masked else False)] = math.nan
    return kl


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of every row pair (non-batch axes flattened); two zero rows count as 1, one as 0."""
    a, b = _same_shape(a, b)
    a, b = _float_rows(a), _float_rows(b)
    norm_a, norm_b = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cosine = np.sum(a * b, axis=1) / (norm_a * norm_b)
    cosine = np.clip(cosine, -1.0, 1.0)  # np.clip keeps NaN
    cosine[(norm_a == 0) & (norm_b == 0)] = 1.0
    cosine[(norm_a == 0) ^ (norm_b == 0)] = 0.0
    return cosine


def max_abs_error(a: np.ndarray, b: np.ndarray, masked: bool = False) -> float:
    """The largest |a - b| over all elements; NaN for no elements; NaN/inf propagate. `masked`: a value -inf in both
    (a class both rule out) differs by 0; -inf in one only, by inf."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise QbenchError(f"outputs have different shapes: {a.shape} vs {b.shape}")
    if a.size == 0:
        return math.nan
    if a.ndim == 0:
        a, b = a.reshape(1), b.reshape(1)
    largest = []
    with np.errstate(invalid="ignore"):
        for block in row_blocks(a.shape[0], _features(a)):
            a64, b64 = _same_shape(a[block], b[block])
            difference = np.abs(a64 - b64)
            if masked:
                difference[np.isneginf(a64) & np.isneginf(b64)] = 0.0
            largest.append(np.max(difference))
    return float(np.max(largest))


def spread(values: np.ndarray, rows: np.ndarray | None = None, read: np.ndarray | None = None,
           masked: bool = False) -> float:
    """How much an output varies across its rows: the root of the summed variance of each value over the rows (the
    rows' RMS distance from their mean row), over the rows `rows` selects (a slice's mask; every row when None) whose
    values are all finite; NaN for none, or for values that are not numbers. A constant output (every row the same)
    spreads 0, whatever its values. Only the selected rows are widened, block by block: a slice costs its own rows.

    `read`: (rows, n) marks which entries along axis 1 (a token's scores) the task reads (token classification's
    scored tokens); each value then varies over the rows it is read on, a row counts when its read values are finite,
    and values no metric reads (padding an export fills as it likes) move nothing. None: every value is read.
    `masked`: a -inf value is a class ruled out on that row (nonfinite_rows), read as not there: each value varies
    over the rows it is not -inf on."""
    values = np.asarray(values)
    if values.ndim == 0:
        _float_rows(values)  # the error a scalar gets
    if values.dtype.kind not in "biuf":
        return math.nan
    chosen = np.ones(values.shape[0], dtype=bool) if rows is None else np.asarray(rows, dtype=bool)
    blocks = row_blocks(values.shape[0], _features(values))
    if read is None:
        weights = np.ones(values.shape[:1] + (1,), dtype=bool)
    else:  # one flag per value: each entry's flag repeated over the values it holds
        weights = np.repeat(np.asarray(read, dtype=bool), _features(values) // max(np.shape(read)[1], 1), axis=1)

    def finite_blocks():
        for block in blocks:
            part, weight = _float_rows(values[block][chosen[block]]), weights[block][chosen[block]]
            if masked:
                weight = weight & ~np.isneginf(part)
            finite = (np.isfinite(part) | ~weight).all(axis=1)
            yield np.where(weight[finite], part[finite], 0.0), np.broadcast_to(weight[finite], part[finite].shape)

    # two passes (the mean row, then squared distances): no cancellation
    total, count = np.zeros(_features(values)), np.zeros(_features(values))
    for part, weight in finite_blocks():
        total, count = total + part.sum(axis=0), count + weight.sum(axis=0)
    if not count.any():
        return math.nan
    mean = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
    squares = np.zeros(_features(values))
    for part, weight in finite_blocks():
        squares += np.sum(np.where(weight, part - mean, 0.0) ** 2, axis=0)
    return math.sqrt(float(np.sum(np.divide(squares, count, out=np.zeros_like(squares), where=count > 0))))


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a proportion (sound near 0 and 1, unlike the normal one)."""
    if n == 0:
        return (math.nan, math.nan)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, {n}], got {successes}")
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def mean_interval(values: np.ndarray, z: float = 1.96) -> tuple[float, float]:
    """Normal-approximation interval of a mean: mean ± z·s/√n; a point for one value, NaN for none."""
    array = np.asarray(values, dtype=np.float64).ravel()
    if array.size == 0:
        return (math.nan, math.nan)
    mean = float(np.mean(array))
    if array.size < 2:
        return (mean, mean)
    half = z * float(np.std(array, ddof=1)) / math.sqrt(array.size)
    return (mean - half, mean + half)
