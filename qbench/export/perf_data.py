"""perf_analyzer's `--input-data` file: a seeded sample of the recipe's evaluation rows, as the sweep fed them to the
model.

Without it perf_analyzer fills every non-string input with random bytes: an int64 token id of random bytes
indexes far past any embedding table (ONNX Runtime refuses the request: every request of the benchmark fails),
and random float bytes hold NaN, inf and denormals that no production row holds (denormals slow a CPU's
arithmetic down). qbench times a rotation of batches drawn from every evaluation row
(qbench.validate.latency.timed_batches); the file holds a seeded sample of them (`sample_rows`), each with its
shape (which makes `--shape` unnecessary for dynamic dimensions). The first rows of a table are often one kind of
row (sorted by date, by class, by length), so the sample is drawn across all evaluation rows, each combination of
slices getting its share (every slice shows up in the traffic). Text is tokenized as the recipe pads it, over the
sample: `longest` pads to the sample's longest row, so that Triton can batch them (qbench times each batch at its
own longest row). Which rows were written is recorded beside the file (`write_input_data`).

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

from qbench.data.sampling import allocate_proportionally
from qbench.modelinfo.signature import ModelInfo
from qbench.recipe.spec import Recipe

# rows written for a model Triton batches: larger batches cycle through them
MAX_ROWS = 64
SAMPLE_SEED = 0


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


def sample_rows(rows: np.ndarray, slices: Mapping[str, np.ndarray], count: int, seed: int = SAMPLE_SEED) -> np.ndarray:
    """`count` of the evaluation `rows` (table positions, in evaluation order; all of them when fewer), drawn with
    `seed`, kept in evaluation order. With `slices` (name -> mask over `rows`), the rows are grouped by which slices
    they belong to and each group gets a share in proportion to its size, at least one row when `count` allows."""
    rows = np.asarray(rows, dtype=np.int64)
    if count >= len(rows):
        return rows
    masks = np.array([np.asarray(mask, dtype=bool) for mask in slices.values()]).reshape(len(slices), len(rows))
    _, group = np.unique(masks.T, axis=0, return_inverse=True)
    members = [np.flatnonzero(group.ravel() == g) for g in range(int(group.max()) + 1)]
    quotas = allocate_proportionally(np.array([len(m) for m in members]), count)
    rng = np.random.default_rng(seed)
    picked = [rng.choice(m, size=q, replace=False) for m, q in zip(members, quotas, strict=True) if q]
    return rows[np.sort(np.concatenate(picked))]


def evaluation_feeds(recipe: Recipe, info: ModelInfo, rows: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A sample of `rows` evaluation rows of the recipe's data (`sample_rows`) as the sweep feeds them to a model
    with `info`'s inputs (the variant's: an input the FP32 model only lists with a default is a constant there),
    and what was drawn: the table positions, the seed, the evaluation rows and the sampled rows per slice."""
    from qbench.data import build_feeds, evaluation_rows, load_data_table
    from qbench.tasks import get_task

    table = load_data_table(recipe.data_path, recipe.data, label_names=get_task(recipe.task).labels_name_classes,
                            recipe_file=recipe.source, model_inputs=info.inputs)  # fmt: skip
    evaluation = evaluation_rows(table, recipe.data, recipe_file=recipe.source,
                                 calibrated=recipe.fits_on_calibration_rows)  # fmt: skip
    positions = sample_rows(evaluation.rows, evaluation.slices, rows)
    drawn = {"seed": SAMPLE_SEED, "evaluation_rows": len(evaluation.rows), "rows": positions.tolist(),
             "slices": {name: int(mask[positions].sum()) for name, mask in evaluation.masks.items()}}  # fmt: skip
    return build_feeds(table, positions, recipe.data.inputs, info.inputs, recipe_file=recipe.source), drawn


def write_input_data(path: Path, recipe: Recipe, info: ModelInfo, *, fixed_batch: int | None) -> Path:
    """Write the `--input-data` file for the model with `info` at `path`, and beside it (`rows_file`) which rows of
    the data table it holds."""
    feeds, drawn = evaluation_feeds(recipe, info, fixed_batch or MAX_ROWS)
    path.write_text(json.dumps({"data": input_data_steps(feeds, fixed_batch=fixed_batch)}), encoding="utf-8")
    rows_file(path).write_text(json.dumps(drawn, indent=1) + "\n", encoding="utf-8")
    return path


def rows_file(path: Path) -> Path:
    """Where the rows written to the input data file at `path` are recorded."""
    return path.with_name(f"{path.stem}.rows.json")
