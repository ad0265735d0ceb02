"""The evaluation labels read and checked by the task (`read_labels`). Labels given as class names (`data.classes`):
each names a score column of the outputs, by its position in the list; the labels checked against each evaluated
output (`check_output_labels`; where the graph leaves its width symbolic, against FP32's outputs:
`check_labels_fit_outputs`), and against FP32's answers (`check_labels_beat_chance`).

Checked against what the graph says of its outputs before any label is read: a map output names its own classes, a
graph may name its columns (a ZipMap's keys, a class table), and the count must match the score columns.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from qbench.data.labels import label_cells, unlabelled_hint
from qbench.data.text_tables import text_cells_hint
from qbench.errors import RecipeError
from qbench.modelinfo.signature import TensorMeta
from qbench.recipe.spec import Recipe
from qbench.results.schema import SliceMetrics
from qbench.tasks import LabelError, Task, get_task
from qbench.tasks.base import wilson
from qbench.tasks.class_labels import label_columns
from qbench.tasks.class_scores import (
    ONE_COLUMN_CLASSES,
    below_chance,
    chance_accuracy,
    class_count,
    column_classes,
    one_score_column,
)
from qbench.tasks.selection import OutputChoice
from qbench.tasks.tokens import IGNORE_LABEL, any_token_list
from qbench.validate.catalogue import OUTPUT_SEPARATOR

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from qbench.preflight.prepare import Prepared  # which imports this module


def named_classes(
    recipe: Recipe, task: Task, values: list, outputs: list[OutputChoice], positions: np.ndarray
) -> list[int]:
    """Label values read through `data.classes`: each names a score column, by its position in the list."""
    classes = recipe.data.classes or []
    if task.name != "classification":
        raise RecipeError(recipe.source, "data.classes", f"task {task.name!r} does not read class names; "
                          "expected it only with task: classification")  # fmt: skip
    if any_token_list(values):  # names would be read per row, a whole list as one name: "are none of data.classes"
        raise RecipeError(recipe.source, "data.classes", f"column {recipe.data.label!r} holds a list of token labels "
                          "per row, and data.classes names one class per row; expected token labels as integer class "
                          f"ids (the score columns' numbers, {IGNORE_LABEL} for a token not to score) and no "
                          "data.classes")  # fmt: skip
    mapped = [o.name for o in outputs if o.meta.kind == "map" and not _ids_in_order(o.meta.class_keys)]
    if mapped:
        raise RecipeError(recipe.source, "data.classes",
                          f"output {mapped[0]!r} names its own classes (a map); expected "
                          "no data.classes with it")  # fmt: skip
    for choice in outputs:
        stated = column_classes(choice.meta)
        if stated is not None and [str(c) for c in stated] != [str(c) for c in classes]:
            raise RecipeError(recipe.source, "data.classes",
                              f"output {choice.name!r} names its own classes in the graph "
                              f"({', '.join(map(str, stated))}); expected "
                              "data.classes left out, or equal to them")  # fmt: skip
        count = class_count(choice.meta)
        if count is not None and count != len(classes):
            layout = f" ({ONE_COLUMN_CLASSES})" if one_score_column(choice.meta) else ""
            raise RecipeError(recipe.source, "data.classes", f"names {len(classes)} classes, output {choice.name!r} "
                              f"has {count}{layout}; expected one name per class, in column order")  # fmt: skip
    return label_columns(values, classes, positions,
                         unknown=f"are none of data.classes ({', '.join(map(str, classes))})")  # fmt: skip


def _ids_in_order(keys: Sequence[int | str] | None) -> bool:
    """Whether a map's keys are the class ids 0, 1, ... (skl2onnx's `nocl` option, a model trained on ids): they name no
    class, so `data.classes` names them, in key order, as it names a score tensor's columns."""
    return keys is not None and tuple(keys) == tuple(range(len(keys)))


def check_output_labels(
    recipe: Recipe, task: Task, labels: np.ndarray, output: TensorMeta, positions: np.ndarray, evaluated: int
) -> None:
    """The task's check of the labels against one evaluated output. Where several are evaluated, every one is judged
    as the recipe's task against the one data.label: an output the labels do not fit may be a head of another task
    (a regression head beside a classifier's logits), so the error says how such a head is judged."""
    try:
        task.check_labels(labels, output, positions)
    except LabelError as exc:
        if evaluated < 2:
            raise
        raise LabelError(
            f"{exc}; every output in model.outputs is judged as task {recipe.task!r} against data.label: for an "
            f"output of another task, evaluate it in a recipe of its own (model.output: {output.name}, with its own "
            "task and data.label), or use task: structured with your own metrics: over several outputs"
        ) from None


def below_chance_readings(recipe: Recipe, outputs: Sequence[OutputChoice], overall: SliceMetrics, labels: np.ndarray,
                          unpaired: Callable[[], SliceMetrics]) -> list[tuple[str, bool]]:  # fmt: skip
    """For each evaluated output on which FP32's accuracy over every evaluation row (`overall`, its figures against
    `labels`) is below what a uniform guess among its classes scores and below what a guess answering each class as
    often as FP32 does, whatever the input, scores (`unpaired`: FP32's figures against the labels shuffled across
    rows, asked only then): why that is suspect (class_scores.below_chance) and whether it is beyond chance's reach,
    the 95 % interval (the report's) ending below both. Labels in another coding than the output's columns (ids
    shifted by one, data.classes in another order, binary labels inverted) make FP32 wrong on nearly every row, and a
    variant is then judged by its changes between wrong answers. An evaluation set whose labels lean to classes FP32
    answers less often (one class's rows only: FP32's accuracy there is its recall of that class, below a uniform
    guess for a model that answers it rarely) scores no better unpaired: no reading. None where FP32 gives NaN/inf
    (those rows are misses whatever the labels say) or the task is not classification."""
    if recipe.task != "classification" or overall.nonfinite_outputs:
        return []
    found: list[tuple[str, bool]] = []
    shuffled = functools.cache(unpaired)
    for choice in outputs:
        name = f"{choice.name}{OUTPUT_SEPARATOR}accuracy" if len(outputs) > 1 else "accuracy"
        rate, rows = overall.metrics.get(name, math.nan), overall.judged_count(name)
        guess = functools.cache(lambda name=name: shuffled().metrics.get(name, math.nan))
        judged = rows and math.isfinite(rate)
        why = below_chance(rate, choice.meta, labels, recipe.data.classes, guess) if judged else None
        if why is None:
            continue
        high = wilson(rate, rows)[1]
        sure = high < min(chance_accuracy(choice.meta, labels) or 0.0, guess())
        found.append((f"{why}; {rate:.4g} of {rows} evaluated, 95% interval up to {high:.4g}", sure))
    return found


def check_labels_beat_chance(recipe: Recipe, outputs: Sequence[OutputChoice], overall: SliceMetrics,
                             labels: np.ndarray, unpaired: Callable[[], SliceMetrics]) -> list[str]:  # fmt: skip
    """A RecipeError on data.label where FP32's accuracy is below chance beyond its interval (below_chance_readings):
    FP16 rounding that changed 6 % of 600 rows' answers gained 0.023 accuracy against labels shifted by one and
    passed a max_drop of 0.05 it breaches against labels in the output's order. Otherwise the readings within the
    interval, for a warning."""
    readings = below_chance_readings(recipe, outputs, overall, labels, unpaired)
    sure = next((why for why, certain in readings if certain), None)
    if sure is None:
        return [why for why, _ in readings]
    column = f"column {recipe.data.label!r}" if isinstance(recipe.data.label, str) else "the label columns"
    raise RecipeError(recipe.source, "data.label", (
        f"{column}: {sure}, below the guess: FP32 is wrong on nearly every row, most likely labels in another coding "
        "than the output's columns (ids shifted by one, another class order, binary labels inverted), and every drop "
        "against them would count changes between wrong "
        "answers; expected labels in the output's class order"))  # fmt: skip


def read_labels(
    recipe: Recipe, task: Task, table: pd.DataFrame, rows: np.ndarray, outputs: list[OutputChoice]
) -> np.ndarray | None:
    """The label column(s) read and checked by the task (type, then against every evaluated output)."""
    positions = np.asarray(rows)
    values = cells = label_cells(table, recipe.data, positions, recipe_file=recipe.source)  # None without labels
    if values is None:
        for choice in outputs:
            reason = task.labels_needed(choice.meta)
            if reason is not None:
                raise RecipeError(recipe.source, "data.label", reason)
        return None
    try:
        if recipe.data.classes is not None:
            values = named_classes(recipe, task, values, outputs, positions)
        else:
            values = task.decode_label_names(values, [c.meta for c in outputs], positions)
        labels = task.labels_from_values(values, positions)
        for choice in outputs:
            check_output_labels(recipe, task, labels, choice.meta, positions, len(outputs))
    except LabelError as exc:
        single = isinstance(recipe.data.label, str)  # its text cells: '0,5' in a CSV not declaring decimal commas, ...
        column = recipe.data.label if single else ""
        hint = text_cells_hint(table[column]) + unlabelled_hint(table, column, positions) if single else ""
        raise label_error(recipe, exc, hint + default_task_hint(recipe, cells)) from None
    return labels


def label_error(recipe: Recipe, exc: LabelError, hint: str = "") -> RecipeError:
    """`exc` as the recipe's data.label error, naming its column(s)."""
    columns = recipe.data.label_columns
    named = f"column {columns[0]!r}" if isinstance(recipe.data.label, str) else f"columns {', '.join(columns)}"
    return RecipeError(recipe.source, "data.label", f"{named}: {exc}{hint}")


def check_labels_fit_outputs(prepared: Prepared, outputs: Mapping[str, np.ndarray], labels: np.ndarray) -> None:
    """Every evaluation label against the width FP32's `outputs` show, for the outputs whose graph leaves a dimension
    symbolic (`["batch", "classes"]`): `prepare` could not check those, and a label beyond the classes is then the
    same data.label error as with a static width, not a scoring failure naming neither the column nor the row. Then
    the task's check of the labels against the values FP32 gave on the rows it ran, whose labels are `labels`
    (Task.check_labels_against_reference)."""
    if prepared.labels is None:
        return
    task = get_task(prepared.recipe.task)
    for choice in prepared.outputs:
        values = outputs.get(choice.name)
        meta = choice.meta
        if values is None or meta.kind != "tensor":
            continue
        try:
            if None in meta.shape[1:] or len(meta.shape) != np.ndim(values):
                shown = replace(meta, shape=tuple(np.shape(values)))
                check_output_labels(prepared.recipe, task, prepared.labels, shown, prepared.evaluation_rows,
                                     len(prepared.outputs))  # fmt: skip
            task.check_labels_against_reference(prepared.labels, meta, values, labels)
        except LabelError as exc:
            raise label_error(prepared.recipe, exc) from None


def default_task_hint(recipe: Recipe, cells: Sequence[Any]) -> str:
    """For an error about labels read by the default task: that the recipe states none, where the label cells are
    floats (one per row, or a list per row). A regressor's targets (diabetes' 151.0 ..., two per row of a
    MultiOutputRegressor) were refused as class ids outside the output's classes, or as token labels, and nothing said
    that `task` had been left to its default. Whole floats beside missing cells are the class ids of an integer column
    with gaps (pandas reads it as floats), not targets."""
    if "task" in recipe.model_fields_set or recipe.task != "classification":
        return ""
    floats = np.array([v for cell in cells for v in _cell_floats(cell)], dtype=np.float64)
    finite = floats[np.isfinite(floats)]
    whole_with_gaps = finite.size < floats.size and bool(np.all(finite == np.round(finite)))
    if not finite.size or whole_with_gaps:
        return ""
    return ("; the recipe sets no task, so these labels were read as class ids (task: classification); for a "
            "regressor's targets, one or a list per row, set task: regression")


def _cell_floats(cell: Any) -> list[float]:
    """The floats a label cell is or holds (a list cell's, nested lists included); a class id is an integer or a
    name."""
    if isinstance(cell, (list, tuple, np.ndarray)):
        return [v for item in cell for v in _cell_floats(item)]
    return [float(cell)] if isinstance(cell, (float, np.floating)) else []
