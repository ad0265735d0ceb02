"""Small user projects for the task tests: a model, a parquet table and a recipe written to a folder,
and the validate -> sweep -> gate round trip. A helper module, not a test module."""

from __future__ import annotations

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
from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, evaluate_gate
from qbench.gate.run import latest_results
from qbench.recipe.spec import load_recipe
from qbench.results.schema import SweepResults, read_results

ROWS = 150
INT8 = {"name": "int8", "precision": "int8", "calibrator": "minmax"}


# -- building projects ----------------------------------------------------------------------------


def iris() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_iris

    features, labels = load_iris(return_X_y=True)
    return features.astype(np.float32), labels.astype(np.int64)


def table(features: np.ndarray, label: Any = None, **columns: Any) -> pd.DataFrame:
    rows = len(features)
    table = pd.DataFrame({"x": list(features), "half": np.where(np.arange(rows) % 2 == 0, "even", "odd"), **columns})
    if label is not None:
        table["y"] = list(label) if np.ndim(label) > 1 else label
    return table


def project(root: Path, onnx_model: onnx.ModelProto, table: pd.DataFrame, **recipe: Any) -> Path:
    """model.onnx + data.parquet + recipe.yaml (input column x; slices by `half`; fp32 + one int8)."""
    root.mkdir(parents=True, exist_ok=True)
    onnx.save(onnx_model, str(root / "model.onnx"))
    table.to_parquet(root / "data.parquet")
    body: dict[str, Any] = {
        "name": "matrix",
        "model": {"path": "model.onnx"},
        "data": {
            "path": "data.parquet",
            "inputs": {"x": onnx_model.graph.input[0].name},
            "calibration": {"samples": 32, "overlap": "allow"},  # figures checked over every row
            "slices": [{"by": "half"}],
        },
        "variants": [INT8],
        "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 3},
        # 150 rows resolve no default tolerance (qbench.gate.resolution): these round trips are about the tasks, so
        # an unresolved pass is a note here, not exit 2
        "gate": {"unresolved": "note"},
        "output_dir": str(root / "reports"),
    }
    if "y" in table.columns:
        body["data"]["label"] = "y"
    for key, value in recipe.items():
        if key in body and isinstance(value, dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def run_all(recipe: Path, capsys: pytest.CaptureFixture[str]) -> tuple[SweepResults, str]:
    """validate (must pass), sweep without tracking, gate (must agree with the sweep's verdict)."""
    assert main(["validate", str(recipe)]) == 0, capsys.readouterr()
    sweep_code = main(["sweep", str(recipe), "--no-track", "--gate"])
    gate_code = main(["gate", str(recipe)])
    shown = capsys.readouterr()
    results = read_results(latest_results(load_recipe(recipe)))
    loaded = load_recipe(recipe)
    verdict = evaluate_gate(results, loaded.gate, slo=loaded.slo)  # complete results: judged, never unusable
    assert not verdict.problems and sweep_code == gate_code == (EXIT_BREACH if verdict.breaches else EXIT_PASS), shown
    return results, shown.out + shown.err


def said(message: str, output: str) -> bool:
    """`message` appears in console `output`, however rich folded the lines (whitespace is ignored)."""
    return "".join(message.split()) in "".join(output.split())


def overall(results: SweepResults, variant: str = "fp32") -> dict[str, float]:
    found = results.find(variant, "onnxruntime-cpu")
    assert found is not None and found.status == "ok" and found.accuracy is not None, found
    return dict(found.accuracy.overall.metrics)


def plain_ort(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def linear(name: str, inputs: int, outputs: int, seed: int) -> list[TensorProto]:
    rng = np.random.default_rng(seed)
    weight = rng.normal(size=(inputs, outputs)).astype(np.float32)
    bias = rng.normal(size=outputs).astype(np.float32)
    return [numpy_helper.from_array(weight, f"{name}_w"), numpy_helper.from_array(bias, f"{name}_b")]


def graph_model(nodes: list[onnx.NodeProto], inputs: list, outputs: list, initializers: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "matrix", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def argmax_first_model() -> onnx.ModelProto:
    """A 4 -> 3 linear classifier whose first output is the int64 class id, the second the logits."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    label = helper.make_tensor_value_info("label", TensorProto.INT64, [None])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 3])
    weights = fitted_linear(*iris())
    nodes = [
        helper.make_node("MatMul", ["x", "fc_w"], ["mm"]),
        helper.make_node("Add", ["mm", "fc_b"], ["logits"]),
        helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0),
    ]
    return graph_model(nodes, [x], [label, logits], weights)


def iris_logits_model(batch: int | None = None) -> onnx.ModelProto:
    """The iris-fitted 4 -> 3 linear classifier: input x [batch, 4], output logits [batch, 3] (None: a dynamic
    batch)."""
    features, labels = iris()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 3])
    nodes = [helper.make_node("MatMul", ["x", "fc_w"], ["mm"]), helper.make_node("Add", ["mm", "fc_b"], ["logits"])]
    return graph_model(nodes, [x], [logits], fitted_linear(features, labels))


def fitted_linear(features: np.ndarray, labels: np.ndarray) -> list[TensorProto]:
    from sklearn.linear_model import LogisticRegression

    fitted = LogisticRegression(max_iter=500).fit(features, labels)
    return [
        numpy_helper.from_array(fitted.coef_.T.astype(np.float32), "fc_w"),
        numpy_helper.from_array(fitted.intercept_.astype(np.float32), "fc_b"),
    ]
