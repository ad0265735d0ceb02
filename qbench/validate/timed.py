"""Timed regions: background work in this process (MLflow writes) never runs while latency is being timed.

A sweep hands its MLflow writes to a background thread so that they overlap with the untimed work
(building the next variant, scoring its outputs) instead of adding to the sweep's wall time. A thread
that took the GIL or a core while ONNX Runtime was being timed would show up in the latency figures,
so the two take turns:

- `timed_region()` wraps everything whose duration is reported (session creation and first run,
  warm-up and timed runs, the batcher's idle starts). On entry it stops background steps from
  starting and waits for the one under way, if any, to finish.
- `background_step()` wraps one unit of background work (one store call); it starts only when no
  timed region is open or waiting.

The turn-taking is within one process: work in other processes (a Ray worker timing a variant while
the driver logs) is not held back by it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager


class TimedRegions:
    """Who has the machine now: timed regions (any number, any thread) or background steps, never both."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._timing = 0  # timed regions open or waiting to open
        self._background = 0  # background steps running
        self.waited_s = 0.0  # how long timed regions have waited, in all, for a background step to finish

    @contextmanager
    def timed(self) -> Iterator[None]:
        with self._condition:
            self._timing += 1  # from now no background step starts
            try:
                if self._background:
                    started = time.perf_counter()
                    self._condition.wait_for(lambda: self._background == 0)
                    self.waited_s += time.perf_counter() - started
            except BaseException:  # interrupted while waiting (Ctrl+C): background work must not stay held off
                self._timing -= 1
                self._condition.notify_all()
                raise
        try:
            yield
        finally:
            with self._condition:
                self._timing -= 1
                self._condition.notify_all()

    @contextmanager
    def background(self) -> Iterator[None]:
        with self._condition:
            self._condition.wait_for(lambda: self._timing == 0)
            self._background += 1
        try:
            yield
        finally:
            with self._condition:
                self._background -= 1
                self._condition.notify_all()


_REGIONS = TimedRegions()


def timed_region() -> AbstractContextManager[None]:
    """Hold background work in this process off while the block times something (see the module docstring)."""
    return _REGIONS.timed()


def background_wait_s() -> float:
    """Seconds timed regions in this process have waited for background steps so far (a running total): the cost
    of the background work that still fell on the timed path, which callers report apart from what they timed."""
    return _REGIONS.waited_s


def background_step() -> AbstractContextManager[None]:
    """Run the block only while nothing in this process is being timed (see the module docstring)."""
    return _REGIONS.background()
