"""SIGINT/SIGTERM: turned into an exception a long job cleans up after (at safe points only), or passed
on to a child process group (`run_process_group`, for `qbench ui`).

    with SignalGuard() as guard:
        ...                          # a signal raises Interrupted here
        with guard.shielded():
            write_the_store()        # a signal waits until this block ends, then raises
        ...
    except Interrupted: guard.ignore(); clean up (no second signal cuts the clean-up short)

Code below the guard's owner (a job function that must write what it finished before a signal can stop it) shields
itself with `held()`, the innermost active guard's `shielded()` (nothing where no guard is active: a Ray worker).

`Interrupted` is a BaseException so that `except Exception` (one variant's failure is recorded and
the sweep goes on) never swallows it. Outside the main thread no handler can be installed: the guard
then does nothing and the process's default handling stays.

A signal that lands inside the runtime's own locking code (the import system taking a module lock,
threading, queue, logging handlers) is not raised there: an exception between a lock's acquire and
the code that releases it leaves the lock held, and the clean-up then waits for ever on a thread
that needs it (seen: MLflow's system-metrics thread importing while the main thread was stopped
inside an import). It is raised again 50 ms later (SIGALRM), once the main thread is elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from qbench.errors import QbenchError

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_RETRY_S = 0.05
_LOCKING_CODE = ("<frozen importlib._bootstrap>", f"{os.sep}threading.py", f"{os.sep}queue.py",
                 os.path.join("logging", "__init__.py"))  # fmt: skip


_active: list[SignalGuard] = []  # the guards installed, innermost last


def _in_locking_code(frame: FrameType | None) -> bool:
    """Whether the interrupted frame is the runtime's lock handling, where an exception would leak a lock."""
    return frame is not None and frame.f_code.co_filename.endswith(_LOCKING_CODE)


class Interrupted(BaseException):
    """The job got SIGINT or SIGTERM."""

    def __init__(self, signum: int) -> None:
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"interrupted by {self.signal_name}")


class EndedBySignal(QbenchError):
    """The error a command raises in place of `Interrupted` once it cleaned up after it (a sweep marking its run
    folder incomplete, saying where its partial results are): one line and exit 2 as any QbenchError, and still a
    signal's ending (the gate's reports call it 'interrupted', qbench.cli.gate)."""

    def __init__(self, message: str, interrupted: Interrupted) -> None:
        super().__init__(message)
        self.signal_name = interrupted.signal_name


class SignalGuard:
    """Installs handlers for SIGINT and SIGTERM for the duration of a `with` block; restores the old ones after."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self._shield_depth = 0
        self._pending: int | None = None

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in _SIGNALS}
            self._previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._retry)
            _active.append(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._previous:
            signal.setitimer(signal.ITIMER_REAL, 0)
            _active.remove(self)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._shield_depth:
            self._pending = signum
            return
        if _in_locking_code(frame):
            self._pending = signum
            signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
            return
        raise Interrupted(signum)

    def _retry(self, signum: int, frame: FrameType | None) -> None:
        """SIGALRM: raise the signal held back from locking code, unless a shielded block will raise it at its end."""
        if self._pending is not None and not self._shield_depth:
            pending, self._pending = self._pending, None
            self._handle(pending, frame)

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """A block a signal must not cut in two (a store write): the signal is raised when the block ends."""
        self._shield_depth += 1
        try:
            yield
        finally:
            self._shield_depth -= 1
            if not self._shield_depth and self._pending is not None:
                signum, self._pending = self._pending, None
                raise Interrupted(signum)

    def ignore(self) -> None:
        """From now until the guard ends, SIGINT and SIGTERM are ignored (the clean-up runs to its end)."""
        if self._previous:
            signal.setitimer(signal.ITIMER_REAL, 0)
        self._pending = None
        for signum in self._previous:
            signal.signal(signum, signal.SIG_IGN)


@contextmanager
def held() -> Iterator[None]:
    """The innermost active SignalGuard's `shielded()` block; a plain block where none is active."""
    with _active[-1].shielded() if _active else contextlib.nullcontext():
        yield


def run_process_group(command: Sequence[str], stop_timeout_s: float = 10.0) -> int | None:
    """Run `command` in a session (process group) of its own until it ends; returns its exit code.

    SIGINT/SIGTERM sent to this process stop the whole group with SIGTERM (a server and every
    worker it forked: workers outlive a signal to their parent alone). Not SIGINT: a Python worker still
    starting raised KeyboardInterrupt and printed its traceback, eight of them on Ctrl+C in `qbench ui`
    (MLflow's job consumers were importing); SIGTERM ends those without a word and is a server's own
    stop request. Whatever is still alive `stop_timeout_s` later is killed. Stopped that way, it returns None: a server
    that ends by itself (whatever its status: MLflow's UI exits 0 when its port is taken) was not stopped by its user.
    """
    process = subprocess.Popen(list(command), start_new_session=True)  # the group id is the leader's pid
    received: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)

    previous = {signum: signal.signal(signum, forward) for signum in _SIGNALS}
    try:
        while process.poll() is None and not received:
            time.sleep(0.1)
        deadline = time.monotonic() + stop_timeout_s
        while received and _group_alive(process) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # workers left behind, whichever way it ended
        process.wait()
    return None if received else process.returncode


def _group_alive(process: subprocess.Popen[bytes]) -> bool:
    """Whether the leader or any process of its group still runs (reaps the leader once it has ended)."""
    if process.poll() is None:
        return True
    proc = Path("/proc")
    if not proc.is_dir():  # no /proc: a zombie left in the group counts as alive
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return False
        return True
    return any(_in_group_and_running(entry, process.pid) for entry in proc.iterdir() if entry.name.isdigit())


def _in_group_and_running(entry: Path, pgid: int) -> bool:
    """Whether /proc/<pid> is a process of group `pgid` that is not a zombie (an ended worker not yet reaped)."""
    try:
        fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, pgrp
    except (OSError, IndexError):
        return False
    return int(fields[2]) == pgid and fields[0] != "Z"
