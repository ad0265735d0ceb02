"""The data table: loading, declarative filters, slices, the calibration sample, and model feeds.

The usual order: `load_table` -> `select_rows` (calibration / evaluation
filters) -> `nonfinite_masks` (NaN/inf inputs: error or drop) -> `slice_masks`
(the evaluation part of this, as sweep and gate both do it: `evaluation_rows`)
-> `draw_calibration_sample` -> `build_feeds` +
`labels_array` -> `iter_batches`. Every problem with the user's data or recipe
is a `RecipeError` naming the recipe file and the field.
"""

from __future__ import annotations

from qbench.data.evaluation import (
    EvaluationRows,
    evaluation_rows,
    finite_rows,
    limit_notes,
    load_data_table,
    text_columns,
    training_rows,
)
from qbench.data.feeds import build_feeds, iter_batches, labels_array
from qbench.data.filters import filter_mask, format_value, select_rows
from qbench.data.load import SUPPORTED_FORMATS, load_table, table_name
from qbench.data.nonfinite import NonfiniteMasks, check_finite, drop_nonfinite, nonfinite_masks
from qbench.data.sampling import draw_calibration_sample, per_slice_counts, row_ids_sha256
from qbench.data.slices import slice_masks

__all__ = [
    "SUPPORTED_FORMATS",
    "EvaluationRows",
    "NonfiniteMasks",
    "build_feeds",
    "check_finite",
    "draw_calibration_sample",
    "drop_nonfinite",
    "evaluation_rows",
    "filter_mask",
    "finite_rows",
    "format_value",
    "iter_batches",
    "limit_notes",
    "labels_array",
    "load_table",
    "nonfinite_masks",
    "per_slice_counts",
    "row_ids_sha256",
    "select_rows",
    "slice_masks",
    "table_name",
    "load_data_table",
    "text_columns",
    "training_rows",
]
