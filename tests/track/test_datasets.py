"""Dataset inputs within MLflow's limits, whatever the slices are called and however many there are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_DATASET_NAME_SIZE, MAX_INPUT_TAG_VALUE_SIZE

from qbench.sweep.data import SweepData
from qbench.track.datasets import dataset_inputs


def test_many_and_long_slice_names_fit_mlflows_input_limits(tmp_path: Path) -> None:
    """30 stores and one 300-character value: the tag listing every slice passed MLflow's 500 characters for input
    tags and every tracked sweep failed ('value' exceeds the maximum length of 500 characters)."""
    rows = 120
    names = [f"store=store-{i:02d}" for i in range(30)] + ["note=" + "x" * 600]
    masks = {name: np.arange(rows) % len(names) == i for i, name in enumerate(names)}
    data = SweepData(recipe_name="many", evaluation_source=tmp_path / "data.parquet",
                     evaluation={"x": np.zeros((rows, 2), np.float32)}, labels=np.zeros(rows, np.int64), slices=masks,
                     calibration_source=tmp_path / "data.parquet", calibration={})  # fmt: skip
    inputs = dataset_inputs(data)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("many", artifact_location=str(tmp_path / "artifacts")))
    client.log_inputs(run.info.run_id, datasets=inputs.sweep)
    logged = client.get_run(run.info.run_id).inputs.dataset_inputs
    assert len(logged) == 1 + len(names)
    tags = {t.key: t.value for i in logged for t in i.tags}
    assert len(tags["qbench.slices"]) == MAX_INPUT_TAG_VALUE_SIZE and tags["qbench.slices"].endswith("…")
    assert all(len(i.dataset.name) <= MAX_DATASET_NAME_SIZE for i in logged)
