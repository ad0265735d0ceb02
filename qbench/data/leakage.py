"""Rows a variant is fitted on (calibration, QAT) that it is also judged on, found by what they feed the model.

A variant judged on rows it was calibrated or fine-tuned on looks better than it would on unseen rows. Within
one table qbench keeps such rows apart by position (data.calibration.overlap, qat.train); these digests also
find the same row twice in a table, or in a calibration file that copies part of the data file.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable

import numpy as np
import pandas as pd

logger = logging.getLogger(__name__)


def row_digests(table: pd.DataFrame, rows: np.ndarray, columns: Iterable[str]) -> set[str]:
    """sha256 of each row's cells in `columns` (arrays by their values, so a list cell and the same numbers read
    as an array are one row; a float32 cell and its float64 widening are too)."""
    columns = list(columns)
    return {_digest(table, int(row), columns) for row in rows}


def shared_rows(fitted: pd.DataFrame, fit_rows: np.ndarray, judged: pd.DataFrame, judged_rows: np.ndarray,
                columns: Iterable[str]) -> int:  # fmt: skip
    """How many of `fit_rows` of `fitted` feed the model exactly what one of `judged_rows` of `judged` feeds it."""
    columns = list(columns)
    judged_digests = row_digests(judged, judged_rows, columns)
    return sum(_digest(fitted, int(row), columns) in judged_digests for row in fit_rows)


def warn_shared(shared: int, total: int, what: str, cause: str) -> None:
    """Say that `shared` of the `total` `what` rows (calibration, a QAT variant's training) are evaluated too."""
    if shared:
        logger.warning("%d of the %d %s rows feed the model what evaluation rows feed it (%s); variants fitted on "
                       "them may look better than on unseen rows", shared, total, what, cause)  # fmt: skip


def _digest(table: pd.DataFrame, row: int, columns: list[str]) -> str:
    digest = hashlib.sha256()
    for column in columns:
        digest.update(repr(_plain(table[column].iat[row])).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _plain(cell: object) -> object:
    """A cell as Python values: numbers of any width alike, arrays and lists alike."""
    if isinstance(cell, (np.ndarray, list, tuple)):
        return [_plain(value) for value in (cell.tolist() if isinstance(cell, np.ndarray) else cell)]
    if isinstance(cell, (np.floating, float)):
        return float(cell)
    if isinstance(cell, (np.integer, np.bool_)):
        return int(cell)
    return cell
