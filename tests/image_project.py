"""A tiny CNN fed PNG files written by the test: pixels [batch, 3, 8, 8] -> 3 class scores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

SIDE = 8
MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]


def png(path: Path, pixels: np.ndarray) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint8)).save(path)
    return path


def cnn(path: Path) -> None:
    """Conv 3->4 (3x3) -> Relu -> GlobalAveragePool -> Flatten -> Gemm 4->3: pixels [batch, 3, 8, 8] -> scores."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.normal(0, 0.1, 4).astype(np.float32), "b"),
               numpy_helper.from_array(rng.normal(0, 1.0, (4, 3)).astype(np.float32), "fc"),
               numpy_helper.from_array(np.zeros(3, np.float32), "fcb")]  # fmt: skip
    nodes = [helper.make_node("Conv", ["pixels", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fcb"], ["scores"])]  # fmt: skip
    graph = helper.make_graph(nodes, "cnn",
                              [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 3, SIDE, SIDE])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 3])],
                              weights)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def write_image_project(root: Path, cells: list[str], labels: list[int], **recipe_options) -> Path:
    """cnn.onnx, rows.parquet (`file`: the cells, `label`) and cnn.yaml (an FP16 and an INT8 variant, images read
    under root/images, the gate on agreement) in `root`; `recipe_options` are set at the recipe's top level."""
    cnn(root / "cnn.onnx")
    pd.DataFrame({"file": cells, "label": labels}).to_parquet(root / "rows.parquet")
    recipe = {
        "name": "cnn", "task": "classification", "model": {"path": "cnn.onnx"},
        "data": {"path": "rows.parquet", "label": "label",
                 "inputs": {"file": {"image": {"root": "images", "mean": MEAN, "std": STD}}},
                 "calibration": {"samples": 8}},
        "variants": [{"name": "fp16", "precision": "fp16"},
                     {"name": "int8", "precision": "int8", "calibrator": "minmax"}],
        "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 3},
        "gate": {"metric": "agreement", "max_drop": 1.0}, "output_dir": str(root / "reports"), **recipe_options,
    }  # fmt: skip
    (root / "cnn.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return root / "cnn.yaml"
