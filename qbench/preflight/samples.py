"""The calibration sample of a sweep's preparation (qbench.preflight): the rows drawn, split into the rows fitted on
and the rows an INT8 search chooses on, fed to the model in batches, and the rows left out for NaN/inf inputs."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import pandas as pd

from qbench.data import NonfiniteMasks, build_feeds, check_finite, iter_batches
from qbench.data.content import numeric_dtypes
from qbench.data.evaluation import EvaluationRows, calibration_sample, holds_out
from qbench.modelinfo.signature import ModelInfo
from qbench.preflight.lookups import Lookup, check_lookup_indices
from qbench.recipe.data import DataSpec
from qbench.recipe.spec import Recipe
from qbench.selection_rows import CalibrationSplit, calibration_split

logger = logging.getLogger(__name__)

Feeds = dict[str, np.ndarray]


def record_dropped(dropped: dict[str, dict[str, int]], what: str, counts: dict[str, int], left_out: int) -> None:
    """Count the `what` rows left out for NaN/inf inputs in `dropped[what]` and say so in the log."""
    if not counts:
        return
    dropped[what] = counts
    shown = ", ".join(f"{column}: {n}" for column, n in counts.items())
    logger.warning("%d %s rows dropped for NaN/inf inputs (%s)", left_out, what, shown)


def calibration_feeds(
    recipe: Recipe,
    table: pd.DataFrame,
    model: ModelInfo,
    nonfinite: NonfiniteMasks,
    dropped: dict[str, dict[str, int]],
    slices: dict[str, np.ndarray],
    lookups: Mapping[str, Lookup],
    *,
    whole: bool,
    data: DataSpec,
    evaluation: EvaluationRows | None,
    unread: Mapping[str, bool] | None = None,
) -> tuple[CalibrationSplit, list[Feeds]]:
    """The calibration sample split into the rows fitted on and the rows searches choose on (calibration_split;
    `evaluation`: the evaluation rows where they come from `table`) and the batches of the rows fitted on (the last
    one filled up to the batch size when `whole`: a model with a fixed batch), fed as `data.inputs`
    (tokenizers and images read from the sweep's copies). `unread`: the model inputs no output reads
    (content_table), so that the warning on a thin sample tells its rows apart as the model is fed them."""
    spec = recipe.data.calibration
    rows, counts, left_out = calibration_sample(table, data, nonfinite, recipe_file=recipe.source, warn=True,
                                                hold_out=holds_out(recipe.data, recipe.fits_on_calibration_rows),
                                                unread=unread, dtypes=numeric_dtypes(model.inputs))  # fmt: skip
    record_dropped(dropped, "calibration", counts, left_out)
    field_name = "data.inputs" if recipe.calibration_data_path is None else "data.calibration.path"
    check_finite(table, rows, nonfinite, slices, what="calibration", recipe_file=recipe.source, field=field_name,
                 policy=recipe.data.nonfinite_inputs)  # every row drawn: those kept apart to choose on are fed too
    split = calibration_split(recipe, table, rows, nonfinite, evaluation)
    rows = split.fitted
    feeds = build_feeds(table, rows, data.inputs, model.inputs, recipe_file=recipe.source,
                        table_field=None if recipe.calibration_data_path is None else field_name)  # fmt: skip
    check_lookup_indices(recipe, lookups, feeds, rows, "calibration")
    return split, list(iter_batches(feeds, spec.batch_size, whole=whole))
