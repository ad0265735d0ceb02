"""The timing guard: background steps never share a timed section's clock, and what timed sections waited is kept."""

from __future__ import annotations

import threading
import time

import numpy as np

from qbench.validate.latency import measure_samples
from qbench.validate.timing_guard import GUARD, TimingGuard


def test_a_background_step_waits_until_no_section_is_timed() -> None:
    guard = TimingGuard()
    ran = threading.Event()

    def step() -> None:
        with guard.between_timings():
            ran.set()

    with guard.timed():
        with guard.timed():  # nested: the outer section still holds the step back when the inner one ends
            worker = threading.Thread(target=step)
            worker.start()
            assert not ran.wait(0.2)
        assert not ran.wait(0.1)
    assert ran.wait(5)
    worker.join()


def test_a_timed_section_starts_after_the_step_under_way_and_counts_its_wait() -> None:
    guard = TimingGuard()
    inside, release = threading.Event(), threading.Event()

    def step() -> None:
        with guard.between_timings():
            inside.set()
            release.wait(5)

    worker = threading.Thread(target=step)
    worker.start()
    assert inside.wait(5)
    threading.Timer(0.3, release.set).start()
    started = time.perf_counter()
    with guard.timed():
        entered_after = time.perf_counter() - started
        assert release.is_set()
    worker.join()
    assert entered_after >= 0.25
    assert 0.25 <= guard.waited_s <= entered_after + 0.01


class _Runner:
    """A runner that records, at every run, whether a background step of the process's guard was under way."""

    def __init__(self) -> None:
        self.overlapped = 0
        self.runs = 0

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.runs += 1
        self.overlapped += GUARD._busy  # noqa: SLF001 - what the guard must keep at 0 while timing
        time.sleep(0.0005)
        return [feeds["x"]]


def test_latency_is_timed_with_no_background_step_under_way() -> None:
    """Background steps hammering the guard from another thread never run while measure_samples times."""
    stop = threading.Event()
    steps = 0

    def background() -> None:
        nonlocal steps
        while not stop.is_set():
            with GUARD.between_timings():
                steps += 1
                time.sleep(0.001)

    runner = _Runner()
    worker = threading.Thread(target=background)
    worker.start()
    try:
        time.sleep(0.02)
        measure_samples(runner, {"x": np.zeros((16, 2), np.float32)}, [1, 4], warmup=2, iterations=60)
    finally:
        stop.set()
        worker.join()
    assert runner.runs == 2 * (2 + 60) and steps > 0
    assert runner.overlapped == 0
