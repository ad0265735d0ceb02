"""Model outputs as arrays: run every evaluation row in batches and keep the chosen outputs.

A sequence of {class: score} maps (a converter's ZipMap) becomes a (rows, classes) matrix.
Non-negative integer keys give the column: column k holds class k's score (absent classes score 0), so
the argmax is the class id itself; other keys (strings, -1 / +1) take their sorted position. A string label output
becomes class ids too: each value's position in the class table the graph states for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from qbench.backends.base import Runner
from qbench.data.feeds import iter_batches
from qbench.errors import QbenchError
from qbench.modelinfo.classes import keys_are_columns
from qbench.progress import track


def maps_to_matrix(rows: Sequence[Mapping[Any, float]]) -> np.ndarray:
    """(rows, classes) float32 from per-row {class: score} maps (see the module docstring for columns)."""
    keys = sorted({key for row in rows for key in row})
    if keys and keys_are_columns(tuple(int(k) if isinstance(k, np.integer) else k for k in keys)):
        columns = {key: int(key) for key in keys}
        width = int(keys[-1]) + 1
    else:
        columns = {key: position for position, key in enumerate(keys)}
        width = len(keys)
    matrix = np.zeros((len(rows), width), dtype=np.float32)
    for row_index, row in enumerate(rows):
        for key, score in row.items():
            matrix[row_index, columns[key]] = score
    return matrix


def is_maps(value: Any) -> bool:
    """Whether one batch of an output is a sequence of {class: score} maps (a ZipMap's), whose width is the classes
    that batch happens to hold."""
    return isinstance(value, list) and all(isinstance(row, Mapping) for row in value)


def as_array(value: Any, name: str) -> np.ndarray:
    """One batch of one output as an array; a list of maps becomes a score matrix."""
    if isinstance(value, np.ndarray):
        return value
    if is_maps(value):
        return maps_to_matrix(value)
    try:
        array = np.asarray(value)
    except ValueError:  # ragged: a sequence of differently shaped tensors
        array = np.empty(0, dtype=object)
    if array.dtype == object:
        raise QbenchError(f"output {name!r} is not a tensor or a sequence of maps ({type(value).__name__})")
    return array


def table_positions(values: np.ndarray, table: Sequence[Any], name: str) -> np.ndarray:
    """int64 (rows,): each string label's position in the output's class `table`; a value not in it is an error."""
    column = {str(key): index for index, key in enumerate(table)}
    flat = np.asarray(values).reshape(np.shape(values)[0] if np.ndim(values) else 0)
    unknown = next((value for value in flat if str(value) not in column), None)
    if unknown is not None:
        raise QbenchError(f"output {name!r} gave {unknown!r}, none of the classes its graph states "
                          f"({', '.join(map(str, table[:12]))}{', ...' if len(table) > 12 else ''})")  # fmt: skip
    return np.array([column[str(value)] for value in flat], dtype=np.int64)


# What to do with an output whose length depends on the data (NonMaxSuppression, NonZero, a data-dependent TopK).
VARIABLE_SHAPE = ("qbench compares outputs row by row and value by value, so an output whose length depends on the "
                  "data (detections kept by NonMaxSuppression, NonZero, Compress, a TopK whose K is computed) cannot "
                  "be judged: evaluate the tensors before that step (the raw boxes and scores: save the model with "
                  "them among its outputs and name them in model.outputs), or export a fixed number per row (the top "
                  "K, padded, with a count output)")


def row_count(feeds: Mapping[str, np.ndarray]) -> int:
    """The number of rows in `feeds`; every input must have the same number."""
    if not feeds:
        raise QbenchError("no model inputs to feed")
    counts = {name: int(np.shape(array)[0]) if np.ndim(array) else 0 for name, array in feeds.items()}
    if len(set(counts.values())) != 1:
        raise QbenchError(f"model inputs have different row counts: {counts}")
    return next(iter(counts.values()))


@contextlib.contextmanager
def batch_named(rows: int) -> Iterator[None]:
    """A runtime's error while running a batch of `rows` rows says the batch's size: a graph may run one row and
    refuse 16 (a shape written for batch 1), and the runtime's own message rarely says which batch it was fed.
    qbench's own errors and interruptions pass as they are; the runtime's error stays the cause (what
    qbench.errors.environment_cause and qbench.files.write_fault read)."""
    try:
        yield
    except QbenchError:
        raise
    except Exception as exc:  # noqa: BLE001 - any runtime's error: re-raised with the batch named
        plural = "" if rows == 1 else "s"
        raise QbenchError(f"a batch of {rows} row{plural} failed: {type(exc).__name__}: {' '.join(str(exc).split())}"
                          ) from exc  # fmt: skip


def run_outputs(
    runner: Runner,
    feeds: Mapping[str, np.ndarray],
    batch_size: int,
    outputs: Mapping[str, int],
    description: str = "evaluate",
    *,
    whole: bool = False,
    tables: Mapping[str, Sequence[Any]] | None = None,
) -> dict[str, np.ndarray]:
    """Every row through `runner` in batches of `batch_size`; output name -> its index's values, concatenated.

    whole: every batch must have `batch_size` rows (a model with a fixed batch): the last one is filled
    with repeats of its own rows, and what those give is dropped, so the outputs hold exactly the rows fed.
    tables: output name -> the class table its string labels are read through (table_positions)."""
    if batch_size <= 0:
        raise QbenchError(f"batch_size must be positive, got {batch_size}")
    rows = row_count(feeds)
    starts = range(0, rows, batch_size)
    gathered = {name: _Rows(rows) for name in outputs}
    batches = iter_batches(feeds, batch_size, whole=whole)
    for start, batch in track(zip(starts, batches), description, total=len(starts)):
        fed = row_count(batch)
        with batch_named(fed):
            results = runner.run(batch)
        for name, index in outputs.items():
            if not -len(results) <= index < len(results):
                raise QbenchError(f"output index {index} is out of range: the model has {len(results)} outputs")
            value = as_array(results[index], name)
            if value.ndim == 0 or value.shape[0] != fed:
                got = f"{value.shape[0]} row{'s' if value.shape[0] != 1 else ''}" if value.ndim else "a scalar"
                remedy = f"; {VARIABLE_SHAPE}" if value.ndim > 1 else ""  # rows of values: detections of the batch?
                raise QbenchError(f"output {name!r} gave {got} for a batch of {fed} input rows: qbench reads one "
                                  f"output row per input row (the first axis is the batch){remedy}")  # fmt: skip
            if tables and name in tables:
                value = table_positions(value, tables[name], name)
            gathered[name].put(start, value[: rows - start], name, widens=is_maps(results[index]))
    return {name: rows_of.array for name, rows_of in gathered.items()}


class _Rows:
    """One output's values for every row, written batch by batch into one array allocated at the first batch.

    Joining a list of batches at the end held both the list and the joined array (twice the output matrix:
    1.2 GB each at 300,000 rows x 1,000 classes); this holds the matrix once. A later batch of class maps that is
    wider (earlier batches lacked the top classes: zeros, the score of a class a map leaves out, fill the columns a
    batch lacks) or of a wider dtype widens the array, as joining them would have. A tensor's rows keep one shape:
    a width that changes with the data (TopK with a K computed from the scores, NonZero, Compress) filled with zeros
    would pass padding off as values (a box index 0, a score 0) and a missing detection as agreement."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.array = np.empty((0,), dtype=np.float32)  # no rows: no batch
        self._started = False

    def put(self, start: int, value: np.ndarray, name: str, *, widens: bool = False) -> None:
        """`value`'s rows from row `start`; widens: a batch of class maps, which may be narrower or wider."""
        if not self._started:
            self.array, self._started = np.empty((self.rows, *value.shape[1:]), dtype=value.dtype), True
        shape = self.array.shape[1:]
        if value.shape[1:] != shape and not (widens and value.ndim == 2 and len(shape) == 1):
            raise QbenchError(f"output {name!r} gave rows of shape {list(value.shape[1:])} in one batch and "
                              f"{list(shape)} in an earlier one: its "
                              f"rows must have one shape; {VARIABLE_SHAPE}")  # fmt: skip
        if value.ndim == 2 and value.shape[1] > shape[0]:
            shape = value.shape[1:]
        dtype = np.result_type(self.array.dtype, value.dtype)
        if shape != self.array.shape[1:] or dtype != self.array.dtype:
            wider = np.empty((self.rows, *shape), dtype=dtype)
            _write(wider, 0, self.array[:start])
            self.array = wider
        _write(self.array, start, value)


def _write(target: np.ndarray, start: int, value: np.ndarray) -> None:
    """`value` into `target`'s rows from `start`; a narrower 2-D value fills the columns it lacks with zeros."""
    rows = target[start : start + len(value)]
    if value.shape[1:] == target.shape[1:]:
        rows[...] = value
    else:
        rows[:, : value.shape[1]] = value
        rows[:, value.shape[1] :] = 0
