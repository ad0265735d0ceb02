"""When to stop timing: windows of runs whose p50s must agree, in the spirit of perf_analyzer.

The timed runs of one batch size are cut into consecutive windows. A window closes once it
holds at least `window_runs` runs *and* its runs add up to at least `window_time` of run time
(so a window of a very fast model is not over in a few milliseconds). When a window closes,
the last `windows` closed windows are stable if their p50s agree within `threshold`:
(max - min) / median <= threshold. Timing stops at the first run at which at least
`min_runs` runs were timed and the last check found the windows stable, or at `max_runs`.

Everything here is a pure function of the run durations (the wall-clock bound on a
measurement lives in the caller), so the rule is tested on hand-made sequences.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from qbench.errors import QbenchError

# A window's p99 is reported only when the window has enough runs for it not to be the maximum.
P99_MIN_RUNS = 100


def relative_spread(values: Sequence[float] | np.ndarray) -> float:
    """(max - min) / median; NaN for no values or a median of zero, 0.0 for one value."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        return math.nan
    median = float(np.median(array))
    if median == 0.0:
        return math.nan
    return float((array.max() - array.min()) / median)


def iqr_ratio(samples: Sequence[float] | np.ndarray) -> float:
    """Interquartile range over median (numpy's linear percentiles); NaN for no samples or a zero median."""
    array = np.asarray(samples, dtype=np.float64)
    if array.size == 0:
        return math.nan
    q25, q50, q75 = np.percentile(array, [25, 50, 75])
    return math.nan if q50 == 0.0 else float((q75 - q25) / q50)


@dataclass(frozen=True)
class StabilityRule:
    """The stopping rule for one batch size. Counts are runs; `window_time` is summed run time, in the
    durations' unit."""

    min_runs: int
    max_runs: int
    windows: int
    threshold: float
    window_runs: int
    window_time: float = 0.0
    max_seconds: float = math.inf  # wall-clock bound past min_runs, kept by the timing loop (not by `add`)

    def __post_init__(self) -> None:
        if not 0 < self.min_runs <= self.max_runs:
            raise QbenchError(f"expected 0 < min_runs <= max_runs, got {self.min_runs} and {self.max_runs}")
        if self.windows < 2:
            raise QbenchError(f"windows must be 2 or more (one window agrees with itself), got {self.windows}")
        if self.window_runs < 1 or self.window_time < 0:
            raise QbenchError(
                f"window_runs must be positive and window_time >= 0, got {self.window_runs} and {self.window_time}"
            )
        if not self.threshold > 0:
            raise QbenchError(f"threshold must be positive, got {self.threshold}")


class WindowedStability:
    """Feed run durations one at a time; `add` says when the rule has been met.

    window_p50s holds one p50 (in the duration's unit) per closed window; runs of a window
    that had not closed when timing stopped count in no window.
    """

    def __init__(self, rule: StabilityRule) -> None:
        self.rule = rule
        self.durations: list[float] = []
        self.window_p50s: list[float] = []
        self.window_p99s: list[float] = []
        self.stable = False
        self._window_start = 0
        self._window_sum = 0.0

    def add(self, duration: float) -> bool:
        """Record one run; True when timing should stop (stable after the minimum, or the maximum reached)."""
        self.durations.append(duration)
        self._window_sum += duration
        window_len = len(self.durations) - self._window_start
        if window_len >= self.rule.window_runs and self._window_sum >= self.rule.window_time:
            self._close_window()
        runs = len(self.durations)
        return runs >= self.rule.max_runs or (runs >= self.rule.min_runs and self.stable)

    def _close_window(self) -> None:
        window = np.asarray(self.durations[self._window_start :], dtype=np.float64)
        self.window_p50s.append(float(np.percentile(window, 50)))
        if window.size >= P99_MIN_RUNS:
            self.window_p99s.append(float(np.percentile(window, 99)))
        self._window_start, self._window_sum = len(self.durations), 0.0
        last = self.window_p50s[-self.rule.windows :]
        self.stable = len(last) == self.rule.windows and relative_spread(last) <= self.rule.threshold

    @property
    def spread(self) -> float:
        """Relative spread of the last `windows` window p50s (NaN before any window closed)."""
        return relative_spread(self.window_p50s[-self.rule.windows :])


def run_until_stable(durations: Iterable[float], rule: StabilityRule) -> WindowedStability:
    """Feed `durations` until the rule says stop (or they run out): the stopping rule over a fixed array."""
    state = WindowedStability(rule)
    for duration in durations:
        if state.add(duration):
            break
    return state
