"""Unsupervised scikit-learn models converted by skl2onnx, through `qbench validate`, `sweep` and `gate`: KMeans judged
by its distances (whose label is their ArgMin) and an IsolationForest by its label (-1 outlier, 1 inlier, no class
table). Every figure is recomputed from scikit-learn's predictions and from the variant model's own outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from task_projects import INT8, ROWS, graph_model, iris, overall, plain_ort, project, run_all, said, table

pytestmark = pytest.mark.slow

skl2onnx = pytest.importorskip("skl2onnx")


def _converted(estimator, features: np.ndarray):
    return skl2onnx.to_onnx(estimator, features[:1], target_opset={"": 17, "ai.onnx.ml": 3})


def _variant_path(results, recipe: Path, variant: str) -> Path:
    found = results.find(variant, "onnxruntime-cpu")
    path = Path(found.evaluated_model_path or found.model_path)
    return path if path.is_absolute() else recipe.parent / path


def test_kmeans_distances_are_decided_by_their_arg_min(tmp_path, monkeypatch, capsys):
    """Read by their arg-max (the farthest centre), KMeans' distances scored FP32 0.0 against its own clusters, and an
    INT8 variant moving rows to another cluster passed the gate with a drop of 0. The graph's label is their ArgMin:
    each row's class is its nearest centre, FP32 scores scikit-learn's accuracy and the variant its own."""
    from sklearn.cluster import KMeans

    features, _ = iris()
    clusters = KMeans(3, n_init=3, random_state=0).fit(features)
    labels = clusters.predict(features)
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, _converted(clusters, features), table(features, labels), variants=[INT8],
                     model={"path": "model.onnx", "output": "scores"})  # fmt: skip
    results, _ = run_all(recipe, capsys)
    assert overall(results)["accuracy"] == pytest.approx(float(np.mean(labels == clusters.predict(features))),
                                                         abs=1e-12)
    int8 = plain_ort(_variant_path(results, recipe, "int8"), {"X": features})["scores"]
    assert overall(results, "int8")["accuracy"] == pytest.approx(float(np.mean(int8.argmin(1) == labels)), abs=1e-12)


def test_an_outlier_label_of_minus_one_is_a_class_value(tmp_path, monkeypatch, capsys):
    """An IsolationForest's label (-1 outlier, 1 inlier) states no class table: -1 was refused as a label ('expected
    class ids >= 0'), and read as the mark of a NaN row it matched nothing, FP32's own rows included."""
    from sklearn.ensemble import IsolationForest

    features, _ = iris()
    forest = IsolationForest(n_estimators=10, contamination=0.2, random_state=0).fit(features)
    truth = np.where(np.arange(len(features)) % 7 == 0, -forest.predict(features), forest.predict(features))
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, _converted(forest, features), table(features, truth),
                     variants=[{"name": "fp32", "precision": "fp32"}, {"name": "fp32-again", "precision": "fp32"}],
                     model={"path": "model.onnx", "output": "label"})  # fmt: skip
    results, _ = run_all(recipe, capsys)
    assert overall(results)["accuracy"] == pytest.approx(float(np.mean(forest.predict(features) == truth)), abs=1e-12)
    assert overall(results)["agreement"] == overall(results, "fp32-again")["agreement"] == 1.0


def test_minus_one_labels_pick_the_outlier_label_over_its_score(tmp_path, monkeypatch, capsys):
    """A OneClassSVM's outputs are its label (-1 outlier, 1 inlier) and its score [N, 1]. Without model.output the
    score ranked first and labels of -1 and 1 were refused ('are negative; expected class ids >= 0 (output 'scores'
    gives class ids, not class values)', exit 2), though the label beside it holds those values: labels that only an
    output giving class values can hold now pick it, and FP32 scores scikit-learn's accuracy."""
    from sklearn.svm import OneClassSVM

    features, _ = iris()
    detector = OneClassSVM(nu=0.2, gamma=0.5).fit(features)
    truth = np.where(np.arange(len(features)) % 5 == 0, -1, 1)
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, _converted(detector, features), table(features, truth),
                     variants=[{"name": "fp32", "precision": "fp32"},
                               {"name": "fp16", "precision": "fp16"}])  # fmt: skip
    results, output = run_all(recipe, capsys)
    assert said("output 'scores' passed over", output)
    assert overall(results)["accuracy"] == pytest.approx(float(np.mean(detector.predict(features) == truth)), abs=1e-12)
    assert 0.5 < overall(results)["accuracy"] < 1.0  # both kinds of row, right and wrong



def _split_scores_model() -> onnx.ModelProto:
    """x [None, 4] -> scores [None, 1] = x @ w + b, and label = 1 - 2 * Less(scores, 0) (-1 or 1): an outlier
    detector as skl2onnx writes an IsolationForest's, whose score of exactly 0 is an inlier."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    outputs = [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, 1]),
               helper.make_tensor_value_info("label", TensorProto.INT64, [None, 1])]  # fmt: skip
    constants = [numpy_helper.from_array(np.array([[1.0], [0.5], [-0.5], [0.25]], np.float32), "w"),
                 numpy_helper.from_array(np.array([0.01], np.float32), "b"),
                 numpy_helper.from_array(np.array([0.0], np.float32), "zero"),
                 numpy_helper.from_array(np.array([-2], np.int64), "minus_two"),
                 numpy_helper.from_array(np.array([1], np.int64), "one")]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["scores"]),
             helper.make_node("Less", ["scores", "zero"], ["outlier"]),
             helper.make_node("Cast", ["outlier"], ["outlier_id"], to=TensorProto.INT64),
             helper.make_node("Mul", ["outlier_id", "minus_two"], ["shifted"]),
             helper.make_node("Add", ["shifted", "one"], ["label"])]  # fmt: skip
    return graph_model(nodes, [x], outputs, constants)


def test_outlier_scores_are_decided_where_the_graph_splits_them(tmp_path, monkeypatch, capsys):
    """Scores judged against FP32 (no labels) whose graph labels them Less(scores, 0) -> -1, as an IsolationForest's:
    a score of exactly 0 is an inlier. Read as a logit ('> 0'), INT8's scores, which its quantization grid puts on 0
    for rows just above it, were outliers there and the agreement counted flips the model never makes (an
    IsolationForest on 300 digits: 0.943 where the INT8 model's own label agreed with FP32's on 0.987 of the rows). It
    is now the agreement of the model's own labels."""
    rng = np.random.default_rng(5)
    features = rng.uniform(-1, 1, size=(ROWS, 4)).astype(np.float32)
    features[::3, 1:] = 0.0
    features[::3, 0] = rng.uniform(-0.0095, -0.0055, size=len(features[::3]))  # scores in (0.0005, 0.0045)
    model = _split_scores_model()
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, model, table(features), variants=[INT8],
                     model={"path": "model.onnx", "output": "scores"})  # fmt: skip
    results, _ = run_all(recipe, capsys)
    fp32 = plain_ort(tmp_path / "model.onnx", {"x": features})
    int8 = plain_ort(_variant_path(results, recipe, "int8"), {"x": features})
    assert np.count_nonzero((int8["scores"][:, 0] == 0) & (fp32["scores"][:, 0] > 0)) > 10  # ties '> 0' misreads
    expected = float(np.mean(int8["label"].ravel() == fp32["label"].ravel()))
    assert overall(results, "int8")["agreement"] == pytest.approx(expected, abs=1e-12)
    assert overall(results, "int8")["accuracy"] == pytest.approx(expected, abs=1e-12)  # no labels: against FP32
