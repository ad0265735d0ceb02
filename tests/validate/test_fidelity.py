"""Emulated vs native figures end to end: a tiny model that overflows FP16 on one slice, swept on ORT CPU.

The sweep must score FP16 on its emulation (non-finite outputs on the overflowing slice, a gate
breach there), say "emulated" for FP16/BF16/FP8 and "native" for FP32/INT8 in results.json,
report.md and MLflow, and every saved model must give the measured figures when loaded with
default ONNX Runtime session options.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient
from onnx import TensorProto, helper, numpy_helper

from qbench.preflight.prepare import prepare
from qbench.recipe.spec import load_recipe
from qbench.results.schema import EMULATED, NATIVE, read_results
from qbench.sweep.runner import run_sweep

ROWS_PER_BAND = 40
BIG_INPUT = 500.0  # hidden = 300 x 500 = 1.5e5 > 65504: FP16 overflows on band=big only


def _write_model(path: Path) -> None:
    """x[4] -> MatMul(300 I) -> Relu -> MatMul(I / 300) -> logits[4]; FP32 logits == relu(x)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "up"], ["hidden"]), helper.make_node("Relu", ["hidden"], ["r"]),
         helper.make_node("MatMul", ["r", "down"], ["logits"])],
        "overflow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.eye(4, dtype=np.float32) * 300, "up"),
         numpy_helper.from_array(np.eye(4, dtype=np.float32) / 300, "down")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))


def _write_project(root: Path) -> Path:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, size=(2 * ROWS_PER_BAND, 4)).astype(np.float32)
    labels = x.argmax(axis=1)
    band = np.array(["small"] * ROWS_PER_BAND + ["big"] * ROWS_PER_BAND, dtype=object)
    x[ROWS_PER_BAND:, 2] = BIG_INPUT  # the winning class of every big row is 2
    labels[ROWS_PER_BAND:] = 2
    # calibration sees small rows only: FP16 keeps in FP32 what overflows on the calibration sample, so the
    # overflow it cannot foresee is on rows beyond it
    subset = np.where(np.arange(len(x)) % 4 == 0, "calib", "eval")
    _write_model(root / "overflow.onnx")
    pd.DataFrame({"x": list(x), "label": labels, "band": band, "subset": subset}).to_parquet(root / "rows.parquet")
    recipe = {
        "name": "overflow", "task": "classification", "model": {"path": "overflow.onnx"},
        "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "label",
                 "calibration": {"filter": {"subset": "calib", "band": "small"}, "samples": 10, "batch_size": 10},
                 "evaluation": {"filter": {"subset": "eval"}, "batch_size": 16}, "slices": [{"by": "band"}]},
        "variants": [{"name": "fp16", "precision": "fp16"}, {"name": "bf16", "precision": "bf16"},
                     {"name": "fp8", "precision": "fp8", "calibrator": "minmax"},
                     {"name": "int8", "precision": "int8", "calibrator": "minmax"}],
        "backends": ["onnxruntime-cpu"],
        "latency": {"batch_sizes": [1, 4], "warmup": 1, "iterations": 3, "threads": 1},
        "gate": {"metric": "accuracy", "max_drop": 0.5, "max_slice_drop": 0.05, "applies_to": ["fp16"]},
        "tracking": {"uri": f"sqlite:///{root / 'mlflow.db'}"},
        "output_dir": str(root / "reports"),
    }  # fmt: skip
    path = root / "overflow.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("fidelity")
    recipe = _write_project(root)
    return recipe, run_sweep(recipe)


def test_fp16_overflow_shows_on_its_slice_and_breaches_the_gate(swept):
    _, outcome = swept
    fp16 = outcome.results.find("fp16", "onnxruntime-cpu")
    big = fp16.accuracy.slice("band=big")
    small = fp16.accuracy.slice("band=small")
    assert fp16.accuracy.nonfinite_outputs == big.size == ROWS_PER_BAND * 3 // 4
    assert small.metrics["accuracy"] == 1.0 and big.metrics["accuracy"] < 1.0
    breached = {(c.variant, c.scope) for c in outcome.gate.breaches}
    assert ("fp16", "band=big") in breached and ("fp16", "band=small") not in breached
    assert outcome.gate.exit_code == 1


def test_results_report_and_mlflow_say_which_figures_are_emulated(swept):
    recipe, outcome = swept
    results = read_results(outcome.results_path)
    expected = {"fp32": NATIVE, "int8": NATIVE, "fp16": EMULATED, "bf16": EMULATED, "fp8": EMULATED}
    for variant in results.variants:
        assert (variant.fidelity.accuracy, variant.fidelity.latency) == (expected[variant.variant],) * 2, variant.key
    fp16 = results.find("fp16", "onnxruntime-cpu")
    assert fp16.evaluated_model_path.endswith("fp16.emulated.onnx") and fp16.model_path.endswith("fp16.onnx")
    assert results.find("fp8", "onnxruntime-cpu").evaluated_model_path is None

    report = outcome.report_path.read_text()
    row = next(line for line in report.splitlines() if line.startswith("| fp16 "))
    assert "| emulated |" in row
    assert "| native |" in next(line for line in report.splitlines() if line.startswith("| int8 "))
    assert "**fp16@onnxruntime-cpu** figures emulated, not native: FP16 emulated" in report

    client = MlflowClient(load_recipe(recipe).tracking.uri)
    runs = client.search_runs([client.get_experiment_by_name("overflow").experiment_id])
    params = {r.data.params["variant"]: r.data.params for r in runs if "variant" in r.data.params}
    assert {name: p["fidelity.accuracy"] for name, p in params.items()} == expected
    assert params["fp16"]["fidelity.latency"] == EMULATED and "float16" in params["fp16"]["fidelity.method"]


def test_every_saved_model_gives_the_measured_accuracy_under_default_options(swept):
    recipe, outcome = swept
    prepared = prepare(load_recipe(recipe))
    feeds = prepared.evaluation_feeds
    for variant in outcome.results.variants:
        path = variant.evaluated_model_path or variant.model_path
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])  # plain defaults
        outputs = session.run(None, feeds)[prepared.output_index]
        finite = np.all(np.isfinite(outputs), axis=1)
        correct = finite & (outputs.argmax(axis=1) == prepared.labels)
        assert correct.mean() == pytest.approx(variant.accuracy.overall.metrics["accuracy"]), variant.key
        assert int((~finite).sum()) == variant.accuracy.nonfinite_outputs, variant.key
