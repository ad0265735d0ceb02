"""Models as other converters ship them: LightGBM through onnxmltools, through `qbench validate`, `sweep` and `gate`.

onnxmltools writes a LightGBM classifier's probabilities as Mul(scores, 1) behind its TreeEnsembleClassifier; every
figure is compared with LightGBM's own predictions.
"""

from __future__ import annotations

import numpy as np
import pytest
from task_projects import overall, project, run_all, table

pytestmark = pytest.mark.slow

lightgbm = pytest.importorskip("lightgbm", reason="LightGBM models: the dev extra installs lightgbm")
onnxmltools = pytest.importorskip("onnxmltools", reason="LightGBM to ONNX: the dev extra installs onnxmltools")
FP32_TWICE = [{"name": "fp32", "precision": "fp32"}, {"name": "fp32-again", "precision": "fp32"}]


def _lightgbm_onnx(classifier, features: np.ndarray, zipmap: bool):
    from onnxmltools.convert.common.data_types import FloatTensorType

    shape = [None, features.shape[1]]
    return onnxmltools.convert_lightgbm(classifier, initial_types=[("input", FloatTensorType(shape))], zipmap=zipmap,
                                        target_opset=15)  # fmt: skip


@pytest.mark.parametrize("classes", [("low", "mid", "high"), (1, 2, 5)], ids=["names", "ids-1-2-5"])
def test_a_lightgbm_classifier_without_zipmap_is_scored_by_its_own_classes(tmp_path, monkeypatch, capsys, classes):
    """Its class names were refused ('not integer class ids') and classes 1, 2, 5 read as column ids ('outside 0..2'):
    the class table stopped at onnxmltools' Mul by 1. Accuracy is LightGBM's own, read through the graph's classes."""
    from sklearn.datasets import load_wine

    features, ids = load_wine(return_X_y=True)
    features = features.astype(np.float32)
    labels = np.array(classes)[ids]
    classifier = lightgbm.LGBMClassifier(n_estimators=2, num_leaves=3, verbose=-1).fit(features[::3], labels[::3])
    monkeypatch.chdir(tmp_path)
    data = table(features, list(labels))
    recipe = project(tmp_path, _lightgbm_onnx(classifier, features, zipmap=False), data, variants=FP32_TWICE)
    results, _ = run_all(recipe, capsys)
    assert results.recipe["model_output"] == "probabilities"
    expected = float(np.mean(classifier.predict(features) == labels))
    assert 0.5 < expected < 1.0
    assert overall(results)["accuracy"] == pytest.approx(expected, abs=1e-12)
