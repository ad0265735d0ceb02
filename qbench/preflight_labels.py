"""Labels given as class names (`data.classes`): each names a score column of the outputs, by its position in the list;
and the labels checked against each evaluated output (`check_output_labels`).

Checked against what the graph says of its outputs before any label is read: a map output names its own classes, a
graph may name its columns (a ZipMap's keys, a class table), and the count must match the score columns.
"""

from __future__ import annotations

import numpy as np

from qbench.errors import RecipeError
from qbench.modelinfo import TensorMeta
from qbench.recipe import Recipe
from qbench.tasks import LabelError, Task
from qbench.tasks.class_labels import label_columns
from qbench.tasks.classification import ONE_COLUMN_CLASSES, class_count, column_classes, one_score_column
from qbench.tasks.selection import OutputChoice
from qbench.tasks.tokens import IGNORE_LABEL, any_token_list


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
    mapped = [o.name for o in outputs if o.meta.kind == "map"]
    if mapped:
        raise RecipeError(recipe.source, "data.classes", f"output {mapped[0]!r} names its own classes (a map); expected "
                          "no data.classes with it")  # fmt: skip
    for choice in outputs:
        stated = column_classes(choice.meta)
        if stated is not None and [str(c) for c in stated] != [str(c) for c in classes]:
            raise RecipeError(recipe.source, "data.classes", f"output {choice.name!r} names its own classes in the graph "
                              f"({', '.join(map(str, stated))}); expected data.classes left out, or equal to them")  # fmt: skip
        count = class_count(choice.meta)
        if count is not None and count != len(classes):
            layout = f" ({ONE_COLUMN_CLASSES})" if one_score_column(choice.meta) else ""
            raise RecipeError(recipe.source, "data.classes", f"names {len(classes)} classes, output {choice.name!r} "
                              f"has {count}{layout}; expected one name per class, in column order")  # fmt: skip
    return label_columns(values, classes, positions, unknown=f"are none of data.classes ({', '.join(map(str, classes))})")


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
