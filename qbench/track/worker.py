"""The tracking process (started by qbench.track.process): one sweep's SweepTracker, driven by the calls it is sent.

It imports MLflow as it starts, then runs each call in the order sent (a sweep's, then the next sweep's of the same
process: it is kept idle between them) and answers it with the call's value and
the store's failure so far; qbench's log records go back to be logged by the sweep's process. An unexpected error
in a call counts as the store's failure (the runs end FAILED, later calls are skipped, the sweep goes on). When
the sweep's process goes away without ending the runs (its pipe closes: SIGKILL, a native crash), they are ended
KILLED here. A call sent held waits, in order, until any other call but `settle` comes (`hand_over` is nothing
else), or the pipe closes: it is then run first.

The calls are read off the pipe as they come, from the moment the process starts, by a thread that does nothing
else (`_drain`): the sweep's process never waits for this one to take what it sends. A pipe holds 64 KiB, and the
opening of the runs carries the evaluation and calibration rows (220 KiB for the digits demo): sent while MLflow was
still importing here, it held the sweep until that import was done (1.3-1.9 s of a `qbench sweep` of the digits demo
on a loaded 2-CPU machine), its builds waiting with it. Now they run beside the import, and the first timed run waits
only for what is left of it and of the opening (0.9 s less waiting a sweep). The calls are unpickled, in order, by
the thread that runs them: the one that reads them imports nothing beside MLflow's import.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import ExitStack
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any, NoReturn

from qbench.errors import QbenchError
from qbench.startup import uncollected_setup

if TYPE_CHECKING:
    from qbench.track.tracker import SweepTracker

_CALLS = ("variant_started", "variant_finished", "close", "abort")  # SweepTracker's, once open
# calls that leave the held ones held: the rest run them first (qbench.track.process.RemoteTracker._hand)
_KEEPING_HELD = ("held", "settle")


class _Forward(logging.Handler):
    """qbench's log records, sent to the sweep's process."""

    def __init__(self, send: Callable[[tuple[Any, ...]], None]) -> None:
        super().__init__()
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            self._send(("log", {"name": record.name, "levelno": record.levelno, "levelname": record.levelname,
                                "msg": text, "created": record.created, "msecs": record.msecs,
                                "pathname": record.pathname, "lineno": record.lineno, "funcName": record.funcName,
                                "module": record.module, "process": record.process}))  # fmt: skip
        except Exception:  # noqa: BLE001 - logging never raises into the logged code
            self.handleError(record)


class _Session:
    def __init__(self, send: Callable[[tuple[Any, ...]], None]) -> None:
        self._send = send
        self._scope = ExitStack()
        self.tracker: SweepTracker | None = None
        self.ended = False
        self.held: list[tuple[int, str, tuple[Any, ...], dict[str, Any]]] = []

    def take(self, number: int, call: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Run `call`, after the calls held unless it keeps them held; a `held` call is kept."""
        if call == "held":
            self.held.append((number, *args))
            return
        if call not in _KEEPING_HELD:
            self.run_held()
        self.run(number, call, args, kwargs)

    def run_held(self) -> None:
        while self.held:  # one at a time: the sweep's process gone while one runs, `gone` runs the rest
            number, call, args, kwargs = self.held.pop(0)
            self.run(number, call, args, kwargs)

    def run(self, number: int, call: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        value = None
        try:
            if call == "open":
                self._open(*args, **kwargs)
            elif call in _CALLS and self.tracker is not None:
                value = getattr(self.tracker, call)(*args, **kwargs)
                self.ended = self.ended or call in ("close", "abort")
            elif call not in ("settle", "hand_over"):
                raise QbenchError(f"the MLflow logging process has no call {call!r} (or no runs open for it)")
        except QbenchError as exc:
            self._send(("raised", number, str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - a bug in the logging costs MLflow its runs, not the sweep its results
            if self.tracker is None:
                self._send(("raised", number, f"MLflow tracking could not start: {type(exc).__name__}: {exc}"))
                return
            self._failed(exc)
        self._send(("done", number, value, self.tracker.failure if self.tracker is not None else None))

    def _open(self, recipe: Any, run_name: str, cwd: str, environment: dict[str, str], **kwargs: Any) -> None:
        """A sweep's runs, in its folder and environment; the runs of the sweep before (ended) are let go."""
        from qbench.track.tracker import SweepTracker
        from qbench.validate.catalogue import custom_metrics

        self.orphaned()
        self._scope.close()
        self.tracker, self.ended = None, False
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environment)
        self._scope.enter_context(custom_metrics(recipe.custom_metrics()))  # as the sweep scores them
        with uncollected_setup(own_process=True):  # the store's schema and MLflow's own imports, made as it opens
            self.tracker = SweepTracker.open(recipe, run_name, **kwargs)

    def _failed(self, exc: Exception) -> None:
        assert self.tracker is not None
        if self.tracker.failure is None:
            self.tracker.failure = f"MLflow tracking failed: {type(exc).__name__}: {exc}"
            logging.getLogger("qbench.track.tracker").warning(
                "%s; the sweep goes on without MLflow (its runs are ended FAILED)", self.tracker.failure)
            self.tracker.abort("FAILED", "failed: MLflow logging error")
            self.ended = True

    def gone(self) -> None:
        """The sweep's process went away: the calls held (the variants it finished) still run, unanswered, then its
        runs are ended."""
        self._send = lambda message: None
        self.run_held()
        self.orphaned()

    def orphaned(self) -> None:
        """The sweep's process went away without ending its runs."""
        if self.tracker is not None and not self.ended and self.tracker.failure is None:
            self.tracker.abort("KILLED", "killed: its process ended without ending its MLflow runs")


def serve(calls_fd: int, answers_fd: int, level: int) -> NoReturn:
    """`main`, then the process ends without the interpreter's teardown, which the sweep's process would wait for as
    it exits (with MLflow's SQL store open, tearing its modules down takes about 0.6 s on 2 cores). Everything the
    process was handed is done by then: the runs are ended and each store call committed. The exit handlers still
    run first (MLflow's own: its telemetry, its temporary folders; logging's flush), as the interpreter would run
    them, then the standard streams are flushed."""
    code = main(calls_fd, answers_fd, level)
    atexit._run_exitfuncs()  # the interpreter's own first step of an exit, without the teardown after it
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    os._exit(code)


def main(calls_fd: int, answers_fd: int, level: int) -> int:
    # an interrupted sweep ends its runs itself (abort): Ctrl+C, and a SIGTERM to the process group (a CI job's
    # timeout), reach this process too, and ended here first they would leave the runs RUNNING; should the sweep's
    # process die instead, the pipe closes and its runs are ended KILLED here
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    calls: queue.SimpleQueue[bytes | Exception] = queue.SimpleQueue()
    threading.Thread(target=_drain, args=(Connection(calls_fd, writable=False), calls), daemon=True,
                     name="qbench-tracking-calls").start()
    answers = Connection(answers_fd, readable=False)
    lock = threading.Lock()  # MLflow's system-metrics thread may log too

    def send(message: tuple[Any, ...]) -> None:
        with lock:
            answers.send(message)

    logger = logging.getLogger("qbench")
    logger.setLevel(level)
    logger.propagate = False
    logger.addHandler(_Forward(send))
    with uncollected_setup(own_process=True):  # this process ends with the sweep's pipe
        import qbench.track.tracker  # noqa: F401 - MLflow's import, the cost this process takes off the sweep's path

    session = _Session(send)
    while True:
        message = calls.get()
        if isinstance(message, (EOFError, OSError)):  # the pipe closed, between calls or inside one (the sweep's
            session.gone()  # process died as it sent it): either way the sweep's process is gone
            return 0
        if isinstance(message, Exception):
            raise message
        number, call, args, kwargs = ForkingPickler.loads(message)
        try:
            session.take(number, call, args, kwargs)
        except OSError:  # the sweep's process is gone: nobody reads the answers
            session.gone()
            return 0


def _drain(calls: Connection, into: queue.SimpleQueue[bytes | Exception]) -> None:
    """Each call's bytes, read as they come, put `into` the queue; then the error that ended the reading (EOFError:
    the sweep's process closed the pipe, or died; OSError: it died inside a call's bytes)."""
    while True:
        try:
            into.put(calls.recv_bytes())
        except Exception as exc:  # noqa: BLE001 - handed to the thread that runs the calls
            into.put(exc)
            return
