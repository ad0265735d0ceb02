"""The sweep's MLflow writes on a thread of their own, in order, never while latency is being timed.

Each variant's logging (its child run, metrics, LoggedModel) costs a tracking server several round
trips. Made in the sweep's thread they add up; handed to `BackgroundWriter` they run while the sweep
builds and scores the next variant (the server does the work; this thread mostly waits on the
network), and wait whenever a timed region is open (qbench.validate.timed).

A local store (sqlite, files) is written by this process: its writes are Python work that would
compete with the sweep's own for the interpreter (measured on the digits demo with sqlite: no gain,
slightly slower), so for such a store the writer is `inline`: each call runs at once, in the caller's
thread, and raises there.

Calls run one at a time in the order submitted. An exception a call raises is kept and raised by the
next `drain()` (the calls after it are skipped): the owner decides, as it would have for a call made
in its own thread. Store failures are the owner's to catch inside its calls (SweepTracker does).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from qbench.validate.timed import background_step

logger = logging.getLogger(__name__)

_STOP = object()


class BackgroundWriter:
    def __init__(self, name: str = "qbench-mlflow", *, inline: bool = False) -> None:
        self._calls: queue.Queue[object] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._inline = inline
        self._closed = False
        if not inline:
            self._thread.start()

    def submit(self, call: Callable[[], object]) -> None:
        """Run `call` after every call submitted before it (at once, when `inline`)."""
        if self._closed:
            raise RuntimeError("the background writer is closed")
        if self._inline:
            call()
        else:
            self._calls.put(call)

    def drain(self) -> None:
        """Wait until every submitted call has run; raise the first exception one of them raised."""
        self._calls.join()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Run what is queued, then end the thread (idempotent); raises as `drain` does."""
        self._closed = True
        if self._thread.is_alive():
            self._calls.put(_STOP)
            self._thread.join()
        self.drain()

    def _serve(self) -> None:
        while True:
            call = self._calls.get()
            try:
                if call is _STOP:
                    return
                if self._error is None:
                    with background_step():
                        call()  # type: ignore[operator]
            except BaseException as exc:  # noqa: BLE001 - raised in the owner's thread by drain()
                logger.debug("background MLflow call failed: %r", exc)
                self._error = exc
            finally:
                self._calls.task_done()
