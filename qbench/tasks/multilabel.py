"""Multilabel: an independent yes/no per label (sigmoid probabilities or logits), labels a 0/1 row each.

Outputs whose every finite FP32 value lies in [0, 1] are read as probabilities (threshold 0.5),
others as logits (threshold 0), and a variant is read the same way as FP32. Without labels,
micro/macro F1 are measured against FP32's decisions. A row holding NaN/inf has no decisions (see
the F1s' entries in Multilabel.metric_infos for rows where FP32's does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from qbench.modelinfo.signature import TensorMeta
from qbench.results.schema import SliceMetrics
from qbench.tasks.base import (
    LabelError,
    RowSummary,
    Task,
    example_rows,
    float_output_problem,
    mean_or_nan,
    thresholded_log_problem,
    wilson,
)
from qbench.validate import kept as kept_rules
from qbench.validate import metrics, metrics_targets
from qbench.validate.catalogue import MAX_ABS_ERROR, MetricInfo, share_of_rows

if TYPE_CHECKING:  # pragma: no cover
    import torch


def _zero_one_row(value: Any) -> bool:
    try:
        row = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return row.ndim == 1 and row.size > 0 and bool(np.isin(row, (0.0, 1.0)).all())


@dataclass(frozen=True)
class MultilabelRows:
    outputs: np.ndarray
    reference: np.ndarray
    predicted: np.ndarray  # (rows, labels) 0/1; INVALID_CLASS on rows with NaN/inf here or in FP32
    reference_predicted: np.ndarray
    target: np.ndarray  # labels, or FP32's decisions without labels

    def summarise(self, name: str, mask: np.ndarray) -> SliceMetrics:
        size = int(np.count_nonzero(mask))
        predicted, reference_predicted = self.predicted[mask], self.reference_predicted[mask]
        same = metrics.same_decisions(predicted, reference_predicted)
        label_agreement = mean_or_nan(same)
        row_agreement = mean_or_nan(same.all(axis=1))
        values = {
            "micro_f1": metrics_targets.micro_f1(predicted, self.target[mask]),
            "macro_f1": metrics_targets.macro_f1(predicted, self.target[mask]),
            "label_agreement": label_agreement,
            "row_agreement": row_agreement,
            "max_abs_error": metrics.max_abs_error(self.outputs[mask], self.reference[mask]),
        }
        intervals = {"row_agreement": wilson(row_agreement, size)}
        kept = kept_rules.decisions_kept(predicted, reference_predicted)
        return SliceMetrics(name=name, size=size, metrics=values, intervals=intervals, kept={"": kept} if kept else {})


class Multilabel(Task):
    name = "multilabel"
    columns_are_classes = True
    reads_label_columns = True
    metric_infos = (
        # F1 cannot count a row FP32 gives NaN/inf on, so it is NaN on a scope holding one (qbench.validate.accuracy):
        # as a miss on every label for every result, it would make F1 0 for FP32 and every variant alike on a scope
        # with no positive label, blind to the spurious positives a variant adds there, and would add to macro_f1
        # labels only the miss holds, diluting a variant's drop on the others
        MetricInfo("micro_f1", True, "F1 over all (row, label) decisions vs labels (vs FP32 without labels)", low=0.0,
                   high=1.0),
        MetricInfo("macro_f1", True, "mean per-label F1 vs labels (vs FP32 without labels)", low=0.0, high=1.0),
        MetricInfo("label_agreement", True, "fraction of (row, label) decisions equal to FP32's", low=0.0, high=1.0,
                   counts_nonfinite_rows=True),
        share_of_rows("row_agreement", True, "fraction of rows whose every label decision equals FP32's",
                      row_mean=True),
        MAX_ABS_ERROR,
    )  # fmt: skip
    default_gate_metric = "micro_f1"

    def labels_from_values(self, values: Sequence[Any], positions: np.ndarray) -> np.ndarray:
        bad = np.array([not _zero_one_row(v) for v in values], dtype=bool)
        if bad.any():
            raise LabelError(f"{example_rows(bad, values, positions)} are not lists of 0/1 per label")
        widths = np.array([len(v) for v in values])
        uneven = widths != widths[0]
        if uneven.any():
            raise LabelError(
                f"{example_rows(uneven, values, positions)} have another label count than the first row's {widths[0]}"
            )
        return np.array([np.asarray(v, dtype=np.int64) for v in values]).reshape(len(values), int(widths[0]))

    def check_labels(self, labels: np.ndarray, output: TensorMeta, positions: np.ndarray) -> None:
        width = output.shape[-1] if len(output.shape) == 2 else None
        if width is not None and width != labels.shape[1]:
            raise LabelError(f"rows have {labels.shape[1]} labels but output {output.name!r} scores {width}; expected "
                             "one label per output column, in the output's column order")  # fmt: skip

    def thresholds_by_scale(self, reference: np.ndarray) -> bool:
        return np.asarray(reference).dtype.kind == "f"

    def output_problem(self, output: TensorMeta) -> str | None:
        problem = float_output_problem(self.name, output) or thresholded_log_problem(output)
        if problem is None and len(output.shape) != 2:
            return f"output {output.name!r} has shape {list(output.shape)}, not (rows, labels)"
        return problem

    def rows(
        self, outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None, *,
        probabilities: bool | None = None
    ) -> RowSummary:
        outputs, reference = np.asarray(outputs), np.asarray(reference)
        if outputs.dtype.kind != "f" or outputs.ndim != 2:
            raise LabelError("task 'multilabel' reads (rows, labels) float "
                             f"outputs, got {outputs.dtype} {outputs.shape}")
        if labels is not None and np.size(labels) == outputs.size:
            # one label per row arrives as (rows,), see regression
            labels = np.asarray(labels).reshape(outputs.shape)
        if labels is not None and labels.shape != outputs.shape:
            raise LabelError(f"labels have shape {labels.shape}, the output {outputs.shape}")
        as_probabilities = metrics.looks_like_sigmoid(reference) if probabilities is None else probabilities
        reference_predicted = metrics_targets.multilabel_predictions(reference, as_probabilities)
        predicted = metrics.unscored_where_reference_is(
            metrics_targets.multilabel_predictions(outputs, as_probabilities), reference_predicted
        )
        target = reference_predicted if labels is None else labels
        return MultilabelRows(outputs, reference, predicted, reference_predicted, target)

    def qat_reads_probabilities(self, teacher_output: np.ndarray, stated: bool | None) -> bool:
        return bool(metrics.looks_like_sigmoid(teacher_output)) if stated is None else stated

    def qat_logits(self, probabilities: torch.Tensor) -> torch.Tensor:
        """logit(p), as binary_cross_entropy_with_logits expects (on p itself, a sure 'yes' of 1.0 read as 0.73)."""
        import torch

        return torch.logit(probabilities, eps=1e-7)

    def qat_label_targets(self, labels: np.ndarray, output: torch.Tensor) -> torch.Tensor:
        import torch

        if tuple(output.shape[1:]) != tuple(np.shape(labels)[1:]):
            raise LabelError(f"qat.loss 'label': labels are {np.shape(labels)[1:]} "
                             f"per row, the output {list(output.shape)}")
        return torch.as_tensor(np.array(labels), dtype=torch.float32)

    def qat_distill_targets(self, teacher_output: torch.Tensor) -> torch.Tensor:
        return teacher_output.detach().sigmoid()

    def qat_loss(self, kind: str, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        return F.binary_cross_entropy_with_logits(output, targets)


MULTILABEL = Multilabel()
