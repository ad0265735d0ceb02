"""Rows a variant is fitted on (calibration, QAT) that it is also judged on, found by what they feed the model.

A variant judged on rows it was calibrated or fine-tuned on looks better than it would on unseen rows. Within
one table qbench keeps such rows apart by position (data.calibration.overlap, qat.train); these digests also
find the same row twice in a table, or in a calibration file that copies part of the data file.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

logger = logging.getLogger(__name__)

_BLOCK_ROWS = 8192
"""Rows encoded at a time: the encodings of a million rows of 64 floats, widened to float64 at once, held 1.5 GB
(more than the table) at the start of every sweep; a block's cells encode as they would in any other block."""


def row_digests(table: pd.DataFrame, rows: np.ndarray, columns: Iterable[str]) -> np.ndarray:
    """sha256 of each of `rows`' cells in `columns`, in order, as 32-byte strings (arrays by their values, so a list
    cell and the same numbers read as an array are one row; a float32 cell and its float64 widening are too). A table's
    rows are hashed once and the digests shared: the evaluation rows' count their distinct inputs
    (distinct_inputs) and find calibration rows they repeat (shared_rows)."""
    return np.array(_digests(table, rows, list(columns)), dtype="S32").reshape(-1)


def shared_rows(fitted: pd.DataFrame, fit_rows: np.ndarray, judged: np.ndarray, columns: Iterable[str]) -> int:
    """How many of `fit_rows` of `fitted` feed the model exactly what one of the rows whose row_digests are `judged`
    feeds it."""
    return int(np.isin(row_digests(fitted, fit_rows, columns), judged).sum())


def distinct_inputs(digests: np.ndarray, slices: Mapping[str, np.ndarray]) -> dict[str, int]:
    """How many distinct inputs rows whose row_digests are `digests` feed the model, overall ("overall") and on each
    of `slices` (name -> mask over those rows), for the scopes where that is fewer than their rows: copies of a row
    are one input, and a variant that gets an input wrong gets every copy of it wrong."""
    scopes = {"overall": np.ones(len(digests), dtype=bool), **slices}
    counts = {name: len(np.unique(digests[mask])) for name, mask in scopes.items()}
    return {name: count for name, count in counts.items() if count < int(scopes[name].sum())}


def warn_shared(shared: int, total: int, what: str, cause: str) -> None:
    """Say that `shared` of the `total` `what` rows (calibration, a QAT variant's training) are evaluated too."""
    if shared:
        logger.warning("%d of the %d %s rows feed the model what evaluation rows feed it (%s); variants fitted on "
                       "them may look better than on unseen rows", shared, total, what, cause)  # fmt: skip


def _digests(table: pd.DataFrame, rows: np.ndarray, columns: list[str]) -> list[bytes]:
    """The digest of each of `rows`, in order: sha256 over its cells' encodings (_cell), column by column. A column
    of numbers, or of arrays of one shape, is encoded whole with numpy (a million rows in seconds, where a cell at a
    time took minutes); any other column cell by cell, the same encoding either way."""
    positions = np.asarray(rows, dtype=np.int64)
    if not columns:
        return [hashlib.sha256(b"").digest()] * len(positions)
    values = [table[column].to_numpy() for column in columns]
    digests: list[bytes] = []
    for start in range(0, len(positions), _BLOCK_ROWS):
        block = positions[start : start + _BLOCK_ROWS]
        encoded = [_column_cells(column[block]) for column in values]
        if all(isinstance(cells, np.ndarray) for cells in encoded):  # one byte row per table row: no Python per cell
            digests += [hashlib.sha256(row).digest() for row in np.concatenate(encoded, axis=1)]
            continue
        cells = [[row.tobytes() for row in cells] if isinstance(cells, np.ndarray) else cells for cells in encoded]
        digests += [hashlib.sha256(b"".join(row)).digest() for row in zip(*cells)]
    return digests


def _column_cells(values: np.ndarray) -> np.ndarray | list[bytes]:
    """Each cell's encoding (_cell) of one column's selected `values`, followed by the separator b"\\0": a uint8
    matrix of one row per cell for a column of numbers or of arrays of one shape (every cell the same length), a
    list of bytes otherwise."""
    numbers = _numbers(values)
    if numbers is None and values.dtype == object and len(values) and all(isinstance(v, np.ndarray) for v in values):
        shapes = {value.shape for value in values}
        numbers = _numbers(np.stack(list(values))) if len(shapes) == 1 else None
    if numbers is None:
        return [_cell(value) + b"\0" for value in values]
    tag, array = numbers
    head = np.frombuffer(tag + repr(array.shape[1:]).encode(), dtype=np.uint8)
    body = np.ascontiguousarray(array.reshape(len(array), -1)).view(np.uint8)
    return np.hstack([np.broadcast_to(head, (len(array), head.size)), body, np.zeros((len(array), 1), np.uint8)])


def _numbers(array: np.ndarray) -> tuple[bytes, np.ndarray] | None:
    """b"i" and the values as int64, or b"f" and as float64 (every NaN the same NaN, -0.0 as 0.0: bit patterns the
    model computes alike, which a digest of the bytes told apart), for an array of numbers of any width: what tells
    cells apart is the kind and the value, as in the model's feed. None for anything else."""
    kind = array.dtype.kind
    if kind in "bi" or (kind == "u" and (array.size == 0 or int(array.max()) < 2**63)):
        return b"i", array.astype(np.int64)
    if kind == "f":
        wide = array.astype(np.float64) + 0.0  # -0.0 + 0.0 is 0.0
        return b"f", np.where(np.isnan(wide), np.nan, wide)
    return None


def _cell(cell: object) -> bytes:
    """One cell's encoding: a number, a list or an array of numbers as _numbers encodes it; anything else its repr
    (an array or a tuple as a list: the same strings in any of them are one cell)."""
    if isinstance(cell, (np.ndarray, list, tuple, int, float, np.number, np.bool_)) and not isinstance(cell, str):
        try:
            array = np.asarray(cell)
        except ValueError:  # ragged
            array = None
        numbers = _numbers(array) if array is not None else None
        if numbers is not None:
            return numbers[0] + repr(numbers[1].shape).encode() + numbers[1].tobytes()
    plain = cell.tolist() if isinstance(cell, np.ndarray) else list(cell) if isinstance(cell, tuple) else cell
    return b"r" + repr(plain).encode()
