"""The INT8 search on a slice where no gated metric can show a drop (FP32 wrong on every row of it, gated on
accuracy): its pick's pass says nothing of that slice, and the search says so as the gate does.

Before, the search kept its pick as "passed" (`search.outcome` "passed") and `qbench gate` then exited 2 on the same
results ("not judged on group=hard"): the search's report and the gate disagreed."""

from __future__ import annotations

import numpy as np
import onnx
import pandas as pd
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.gate.evaluate import EXIT_UNUSABLE
from qbench.gate.resolution import PASS_UNRESOLVED
from qbench.recipe.spec import load_recipe
from qbench.sweep.runner import run_sweep
from tests.explain.test_sensitivity import SEARCH_BUDGET_S

WIDTH, HIDDEN, CLASSES, ROWS = 8, 32, 4, 600


def _model_and_rows(tmp_path) -> None:
    """An MLP and rows labelled by its own answers, but for group=hard (a sixth of them), labelled by the class after
    its answer: FP32's accuracy there is 0, its worst."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.normal(size=(WIDTH, HIDDEN)) / 2, rng.normal(size=(HIDDEN, CLASSES)) / 4
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", CLASSES])],
        initializer=[numpy_helper.from_array(w.astype(np.float32), name) for name, w in (("w1", w1), ("w2", w2))],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(tmp_path / "model.onnx"))  # fmt: skip
    x = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    answers = (np.maximum(x @ w1.astype(np.float32), 0) @ w2.astype(np.float32)).argmax(axis=1)
    hard = np.arange(ROWS) % 6 == 0
    labels = np.where(hard, (answers + 1) % CLASSES, answers)
    pd.DataFrame({"x": list(x), "y": labels, "group": np.where(hard, "hard", "easy")}).to_parquet(tmp_path / "rows.parquet")


def test_a_pick_that_says_nothing_of_a_slice_is_not_passed_by_the_search_where_the_gate_holds_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _model_and_rows(tmp_path)
    recipe = {
        "name": "unjudged-pick", "task": "classification", "model": {"path": "model.onnx"},
        "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "y", "slices": [{"by": "group"}],
                 "evaluation": {"batch_size": 50}},
        "variants": [], "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 3, "threads": 1},
        "gate": {"metric": "accuracy", "max_drop": 0.2, "max_slice_drop": 0.3},
        "search": {"time_budget_s": SEARCH_BUDGET_S, "techniques": ["ort-static"], "max_keep_float": 0},
        "tracking": {"uri": f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"}, "output_dir": "reports",
    }  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    outcome = run_sweep(load_recipe(tmp_path / "recipe.yaml"), track=False)
    gate = outcome.gate
    assert gate.exit_code == EXIT_UNUSABLE
    assert any("int8-search@" in p and "not judged on group=hard" in p for p in gate.problems), gate.problems
    report = outcome.results.search
    assert report.outcome == "unresolved" and report.chosen is None
    picked = report.candidates[report.closest]
    assert picked.passed and "not judged on group=hard" in picked.unresolved
    assert any("not judged on group=hard" in note and "gate.unresolved: fail" in note for note in report.notes)
    variant = outcome.results.find("int8-search", "onnxruntime-cpu")
    assert variant.params["search.outcome"] == PASS_UNRESOLVED
