"""Fed cells replaced by what they give the model, so that digests of input cells (qbench.data.leakage) tell the rows
feeding the same input apart from those feeding another: image paths by the pixels their files decode to
(`image_content`), text by the token ids its tokenizer feeds (`token_content`), numbers as the model input's type takes
them (`as_fed`). Two paths to one file, two files of one image, two spellings the tokenizer reads alike, or two float64
values one float32 holds, are one input: no more evidence for the gate, and a calibration row repeating an evaluation
row either way."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from qbench.data.images import image_content
from qbench.data.text import token_content
from qbench.modelinfo.signature import TensorMeta
from qbench.recipe.data import DataSpec


def content_table(
    table: pd.DataFrame, data: DataSpec, *, recipe_file: Path, rows: np.ndarray | None = None,
    unread: Mapping[str, bool] | None = None, dtypes: Mapping[str, np.dtype] | None = None,
) -> pd.DataFrame:  # fmt: skip
    """`table` with its image and text input columns replaced by their content as fed (of `rows` only, where given:
    decoding and tokenizing are the costly part), and the columns feeding `unread` model inputs (those whose values no
    output is computed from, each with whether its shape is: preflight_checks.unread_inputs) emptied, or replaced by
    each cell's shape where the shape is read: rows differing only there feed every output the same (an id column a
    pipeline's export keeps as an input and drops, or reads the batch size of), so they are one input; a shape read
    still tells cells of other lengths apart. A column of numbers feeding a model input of `dtypes` (model input ->
    the numeric type it is fed as: `numeric_dtypes`) is cast to it, as the feed casts it (as_fed; a column of arrays
    on `rows` only, where given). Other columns as they are."""
    replaced = {**image_content(table, data, recipe_file=recipe_file, rows=rows),
                **token_content(table, data, recipe_file=recipe_file, rows=rows)}  # fmt: skip
    for column, target in data.inputs.items():
        if isinstance(target, str) and target in (unread or {}) and column in table.columns:
            cells = replaced.get(column, table[column])
            shapes = [str(np.shape(cell)) for cell in cells] if unread[target] else ""
            replaced[column] = pd.Series(shapes, index=table.index, dtype=object)
        elif isinstance(target, str) and target in (dtypes or {}) and column in table.columns:
            fed = as_fed(table[column], (dtypes or {})[target], rows)
            if fed is not None:
                replaced[column] = fed
    return table.assign(**replaced) if replaced else table


def numeric_dtypes(types: Mapping[str, Any]) -> dict[str, np.dtype]:
    """Model input -> its numpy type, for the inputs of `types` (name -> a TensorMeta, a numpy type or its name: a
    PyTorch source's model.input_dtypes) fed numbers: bool, integers, float16/32/64. A type numpy does not name
    (bfloat16) or a string input is left out, and its column digested as written."""
    found = {}
    for name, given in types.items():
        try:
            dtype = np.dtype(given.dtype if isinstance(given, TensorMeta) else given)
        except TypeError:
            continue
        if dtype.kind in "biuf":
            found[name] = dtype
    return found


def as_fed(cells: pd.Series, dtype: np.dtype, rows: np.ndarray | None = None) -> pd.Series | None:
    """`cells` cast to `dtype` as a model input of that type is fed them (qbench.data.feed_cast): a float64 table's
    values differing below float32's precision (0.1 + 0.2 and 0.3; a record written by two pipelines) or ids past 2**24
    fed to a float32 input give the model one input, and a digest of the cells as written counted them apart (600
    rows of 100 inputs so written resolved a tolerance 100 inputs do not). A column of arrays (feature rows) is cast
    on `rows` alone where given (the rows digested: a copy of every row's array would double a large table), the
    others kept as written. None for cells that are no numbers, or arrays of more than one shape: the feed refuses
    them or reads them as it does, and they are digested as written. Values the feed refuses (a fraction fed to an
    integer input) are refused there, whatever their digest."""
    values = cells.to_numpy()
    if values.dtype.kind in "biuf":
        with np.errstate(all="ignore"):  # NaN cast to an integer input: refused by the feed, not here
            return pd.Series(values.astype(dtype), index=cells.index)
    positions = np.arange(len(values)) if rows is None else np.asarray(rows, dtype=np.int64)
    arrays = [np.asarray(values[position]) for position in positions]
    if not arrays or len({(array.shape, array.dtype.kind in "biuf") for array in arrays}) != 1:
        return None
    if arrays[0].dtype.kind not in "biuf":
        return None
    with np.errstate(all="ignore"):
        cast = np.stack(arrays).astype(dtype)
    fed = values.copy()
    for position, array in zip(positions, cast, strict=True):
        fed[position] = array
    return pd.Series(fed, index=cells.index, dtype=object)
