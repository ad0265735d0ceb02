"""Structured outputs (segmentation masks, detection boxes, any tensor per row), judged by the recipe's own metrics.

No built-in task can say what a `[N, C, H, W]` score map or `[N, K, 4]` boxes are worth: classification reads
(rows, classes) and refuses them, regression wants one label per output value, embedding takes no labels. This
task reads any tensor output with its rows on axis 0, passes each row's label cell to the custom metrics as it is
(per-pixel classes, boxes...), and reports only what needs no interpretation: agreement with FP32 (rows whose every
value is within 1 % of that value's FP32 spread, or of itself where FP32 gives it one value, as regression's; an
integer output's rows where every value equals FP32's) and `max_abs_error`. The gate's metric is one of `metrics:` (the
first by default), so the verdict is the user's metric, never a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qbench.modelinfo.signature import TensorMeta
from qbench.results.schema import SliceMetrics
from qbench.tasks.base import (
    LabelError,
    RowSummary,
    Task,
    container_problem,
    example_rows,
    mean_or_nan,
    no_label,
    wilson,
)
from qbench.tasks.regression import agreeing_rows, agreement_tolerances
from qbench.validate import metrics
from qbench.validate.catalogue import MAX_ABS_ERROR, share_of_rows


def _cell(value: Any) -> np.ndarray | None:
    """A label cell as an array (a Parquet list column's cell, nested lists too); None when it holds no label, or
    no rectangular array of numbers (a null inside, lists of different lengths)."""
    if not isinstance(value, (list, tuple, np.ndarray)):
        if no_label(value):
            return None
        array = np.asarray(value)  # a text cell (an array pandas' to_csv printed) is no number: refused as a list is
    else:
        try:
            array = np.array(value.tolist() if isinstance(value, np.ndarray) else value)
        except ValueError:  # ragged nested lists
            return None
    return None if array.dtype.kind not in "fiub" else array


@dataclass(frozen=True)
class StructuredRows:
    outputs: np.ndarray
    reference: np.ndarray
    agrees: np.ndarray

    def summarise(self, name: str, mask: np.ndarray) -> SliceMetrics:
        size = int(np.count_nonzero(mask))
        agreement = mean_or_nan(self.agrees[mask])
        values = {"agreement": agreement,
                  "max_abs_error": metrics.max_abs_error(self.outputs[mask], self.reference[mask])}  # fmt: skip
        return SliceMetrics(name=name, size=size, metrics=values, intervals={"agreement": wilson(agreement, size)})


def exact_rows(outputs: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """1.0 for rows whose every value equals FP32's, else 0.0: an integer output (item ids, class ids, counts) is
    computed, never rounded, so a value that differs is another answer, whatever its distance. Compared as the
    integers they are: through float64, ids past 2**53 merged, and a spread-relative tolerance (with its floor of
    FP16 ULPs at the values' magnitude, 2e9 at ids near 1e12) let ids 7919 apart agree."""
    rows = np.shape(outputs)[0]
    equal = np.asarray(outputs).reshape(rows, -1) == np.asarray(reference).reshape(rows, -1)
    return equal.all(axis=1).astype(np.float64)


class Structured(Task):
    name = "structured"
    labels_may_be_fed = True  # an autoencoder's target is its input
    metric_infos = (
        share_of_rows("agreement", True, "fraction of rows whose every value is within 1% of its FP32 spread of FP32"),
        MAX_ABS_ERROR,
    )  # fmt: skip
    default_gate_metric = None  # the recipe's first custom metric (qbench.recipe)

    def labels_from_values(self, values: Sequence[Any], positions: np.ndarray) -> np.ndarray:
        """One label per row, as the custom metrics read it: stacked into one array when every row's has the same
        shape (a Parquet list of H*W pixel classes per row: `[rows, H*W]`), else one array per row (boxes per image)."""
        cells = [_cell(v) for v in values]
        missing = np.array([c is None for c in cells])
        if missing.any():
            raise LabelError(f"{example_rows(missing, list(values), positions)} hold no label or no "
                             "rectangular array of numbers (expected a number or a list of numbers per row, nested "
                             "lists of equal lengths)")  # fmt: skip
        if len({c.shape for c in cells}) == 1:  # type: ignore[union-attr]
            return np.stack(cells)  # type: ignore[arg-type]
        stacked = np.empty(len(cells), dtype=object)
        stacked[:] = cells
        return stacked

    def output_problem(self, output: TensorMeta) -> str | None:
        if output.passthrough_of is not None:
            return f"output {output.name!r} is a copy of the input {output.passthrough_of!r}, not a prediction"
        if output.kind != "tensor":
            return container_problem(self.name, output)
        if output.dtype.kind not in "fiub":
            return f"output {output.name!r} holds {output.dtype} values: task 'structured' reads numeric tensors only"
        return None

    def rows(
        self, outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None, *,
        probabilities: bool | None = None
    ) -> RowSummary:
        if np.asarray(outputs).dtype.kind in "iub" and np.asarray(reference).dtype.kind in "iub":
            return StructuredRows(np.asarray(outputs), np.asarray(reference), exact_rows(outputs, reference))
        rows = np.shape(outputs)[0]
        reference_values = np.asarray(reference, dtype=np.float64).reshape(rows, -1)
        agrees = agreeing_rows(np.asarray(outputs, dtype=np.float64).reshape(rows, -1), reference_values,
                               agreement_tolerances(reference_values))  # fmt: skip
        return StructuredRows(np.asarray(outputs), np.asarray(reference), agrees)


STRUCTURED = Structured()
