"""What a classifier's output says of its classes, before any label is read: how many (`class_count`), which class
each score column stands for (`column_classes`: a ZipMap's keys, a class table), whether a label output is read as
positions in its graph's class table (`named_labels`), and why an FP32 accuracy below a uniform guess over them is
suspect (`below_chance`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from qbench.modelinfo.classes import keys_are_columns
from qbench.modelinfo.signature import TensorMeta
from qbench.tasks.base import is_float


def named_labels(output: TensorMeta) -> bool:
    """Whether `output` is a label tensor whose class table the graph states, read as positions there as the data's
    labels are: strings, or integers that are no column numbers (-1 / +1; qbench.modelinfo)."""
    return output.kind == "tensor" and output.dtype.kind in "Oiu" and output.class_keys is not None


def class_count(output: TensorMeta) -> int | None:
    """How many classes an output has, when the graph says (a static last dim, a ZipMap's keys, a label's table, a
    boolean decision's two, an ArgMax's scores)."""
    if output.kind == "tensor" and output.dtype.kind == "b":
        return 2
    if output.class_count is not None:
        return output.class_count
    if output.kind == "map" or named_labels(output):
        return None if output.class_keys is None else len(output.class_keys)
    if one_score_column(output):
        return 2
    if is_float(output) and output.shape and output.shape[-1] is not None:
        return output.shape[-1]
    return None


def one_score_column(output: TensorMeta) -> bool:
    """A binary classifier's single score per row, (rows, 1) or (rows,): the score of its second class, so it stands
    for two classes (a rank-1 output's only dimension is its rows, whatever size it states)."""
    if output.kind != "tensor" or not is_float(output):
        return False
    return len(output.shape) == 1 or (len(output.shape) > 1 and output.shape[-1] == 1)


ONE_COLUMN_CLASSES = "a single score column stands for two classes, listed as [negative, positive], e.g. ['no', 'yes']"


def chance_accuracy(output: TensorMeta, labels: np.ndarray) -> float | None:
    """The accuracy a uniform guess over `output`'s classes scores (1 / classes; the labels' distinct values where the
    graph does not say how many), None with fewer than two."""
    classes = class_count(output) or len(np.unique(labels))
    return 1.0 / classes if classes >= 2 else None


def below_chance(
    accuracy: float, output: TensorMeta, labels: np.ndarray, named: Sequence[Any] | None = None,
    unpaired: Callable[[], float] | None = None,
) -> str | None:
    """Why an FP32 accuracy below a uniform guess (1 / classes) is suspect, else None: a model that bad is more often
    a label column read against the wrong score columns than a model anyone would ship. `named`: data.classes, whose
    order is then the likelier culprit. `unpaired`: what a guess answering each class as often as FP32 does,
    whatever the input, scores against these labels (asked only for an accuracy below the uniform guess: it shuffles
    the labels and scores FP32 again); an accuracy not below it is no reading either."""
    chance = chance_accuracy(output, labels)
    if chance is None or not accuracy < chance:
        return None
    unpaired_rate = unpaired() if unpaired is not None else None
    if unpaired_rate is not None and not accuracy < unpaired_rate:
        return None
    classes = round(1.0 / chance)
    if named:
        hint = (f"check the order of data.classes ({listed_classes(named)}): "
                "it names each score column's class in column order")
        if one_score_column(output):
            hint += f"; {ONE_COLUMN_CLASSES}"
    elif (stated := column_classes(output)) is not None:  # data.classes is refused beside a class table
        hint = (f"the graph names its classes ({listed_classes(stated)}), so a number label is the position of its "
                f"class there (0: {stated[0]}); write the labels as those classes, or recode them to those positions")
    else:
        hint = "if the labels are not the score columns' numbers, name each column's class with data.classes"
    guess = "" if unpaired_rate is None else (" and a guess answering each class as "
                                              f"often as FP32 does ({unpaired_rate:.4f})")
    return (f"FP32 accuracy {accuracy:.4f} on output {output.name!r} is below a uniform guess over {classes} classes "
            f"({1.0 / classes:.4f}){guess}: {hint}")  # fmt: skip


def column_classes(output: TensorMeta) -> tuple[int | str, ...] | None:
    """The class each score column stands for, when that is not simply the column's number: a ZipMap's string or
    negative integer keys (read in sorted order), a score tensor's class table (in column order). None: labels are
    column ids."""
    keys = output.class_keys
    if keys is None:
        return None
    if output.kind == "map":  # non-negative integer keys are the matrix's columns already (qbench.validate.outputs)
        if keys_are_columns(keys):
            return None
        return tuple(sorted(str(k) for k in keys)) if all(isinstance(k, str) for k in keys) else tuple(sorted(keys))
    return None if tuple(keys) == tuple(range(len(keys))) else tuple(keys)


def listed_classes(classes: Sequence[Any]) -> str:
    """The first 12 classes, comma-separated, and '...' where there are more."""
    return ", ".join(str(c) for c in classes[:12]) + (", ..." if len(classes) > 12 else "")
