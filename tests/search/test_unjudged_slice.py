"""A slice the gate judges that no selection row falls in: the INT8 search cannot weigh a candidate there, and says so.

A calibration file of clean rows only (the evaluation holds noisy rows at 3x the scale): a static candidate calibrated
on the clean rows clips the noisy ones, passes on the selection rows, which hold no noisy row, and the gate blocks it on
condition=noisy. Before, the search's report judged condition=clean alone and never named condition=noisy."""

from __future__ import annotations

import numpy as np
import onnx
import pandas as pd
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.gate.evaluate import EXIT_BREACH
from qbench.recipe.spec import load_recipe
from qbench.sweep.runner import run_sweep
from tests.explain.test_sensitivity import SEARCH_BUDGET_S

WIDTH, HIDDEN = 16, 64


def _mlp(path):
    rng = np.random.default_rng(0)
    weights = {"w1": rng.normal(size=(WIDTH, HIDDEN)) / 4, "w2": rng.normal(size=(HIDDEN, 4)) / 8}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="head")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def _rows(count, noisy_share, rng):
    x = rng.normal(size=(count, WIDTH)).astype(np.float32)
    noisy = rng.random(count) < noisy_share
    x[noisy] *= 3.0
    return pd.DataFrame({"x": list(x), "condition": np.where(noisy, "noisy", "clean")})


def _searched(tmp_path, *, calibration_noisy, gate=None):
    _mlp(tmp_path / "model.onnx")
    rng = np.random.default_rng(1)
    _rows(400, 0.3, rng).to_parquet(tmp_path / "eval.parquet")
    _rows(300, calibration_noisy, rng).to_parquet(tmp_path / "calib.parquet")
    recipe = {
        "name": "unjudged", "task": "classification", "model": {"path": "model.onnx"},
        "data": {"path": "eval.parquet", "inputs": {"x": "x"}, "calibration": {"path": "calib.parquet", "samples": 128},
                 "evaluation": {"batch_size": 50}, "slices": [{"by": "condition"}]},
        "variants": [], "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 5, "threads": 1},
        "gate": {"metric": "agreement", "max_drop": 0.05, "max_slice_drop": 0.05, "unresolved": "note", **(gate or {})},
        "search": {"time_budget_s": SEARCH_BUDGET_S, "techniques": ["ort-static"], "max_keep_float": 0},
        "tracking": {"uri": f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"}, "output_dir": "reports",
    }  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return run_sweep(load_recipe(tmp_path / "recipe.yaml"), track=False)


def test_a_slice_no_selection_row_falls_in_is_named_by_the_search(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outcome = _searched(tmp_path, calibration_noisy=0.0)  # the condition column, but no noisy row
    report = outcome.results.search
    assert outcome.results.calibration.selection_rows == 172  # the 300 rows of the file less the 128 drawn
    chosen = report.candidates[report.chosen]
    assert chosen.passed and chosen.worst_slice == "condition=clean"  # the only slice the selection rows hold
    said = "none of them in condition=noisy (the choice could not weigh a candidate there)"
    assert said in report.notes[0]
    variant = outcome.results.find("int8-search", "onnxruntime-cpu")
    assert any(said in note for note in variant.notes)
    assert said in outcome.report_path.read_text()
    noisy = next(c for c in outcome.gate.checks if c.scope == "condition=noisy" and c.metric == "agreement")
    assert noisy.status == "breach" and outcome.gate.exit_code == EXIT_BREACH  # what the search could not see


def test_a_slice_the_selection_rows_hold_too_few_of_for_min_slice_size_is_named_too(tmp_path, monkeypatch):
    """A few noisy calibration rows: the selection rows hold some, fewer than gate.min_slice_size, so the search
    judges the slice nowhere, as if it were absent."""
    monkeypatch.chdir(tmp_path)
    outcome = _searched(tmp_path, calibration_noisy=0.03, gate={"min_slice_size": 20})
    report = outcome.results.search
    chosen = report.candidates[report.chosen]
    assert chosen.passed and chosen.worst_slice == "condition=clean"
    assert "fewer than gate.min_slice_size of them in condition=noisy (the choice could not" in report.notes[0]
    assert "none of them in" not in report.notes[0]
    noisy = next(c for c in outcome.gate.checks if c.scope == "condition=noisy" and c.metric == "agreement")
    assert noisy.status == "breach" and outcome.gate.exit_code == EXIT_BREACH
