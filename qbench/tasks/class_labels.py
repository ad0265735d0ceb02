"""How label cells name classes: class ids read in one pass from integer or digit-text columns, text cells read as
the numbers they write, and each label's score column among a stated class table (3, 3.0 and '3' are one class)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from qbench.tasks.base import LabelError, example_rows
from qbench.validate.metrics import top1

AGREEMENT_Z = NormalDist().inv_cdf(0.999)  # one-sided: a reading unrelated to the labels passes 1 run in 1,000
MIN_AGREEMENT_ROWS = 30  # fewer distinct rows test no agreement (the binomial's normal approximation fails)


def integral(value: Any) -> bool:
    """Whether `value` is a whole number a class id can hold (int64: 1e20 is whole, but no class id)."""
    if isinstance(value, (bool, np.bool_)):
        return True
    if isinstance(value, (int, np.integer)):
        return -(2**63) <= int(value) < 2**63
    return isinstance(value, (float, np.floating)) and float(value).is_integer() and abs(float(value)) < 2**63


def plain_class_ids(values: Sequence[Any]) -> np.ndarray | None:
    """Labels that are all Python ints within int64 and >= 0, as a Parquet or NumPy integer column gives them, as one
    int64 array in one pass (what the per-value checks of labels_from_values would conclude); else None, and those
    checks run and explain what is wrong."""
    if len(values) == 0 or not all(type(value) is int for value in values):
        return None
    labels = np.array(values)
    if labels.dtype != np.int64 or labels.min() < 0:
        return None
    return labels


def text_class_ids(values: Sequence[Any]) -> np.ndarray | None:
    """Labels that are all the text of a non-negative int64 in ASCII digits ("3", "+3", "007"), as a CSV label column
    read as text gives them, as one int64 array in one pass over them all joined, where as_number runs a regex per
    label; else None, and the per-value checks run and explain what is wrong."""
    if len(values) == 0 or not all(type(value) is str for value in values):
        return None
    joined = "\n".join(values)
    if joined.count("\n") != len(values) - 1:  # a label holding a line break
        return None
    lines = joined.removeprefix("+").replace("\n+", "\n")  # one leading '+' a line
    digits = lines.replace("\n", "")
    if "\n\n" in lines or lines.startswith("\n") or lines.endswith("\n") or not (digits.isascii() and digits.isdigit()):
        return None  # an empty label, or one that is no ASCII digits (no regex: one per label, or 80 MB on 500k)
    try:
        labels = np.array(values, dtype=np.int64)
    except (OverflowError, ValueError):
        return None
    return labels if labels.min() >= 0 else None


def as_number(value: Any) -> Any:
    """A label cell that is the text of a number ("3", "-1", "3.0") or of a truth value ("True", as pandas reads
    it) as that value, anything else as it is: a CSV label column keeps the text its file holds
    (qbench.data.text_tables), so that "01" can name a class, while class ids and integer classes are read as the
    numbers they write."""
    if not isinstance(value, str):
        return value
    if value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    try:
        number = float(value)
    except ValueError:
        return value
    return number if math.isfinite(number) else value


def label_columns(values: Sequence[Any], classes: Sequence[Any], positions: np.ndarray, *, unknown: str) -> list[int]:
    """Each label value's score column: its position in `classes` (3, 3.0 and '3' are one class). Values that are
    none of them are a LabelError whose example rows `unknown` describes."""
    key = class_key if any(isinstance(name, str) for name in classes) else _number_key
    column = {key(name): index for index, name in enumerate(classes)}
    missing = np.array([key(v) not in column for v in values], dtype=bool)
    if missing.any():
        raise LabelError(f"{example_rows(missing, values, positions)} {unknown}{_near_class(values, missing, classes)}")
    return [column[key(v)] for v in values]


def _near_class(values: Sequence[Any], missing: np.ndarray, classes: Sequence[Any]) -> str:
    """'; ' DOG ' differs from class 'dog' only in case or surrounding spaces' for the first unknown label when it
    does: exported labels often do, and a class is never guessed for them (two classes may differ only so)."""
    value = values[int(np.flatnonzero(missing)[0])]
    if not isinstance(value, str):
        return ""
    near = [name for name in classes if str(name).strip().casefold() == value.strip().casefold()]
    if not near:
        return ""
    return (f"; {value!r} differs from class {str(near[0])!r} only in "
            "case or surrounding spaces (labels name a class exactly)")


def class_key(value: object) -> str:
    """A class as labels and class tables name it: a label column with gaps reads 3 as 3.0."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def _number_key(value: object) -> str:
    """A class of a table of integer classes: the text "07" of a CSV label names class 7."""
    return class_key(as_number(value))


def decisions_beyond_labels(scores: np.ndarray, labels: np.ndarray, output: str) -> str | None:
    """Why the columns of a score output (`output`: its name and shape, for the message) are not the labels' classes,
    judged by FP32's `scores` (rows, columns) against row `labels` (class ids), else None: the labels reach at most
    half of the columns and FP32's top column lies beyond every label on most rows. A row decided there is wrong
    whatever the labels, so such an FP32 accuracy measures the reading, not the model: a per-position output (token
    scores of an input of a fixed length, [rows, 128] beside input ids [rows, 128]) read as one class per position, or
    labels of another task's classes (10 against a 1000-class head). A classifier evaluated on rows of a few of its
    classes decides those classes on most of them, and one weak on those rows (a hard or shifted set: most rows decided
    as other classes) still agrees with the labels beyond chance, which a reading of positions or of other classes
    does not (_agreement, over the distinct rows: the dry run repeats a few to fill a batch). Fewer than
    MIN_AGREEMENT_ROWS distinct rows (the dry run's 8) cannot tell the two apart: None, and FP32's run on the
    evaluation rows decides."""
    predicted, classes = top1(scores), np.shape(scores)[1]
    decided = predicted >= 0
    if labels.ndim != 1 or not labels.size or labels.min() < 0 or not decided.any():
        return None
    highest = int(labels.max())
    if 2 * (highest + 1) > classes:
        return None
    beyond = int(np.count_nonzero(predicted > highest))
    if 2 * beyond <= int(np.count_nonzero(decided)):
        return None
    _, first = np.unique(np.column_stack([scores, labels]), axis=0, return_index=True)
    distinct = np.isin(np.arange(len(labels)), first) & decided
    if np.count_nonzero(distinct) < MIN_AGREEMENT_ROWS:
        return None
    accuracy, least = _agreement(predicted[distinct], labels[distinct])
    if accuracy > least:
        return None
    return (f"FP32's highest of its {classes} score columns is beyond every label (labels 0..{highest}) on {beyond} "
            f"of {len(predicted)} rows, and its distinct rows' accuracy {accuracy:.1%} is no more than columns "
            f"unrelated to the labels give (agreement needs above {least:.1%}): the columns of {output} are not the "
            "labels' classes (classification reads one class per column): a per-position output (token scores of a "
            "fixed-length input) or labels of other classes; expected model.output naming class scores, task span or "
            "structured for per-position scores, or labels in the output's classes")


def _agreement(predicted: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """The share of rows whose `predicted` column is their label, and the least share showing that the two agree more
    than independent draws would: their agreement as such (sum over classes of the share of rows decided as it times
    the share labelled it) plus AGREEMENT_Z binomial standard errors."""
    columns, decided_as = np.unique(predicted, return_counts=True)
    labelled_as = np.array([np.count_nonzero(labels == column) for column in columns])
    chance = float(np.sum(decided_as * labelled_as)) / predicted.size**2
    least = chance + AGREEMENT_Z * math.sqrt(chance * (1.0 - chance) / predicted.size)
    return float(np.mean(predicted == labels)), least
