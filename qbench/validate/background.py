"""Work that runs beside the measurements and must be idle while anything is timed.

The sweep's MLflow logging runs in a process of its own (qbench.track_process) so that importing MLflow and
writing to its store overlap the sweep's building and scoring instead of adding to its wall time. On a machine of
two cores a second busy process slows the runs being timed, so `measure` calls `settle_before_timing()` before it
times anything: every such worker registered here first finishes the work it was handed. Nothing new is handed
to it until the measurement returns (only the thread that measures hands it work).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

_settlers: list[Callable[[], None]] = []


@contextmanager
def settled_before_timing(settle: Callable[[], None]) -> Iterator[None]:
    """Within the block, `settle` (which returns once its worker is idle) runs before each timed measurement."""
    _settlers.append(settle)
    try:
        yield
    finally:
        _settlers.remove(settle)


def settle_before_timing() -> None:
    """Wait until every worker beside the measurements is idle (see the module docstring)."""
    for settle in tuple(_settlers):
        settle()
