"""The thread that makes a sweep's MLflow writes while the sweep goes on.

Logging a finished variant (its run, its model, a hundred-odd metrics) is about twenty store
transactions; on a sqlite store each commit waits for the disk, and done in line they were most of a
small model's sweep overhead. Submitted here, they run in order on one thread, one call at a time
between the sweep's timed sections (qbench.validate.timing_guard), while the sweep builds, scores and
simulates the next variant. `drain()` waits for every call submitted: the tracker drains before it
closes or aborts the sweep's runs, so nothing submitted is lost and the runs end after their figures.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from qbench.validate.timing_guard import GUARD

logger = logging.getLogger(__name__)


class BackgroundWriter:
    """Calls run in submission order on one daemon thread; the first unexpected error is raised by `drain()`
    (the tracker catches the store's own errors itself), and no later call runs."""

    def __init__(self, name: str = "qbench-mlflow-writer") -> None:
        self._calls: queue.Queue[Callable[[], object] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], object]) -> None:
        """Run `call` after every call submitted before it."""
        self._calls.put(call)

    def on_writer_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def drain(self) -> None:
        """Wait until every submitted call has run; raise the first unexpected error one raised."""
        if not self.on_writer_thread():
            self._calls.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def stop(self) -> None:
        """Drain, then end the thread (an unexpected error is raised after the thread ends)."""
        try:
            self.drain()
        finally:
            self._calls.put(None)
            if not self.on_writer_thread():
                self._thread.join()

    def _work(self) -> None:
        while True:
            call = self._calls.get()
            try:
                if call is None:
                    return
                if self._error is None:
                    with GUARD.between_timings():
                        call()
            except BaseException as exc:  # noqa: BLE001 - handed to the thread that drains
                logger.debug("MLflow writer: %s", exc)
                self._error = exc
            finally:
                self._calls.task_done()
