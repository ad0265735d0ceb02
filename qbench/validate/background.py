"""Work that runs beside the measurements and must be idle while anything is timed.

The sweep's MLflow logging runs in a process of its own (qbench.track.process) so that importing MLflow and
writing to its store overlap the sweep's building and scoring instead of adding to its wall time. On a machine of
two cores a second busy process slows the runs being timed, so `measure` calls `settle_before_timing()` before it
times anything: every such worker registered here first finishes the work it was handed. Nothing new is handed
to it until the measurement returns (only the thread that measures hands it work). While one is still busy, a
sweep that runs its jobs in its own process starts the builds that are ready before the measurements that are
(`busy_beside_timing`): they need no quiet machine, and the measurement would only wait.

A worker may hold what it is handed after a measurement (the MLflow logging of the variant just measured) instead
of starting it at once: a measurement that simulates serving load times its runs first, then computes the
simulation, which times nothing, then times real serving runs. It settles keeping the held work (`keep_held`) before
its first timed run, hands it over as the simulation starts (`hand_over_beside_timing`) and settles all of it before
the real serving runs: the logging runs beside the simulation on the second core instead of being waited for before
the first timed run. Any other settle hands the held work over first, so what is held never waits past the next
timed run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class BackgroundWorker(Protocol):
    def settle(self, *, keep_held: bool = False) -> None:
        """Return once the worker has done all it was handed; unless `keep_held`, what it holds is handed over first."""

    def hand_over(self) -> None:
        """Start what it holds, without waiting for it (answers at once)."""

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


def settle_before_timing(*, keep_held: bool = False) -> None:
    """Wait until every worker beside the measurements is idle; with `keep_held`, what they hold stays held, to be
    handed over in an untimed stretch to come (see the module docstring)."""
    for worker in tuple(_workers):
        worker.settle(keep_held=keep_held)


def hand_over_beside_timing() -> None:
    """Let every worker start what it holds: the caller computes something that times nothing meanwhile."""
    for worker in tuple(_workers):
        worker.hand_over()


def busy_beside_timing() -> bool:
    """Whether a worker beside the measurements has work left, which a measurement starting now would wait for."""
    return any(worker.busy() for worker in tuple(_workers))
