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
from dataclasses import dataclass
from typing import Any

import numpy as np

from qbench.backends.base import Runner
from qbench.data.feeds import take_batch
from qbench.errors import QbenchError
from qbench.progress import track
from qbench.recipe import StabilitySpec
from qbench.results import LatencyPoint
from qbench.validate.contention import cpu_sample, others_cpus
from qbench.validate.stability import StabilityRule, WindowedStability, iqr_ratio, run_until_stable

_NS_PER_MS = 1_000_000
_DEFAULT_MAX_RUNS = 100_000  # latency.stability.max_iterations when not given


def _elapsed_ms(start_ns: int) -> float:
    return (time.perf_counter_ns() - start_ns) / _NS_PER_MS


def measure_cold_start(
    load: Callable[[], Runner], feeds: Mapping[str, np.ndarray], rows: int = 1
) -> tuple[Runner, float, float]:
    """Time `load()` (session creation) and the first run on `rows` rows (one, or the batch a model with a
    fixed batch takes), in ms; return the live runner too.

    The first run pays for lazy initialisation (kernel selection, memory arenas), which is
    why it is reported apart from the steady state.
    """
    batch = take_batch(feeds, rows)
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


def stability_rule(spec: StabilitySpec | None, iterations: int) -> StabilityRule | None:
    """The recipe's stability settings for a minimum of `iterations` timed runs (durations in ms);
    None without them (fixed-count timing)."""
    if spec is None:
        return None
    window_runs = spec.window_runs or max(1, iterations // spec.windows)
    return StabilityRule(
        min_runs=iterations,
        max_runs=spec.max_iterations or max(_DEFAULT_MAX_RUNS, iterations),
        windows=spec.windows,
        threshold=spec.threshold,
        window_runs=window_runs,
        window_time=spec.window_seconds * 1000.0,
        max_seconds=spec.max_seconds,
    )


def _timed_until_stable(
    runner: Runner, batch: dict[str, np.ndarray], rule: StabilityRule, description: str
) -> np.ndarray:
    """Timed runs (ms) until the rule stops them, or `rule.max_seconds` of wall time once the minimum is done."""
    state = WindowedStability(rule)
    deadline = time.perf_counter_ns() + rule.max_seconds * 1e9
    for _ in track(range(rule.max_runs), description, total=rule.max_runs):
        start = time.perf_counter_ns()
        runner.run(batch)
        end = time.perf_counter_ns()
        if state.add((end - start) / _NS_PER_MS) or (end >= deadline and len(state.durations) >= rule.min_runs):
            break
    return np.asarray(state.durations, dtype=np.float64)


class TimedSamples(dict[int, np.ndarray]):
    """Batch size -> every timed duration (ms), and the CPUs other processes kept busy while each was timed
    (qbench.validate.contention)."""

    def __init__(self) -> None:
        super().__init__()
        self.others_cpus: dict[int, float] = {}


def _latency_point(
    batch_size: int, warmup: int, durations_ms: np.ndarray, rule: StabilityRule | None, others: float = math.nan
) -> LatencyPoint:
    p50, p95, p99 = np.percentile(durations_ms, [50, 95, 99])
    mean_ms = float(np.mean(durations_ms))
    windows: dict[str, Any] = {}
    if rule is not None:
        # the same rule over the same durations: the windows the timing loop saw when it stopped
        state = run_until_stable(durations_ms.tolist(), rule)
        windows = {"window_p50_ms": tuple(state.window_p50s), "window_p99_ms": tuple(state.window_p99s),
                   "spread": state.spread, "stable": state.stable}  # fmt: skip
    return LatencyPoint(
        batch_size=batch_size,
        warmup=warmup,
        iterations=int(durations_ms.size),
        p50_ms=float(p50),
        p95_ms=float(p95),
        p99_ms=float(p99),
        mean_ms=mean_ms,
        items_per_s=batch_size * 1000.0 / mean_ms if mean_ms > 0 else math.inf,
        iqr_ratio=iqr_ratio(durations_ms),
        others_cpus=others,
        **windows,
    )


def measure_samples(
    runner: Runner,
    feeds: Mapping[str, np.ndarray],
    batch_sizes: Sequence[int],
    warmup: int,
    iterations: int,
    description: str = "latency",
    stability: StabilitySpec | None = None,
) -> TimedSamples:
    """For each batch size: `warmup` untimed runs, then timed runs of `runner.run`; batch size ->
    every timed duration in ms (the load simulation replays them, `latency_points` summarises them),
    with the CPUs other processes kept busy over the timed runs.

    Without `stability`, exactly `iterations` timed runs. With it, at least `iterations`, then on
    until the last windows' p50s agree (qbench.validate.stability), at most `max_iterations` runs
    and, past the minimum, `max_seconds`.
    """
    if warmup < 0:
        raise QbenchError(f"warmup must be zero or more, got {warmup}")
    if iterations <= 0:
        raise QbenchError(f"iterations must be positive, got {iterations}")
    samples = TimedSamples()
    for batch_size in batch_sizes:
        batch = take_batch(feeds, batch_size)
        for _ in range(warmup):
            runner.run(batch)
        label = f"{description} (batch {batch_size})"
        rule = stability_rule(stability, iterations)
        start = cpu_sample()
        if rule is None:
            samples[batch_size] = _timed_runs_ns(runner, batch, iterations, label).astype(np.float64) / _NS_PER_MS
        else:
            samples[batch_size] = _timed_until_stable(runner, batch, rule, label)
        samples.others_cpus[batch_size] = others_cpus(start, cpu_sample())
    return samples


def _gather(requests: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One batch from one-row requests, as a batcher joins them: one np.concatenate per input."""
    return {name: np.concatenate([request[name] for request in requests]) for name in requests[0]}


@dataclass(frozen=True)
class BatcherSamples:
    """What serving through a dynamic batcher adds to back-to-back runs of a ready batch, per batch size (ms)."""

    gather_ms: dict[int, float]  # median time to gather one-row requests into the batch, paid before every run
    idle_ms: dict[int, float]  # median time of a batch served on an idle model, from when the batcher's timer was due


IDLE_RUNS = 30  # idle-start batches timed per batch size at most (their median is what the simulation uses)
IDLE_MIN_RUNS = 5
IDLE_BUDGET_S = 1.0  # per batch size: past it (and IDLE_MIN_RUNS), no more idle starts are timed


def measure_batcher_samples(
    runner: Runner, feeds: Mapping[str, np.ndarray], batch_sizes: Sequence[int], iterations: int, idle_ms: float
) -> BatcherSamples:
    """For each batch size: the median of `iterations` gatherings of the batch from one-row requests (one
    np.concatenate per input, as a batcher joins its requests), and the median of batches served as a dynamic
    batcher serves one on an idle model: sleep `idle_ms`, gather, run, timed from when the sleep was due
    (at most `iterations` and IDLE_RUNS of them, fewer past IDLE_BUDGET_S: a median needs few runs, and a large
    model's idle start differs from its back-to-back run by a share too small to need more).

    The runner must be warm (timed before). The load simulation charges every batch its gathering and a batch
    that starts on an idle model the idle time: the timer firing late, the gathering, and the runtime's parked
    threads and cold caches (qbench.validate.load, qbench.slo.served_times).
    """
    if iterations <= 0:
        raise QbenchError(f"iterations must be positive, got {iterations}")
    idle_ns = int(idle_ms * _NS_PER_MS)
    gather: dict[int, float] = {}
    idle: dict[int, float] = {}
    for batch_size in batch_sizes:
        batch = take_batch(feeds, batch_size)
        requests = [{name: array[i : i + 1] for name, array in batch.items()} for i in range(batch_size)]
        gatherings = np.empty(iterations, dtype=np.int64)
        for i in range(iterations):
            start = time.perf_counter_ns()
            _gather(requests)
            gatherings[i] = time.perf_counter_ns() - start
        gather[batch_size] = float(np.median(gatherings)) / _NS_PER_MS
        durations: list[int] = []
        deadline = time.perf_counter_ns() + int(IDLE_BUDGET_S * 1e9)
        while len(durations) < min(iterations, IDLE_RUNS) and (
            len(durations) < IDLE_MIN_RUNS or time.perf_counter_ns() < deadline
        ):
            due = time.perf_counter_ns() + idle_ns
            time.sleep(idle_ms / 1000)
            runner.run(_gather(requests))
            durations.append(time.perf_counter_ns() - due)
        idle[batch_size] = float(np.median(durations)) / _NS_PER_MS
    return BatcherSamples(gather, idle)


def latency_points(
    samples_ms: Mapping[int, np.ndarray], warmup: int, rule: StabilityRule | None = None
) -> tuple[LatencyPoint, ...]:
    """One LatencyPoint per batch size. Percentiles are numpy's (linear interpolation), so
    p50 <= p95 <= p99; items_per_s is batch_size / mean seconds. With the `rule` the samples were
    timed under (`stability_rule`), each point records its windows, their spread and `stable`; from
    `TimedSamples`, the CPUs other processes kept busy."""
    others = samples_ms.others_cpus if isinstance(samples_ms, TimedSamples) else {}
    return tuple(_latency_point(bs, warmup, durations, rule, others.get(bs, math.nan))
                 for bs, durations in samples_ms.items())  # fmt: skip


def measure_steady_state(
    runner: Runner,
    feeds: Mapping[str, np.ndarray],
    batch_sizes: Sequence[int],
    warmup: int,
    iterations: int,
    description: str = "latency",
    stability: StabilitySpec | None = None,
) -> tuple[LatencyPoint, ...]:
    """`measure_samples`, summarised per batch size."""
    samples = measure_samples(runner, feeds, batch_sizes, warmup, iterations, description, stability)
    return latency_points(samples, warmup, stability_rule(stability, iterations))
