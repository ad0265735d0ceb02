"""Timings of a loaded machine: a few of the timed runs stalled for milliseconds (tests/ is on sys.path)."""

from __future__ import annotations

import numpy as np


def stalled(base_ms: float, runs: int, stalls_ms: list[float], rng: np.random.Generator) -> np.ndarray:
    """`runs` timings of `base_ms`, a few of them stalls (a loaded machine preempting the runtime)."""
    values = np.full(runs, base_ms)
    values[rng.choice(runs, len(stalls_ms), replace=False)] = stalls_ms
    return values


def stalled_digits_samples() -> dict[int, np.ndarray]:
    """Shaped like a digits MLP's timings on 2 CPUs at load 4-6: 0.01 ms a batch of one and 0.015 ms one of 32,
    and 0.15 % of the runs stalled for 8-50 ms."""
    rng = np.random.default_rng(0)
    return {1: stalled(0.01, 4000, [8, 15, 25, 30, 40, 50], rng),
            32: stalled(0.015, 8000, [20, 22, 25, 28, 30, 30, 32, 34, 35, 36, 36, 36], rng)}  # fmt: skip
