"""Work that runs beside the measurements and must be idle while anything is timed.

The sweep's MLflow logging runs in a process of its own (qbench.track_process) so that importing MLflow and
writing to its store overlap the sweep's building and scoring instead of adding to its wall time. On a machine of
two cores a second busy process slows the runs being timed, so `measure` calls `settle_before_timing()` before it
times anything: every such worker registered here first finishes the work it was handed. Nothing new is handed
to it until the measurement returns (only the thread that measures hands it work). While one is still busy, a
sweep that runs its jobs in its own process starts the builds that are ready before the measurements that are
(`busy_beside_timing`): they need no quiet machine, and the measurement would only wait.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class BackgroundWorker(Protocol):
    def settle(self) -> None:
        """Return once the worker has done all it was handed."""

    def busy(self) -> bool:
        """Whether it still has work it was handed (answers at once)."""


_workers: list[BackgroundWorker] = []


@contextmanager
def settled_before_timing(worker: BackgroundWorker) -> Iterator[None]:
    """Within the block, `worker` settles before each timed measurement."""
    _workers.append(worker)
    try:
        yield
    finally:
        _workers.remove(worker)


def settle_before_timing() -> None:
    """Wait until every worker beside the measurements is idle (see the module docstring)."""
    for worker in tuple(_workers):
        worker.settle()


def busy_beside_timing() -> bool:
    """Whether a worker beside the measurements has work left, which a measurement starting now would wait for."""
    return any(worker.busy() for worker in tuple(_workers))
