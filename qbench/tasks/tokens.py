"""Token classification (NER, POS tagging): class scores per token, (rows, tokens, classes), judged per token.

Labels are one list per row of one class id per token, as long as the output's token axis; a token labelled
IGNORE_LABEL (-100, Hugging Face's convention for padding, special tokens and later sub-tokens) is not scored.
Every metric is computed over the scored tokens of a scope's rows, so the rates (accuracy, agreement, flip_rate)
are shares of tokens, not rows, and kl_mean a mean over tokens: each scope records how many tokens every metric rests
on (SliceMetrics.denominators), which is what the gate checks the rates against and counts for min_slice_size (a
slice of 40 rows with 3 scored tokens is judged as 3, not 40). A class FP32 decides in enough rows that the variant
no longer decides on half their tokens of it breaches (token_decisions_kept, qbench.validate.kept).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qbench.modelinfo.signature import TensorMeta
from qbench.results.schema import SliceMetrics
from qbench.tasks.base import LabelError, is_float, mean_or_nan, no_label, wilson
from qbench.validate import kept as kept_rules
from qbench.validate import metrics
from qbench.validate.metrics import IGNORE_LABEL
from qbench.validate.scores_scale import ScaleReading


def is_token_list(value: Any) -> bool:
    """Whether a label cell is a list of labels (one per token) rather than one label."""
    return isinstance(value, (list, tuple, np.ndarray))


_NO_LIST_KINDS = frozenset({"string", "integer", "floating", "mixed-integer-float", "boolean", "decimal", "empty"})


def any_token_list(values: Sequence[Any]) -> bool:
    """Whether any label cell is a list of labels: pandas' C type inference tells a column of plain numbers, text or
    truth values at once; only a column of other kinds is looked at cell by cell."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        return False
    from pandas.api.types import infer_dtype  # label cells come from a table: pandas is loaded already

    if infer_dtype(values, skipna=True) in _NO_LIST_KINDS:
        return False
    return any(is_token_list(v) for v in values)


def token_axis(output: TensorMeta) -> bool:
    """Whether `output` holds class scores per token: a float (rows, tokens, classes) whose token axis is not a
    static 1 (a (rows, 1, classes) output is one score vector per row)."""
    return is_float(output) and len(output.shape) == 3 and output.shape[1] != 1


def is_token_scores(outputs: np.ndarray, labels: np.ndarray | None) -> bool:
    """Whether evaluated `outputs` are read per token: (rows, tokens, classes) with a token axis other than 1, or
    with a label per token."""
    return np.ndim(outputs) == 3 and (np.shape(outputs)[1] != 1 or (labels is not None and np.ndim(labels) == 2))


def labels_from_lists(values: Sequence[Any], positions: np.ndarray, integral: Any) -> np.ndarray:
    """(rows, tokens) int64 labels from one list per row; LabelError naming the first bad row.

    `integral`: whether a label value is a whole number a class id can hold."""

    def row(index: int) -> int:
        return int(positions[index])

    not_lists = [i for i, v in enumerate(values) if not is_token_list(v)]
    if not_lists:
        first = not_lists[0]
        raise LabelError(f"{len(not_lists)} rows, e.g. row {row(first)}: {values[first]!r}, are no list of token "
                         "labels while other rows are: expected one list of class ids per row")  # fmt: skip
    lengths = np.array([len(v) for v in values], dtype=np.int64)
    usual = int(np.bincount(lengths).argmax()) if lengths.size else 0
    if (lengths != usual).any():
        first = int(np.flatnonzero(lengths != usual)[0])
        raise LabelError(f"row {row(first)} has {lengths[first]} token labels, the other rows mostly {usual}: expected "
                         f"one class id per token of the output ({IGNORE_LABEL} for a token not to score) in every "
                         "row")  # fmt: skip
    for index, cell in enumerate(values):
        bad = [v for v in cell if not integral(v)]
        if bad:
            value = bad[0].item() if isinstance(bad[0], np.generic) else bad[0]  # 2.5, not np.float64(2.5)
            shown = "a missing token label" if no_label(value) else f"token label {value!r}"
            raise LabelError(f"row {row(index)} holds {shown}: expected integer class ids ({IGNORE_LABEL} for a "
                             "token not to score)")  # fmt: skip
    labels = np.array([[int(v) for v in cell] for cell in values], dtype=np.int64).reshape(len(values), -1)
    negative = (labels < 0) & (labels != IGNORE_LABEL)
    if negative.any():
        first = int(np.flatnonzero(negative.any(axis=1))[0])
        raise LabelError(f"row {row(first)} holds token label {int(labels[first][negative[first]][0])}: expected class "
                         f"ids >= 0, or {IGNORE_LABEL} for a token not to score")  # fmt: skip
    return labels


def check_token_labels(labels: np.ndarray, output: TensorMeta, positions: np.ndarray, classes: int | None) -> None:
    """Token labels against a per-token output: as many per row as its token axis, class ids within its classes.

    Lists of labels fit any float (rows, tokens, classes) output, a token axis of 1 included, as is_token_scores reads
    it: the run check sees a symbolic token axis at its length, and a decoder step's one new token ([batch, 'step',
    vocabulary], 1 at run time) must not be refused there for the token labels the graph's shape asked for."""
    if labels.ndim != 2:
        if token_axis(output):
            raise LabelError(f"hold one class id per row, but output {output.name!r} of shape {list(output.shape)} "
                             "scores every token: expected a list of one class id per token in each row "
                             f"({IGNORE_LABEL} for a token not to score)")  # fmt: skip
        return
    if not (is_float(output) and len(output.shape) == 3):
        raise LabelError(f"hold a list per row (token labels), but output {output.name!r} of shape "
                         f"{list(output.shape)} is not (rows, tokens, "
                         "classes): expected one class id per row")  # fmt: skip
    tokens = output.shape[1]
    if tokens is not None and labels.shape[1] != tokens:
        raise LabelError(f"row {int(positions[0]) if len(positions) else 0} has {labels.shape[1]} token labels, output "
                         f"{output.name!r} has {tokens} tokens per row: expected one class id per token")  # fmt: skip
    if classes is not None:
        outside = labels >= classes
        if outside.any():
            first = int(np.flatnonzero(outside.any(axis=1))[0])
            raise LabelError(f"row {int(positions[first])} holds token label {int(labels[first][outside[first]][0])}, "
                             f"outside 0..{classes - 1} (output {output.name!r} has {classes} classes)")  # fmt: skip


@dataclass(frozen=True)
class TokenRows:
    """Per-token quantities of (rows, tokens, classes) scores; a slice of rows scores the scored tokens of its rows."""

    outputs: np.ndarray
    reference: np.ndarray
    labels: np.ndarray | None  # (rows, tokens); None: every token is scored, accuracy against FP32
    scored: np.ndarray  # (rows, tokens) bool
    predicted: np.ndarray  # (rows, tokens)
    reference_predicted: np.ndarray
    kl: np.ndarray  # (rows, tokens), KL(FP32 || variant) of each token
    masked: bool = False  # -inf scores are classes ruled out (Classification.masks_with_neginf)

    @classmethod
    def of(cls, outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None, scale: ScaleReading,
           masked: bool = False) -> TokenRows:  # fmt: skip
        """`scale`: how the scores are read, probabilities or logits (Classification.scale_reading: on the scored
        tokens alone, as every figure is; a padding token an export zeroes says nothing of their scale). `masked`:
        -inf scores are classes ruled out; a token whose -inf positions are not FP32's is the variant's miss."""
        if labels is not None and labels.shape != outputs.shape[:2]:
            raise LabelError(f"got {labels.shape[1]} token labels per row for an output of {outputs.shape[1]} tokens")
        everything = np.ones(outputs.shape[:2], dtype=bool)
        scored = everything if labels is None else metrics.scored_tokens(labels)
        shape = outputs.shape[:2]
        reference_scores = metrics.token_scores(reference, everything)
        scores = metrics.token_scores(outputs, everything)
        reference_predicted = metrics.top1(reference_scores, masked=masked).reshape(shape)
        predicted = metrics.top1(scores, masked=masked)
        if masked:
            predicted[metrics.mask_changed_rows(scores, reference_scores)] = metrics.INVALID_CLASS
        predicted = predicted.reshape(shape)
        return cls(
            outputs, reference, labels, scored,
            metrics.unscored_where_reference_is(predicted, reference_predicted), reference_predicted,
            metrics.kl_rows(reference_scores, scores, scale.probabilities, masked).reshape(shape), masked,
        )  # fmt: skip

    def summarise(self, name: str, mask: np.ndarray) -> SliceMetrics:
        tokens = self.scored & mask[:, None]
        count = int(np.count_nonzero(tokens))
        predicted, reference_predicted = self.predicted[tokens], self.reference_predicted[tokens]
        agreement = metrics.agreement(predicted, reference_predicted)
        accuracy = agreement if self.labels is None else metrics.accuracy(predicted, self.labels[tokens])
        values = {"accuracy": accuracy, "agreement": agreement,
                  "flip_rate": metrics.flip_rate(predicted, reference_predicted)}  # fmt: skip
        intervals = {metric: wilson(value, count) for metric, value in values.items()}
        kl = self.kl[tokens]
        values["kl_mean"] = mean_or_nan(kl)
        intervals["kl_mean"] = metrics.mean_interval(kl)
        values["max_abs_error"] = metrics.max_abs_error(
            metrics.token_scores(self.outputs, tokens), metrics.token_scores(self.reference, tokens), self.masked
        )
        rows = np.nonzero(tokens)[0]
        kept = kept_rules.token_decisions_kept(predicted, reference_predicted, rows)
        return SliceMetrics(name=name, size=int(np.count_nonzero(mask)), metrics=values, intervals=intervals,
                            denominators=dict.fromkeys(values, count), kept={"": kept} if kept else {},
                            changed_together={"agreement": metrics.changed_together(predicted, reference_predicted,
                                                                                     rows)})  # fmt: skip
