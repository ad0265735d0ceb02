"""A model exported with a fixed batch dimension (input [8, 16], as converters often write it), swept end to end.

Every run feeds exactly 8 rows: 101 evaluation rows and 30 calibration rows end in a partial batch, filled with
repeats whose outputs are dropped, so accuracy is that of the 101 real rows; the batch sizes the recipe leaves out
take the model's batch, and the gate expects a latency point at that batch alone. The same MLP with a symbolic
batch axis keeps the recipe's defaults.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.cli.app import main
from qbench.gate.run import latest_results
from qbench.recipe.spec import load_recipe
from qbench.results.schema import SweepResults, content_digest, read_results
from tests.explain.test_sensitivity import SEARCH_BUDGET_S

BATCH = 8
ROWS = 101  # 12 batches of 8 and one of 5
RNG = np.random.default_rng(3)
WEIGHTS = [RNG.normal(size=(16, 32)), RNG.normal(size=32), RNG.normal(size=(32, 4)), RNG.normal(size=4)]
FEATURES = RNG.normal(size=(ROWS, 16)).astype(np.float32)


def logits(x: np.ndarray) -> np.ndarray:
    w1, b1, w2, b2 = WEIGHTS
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


def mlp(batch: int | str) -> onnx.ModelProto:
    """16 -> 32 -> ReLU -> 4, its batch axis fixed (an int) or symbolic (a name)."""
    names = ["w1", "b1", "w2", "b2"]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["logits"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 4])],
        [numpy_helper.from_array(w.astype(np.float32), n) for w, n in zip(WEIGHTS, names, strict=True)],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def labels() -> np.ndarray:
    """FP32's top-1, with every 7th row moved to another class: FP32 scores below 1, so dropped rows would show."""
    top = logits(FEATURES).argmax(1)
    return np.where(np.arange(ROWS) % 7 == 0, (top + 1) % 4, top)


def project(root: Path, batch: int | str, **changes: Any) -> Path:
    root.mkdir()
    onnx.save(mlp(batch), str(root / "mlp.onnx"))
    group = np.where(np.arange(ROWS) % 3 == 0, "a", "b")
    pd.DataFrame({"x": list(FEATURES), "y": labels(), "g": group}).to_parquet(root / "rows.parquet")
    recipe: dict[str, Any] = {
        "name": "mlp", "task": "classification", "model": {"path": "mlp.onnx"},
        "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "y", "slices": [{"by": "g"}],
                 "calibration": {"samples": 30, "overlap": "allow"}},  # every row evaluated
        "variants": [{"name": "fp16", "precision": "fp16"},
                     {"name": "int8", "precision": "int8", "calibrator": "minmax"},
                     {"name": "int8-dynamic", "precision": "int8", "calibrator": "dynamic"}],
        "latency": {"warmup": 1, "iterations": 3, "threads": 1, "stability": None},
        "analysis": {"ranges": True},
        "gate": {"metric": "accuracy", "max_drop": 0.5, "max_slice_drop": 0.5}, "output_dir": "reports",
        **changes,
    }  # fmt: skip
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def sweep(recipe: Path, capsys: pytest.CaptureFixture[str]) -> SweepResults:
    assert main(["validate", str(recipe)]) == 0, capsys.readouterr()
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 0, capsys.readouterr()
    assert main(["gate", str(recipe)]) == 0, capsys.readouterr()  # the results are not stale against the recipe
    return read_results(latest_results(load_recipe(recipe)))


def dynamic_twin(path: Path, target: Path) -> Path:
    """A built variant with its batch axis made symbolic, to run all rows at once in a plain session."""
    model = onnx.load(str(path))
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(model, str(target))
    return target


def top1(path: Path) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": FEATURES})[0].argmax(1)


def test_a_fixed_batch_model_is_swept_on_exactly_its_rows(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    search = {"time_budget_s": SEARCH_BUDGET_S, "techniques": ["ort-static", "ort-dynamic"], "screen_rows": 10,
              "max_keep_float": 0}
    results = sweep(project(tmp_path / "fixed", BATCH, search=search), capsys)
    assert results.recipe["latency"]["batch_sizes"] == [BATCH]
    assert results.evaluation_rows == ROWS and results.calibration.size == 30
    truth = labels()
    for result in results.variants:
        assert result.status == "ok", (result.key, result.error)
        assert [p.batch_size for p in result.latency.points] == [BATCH]
        assert result.latency.first_run_ms > 0
        assert result.accuracy.rows == ROWS
        assert sum(s.size for s in result.accuracy.slices) == ROWS
    fp32 = results.find("fp32", "onnxruntime-cpu").accuracy.overall.metrics["accuracy"]
    assert fp32 == pytest.approx(float(np.mean(logits(FEATURES).argmax(1) == truth)), abs=1e-12)
    assert fp32 < 1.0
    int8 = results.find("int8", "onnxruntime-cpu")
    twin = dynamic_twin(Path(int8.model_path), tmp_path / "int8-dynamic-batch.onnx")
    assert int8.accuracy.overall.metrics["accuracy"] == pytest.approx(float(np.mean(top1(twin) == truth)), abs=1e-12)
    assert results.search is not None and any(c.stage == "evaluated" for c in results.search.candidates)
    assert results.ranges is not None and results.ranges.rows == ROWS

    # a passing variant exports to Triton unbatched: a request is one whole batch, as qbench timed it
    recipe = tmp_path / "fixed" / "recipe.yaml"
    assert main(["export", "triton", str(recipe), "--variant", "fp16", "--backend", "onnxruntime-cpu", "--to",
                 str(tmp_path / "repository"), "--force"]) == 0, capsys.readouterr()  # fmt: skip
    config = (tmp_path / "repository" / "mlp-fp16" / "config.pbtxt").read_text()
    assert "max_batch_size: 0" in config and "dynamic_batching" not in config and f"dims: [ {BATCH}, " in config


def edited_copy(results: Path, target: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of results.json changed by `edit` and signed again, as a careful editor would."""
    raw = json.loads(results.read_text())
    edit(raw)
    raw["digest"] = content_digest(raw)
    target.write_text(json.dumps(raw))
    return target


def gate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["gate", *argv])
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())


def test_the_gate_expects_a_fixed_batch_models_one_batch_and_no_other(tmp_path, monkeypatch, capsys):
    """The recipe leaves latency.batch_sizes out (its default is 1, 32): the sweep times the model's batch alone, and
    the gate, reading the model (or, with its inputs unchecked, the results' record of one batch), asks for exactly
    that point: none missing, none at a batch size the model cannot take."""
    monkeypatch.chdir(tmp_path)
    int8 = {"name": "int8", "precision": "int8", "calibrator": "minmax"}
    recipe = project(tmp_path / "fixed", BATCH, variants=[int8])
    sweep(recipe, capsys)
    results = latest_results(load_recipe(recipe))
    assert gate(capsys, "--results", str(results))[0] == 0
    assert gate(capsys, "--results", str(results), "--no-staleness-check")[0] == 0

    def drop_int8_point(raw: dict[str, Any]) -> None:
        result = next(v for v in raw["variants"] if v["variant"] == "int8")
        result["latency"]["points"] = []

    dropped = edited_copy(results, tmp_path / "dropped.json", drop_int8_point)
    for flags in ((), ("--no-staleness-check",)):
        code, shown = gate(capsys, "--results", str(dropped), *flags)
        assert code == 2, shown
        assert "int8@onnxruntime-cpu: latency: no point at batch size 8; the sweep times batch size 8" in shown

    def relabel_as_batch_one(raw: dict[str, Any]) -> None:  # a batch of 1 the model cannot run, everywhere
        raw["recipe"]["latency"]["batch_sizes"] = [1]
        for result in raw["variants"]:
            result["latency"]["points"][0]["batch_size"] = 1

    code, shown = gate(capsys, "--results", str(edited_copy(results, tmp_path / "one.json", relabel_as_batch_one)))
    assert code == 2, shown
    assert "recipe.latency.batch_sizes: the results record [1], but a sweep of the recipe times batch size 8" in shown
    assert "fp32@onnxruntime-cpu: latency: no point at batch size 8; the sweep times batch size 8" in shown


def test_a_batch_size_the_recipe_sets_otherwise_is_one_line_naming_the_field(tmp_path, capsys):
    recipe = project(tmp_path / "fixed", BATCH, latency={"batch_sizes": [1, 8], "iterations": 3})
    assert main(["validate", str(recipe)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (f"{recipe}: latency.batch_sizes: model input 'x' has a fixed batch dimension of 8 (shape [8, 16]), so it "
            "runs batches of 8 only; expected latency.batch_sizes: [8] (now [1, 8])") in err  # fmt: skip


def test_a_symbolic_batch_axis_keeps_the_recipes_batch_sizes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    results = sweep(project(tmp_path / "symbolic", "batch", variants=[{"name": "int8", "precision": "int8", "calibrator": "minmax"}]), capsys)
    assert results.recipe["latency"]["batch_sizes"] == [1, 32]
    fp32 = results.find("fp32", "onnxruntime-cpu")
    assert [p.batch_size for p in fp32.latency.points] == [1, 32]
    assert fp32.accuracy.overall.metrics["accuracy"] == pytest.approx(float(np.mean(logits(FEATURES).argmax(1) == labels())), abs=1e-12)


def test_a_fixed_batch_model_is_served_under_load(tmp_path, monkeypatch, capsys):
    """A rate budget on a model with its batch fixed at 8: the real server behind the dynamic batcher sends every
    batch of requests filled up to 8 rows (the model refuses any other count), so each variant gets its figures under
    load instead of failing, and the gate judges them."""
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path / "fixed", BATCH, variants=[{"name": "fp16", "precision": "fp16"}],
                     latency={"warmup": 2, "iterations": 100, "threads": 1, "stability": None},
                     slo={"p99_ms": 50, "rate_rps": 200,
                          "load": {"max_queue_delay_ms": 1, "requests": 1000}})  # fmt: skip
    results = sweep(recipe, capsys)
    for result in results.variants:
        assert result.status == "ok", (result.key, result.error)
        serving = result.serving
        assert serving.max_batch_size == BATCH and serving.at_rate is not None
        assert serving.max_rate_rps is not None and serving.at_max_rate.p99_ms <= 50
