"""Fed cells replaced by what they give the model, so that digests of input cells (qbench.data.leakage) tell the rows
feeding the same input apart from those feeding another: image paths by their files' bytes (`image_content`), text
by the token ids its tokenizer feeds (`token_content`). Two paths to one file, or two spellings the tokenizer reads
alike, are one input: no more evidence for the gate, and a calibration row repeating an evaluation row either way."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from qbench.data.images import image_content
from qbench.data.text import token_content
from qbench.recipe_data import DataSpec


def content_table(
    table: pd.DataFrame, data: DataSpec, *, recipe_file: Path, rows: np.ndarray | None = None,
    unread: Mapping[str, bool] | None = None,
) -> pd.DataFrame:  # fmt: skip
    """`table` with its image and text input columns replaced by their content as fed (text of `rows` only, where
    given: tokenizing is the costly part), and the columns feeding `unread` model inputs (those whose values no output
    is computed from, each with whether its shape is: preflight_checks.unread_inputs) emptied, or replaced by each
    cell's shape where the shape is read: rows differing only there feed every output the same (an id column a
    pipeline's export keeps as an input and drops, or reads the batch size of), so they are one input; a shape read
    still tells cells of other lengths apart. Other columns as they are."""
    replaced = {**image_content(table, data, recipe_file=recipe_file),
                **token_content(table, data, recipe_file=recipe_file, rows=rows)}  # fmt: skip
    for column, target in data.inputs.items():
        if isinstance(target, str) and target in (unread or {}) and column in table.columns:
            cells = replaced.get(column, table[column])
            shapes = [str(np.shape(cell)) for cell in cells] if unread[target] else ""
            replaced[column] = pd.Series(shapes, index=table.index, dtype=object)
    return table.assign(**replaced) if replaced else table
