"""Model inputs that take one value per call, beside inputs that take the rows.

An input declared `[1]` while another input leaves its axis 0 dynamic for the rows (a temperature, a sequence
length, an optimum merged decoder's `use_cache_branch` flag) holds one value for the whole call: ONNX Runtime
refuses it a batch of 64 values ("Got: 64 Expected: 1"), and such a model ran one row at a time or not at all. qbench
feeds it from a column like any input, one value per row, which keeps every row-indexed path (batches, subsets,
repeats) as it is, and each call then feeds it its rows' one value (`fed_per_call`); rows of one call holding
different values are refused (`per_call_value`), as no call can give two rows two values (batch sizes of 1 can).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from qbench.errors import QbenchError


def per_call_inputs(shapes: Mapping[str, Sequence[object]]) -> frozenset[str]:
    """The inputs of shape [1] beside an input whose axis 0 is dynamic; `shapes`: input name -> its dims, an int for a
    static one (ModelInfo's None, or ONNX Runtime's dim name or None, for a dynamic one)."""
    if not any(dims and not isinstance(dims[0], int) for dims in shapes.values()):
        return frozenset()
    return frozenset(name for name, dims in shapes.items() if list(dims) == [1])


def session_per_call_inputs(session: object) -> frozenset[str]:
    """`per_call_inputs` of an ONNX Runtime session's inputs."""
    return per_call_inputs({value.name: value.shape for value in session.get_inputs()})  # type: ignore[attr-defined]


def per_call_value(name: str, values: np.ndarray) -> np.ndarray:
    """The one value per-call input `name` is fed, shape [1], from its rows' values; QbenchError where they differ."""
    array = np.asarray(values)
    if len(array) > 1 and not _all_alike(array):
        distinct = np.unique(array)
        shown = ", ".join(map(str, distinct[:3])) + (", ..." if len(distinct) > 3 else "")
        raise QbenchError(f"model input {name!r} [1] takes one value per call beside inputs with a dynamic batch, but "
                          f"the {len(array)} rows of this call hold {len(distinct)} different values ({shown}); "
                          "expected one value in every row, or batches of one row (latency.batch_sizes: [1], "
                          "data.evaluation.batch_size: 1 and data.calibration.batch_size: 1)")  # fmt: skip
    return array[:1]


def fed_per_call(feeds: Mapping[str, np.ndarray], names: Collection[str]) -> Mapping[str, np.ndarray]:
    """`feeds` for one call: each of `names` (`per_call_inputs`) fed its rows' one value; `feeds` itself without any."""
    if not names:
        return feeds
    return {name: per_call_value(name, values) if name in names else values for name, values in feeds.items()}


def _all_alike(array: np.ndarray) -> bool:
    """Whether every row holds the first row's value, NaN alike with NaN (a column kept with NaN: nonfinite_inputs)."""
    alike = array == array[0]
    if array.dtype.kind in "fc":
        alike |= np.isnan(array) & np.isnan(array[0])
    return bool(np.all(alike))
