"""Labels in another coding than the output's class order (ids shifted by one, class names listed in another order,
binary labels inverted): FP32 is wrong on nearly every row, every drop counts changes between wrong answers, and the
gate passed. The sweep's FP32 measurement now refuses such labels (qbench.preflight.labels.check_labels_beat_chance).
"""

from __future__ import annotations

import numpy as np
import pytest
from task_projects import iris, iris_logits_model, project, said, table

from qbench.cli.app import main

pytestmark = pytest.mark.slow

FP16 = [{"name": "fp16", "precision": "fp16"}]


def _fp32_answers() -> np.ndarray:
    features, _ = iris()
    model = iris_logits_model()
    weights = {t.name: np.frombuffer(t.raw_data, dtype=np.float32).reshape(t.dims) for t in model.graph.initializer}
    return np.argmax(features @ weights["fc_w"] + weights["fc_b"], axis=1)


@pytest.mark.parametrize("coding", ["ids shifted by one", "classes listed in another order"])
def test_labels_fp32_gets_wrong_on_nearly_every_row_are_refused(tmp_path, monkeypatch, capsys, coding):
    """Iris labels rotated by one class against the fitted classifier's columns: FP32's accuracy is 0.02 (3 of 150,
    95 % interval up to 0.0571, a uniform guess among 3 classes scores 0.333). Before, FP32 and FP16 scored the same
    and the gate passed (exit 0); now the sweep stops on data.label (exit 2)."""
    features, ids = iris()
    answers = _fp32_answers()
    assert np.mean(answers == ids) > 0.9  # the classifier is right on its own coding
    rotated = (ids + 1) % 3
    assert np.mean(answers == rotated) == pytest.approx(3 / 150)  # hand-computed with numpy above
    monkeypatch.chdir(tmp_path)
    if coding == "ids shifted by one":
        labels, data = rotated, {}
    else:  # each name listed one column late: setosa rows named for column 1, as the rotated ids are
        names = np.array(["setosa", "versicolor", "virginica"])
        labels, data = names[ids], {"classes": ["virginica", "setosa", "versicolor"]}
    recipe = project(tmp_path, iris_logits_model(), table(features, labels), variants=FP16, data=data)
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 2
    err = capsys.readouterr().err
    assert said("data.label: column 'y': FP32 accuracy 0.0200 on output 'logits' is below a uniform guess over 3 "
                "classes (0.3333)", err), err
    assert said("0.02 of 150 evaluated, 95% interval up to 0.05715, below the guess: FP32 is wrong on nearly every row",
                err), err

def test_labels_at_chance_are_judged(tmp_path, monkeypatch, capsys):
    """Labels FP32 matches less often than a guess, but within the noise of one (shuffled: 43 of 150, 0.2867, 95 %
    interval up to 0.3637 > 1/3), are a weak model's, not another coding: judged as before. The reading is kept in
    FP32's notes as well as logged: logged alone, where FP32 is measured, it never reached a Ray sweep's driver
    (its workers' logs are not forwarded) nor a resumed sweep that reuses FP32's measurement."""
    from qbench.gate.run import latest_results
    from qbench.recipe.spec import load_recipe
    from qbench.results.schema import read_results

    features, ids = iris()
    shuffled = np.random.default_rng(0).permutation(ids)
    answers = _fp32_answers()
    assert np.mean(answers == shuffled) == pytest.approx(43 / 150)
    # the unpaired guess: FP32's answers against the labels shuffled again across rows (qbench.validate.measure)
    assert np.mean(answers == shuffled[np.random.default_rng(0).permutation(150)]) == pytest.approx(53 / 150)
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, iris_logits_model(), table(features, shuffled), variants=FP16)
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 0, capsys.readouterr()
    fp32 = read_results(latest_results(load_recipe(recipe))).find("fp32", "onnxruntime-cpu")
    assert [note for note in fp32.notes if "uniform guess" in note] == [
        "FP32 accuracy 0.2867 on output 'logits' is below a uniform "
        "guess over 3 classes (0.3333) and a guess answering each class as often as FP32 does (0.3533): if the labels "
        "are not the score columns' numbers, name each column's class with "
        "data.classes; 0.2867 of 150 evaluated, 95% interval up to 0.3637"]


def test_one_class_evaluation_set_a_model_answers_rarely_is_judged(tmp_path, monkeypatch, capsys):
    """A binary classifier evaluated on its positive class's rows only (a recall check): FP32 answers 'positive' on
    118 of 300 (0.3933, 95 % interval up to 0.4496), below a uniform guess between 2 classes (0.5), but a guess
    answering 'positive' as often as FP32 does, whatever the input, scores the same 0.3933 on these labels: the
    labels are in the output's coding, FP32 is a model of low recall here. Before, the sweep stopped on data.label
    (exit 2); now it is judged (FP16 keeps every answer: exit 0) and nothing is said of chance."""
    from onnx import TensorProto, helper, numpy_helper
    from task_projects import graph_model

    features = np.random.default_rng(3).normal(size=(300, 2)).astype(np.float32)
    weight = np.array([[0.0, 0.0], [0.0, 1.0]], np.float32)  # positive's score minus negative's: x1 - 0.524
    bias = np.array([0.0, -0.524], np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 2])
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["mm"]),
                         helper.make_node("Add", ["mm", "b"], ["logits"])],
                        [x], [logits], [numpy_helper.from_array(weight, "w"),
                                        numpy_helper.from_array(bias, "b")])  # fmt: skip
    answers = np.argmax(features @ weight + bias, axis=1)
    assert int(answers.sum()) == 118  # hand-computed with numpy above
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, model, table(features, np.ones(300, dtype=np.int64)), variants=FP16)
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 0
    captured = capsys.readouterr()
    assert "uniform guess" not in captured.err + captured.out
