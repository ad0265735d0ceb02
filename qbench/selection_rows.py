"""The rows that choose among candidates, apart from the rows that judge the choice.

The INT8 search, `calibrator: auto` and `fallback:` try several candidates and keep the best. Kept on the rows the
gate then judges it on, the pick's figure is the best of N noisy figures: a candidate whose drop breaches the
tolerance on unseen rows passes by the luck of those rows (the more candidates, the likelier). So candidates are
measured and chosen on *selection rows*, which the verdict never uses: the calibration rows that are not evaluated
(held out with `data.calibration.overlap: hold_out`, kept apart by the filters, or read from
`data.calibration.path`), with their labels and slices; the chosen variant is then measured on the evaluation rows
like any other, and the gate judges it there. Without such rows (every calibration row is also evaluated, or the
gate metric needs labels the calibration file lacks) the choice is made on the evaluation rows and every record of
it says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from qbench.data import build_feeds
from qbench.data.slices import slice_masks
from qbench.errors import QbenchError
from qbench.modelinfo import TensorMeta
from qbench.recipe import Recipe
from qbench.recipe_data import DataSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SelectionRows:
    """Feeds, labels (None: the metric compares with FP32) and slice masks of the rows candidates are chosen on."""

    feeds: dict[str, np.ndarray]
    labels: np.ndarray | None
    slices: dict[str, np.ndarray]
    count: int
    why_unsliced: str | None = None  # the slices could not be drawn on these rows: only overall is judged there


def chooses_among_candidates(recipe: Recipe) -> bool:
    """Whether a sweep of `recipe` keeps the best of several candidates (`search:`, `calibrator: auto`, `fallback:`)."""
    return recipe.search is not None or any(v.calibrator == "auto" or v.fallback is not None for v in recipe.variants)


def selection_rows(
    data: DataSpec, table: pd.DataFrame, rows: np.ndarray, evaluated: np.ndarray | None, *, judged: Collection[str],
    model_inputs: dict[str, TensorMeta], labels: Callable[[pd.DataFrame, np.ndarray], np.ndarray | None],
    recipe_file: Path,
) -> SelectionRows | None:  # fmt: skip
    """The calibration `rows` of `table` that are not `evaluated` (positions in the same table; None: another
    file), in table order, as selection rows; None when none is left or their labels cannot be read (`labels`
    raises). Slices are those of `judged` (the evaluation's: what the gate judges) that hold some of these rows."""
    rows = np.sort(rows if evaluated is None else rows[~np.isin(rows, evaluated)])
    if len(rows) == 0:
        return None
    try:
        labelled = labels(table, rows)
    except QbenchError as exc:
        logger.info("no selection rows: the calibration rows' labels: %s", exc)
        return None
    why_unsliced = None
    try:
        masks = slice_masks(table, data.slices, recipe_file=recipe_file, inputs=data.inputs)
        slices = {name: mask[rows] for name, mask in masks.items() if name in judged and mask[rows].any()}
    except QbenchError as exc:  # a calibration file without the slice columns
        slices, why_unsliced = {}, str(exc)
    feeds = build_feeds(table, rows, data.inputs, model_inputs, recipe_file=recipe_file)
    return SelectionRows(feeds, labelled, slices, len(rows), why_unsliced)


def chosen_on(selection: SelectionRows | None, evaluation_rows: int) -> str:
    """Which rows chose a searched variant and which judge it, in words (results, report, notes)."""
    if selection is None:
        return (f"chosen on the {evaluation_rows} evaluation rows that also judge it: no calibration row is left out of "
                "the evaluation to choose on, so its figures are the best of several tries on those rows and flatter "
                "it (hold calibration rows out: data.calibration.overlap: hold_out, or calibration.path)")  # fmt: skip
    unsliced = f" (overall only there: {selection.why_unsliced})" if selection.why_unsliced else ""
    return (f"chosen on {selection.count} calibration rows not evaluated{unsliced}; judged on the {evaluation_rows} "
            "evaluation rows, which took no part in choosing it")  # fmt: skip
