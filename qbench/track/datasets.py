"""The rows a sweep measured on, as MLflow dataset inputs: evaluation, each slice, calibration.

MLflow stores a dataset's metadata only (name, digest, source, schema, profile), never its rows. The
digest and schema are computed from the model feeds qbench actually used (the evaluation rows after
filtering, the drawn calibration rows), the source is the data file they came from, and the
context ("evaluation", "evaluation slice", "calibration") says what each was for.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mlflow.entities import Dataset, DatasetInput, InputTag
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT
from mlflow.utils.validation import MAX_DATASET_NAME_SIZE, MAX_INPUT_TAG_VALUE_SIZE

from qbench.sweep.data import SweepData
from qbench.track.content import fit_value

EVALUATION = "evaluation"
EVALUATION_SLICE = "evaluation slice"
CALIBRATION = "calibration"


def _typed(values: np.ndarray) -> np.ndarray:
    """Object arrays (string labels, say) as strings: MLflow's schema has no type for Python objects."""
    return values.astype(str) if values.dtype == object else values


def _dataset(name: str, source: Path, features: Mapping[str, np.ndarray], targets: np.ndarray | None) -> Dataset:
    from mlflow.data.numpy_dataset import from_numpy

    typed = {key: _typed(np.asarray(value)) for key, value in features.items()}
    labels = _typed(np.asarray(targets)) if targets is not None else None
    with warnings.catch_warnings():  # MLflow registers its local-file source twice and warns that a path is ambiguous
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted in multiple ways")
        dataset = from_numpy(typed, source=str(source), targets=labels, name=fit_value(name, MAX_DATASET_NAME_SIZE))
        return dataset._to_mlflow_entity()


def _input(dataset: Dataset, context: str, **tags: str) -> DatasetInput:
    extra = [InputTag(key, fit_value(value, MAX_INPUT_TAG_VALUE_SIZE)) for key, value in tags.items()]
    return DatasetInput(dataset, [InputTag(MLFLOW_DATASET_CONTEXT, context), *extra])


@dataclass(frozen=True)
class DatasetInputs:
    """The dataset inputs of the parent run (all of them) and of the variants' child runs."""

    evaluation: DatasetInput
    slices: tuple[DatasetInput, ...]
    calibration: DatasetInput | None

    @property
    def sweep(self) -> list[DatasetInput]:
        return [self.evaluation, *self.slices, *([self.calibration] if self.calibration else [])]

    def variant(self, calibrated: bool) -> list[DatasetInput]:
        return [self.evaluation, *([self.calibration] if calibrated and self.calibration else [])]


def dataset_inputs(data: SweepData) -> DatasetInputs:
    """Dataset entities for the evaluation rows, each slice's rows and the calibration rows (digests of the feeds)."""
    evaluation = _dataset(f"{data.recipe_name}-{EVALUATION}", data.evaluation_source, data.evaluation, data.labels)
    sizes = ", ".join(f"{name} ({int(mask.sum())})" for name, mask in data.slices.items())
    slices = tuple(
        _input(
            _dataset(f"{data.recipe_name}-{EVALUATION}[{name}]", data.evaluation_source,
                     {k: v[mask] for k, v in data.evaluation.items()},
                     data.labels[mask] if data.labels is not None else None),
            EVALUATION_SLICE, **{"qbench.slice": name},
        )
        for name, mask in data.slices.items()
        if mask.any()
    )  # fmt: skip
    calibration = None
    if data.calibration:
        dataset = _dataset(f"{data.recipe_name}-{CALIBRATION}", data.calibration_source, data.calibration, None)
        calibration = _input(dataset, CALIBRATION)
    slice_tags = {"qbench.slices": sizes} if sizes else {}
    return DatasetInputs(_input(evaluation, EVALUATION, **slice_tags), slices, calibration)
