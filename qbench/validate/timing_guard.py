"""Keep a process's background work out of its timed sections.

A sweep writes each finished variant to MLflow on a thread while it goes on measuring the next
(qbench.track_writer): most of a store write is waiting on the disk (a sqlite commit's fsyncs), which
costs no CPU, but the store client's own Python work would land inside another variant's latency
figures on a small machine. So timed code runs inside `timed()`, background work one step at a
time inside `between_timings()`: a step waits while anything is timed, and a timed section waits for
the step under way (one store call, milliseconds) before its clock starts. What timed sections spent
waiting is kept in `waited_s`, for a sweep to count as tracking rather than inference.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class TimingGuard:
    """Timed sections (any thread, nested) against background steps (see the module docstring)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._timed = 0  # timed sections open
        self._busy = 0  # background steps under way
        self.waited_s = 0.0

    @contextmanager
    def timed(self) -> Iterator[None]:
        """A section whose clock no background step may share: it starts once the step under way has ended."""
        with self._changed:
            self._timed += 1
            if self._busy:
                started = time.perf_counter()
                self._changed.wait_for(lambda: not self._busy)
                self.waited_s += time.perf_counter() - started
        try:
            yield
        finally:
            with self._changed:
                self._timed -= 1
                self._changed.notify_all()

    @contextmanager
    def between_timings(self) -> Iterator[None]:
        """One step of background work, started when no section is timed; timed sections wait for its end."""
        with self._changed:
            self._changed.wait_for(lambda: not self._timed)
            self._busy += 1
        try:
            yield
        finally:
            with self._changed:
                self._busy -= 1
                self._changed.notify_all()


GUARD = TimingGuard()  # the process's one guard: every timed section and background step of it goes through it


def timed_section(function: Callable[P, T]) -> Callable[P, T]:
    """Run `function` as one timed section of GUARD."""

    @functools.wraps(function)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> T:
        with GUARD.timed():
            return function(*args, **kwargs)

    return guarded
