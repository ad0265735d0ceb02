"""Metrics: a catalogue (direction, task) and pure functions over numpy arrays.

Every function takes plain arrays and returns floats; empty input gives NaN
(never an exception and never a silent 0), and NaN propagates.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricInfo:
    name: str
    higher_is_better: bool
    tasks: tuple[str, ...]
    description: str


_ALL = ("classification", "embedding")

METRICS: dict[str, MetricInfo] = {
    m.name: m
    for m in (
        MetricInfo("accuracy", True, ("classification",), "top-1 accuracy vs labels (vs FP32 top-1 without labels)"),
        MetricInfo("agreement", True, ("classification",), "fraction of rows whose top-1 matches FP32"),
        MetricInfo("flip_rate", False, ("classification",), "fraction of rows whose top-1 differs from FP32"),
        MetricInfo("kl_mean", False, ("classification",), "mean KL(FP32 || variant) of the softmax outputs"),
        MetricInfo("cosine", True, ("embedding",), "mean cosine similarity with the FP32 output"),
        MetricInfo("cosine_min", True, ("embedding",), "lowest cosine similarity with the FP32 output"),
        MetricInfo("max_abs_error", False, _ALL, "largest absolute difference from the FP32 output"),
    )
}


def gate_metric_names(task: str) -> list[str]:
    """Metrics the gate can judge for `task`."""
    return [name for name, info in METRICS.items() if task in info.tasks]


def drop(metric: str, reference: float, value: float) -> float:
    """How much worse `value` is than `reference` (positive = worse), whatever the metric's direction."""
    if METRICS[metric].higher_is_better:
        return reference - value
    return value - reference
