"""Accuracy of a variant against the labels and against the FP32 reference, overall and per slice.

Per-row quantities (predicted class, KL, cosine) are computed once over the whole
evaluation set; every slice is then a boolean mask over those rows. A row whose
variant output holds NaN or inf is counted, never dropped: it is a wrong and
disagreeing prediction (class INVALID_CLASS) and has cosine 0, while KL and
max_abs_error over it are NaN/inf (so a gate on them fails rather than passes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from qbench.backends.base import Runner
from qbench.console import track
from qbench.errors import QbenchError, expected_one_of
from qbench.results import AccuracyResult, SliceMetrics
from qbench.validate import metrics

TASKS = ("classification", "embedding")
OVERALL = "overall"


class _RowSummary(Protocol):
    def summarise(self, name: str, mask: np.ndarray) -> SliceMetrics: ...


def _wilson(rate: float, n: int) -> tuple[float, float]:
    """Wilson interval of a rate measured over `n` rows (the count is recovered from the rate)."""
    if n == 0 or np.isnan(rate):
        return metrics.wilson_interval(0, 0)
    return metrics.wilson_interval(round(rate * n), n)


@dataclass(frozen=True)
class _ClassificationRows:
    outputs: np.ndarray
    reference: np.ndarray
    labels: np.ndarray | None
    predicted: np.ndarray
    reference_predicted: np.ndarray
    kl: np.ndarray

    @classmethod
    def compute(cls, outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> _ClassificationRows:
        return cls(
            outputs=outputs,
            reference=reference,
            labels=labels,
            predicted=metrics.top1(outputs),
            reference_predicted=metrics.top1(reference),
            kl=metrics.kl_rows(reference, outputs),
        )

    def summarise(self, name: str, mask: np.ndarray) -> SliceMetrics:
        size = int(np.count_nonzero(mask))
        predicted, reference_predicted = self.predicted[mask], self.reference_predicted[mask]
        agreement = metrics.agreement(predicted, reference_predicted)
        flips = metrics.flip_rate(predicted, reference_predicted)
        accuracy = agreement if self.labels is None else metrics.accuracy(predicted, self.labels[mask])
        kl = self.kl[mask]
        values = {
            "accuracy": accuracy,
            "agreement": agreement,
            "flip_rate": flips,
            "kl_mean": float(np.mean(kl)) if kl.size else float("nan"),
            "max_abs_error": metrics.max_abs_error(self.outputs[mask], self.reference[mask]),
        }
        intervals = {
            "accuracy": _wilson(accuracy, size),
            "agreement": _wilson(agreement, size),
            "flip_rate": _wilson(flips, size),
            "kl_mean": metrics.mean_interval(kl),
        }
        return SliceMetrics(name=name, size=size, metrics=values, intervals=intervals)


@dataclass(frozen=True)
class _EmbeddingRows:
    """Per-row cosine with FP32, and whether the row's nearest neighbour is FP32's.

    Neighbours are searched among all evaluation rows, also when a slice is summarised.
    """

    outputs: np.ndarray
    reference: np.ndarray
    cosine: np.ndarray
    neighbour_matches: np.ndarray

    @classmethod
    def compute(cls, outputs: np.ndarray, reference: np.ndarray) -> _EmbeddingRows:
        cosine = metrics.cosine_rows(reference, outputs)
        cosine[metrics.nonfinite_rows(outputs)] = 0.0
        matches = metrics.nearest_neighbour_matches(reference, outputs)
        return cls(outputs=outputs, reference=reference, cosine=cosine, neighbour_matches=matches)

    def summarise(self, name: str, mask: np.ndarray) -> SliceMetrics:
        cosine = self.cosine[mask]
        matches = self.neighbour_matches[mask]
        nn_agreement = float(np.mean(matches)) if matches.size else float("nan")
        values = {
            "cosine": float(np.mean(cosine)) if cosine.size else float("nan"),
            "cosine_min": float(np.min(cosine)) if cosine.size else float("nan"),
            "nn_agreement": nn_agreement,
            "max_abs_error": metrics.max_abs_error(self.outputs[mask], self.reference[mask]),
        }
        intervals = {"cosine": metrics.mean_interval(cosine), "nn_agreement": _wilson(nn_agreement, int(matches.size))}
        return SliceMetrics(name=name, size=int(cosine.size), metrics=values, intervals=intervals)


def _checked_labels(labels: np.ndarray | None, rows: int) -> np.ndarray | None:
    if labels is None:
        return None
    array = np.asarray(labels)
    if array.size != rows or (array.ndim > 1 and array.shape[0] != rows):
        raise QbenchError(f"got {array.size} labels for {rows} evaluated rows")
    if array.dtype.kind not in "biuf":
        raise QbenchError(f"labels must be integer class indices, got {array.dtype} values")
    return array.reshape(rows)


def _checked_masks(slices: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    masks: dict[str, np.ndarray] = {}
    for name, mask in slices.items():
        array = np.asarray(mask)
        if array.dtype != np.bool_ or array.shape != (rows,):
            raise QbenchError(
                f"slice {name!r}: expected a boolean mask over {rows} rows, got {array.dtype} {array.shape}"
            )
        masks[name] = array
    return masks


def evaluate_accuracy(
    task: str,
    outputs: np.ndarray,
    reference_outputs: np.ndarray,
    labels: np.ndarray | None,
    slices: Mapping[str, np.ndarray],
) -> AccuracyResult:
    """Metrics of `outputs` against `reference_outputs` (FP32) and `labels`, overall and per slice.

    classification: accuracy (agreement with FP32 when there are no labels), agreement,
    flip_rate, kl_mean, max_abs_error; 95 % intervals for the first four.
    embedding: cosine (mean), cosine_min, nn_agreement (nearest neighbour among all rows is
    FP32's), max_abs_error; 95 % intervals for cosine and nn_agreement.
    `slices` maps a slice name to a boolean mask over the rows.
    """
    if task not in TASKS:
        raise QbenchError(f"task: {expected_one_of(task, TASKS)}")
    outputs, reference = np.asarray(outputs), np.asarray(reference_outputs)
    if outputs.ndim == 0 or outputs.shape != reference.shape:
        raise QbenchError(
            f"variant outputs have shape {outputs.shape}, FP32 outputs {reference.shape}: they must match"
        )
    rows = outputs.shape[0]
    masks = _checked_masks(slices, rows)
    summary: _RowSummary
    if task == "classification":
        summary = _ClassificationRows.compute(outputs, reference, _checked_labels(labels, rows))
    else:
        summary = _EmbeddingRows.compute(outputs, reference)
    return AccuracyResult(
        rows=rows,
        nonfinite_outputs=int(np.count_nonzero(metrics.nonfinite_rows(outputs))),
        overall=summary.summarise(OVERALL, np.ones(rows, dtype=bool)),
        slices=tuple(summary.summarise(name, mask) for name, mask in masks.items()),
    )


def _slice_with_drops(current: SliceMetrics, reference: SliceMetrics | None) -> SliceMetrics:
    if reference is None:
        return dataclasses.replace(current, drops={})
    drops = {
        name: metrics.drop(name, reference.metrics[name], value)
        for name, value in current.metrics.items()
        if name in metrics.METRICS and name in reference.metrics
    }
    return dataclasses.replace(current, drops=drops)


def with_drops(result: AccuracyResult, reference: AccuracyResult) -> AccuracyResult:
    """`result` with every catalogue metric's drop vs `reference` filled in (positive = worse).

    Slices are matched by name; a slice the reference lacks gets no drops.
    """
    return dataclasses.replace(
        result,
        overall=_slice_with_drops(result.overall, reference.overall),
        slices=tuple(_slice_with_drops(s, reference.slice(s.name)) for s in result.slices),
    )


def row_count(feeds: Mapping[str, np.ndarray]) -> int:
    """The number of rows in `feeds`; every input must have the same number."""
    if not feeds:
        raise QbenchError("no model inputs to feed")
    counts = {name: int(np.shape(array)[0]) if np.ndim(array) else 0 for name, array in feeds.items()}
    if len(set(counts.values())) != 1:
        raise QbenchError(f"model inputs have different row counts: {counts}")
    return next(iter(counts.values()))


def run_batched(
    runner: Runner,
    feeds: Mapping[str, np.ndarray],
    batch_size: int,
    output_index: int = 0,
    description: str = "evaluate",
) -> np.ndarray:
    """Run every row through `runner` in batches of `batch_size`; output `output_index`, concatenated."""
    if batch_size <= 0:
        raise QbenchError(f"batch_size must be positive, got {batch_size}")
    rows = row_count(feeds)
    starts = range(0, rows, batch_size)
    chunks: list[np.ndarray] = []
    for start in track(starts, description, total=len(starts)):
        outputs = runner.run({name: array[start : start + batch_size] for name, array in feeds.items()})
        if not -len(outputs) <= output_index < len(outputs):
            raise QbenchError(f"output index {output_index} is out of range: the model has {len(outputs)} outputs")
        chunks.append(np.asarray(outputs[output_index]))
    if not chunks:
        return np.empty((0,), dtype=np.float32)
    return np.concatenate(chunks, axis=0)
