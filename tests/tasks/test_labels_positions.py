"""Score columns that are no classes of the labels: a per-position output of a fixed-length input (token scores
[rows, 16] beside input ids [rows, 16], one label per row) was read as 16 classes, FP32 scored a meaningless
accuracy near 0 and the gate passed every variant. FP32's measurement now refuses it on data.label
(qbench.tasks.class_labels.decisions_beyond_labels); a classifier whose evaluation rows hold a few of its classes is
judged as before."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from task_projects import graph_model, plain_ort, project, run_all, said, table

from qbench.cli.app import main
from qbench.tasks.class_labels import decisions_beyond_labels

LENGTH = 16
FP16 = [{"name": "fp16", "precision": "fp16"}]


def _scores(predicted: np.ndarray, classes: int = 16) -> np.ndarray:
    """Scores whose top column in row k is predicted[k] (a row of NaN for -1), each row distinct from the others."""
    scores = np.eye(classes)[predicted] + 0.001 * np.arange(len(predicted))[:, None]
    scores[predicted < 0] = np.nan
    return scores


def test_decisions_beyond_every_label_on_most_rows_are_no_classes():
    """100 rows of labels 0, 1 alternating: 40 decided as the other label, 59 as class 9, the last not decided.
    Independent draws agree on (20 * 50 + 20 * 49) / 99^2 = 0.202 of the 99 decided rows, standard error
    sqrt(0.202 * 0.798 / 99) = 0.0403, so agreement needs above 0.202 + 3.09 * 0.0403 = 0.327; none is right."""
    labels = np.arange(100) % 2
    predicted = np.where(np.arange(100) < 40, 1 - labels, 9)
    predicted[99] = -1  # NaN scores: not decided
    assert decisions_beyond_labels(_scores(predicted), labels, "output 's'").startswith(
        "FP32's highest of its 16 score columns is beyond every label (labels 0..1) on 59 of 100 rows, and its "
        "distinct rows' accuracy 0.0% is no more than columns unrelated to the labels give (agreement needs above "
        "32.7%): the columns of output 's' are not the labels' classes")


@pytest.mark.parametrize(("predicted", "labels"), [
    (np.array([5, 9, 1, 0]), np.array([0, 1, 1, 0])),  # beyond on 2 of 4 rows: not most
    (np.array([9, 9, 9, 9]), np.array([0, 8, 1, 0])),  # labels reach 9 of 16 columns: more than half
    (np.array([9, 9, 9, 9]), np.array([[0, 1], [1, 0], [0, 0], [1, 1]])),  # token labels: the token check's
    (np.array([-1, -1]), np.array([0, 1])),  # no row decided (NaN/inf everywhere)
])  # fmt: skip
def test_decisions_within_the_labels_classes_are_judged(predicted, labels):
    assert decisions_beyond_labels(_scores(predicted), labels, "output 's'") is None


def test_a_weak_classifier_agreeing_with_its_labels_beyond_chance_is_judged():
    """40 rows of classes 0..3 (10 each): 12 decided right (3 a class), 28 as class 9. Independent draws agree on
    4 * 3 * 10 / 40^2 = 0.075 of rows, standard error sqrt(0.075 * 0.925 / 40) = 0.0416: 0.3 is 5.4 of them above."""
    labels = np.tile(np.arange(4), 10)
    predicted = np.where(np.arange(40) < 12, labels, 9)
    assert decisions_beyond_labels(_scores(predicted), labels, "output 's'") is None
    shifted = np.where(np.arange(40) < 12, (labels + 1) % 4, 9)  # same shares decided as each class, none right
    assert decisions_beyond_labels(_scores(shifted), labels, "output 's'") is not None
    few = [0, 1, 12, 13, 14, 15, 16, 17]  # 2 of 8 right: on 40 rows 0.25 would be agreement, on 8 it is none
    repeated = np.tile(_scores(shifted)[few], (5, 1))
    assert decisions_beyond_labels(repeated, np.tile(labels[few], 5), "output 's'") is None


def _token_scorer() -> object:
    """Input ids [batch, 16] -> embedding (50 x 8) -> one score per token [batch, 16]: a fixed sequence length."""
    rng = np.random.default_rng(0)
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [None, LENGTH])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, LENGTH])
    nodes = [helper.make_node("Gather", ["table", "ids"], ["embedded"]),
             helper.make_node("MatMul", ["embedded", "head"], ["scored"]),
             helper.make_node("Squeeze", ["scored", "last"], ["scores"])]  # fmt: skip
    weights = [numpy_helper.from_array(rng.normal(size=(50, 8)).astype(np.float32), "table"),
               numpy_helper.from_array(rng.normal(size=(8, 1)).astype(np.float32), "head"),
               numpy_helper.from_array(np.array([2], dtype=np.int64), "last")]  # fmt: skip
    return graph_model(nodes, [ids], [scores], weights)


def test_token_scores_of_a_fixed_length_read_against_row_labels_are_refused(tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 50, size=(120, LENGTH))
    labels = rng.integers(0, 2, size=120)
    model = _token_scorer()
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, model, table(ids, labels), variants=FP16)
    answers = plain_ort(tmp_path / "model.onnx", {"ids": ids})["scores"].argmax(axis=1)
    beyond = int(np.count_nonzero(answers > 1))  # hand-computed with ONNX Runtime and numpy
    assert beyond > 60
    assert main(["validate", str(recipe)]) == 0  # validate's FP32 run on 8 rows cannot tell it from a weak classifier
    import qbench.sweep.runner

    # no dry run: FP32 on every row
    monkeypatch.setattr(qbench.sweep.runner, "_check_reference_runs", lambda prepared: None)
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 2
    err = capsys.readouterr().err
    assert said(f"on {beyond} of 120 rows, and its distinct rows' accuracy", err)
    assert said("the columns of output 'scores' of shape [None, 16] are not the labels' classes (classification reads "
                "one class per column)", err)


@pytest.mark.parametrize(("seed", "noise", "signal", "weak"), [(2, 0.7, 2.0, False), (3, 1.0, 1.0, True)])
def test_a_classifier_evaluated_on_a_few_of_its_classes_is_judged(tmp_path, monkeypatch, capsys, seed, noise, signal,
                                                                  weak):  # fmt: skip
    """A 16-feature, 16-class linear classifier on rows of classes 0..3 only: FP32 decides them, as it should, or
    (`weak`: noise drowning much of the signal, a hard or shifted set) decides most rows as other classes, yet far
    more of them right than chance: either is measured, not refused as a per-position output."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, size=120)
    features = (rng.normal(scale=noise, size=(120, LENGTH)) + signal * np.eye(LENGTH)[labels]).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, LENGTH])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, LENGTH])
    weight = numpy_helper.from_array(np.eye(LENGTH, dtype=np.float32), "w")
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["logits"])], [x], [logits], [weight])
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, model, table(features, labels), variants=FP16)
    answers = plain_ort(tmp_path / "model.onnx", {"x": features})["logits"].argmax(axis=1)
    expected = float(np.mean(answers == labels))  # hand-computed with ONNX Runtime and numpy
    beyond = np.count_nonzero(answers > 3)
    if weak:
        assert beyond > 60 and expected > 0.2  # most rows decided beyond the labels
    else:
        assert 0 < beyond < 60 and 0.5 < expected < 1.0  # some rows decided beyond the labels
    results, _ = run_all(recipe, capsys)
    assert results.find("fp32", "onnxruntime-cpu").accuracy.overall.metrics["accuracy"] == pytest.approx(expected)
