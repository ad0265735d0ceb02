"""Waiting for a sampler thread's samples in tests: a fixed sleep gets fewer on a loaded machine, where the thread
waits for a CPU between samples; the deadline only stops a sampler that never samples."""

from __future__ import annotations

import time
from collections.abc import Sized


def wait_for_samples(samples: Sized, count: int, deadline_s: float = 60.0, poll_s: float = 0.002) -> None:
    """Return once `samples` (the list a sampler thread appends to) holds at least `count`; fail past `deadline_s`."""
    give_up = time.monotonic() + deadline_s
    while len(samples) < count:
        assert time.monotonic() < give_up, f"{len(samples)} of {count} samples after {deadline_s} s"
        time.sleep(poll_s)
