"""What a sweep measured on (its evaluation rows, labels and slices, and its calibration rows), handed to the
tracking process for MLflow's dataset inputs (qbench.track.datasets); free of MLflow, which the sweep's own process
never imports (qbench.track.process)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class SweepData:
    """What the sweep measured on: evaluation feeds, labels and slice masks, and the calibration feeds."""

    recipe_name: str
    evaluation_source: Path
    evaluation: Mapping[str, np.ndarray]
    labels: np.ndarray | None
    slices: Mapping[str, np.ndarray]  # slice name -> boolean mask over the evaluation rows
    calibration_source: Path
    calibration: Mapping[str, np.ndarray]  # empty when nothing is calibrated


def concatenated(batches: list[Mapping[str, np.ndarray]], rows: int) -> dict[str, np.ndarray]:
    """Calibration batches (feed dicts) as one feed dict of their first `rows` rows (the sample: a model with a
    fixed batch gets a last batch filled with repeats)."""
    if not batches:
        return {}
    return {name: np.concatenate([batch[name] for batch in batches])[:rows] for name in batches[0]}
