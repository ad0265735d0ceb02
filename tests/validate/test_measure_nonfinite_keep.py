"""`data.nonfinite_inputs: keep` end to end: a model that reads NaN as missing is swept and gated on every row, the
rows with a missing value judged apart (`missing:<column>`) and counted in results.json, report.md and MLflow's
metrics; a model whose FP32 outputs turn NaN on those rows is refused in one line naming the column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from qbench.cli.app import main
from qbench.gate.run import latest_results
from qbench.recipe.spec import load_recipe
from qbench.results.schema import read_results
from qbench.track.content import sweep_metrics

ROWS, CALIBRATION = 80, 24


def _project(root: Path, *, reads_nan: bool) -> tuple[Path, pd.DataFrame]:
    """A 3 -> 2 linear classifier, reading NaN as 0 (IsNaN + Where) or not; `x[:, 1]` NaN in about 60 % of rows."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = rng.normal(size=(3, 2)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["f" if reads_nan else "x", "w"], ["logits"])]
    if reads_nan:
        nodes = [helper.make_node("IsNaN", ["x"], ["gap"]), helper.make_node("Where", ["gap", "zero", "x"], ["f"]),
                 *nodes]  # fmt: skip
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 2])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.zeros((), np.float32), "zero")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(root / "m.onnx"))
    x = rng.normal(size=(ROWS, 3)).astype(np.float32)
    x[rng.random(ROWS) < 0.6, 1] = np.nan
    table = pd.DataFrame({"x": list(x), "y": np.argmax(np.nan_to_num(x) @ weights, axis=1),
                          "kind": ["a", "b"] * (ROWS // 2),
                          "split": ["calib"] * CALIBRATION + ["eval"] * (ROWS - CALIBRATION)})  # fmt: skip
    table.to_parquet(root / "rows.parquet")
    recipe = {
        "name": "gaps", "task": "classification", "model": {"path": "m.onnx"},
        "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "y", "nonfinite_inputs": "keep",
                 "slices": [{"by": "kind"}], "calibration": {"filter": {"split": "calib"}, "samples": CALIBRATION},
                 "evaluation": {"filter": {"split": "eval"}}},
        "variants": [{"name": "fp16", "precision": "fp16"}],
        "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 3, "threads": 1}, "analysis": {"ranges": False},
        "gate": {"metric": "accuracy", "max_drop": 0.5, "max_slice_drop": 0.5},
        "tracking": {"uri": f"sqlite:///{(root / 'mlflow.db').as_posix()}", "experiment": "gaps"},
        "output_dir": "reports",
    }  # fmt: skip
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return root / "recipe.yaml", table


def test_a_model_reading_nan_is_judged_on_every_row_with_the_missing_rows_apart(tmp_path: Path) -> None:
    recipe_path, table = _project(tmp_path, reads_nan=True)
    evaluated = table[table["split"] == "eval"]
    gaps = np.isnan(np.stack(evaluated["x"].to_numpy())).any(axis=1)
    assert main(["sweep", str(recipe_path)]) == 0
    path = latest_results(load_recipe(recipe_path))
    results = read_results(path)
    assert results.evaluation_rows == len(evaluated) and results.dropped_nonfinite == {}
    for variant in results.variants:
        scopes = {scope.name: scope.size for scope in variant.accuracy.slices}
        assert scopes["missing:x"] == int(gaps.sum())
    assert results.kept_nonfinite["evaluation"] == {"x": int(gaps.sum())}
    assert results.kept_nonfinite["slice:kind=a"] == {"x": int(gaps[evaluated["kind"].to_numpy() == "a"].sum())}
    calibration = table[table["split"] == "calib"]
    assert results.kept_nonfinite["calibration"] == {"x": int(np.isnan(np.stack(calibration["x"].to_numpy())).any(axis=1).sum())}
    assert f"**Rows with NaN/inf inputs fed (evaluation):** x {int(gaps.sum())}" in (path.parent / "report.md").read_text()
    assert sweep_metrics(results, None)["kept_nonfinite/evaluation/x"] == float(gaps.sum())
    assert main(["gate", str(recipe_path)]) == 0  # the gate re-derives the missing slice and the counts


def test_a_model_giving_nan_on_nan_inputs_is_refused_in_one_line(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    recipe_path, _ = _project(tmp_path, reads_nan=False)
    assert main(["validate", str(recipe_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "data.nonfinite_inputs" in err and "column 'x' holds NaN/inf" in err and "FP32 model gives NaN/inf outputs" in err


def test_the_rows_a_calibrator_is_chosen_on_are_counted_with_the_calibration_rows(tmp_path: Path) -> None:
    """`calibrator: auto` chooses on rows kept apart from the calibration sample: they are fed too, so every drawn row
    holding NaN is counted, under `calibration` (fitted on) or `selection` (chosen on)."""
    from qbench.preflight.prepare import prepare

    recipe_path, table = _project(tmp_path, reads_nan=True)
    recipe = yaml.safe_load(recipe_path.read_text())
    recipe["variants"] = [{"name": "int8", "precision": "int8", "calibrator": "auto"}]
    recipe_path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    prepared = prepare(load_recipe(recipe_path), track=False)
    calibration = table[table["split"] == "calib"]
    gaps = int(np.isnan(np.stack(calibration["x"].to_numpy())).any(axis=1).sum())
    kept = prepared.kept_nonfinite
    assert prepared.calibration.selection_rows and kept["selection"]["x"] > 0
    assert kept["calibration"]["x"] + kept["selection"]["x"] == gaps
