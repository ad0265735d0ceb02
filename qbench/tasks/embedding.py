"""Embedding: a float vector per row, judged only against FP32 (cosine, nearest-neighbour agreement)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from qbench.errors import QbenchError
from qbench.modelinfo.signature import TensorMeta
from qbench.results.schema import SliceMetrics
from qbench.tasks.base import (
    LabelError,
    RowSummary,
    Task,
    float_output_problem,
    mean_or_nan,
    wilson,
)
from qbench.validate import kept as kept_rules
from qbench.validate import metrics, neighbours
from qbench.validate.catalogue import MAX_ABS_ERROR, MetricInfo, share_of_rows

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True)
class EmbeddingRows:
    """Per-row cosine with FP32, and whether the row's nearest neighbours are FP32's (ties as a set).

    Neighbours are searched among all evaluation rows, also when a slice is summarised. `queried`: the rows scored
    for nn_agreement (None: every row); a scope's nn_agreement, its interval and its denominator (recorded only
    when sampled) then rest on its queried rows alone.
    """

    outputs: np.ndarray
    reference: np.ndarray
    cosine: np.ndarray
    neighbour_matches: np.ndarray
    queried: np.ndarray | None = None
    shared: float = float("nan")  # the cosine FP32's rows share (kept_rules.shared_cosine), over every row
    directionless: np.ndarray | None = None  # rows FP32 gives all 0 on: no direction for rows_kept to judge

    def summarise(self, name: str, mask: np.ndarray) -> SliceMetrics:
        cosine = self.cosine[mask]
        matches = self.neighbour_matches[mask if self.queried is None else mask & self.queried]
        nn_agreement = mean_or_nan(matches)
        values = {
            "cosine": mean_or_nan(cosine),
            "cosine_min": float(np.min(cosine)) if cosine.size else float("nan"),
            "nn_agreement": nn_agreement,
            "max_abs_error": metrics.max_abs_error(self.outputs[mask], self.reference[mask]),
        }
        intervals = {"cosine": metrics.mean_interval(cosine), "nn_agreement": wilson(nn_agreement, int(matches.size))}
        counted = {} if self.queried is None else {"nn_agreement": int(matches.size)}
        judged = cosine if self.directionless is None else np.where(self.directionless[mask], np.nan, cosine)
        found = [k for k in (kept_rules.spread_kept(self.outputs[mask], self.reference[mask]),
                             kept_rules.rows_kept(judged, self.shared, np.flatnonzero(mask))) if k is not None]
        kept = min(found, key=lambda k: k.share, default=None)  # the lower share; FP32 keeps both whole
        return SliceMetrics(name=name, size=int(cosine.size), metrics=values, intervals=intervals, denominators=counted,
                            kept={"": kept} if kept else {})


NN_QUERIES = 10_000
"""Rows scored for nn_agreement unless task_options.nn_queries says otherwise: past it a seeded sample of this many
rows, each row's neighbours still searched among all rows. Time then grows with queries x rows (linear in the rows,
where every row as a query grows with rows²); 10,000 rows give a share within about ±1 % (95 %) overall."""

NN_SEED = 0
"""The query sample's seed: the same rows for FP32 and every variant, sweep after sweep."""


class Embedding(Task):
    """`nn_queries`: the most rows scored for nn_agreement (None: every row); `strata`: each row's slice-membership
    pattern, so that the sample keeps every slice's share."""

    name = "embedding"
    metric_infos = (
        MetricInfo("cosine", True, "mean cosine similarity with the FP32 output", low=-1.0, high=1.0, row_mean=True),
        MetricInfo("cosine_min", True, "lowest cosine similarity with the FP32 output", low=-1.0, high=1.0),
        share_of_rows("nn_agreement", True,
                      "fraction of rows whose nearest neighbours are FP32's (ties within 1e-6 as a set)"),
        MAX_ABS_ERROR,
    )  # fmt: skip
    default_gate_metric = "cosine"

    def __init__(self, nn_queries: int | None = NN_QUERIES, strata: np.ndarray | None = None) -> None:
        self.nn_queries = nn_queries
        self.strata = strata

    def configured(self, options: Mapping[str, Any]) -> Embedding:
        queries = self.whole_number_option(options, "nn_queries", NN_QUERIES, minimum=2, unit="rows", null="every row")
        return Embedding(queries, self.strata)

    def for_slices(self, slices: Mapping[str, np.ndarray]) -> Embedding:
        """Rows in the same slices form a stratum (every slice is a union of strata, also with overlapping slices)."""
        columns = [np.asarray(mask, dtype=bool) for mask in slices.values()]
        strata = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)[1].reshape(-1) if columns else None
        return Embedding(self.nn_queries, strata)

    def labels_from_values(self, values: Sequence[Any], positions: np.ndarray) -> np.ndarray:
        raise LabelError("task 'embedding' is judged against FP32 only; remove data.label")

    def output_problem(self, output: TensorMeta) -> str | None:
        return float_output_problem(self.name, output)

    def rows(
        self, outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None, *,
        probabilities: bool | None = None
    ) -> RowSummary:
        if np.asarray(outputs).dtype.kind not in "fc":
            raise LabelError(f"task 'embedding' reads float outputs only, got {np.asarray(outputs).dtype} values")
        cosine = metrics.cosine_rows(reference, outputs)
        cosine[metrics.nonfinite_rows(outputs)] = 0.0  # the variant's own NaN/inf row: nothing of FP32's direction
        # FP32's NaN/inf row has no direction to compare with: NaN for every result (FP32's own too), never a 0 both
        # share, which would dilute the mean and set a cosine_min no variant can fall below
        cosine[metrics.nonfinite_rows(reference)] = np.nan
        count = np.asarray(outputs).shape[0]
        strata = np.zeros(count, dtype=np.int64) if self.strata is None else self.strata
        if strata.shape != (count,):
            raise QbenchError(f"slices cover {strata.shape[0]} rows, the outputs {count}")
        queries = None if self.nn_queries is None else neighbours.query_sample(strata, self.nn_queries, NN_SEED)
        matches = neighbours.nearest_neighbour_matches(reference, outputs, queries)
        queried = None
        if queries is not None:
            queried = np.zeros(count, dtype=bool)
            queried[queries] = True
        reference = np.asarray(reference)
        directionless = ~np.any(reference.reshape(count, -1) != 0, axis=1)
        return EmbeddingRows(np.asarray(outputs), reference, cosine, matches, queried,
                             kept_rules.shared_cosine(reference), directionless)

    def qat_loss(self, kind: str, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        if kind == "label":
            return super().qat_loss(kind, output, targets)
        return (1.0 - F.cosine_similarity(output.flatten(1), targets.flatten(1), dim=1)).mean()


EMBEDDING = Embedding()
