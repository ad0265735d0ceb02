"""Fed cells replaced by what they give the model, so that digests of input cells (qbench.data.leakage) tell the rows
feeding the same input apart from those feeding another: image paths by their files' bytes (`image_content`), text
by the token ids its tokenizer feeds (`token_content`). Two paths to one file, or two spellings the tokenizer reads
alike, are one input: no more evidence for the gate, and a calibration row repeating an evaluation row either way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from qbench.data.images import image_content
from qbench.data.text import token_content
from qbench.recipe_data import DataSpec


def content_table(
    table: pd.DataFrame, data: DataSpec, *, recipe_file: Path, rows: np.ndarray | None = None
) -> pd.DataFrame:
    """`table` with its image and text input columns replaced by their content as fed (text of `rows` only, where
    given: tokenizing is the costly part); other columns as they are."""
    replaced = {**image_content(table, data, recipe_file=recipe_file),
                **token_content(table, data, recipe_file=recipe_file, rows=rows)}  # fmt: skip
    return table.assign(**replaced) if replaced else table
