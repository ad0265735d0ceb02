"""perf_analyzer's `--input-data` file: the recipe's first evaluation rows, as the sweep fed them to the model.

Without it perf_analyzer fills every non-string input with random bytes: an int64 token id of random bytes
indexes far past any embedding table (ONNX Runtime refuses the request: every request of the benchmark fails),
and random float bytes hold NaN, inf and denormals that no production row holds (denormals slow a CPU's
arithmetic down). qbench times a rotation of batches drawn from every evaluation row
(qbench.validate.latency.timed_batches); the file holds the first evaluation rows, each with its shape (which
makes `--shape` unnecessary for dynamic dimensions). Text padded `longest` is padded to those rows' longest, so
that Triton can batch them (qbench times each batch at its own longest row).

perf_analyzer's format: {"data": [step, ...]}, a step being input name -> {"content": ..., "shape": [...]}.
A batched request of `-b n` takes n consecutive steps, so for a model Triton batches a step is one row (its
shape without the batch dimension; a row of a batch-only input is `[1]`, as config.pbtxt's dims say); for a
fixed-batch model it is one whole batch. Numbers are written as base64 of their little-endian bytes (exact for
every type, float16 and bool included); strings as a list of strings.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from qbench.modelinfo import ModelInfo
from qbench.recipe import Recipe

# rows written for a model Triton batches: larger batches cycle through them
MAX_ROWS = 64


def _content(values: np.ndarray) -> dict[str, Any]:
    """One step's tensor in perf_analyzer's JSON form."""
    shape = list(values.shape) or [1]  # a batch-only input's row: config.pbtxt's dims [1]
    if values.dtype == np.dtype(object):
        return {"content": [str(v) for v in values.ravel()], "shape": shape}
    raw = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<")).tobytes()
    return {"content": {"b64": base64.b64encode(raw).decode("ascii")}, "shape": shape}


def input_data_steps(feeds: Mapping[str, np.ndarray], *, fixed_batch: int | None) -> list[dict[str, Any]]:
    """perf_analyzer steps from model-ready `feeds` (input name -> rows on axis 0): one row per step, or with a
    `fixed_batch` one step of that many rows (fewer rows are repeated from the top, as qbench's batches are)."""
    if fixed_batch is not None:
        picks = np.arange(fixed_batch) % len(next(iter(feeds.values())))
        return [{name: _content(np.take(array, picks, axis=0)) for name, array in feeds.items()}]
    rows = min(MAX_ROWS, len(next(iter(feeds.values()))))
    return [{name: _content(array[row]) for name, array in feeds.items()} for row in range(rows)]


def evaluation_feeds(recipe: Recipe, info: ModelInfo, rows: int) -> dict[str, np.ndarray]:
    """The first `rows` evaluation rows of the recipe's data as the sweep feeds them to a model with `info`'s
    inputs (the variant's: an input the FP32 model only lists with a default is a constant there)."""
    from qbench.data import build_feeds, evaluation_rows, load_data_table
    from qbench.tasks import get_task

    table = load_data_table(recipe.data_path, recipe.data, label_names=get_task(recipe.task).labels_name_classes,
                            recipe_file=recipe.source, model_inputs=info.inputs)  # fmt: skip
    positions = evaluation_rows(table, recipe.data, recipe_file=recipe.source,
                                calibrated=recipe.fits_on_calibration_rows).rows[:rows]
    return build_feeds(table, positions, recipe.data.inputs, info.inputs, recipe_file=recipe.source)


def write_input_data(path: Path, recipe: Recipe, info: ModelInfo, *, fixed_batch: int | None) -> Path:
    """Write the `--input-data` file for the model with `info` at `path`."""
    feeds = evaluation_feeds(recipe, info, fixed_batch or MAX_ROWS)
    path.write_text(json.dumps({"data": input_data_steps(feeds, fixed_batch=fixed_batch)}), encoding="utf-8")
    return path
