"""Embedding: a float vector per row, judged only against FP32 (cosine, nearest-neighbour agreement)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from qbench.modelinfo import TensorMeta
from qbench.results import SliceMetrics
from qbench.tasks.base import (
    LabelError,
    RowSummary,
    Task,
    float_output_problem,
    mean_or_nan,
    wilson,
)
from qbench.validate import metrics, neighbours
from qbench.validate.catalogue import MetricInfo, share_of_rows

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True)
class EmbeddingRows:
    """Per-row cosine with FP32, and whether the row's nearest neighbours are FP32's (ties as a set).

    Neighbours are searched among all evaluation rows, also when a slice is summarised.
    """

    outputs: np.ndarray
    reference: np.ndarray
    cosine: np.ndarray
    neighbour_matches: np.ndarray

    def summarise(self, name: str, mask: np.ndarray) -> SliceMetrics:
        cosine = self.cosine[mask]
        matches = self.neighbour_matches[mask]
        nn_agreement = mean_or_nan(matches)
        values = {
            "cosine": mean_or_nan(cosine),
            "cosine_min": float(np.min(cosine)) if cosine.size else float("nan"),
            "nn_agreement": nn_agreement,
            "max_abs_error": metrics.max_abs_error(self.outputs[mask], self.reference[mask]),
        }
        intervals = {"cosine": metrics.mean_interval(cosine), "nn_agreement": wilson(nn_agreement, int(matches.size))}
        return SliceMetrics(name=name, size=int(cosine.size), metrics=values, intervals=intervals)


class Embedding(Task):
    name = "embedding"
    metric_infos = (
        MetricInfo("cosine", True, "mean cosine similarity with the FP32 output", low=-1.0, high=1.0),
        MetricInfo("cosine_min", True, "lowest cosine similarity with the FP32 output", low=-1.0, high=1.0),
        share_of_rows("nn_agreement", True, "fraction of rows whose nearest neighbours are FP32's (ties within 1e-6 as a set)"),
        MetricInfo("max_abs_error", False, "largest absolute difference from the FP32 output", low=0.0),
    )
    default_gate_metric = "cosine"

    def labels_from_values(self, values: Sequence[Any], positions: np.ndarray) -> np.ndarray:
        raise LabelError("task 'embedding' is judged against FP32 only; remove data.label")

    def output_problem(self, output: TensorMeta) -> str | None:
        return float_output_problem(self.name, output)

    def rows(
        self, outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None, *, probabilities: bool | None = None
    ) -> RowSummary:
        if np.asarray(outputs).dtype.kind not in "fc":
            raise LabelError(f"task 'embedding' reads float outputs only, got {np.asarray(outputs).dtype} values")
        cosine = metrics.cosine_rows(reference, outputs)
        cosine[metrics.nonfinite_rows(outputs)] = 0.0  # the variant's own NaN/inf row: nothing of FP32's direction
        # FP32's NaN/inf row has no direction to compare with: NaN for every result (FP32's own too), never a 0 both
        # share, which would dilute the mean and set a cosine_min no variant can fall below
        cosine[metrics.nonfinite_rows(reference)] = np.nan
        matches = neighbours.nearest_neighbour_matches(reference, outputs)
        return EmbeddingRows(np.asarray(outputs), np.asarray(reference), cosine, matches)

    def qat_loss(self, kind: str, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        if kind == "label":
            return super().qat_loss(kind, output, targets)
        return (1.0 - F.cosine_similarity(output.flatten(1), targets.flatten(1), dim=1)).mean()


EMBEDDING = Embedding()
