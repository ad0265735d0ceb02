"""The rows that choose among candidates, apart from the rows that judge the choice and the rows fitted on.

The INT8 search, `calibrator: auto` and `fallback:` try several candidates and keep the best. Kept on the rows the
gate then judges it on, the pick's figure is the best of N noisy figures: a candidate whose drop breaches the
tolerance on unseen rows passes by the luck of those rows (the more candidates, the likelier). Kept on the rows the
static candidates were calibrated on, the choice favours them (and calibrators that overfit the sample: MinMax on a
small sample covers exactly its extremes) over dynamic ones, which saw none of those rows. So candidates are
measured and chosen on *selection rows*, which neither the verdict nor any calibrator uses (split_calibration):
rows of the calibration pool that were not drawn and are not evaluated, and rows left out of the evaluation only by
`data.evaluation.limit` (in the evaluation's table: a calibration file lends only its own rows); where those are fewer
than half the calibration sample, part of the sample (seeded, in proportion to the slices) is kept apart from fitting
to make up that half, and every variant is calibrated on the rest. The chosen variant is then measured on the
evaluation rows like any other, and the gate judges it there. Without such rows (every calibration row is also
evaluated and no other is left, or the gate metric needs labels the calibration file lacks) the choice is made on the
evaluation rows and every record of it says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from qbench.data import build_feeds
from qbench.data.content import content_table, numeric_dtypes
from qbench.data.evaluation import EvaluationRows, calibration_candidates
from qbench.data.feeds import sequence_ids
from qbench.data.leakage import row_digests
from qbench.data.nonfinite import NonfiniteMasks, drop_nonfinite, missing_slices
from qbench.data.sampling import draw_from_strata, group_codes, slice_strata
from qbench.data.slices import slice_masks
from qbench.errors import QbenchError, named_some
from qbench.modelinfo.signature import TensorMeta
from qbench.recipe.data import DataSpec
from qbench.recipe.spec import Recipe

logger = logging.getLogger(__name__)


SELECTION_ROWS = 256  # selection rows drawn from the pool when the calibration sample is smaller
FEW_SELECTION_ROWS = 32  # below this many, the choice among candidates rests on noisy figures: warned about
SELECTION_STREAM = 1  # the split's generator is seeded with (data.calibration.seed, this): not the sample's own draw


@dataclass(frozen=True)
class SelectionRows:
    """Feeds, labels (None: the metric compares with FP32) and slice masks of the rows candidates are chosen on;
    `from_sample`: how many of them were drawn for calibration and kept apart from fitting (split_calibration);
    `digests`: each row's digest of what it feeds the model (qbench.data.leakage.row_digests), so that copies of an
    input among them count as one input when a candidate's pass is judged there, as the gate counts them."""

    feeds: dict[str, np.ndarray]
    labels: np.ndarray | None
    slices: dict[str, np.ndarray]
    count: int
    why_unsliced: str | None = None  # the slices could not be drawn on these rows: only overall is judged there
    from_sample: int = 0
    digests: np.ndarray | None = None
    # slices the gate judges that none of these rows fall in: the choice could not weigh a candidate there
    unjudged: tuple[str, ...] = ()
    sequence_ids: np.ndarray | None = None  # the rows' text pairs' (qbench.data.feeds.sequence_ids)


@dataclass(frozen=True)
class CalibrationSplit:
    """The calibration sample drawn, split into the rows every variant is fitted on and the rows searches choose on
    (positions in the calibration table, sorted); `from_sample`: how many selection rows came from the sample."""

    fitted: np.ndarray
    selection: np.ndarray
    from_sample: int


def chooses_among_candidates(recipe: Recipe) -> bool:
    """Whether a sweep of `recipe` keeps the best of several candidates (`search:`, `calibrator: auto`, `fallback:`)."""
    return recipe.search is not None or any(v.calibrator == "auto" or v.fallback is not None for v in recipe.variants)


def calibration_split(
    recipe: Recipe, table: pd.DataFrame, drawn: np.ndarray, nonfinite: NonfiniteMasks, evaluation: EvaluationRows | None
) -> CalibrationSplit:  # fmt: skip
    """The calibration sample `drawn` from `table` split for a sweep of `recipe` (split_calibration): the pool is the
    calibration candidates and, in the evaluation's own table (`evaluation`; None: a calibration file), the rows
    left out only by its limit. A recipe that chooses among no candidates fits on every drawn row."""
    if not chooses_among_candidates(recipe):
        return CalibrationSplit(drawn, drawn[:0], 0)
    candidates, _, _ = calibration_candidates(table, recipe.data, nonfinite, recipe_file=recipe.source)
    pool = candidates if evaluation is None else np.union1d(candidates, evaluation.beyond_limit)
    if recipe.data.nonfinite_inputs != "keep":  # error: rows with NaN/inf inputs are refused where fed, never chosen on
        pool = drop_nonfinite(pool, nonfinite)[0]  # the rows past the evaluation's limit too: no check saw them
    groups = group_codes(table, recipe.data.calibration.group_by, recipe_file=recipe.source)
    if evaluation is None:
        masks = calibration_masks(recipe.data, table, recipe_file=recipe.source)
        return split_calibration(drawn, pool, None, masks, seed=recipe.data.calibration.seed, groups=groups)
    return split_calibration(drawn, pool, evaluation.rows, evaluation.masks, seed=recipe.data.calibration.seed,
                             groups=groups)  # fmt: skip


def split_calibration(
    drawn: np.ndarray, pool: np.ndarray, evaluated: np.ndarray | None, masks: dict[str, np.ndarray], *, seed: int,
    groups: np.ndarray | None = None,
) -> CalibrationSplit:  # fmt: skip
    """Selection rows no candidate is fitted on and the gate never judges: from `pool` (rows of the calibration
    table neither `drawn` nor `evaluated`; None: another table), at most max(len(drawn), SELECTION_ROWS); where
    that is less than half the drawn rows not evaluated, rows of the sample make up that half and are no longer
    fitted on. Both draws are seeded and keep the shares of the slices (`masks`, over the table); with `groups`
    (data.calibration.group_by's code per table row) both take whole groups, so a metric over groups (NDCG per
    query) chooses on whole queries, not on the few documents of each that a row-by-row draw would leave."""
    rng = np.random.default_rng([seed, SELECTION_STREAM])
    spare = np.sort(drawn if evaluated is None else drawn[~np.isin(drawn, evaluated)])
    pool = np.setdiff1d(pool, drawn if evaluated is None else np.union1d(drawn, evaluated))
    chosen = draw_from_strata(slice_strata(pool, masks), max(len(drawn), SELECTION_ROWS), rng, groups=groups)
    wanted = len(spare) // 2 - len(chosen)
    moved = draw_from_strata(slice_strata(spare, masks), wanted, rng, groups=groups) if wanted > 0 else spare[:0]
    return CalibrationSplit(np.setdiff1d(drawn, moved), np.union1d(chosen, moved), len(moved))


def calibration_masks(data: DataSpec, table: pd.DataFrame, *, recipe_file: Path) -> dict[str, np.ndarray]:
    """The recipe's slices over the calibration `table` (none where it lacks their columns: a calibration file)."""
    try:
        return slice_masks(table, data.slices, recipe_file=recipe_file, inputs=data.inputs)
    except QbenchError:
        return {}


def selection_rows(
    data: DataSpec, table: pd.DataFrame, split: CalibrationSplit, nonfinite: NonfiniteMasks, *,
    judged: Collection[str], model_inputs: dict[str, TensorMeta],
    labels: Callable[[pd.DataFrame, np.ndarray], np.ndarray | None], recipe_file: Path,
    unread: Mapping[str, bool] | None = None,
) -> SelectionRows | None:  # fmt: skip
    """The selection rows of `split` (positions in `table`; `nonfinite`: the table's NaN/inf masks, scanned once per
    table by the caller) with their feeds, labels and slices; None when there
    are none or their labels cannot be read (`labels` raises). Slices are those of `judged` (the evaluation's: what
    the gate judges) that hold some of these rows, the `missing:<column>` slices of `data.nonfinite_inputs: keep`
    too, so a candidate that loses the missing-value rows is chosen against there as the gate would judge it. A judged
    slice holding none of these rows (a calibration file without its value, a slice rarer than one row in the draw)
    is `unjudged`, warned about and said wherever the choice is (`chosen_on`): a candidate that breaks there passed
    the choice unseen, and only the gate can block it. Fewer than FEW_SELECTION_ROWS are warned about. `unread`: model
    inputs no output reads, whose columns tell no inputs apart (content_table)."""
    rows = split.selection
    if len(rows) == 0:
        return None
    try:
        labelled = labels(table, rows)
    except QbenchError as exc:
        logger.warning("candidates are chosen on the evaluation rows, not on the %d calibration rows kept for it: "
                       "their labels cannot be read (%s)", len(rows), exc)  # fmt: skip
        return None
    why_unsliced = None
    try:
        masks = slice_masks(table, data.slices, recipe_file=recipe_file, inputs=data.inputs)
        if data.nonfinite_inputs == "keep":
            masks |= missing_slices(rows, nonfinite)
        slices = {name: mask[rows] for name, mask in masks.items() if name in judged and mask[rows].any()}
    except QbenchError as exc:  # a calibration file without the slice columns
        slices, why_unsliced = {}, str(exc)
    unjudged = () if why_unsliced else tuple(name for name in judged if name not in slices)
    if unjudged:
        logger.warning("slices the gate judges hold none of the %d rows candidates are chosen on, so the choice cannot "
                       "weigh them: %s; a candidate that breaks there is blocked only by the gate", len(rows),
                       named_some(unjudged))  # fmt: skip
    if len(rows) < FEW_SELECTION_ROWS:
        logger.warning("only %d rows to choose among candidates on (none fitted on, none evaluated): the choice rests "
                       "on noisy figures; draw more calibration rows or leave more rows unevaluated",
                       len(rows))  # fmt: skip
    feeds = build_feeds(table, rows, data.inputs, model_inputs, recipe_file=recipe_file)
    # building the feeds found every fed column; an image column is digested by its files' bytes, as the gate's are
    fed_as = numeric_dtypes(model_inputs)
    digests = row_digests(content_table(table, data, recipe_file=recipe_file, rows=rows, unread=unread, dtypes=fed_as),
                          rows, data.fed_columns)
    return SelectionRows(feeds, labelled, slices, len(rows), why_unsliced, split.from_sample, digests, unjudged,
                         sequence_ids(table, rows, data.inputs, recipe_file=recipe_file))


def chosen_on(selection: SelectionRows | None, evaluation_rows: int, too_small: Sequence[str] = ()) -> str:
    """Which rows chose a searched variant and which judge it, in words (results, report, notes); `too_small`: slices
    the selection rows hold too few of to judge (gate.min_slice_size), named as the `unjudged` ones are."""
    if selection is None:
        return (f"chosen on the {evaluation_rows} evaluation rows that also judge it: no row apart from the evaluation "
                "and the calibration fit is left to choose on, or those rows carry no labels to choose by, so its "
                "figures are the best of several tries on those rows and flatter it (hold calibration rows out: "
                "data.calibration.overlap: hold_out, or "
                "calibration.path; give them the data.label column)")  # fmt: skip
    unsliced = f" (overall only there: {selection.why_unsliced})" if selection.why_unsliced else ""
    unseen = [f"none of them in {named_some(selection.unjudged)}"] if selection.unjudged else []
    unseen += [f"fewer than gate.min_slice_size of them in {named_some(too_small)}"] if too_small else []
    if unseen:
        unsliced = f", {' and '.join(unseen)} (the choice could not weigh a candidate there)"
    few = (f", few enough to make the choice noisy (under {FEW_SELECTION_ROWS})"
           if selection.count < FEW_SELECTION_ROWS else "")
    return (f"chosen on {selection.count} rows no candidate was calibrated on and none evaluated "
            f"({selection.from_sample} of them drawn for calibration and kept apart from fitting){few}{unsliced}; "
            f"judged on the {evaluation_rows} evaluation rows, which took no part in choosing it")  # fmt: skip
