"""The evaluation rows and the slices over them, selected exactly as every sweep selects them.

One derivation for the sweep (qbench.preflight) and the gate, which re-derives the slices and their
sizes to check results against: the evaluation filter, then the NaN/inf input policy (with
`data.nonfinite_inputs: drop` such rows are left out; with `keep` each input column holding some makes a
`missing:<column>` slice after the recipe's), then the calibration sample held out (when a variant
is fitted on it and it comes from the same table: `data.calibration.overlap: hold_out`), then the limit; `by` slices
are made from the values those rows hold (a value only calibration rows hold is no slice). Any other derivation would
let the two disagree on valid results.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from qbench.data.content import content_table
from qbench.data.filters import format_value, select_rows
from qbench.data.leakage import distinct_inputs, row_digests
from qbench.data.load import load_table, table_name
from qbench.data.nonfinite import NonfiniteMasks, check_finite, drop_nonfinite, missing_slices, nonfinite_masks
from qbench.data.sampling import draw_calibration_sample, warn_thin_sample
from qbench.data.slices import slice_masks
from qbench.data.text_tables import CsvDialect, spreadsheet_error
from qbench.errors import RecipeError
from qbench.modelinfo.signature import TensorMeta
from qbench.recipe.data import DataSpec, TextInputSpec


@dataclass(frozen=True)
class EvaluationRows:
    """rows: positions in the table, in evaluation order. masks: slice name -> mask over ALL rows of the table
    (calibration counts per slice use them too). nonfinite: input column -> rows holding NaN/inf, over all rows.
    dropped: input column -> evaluation rows left out for NaN/inf (only with `data.nonfinite_inputs: drop`);
    left_out: how many rows that is (a row with NaN/inf in two columns counts once). held_out: rows of the
    evaluation filter not evaluated because they are calibration rows (`data.calibration.overlap: hold_out`).
    beyond_limit: rows the evaluation would take but for `data.evaluation.limit` (searches may choose on them).
    distinct_inputs: scope ("overall" or a slice) -> the distinct inputs its rows feed the model, where fewer than its
    rows (qbench.data.leakage.distinct_inputs): results record it, and the gate's resolution rule counts inputs.
    digests: each row's digest of the cells it feeds the model (qbench.data.leakage.row_digests; None where a fed
    column is missing), computed once: the calibration-overlap check reads them too."""

    rows: np.ndarray
    masks: dict[str, np.ndarray]
    nonfinite: NonfiniteMasks
    dropped: dict[str, int]
    left_out: int
    held_out: int = 0
    beyond_limit: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    distinct_inputs: dict[str, int] = field(default_factory=dict)
    digests: np.ndarray | None = None

    @property
    def slices(self) -> dict[str, np.ndarray]:
        """Slice name -> mask over the evaluation rows (in evaluation order)."""
        return {name: mask[self.rows] for name, mask in self.masks.items()}

    @property
    def slice_sizes(self) -> dict[str, int]:
        """Slice name -> evaluation rows in it."""
        return {name: int(mask.sum()) for name, mask in self.slices.items()}


def text_columns(
    data: DataSpec, *, label_names: bool, model_inputs: Mapping[str, TensorMeta] | None = None
) -> tuple[str, ...]:  # fmt: skip
    """The columns whose cells name things, read as the text a CSV file holds (qbench.data.text_tables): slice `by`
    columns and the calibration's stratify_by and group_by columns ("007" and "7" are two codes, each named as
    written), text inputs, image paths (a file named 0001 is no number), the columns feeding a string input of the model
    (`model_inputs`: a zip code "007" read as the number 7 would be refused, or fed as "7"), the second texts of pairs
    (`tokenizer.pair`), and the label when it names classes (`label_names`: "01" and "1" are two classes of a model's
    string labels)."""
    columns = [spec.by for spec in data.slices if spec.by is not None]
    columns += [column for column, spec in data.inputs.items() if isinstance(spec, TextInputSpec)]
    columns += data.pair_columns
    columns += data.image_columns
    columns += string_input_columns(data, model_inputs or {})
    columns += [c for c in (data.calibration.stratify_by, data.calibration.group_by) if c is not None]
    if label_names:
        columns += data.label_columns
    return tuple(dict.fromkeys(columns))


def string_input_columns(data: DataSpec, model_inputs: Mapping[str, TensorMeta]) -> list[str]:
    """The data columns that feed a tensor(string) model input (skl2onnx's categorical columns)."""
    return [column for column, target in data.inputs.items()
            if isinstance(target, str) and target in model_inputs and model_inputs[target].dtype == object]  # fmt: skip


def _list_columns(data: DataSpec) -> tuple[str, ...]:
    """The columns a CSV file may hold JSON lists in even where text_columns keeps them as text: the label, whose
    cells are class names or, for token classification, a list of class ids per row (not the columns of a
    multilabel table with one 0/1 column per label)."""
    return (data.label,) if isinstance(data.label, str) else ()


def load_data_table(
    path: Path, data: DataSpec, *, label_names: bool, recipe_file: Path, field: str = "data.path",
    model_inputs: Mapping[str, TensorMeta] | None = None,
) -> pd.DataFrame:  # fmt: skip
    """The table at `path` read for a recipe's `data` section, as the sweep and the gate both read it: the columns
    that name things (and those feeding the string inputs among `model_inputs`) kept as a CSV's text
    (text_columns), a label column of JSON lists read as lists, a CSV file in the dialect `data.csv` declares (in a
    file with decimal commas the text columns' numbers are written with points, as other formats name them, except
    in the columns feeding the model: their text is fed as written), and in another format the text cells of the
    inputs and the label read as a CSV file's are (a Parquet string column of '-1.5' or '[0, 1]' as numbers, lists)."""
    kept = text_columns(data, label_names=label_names, model_inputs=model_inputs)
    dialect = CsvDialect(delimiter=data.csv.delimiter, decimal=data.csv.decimal, thousands=data.csv.thousands)
    table = load_table(path, recipe_file=recipe_file, field=field, text_columns=kept, list_columns=_list_columns(data),
                       verbatim_columns=data.fed_columns, csv_dialect=dialect,
                       value_columns=[*data.inputs, *data.label_columns], encoding=data.encoding)  # fmt: skip
    error = spreadsheet_error(table, read_columns(data))
    if error is not None:
        row, column, cell = error
        raise RecipeError(recipe_file, field, f"{table_name(table)} row {row}, column {column!r}, holds {cell!r}, "
                                              "a spreadsheet error (a formula that failed); expected a value: fix "
                                              "the formula, or leave the cell empty for a missing value")  # fmt: skip
    return table


def read_columns(data: DataSpec) -> tuple[str, ...]:
    """Every column the recipe's `data` section reads: the inputs' (pairs' second texts too), the label's, the slices'
    and the calibration's strata, and the columns its filters name."""
    filters = [data.evaluation.filter, data.calibration.filter, *(spec.filter for spec in data.slices)]
    columns = [*data.fed_columns, *data.label_columns, *text_columns(data, label_names=False)]
    return tuple(dict.fromkeys([*columns, *(column for flt in filters for column in flt or {})]))


def evaluation_rows(
    table: pd.DataFrame, data: DataSpec, *, recipe_file: Path, calibrated: bool,
    unread: Mapping[str, bool] | None = None, dtypes: Mapping[str, np.dtype] | None = None,
) -> EvaluationRows:  # fmt: skip
    """The rows a sweep of a recipe with `data` evaluates, and its slices over them (RecipeError when the recipe's
    filters, slices or inputs do not fit the table). `calibrated`: a variant is fitted on the calibration rows
    (Recipe.fits_on_calibration_rows); then, drawn from this table, they are held out of the evaluation unless
    `data.calibration.overlap: allow`: a variant judged on the rows it was fitted on looks better than it is.
    `unread`: model inputs no output is computed from, whose columns do not tell inputs apart; `dtypes`: the numeric
    type each model input is fed as, which tells them apart (content_table)."""
    nonfinite = nonfinite_masks(table, data.inputs)
    rows = select_rows(table, data.evaluation.filter, field="data.evaluation.filter", recipe_file=recipe_file)
    selected = len(rows)
    rows, dropped = finite_rows(rows, nonfinite, data, what="evaluation", recipe_file=recipe_file)
    left_out = selected - len(rows)
    held_out = 0
    if holds_out(data, calibrated):
        calibration, _, _ = calibration_sample(table, data, nonfinite, recipe_file=recipe_file, hold_out=True)
        kept = rows[~np.isin(rows, calibration)]
        held_out = len(rows) - len(kept)
        if held_out and len(kept) == 0:
            raise RecipeError(
                recipe_file, "data.calibration", f"every one of the {len(rows)} evaluation rows of {table_name(table)} "
                f"is a calibration row ({len(calibration)} drawn); expected rows left to evaluate: lower samples, "
                "separate the rows (calibration.filter / evaluation.filter, "
                "or calibration.path), or set overlap: allow",
            )  # fmt: skip
        rows = kept
    beyond_limit = rows[data.evaluation.limit :] if data.evaluation.limit is not None else rows[:0]
    rows = rows[: len(rows) - len(beyond_limit)]
    masks = slice_masks(table, data.slices, recipe_file=recipe_file, inputs=data.inputs, evaluation_rows=rows)
    if data.nonfinite_inputs == "keep":
        masks = _with_missing_slices(table, masks, missing_slices(rows, nonfinite), recipe_file=recipe_file)
    check_finite(table, rows, nonfinite, masks, what="evaluation", recipe_file=recipe_file,
                 policy=data.nonfinite_inputs)  # fmt: skip
    fed = data.fed_columns  # a column missing is named where the feeds are built
    digests = (row_digests(content_table(table, data, recipe_file=recipe_file, rows=rows, unread=unread,
                                             dtypes=dtypes), rows, fed)
               if all(column in table.columns for column in fed) else None)
    evaluated_masks = {name: mask[rows] for name, mask in masks.items()}
    distinct = distinct_inputs(digests, evaluated_masks) if digests is not None else {}
    return EvaluationRows(rows=rows, masks=masks, nonfinite=nonfinite, dropped=dropped, left_out=left_out,
                          held_out=held_out, beyond_limit=beyond_limit, distinct_inputs=distinct,
                          digests=digests)  # fmt: skip


def limit_notes(table: pd.DataFrame, evaluation: EvaluationRows, data: DataSpec, *, label_classes: bool) -> list[str]:
    """What `data.evaluation.limit` left out, as warnings: how many rows (the limit keeps the first rows in file
    order), and each class of the label (`label_classes`: the task's labels name classes) and each value of a `by`
    slice column that the rows past the limit hold and the rows kept do not. Tables are often ordered by what they
    hold (a partitioned folder by date, an export by label): on one sorted by label, `limit: 150` judged 150 rows of
    one class while 66 of the other were never scored, and nothing said so."""
    kept, beyond = evaluation.rows, evaluation.beyond_limit
    if len(beyond) == 0:
        return []
    notes = [f"data.evaluation.limit: {len(kept)} of the {len(kept) + len(beyond)} evaluation rows of "
             f"{table_name(table)} are evaluated, the first in file order; {len(beyond)} past the limit are not"]
    named = [*(data.label_columns if label_classes else ()), *(spec.by for spec in data.slices if spec.by)]
    for column in dict.fromkeys(named):
        if column not in table.columns:
            continue
        try:
            held = set(table[column].iloc[kept].dropna())
            past = table[column].iloc[beyond].dropna()
            lost = past[~past.isin(held)]
        except TypeError:  # list cells (token labels): no single value to name
            continue
        if lost.empty:
            continue
        counts = lost.value_counts(sort=False)
        shown = ", ".join(f"{format_value(value)} ({count} rows)" for value, count in list(counts.items())[:5])
        more = f", ... ({len(counts)} in all)" if len(counts) > 5 else ""
        what = "label" if column in data.label_columns else "slice column"
        notes.append(f"data.evaluation.limit: the {len(kept)} rows kept hold no row of {what} {column!r} = {shown}"
                     f"{more}, which rows past the limit hold (the limit keeps the first rows: a table ordered by this "
                     "column leaves its later values out); every figure and the gate judge the rows kept alone: "
                     "shuffle the table, or select the rows to judge with data.evaluation.filter")  # fmt: skip
    return notes


def _with_missing_slices(
    table: pd.DataFrame, masks: dict[str, np.ndarray], missing: dict[str, np.ndarray], *, recipe_file: Path
) -> dict[str, np.ndarray]:
    """The recipe's slices and then the `missing:<column>` ones; a recipe slice of one of those names is refused
    (two slices of one name would leave the gate judging one of them)."""
    clash = next((name for name in missing if name in masks), None)
    if clash is not None:
        raise RecipeError(recipe_file, "data.slices", f"slice {clash!r} of {table_name(table)} has the name "
                          "data.nonfinite_inputs: keep gives the rows with NaN/inf in that input column; "
                          "expected another name")  # fmt: skip
    return {**masks, **missing}


def holds_out(data: DataSpec, calibrated: bool) -> bool:
    """Whether the calibration sample is left out of the evaluation: a variant is fitted on it (`calibrated`), it is
    drawn from data.path, and `data.calibration.overlap` is hold_out."""
    return calibrated and data.calibration.path is None and data.calibration.overlap == "hold_out"


def calibration_sample(
    table: pd.DataFrame, data: DataSpec, nonfinite: NonfiniteMasks, *, recipe_file: Path, hold_out: bool = False,
    warn: bool = False, unread: Mapping[str, bool] | None = None, dtypes: Mapping[str, np.dtype] | None = None,
) -> tuple[np.ndarray, dict[str, int], int]:
    """The calibration rows of `table` (data.calibration's filter, the NaN/inf input policy, then the seeded draw),
    input column -> candidates left out for NaN/inf, and how many candidates that is: one derivation for the
    sample and the evaluation rows held out for it.

    With `hold_out` (`holds_out`), when the candidates include rows of the evaluation filter, at most half of the
    candidates are drawn: `samples` (256 by default) from a table of 300 rows without filters would leave 44 rows
    to judge every variant on, and would refuse a table of 200. `warn`: say what makes the sample thinner than
    asked (`warn_thin_sample`, on the rows' cells as fed: `unread` and `dtypes` as evaluation_rows takes them; once
    per sweep, not for each derivation)."""
    spec = data.calibration
    candidates, dropped, left_out = calibration_candidates(table, data, nonfinite, recipe_file=recipe_file)
    if hold_out and spec.samples > len(candidates) // 2:
        evaluated = select_rows(table, data.evaluation.filter, field="data.evaluation.filter", recipe_file=recipe_file)
        if np.isin(candidates, evaluated).any():
            spec = spec.model_copy(update={"samples": max(1, len(candidates) // 2)})
    rows = draw_calibration_sample(table, candidates, spec, recipe_file=recipe_file)
    if warn:
        fed = content_table(table, data, recipe_file=recipe_file, rows=rows, unread=unread, dtypes=dtypes)
        warn_thin_sample(fed, len(candidates), rows, data)
    return rows, dropped, left_out


def calibration_candidates(
    table: pd.DataFrame, data: DataSpec, nonfinite: NonfiniteMasks, *, recipe_file: Path
) -> tuple[np.ndarray, dict[str, int], int]:
    """The rows of `table` the calibration sample may be drawn from (data.calibration.filter, less NaN/inf inputs
    under `data.nonfinite_inputs: drop`), input column -> candidates left out for NaN/inf, and how many that is."""
    selected = select_rows(table, data.calibration.filter, field="data.calibration.filter", recipe_file=recipe_file)
    candidates, dropped = finite_rows(selected, nonfinite, data, what="calibration", recipe_file=recipe_file)
    return candidates, dropped, len(selected) - len(candidates)


def training_rows(
    table: pd.DataFrame, flt: dict[str, Any] | None, evaluation: np.ndarray, *, field: str, recipe_file: Path
) -> np.ndarray:
    """The rows a QAT variant may fine-tune on: its filter's (without one, every row not evaluated), never an
    evaluation row.

    A variant fine-tuned on the rows it is then scored on reports a flattering accuracy, and the gate
    would pass it on that: so a filter that selects evaluation rows is refused, not narrowed silently
    (the user meant those rows; which others to train on is theirs to say)."""
    if flt is None:
        rows = np.setdiff1d(np.arange(len(table), dtype=np.int64), evaluation)
        if len(rows) == 0:
            raise RecipeError(
                recipe_file, field, f"every one of the {len(table)} rows in {table_name(table)} is an evaluation row; "
                "expected rows apart from the evaluation rows to fine-tune on (narrow data.evaluation.filter or "
                "set its limit)",
            )  # fmt: skip
        return rows
    rows = select_rows(table, flt, field=field, recipe_file=recipe_file)
    shared = np.intersect1d(rows, evaluation)
    if shared.size:
        raise RecipeError(
            recipe_file, field, f"selects {shared.size} of the {len(evaluation)} evaluation rows (e.g. row "
            f"{int(shared[0])} of {table_name(table)}); expected rows apart from the evaluation rows: a variant "
            "fine-tuned on the rows it is scored on reports a flattering accuracy (leave the filter out to train "
            "on every row that is not evaluated)",
        )  # fmt: skip
    return rows


def finite_rows(
    rows: np.ndarray, nonfinite: NonfiniteMasks, data: DataSpec, *, what: str, recipe_file: Path
) -> tuple[np.ndarray, dict[str, int]]:
    """With `data.nonfinite_inputs: drop`, `rows` less those holding NaN/inf, and input column -> rows left out
    (with `error`, `rows` as they are: check_finite refuses them). Leaving out every row is a RecipeError."""
    if data.nonfinite_inputs != "drop" or not nonfinite:
        return rows, {}
    kept, counts = drop_nonfinite(rows, nonfinite)
    if len(kept) == 0:
        shown = ", ".join(f"{column}: {n}" for column, n in counts.items())
        raise RecipeError(recipe_file, "data.nonfinite_inputs",
                          f"every {what} row holds NaN or inf in an input column ({shown})")  # fmt: skip
    return kept, counts
