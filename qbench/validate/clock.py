"""The sweep's phase clock, which the scheduler, each measurement and the search add to."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class PhaseClock:
    """Seconds spent per phase (build, inference, report...), so a sweep's own overhead can be reported."""

    seconds: dict[str, float] = field(default_factory=dict)
    carved: float = 0.0  # seconds `within` gave their own phase so far, which the enclosing phase leaves out

    def add(self, phase: str, started: float, *, less: float = 0.0) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - started - less

    @contextmanager
    def within(self, phase: str) -> Iterator[None]:
        """Time spent in the block is `phase`'s, inside another phase that leaves it out (`add(..., less=)` with
        what `carved` grew by): the load simulation is computed inside a measurement, and is no inference."""
        started = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - started
            self.seconds[phase] = self.seconds.get(phase, 0.0) + spent
            self.carved += spent

    def merge(self, seconds: Mapping[str, float]) -> None:
        """Add the phases another clock measured (a job run in a worker)."""
        for phase, value in seconds.items():
            self.seconds[phase] = self.seconds.get(phase, 0.0) + value
