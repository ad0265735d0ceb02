"""The data table: loading, declarative filters, slices, the calibration sample, and model feeds.

The usual order: `load_table` -> `select_rows` (calibration / evaluation
filters) -> `slice_masks` -> `draw_calibration_sample` -> `build_feeds` +
`labels_array` -> `iter_batches`. Every problem with the user's data or recipe
is a `RecipeError` naming the recipe file and the field.
"""

from __future__ import annotations

from qbench.data.feeds import build_feeds, iter_batches, labels_array
from qbench.data.filters import filter_mask, format_value, select_rows
from qbench.data.load import SUPPORTED_FORMATS, load_table, table_name
from qbench.data.sampling import draw_calibration_sample, per_slice_counts, row_ids_sha256
from qbench.data.slices import slice_masks

__all__ = [
    "SUPPORTED_FORMATS",
    "build_feeds",
    "draw_calibration_sample",
    "filter_mask",
    "format_value",
    "iter_batches",
    "labels_array",
    "load_table",
    "per_slice_counts",
    "row_ids_sha256",
    "select_rows",
    "slice_masks",
    "table_name",
]
