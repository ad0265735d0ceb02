"""Label errors of a recipe that leaves `task` to its default: scikit-learn regressors converted by skl2onnx, whose
float targets were refused as class ids (or as token labels) with no word that the recipe sets no task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pandas as pd
import pytest
import yaml

from qbench.cli.app import main

skl2onnx = pytest.importorskip("skl2onnx")
sklearn_datasets = pytest.importorskip("sklearn.datasets")

HINT = "the recipe sets no task, so these labels were read as class ids (task: classification)"


def _diabetes() -> tuple[np.ndarray, np.ndarray]:
    features, targets = sklearn_datasets.load_diabetes(return_X_y=True)
    return features.astype(np.float32)[:120], targets[:120]


def _project(root: Path, model: onnx.ModelProto, features: np.ndarray, labels: Any, **recipe: Any) -> Path:
    """model.onnx + data.parquet (input column x, label column y) + recipe.yaml with one FP16 variant."""
    onnx.save(model, str(root / "model.onnx"))
    pd.DataFrame({"x": list(features), "y": labels}).to_parquet(root / "data.parquet")
    body = {"name": "labels", "model": {"path": "model.onnx"},
            "data": {"path": "data.parquet", "inputs": {"x": model.graph.input[0].name}, "label": "y"},
            "variants": [{"name": "fp16", "precision": "fp16"}], "output_dir": str(root / "reports"), **recipe}
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _converted(estimator: Any, features: np.ndarray) -> onnx.ModelProto:
    return skl2onnx.to_onnx(estimator, features[:1], target_opset={"": 17, "ai.onnx.ml": 3})


def _validated(recipe: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["validate", str(recipe)])
    shown = capsys.readouterr()
    return code, " ".join((shown.out + shown.err).split())


def _polynomial_ridge(features: np.ndarray, targets: np.ndarray) -> onnx.ModelProto:
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import PolynomialFeatures

    return _converted(make_pipeline(PolynomialFeatures(2), Ridge()).fit(features, targets), features)


def _two_target_ridge(features: np.ndarray, targets: np.ndarray) -> tuple[onnx.ModelProto, np.ndarray]:
    from sklearn.linear_model import Ridge
    from sklearn.multioutput import MultiOutputRegressor

    both = np.stack([targets, targets * 0.5 + features[:, 0] * 100.0], axis=1)
    return _converted(MultiOutputRegressor(Ridge()).fit(features, both), features), both


def test_whole_float_targets_of_a_regressor_say_the_task_was_left_to_its_default(tmp_path, capsys):
    """Diabetes' targets (151.0, 75.0, ...) on a PolynomialFeatures + Ridge pipeline's [N, 1] output were 'class ids
    outside 0..1' and nothing more; the error now says the recipe sets no task, and with task: regression it loads."""
    features, targets = _diabetes()
    model = _polynomial_ridge(features, targets)
    code, shown = _validated(_project(tmp_path, model, features, targets), capsys)
    assert code == 2 and "data.label" in shown and "hold class ids outside 0..1" in shown, shown
    assert HINT in shown and "set task: regression" in shown, shown
    code, shown = _validated(_project(tmp_path, model, features, targets, task="regression"), capsys)
    assert code == 0, shown


def test_a_list_of_float_targets_per_row_is_not_only_called_token_labels(tmp_path, capsys):
    """A MultiOutputRegressor's two targets per row were read as token labels ('row 0 holds token label 79.3...:
    expected integer class ids'), the task left unsaid."""
    features, targets = _diabetes()
    model, both = _two_target_ridge(features, targets)
    code, shown = _validated(_project(tmp_path, model, features, list(both)), capsys)
    assert code == 2 and "token label" in shown and HINT in shown, shown
    code, shown = _validated(_project(tmp_path, model, features, list(both), task="regression"), capsys)
    assert code == 0, shown


@pytest.mark.parametrize(
    ("labels", "recipe"),
    [(lambda t: t, {"task": "classification"}),  # stated: the recipe meant class ids
     (lambda t: (t > 140).astype(np.int64) + 2, {}),  # integer ids beyond the classes: a classifier's labels
     (lambda t: np.where(np.arange(len(t)) % 9 == 0, np.nan, (t > 140) + 2.0), {})],  # an integer column with gaps
    ids=["task-stated", "integer-ids", "whole-floats-with-gaps"],
)
def test_labels_that_are_class_ids_or_a_stated_task_get_no_task_hint(tmp_path, capsys, labels, recipe):
    features, targets = _diabetes()
    code, shown = _validated(_project(tmp_path, _polynomial_ridge(features, targets), features, labels(targets),
                                      **recipe), capsys)  # fmt: skip
    assert code == 2 and "data.label" in shown and HINT not in shown, shown
