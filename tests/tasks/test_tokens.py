"""Token classification: (rows, tokens, classes) scores, one label per token (-100 not scored), metrics per token."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.cli.app import main
from qbench.gate.evaluate import evaluate_gate
from qbench.modelinfo.signature import TensorMeta
from qbench.recipe.spec import load_recipe
from qbench.tasks import LabelError, get_task
from qbench.validate import metrics
from qbench.validate.accuracy import evaluate_accuracy
from qbench.validate.catalogue import METRICS, impossible_value
from tests.tasks.task_projects import graph_model, plain_ort, project, run_all, said

TOKENS, CLASSES, VOCAB, ROWS = 6, 3, 20, 60
LOGITS = TensorMeta("logits", np.dtype("float32"), (None, TOKENS, CLASSES))

# two rows of three tokens, three classes; the last token of each row is not scored
OUTPUTS = np.array([[[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [5.0, 0.0, 0.0]],
                    [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 9.0, 0.0]]])  # fmt: skip
REFERENCE = np.array([[[2.0, 1.0, 0.0], [0.0, 1.0, 3.0], [0.0, 5.0, 0.0]],
                      [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 9.0]]])  # fmt: skip
LABELS = np.array([[0, 1, -100], [1, 0, -100]])


def test_scored_token_scores_are_the_rows_of_the_row_level_metrics() -> None:
    scored = metrics.scored_tokens(LABELS)
    assert scored.tolist() == [[True, True, False], [True, True, False]]
    assert metrics.token_scores(OUTPUTS, scored).tolist() == [[2, 1, 0], [0, 3, 1], [0, 0, 1], [1, 0, 0]]
    with pytest.raises(Exception, match="rows, tokens, classes"):
        metrics.token_scores(OUTPUTS[0], scored)


def test_metrics_are_per_scored_token_by_hand() -> None:
    summary = get_task("classification").rows(OUTPUTS, REFERENCE, LABELS)
    # scored tokens, variant top-1: 0, 1 | 2, 0; FP32 top-1: 0, 2 | 2, 0; labels: 0, 1 | 1, 0
    overall = summary.summarise("overall", np.array([True, True]))
    assert overall.size == 2 and overall.denominators == dict.fromkeys(overall.metrics, 4)
    assert overall.metrics["accuracy"] == 3 / 4  # the unscored tokens (top-1 0 vs label -100 / FP32 1, 2) count nowhere
    assert overall.metrics["agreement"] == 3 / 4 and overall.metrics["flip_rate"] == 1 / 4
    # only the second token of row 0 differs: softmax([0, 1, 3]) vs softmax([0, 3, 1]); its KL over 4 tokens
    p, q = metrics.softmax(np.array([0.0, 1.0, 3.0])), metrics.softmax(np.array([0.0, 3.0, 1.0]))
    assert overall.metrics["kl_mean"] == pytest.approx(float(np.sum(p * np.log(p / q))) / 4)
    assert overall.metrics["max_abs_error"] == 2.0  # the unscored tokens' difference of 5 and 9 is left out
    second = summary.summarise("second", np.array([False, True]))
    assert second.size == 1 and second.denominators["accuracy"] == 2
    assert second.metrics["accuracy"] == 1 / 2 and second.metrics["agreement"] == 1.0
    assert second.metrics["kl_mean"] == 0.0 and second.metrics["max_abs_error"] == 0.0
    unscored = get_task("classification").rows(OUTPUTS, REFERENCE, np.full((2, 3), -100)).summarise("none", np.array([True, True]))
    assert unscored.denominators["accuracy"] == 0 and all(np.isnan(v) for v in unscored.metrics.values())


def test_results_record_what_token_rates_count_over_and_a_rate_of_tokens_passes_the_row_check() -> None:
    result = evaluate_accuracy("classification", {"logits": OUTPUTS, "other": OUTPUTS}, {"logits": REFERENCE,
                               "other": REFERENCE}, LABELS, {"first": np.array([True, False])})  # fmt: skip
    first = result.slice("first")
    assert first is not None and first.size == 1 and first.denominators["logits/accuracy"] == 2
    # 3/4 of a two-row scope is no whole number of rows, but is 3 of its 4 scored tokens
    info = METRICS["accuracy"]
    assert impossible_value(info, 0.75, 2) is not None
    assert impossible_value(info, 0.75, 4, "scored items") is None
    assert "of the scope's 4 scored items" in str(impossible_value(info, 0.7, 4, "scored items"))


def test_token_labels_are_read_as_one_list_per_row() -> None:
    task = get_task("classification")
    rows = np.array([3, 8])
    labels = task.labels_from_values([[0, 2, -100], np.array([1, 1, -100])], rows)
    assert labels.tolist() == [[0, 2, -100], [1, 1, -100]]
    three = np.array([3, 8, 9])
    with pytest.raises(LabelError, match=r"row 3 has 2 token labels, the other rows mostly 3"):
        task.labels_from_values([[0, 2], [0, 2, -100], [1, 1, -100]], three)
    with pytest.raises(LabelError, match=r"row 8 holds token label -1: expected class ids >= 0, or -100"):
        task.labels_from_values([[0, 2, -100], [1, -1, 0]], rows)
    with pytest.raises(LabelError, match=r"row 8 holds token label 'B-PER'"):
        task.labels_from_values([[0, 2, -100], [1, "B-PER", 0]], rows)
    # a parquet list column's null element reads as NaN in a float array: said as missing, numbers as written
    with pytest.raises(LabelError, match=r"row 8 holds a missing token label: expected integer class ids"):
        task.labels_from_values([np.array([0.0, 2.0, -100.0]), np.array([1.0, np.nan, 0.0])], rows)
    with pytest.raises(LabelError, match=r"row 3 holds token label 2\.5: expected integer class ids"):
        task.labels_from_values([np.array([0.0, 2.5, -100.0]), np.array([1.0, 1.0, 0.0])], rows)


def test_token_labels_are_checked_against_the_output() -> None:
    task = get_task("classification")
    rows = np.array([4, 9])
    with pytest.raises(LabelError, match=r"row 4 has 5 token labels, output 'logits' has 6 tokens per row"):
        task.check_labels(np.zeros((2, 5), dtype=np.int64), LOGITS, rows)
    with pytest.raises(LabelError, match=r"row 9 holds token label 3, outside 0..2"):
        task.check_labels(np.array([[0] * 6, [0, 3, 0, 0, 0, -100]]), LOGITS, rows)
    with pytest.raises(LabelError, match="one class id per row, but output 'logits'"):
        task.check_labels(np.array([0, 1]), LOGITS, rows)
    scores = TensorMeta("scores", np.dtype("float32"), (None, CLASSES))
    with pytest.raises(LabelError, match="not \\(rows, tokens, classes\\)"):
        task.check_labels(np.zeros((2, 6), dtype=np.int64), scores, rows)


def test_a_per_token_output_needs_token_labels() -> None:
    task = get_task("classification")
    assert task.output_problem(LOGITS) is None
    assert "token classification" in str(task.labels_needed(LOGITS))
    assert task.labels_needed(TensorMeta("scores", np.dtype("float32"), (None, 1, CLASSES))) is None
    four = TensorMeta("masks", np.dtype("float32"), (None, 2, 4, 4))
    assert "not supported" in str(task.output_problem(four))


def test_scores_per_row_are_chosen_over_scores_per_token_beside_them() -> None:
    """A sequence classifier exporting its logits (rows, classes) and its hidden states (rows, tokens, dim): the
    task picks the logits (before, both ranked alike and the model was refused as ambiguous); per-token scores are
    chosen on their own, or when named."""
    from qbench.modelinfo.signature import ModelInfo
    from qbench.tasks.selection import choose_outputs

    task = get_task("classification")
    logits = TensorMeta("logits", np.dtype("float32"), (None, CLASSES))
    hidden = TensorMeta("hidden", np.dtype("float32"), (None, TOKENS, 8))
    both = ModelInfo(inputs={}, outputs={"hidden": hidden, "logits": logits}, opset=17)
    assert [c.name for c in choose_outputs(task, both, None)] == ["logits"]
    assert [c.name for c in choose_outputs(task, both, ["hidden"])] == ["hidden"]
    alone = ModelInfo(inputs={}, outputs={"logits": LOGITS}, opset=17)
    assert [c.name for c in choose_outputs(task, alone, None)] == ["logits"]


def test_the_labels_pass_over_the_outputs_they_cannot_score() -> None:
    """Token labels pick the per-token logits over a (rows, dim) CLS embedding beside them, which ranks above them
    without labels (before, the embedding was picked and the token labels refused for it); labels per row keep the
    (rows, classes) logits even when their hidden states come first; labels no output fits leave the ranking alone."""
    from qbench.modelinfo.signature import ModelInfo
    from qbench.tasks.selection import choose_outputs

    task = get_task("classification")
    cls = TensorMeta("cls", np.dtype("float32"), (None, 8))
    token_model = ModelInfo(inputs={}, outputs={"cls": cls, "logits": LOGITS}, opset=17)
    token_labels = [np.array([0, 1, 2, 0, 1, -100]), [1, 1, 0, 0, 2, -100]]
    assert [c.name for c in choose_outputs(task, token_model, None)] == ["cls"]
    assert [c.name for c in choose_outputs(task, token_model, None, token_labels)] == ["logits"]
    assert [c.name for c in choose_outputs(task, token_model, ["cls"], token_labels)] == ["cls"]  # named: as named
    assert [c.name for c in choose_outputs(task, token_model, None, [0, 2])] == ["cls"]
    hidden = TensorMeta("hidden", np.dtype("float32"), (None, TOKENS, 8))
    row_model = ModelInfo(inputs={}, outputs={"hidden": hidden, "cls": cls}, opset=17)
    assert [c.name for c in choose_outputs(task, row_model, None, [0, 2])] == ["cls"]
    alone = ModelInfo(inputs={}, outputs={"cls": cls}, opset=17)
    assert [c.name for c in choose_outputs(task, alone, None, token_labels)] == ["cls"]


# -- end to end --------------------------------------------------------------------------------


def _token_project(root: Path, pooled: bool = False, step: bool = False,
                   **recipe: object) -> tuple[Path, np.ndarray, np.ndarray]:  # fmt: skip
    """Gather(embedding, ids[batch, 6]) -> MatMul -> logits [batch, 6, 3]; classes 0 and 1 nearly tie, so INT8 turns
    some tokens. Labels: FP32's top-1 with a fifth of the tokens moved to the next class, the last token -100.
    `pooled`: a first output `pooled` [batch, 8] too, the embeddings' mean over the tokens. `step`: a decoder step
    as optimum exports one for use with a cache, one new token per row on token axes the graph leaves symbolic
    (ids ['batch', 'new_tokens'], logits ['batch', 'step', 3]), that token scored."""
    import pandas as pd

    rng = np.random.default_rng(0)
    embedding = rng.normal(size=(VOCAB, 8)).astype(np.float32)
    weights = rng.normal(size=(8, CLASSES)).astype(np.float32)
    weights[:, 1] = weights[:, 0] + rng.normal(scale=0.02, size=8).astype(np.float32)
    tokens = 1 if step else TOKENS
    ids_info = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "new_tokens" if step else TOKENS])
    logits_info = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "step" if step else TOKENS,
                                                                              CLASSES])  # fmt: skip
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h"]), helper.make_node("MatMul", ["h", "w"], ["logits"])]
    outputs = [logits_info]
    if pooled:
        nodes.append(helper.make_node("ReduceMean", ["h"], ["pooled"], axes=[1], keepdims=0))
        outputs.insert(0, helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 8]))
    model = graph_model(
        nodes, [ids_info], outputs, [numpy_helper.from_array(embedding, "emb"), numpy_helper.from_array(weights, "w")]
    )
    ids = rng.integers(0, VOCAB, size=(ROWS, tokens))
    labels = np.argmax(embedding[ids] @ weights, axis=-1)
    moved = rng.random(labels.shape) < 0.2
    labels[moved] = (labels[moved] + 1) % CLASSES
    if not step:
        labels[:, -1] = -100
    table = pd.DataFrame({"x": list(ids), "y": list(labels), "half": np.where(np.arange(ROWS) < 20, "few", "many")})
    return project(root, model, table, task="classification", **recipe), ids, labels


def test_token_classification_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe, ids, labels = _token_project(tmp_path, gate={"metric": "accuracy", "max_drop": 0.5, "max_slice_drop": 0.5})
    results, output = run_all(recipe, capsys)
    assert said("gate: PASS", output)
    scored = labels != -100
    fp32 = plain_ort(tmp_path / "model.onnx", {"ids": ids})["logits"]
    fp32_result = results.find("fp32", "onnxruntime-cpu")
    int8_result = results.find("int8", "onnxruntime-cpu")
    assert fp32_result is not None and fp32_result.accuracy is not None
    assert int8_result is not None and int8_result.accuracy is not None and int8_result.model_path
    assert fp32_result.accuracy.overall.metrics["accuracy"] == pytest.approx(np.mean(fp32.argmax(-1)[scored] == labels[scored]))
    int8 = plain_ort(Path(int8_result.model_path), {"ids": ids})["logits"]
    agree = int8.argmax(-1)[scored] == fp32.argmax(-1)[scored]
    assert 0 < np.mean(agree) < 1  # the near-tie turns some tokens: the figure is not a default 1.0
    assert int8_result.accuracy.overall.metrics["agreement"] == pytest.approx(np.mean(agree))
    few = np.zeros(ROWS, dtype=bool)
    few[:20] = True
    few_scope = int8_result.accuracy.slice("half=few")
    assert few_scope is not None and few_scope.size == 20 and few_scope.denominators["agreement"] == 20 * (TOKENS - 1)
    few_agree = int8.argmax(-1)[few][scored[few]] == fp32.argmax(-1)[few][scored[few]]
    assert few_scope.metrics["agreement"] == pytest.approx(np.mean(few_agree))

    # a slice breach: allowed flip rate between the two slices' (overall loose)
    slices = {s.name: s.drops["flip_rate"] for s in int8_result.accuracy.slices}
    assert slices["half=few"] != slices["half=many"]
    worse = max(slices, key=slices.__getitem__)
    threshold = (slices["half=few"] + slices["half=many"]) / 2
    spec = load_recipe(recipe).gate.model_copy(update={"metric": "flip_rate", "max_drop": 1.0,
                                                       "max_slice_drop": threshold})  # fmt: skip
    verdict = evaluate_gate(results, spec)
    assert not verdict.problems
    assert [(b.variant, b.scope) for b in verdict.breaches] == [("int8", worse)]


def _assert_fp32_token_accuracy(recipe: Path, root: Path, ids: np.ndarray, labels: np.ndarray,
                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Sweep and gate `recipe`; FP32's token accuracy is the model's own over the scored tokens, counted over them."""
    results, _ = run_all(recipe, capsys)
    fp32_result = results.find("fp32", "onnxruntime-cpu")
    assert fp32_result is not None and fp32_result.accuracy is not None
    fp32 = plain_ort(root / "model.onnx", {"ids": ids})["logits"]
    scored = labels != -100
    assert fp32_result.accuracy.overall.metrics["accuracy"] == pytest.approx(np.mean(fp32.argmax(-1)[scored] == labels[scored]))
    assert fp32_result.accuracy.overall.denominators["accuracy"] == ROWS * (TOKENS - 1)


def test_token_labels_evaluate_the_per_token_output_beside_a_pooled_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe, ids, labels = _token_project(tmp_path, pooled=True, gate={"metric": "accuracy", "max_drop": 0.5,
                                         "max_slice_drop": 0.5})  # fmt: skip
    _assert_fp32_token_accuracy(recipe, tmp_path, ids, labels, capsys)


def test_a_decoder_steps_one_new_token_takes_the_token_labels_its_graph_asks_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Logits ['batch', 'step', classes], 1 at run time (optimum's decoder_with_past_model.onnx): the graph's shape
    asks for a list of token labels per row, and the check against FP32's run then refused those same lists as 'not
    (rows, tokens, classes): expected one class id per row' (exit 2 whatever the labels). They are scored per token."""
    import pandas as pd

    recipe, ids, labels = _token_project(tmp_path, step=True, gate={"metric": "accuracy", "max_drop": 0.5,
                                         "max_slice_drop": 0.5})  # fmt: skip
    results, _ = run_all(recipe, capsys)
    fp32_result = results.find("fp32", "onnxruntime-cpu")
    assert fp32_result is not None and fp32_result.accuracy is not None
    fp32 = plain_ort(tmp_path / "model.onnx", {"ids": ids})["logits"]
    assert fp32.shape == (ROWS, 1, CLASSES)
    assert fp32_result.accuracy.overall.metrics["accuracy"] == pytest.approx(np.mean(fp32.argmax(-1) == labels))
    int8_result = results.find("int8", "onnxruntime-cpu")
    assert int8_result is not None and int8_result.accuracy is not None and int8_result.model_path
    int8 = plain_ort(Path(int8_result.model_path), {"ids": ids})["logits"]
    agreement = int8_result.accuracy.overall.metrics["agreement"]
    assert agreement == pytest.approx(np.mean(int8.argmax(-1) == fp32.argmax(-1)))
    table = pd.read_parquet(tmp_path / "data.parquet")
    table["y"] = [int(cell[0]) for cell in table["y"]]
    table.to_parquet(tmp_path / "data.parquet")
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert said("hold one class id per row, but output 'logits' of shape [None, None, 3] scores every token", err), err


def test_token_labels_in_a_csv_file_are_json_lists_as_the_inputs_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CSV label cell '[1, 0, 2, 1, 0, -100]' was kept as text (the label column may name classes) and refused as
    'not integer class ids'; it is read as the list it writes, as the input column's cells are."""
    import json

    import pandas as pd

    recipe, ids, labels = _token_project(tmp_path, gate={"metric": "accuracy", "max_drop": 0.5, "max_slice_drop": 0.5})
    table = pd.read_parquet(tmp_path / "data.parquet")
    for column in ("x", "y"):
        table[column] = [json.dumps([int(v) for v in cell]) for cell in table[column]]
    table.to_csv(tmp_path / "data.csv", index=False)
    recipe.write_text(recipe.read_text().replace("data.parquet", "data.csv"))
    _assert_fp32_token_accuracy(recipe, tmp_path, ids, labels, capsys)


def test_a_recipe_without_token_labels_is_refused_naming_data_label(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    recipe, _, _ = _token_project(tmp_path)
    body = recipe.read_text().replace("  label: y\n", "")
    assert body != recipe.read_text()
    recipe.write_text(body)
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert said("data.label: output 'logits' of shape [None, 6, 3] is read as class scores per token", err), err


@pytest.mark.parametrize(
    ("row_labels", "message"),
    [([0, 1, 2, 0, -100], "row 7 has 5 token labels, the other rows mostly 6"),
     ([0, 5, 1, 0, 0, -100], "row 7 holds token label 5, outside 0..2 (output 'logits' has 3 classes)")],
)  # fmt: skip
def test_a_bad_row_of_token_labels_is_one_data_label_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], row_labels: list[int], message: str
) -> None:
    import pandas as pd

    recipe, _, _ = _token_project(tmp_path)
    table = pd.read_parquet(tmp_path / "data.parquet")
    table["y"] = [list(v) for v in table["y"]]
    table.at[7, "y"] = row_labels
    table.to_parquet(tmp_path / "data.parquet")
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert said(f"data.label: column 'y': {message}", err), err
    assert len([line for line in err.splitlines() if line.startswith("error")]) == 1, err


def test_an_edited_token_count_is_caught_by_the_gate_against_fp32() -> None:
    from qbench.gate.checks import _denominator_problems
    from qbench.results.schema import SliceMetrics

    fp32 = SliceMetrics("overall", 2, {"accuracy": 0.75}, denominators={"accuracy": 4})
    edited = dataclasses.replace(fp32, metrics={"accuracy": 0.7}, denominators={"accuracy": 10})
    assert any("FP32's over" in p for p in _denominator_problems(edited, fp32))
    assert _denominator_problems(fp32, fp32) == []
    assert any("not a metric of this scope" in p for p in _denominator_problems(
        dataclasses.replace(fp32, denominators={"kl_mean": 4}), None))  # fmt: skip


def test_tokens_fp32_gives_nan_on_are_misses_for_the_variant_against_the_labels_too() -> None:
    """A token FP32 scores NaN: the variant's finite, correct top-1 there earned it accuracy FP32 cannot have."""
    reference = np.array([[[3.0, 0.0], [np.nan, np.nan]]])
    outputs = np.array([[[3.0, 0.0], [3.0, 0.0]]])
    labels = np.array([[0, 0]])
    overall = get_task("classification").rows(outputs, reference, labels).summarise("overall", np.array([True]))
    assert overall.metrics["accuracy"] == 1 / 2 and overall.metrics["agreement"] == 1 / 2


@pytest.mark.parametrize(
    "values",
    [[1, 2], [1.0, float("nan")], ["a", None], [True, False], [], [None, None], [[1], 2], [1, (1,)], ["a", [1]],
     [np.array([1]), 1], [1, "a", 2.5], np.array([1, 2]), np.array([[1], [2]], dtype=object)[:, 0]],
)
def test_any_token_list_answers_as_looking_at_every_cell(values) -> None:
    from qbench.tasks.tokens import any_token_list, is_token_list

    assert any_token_list(values) == any(is_token_list(v) for v in values)


@pytest.mark.parametrize("side", ["fp32", "variant"])
def test_nan_on_an_unscored_token_is_read_by_no_metric_nor_counted(side: str) -> None:
    """A NaN/inf score on a token labelled -100 (padding) enters no figure: FP32's does not leave kl_mean and
    max_abs_error undefined on the row's scopes, a variant's is no NaN/inf output the gate would call a breach."""
    reference, outputs = REFERENCE.copy(), OUTPUTS.copy()
    (reference if side == "fp32" else outputs)[1, 2] = [np.nan, np.inf, 0.0]  # row 1's unscored third token
    result = evaluate_accuracy("classification", outputs, reference, LABELS, {"second": np.array([False, True])})
    p, q = metrics.softmax(np.array([0.0, 1.0, 3.0])), metrics.softmax(np.array([0.0, 3.0, 1.0]))
    for scope, kl in ((result.overall, float(np.sum(p * np.log(p / q))) / 4), (result.slice("second"), 0.0)):
        assert scope.nonfinite_outputs == 0 and scope.new_nonfinite_outputs == 0
        assert scope.metrics["kl_mean"] == pytest.approx(kl)
    assert result.overall.metrics["max_abs_error"] == 2.0 and result.slice("second").metrics["max_abs_error"] == 0.0
    assert result.overall.metrics["accuracy"] == 3 / 4 and result.nonfinite_outputs == 0
    # on a scored token the same NaN is FP32's failure (or the variant's own) as before
    (reference if side == "fp32" else outputs)[1, 1] = np.nan
    failed = evaluate_accuracy("classification", outputs, reference, LABELS, {}).overall
    assert np.isnan(failed.metrics["kl_mean"]) and np.isnan(failed.metrics["max_abs_error"])
    assert failed.nonfinite_outputs == failed.new_nonfinite_outputs == (side == "variant")


def test_min_slice_size_counts_the_scored_tokens_a_token_mean_rests_on() -> None:
    """A slice of 40 rows holding 3 scored tokens: its kl_mean is a mean over 3 tokens, so min_slice_size 10 leaves
    it unjudged (it was judged as 40 rows), while the overall scope, on 23 tokens, is judged."""
    from qbench.gate.evaluate import judge
    from qbench.gate.metric_check import UNDER_MIN_SIZE
    from qbench.recipe.spec import GateSpec
    from qbench.results.schema import VariantResult

    rng = np.random.default_rng(0)
    reference = rng.normal(size=(50, 2, CLASSES))
    outputs = reference + rng.normal(scale=0.5, size=reference.shape)
    labels = rng.integers(0, CLASSES, size=(50, 2))
    labels[:40] = -100
    labels[[0, 5, 9], [0, 1, 0]] = 1
    sparse = np.arange(50) < 40
    scored_in_slice = int(np.count_nonzero((labels != -100) & sparse[:, None]))  # by hand
    assert scored_in_slice == 3

    def result(name: str, scores: np.ndarray) -> VariantResult:
        accuracy = evaluate_accuracy("classification", scores, reference, labels, {"sparse": sparse})
        return VariantResult(name, "b", "fp32" if name == "fp32" else "int8", "ok", accuracy=accuracy)

    report = judge(result("fp32", reference), result("int8", outputs), GateSpec(metric="kl_mean", max_drop=1.0,
                   max_slice_drop=0.0, min_slice_size=10))  # fmt: skip
    by_scope = {c.scope: c for c in report.checks}
    assert (by_scope["sparse"].status, by_scope["sparse"].reason, by_scope["sparse"].size) == ("skipped", UNDER_MIN_SIZE, 3)
    assert by_scope["overall"].status == "pass" and report.exit_code == 0


def test_token_labels_named_by_data_classes_are_refused_naming_what_is_expected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """NER tags written as names with data.classes: before, each row's whole list was read as one class name and
    refused as 'none of data.classes', though every tag was one of them."""
    import pandas as pd

    recipe, _, labels = _token_project(tmp_path)
    names = np.array(["a", "b", "c"])
    table = pd.read_parquet(tmp_path / "data.parquet")
    table["y"] = [list(names[np.maximum(row, 0)]) for row in labels]
    table.to_parquet(tmp_path / "data.parquet")
    body = recipe.read_text().replace("  label: y\n", "  label: y\n  classes: [a, b, c]\n")
    assert body != recipe.read_text()
    recipe.write_text(body)
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert said("data.classes: column 'y' holds a list of token labels per row, and data.classes names one class per "
                "row; expected token labels as integer class ids", err), err
