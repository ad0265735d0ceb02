"""A sweep's MLflow runs, driven in a process of their own (qbench.track.worker runs qbench.track.tracker.SweepTracker
there).

Importing MLflow takes about a second, and each variant's logging (metrics, datasets, the model) a tenth of one:
in the sweep's own process both add to its wall time, a fifth of a small model's sweep. In the tracking process
they overlap what the sweep does meanwhile: its own imports and preparation (`qbench sweep` starts the process
first: `prestart`), then the variants' builds. Calls that only log are handed over without waiting, and so is
the opening of the runs where the sweep's jobs run in its own process (`open(wait=False)`); ending the runs waits
for its answer. Before anything is timed, `measure` waits until the process has done all it was handed
(qbench.validate.background), so no MLflow work runs beside a timed run; while it is busy, ready builds go first.
A finished variant's logging is sent held: the process keeps it until the next stretch that times nothing (a
build, the next measurement's load simulation, the range analysis) or the next full settle, so that it is not
waited for before the next measurement's timed runs; kept in the process, it is logged should the sweep's die.

What the sweep sees is what SweepTracker gives it: opening fails with a QbenchError naming the store (from `open`,
or, when it did not wait, from the first call that waits: before anything is timed); a store failing later is
`failure`, and the sweep goes on. Two more failures count as the store's: an unexpected error in
the logging (it ends the runs FAILED, as a store's failure does), and the tracking process dying. If the sweep's
own process dies (SIGKILL, a native crash), the tracking process ends its runs KILLED.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from contextlib import ExitStack
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import qbench
from qbench.errors import QbenchError
from qbench.supervisor import cause, supervised
from qbench.validate.background import settled_before_timing

if TYPE_CHECKING:
    from qbench.gate.evaluate import GateReport
    from qbench.recipe.spec import Recipe
    from qbench.results.schema import SweepResults, VariantResult
    from qbench.sweep.data import SweepData

logger = logging.getLogger(__name__)

WORKER_MODULE = "qbench.track.worker"
ENDED_AFTER_S = 60.0  # the process, its pipe closed, ends at once (after its last call); it is killed after this


class TrackingProcess:
    """The tracking process, the pipe of calls to it and a thread taking its answers and log records."""

    def __init__(self, level: int | None = None) -> None:
        """`level`: the least level of the log records it passes on (default: the `qbench` logger's, as of now)."""
        calls_read, calls_write = os.pipe()
        answers_read, answers_write = os.pipe()
        level = logging.getLogger("qbench").getEffectiveLevel() if level is None else level
        try:
            self._process = subprocess.Popen(_worker_command(calls_read, answers_write, level),
                                             pass_fds=(calls_read, answers_write), stdin=subprocess.DEVNULL,
                                             stdout=_stderr_fd())  # fmt: skip
        except OSError as exc:
            os.close(calls_write)
            os.close(answers_read)
            raise QbenchError(f"cannot start the MLflow logging process: {exc}") from exc
        finally:  # the worker's ends, which it holds now
            os.close(calls_read)
            os.close(answers_write)
        self._calls = Connection(calls_write, readable=False)
        self._answers: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._sent = 0
        self._answered = 0  # the last call answered (set by the reading thread; answers come in order)
        self.started_with = _startup_environment()
        self.failure: str | None = None  # the store's first failure, as of the last answer
        self.gone: str | None = None  # why the process no longer answers
        reader = threading.Thread(target=self._read, args=(Connection(answers_read, writable=False),), daemon=True,
                                  name="qbench-tracking-answers")  # fmt: skip
        reader.start()

    def _read(self, answers: Connection) -> None:
        """Log records are logged here as they come; answers wait in the queue for `wait`."""
        while True:
            try:
                message = answers.recv()
            except (EOFError, OSError):
                answers.close()
                self._answers.put(None)
                return
            if message[0] == "log":
                record = logging.makeLogRecord(message[1])
                logging.getLogger(record.name).handle(record)
            else:
                self._answered = message[1]
                self._answers.put(message)

    def send(self, call: str, *args: object, **kwargs: object) -> int:
        """Hand `call` over; its number, for `wait` (0: not handed over, the process is gone)."""
        if self.gone is not None:
            return 0
        self._sent += 1
        try:
            self._calls.send((self._sent, call, args, kwargs))
        except OSError:
            self._lost()
            return 0
        except Exception as exc:  # noqa: BLE001 - not picklable: what it carries cannot reach MLflow
            self._give_up(f"MLflow tracking failed: {call} could not be handed to its logging process "
                          f"({type(exc).__name__}: {exc})")  # fmt: skip
            return 0
        return self._sent

    def _give_up(self, reason: str) -> None:
        """End the runs FAILED, as after a store's failure, and hand nothing more over."""
        self._sent += 1
        with contextlib.suppress(OSError):
            self._calls.send((self._sent, "abort", ("FAILED", "failed: MLflow logging error"), {}))
        self.gone = reason
        self.failure = self.failure or reason
        logger.warning("%s; the sweep goes on without MLflow", reason)

    @property
    def busy(self) -> bool:
        """Whether a call handed over is not answered yet."""
        return self.gone is None and self._answered < self._sent

    def wait(self, number: int) -> Any:
        """The answer to call `number`, once every call before it is done; a QbenchError where it raised one."""
        while number and self.gone is None:
            message = self._answers.get()
            if message is None:
                self._lost()
                break
            kind, answered = message[0], message[1]
            if kind == "done":
                self.failure = message[3]
            if answered == number:
                if kind == "raised":
                    raise QbenchError(message[2])
                return message[2]
        return None

    def _lost(self) -> None:
        try:
            status = self._process.wait(timeout=ENDED_AFTER_S)
        except subprocess.TimeoutExpired:
            status = None
        how = "stopped answering" if status is None else _ended(status)
        self.gone = f"MLflow tracking failed: its logging process {how}"
        self.failure = self.failure or self.gone
        logger.warning("%s; the sweep goes on without MLflow", self.gone)

    def let_go(self) -> None:
        """Close the pipe: the process ends after its last call (`close` waits for that)."""
        self.gone = self.gone or "was let go"  # nothing more is handed over
        self._calls.close()

    def close(self) -> None:
        """Close the pipe (the process ends after its last call) and wait for the process to end."""
        self.let_go()
        try:
            self._process.wait(timeout=ENDED_AFTER_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def _ended(status: int) -> str:
    """How the process ended, from its exit status (negative: the signal that killed it)."""
    return f"died: {cause(-status)}" if status < 0 else f"ended with status {status}"


def _startup_environment() -> dict[str, str]:
    """What an interpreter's start depends on in the environment (PYTHONPATH, PYTHONHOME...): an idle process started
    under other values is not reused."""
    return {name: value for name, value in os.environ.items() if name.startswith("PYTHON")}


def _worker_command(calls: int, answers: int, level: int) -> list[str]:
    """This interpreter on the worker, with the qbench this process imported first on its path; the current folder
    is not put on it (`-P`): a module there named like one of MLflow's would be imported instead."""
    root = str(Path(qbench.__file__).resolve().parents[1])
    start = (f"import sys\nif {root!r} not in sys.path: sys.path.insert(0, {root!r})\n"
             f"from {WORKER_MODULE} import serve\nserve({calls}, {answers}, {level})")  # fmt: skip
    return [sys.executable, "-P", "-c", start]


def _stderr_fd() -> int | None:
    """The worker prints (MLflow's own messages) to this process's stderr, never into a document on its stdout."""
    try:
        return sys.__stderr__.fileno() if sys.__stderr__ is not None else None
    except (OSError, ValueError):  # no file behind it (a notebook's stream): the worker keeps what it inherits
        return None


# a tracking process ready for the next sweep of this process: started by `prestart`, or left idle by the last sweep
# (a notebook's sweeps import MLflow once)
_idle: list[TrackingProcess] = []


def prestart(level: int | None = None) -> None:
    """Start the tracking process now, so that its import of MLflow overlaps what comes before the sweep opens its
    runs (`qbench sweep` calls this first); the sweep takes it over. Unused, it ends with this process. `level`: the
    one the command will log at, where its logging is not set up yet (TrackingProcess)."""
    if not _idle:
        _idle.append(TrackingProcess(level))


# tracking processes let go (their pipe closed) and waited for as this process exits
_ending: list[TrackingProcess] = []


def _release(process: TrackingProcess) -> None:
    """Keep a process that still answers for the next sweep (one at most); end any other. The supervised command's
    process runs one sweep: its tracking process is let go at once, and waited for as the command's process exits,
    so that its own exit (MLflow's exit handlers) runs beside the command's last steps (its summary) instead of after
    them."""
    if supervised():
        process.let_go()
        _ending.append(process)
    elif process.gone is None and not _idle:
        process.failure = None  # the store's failure was that sweep's
        _idle.append(process)
    else:
        process.close()


@atexit.register
def _close_idle() -> None:
    while _idle:
        _idle.pop().close()
    while _ending:
        _ending.pop().close()


class RemoteTracker:
    """The sweep's MLflow runs through the tracking process: SweepTracker's calls a sweep makes (see the module
    docstring)."""

    def __init__(self, process: TrackingProcess, opening: int = 0) -> None:
        self._process = process
        self._opening = opening  # the open call handed over, its answer not read yet
        self._refused: str | None = None  # why the store refused to open the runs (read from a later call's wait)
        self._holding = False  # the calls sent since a variant finished wait in the tracking process (`_hand`)
        self._settled = ExitStack()
        self._settled.enter_context(settled_before_timing(self))

    @classmethod
    def open(cls, recipe: Recipe, run_name: str, *, run_dir: Path, data: SweepData, resumes: Path | None = None,
             wait: bool = True) -> RemoteTracker:  # fmt: skip
        """SweepTracker.open in the tracking process (an idle one, if any), in this process's current folder and
        environment (MLFLOW_TRACKING_URI, a cloud store's credentials). With `wait`, returns once the runs are open;
        without, at once, and the first call that waits (`settle` before anything is timed, `close`) raises the
        store's refusal, if any."""
        process = _idle.pop() if _idle else TrackingProcess()
        if process.started_with != _startup_environment():  # PYTHONPATH changed since: another interpreter's start
            process.close()
            process = TrackingProcess()
        try:
            opening = process.send("open", recipe, run_name, os.getcwd(), dict(os.environ), run_dir=run_dir,
                                   data=data, resumes=resumes)  # fmt: skip
            if wait:
                process.wait(opening)
            if process.gone is not None:
                raise QbenchError(process.gone)
        except BaseException:
            _release(process)
            raise
        return cls(process, 0 if wait else opening)

    @property
    def failure(self) -> str | None:
        return self._process.failure

    def busy(self) -> bool:
        return self._holding or self._process.busy

    def _hand(self, call: str, *args: Any, hold: bool = False, **kwargs: Any) -> None:
        """Send `call`; with `hold`, or after a call held, the tracking process keeps it, in order, until it is handed
        over (`hand_over`, `settle`, `close`, `abort`, or this process gone: qbench.track.worker)."""
        self._holding = self._holding or hold
        if self._holding:
            self._process.send("held", call, args, kwargs)
        else:
            self._process.send(call, *args, **kwargs)

    def hand_over(self) -> None:
        """Let the tracking process start the calls it holds; returns at once."""
        if self._holding:
            self._holding = False
            self._process.send("hand_over")

    def _wait(self, number: int) -> Any:
        """The answer to call `number`, once the opening of the runs has answered: its refusal is raised (once; later
        calls, which the tracking process refuses for want of runs, answer None)."""
        opening, self._opening = self._opening, 0
        if opening:
            try:
                self._process.wait(opening)
            except QbenchError as exc:
                self._refused = str(exc)
                raise
        return None if self._refused is not None else self._process.wait(number)

    def settle(self, *, keep_held: bool = False) -> None:
        """Return once the tracking process has done every call sent to it; unless `keep_held`, the calls held are
        sent first."""
        if not keep_held:
            self.hand_over()
        self._wait(self._process.send("settle"))

    def variant_started(self, variant: str, backend: str) -> None:
        self._hand("variant_started", variant, backend)

    def variant_finished(self, results: SweepResults, variant: VariantResult, *, reused: bool = False) -> None:
        """Held: its logging (metrics, datasets, the model) waits for the next untimed stretch (`hand_over`) or
        settle (qbench.validate.background)."""
        self._hand("variant_finished", results, variant, hold=True, reused=reused)

    def close(self, results: SweepResults, recipe: Recipe, gate: GateReport | None,
              artifacts: Sequence[Path]) -> str | None:  # fmt: skip
        """SweepTracker.close: the parent run's id, None when the store failed (`failure` says how). An interruption
        before the sweep lets go of the tracker (`end`) still ends the runs KILLED (`abort`), as in-process."""
        return self._wait(self._process.send("close", results, recipe, gate, artifacts))

    def abort(self, status: str, reason: str) -> None:
        """SweepTracker.abort: end the runs `status`; nothing is raised (runs the store refused to open are none to
        end). The tracking process ends too."""
        try:
            with contextlib.suppress(QbenchError):  # the opening's refusal: the sweep reports its own error
                self._wait(self._process.send("abort", status, reason))
        finally:
            self.end()

    def end(self) -> None:
        """Let go of the tracking process: kept idle for this process's next sweep, or ended."""
        self._settled.close()
        _release(self._process)
