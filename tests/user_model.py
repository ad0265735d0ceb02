"""A user's own project, for end-to-end tests: an ONNX model, a parquet table with a slice column, a recipe.

Nothing here comes from the digits demo: a tabular MLP on scikit-learn's breast-cancer
data, with its own column names (`x`, `y`, `subset`, `band`) and its own input and
output names (`features`, `scores`). `make_user_project(root)` writes

    root/model/tumour_mlp.onnx     input `features` (batch, 30) float32, output `scores` (batch, 2)
    root/data/patients.parquet     x (30 standardised float32), y, subset (calib/test), band, mean_radius
    root/qbench.yaml               the recipe, as a user would write it by hand

and returns the recipe path; `qbench sweep` and `qbench gate` need nothing else.
It is a fixture builder, not a test module (its name does not start with test_).
"""

from __future__ import annotations

import string
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from sklearn.datasets import load_breast_cancer

TRAIN_ROWS = 240  # used to fit the scaler and the model; not written to the table
CALIB_ROWS = 100  # the remaining 229 rows are the test subset: about 76 per band, enough to resolve max_slice_drop
BANDS = ("small", "medium", "large")  # tertiles of the raw `mean radius` feature
EPOCHS = 200  # full-batch Adam steps

RECIPE_TEMPLATE = string.Template(
    """\
# Which precision of our tumour classifier can we ship?
name: tumour-mlp
task: classification

model:
  path: model/tumour_mlp.onnx

data:
  path: data/patients.parquet
  inputs:
    x: features
  label: y
  calibration:
    filter:
      subset: calib
    samples: 64
    seed: 7
  evaluation:
    filter:
      subset: test
  slices:
    - by: band

variants:
  - name: fp16
    precision: fp16
  - name: int8-minmax
    precision: int8
    calibrator: minmax
  - name: int8-pct
    precision: int8
    calibrator: percentile
    percentile: 99.99

latency:
  batch_sizes: [1, 16]
  warmup: 3
  iterations: 20
  stability: null  # a fixed count: adaptive windows on a loaded machine time each point for seconds

gate:
  metric: agreement
  max_drop: 0.02
  max_slice_drop: 0.05
  applies_to: ["int8-*"]

tracking:
  uri: "$tracking_uri"
  experiment: tumour-mlp

output_dir: "$output_dir"
"""
)


def make_user_project(root: Path) -> Path:
    """Build the model, the table and the recipe in `root` (a few seconds); return the recipe path."""
    root = Path(root).resolve()
    features, labels, radius = _load_tumours()
    subset = _assign_subsets(len(labels), np.random.default_rng(11))
    train = subset == "train"
    mean, std = features[train].mean(axis=0), features[train].std(axis=0)
    standardised = ((features - mean) / std).astype(np.float32)

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = _train_mlp(standardised[train], labels[train])
        _export(model, root / "model" / "tumour_mlp.onnx")
    finally:
        torch.set_num_threads(previous_threads)

    kept = ~train
    _write_table(standardised[kept], labels[kept], subset[kept], radius[kept], root / "data" / "patients.parquet")
    recipe = root / "qbench.yaml"
    recipe.write_text(
        RECIPE_TEMPLATE.substitute(
            tracking_uri=f"sqlite:///{root / 'mlflow.db'}",
            output_dir=str(root / "reports"),
        )
    )
    return recipe


def _load_tumours() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw features (569, 30), int64 labels, and the raw `mean radius` column the slice bands come from."""
    data = load_breast_cancer()
    radius = data.data[:, list(data.feature_names).index("mean radius")]
    return data.data, data.target.astype(np.int64), radius


def _assign_subsets(count: int, rng: np.random.Generator) -> np.ndarray:
    subset = np.full(count, "test", dtype=object)
    order = rng.permutation(count)
    subset[order[:TRAIN_ROWS]] = "train"
    subset[order[TRAIN_ROWS : TRAIN_ROWS + CALIB_ROWS]] = "calib"
    return subset


def _train_mlp(features: np.ndarray, labels: np.ndarray) -> torch.nn.Module:
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(features.shape[1], 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 2))
    inputs, targets = torch.tensor(features), torch.tensor(labels)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(EPOCHS):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
    return model.eval()


def _export(model: torch.nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        torch.onnx.export(
            model,
            (torch.zeros(2, 30),),
            str(path),
            dynamo=False,
            input_names=["features"],
            output_names=["scores"],
            dynamic_axes={"features": {0: "batch"}, "scores": {0: "batch"}},
            opset_version=17,
        )


def _write_table(features: np.ndarray, labels: np.ndarray, subset: np.ndarray, radius: np.ndarray, path: Path) -> None:
    edges = np.quantile(radius, [1 / 3, 2 / 3])
    band = np.asarray(BANDS, dtype=object)[np.digitize(radius, edges)]
    table = pd.DataFrame({"x": list(features), "y": labels, "subset": subset, "band": band, "mean_radius": radius})
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_parquet(path, index=False)


def make_fp16_project(root: Path) -> Path:
    """The user's project with its FP16 variant alone, timed briefly and judged on agreement with room for any
    figure: for tests about what a sweep does around its measurements (faults, signals), not about the figures."""
    import yaml

    recipe = make_user_project(root)
    raw = yaml.safe_load(recipe.read_text())
    raw["variants"] = [{"name": "fp16", "precision": "fp16"}]
    raw["latency"] = {"batch_sizes": [1], "warmup": 1, "iterations": 3, "threads": 1, "stability": None}
    raw["gate"] = {"metric": "agreement", "max_drop": 1.0, "max_slice_drop": 1.0, "applies_to": ["*"]}
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    return recipe


def swept_breaches(recipe: Path) -> tuple[int, list[str]]:
    """`qbench sweep RECIPE --no-track --gate` in this process: its exit code and the BREACH lines it printed."""
    import contextlib
    import io

    from qbench.cli.app import main

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["sweep", str(recipe), "--no-track", "--gate"])
    return code, [line for line in stdout.getvalue().splitlines() if line.startswith("BREACH")]
