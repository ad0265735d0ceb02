"""A tiny tracked project for the MLflow tests: a linear 4 -> 3 classifier (ONNX, built here), 120 rows, 2 slices.

Labels are the FP32 model's own top-1, so FP32 scores 1.0; the quick latency settings keep a sweep
to a few seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

ROWS = 120
CALIBRATION_ROWS = 32


def _linear_model(path: Path, weights: np.ndarray, bias: np.ndarray) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["logits"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def make_linear_project(root: Path, tracking_uri: str, *, experiment: str = "linear") -> Path:
    """The model, the table and a recipe (fp32, int8 minmax, fp16; gate on accuracy, loose) in `root`."""
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(4, 3)).astype(np.float32)
    bias = rng.normal(size=3).astype(np.float32)
    _linear_model(root / "linear.onnx", weights, bias)
    x = rng.normal(size=(ROWS, 4)).astype(np.float32)
    labels = np.argmax(x @ weights + bias, axis=1)
    group = np.where(np.arange(ROWS) % 3 == 0, "a", "b")  # 40 rows a, 80 rows b
    pd.DataFrame({"x": list(x), "y": labels, "group": group}).to_parquet(root / "rows.parquet")
    recipe: dict[str, Any] = {
        "name": "linear", "task": "classification", "model": {"path": "linear.onnx"},
        "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "y", "slices": [{"by": "group"}],
                 "calibration": {"samples": CALIBRATION_ROWS, "overlap": "allow"}},  # every row evaluated
        "variants": [{"name": "int8-minmax", "precision": "int8", "calibrator": "minmax"},
                     {"name": "fp16", "precision": "fp16"}],
        "latency": {"batch_sizes": [1, 4], "warmup": 1, "iterations": 5, "threads": 1},
        "gate": {"metric": "accuracy", "max_drop": 0.5, "max_slice_drop": 0.5},
        "tracking": {"uri": tracking_uri, "experiment": experiment}, "output_dir": str(root / "reports"),
    }  # fmt: skip
    path = root / "linear.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def strict_copy(recipe: Path) -> Path:
    """The same recipe gated on max_abs_error with no tolerance: FP16 and INT8 outputs differ, so it breaches."""
    body = yaml.safe_load(recipe.read_text())
    body["gate"] = {"metric": "max_abs_error", "max_drop": 0.0, "max_slice_drop": 0.0}
    path = recipe.with_name("strict.yaml")
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path
