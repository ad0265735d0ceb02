"""Unsupervised scikit-learn models converted by skl2onnx, through `qbench validate`, `sweep` and `gate`: KMeans judged
by its distances (whose label is their ArgMin) and an IsolationForest by its label (-1 outlier, 1 inlier, no class
table). Every figure is recomputed from scikit-learn's predictions and from the variant model's own outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from task_projects import INT8, iris, overall, plain_ort, project, run_all, table

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
    assert overall(results)["accuracy"] == pytest.approx(float(np.mean(labels == clusters.predict(features))), abs=1e-12)
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
