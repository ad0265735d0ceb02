"""Latency of a loaded variant: cold start (session creation, first run) and steady state per batch size.

Only the `runner.run` call is inside a timed region: inputs are sliced, tiled and made
contiguous before the clock starts, and the progress bar advances outside it.

The caller must keep exactly one runner alive while timing: idle ONNX Runtime
sessions keep intra-op threads spinning, and on a small machine that moved
in-process latencies by up to 2x (trials.md, pitfall 3). Close every other runner
first, and close this one before loading the next variant.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from qbench.backends.base import Runner
from qbench.console import track
from qbench.errors import QbenchError
from qbench.results import LatencyPoint
from qbench.validate.accuracy import row_count

_NS_PER_MS = 1_000_000


def take_batch(feeds: Mapping[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
    """The first `batch_size` rows of every input, repeating the rows from the top if there are fewer."""
    if batch_size <= 0:
        raise QbenchError(f"batch_size must be positive, got {batch_size}")
    rows = row_count(feeds)
    if rows == 0:
        raise QbenchError("no rows to time: the evaluation set is empty")
    picks = np.arange(batch_size) % rows
    return {name: np.ascontiguousarray(np.take(array, picks, axis=0)) for name, array in feeds.items()}


def _elapsed_ms(start_ns: int) -> float:
    return (time.perf_counter_ns() - start_ns) / _NS_PER_MS


def measure_cold_start(load: Callable[[], Runner], feeds: Mapping[str, np.ndarray]) -> tuple[Runner, float, float]:
    """Time `load()` (session creation) and the first run on one row, in ms; return the live runner too.

    The first run pays for lazy initialisation (kernel selection, memory arenas), which is
    why it is reported apart from the steady state.
    """
    batch = take_batch(feeds, 1)
    start = time.perf_counter_ns()
    runner = load()
    session_create_ms = _elapsed_ms(start)
    try:
        start = time.perf_counter_ns()
        runner.run(batch)
        first_run_ms = _elapsed_ms(start)
    except BaseException:
        runner.close()
        raise
    return runner, session_create_ms, first_run_ms


def _timed_runs_ns(runner: Runner, batch: dict[str, np.ndarray], iterations: int, description: str) -> np.ndarray:
    durations = np.empty(iterations, dtype=np.int64)
    for i in track(range(iterations), description, total=iterations):
        start = time.perf_counter_ns()
        runner.run(batch)
        durations[i] = time.perf_counter_ns() - start
    return durations


def _latency_point(batch_size: int, warmup: int, durations_ms: np.ndarray) -> LatencyPoint:
    p50, p95, p99 = np.percentile(durations_ms, [50, 95, 99])
    mean_ms = float(np.mean(durations_ms))
    return LatencyPoint(
        batch_size=batch_size,
        warmup=warmup,
        iterations=int(durations_ms.size),
        p50_ms=float(p50),
        p95_ms=float(p95),
        p99_ms=float(p99),
        mean_ms=mean_ms,
        items_per_s=batch_size * 1000.0 / mean_ms if mean_ms > 0 else math.inf,
    )


def measure_samples(
    runner: Runner,
    feeds: Mapping[str, np.ndarray],
    batch_sizes: Sequence[int],
    warmup: int,
    iterations: int,
    description: str = "latency",
) -> dict[int, np.ndarray]:
    """For each batch size: `warmup` untimed runs, then `iterations` timed runs of `runner.run`; batch size ->
    every timed duration in ms (the load simulation replays them, `latency_points` summarises them)."""
    if warmup < 0:
        raise QbenchError(f"warmup must be zero or more, got {warmup}")
    if iterations <= 0:
        raise QbenchError(f"iterations must be positive, got {iterations}")
    samples: dict[int, np.ndarray] = {}
    for batch_size in batch_sizes:
        batch = take_batch(feeds, batch_size)
        for _ in range(warmup):
            runner.run(batch)
        durations = _timed_runs_ns(runner, batch, iterations, f"{description} (batch {batch_size})")
        samples[batch_size] = durations.astype(np.float64) / _NS_PER_MS
    return samples


def latency_points(samples_ms: Mapping[int, np.ndarray], warmup: int) -> tuple[LatencyPoint, ...]:
    """One LatencyPoint per batch size. Percentiles are numpy's (linear interpolation), so
    p50 <= p95 <= p99; items_per_s is batch_size / mean seconds."""
    return tuple(_latency_point(batch_size, warmup, durations) for batch_size, durations in samples_ms.items())


def measure_steady_state(
    runner: Runner,
    feeds: Mapping[str, np.ndarray],
    batch_sizes: Sequence[int],
    warmup: int,
    iterations: int,
    description: str = "latency",
) -> tuple[LatencyPoint, ...]:
    """`measure_samples`, summarised per batch size."""
    return latency_points(measure_samples(runner, feeds, batch_sizes, warmup, iterations, description), warmup)
