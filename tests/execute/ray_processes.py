"""Ray clusters a test starts: the processes they started must all be gone once they are stopped (a helper module,
not a test module)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def stopped_without_survivors(stop: Callable[[], object]) -> Iterator[list[int]]:
    """Yields the pids of this process's children (the cluster just started); on exit calls `stop` and fails the
    test if any of those processes is still alive 30 s later."""
    import psutil

    started = [p.pid for p in psutil.Process().children(recursive=True)]
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
