"""A calibrator registered from outside qbench (this module), after the calibration code was imported, is taken by
the recipe loader and calibrates a sweep's INT8 variant as the built-in calibrator of the same ONNX Runtime method."""

from __future__ import annotations

import pytest
import yaml
from tiny_linear import make_linear_project

import qbench.variants.calibrate  # noqa: F401  (imported before the registration, as in any long-lived process)
from qbench.cli.app import main
from qbench.gate.run import latest_results
from qbench.recipe.spec import load_recipe
from qbench.results.schema import read_results
from qbench.techniques import CALIBRATORS, Calibrator


@pytest.mark.slow
def test_a_calibrator_registered_by_a_plugin_calibrates_a_sweep(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(CALIBRATORS, "_entries", dict(CALIBRATORS._entries))
    CALIBRATORS.register("absmax", Calibrator("absmax", ("int8",), (), "MinMax", "max", "MinMaxObserver"))
    recipe = make_linear_project(tmp_path, "unused")
    body = yaml.safe_load(recipe.read_text())
    del body["tracking"]
    body["variants"].append({"name": "int8-absmax", "precision": "int8", "calibrator": "absmax"})
    recipe.write_text(yaml.safe_dump(body, sort_keys=False))
    loaded = load_recipe(recipe)
    assert loaded.variants[-1].technique_config.calibration.calibrator == "absmax"
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(recipe), "--no-track"]) == 0
    results = read_results(latest_results(loaded))
    minmax, absmax = (results.find(name, "onnxruntime-cpu") for name in ("int8-minmax", "int8-absmax"))
    assert minmax is not None and absmax is not None and absmax.status == "ok", absmax
    assert absmax.params["calibrator"] == "absmax"
    assert absmax.accuracy is not None and minmax.accuracy is not None
    assert absmax.accuracy.overall.metrics == minmax.accuracy.overall.metrics
