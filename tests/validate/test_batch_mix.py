"""A variant whose rows' outputs follow their batch is judged also as it serves (qbench.validate.batch_mix)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.cli.app import main
from qbench.recipe.spec import load_recipe
from qbench.results.schema import AccuracyResult, SliceMetrics
from qbench.validate.batch_mix import (
    Arrangement,
    batch_dependence,
    run_arrangements,
    served_arrangements,
    worst_scopes,
)

WIDTH, LOUD = 16, 100.0


def _scope(name: str, accuracy: float, drop: float) -> SliceMetrics:
    return SliceMetrics(name, 10, {"accuracy": accuracy}, drops={"accuracy": drop})


def test_with_several_gated_metrics_the_arrangement_breaking_the_second_is_the_one_judged():
    """gate.metrics gates accuracy and mae (FP32: 0.9 and 2.0). Served alone, accuracy drops 0.02 more than evaluated
    while mae holds; in mixed batches accuracy holds and mae rises by 1.0 (half of FP32's). Weighed by accuracy alone
    the arrangement kept was the one where mae held, and the gate never saw mae's breach."""
    def scope(accuracy_drop: float, mae_drop: float) -> SliceMetrics:
        return SliceMetrics("overall", 10, {"accuracy": 0.9 - accuracy_drop, "mae": 2.0 + mae_drop},
                            drops={"accuracy": accuracy_drop, "mae": mae_drop})  # fmt: skip

    evaluated, alone, mixed = Arrangement(64, mixed=False), Arrangement(1, mixed=True), Arrangement(32, mixed=True)
    judged = {evaluated: AccuracyResult(10, 0, scope(0.0, 0.0)), alone: AccuracyResult(10, 0, scope(0.02, 0.0)),
              mixed: AccuracyResult(10, 0, scope(0.01, 1.0))}  # fmt: skip
    fp32 = AccuracyResult(10, 0, SliceMetrics("overall", 10, {"accuracy": 0.9, "mae": 2.0}))
    worst, chosen = worst_scopes(judged, ("accuracy", "mae"), fp32)
    assert chosen["overall"] == mixed and worst.overall.drops["mae"] == 1.0
    assert worst_scopes(judged, ("accuracy",), fp32)[1]["overall"] == alone  # one metric: its drop alone, as before


def test_worst_scopes_takes_each_scope_from_the_arrangement_where_it_drops_most():
    evaluated, alone, mixed = Arrangement(64, mixed=False), Arrangement(1, mixed=True), Arrangement(32, mixed=True)
    judged = {
        evaluated: AccuracyResult(20, 0, _scope("overall", 0.90, 0.01),
                                  (_scope("a", 0.9, 0.0), _scope("b", 0.9, 0.02))),
        alone: AccuracyResult(20, 1, _scope("overall", 0.89, 0.02), (_scope("a", 0.8, 0.1), _scope("b", 0.9, 0.02))),
        mixed: AccuracyResult(20, 0, _scope("overall", 0.85, 0.06), (_scope("a", 0.7, 0.2), _scope("b", 0.95, -0.03))),
    }  # fmt: skip
    worst, chosen = worst_scopes(judged, ("accuracy",))
    assert worst.overall.metrics == {"accuracy": 0.85} and chosen["overall"] == mixed
    assert [s.metrics["accuracy"] for s in worst.slices] == [0.7, 0.9]
    assert chosen["a"] == mixed and chosen["b"] == evaluated  # a tie keeps the earlier arrangement
    assert worst.nonfinite_outputs == worst.overall.nonfinite_outputs == 0


def test_worst_scopes_takes_nan_rows_fp32_lacks_first_and_counts_the_overall_it_took():
    """Alone, 2 rows' outputs turn NaN where FP32's are finite (the gate's breach whatever the drop) while fewer rows
    flip than in the evaluation's batches. The scope was taken by its drop alone (the evaluation's figures, no NaN:
    the breach unseen) and the result counted the NaN rows of another arrangement than its overall's, a record the
    gate rejects as invalid (exit 2): 'nonfinite_outputs ... (= overall's)'."""
    evaluated, alone = Arrangement(64, mixed=False), Arrangement(1, mixed=True)
    nan_rows = SliceMetrics("overall", 20, {"accuracy": 0.85}, drops={"accuracy": 0.05}, nonfinite_outputs=2,
                            new_nonfinite_outputs=2)  # fmt: skip
    judged = {evaluated: AccuracyResult(20, 0, _scope("overall", 0.80, 0.10), (_scope("a", 0.8, 0.1),)),
              alone: AccuracyResult(20, 2, nan_rows, (_scope("a", 0.9, 0.0),))}  # fmt: skip
    worst, chosen = worst_scopes(judged, ("accuracy",))
    assert chosen["overall"] == alone and worst.overall.new_nonfinite_outputs == 2
    assert worst.nonfinite_outputs == worst.overall.nonfinite_outputs == 2
    assert chosen["a"] == evaluated  # a slice with no NaN rows anywhere: its largest drop
    judged[alone] = AccuracyResult(20, 0, _scope("overall", 0.85, 0.05), (_scope("a", 0.9, 0.0),))
    worst, chosen = worst_scopes(judged, ("accuracy",))
    assert chosen["overall"] == evaluated and worst.nonfinite_outputs == 0


def test_worst_scopes_takes_a_nan_drop_it_cannot_pass():
    evaluated, mixed = Arrangement(8, mixed=False), Arrangement(8, mixed=True)
    judged = {evaluated: AccuracyResult(10, 0, _scope("overall", 0.9, 0.5)),
              mixed: AccuracyResult(10, 0, _scope("overall", float("nan"), float("nan")))}  # fmt: skip
    assert worst_scopes(judged, ("accuracy",))[1]["overall"] == mixed


def test_arrangements_are_named_and_each_gives_its_outputs_back_in_the_rows_order():
    assert Arrangement(1, mixed=True).describe() == "each row alone"
    assert Arrangement(32, mixed=True).describe() == "batches of 32, rows in a seeded mix (seed 0)"
    assert Arrangement(64, mixed=False).describe() == "batches of 64, in the evaluation rows' order"
    feeds = {"x": np.arange(10, dtype=np.float32)[:, None]}
    batches: list[list[float]] = []

    def run(fed: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
        batches.extend(fed["x"][start:start + size, 0].tolist() for start in range(0, len(fed["x"]), size))
        return {"y": fed["x"] * 2}

    ran = run_arrangements(run, feeds, [Arrangement(4, mixed=True)])
    assert ran[Arrangement(4, mixed=True)]["y"][:, 0].tolist() == [2.0 * i for i in range(10)]
    assert batches[0] != [0.0, 1.0, 2.0, 3.0] and sorted(sum(batches, [])) == list(range(10))


def _per_batch_scale(fed: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """Each row divided by its batch's largest magnitude, as a per-batch statistic would."""
    x = fed["x"]
    out = [x[s:s + size] / np.abs(x[s:s + size]).max() for s in range(0, len(x), size)]
    return {"y": np.concatenate(out)}


def test_batch_dependence_is_measured_whatever_built_the_variant():
    feeds = {"x": np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)}
    assert batch_dependence(lambda fed, size: {"y": fed["x"] * 3.0}, feeds, 64) is None
    seen = batch_dependence(_per_batch_scale, feeds, 64)
    assert seen is not None and "when fed alone instead of in a batch of 16 rows: the loudest and a seeded draw" in seen
    assert batch_dependence(_per_batch_scale, feeds, 1) is None  # the runner takes one row a batch: nothing to mix


def _two_layer_model(path: Path) -> None:
    rng = np.random.default_rng(3)
    weights = [numpy_helper.from_array(rng.normal(size=(WIDTH, 32)).astype(np.float32) / 4, "w1"),
               numpy_helper.from_array(rng.normal(size=(32, 4)).astype(np.float32) / 4, "w2")]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], weights)  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def _sorted_by_slice_project(root: Path, batch_sizes: list[int]) -> Path:
    """Evaluation rows sorted by slice (each batch of 64 holds one), the `loud` slice's inputs 100x the others."""
    rng = np.random.default_rng(0)
    quiet, loud = rng.normal(size=(192, WIDTH)), rng.normal(size=(192, WIDTH)) * LOUD
    x = np.concatenate([quiet[:64], loud[:64], quiet[64:], loud[64:]]).astype(np.float32)
    pd.DataFrame({"x": list(x), "split": ["calib"] * 128 + ["eval"] * 256,
                  "level": ["quiet"] * 64 + ["loud"] * 64 + ["quiet"] * 128 + ["loud"] * 128}).to_parquet(root / "d.parquet")
    _two_layer_model(root / "m.onnx")
    recipe = {
        "name": "mix", "task": "classification", "model": {"path": "m.onnx"},
        "data": {"path": "d.parquet", "inputs": {"x": "x"},
                 "calibration": {"filter": {"split": "calib"}, "samples": 128},
                 "evaluation": {"filter": {"split": "eval"}, "batch_size": 64}, "slices": [{"by": "level"}]},
        "variants": [{"name": "int8-dynamic", "precision": "int8", "calibrator": "dynamic"}],
        "latency": {"batch_sizes": batch_sizes, "warmup": 1, "iterations": 3, "threads": 1, "stability": None},
        "gate": {"metric": "agreement", "max_drop": 0.03, "max_slice_drop": 0.05}, "output_dir": "reports",
    }  # fmt: skip
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return root / "recipe.yaml"


def test_served_arrangements_are_the_latency_batch_sizes_mixed(tmp_path):
    recipe = load_recipe(_sorted_by_slice_project(tmp_path, [1, 32]))
    assert served_arrangements(recipe) == [Arrangement(1, mixed=True), Arrangement(32, mixed=True)]


def test_a_batch_dependent_variant_that_passes_on_one_slice_batches_breaches_as_served(tmp_path, monkeypatch, capsys):
    """Dynamic INT8 on rows sorted by slice: each evaluation batch of 64 holds one slice and keeps its own range, so
    the quiet rows keep their agreement; served in mixed batches of 32, a loud row coarsens every quiet row's
    quantization. The gate passed it (exit 0) before; it now judges the quiet slice where it is worst (exit 1)."""
    recipe = _sorted_by_slice_project(tmp_path, [1, 32])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["sweep", str(recipe), "--no-track"]) == 0
    assert main(["gate", str(recipe)]) == 1, capsys.readouterr().out
    results = json.loads(next((tmp_path / "reports").rglob("results.json")).read_text())
    variant = next(v for v in results["variants"] if v["variant"] == "int8-dynamic")
    quiet = next(s for s in variant["accuracy"]["slices"] if s["name"] == "level=quiet")
    assert quiet["drops"]["agreement"] > 0.05
    note = next(n for n in variant["notes"] if n.startswith("rows depend on their batch"))
    assert "level=quiet at batches of 32, rows in a seeded mix (seed 0)" in note
    assert "batches of 64, in the evaluation rows' order: agreement" in note and "each row alone: agreement" in note


@pytest.mark.parametrize("precision", ["fp16"])
def test_a_variant_whose_rows_do_not_follow_their_batch_is_judged_as_evaluated(tmp_path, monkeypatch, precision):
    recipe_path = _sorted_by_slice_project(tmp_path, [1, 32])
    data = yaml.safe_load(recipe_path.read_text())
    data["variants"] = [{"name": precision, "precision": precision}]
    recipe_path.write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["sweep", str(recipe_path), "--no-track"]) == 0
    results = json.loads(next((tmp_path / "reports").rglob("results.json")).read_text())
    variant = next(v for v in results["variants"] if v["variant"] == precision)
    assert not any(n.startswith("rows depend on their batch") for n in variant["notes"])


def _per_batch_12_bit(fed: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """Each batch rounded to 12 bits of its own largest magnitude, as a per-batch quantization scale does."""
    x = fed["x"].astype(np.float64)
    out = []
    for start in range(0, len(x), size):
        batch = x[start:start + size]
        step = np.abs(batch).max() / 2047
        out.append(np.round(batch / step) * step)
    return {"y": np.concatenate(out)}


def test_a_rare_loud_slice_that_coarsens_a_batch_is_seen_where_quiet_batches_show_nothing():
    """10 loud rows among 500: batches of quiet rows alone round within a thousandth of each row, a batch holding a
    loud row moves every quiet row by a loud row's step. A seeded draw of 16 rows held none of them, and a tolerance
    taken of the loudest row's magnitude hid the quiet rows' move where it did."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 8))
    x[rng.choice(500, 10, replace=False)] *= 100
    feeds = {"x": x.astype(np.float32)}
    quiet = {"x": feeds["x"][np.abs(feeds["x"]).max(axis=1) < 20]}
    assert batch_dependence(_per_batch_12_bit, quiet, 64) is None  # quiet rows alone: within tolerance
    seen = batch_dependence(_per_batch_12_bit, feeds, 64)
    assert seen is not None and "(the row's values reach" in seen


def test_a_served_arrangement_that_cannot_be_scored_fails_the_variant_not_the_sweep(tmp_path, monkeypatch):
    """A recipe's metric that raises on every scope of a served arrangement's outputs (and not on the evaluation's)
    fails that variant as its evaluation's would: recorded failed, results written, the sweep's exit 2 naming it. It
    escaped measure() before: the sweep stopped on 'error: custom metric ...' with no results at all."""
    from qbench.tasks.base import MetricError
    from qbench.validate import measure

    recipe = _sorted_by_slice_project(tmp_path, [1, 32])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    scored = measure.evaluate_accuracy

    def raising_when_served(*args, **kwargs):
        if kwargs.get("precision") == "int8":  # the variant's evaluation is scored first, then each arrangement
            calls.append(len(calls))
            if len(calls) > 1:
                raise MetricError("custom metric 'strict' failed: ValueError: served (on overall, 256 rows)", "strict")
        return scored(*args, **kwargs)

    calls: list[int] = []

    monkeypatch.setattr(measure, "evaluate_accuracy", raising_when_served)
    assert main(["sweep", str(recipe), "--no-track"]) == 2  # a measurement failed
    results = json.loads(next((tmp_path / "reports").rglob("results.json")).read_text())
    assert [v["status"] for v in results["variants"]] == ["ok", "failed"]
    variant = next(v for v in results["variants"] if v["variant"] == "int8-dynamic")
    assert variant["status"] == "failed" and "scoring failed: custom metric 'strict' failed" in variant["error"]
    assert len(calls) == 2  # the evaluation's scoring, then the first served arrangement's, which raised
