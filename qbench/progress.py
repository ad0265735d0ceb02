"""Progress of long library work (calibration batches, timed runs, row passes), reported to whoever asked.

Library code never draws anything: it calls `track` / `track_rows`, which report to the reporter of the
current context. A caller passes its reporter in with `reporting_progress(reporter)` (the CLI passes one
that draws rich progress bars); without one, progress goes nowhere and only `logging` speaks.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

T = TypeVar("T")

Advance = Callable[[int], None]


class ProgressReporter(Protocol):
    """Shows one unit of work of `total` steps (None: unknown) while the context is open; the yielded
    callable is told how many steps just finished."""

    def steps(self, description: str, total: int | None) -> contextlib.AbstractContextManager[Advance]: ...


class SilentProgress:
    """The reporter when none was passed in: steps are counted by nobody."""

    @contextlib.contextmanager
    def steps(self, description: str, total: int | None) -> Iterator[Advance]:
        yield lambda done: None


_current: contextvars.ContextVar[ProgressReporter] = contextvars.ContextVar("qbench_progress", default=SilentProgress())


@contextlib.contextmanager
def reporting_progress(reporter: ProgressReporter) -> Iterator[ProgressReporter]:
    """Report the progress of everything run inside this block to `reporter`."""
    token = _current.set(reporter)
    try:
        yield reporter
    finally:
        _current.reset(token)


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate over `items`, one step each, reported to the current reporter."""
    with _current.get().steps(description, total) as advance:
        for item in items:
            yield item
            advance(1)


@contextlib.contextmanager
def track_rows(total: int, description: str) -> Iterator[Advance]:
    """For loops whose steps vary in size: yields `advance(rows)` over `total` rows."""
    with _current.get().steps(description, total) as advance:
        yield advance
