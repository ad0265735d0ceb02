"""Latency of a loaded variant: cold start (session creation, first run) and steady state per batch size.

Only the runtime's call is inside a timed region: the timed batches are built before the clock
starts (`timed_batches`), and so are the runner's calls on them (qbench.backends.base.timed_calls: a torch runner
converts them to tensors there and leaves its outputs as tensors); each run takes the next one in rotation, and
the progress bar advances outside it.

The timed batches are drawn from the evaluation rows (a fixed shuffle, the same for every variant), not
the first rows repeated: a model whose cost depends on its input (text of many lengths served with
dynamic padding, a data-dependent loop) is timed on the mix it will serve. Text padded to the set's
longest row is cut back to each batch's own longest row (`Padding`), as a server padding per batch runs it.

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

from qbench.backends.base import Runner, served_call, timed_calls
from qbench.data.feeds import take_batch
from qbench.data.text import Padding
from qbench.errors import QbenchError
from qbench.progress import track
from qbench.recipe.spec import StabilitySpec
from qbench.results.schema import LatencyPoint
from qbench.validate.contention import cpu_sample, others_cpus
from qbench.validate.outputs import batch_named, row_count
from qbench.validate.stability import StabilityRule, WindowedStability, iqr_ratio, run_until_stable

_NS_PER_MS = 1_000_000
_DEFAULT_MAX_RUNS = 100_000  # latency.stability.max_iterations when not given
# distinct batches timed in rotation per batch size at most (fewer when a stability window, or the fixed count
# of runs, is shorter: every batch is timed in every window); the copies they hold are at most the rows once
MAX_TIMED_BATCHES = 256
# and at most this many bytes of input copies (at least one batch): 256 batches of 32 ImageNet-sized images would
# hold 4.9 GB
MAX_TIMED_BYTES = 256 * 2**20
_SHUFFLE_SEED = 0


def _elapsed_ms(start_ns: int) -> float:
    return (time.perf_counter_ns() - start_ns) / _NS_PER_MS


def measure_cold_start(
    load: Callable[[], Runner], feeds: Mapping[str, np.ndarray], rows: int = 1, padding: Padding | None = None
) -> tuple[Runner, float, float]:
    """Time `load()` (session creation) and the first run, in ms; return the live runner too.

    The first run pays for lazy initialisation (kernel selection, memory arenas), which is why it is reported apart
    from the steady state. It runs the first batch of the steady state's rotation at `rows` rows (one, or the batch
    a model with a fixed batch takes; `timed_batches`, `padding` included): the same rows for FP32 and every variant,
    drawn from the evaluation rows' fixed shuffle rather than whichever row the file lists first, and cut back to its
    own length as the steady state times it (a text row of 5 tokens is no longer run at the set's longest). The first
    run is a served call (qbench.backends.base.served_call): a server's first request arrives as numpy and is answered
    as numpy, so the conversions are counted, but not the modes a server's worker enters once (entered before it)."""
    batch = timed_batches(feeds, rows, padding, limit=1)[0]
    start = time.perf_counter_ns()
    runner = load()
    session_create_ms = _elapsed_ms(start)
    try:
        with served_call(runner) as call, batch_named(row_count(batch)):
            start = time.perf_counter_ns()
            call(batch)
            first_run_ms = _elapsed_ms(start)
    except BaseException:
        runner.close()
        raise
    return runner, session_create_ms, first_run_ms


Batches = list[dict[str, np.ndarray]]


def timed_batches(
    feeds: Mapping[str, np.ndarray], batch_size: int, padding: Padding | None = None, limit: int = MAX_TIMED_BATCHES
) -> Batches:
    """The batches of `batch_size` rows timed in rotation: the rows in a fixed shuffle (seeded, so FP32 and every
    variant run the same batches in the same order), cut into consecutive batches (the last filled from the top),
    at most `limit` and MAX_TIMED_BYTES of copies; a set of fewer rows than `batch_size` gives one batch repeating them
    (`take_batch`). With `padding`, each batch is cut back to its own longest row."""
    count = len(next(iter(feeds.values()), ()))
    batch_bytes = sum(array.nbytes for array in feeds.values()) * batch_size // max(count, 1)
    limit = max(1, min(limit, MAX_TIMED_BYTES // max(batch_bytes, 1)))
    if count <= batch_size:
        batches = [take_batch(feeds, batch_size)]
    else:
        order = np.random.default_rng(_SHUFFLE_SEED).permutation(count)
        starts = range(0, min(count, limit * batch_size), batch_size)
        batches = [{name: np.ascontiguousarray(np.take(array, order[np.arange(start, start + batch_size) % count],
                                                       axis=0))
                    for name, array in feeds.items()} for start in starts]  # fmt: skip
    return [padding.trim(batch) for batch in batches] if padding is not None else batches


def timed_shapes(batches: Batches) -> dict[str, dict[str, list[int]]]:
    """Input name -> the smallest, median and largest of its shapes over `batches` (dimension by dimension), for
    the inputs whose shape differs between them: what the timed figures describe."""
    shapes: dict[str, dict[str, list[int]]] = {}
    for name in batches[0]:
        dims = np.array([batch[name].shape for batch in batches])
        if np.any(dims != dims[0]):
            shapes[name] = {"min": dims.min(axis=0).tolist(), "p50": np.median(dims, axis=0).astype(int).tolist(),
                            "max": dims.max(axis=0).tolist()}  # fmt: skip
    return shapes


Call = Callable[[], object]


def _timed_runs_ns(calls: Sequence[Call], iterations: int, description: str) -> np.ndarray:
    durations = np.empty(iterations, dtype=np.int64)
    count = len(calls)
    for i in track(range(iterations), description, total=iterations):
        call = calls[i % count]
        start = time.perf_counter_ns()
        call()
        durations[i] = time.perf_counter_ns() - start
    return durations


def stability_rule(spec: StabilitySpec | None, iterations: int, rotation: int = 1) -> StabilityRule | None:
    """The recipe's stability settings for a minimum of `iterations` timed runs (durations in ms) over `rotation`
    distinct batches; None without them (fixed-count timing). A window is whole rotations (its runs rounded up to
    a multiple of `rotation`), so windows compare the same inputs and their p50s differ by timing noise only."""
    if spec is None:
        return None
    window_runs = spec.window_runs or max(1, iterations // spec.windows)
    window_runs = -(-window_runs // rotation) * rotation
    return StabilityRule(
        min_runs=iterations,
        max_runs=spec.max_iterations or max(_DEFAULT_MAX_RUNS, iterations),
        windows=spec.windows,
        threshold=spec.threshold,
        window_runs=window_runs,
        window_time=spec.window_seconds * 1000.0,
        max_seconds=spec.max_seconds,
    )


def _timed_until_stable(calls: Sequence[Call], rule: StabilityRule, description: str) -> np.ndarray:
    """Timed runs (ms) until the rule stops them, or `rule.max_seconds` of wall time once the minimum is done."""
    state = WindowedStability(rule)
    deadline = time.perf_counter_ns() + rule.max_seconds * 1e9
    count = len(calls)
    for i in track(range(rule.max_runs), description, total=rule.max_runs):
        call = calls[i % count]
        start = time.perf_counter_ns()
        call()
        end = time.perf_counter_ns()
        if state.add((end - start) / _NS_PER_MS) or (end >= deadline and len(state.durations) >= rule.min_runs):
            break
    return np.asarray(state.durations, dtype=np.float64)


class TimedSamples(dict[int, np.ndarray]):
    """Batch size -> every timed duration (ms); per batch size too, the CPUs other processes kept busy while it was
    timed (qbench.validate.contention), the stability rule it was timed under, how many distinct batches were timed
    in rotation and the shapes that vary among them (`timed_shapes`)."""

    def __init__(self) -> None:
        super().__init__()
        self.others_cpus: dict[int, float] = {}
        self.rules: dict[int, StabilityRule | None] = {}
        self.batches: dict[int, int] = {}
        self.shapes: dict[int, dict[str, dict[str, list[int]]]] = {}


def _latency_point(
    batch_size: int, warmup: int, durations_ms: np.ndarray, rule: StabilityRule | None, others: float = math.nan,
    **timed: Any,
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
        **timed,
    )


def measure_samples(
    runner: Runner,
    feeds: Mapping[str, np.ndarray],
    batch_sizes: Sequence[int],
    warmup: int,
    iterations: int,
    description: str = "latency",
    stability: StabilitySpec | None = None,
    padding: Padding | None = None,
) -> TimedSamples:
    """For each batch size: `warmup` untimed runs, then timed runs of `runner.run`, over the `timed_batches` of
    `feeds` in rotation (with `padding`, each cut back to its longest row); batch size ->
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
        unrotated = stability_rule(stability, iterations)
        limit = min(MAX_TIMED_BATCHES, unrotated.window_runs if unrotated is not None else iterations)
        batches = timed_batches(feeds, batch_size, padding, limit)
        label = f"{description} (batch {batch_size})"
        rule = stability_rule(stability, iterations, len(batches))
        with batch_named(batch_size), timed_calls(runner, batches) as calls:
            for i in range(warmup):
                calls[i % len(calls)]()
            start = cpu_sample()
            if rule is None:
                samples[batch_size] = _timed_runs_ns(calls, iterations, label).astype(np.float64) / _NS_PER_MS
            else:
                samples[batch_size] = _timed_until_stable(calls, rule, label)
            samples.others_cpus[batch_size] = others_cpus(start, cpu_sample())
        samples.rules[batch_size] = rule
        samples.batches[batch_size] = len(batches)
        samples.shapes[batch_size] = timed_shapes(batches)
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
    runner: Runner,
    feeds: Mapping[str, np.ndarray],
    batch_sizes: Sequence[int],
    iterations: int,
    idle_ms: float,
    padding: Padding | None = None,
) -> BatcherSamples:
    """For each batch size: the median of `iterations` gatherings of the first timed batch (`timed_batches`) from
    one-row requests (one np.concatenate per input, as a batcher joins its requests), and the median of batches
    served as a dynamic batcher serves one on an idle model (the timed batches in rotation): sleep `idle_ms`,
    gather, run as a server runs a batch (qbench.backends.base.served_call), timed from when the sleep was due
    (at most `iterations` and IDLE_RUNS of them, fewer past IDLE_BUDGET_S: a median needs few runs, and a large
    model's idle start differs from its back-to-back run by a share too small to need more).

    The runner must be warm (timed before). The load simulation charges every batch its gathering and a batch
    that starts on an idle model the idle time: the timer firing late, the gathering, and the runtime's parked
    threads and cold caches (qbench.validate.load, qbench.serving.served_times).
    """
    if iterations <= 0:
        raise QbenchError(f"iterations must be positive, got {iterations}")
    idle_ns = int(idle_ms * _NS_PER_MS)
    gather: dict[int, float] = {}
    idle: dict[int, float] = {}
    for batch_size in batch_sizes:
        rotation = [[{name: array[i : i + 1] for name, array in batch.items()} for i in range(batch_size)]
                    for batch in timed_batches(feeds, batch_size, padding)]  # fmt: skip
        requests = rotation[0]
        gatherings = np.empty(iterations, dtype=np.int64)
        for i in range(iterations):
            start = time.perf_counter_ns()
            _gather(requests)
            gatherings[i] = time.perf_counter_ns() - start
        gather[batch_size] = float(np.median(gatherings)) / _NS_PER_MS
        durations: list[int] = []
        deadline = time.perf_counter_ns() + int(IDLE_BUDGET_S * 1e9)
        with served_call(runner) as call:
            while len(durations) < min(iterations, IDLE_RUNS) and (
                len(durations) < IDLE_MIN_RUNS or time.perf_counter_ns() < deadline
            ):
                due = time.perf_counter_ns() + idle_ns
                time.sleep(idle_ms / 1000)
                call(_gather(rotation[len(durations) % len(rotation)]))
                durations.append(time.perf_counter_ns() - due)
        idle[batch_size] = float(np.median(durations)) / _NS_PER_MS
    return BatcherSamples(gather, idle)


def latency_points(
    samples_ms: Mapping[int, np.ndarray], warmup: int, rule: StabilityRule | None = None
) -> tuple[LatencyPoint, ...]:
    """One LatencyPoint per batch size. Percentiles are numpy's (linear interpolation), so
    p50 <= p95 <= p99; items_per_s is batch_size / mean seconds. With the stability rule the samples were
    timed under (`TimedSamples` record it per batch size; otherwise `rule`, from `stability_rule`), each point
    records its windows, their spread and `stable`; from `TimedSamples`, the CPUs other processes kept busy and
    what was timed (distinct batches, shapes that varied)."""
    if not isinstance(samples_ms, TimedSamples):
        return tuple(_latency_point(bs, warmup, durations, rule) for bs, durations in samples_ms.items())
    return tuple(_latency_point(bs, warmup, durations, samples_ms.rules.get(bs, rule),
                                samples_ms.others_cpus.get(bs, math.nan), batches=samples_ms.batches.get(bs, 1),
                                shapes=samples_ms.shapes.get(bs, {}))
                 for bs, durations in samples_ms.items())  # fmt: skip


def measure_steady_state(
    runner: Runner,
    feeds: Mapping[str, np.ndarray],
    batch_sizes: Sequence[int],
    warmup: int,
    iterations: int,
    description: str = "latency",
    stability: StabilitySpec | None = None,
    padding: Padding | None = None,
) -> tuple[LatencyPoint, ...]:
    """`measure_samples`, summarised per batch size."""
    return latency_points(measure_samples(runner, feeds, batch_sizes, warmup, iterations, description, stability,
                                          padding), warmup)  # fmt: skip
