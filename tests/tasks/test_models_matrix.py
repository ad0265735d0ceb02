"""Model kinds users bring, each built here, through `qbench validate`, `sweep` and `gate`.

Every FP32 figure qbench reports is compared with the same metric computed here from a plain
onnxruntime InferenceSession run (default session options), so a wrong output choice, a map
read in the wrong column order or an integer read as a score shows up as a mismatch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper
from task_projects import (
    INT8,
    ROWS,
    argmax_first_model,
    fitted_linear,
    graph_model,
    iris,
    iris_logits_model,
    linear,
    overall,
    plain_ort,
    project,
    run_all,
    said,
    table,
)

from qbench.cli.app import main

pytestmark = pytest.mark.slow

skl2onnx = pytest.importorskip("skl2onnx")
sklearn_datasets = pytest.importorskip("sklearn.datasets")

# -- the matrix -----------------------------------------------------------------------------------


@pytest.mark.parametrize("zipmap", [True, False], ids=["zipmap", "no-zipmap"])
def test_skl2onnx_logistic_regression(tmp_path, monkeypatch, capsys, zipmap):
    from sklearn.linear_model import LogisticRegression

    features, labels = iris()
    classifier = LogisticRegression(max_iter=500).fit(features, labels)
    options = None if zipmap else {id(classifier): {"zipmap": False}}
    model = skl2onnx.to_onnx(classifier, features[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})
    monkeypatch.chdir(tmp_path)
    # Without the ZipMap every node is ai.onnx.ml, which ONNX Runtime's int8 quantizer refuses ("Failed to
    # find proper ai.onnx domain"); int8 of such graphs is another change's work, so a second FP32 build
    # is the gated variant here.
    variants = [INT8] if zipmap else [{"name": "fp32", "precision": "fp32"},
                                      {"name": "fp32-again", "precision": "fp32"}]
    recipe = project(tmp_path, model, table(features, labels), variants=variants)
    results, shown = run_all(recipe, capsys)
    probabilities_name = "output_probability" if zipmap else "probabilities"
    assert results.recipe["model_output"] == probabilities_name  # scores chosen over the int64 label output
    plain = plain_ort(tmp_path / "model.onnx", {"X": features})[probabilities_name]
    if zipmap:  # a list of {class: probability}: columns in class order
        plain = np.array([[row[k] for k in sorted(row)] for row in plain], dtype=np.float32)
    expected = float(np.mean(np.argmax(plain, axis=1) == labels))
    assert overall(results)["accuracy"] == pytest.approx(expected, abs=1e-12)
    assert expected > 0.9
    assert overall(results)["kl_mean"] == pytest.approx(0.0)


def test_int64_label_output_first_is_read_as_class_ids(tmp_path, monkeypatch, capsys):
    features, labels = iris()
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, argmax_first_model(), table(features, labels),
                     model={"path": "model.onnx", "output": "label"})
    results, _ = run_all(recipe, capsys)
    ids = plain_ort(tmp_path / "model.onnx", {"x": features})["label"]
    fp32 = overall(results)
    assert fp32["accuracy"] == pytest.approx(float(np.mean(ids == labels)), abs=1e-12)
    assert "kl_mean" not in fp32  # an integer is never read as a score
    assert overall(results, "int8")["agreement"] > 0.9  # int8 ids compared with FP32 ids


def test_unnamed_output_picks_the_logits_over_the_label(tmp_path, monkeypatch, capsys):
    features, labels = iris()
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, argmax_first_model(), table(features, labels))
    results, _ = run_all(recipe, capsys)
    assert results.recipe["model_output"] == "logits"
    logits = plain_ort(tmp_path / "model.onnx", {"x": features})["logits"]
    assert overall(results)["accuracy"] == pytest.approx(float(np.mean(logits.argmax(1) == labels)), abs=1e-12)


def test_label_and_probabilities_evaluated_together_and_gated_by_output(tmp_path, monkeypatch, capsys):
    features, labels = iris()
    monkeypatch.chdir(tmp_path)
    recipe = project(
        tmp_path, argmax_first_model(), table(features, labels),
        model={"path": "model.onnx", "outputs": ["label", "logits"]},
        gate={"metric": "logits/accuracy", "max_drop": 0.05, "max_slice_drop": 0.1},
    )  # fmt: skip
    results, shown = run_all(recipe, capsys)
    plain = plain_ort(tmp_path / "model.onnx", {"x": features})
    fp32 = overall(results)
    assert fp32["label/accuracy"] == pytest.approx(float(np.mean(plain["label"] == labels)), abs=1e-12)
    assert fp32["logits/accuracy"] == pytest.approx(float(np.mean(plain["logits"].argmax(1) == labels)), abs=1e-12)
    assert "logits/kl_mean" in fp32 and "label/kl_mean" not in fp32
    assert results.gate_metric == "logits/accuracy" and said("logits/accuracy", shown)


def _passthrough_encoder() -> onnx.ModelProto:
    """input_ids (int64, 8 tokens) -> [copy of input_ids, mean-pooled 16-d embedding]."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [None, 8])
    copy = helper.make_tensor_value_info("ids_out", TensorProto.INT64, [None, 8])
    embedding = helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [None, 16])
    table = np.random.default_rng(3).normal(size=(50, 16)).astype(np.float32)
    nodes = [
        helper.make_node("Identity", ["input_ids"], ["ids_out"]),
        helper.make_node("Gather", ["table", "input_ids"], ["tokens"]),
        helper.make_node("ReduceMean", ["tokens"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "proj_w"], ["embedding"]),
    ]
    weights = [numpy_helper.from_array(table, "table"), linear("proj", 16, 16, 4)[0]]
    return graph_model(nodes, [ids], [copy, embedding], weights)


def _token_table() -> tuple[np.ndarray, pd.DataFrame]:
    ids = np.random.default_rng(5).integers(0, 50, size=(ROWS, 8)).astype(np.int64)
    return ids, table(ids)


def test_passthrough_output_of_an_encoder_is_skipped(tmp_path, monkeypatch, capsys, caplog):
    ids, token_rows = _token_table()
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, _passthrough_encoder(), token_rows, task="embedding", gate={"metric": "cosine"})
    caplog.set_level("INFO", logger="qbench.tasks.selection")
    results, _ = run_all(recipe, capsys)
    assert results.recipe["model_output"] == "embedding"
    assert "'ids_out' skipped: it is a copy of the input 'input_ids'" in caplog.text
    plain = plain_ort(tmp_path / "model.onnx", {"input_ids": ids})["embedding"]
    assert overall(results)["cosine"] == pytest.approx(1.0)  # FP32 against itself
    int8 = results.find("int8", "onnxruntime-cpu")
    assert int8 is not None and int8.accuracy is not None
    own = plain_ort(Path(int8.model_path), {"input_ids": ids})["embedding"]
    cosine = np.sum(own * plain, 1) / (np.linalg.norm(own, axis=1) * np.linalg.norm(plain, axis=1))
    assert int8.accuracy.overall.metrics["cosine"] == pytest.approx(float(np.mean(cosine)), abs=1e-6)


def test_embedding_on_an_integer_output_is_a_recipe_error_naming_the_float_outputs(tmp_path, capsys):
    _, token_rows = _token_table()
    model = {"path": "model.onnx", "output": "ids_out"}
    recipe = project(tmp_path, _passthrough_encoder(), token_rows, task="embedding", model=model,
                     gate={"metric": "cosine"})
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert said("model.output: output 'ids_out' is a copy of the input 'input_ids'", err)
    assert said("outputs it can read: embedding (float32, [None, 16])", err)


def test_regression_mlp(tmp_path, monkeypatch, capsys):
    from sklearn.neural_network import MLPRegressor

    features, targets = sklearn_datasets.load_diabetes(return_X_y=True)
    features, targets = features[:ROWS].astype(np.float32), targets[:ROWS].astype(np.float64)
    regressor = MLPRegressor(hidden_layer_sizes=(16,), max_iter=300, random_state=0).fit(features, targets)
    model = skl2onnx.to_onnx(regressor, features[:1], target_opset=17)
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, model, table(features, targets), task="regression",
                     gate={"metric": "mae", "max_drop": 5.0, "max_slice_drop": 10.0})
    results, _ = run_all(recipe, capsys)
    predicted = plain_ort(tmp_path / "model.onnx", {"X": features})["variable"].reshape(-1).astype(np.float64)
    fp32 = overall(results)
    assert fp32["mae"] == pytest.approx(float(np.mean(np.abs(predicted - targets))), rel=1e-9)
    assert fp32["rmse"] == pytest.approx(float(np.sqrt(np.mean((predicted - targets) ** 2))), rel=1e-9)
    r2 = 1 - np.sum((targets - predicted) ** 2) / np.sum((targets - targets.mean()) ** 2)
    assert fp32["r2"] == pytest.approx(float(r2), rel=1e-9)
    assert fp32["agreement"] == 1.0


def test_a_regressor_without_labels_under_the_default_task_is_named_as_read_in_one_class(tmp_path, monkeypatch,
                                                                                        capsys):
    """A PolynomialFeatures + Ridge on diabetes, no labels and no `task`: its output (every value above 30) was read
    as one logit, every row class 1, and every variant agreed 1.0 and passed with nothing said. The reading is now
    named (warning, FP32's notes, a gate note) with the task to set; under a stated classification, as before, it is
    not (the labels would say whether one class is wrong there)."""
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import PolynomialFeatures

    features, targets = sklearn_datasets.load_diabetes(return_X_y=True)
    features, targets = features[:ROWS].astype(np.float32), targets[:ROWS]
    model = skl2onnx.to_onnx(make_pipeline(PolynomialFeatures(2), Ridge()).fit(features, targets), features[:1],
                             target_opset=17)  # fmt: skip
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, model, table(features), variants=[{"name": "bf16", "precision": "bf16"}])
    results, output = run_all(recipe, capsys)
    predicted = plain_ort(tmp_path / "model.onnx", {"X": features})["variable"]
    assert predicted.min() > 0 and overall(results, "bf16")["agreement"] == 1.0  # one class: blind to BF16's changes
    assert said("the recipe sets no task, so the output was read as class scores (task: classification): a "
                "regressor's output is judged by task: regression", output)  # fmt: skip
    assert said(f"puts every one of {ROWS} evaluation rows in class 1", output)
    assert said("decides every evaluation row one class on output 'variable'", output)
    _, output = run_all(project(tmp_path / "stated", model, table(features), task="classification",
                                variants=[{"name": "bf16", "precision": "bf16"}]), capsys)  # fmt: skip
    assert said("evaluating output variable", output) and not said("evaluation rows in class", output)


def test_a_regression_on_tiny_targets_is_gated_relative_to_fp32s_error(tmp_path, monkeypatch, capsys):
    """Targets of ~1e-4 (an outlier score): INT8's rounding multiplies FP32's MAE, a drop of ~1e-6 that the absolute
    default of 0.01 passed. With no tolerance stated, `qbench gate` reads the recorded recipe and judges against 1 % of
    FP32's MAE, saying so."""
    rng = np.random.default_rng(0)
    features = rng.normal(size=(ROWS, 4)).astype(np.float32)
    weight = (rng.normal(size=(4, 1)) * 1e-4).astype(np.float32)
    targets = (features @ weight).reshape(-1).astype(np.float64) + rng.normal(size=ROWS) * 1e-7
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
                        [numpy_helper.from_array(weight, "w")])  # fmt: skip
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, model, table(features, targets), task="regression", gate={"metric": "mae"})
    results, shown = run_all(recipe, capsys)
    fp32_mae, int8_mae = overall(results)["mae"], overall(results, "int8")["mae"]
    assert int8_mae - fp32_mae > 0.1 * fp32_mae  # what an absolute 0.01 passed, and 1 % of FP32's MAE does not
    assert main(["gate", str(recipe)]) == 1
    assert said(f"max_drop {0.01 * fp32_mae:.4g} = 1 % of FP32's mae {fp32_mae:.4g}", shown + capsys.readouterr().out)


def _multilabel_model() -> tuple[onnx.ModelProto, np.ndarray]:
    """4 features -> sigmoid of 3 independent linear scores; returns the model and the true weights."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    probabilities = helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 3])
    weights = linear("fc", 4, 3, 11)
    nodes = [
        helper.make_node("MatMul", ["x", "fc_w"], ["mm"]),
        helper.make_node("Add", ["mm", "fc_b"], ["scores"]),
        helper.make_node("Sigmoid", ["scores"], ["probabilities"]),
    ]
    return graph_model(nodes, [x], [probabilities], weights), numpy_helper.to_array(weights[0])


def test_multilabel_model(tmp_path, monkeypatch, capsys):
    model, weight = _multilabel_model()
    features = np.random.default_rng(8).normal(size=(ROWS, 4)).astype(np.float32)
    noise = np.random.default_rng(9).normal(scale=0.8, size=(ROWS, 3))
    labels = ((features @ weight) + noise > 0).astype(np.int64)
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, model, table(features, labels), task="multilabel", gate={"metric": "micro_f1"})
    results, _ = run_all(recipe, capsys)
    predicted = (plain_ort(tmp_path / "model.onnx", {"x": features})["probabilities"] > 0.5).astype(np.int64)
    tp = np.sum(predicted & labels)
    micro = 2 * tp / (2 * tp + np.sum(predicted & (1 - labels)) + np.sum((1 - predicted) & labels))
    per_label = [
        2 * np.sum(predicted[:, j] & labels[:, j])
        / (2 * np.sum(predicted[:, j] & labels[:, j]) + np.sum(predicted[:, j] != labels[:, j]))
        for j in range(3)
    ]
    fp32 = overall(results)
    assert fp32["micro_f1"] == pytest.approx(float(micro), abs=1e-12)
    assert fp32["macro_f1"] == pytest.approx(float(np.mean(per_label)), abs=1e-12)
    assert fp32["label_agreement"] == 1.0


def _averaged_sigmoids_model(width: int) -> onnx.ModelProto:
    """x [None, 4] -> mean of sigmoid(z) and sigmoid(1.1 z), z = the first `width` features, written as
    Add(Mul(p1, 0.5), Mul(p2, 0.5)): an ensemble's probabilities, made by an Add."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    probabilities = helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, width])
    constants = [numpy_helper.from_array(np.asarray(v, np.float32), n)
                 for n, v in (("w", np.eye(4, width)), ("k", 1.1), ("half", 0.5))]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("Sigmoid", ["z"], ["p1"]),
             helper.make_node("Mul", ["z", "k"], ["z2"]), helper.make_node("Sigmoid", ["z2"], ["p2"]),
             helper.make_node("Mul", ["p1", "half"], ["a"]), helper.make_node("Mul", ["p2", "half"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["probabilities"])]  # fmt: skip
    return graph_model(nodes, [x], [probabilities], constants)


@pytest.mark.parametrize(("task", "width", "metric"),
                         [("classification", 1, "accuracy"), ("multilabel", 3, "micro_f1")])
def test_an_average_of_sigmoids_is_thresholded_as_probabilities(tmp_path, monkeypatch, capsys, task, width, metric):
    """An output made by an Add was read as logits (threshold 0): every row of this average of sigmoids was class 1
    (every label positive), FP32 scored the share of positives, and FP16, which rounds the 'near' rows' p = 0.5 + 2e-5
    to 0.5, passed the gate. Read as probabilities, FP32 scores its own decisions perfectly and FP16 breaches."""
    features = np.random.default_rng(12).normal(size=(ROWS, 4)).astype(np.float32)
    near = np.arange(ROWS) % 4 == 0
    features[near, :width] = np.random.default_rng(13).uniform(1e-4, 2e-4, size=(int(near.sum()), width))
    model = _averaged_sigmoids_model(width)
    onnx.save(model, str(tmp_path / "plain.onnx"))
    decisions = (plain_ort(tmp_path / "plain.onnx", {"x": features})["probabilities"] > 0.5).astype(np.int64)
    labels = decisions[:, 0] if width == 1 else decisions
    assert 0.2 < labels.mean() < 0.8  # both decisions occur: threshold 0 would call every one positive
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, model, table(features, labels, kind=np.where(near, "near", "far")), task=task,
                     data={"slices": [{"by": "kind"}]}, variants=[{"name": "fp16", "precision": "fp16"}],
                     gate={"metric": metric, "max_drop": 0.01, "max_slice_drop": 0.02})  # fmt: skip
    results, shown = run_all(recipe, capsys)
    assert overall(results)[metric] == 1.0
    near_fp16 = results.find("fp16", "onnxruntime-cpu").accuracy.slice("kind=near")
    assert near_fp16.drops[metric] > 0.5, shown  # FP16's p = 0.5 is no longer a positive
    assert said("gate: FAIL", shown)


def test_yes_no_labels_of_a_single_probability_column_are_named_negative_then_positive(tmp_path, monkeypatch, capsys):
    """A binary classifier's one sigmoid column (rows, 1) stands for two classes: data.classes lists [no, yes]. A list
    of one class was refused as 'output has 2' with no word on which two; a list in the other order scored FP32 below
    chance with a hint to set data.classes, which was set. Both now say how a single column's classes are listed."""
    features = np.random.default_rng(21).normal(size=(ROWS, 4)).astype(np.float32)
    model = _averaged_sigmoids_model(1)
    onnx.save(model, str(tmp_path / "plain.onnx"))
    positive = plain_ort(tmp_path / "plain.onnx", {"x": features})["probabilities"][:, 0] > 0.5
    labels = np.where(positive ^ (np.arange(ROWS) % 7 == 0), "yes", "no")  # every 7th row's label is wrong
    monkeypatch.chdir(tmp_path)
    single = "a single score column stands for two classes, listed as [negative, positive], e.g. ['no', 'yes']"
    one = project(tmp_path / "one", model, table(features, labels), data={"classes": ["yes"]})
    assert main(["validate", str(one)]) == 2
    assert said(f"data.classes: names 1 classes, output 'probabilities' has 2 ({single})", capsys.readouterr().err)
    swapped = project(tmp_path / "swapped", model, table(features, labels), data={"classes": ["yes", "no"]})
    main(["sweep", str(swapped), "--no-track"])
    assert said(f"check the order of data.classes (yes, no): it names each score column's class in column order; "
                f"{single}", "".join(capsys.readouterr()))  # fmt: skip
    named = project(tmp_path / "named", model, table(features, labels), data={"classes": ["no", "yes"]})
    results, _ = run_all(named, capsys)
    assert overall(results)["accuracy"] == pytest.approx(float(np.mean(positive == (labels == "yes"))), abs=1e-12)


def test_a_binary_score_of_one_value_per_row_has_two_classes(tmp_path, monkeypatch, capsys):
    """A sigmoid squeezed to one value per row, (rows,), is a binary score as (rows, 1) is. Its classes went uncounted:
    labels of a class 2 were scored as always wrong (FP32 accuracy 0.94 with 8 rows of 400 labelled 2, a drop-free
    pass) and three data.classes were taken; both are now the data.label / data.classes error (rows, 1) gives."""
    features = np.random.default_rng(22).normal(size=(ROWS, 4)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    score = helper.make_tensor_value_info("score", TensorProto.FLOAT, [None])
    nodes = [
        helper.make_node("MatMul", ["x", "fc_w"], ["mm"]),
        helper.make_node("Add", ["mm", "fc_b"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["p"]),
        helper.make_node("Squeeze", ["p", "axis"], ["score"]),
    ]
    weights = [*linear("fc", 4, 1, seed=3), numpy_helper.from_array(np.array([1], dtype=np.int64), "axis")]
    model = graph_model(nodes, [x], [score], weights)
    onnx.save(model, str(tmp_path / "plain.onnx"))
    positive = plain_ort(tmp_path / "plain.onnx", {"x": features})["score"] > 0.5
    labels = (positive ^ (np.arange(ROWS) % 7 == 0)).astype(np.int64)  # every 7th row's label is wrong
    monkeypatch.chdir(tmp_path)
    three = project(tmp_path / "three", model, table(features, np.where(np.arange(ROWS) % 50 == 3, 2, labels)))
    assert main(["validate", str(three)]) == 2
    assert said("data.label: column 'y': 3 rows, e.g. row 3: 2 hold class ids outside 0..1 (output 'score' has 2 "
                "classes)", capsys.readouterr().err)  # fmt: skip
    named = np.array(["no", "yes"])[labels]
    listed = project(tmp_path / "listed", model, table(features, named), data={"classes": ["no", "yes", "maybe"]})
    assert main(["validate", str(listed)]) == 2
    assert said("data.classes: names 3 classes, output 'score' has 2", capsys.readouterr().err)
    results, _ = run_all(project(tmp_path / "ok", model, table(features, labels)), capsys)
    assert overall(results)["accuracy"] == pytest.approx(float(np.mean(positive == labels)), abs=1e-12)


def _two_float_outputs() -> onnx.ModelProto:
    """Logits and their softmax: two outputs a classifier could be judged on."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 3])
    probabilities = helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 3])
    nodes = [
        helper.make_node("MatMul", ["x", "fc_w"], ["mm"]),
        helper.make_node("Add", ["mm", "fc_b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    return graph_model(nodes, [x], [logits, probabilities], fitted_linear(*iris()))


def test_several_float_outputs_are_refused_unless_named(tmp_path, monkeypatch, capsys):
    features, labels = iris()
    recipe = project(tmp_path / "unnamed", _two_float_outputs(), table(features, labels))
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert said("several outputs task 'classification' could evaluate ('logits', 'probabilities')", err)
    assert said("logits (float32, [None, 3]); probabilities (float32, [None, 3])", err)

    monkeypatch.chdir(tmp_path)
    named = project(tmp_path / "named", _two_float_outputs(), table(features, labels),
                    model={"path": "model.onnx", "output": "probabilities"})
    results, _ = run_all(named, capsys)
    plain = plain_ort(tmp_path / "named" / "model.onnx", {"x": features})["probabilities"]
    assert overall(results)["accuracy"] == pytest.approx(float(np.mean(plain.argmax(1) == labels)), abs=1e-12)


def test_a_model_with_a_fixed_batch_of_one(tmp_path, monkeypatch, capsys):
    """An export without a dynamic batch axis (input [1, 4]): a batch size the recipe sets otherwise is named by
    `validate` before anything runs; the ones it leaves out take the model's batch, and FP32 matches a plain session."""
    features, labels = iris()
    model = iris_logits_model(batch=1)
    monkeypatch.chdir(tmp_path)
    sixteen = project(tmp_path / "sixteen", model, table(features, labels), data={"evaluation": {"batch_size": 16}})
    assert main(["validate", str(sixteen)]) == 2
    assert said("data.evaluation.batch_size: model input 'x' has a fixed batch dimension of 1 (shape [1, 4]), so it "
                "runs batches of 1 only; expected data.evaluation.batch_size: 1 (now 16)",
                capsys.readouterr().err)  # fmt: skip
    defaults = project(tmp_path / "defaults", model, table(features, labels))
    results, _ = run_all(defaults, capsys)
    plain = np.concatenate([plain_ort(tmp_path / "defaults" / "model.onnx", {"x": row[None]})["logits"]
                            for row in features])
    assert overall(results)["accuracy"] == pytest.approx(float(np.mean(plain.argmax(1) == labels)), abs=1e-12)
    assert results.find("int8", "onnxruntime-cpu").status == "ok"


def test_string_labels_name_score_columns_through_data_classes(tmp_path, monkeypatch, capsys):
    """Class names as labels on a plain score tensor: refused with a hint, then read through data.classes in column
    order (given out of alphabetical order here, so a sorted reading would score wrongly)."""
    features, labels = iris()
    order = np.array(["virginica", "setosa", "versicolor"])  # column 0 is class 0 of the fitted weights
    names = order[labels]
    model = iris_logits_model()
    monkeypatch.chdir(tmp_path)
    unnamed = project(tmp_path / "unnamed", model, table(features, names))
    assert main(["validate", str(unnamed)]) == 2
    assert said("'virginica' are not integer class ids (for class names, list them in the order of the model's score "
                "columns in data.classes; a single score column stands for two classes",
                capsys.readouterr().err)  # fmt: skip
    short = project(tmp_path / "short", model, table(features, names), data={"classes": ["virginica", "setosa"]})
    assert main(["validate", str(short)]) == 2
    assert said("data.classes: names 2 classes, output 'logits' has 3; expected one name per class, in column order",
                capsys.readouterr().err)  # fmt: skip
    wrong = project(tmp_path / "wrong", model, table(features, names),
                    data={"classes": ["virginica", "setosa", "iris"]})
    assert main(["validate", str(wrong)]) == 2
    assert said("'versicolor' are none of data.classes (virginica, setosa, iris)", capsys.readouterr().err)
    named = project(tmp_path / "named", model, table(features, names), data={"classes": order.tolist()})
    results, _ = run_all(named, capsys)
    plain = plain_ort(tmp_path / "named" / "model.onnx", {"x": features})["logits"]
    assert overall(results)["accuracy"] == pytest.approx(float(np.mean(plain.argmax(1) == labels)), abs=1e-12)
    assert overall(results)["accuracy"] > 0.9


def test_a_zipmap_of_minus_one_and_plus_one_is_read_through_its_keys(tmp_path, monkeypatch, capsys):
    """A binary model trained on -1 / +1 (ZipMap keys [-1, 1]) could not be evaluated: the -1 labels were refused as
    negative class ids (and the map's -1 key as a column). Its keys now take their sorted position, as string keys
    do, and the labels are read through them: FP32 accuracy must be scikit-learn's."""
    from sklearn.linear_model import LogisticRegression

    features, ids = iris()
    labels = np.where(ids == 1, 1, -1)  # versicolor or not: not linearly separable, so accuracy is no trivial 1.0
    classifier = LogisticRegression(max_iter=500).fit(features, labels)
    model = skl2onnx.to_onnx(classifier, features[:1], target_opset={"": 17, "ai.onnx.ml": 3})
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, model, table(features, labels),
                     model={"path": "model.onnx", "output": "output_probability"})
    results, _ = run_all(recipe, capsys)
    expected = float(np.mean(classifier.predict(features) == labels))
    assert 0.6 < expected < 1.0
    assert overall(results)["accuracy"] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("estimator", ["logistic", "mlp"])
def test_classes_that_are_not_column_numbers_are_read_through_the_graphs_class_table(tmp_path, monkeypatch, capsys,
                                                                                     estimator):  # fmt: skip
    """scikit-learn classes [1, 2, 5] without a ZipMap, evaluated on rows of classes 1 and 2 only. Read as column ids
    the labels scored FP32 at 0.03 and the gate judged drops against that, silently. The graph states the classes
    (LinearClassifier's classlabels; the MLP's classes[ArgMax]): FP32 accuracy must be scikit-learn's."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier

    features, ids = iris()
    labels = np.array([1, 2, 5])[ids]
    make = {"logistic": lambda: LogisticRegression(max_iter=500),
            "mlp": lambda: MLPClassifier((16,), max_iter=2000, random_state=0)}[estimator]  # fmt: skip
    classifier = make().fit(features, labels)
    model = skl2onnx.to_onnx(classifier, features[:1], options={id(classifier): {"zipmap": False}},
                             target_opset={"": 17, "ai.onnx.ml": 3})  # fmt: skip
    keep = labels != 5
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, model, table(features[keep], labels[keep]))
    results, _ = run_all(recipe, capsys)
    expected = float(np.mean(classifier.predict(features[keep]) == labels[keep]))
    assert expected > 0.9
    assert overall(results)["accuracy"] == pytest.approx(expected, abs=1e-12)


def test_a_regression_with_three_targets_per_row(tmp_path, monkeypatch, capsys):
    """Labels as a list of 3 numbers per row (a parquet list column), scored against all 3 outputs per row."""
    rng = np.random.default_rng(3)
    features = rng.normal(size=(ROWS, 6)).astype(np.float32)
    weight = rng.normal(size=(6, 3)).astype(np.float32)
    targets = features @ weight + 0.1 * rng.normal(size=(ROWS, 3))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [x], [y],
                        [numpy_helper.from_array(weight, "w")])
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, model, table(features, targets), task="regression",
                     gate={"metric": "mae", "max_drop": 0.05, "max_slice_drop": 0.1})  # fmt: skip
    results, _ = run_all(recipe, capsys)
    predicted = plain_ort(tmp_path / "model.onnx", {"x": features})["y"].astype(np.float64)
    assert overall(results)["mae"] == pytest.approx(float(np.mean(np.abs(predicted - targets))), rel=1e-9)
    # rmse and r2 per target, averaged uniformly (scikit-learn's default multioutput='uniform_average')
    per_target_rmse = np.sqrt(np.mean((predicted - targets) ** 2, axis=0))
    per_target_r2 = 1 - np.sum((targets - predicted) ** 2, axis=0) / np.sum((targets - targets.mean(axis=0)) ** 2, axis=0)
    assert overall(results)["rmse"] == pytest.approx(float(np.mean(per_target_rmse)), rel=1e-9)
    assert overall(results)["r2"] == pytest.approx(float(np.mean(per_target_r2)), rel=1e-9)
    assert overall(results)["r2_min"] == pytest.approx(float(np.min(per_target_r2)), rel=1e-9)


def _log_of_sigmoid_model(width: int, eps: float | None) -> onnx.ModelProto:
    """x [None, 4] -> log(sigmoid(z)) (torch's logsigmoid), or log(sigmoid(z) + eps), over `width` columns."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    scores = helper.make_tensor_value_info("log_p", TensorProto.FLOAT, [None, width])
    constants = [numpy_helper.from_array(np.eye(4, width, dtype=np.float32), "w")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("Sigmoid", ["z"], ["p"])]
    if eps is not None:
        constants.append(numpy_helper.from_array(np.asarray(eps, np.float32), "eps"))
        nodes.append(helper.make_node("Add", ["p", "eps"], ["p_safe"]))
    nodes.append(helper.make_node("Log", ["p_safe" if eps is not None else "p"], ["log_p"]))
    return graph_model(nodes, [x], [scores], constants)


@pytest.mark.parametrize(("task", "width", "eps"), [("classification", 1, None), ("classification", 1, 1e-7),
                                                    ("multilabel", 3, None)])  # fmt: skip
def test_thresholded_log_probabilities_are_refused(tmp_path, monkeypatch, capsys, task, width, eps):
    """log(sigmoid(z)) is <= 0 on every row: read as a logit (cut at 0) every decision was 'no', FP32 accuracy 0.55
    where the model's own was 0.96, agreement 1.0 for every variant, and the gate passed. It is refused, naming why."""
    features = np.random.default_rng(31).normal(size=(ROWS, 4)).astype(np.float32)
    decisions = (features[:, :width] > 0).astype(np.int64)
    labels = decisions[:, 0] if width == 1 else decisions
    monkeypatch.chdir(tmp_path)
    gate = {"metric": "accuracy" if task == "classification" else "micro_f1", "max_drop": 0.01}
    recipe = project(tmp_path, _log_of_sigmoid_model(width, eps), table(features, labels), task=task, gate=gate)
    assert main(["validate", str(recipe)]) == 2
    assert said("output 'log_p' is the log of a probability", capsys.readouterr().err)


def test_log_softmax_over_classes_is_read_by_its_arg_max(tmp_path, monkeypatch, capsys):
    """Several columns are decided by their arg-max, which a log leaves as it is: a LogSoftmax output is scored."""
    features = np.random.default_rng(32).normal(size=(ROWS, 4)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    scores = helper.make_tensor_value_info("log_p", TensorProto.FLOAT, [None, 3])
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["z"]),
                         helper.make_node("LogSoftmax", ["z"], ["log_p"], axis=1)], [x], [scores],
                        [numpy_helper.from_array(np.eye(4, 3, dtype=np.float32), "w")])  # fmt: skip
    labels = np.argmax(features[:, :3], axis=1).astype(np.int64)
    monkeypatch.chdir(tmp_path)
    results, _ = run_all(project(tmp_path, model, table(features, labels)), capsys)
    assert overall(results)["accuracy"] == 1.0
