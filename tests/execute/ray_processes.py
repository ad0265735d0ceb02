"""Ray clusters a test starts: the processes they started must all be gone once they are stopped (a helper module,
not a test module)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest


def child_pids() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


@contextmanager
def stopped_without_survivors(stop: Callable[[], object], before: set[int]) -> Iterator[list[int]]:
    """Yields the pids of this process's children that are not in `before` (taken just before the cluster started:
    other fixtures' servers are not the cluster's); on exit calls `stop` and fails the test if any of those processes
    is still alive 30 s later."""
    import psutil

    started = sorted(child_pids() - before)
    try:
        yield started
    finally:
        stop()
        deadline = time.monotonic() + 30
        alive = started
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in started if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
            time.sleep(0.2)
        if alive:
            pytest.fail(f"Ray processes survived the cluster's stop: {alive}")
