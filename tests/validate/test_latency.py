"""Latency measurement with fake runners whose run time and call counts are known."""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import pytest

from qbench.data.text import Padding
from qbench.errors import QbenchError
from qbench.recipe.spec import StabilitySpec
from qbench.validate import latency
from qbench.validate.latency import (
    latency_points,
    measure_batcher_samples,
    measure_cold_start,
    measure_steady_state,
    take_batch,
    timed_batches,
)
from qbench.validate.stability import StabilityRule


class _SleepyRunner:
    """Sleeps `run_s` per run (by `sleep`: a `_VirtualClock`'s takes exactly that) and records the batch size of every
    call."""

    def __init__(self, run_s: float = 0.0, sleep: Callable[[float], None] = time.sleep) -> None:
        self.run_s = run_s
        self.sleep = sleep
        self.batch_sizes: list[int] = []
        self.closed = False

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        self.batch_sizes.append(len(feeds["x"]))
        if self.run_s:
            self.sleep(self.run_s)
        return [feeds["x"]]

    def describe(self) -> dict:
        return {}

    def close(self) -> None:
        self.closed = True


class _VirtualClock:
    """The timing loops' clock (qbench.validate.latency's time), moved only by `sleep`: a run takes exactly what its
    runner sleeps. A real sleep of 1 ms took 11 ms at the median on a loaded 2-core machine, so figures that rest on
    the runs' durations (windows agreeing or not, runs within a wall-time budget) depended on that machine's load."""

    def __init__(self) -> None:
        self.ns = 0

    def perf_counter_ns(self) -> int:
        return self.ns

    def sleep(self, seconds: float) -> None:
        self.ns += round(seconds * 1e9)


@pytest.fixture
def virtual_clock(monkeypatch: pytest.MonkeyPatch) -> _VirtualClock:
    clock = _VirtualClock()
    monkeypatch.setattr(latency, "time", clock)
    return clock


FEEDS = {"x": np.arange(6, dtype=np.float32).reshape(3, 2), "mask": np.array([[1], [2], [3]])}


def test_take_batch_truncates_and_tiles() -> None:
    assert take_batch(FEEDS, 2)["x"].tolist() == [[0, 1], [2, 3]]
    tiled = take_batch(FEEDS, 5)
    # rows 0, 1, 2, 0, 1 for every input
    assert tiled["mask"].ravel().tolist() == [1, 2, 3, 1, 2]
    assert tiled["x"].shape == (5, 2) and tiled["x"].flags["C_CONTIGUOUS"]


def test_take_batch_rejects_empty_feeds_and_bad_sizes() -> None:
    with pytest.raises(QbenchError, match="no rows"):
        take_batch({"x": np.zeros((0, 2))}, 1)
    with pytest.raises(QbenchError, match="positive"):
        take_batch(FEEDS, 0)


def test_cold_start_times_load_and_first_run() -> None:
    runner = _SleepyRunner(run_s=0.005)

    def load() -> _SleepyRunner:
        time.sleep(0.01)
        return runner

    live, session_create_ms, first_run_ms = measure_cold_start(load, FEEDS)
    assert live is runner and not runner.closed
    assert session_create_ms >= 10.0
    assert first_run_ms >= 5.0
    assert runner.batch_sizes == [1]


def test_cold_start_closes_the_runner_when_the_first_run_fails() -> None:
    class _Broken(_SleepyRunner):
        def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
            raise RuntimeError("kernel failed")

    broken = _Broken()
    with pytest.raises(QbenchError, match="^a batch of 1 row failed: RuntimeError: kernel failed$") as raised:
        measure_cold_start(lambda: broken, FEEDS)
    assert isinstance(raised.value.__cause__, RuntimeError)  # the runtime's error stays the cause
    assert broken.closed


def test_steady_state_runs_warmup_then_iterations_per_batch_size() -> None:
    runner = _SleepyRunner()
    points = measure_steady_state(runner, FEEDS, batch_sizes=[1, 4], warmup=3, iterations=5)
    assert [p.batch_size for p in points] == [1, 4]
    assert runner.batch_sizes == [1] * 8 + [4] * 8
    for point in points:
        assert (point.warmup, point.iterations) == (3, 5)
        assert 0 < point.p50_ms <= point.p95_ms <= point.p99_ms
        assert point.items_per_s == pytest.approx(point.batch_size * 1000 / point.mean_ms)


def test_steady_state_measures_the_run_call() -> None:
    points = measure_steady_state(_SleepyRunner(run_s=0.002), FEEDS, batch_sizes=[2], warmup=0, iterations=5)
    (point,) = points
    assert point.p50_ms >= 2.0 and point.mean_ms >= 2.0
    assert point.items_per_s <= 2 / 0.002


class _PreparingRunner(_SleepyRunner):
    """Offers timed calls: batches prepared (and the context entered) once, each call logged with its batch's index."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[object] = []

    @contextlib.contextmanager
    def timed_calls(self, batches: Sequence[Mapping[str, np.ndarray]]) -> Iterator[list[Callable[[], object]]]:
        self.log.append(("prepared", len(batches)))
        yield [functools.partial(self.log.append, index) for index in range(len(batches))]
        self.log.append("left")


@pytest.mark.parametrize("stability",
                         [None, StabilitySpec(windows=2, window_runs=3, window_seconds=0, max_iterations=9)])
def test_steady_state_times_the_runners_own_calls_when_it_offers_them(stability: StabilitySpec | None) -> None:
    """Its run() (scoring's call, which may convert inputs and outputs) is not what the latency loops time."""
    runner = _PreparingRunner()
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(4, 2)}
    samples = latency.measure_samples(runner, feeds, [1, 2], warmup=2, iterations=6, stability=stability)
    assert runner.batch_sizes == []
    for batch_size, durations in samples.items():
        rotation = samples.batches[batch_size]
        start = runner.log.index(("prepared", rotation))
        calls = runner.log[start + 1 : runner.log.index("left", start)]
        assert calls == [i % rotation for i in range(2)] + [i % rotation for i in range(len(durations))]


def test_batcher_samples_gather_the_rows_and_time_idle_batches_from_when_the_timer_was_due() -> None:
    """Per batch size, the gathering of one-row requests (a median, in ms) and each idle batch: the sleep's
    lateness, the gathering and the run, at least the 1 ms run (a sleep never ends early); the batch run is the
    rows take_batch gives, joined back."""
    seen: list[dict[str, np.ndarray]] = []

    class _Recording(_SleepyRunner):
        def run(self, feeds):
            seen.append({k: v.copy() for k, v in feeds.items()})
            return super().run(feeds)

    samples = measure_batcher_samples(_Recording(run_s=0.001), FEEDS, batch_sizes=[1, 4], iterations=3, idle_ms=2.0)
    assert sorted(samples.idle_ms) == sorted(samples.gather_ms) == [1, 4]
    assert all(value >= 0.0 for value in samples.gather_ms.values())
    assert [len(feeds["x"]) for feeds in seen] == [1] * 3 + [4] * 3
    for name, expected in take_batch(FEEDS, 4).items():
        np.testing.assert_array_equal(seen[-1][name], expected)
    # timed from when the 2 ms idling was due: the 1 ms run at least
    assert all(value >= 1.0 for value in samples.idle_ms.values())
    with pytest.raises(QbenchError, match="iterations"):
        measure_batcher_samples(_SleepyRunner(), FEEDS, [1], iterations=0, idle_ms=1.0)


def test_idle_starts_are_timed_a_bounded_number_of_times(virtual_clock: _VirtualClock) -> None:
    """At most IDLE_RUNS per batch size whatever `iterations` asks (200 here), and past IDLE_BUDGET_S only the
    IDLE_MIN_RUNS a median needs (a 0.3 s run: 5 runs, not 30)."""
    from qbench.validate.latency import IDLE_MIN_RUNS, IDLE_RUNS

    quick = _SleepyRunner()
    measure_batcher_samples(quick, FEEDS, batch_sizes=[1], iterations=200, idle_ms=1.0)
    assert len(quick.batch_sizes) == IDLE_RUNS == 30
    slow = _SleepyRunner(run_s=0.3, sleep=virtual_clock.sleep)
    measure_batcher_samples(slow, FEEDS, batch_sizes=[1], iterations=200, idle_ms=1.0)
    assert len(slow.batch_sizes) == IDLE_MIN_RUNS == 5


def test_steady_state_rejects_bad_counts() -> None:
    with pytest.raises(QbenchError, match="iterations"):
        measure_steady_state(_SleepyRunner(), FEEDS, [1], warmup=0, iterations=0)
    with pytest.raises(QbenchError, match="warmup"):
        measure_steady_state(_SleepyRunner(), FEEDS, [1], warmup=-1, iterations=1)


class _PhasedRunner(_SleepyRunner):
    """Sleeps 1 ms for `phase_runs` calls, then 3 ms for as many, and so on: its windows never agree."""

    def __init__(self, phase_runs: int, sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(sleep=sleep)
        self.phase_runs = phase_runs

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        slow = (len(self.batch_sizes) // self.phase_runs) % 2 == 1
        self.run_s = 0.003 if slow else 0.001
        return super().run(feeds)


def test_adaptive_timing_of_a_steady_runner_stops_early_and_is_stable(virtual_clock: _VirtualClock) -> None:
    stability = StabilitySpec(threshold=0.2, windows=3, window_seconds=0.0, max_iterations=300)
    runner = _SleepyRunner(run_s=0.001, sleep=virtual_clock.sleep)
    (point,) = measure_steady_state(runner, FEEDS, [1], warmup=2, iterations=30, stability=stability)
    assert 30 <= point.iterations < 300
    assert point.stable is True
    assert len(point.window_p50_ms) >= 3 and all(p >= 1.0 for p in point.window_p50_ms)  # windows of 30 // 3 runs
    assert point.spread <= 0.2
    assert point.iqr_ratio >= 0.0


def test_adaptive_timing_that_never_agrees_hits_the_run_bound_and_is_flagged(virtual_clock: _VirtualClock) -> None:
    stability = StabilitySpec(threshold=0.05, windows=3, window_runs=5, window_seconds=0.0, max_iterations=40)
    one_row = {"x": FEEDS["x"][:1]}  # one batch to rotate through: windows of exactly window_runs
    runner = _PhasedRunner(phase_runs=5, sleep=virtual_clock.sleep)
    (point,) = measure_steady_state(runner, one_row, [1], warmup=0, iterations=10, stability=stability)
    assert point.iterations == 40
    assert point.stable is False
    assert len(point.window_p50_ms) == 8
    # window p50s alternate ~1 ms and ~3 ms: the last three spread by about (3 - 1) / 3 or (3 - 1) / 1
    assert point.spread > 0.5


def test_adaptive_timing_stops_at_max_seconds_once_the_minimum_is_done(virtual_clock: _VirtualClock) -> None:
    stability = StabilitySpec(threshold=0.05, window_runs=5, window_seconds=0.0, max_seconds=0.1)
    (point,) = measure_steady_state(_PhasedRunner(phase_runs=5, sleep=virtual_clock.sleep), FEEDS, [1], warmup=0,
                                    iterations=10, stability=stability)  # fmt: skip
    assert 10 <= point.iterations < 100  # 1-3 ms a run: about 0.1 s of runs, far below the 100,000 default cap
    assert point.stable is False


def test_fixed_timing_is_not_judged_but_reports_the_sample_spread() -> None:
    (point,) = measure_steady_state(_SleepyRunner(), FEEDS, [1], warmup=0, iterations=8)
    assert point.iterations == 8 and point.stable is None and point.window_p50_ms == ()
    assert math.isnan(point.spread) and point.iqr_ratio >= 0.0


def test_latency_points_record_the_windows_the_rule_saw() -> None:
    rule = StabilityRule(min_runs=4, max_runs=100, windows=3, threshold=0.05, window_runs=2)
    samples = np.array([100, 300, 150, 150, 100, 100, 101, 99, 102, 102], dtype=np.float64)
    (point,) = latency_points({8: samples}, warmup=1, rule=rule)
    assert point.window_p50_ms == (200, 150, 100, 100, 102)  # windows of 2 runs
    assert point.stable is True and point.spread == pytest.approx(0.02)  # (102 - 100) / 100
    assert point.iterations == 10 and point.p50_ms == 101.5
    # sorted: 99 100 100 100 101 102 102 150 150 300; q25 at position 2.25 = 100, q75 at 6.75 = 102 + 0.75 * 48
    assert point.iqr_ratio == pytest.approx((138 - 100) / 101.5)
    (fixed,) = latency_points({8: samples}, warmup=1)
    assert fixed.stable is None and fixed.window_p50_ms == ()


class _Feeding(_SleepyRunner):
    """Records a copy of every batch it is run on."""

    def __init__(self) -> None:
        super().__init__()
        self.fed: list[dict[str, np.ndarray]] = []

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        self.fed.append({name: array.copy() for name, array in feeds.items()})
        return []


ROWS = {"x": np.arange(10, dtype=np.float32)[:, None]}


def test_timed_runs_rotate_over_the_evaluation_rows_the_same_way_for_every_variant() -> None:
    """Not the first row repeated: every row is timed, in one fixed order whichever runner (FP32, a variant) is
    timed."""
    first, second = _Feeding(), _Feeding()
    (point,) = measure_steady_state(first, ROWS, [1], warmup=0, iterations=10)
    measure_steady_state(second, ROWS, [1], warmup=0, iterations=10)
    fed = [float(batch["x"][0, 0]) for batch in first.fed]
    assert sorted(fed) == list(range(10))
    assert fed == [float(batch["x"][0, 0]) for batch in second.fed]
    assert point.batches == 10 and point.shapes == {}


def test_timed_batches_cover_the_rows_and_fill_the_last_batch_from_the_top() -> None:
    batches = timed_batches(ROWS, 4)
    assert [len(batch["x"]) for batch in batches] == [4, 4, 4]
    rows = [float(v) for batch in batches for v in batch["x"][:, 0]]
    assert sorted(set(rows)) == list(range(10)) and len(set(rows[:10])) == 10  # rows 10 and 11 repeat the first two
    assert len(timed_batches(ROWS, 1, limit=3)) == 3
    assert [len(batch["x"]) for batch in timed_batches(ROWS, 16)] == [16]  # fewer rows than the batch: tiled


def test_timed_batches_hold_a_bounded_number_of_bytes_and_at_least_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = {"x": np.zeros((100, 1000), dtype=np.float32)}  # 4,000 bytes a row
    monkeypatch.setattr(latency, "MAX_TIMED_BYTES", 40_000)
    assert len(timed_batches(rows, 2)) == 5  # 8,000 bytes a batch
    assert len(timed_batches(rows, 50)) == 1  # 200,000 bytes: still one batch


def test_a_stability_window_covers_whole_rotations() -> None:
    runner = _Feeding()
    stability = StabilitySpec(threshold=0.5, windows=3, window_runs=4, window_seconds=0.0, max_iterations=24)
    (point,) = measure_steady_state(runner, ROWS, [1], warmup=0, iterations=12, stability=stability)
    assert point.batches == 4  # the rotation is no longer than a window, so every window times the same rows
    windows = [[float(b["x"][0, 0]) for b in runner.fed[i : i + 4]] for i in range(0, point.iterations, 4)]
    assert all(sorted(window) == sorted(windows[0]) for window in windows)


def test_token_padding_is_cut_back_to_each_timed_batch_s_longest_row() -> None:
    """Rows padded to the set's longest (right or left padding) are timed as a server padding per batch runs them."""
    lengths = np.array([2, 9, 3, 5, 4, 7])
    right = (np.arange(9)[None, :] < lengths[:, None]).astype(np.int64)
    for mask in (right, right[:, ::-1].copy()):
        feeds = {"input_ids": mask * 7, "attention_mask": mask, "pixels": np.zeros((6, 3), np.float32)}
        runner = _Feeding()
        (point,) = measure_steady_state(runner, feeds, [2], warmup=0, iterations=3,
                                        padding=Padding("attention_mask", ("input_ids", "attention_mask")))  # fmt: skip
        for batch in runner.fed:
            longest = int(batch["attention_mask"].sum(axis=1).max())
            assert batch["input_ids"].shape == batch["attention_mask"].shape == (2, longest)
            assert np.all(batch["input_ids"][batch["attention_mask"] == 1] == 7)  # no token cut off
            assert batch["pixels"].shape == (2, 3)
        widths = sorted(batch["input_ids"].shape[1] for batch in runner.fed)
        assert point.shapes == {name: {"min": [2, widths[0]], "p50": [2, widths[1]], "max": [2, widths[2]]}
                                for name in ("input_ids", "attention_mask")}  # fmt: skip


def test_cold_start_runs_the_first_batch_of_the_timed_rotation_cut_to_its_own_length() -> None:
    """The first run timed the file's first row at the set's padded length: a 5-token row run at 60 tokens, while
    the steady state times shuffled rows each cut back to its own length. It now runs the rotation's first batch."""
    lengths = np.array([5, 60, *range(20, 78, 2)])
    mask = (np.arange(60)[None, :] < lengths[:, None]).astype(np.int64)
    feeds = {"input_ids": mask * np.arange(len(lengths))[:, None], "attention_mask": mask}
    padding = Padding("attention_mask", ("input_ids", "attention_mask"))
    for rows in (1, 4):
        runner = _Feeding()
        measure_cold_start(lambda runner=runner: runner, feeds, rows, padding)
        steady = _Feeding()
        measure_steady_state(steady, feeds, [rows], warmup=0, iterations=1, padding=padding)
        [first] = runner.fed
        assert first.keys() == steady.fed[0].keys()
        assert all(np.array_equal(first[name], steady.fed[0][name]) for name in first)
        assert first["input_ids"].shape == (rows, int(first["attention_mask"].sum(axis=1).max()))
