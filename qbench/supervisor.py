"""The `qbench` command runs its work in a child process it watches, so that a native crash keeps the exit-code
contract.

ONNX Runtime, torch or ModelOpt can die of a signal on a model nobody here wrote (a segmentation fault while
creating a session), and the out-of-memory killer sends SIGKILL: Python cannot catch either in the process that
dies. The parent (`supervise`, stdlib only: it costs one interpreter start) runs the command in a child that
inherits stdin, stdout, stderr and the environment, passes SIGINT, SIGTERM and SIGHUP on to it (the child, in a
process group of its own, gets Ctrl+C once, from here: its own interrupt handling and exit 2 stay as they were; on
Linux it gets SIGTERM should the parent die) and returns its exit code. A child dead of a signal is one line naming
the signal, the command and what to do, and exit 2.

The child tells the parent, through a pipe whose descriptor it takes out of the environment as it starts, the exit
code it finished the command with (`announce_exit`: a status 0 or 1 without it is no verdict, but a library's exit()
or os._exit() in the recipe's code) and, for a sweep, its run folder (`announce_run`): after a crash the parent
names it and writes `DIED_FILE` there (as it does whenever the child ends without finishing the command: a status
no verdict), so that `qbench sweep --resume` records the job that was running with the signal that ended it
(qbench.execute.records). A sweep's marker says it ran supervised (`supervised`): a job left running with no
`DIED_FILE` was ended from outside, which is no fault of that job: killed with the supervising process itself (the
whole process tree: a CI job cancelled, a runner gone), or by a signal this process passed on (SIGHUP: the terminal
closed), which it therefore does not record.

A sweep's process that dies of a fault (`GOING_ON`: a native library's crash, the out-of-memory killer) inside a job
does not end the sweep: the parent says so in one line naming the job and the signal and runs the same command again
as a `--resume`, which records that job failed and runs the others, a crash in any of them likewise (`_going_on`
bounds it); the command then ends with exit 2, a crashed variant being no pass. `qbench sweep --stop-on-crash` ends
it at the first crash instead, as before.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

EXIT_ERROR = 2
CODES = (0, 1, EXIT_ERROR)  # the contract: pass, breach on complete valid results, anything else
CHILD_MODULE = "qbench.cli.child"
DIED_FILE = "DIED"  # in a run folder: the signal its sweep's process died of, written by the parent
JOBS_FOLDER = "jobs"  # in a run folder: a record per finished job (qbench.execute.records)
STARTED = ".started"  # in JOBS_FOLDER: the mark of a job running in the sweep's process, removed as it is recorded
STOP_ON_CRASH = "--stop-on-crash"  # `qbench sweep`'s option: a crash inside a job ends the command, as it used to
KEEP_FAILED = "--keep-failed"  # `qbench sweep`'s hidden option: a job a resume after a crash never runs again
# `qbench sweep`'s hidden option: the run folder a resume after a crash takes up (the crashed sweep's, not the newest
# of its plan, which another sweep of the same recipe running meanwhile may have written)
RESUME_RUN = "--resume-run"
_CHANNEL = "QBENCH_SUPERVISOR_FD"
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the terminal closed (it reaches the parent only)
_PR_SET_PDEATHSIG = 1  # Linux prctl option: a signal for this process when its parent dies
_CAUSES = {
    signal.SIGSEGV: "segmentation fault (SIGSEGV) inside a native library",
    signal.SIGBUS: "bus error (SIGBUS) inside a native library",
    signal.SIGILL: "illegal instruction (SIGILL) inside a native library (often one built for another CPU)",
    signal.SIGFPE: "arithmetic fault (SIGFPE) inside a native library",
    signal.SIGABRT: "aborted (SIGABRT) by a native library",
    signal.SIGKILL: "killed (SIGKILL), often the out-of-memory killer",
}
# a fault of the sweep's own process inside a job, which the job's variant caused (a native library's crash) or the
# job's memory use (the out-of-memory killer's SIGKILL: a machine short of memory may kill the next job too, and
# each such death records one more job failed), after which the sweep goes on without that job (`_going_on`)
GOING_ON = frozenset((signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT, signal.SIGKILL))
_channel: int | None = None


def cause(signum: int) -> str:
    """What a process that died of `signum` ran into, in words."""
    with contextlib.suppress(ValueError):
        known = signal.Signals(signum)
        return _CAUSES.get(known, f"killed by {known.name}")
    return f"killed by signal {signum}"


def supervise(args: Sequence[str]) -> int:
    """Run `qbench ARGS` in a child process and return its exit code (see the module docstring); a sweep whose process
    dies of a fault inside a job is resumed (`_going_on`)."""
    _open_standard_descriptors()
    received: list[int] = []
    forwarded: list[int] = []
    child: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        for process in child[-1:]:
            if process.returncode is not None:  # ended: the next one, if any, gets it as it starts
                continue
            forwarded.append(signum)
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in _FORWARDED}
    died: dict[str, str] = {}  # job -> how the sweep's process died running it, for each resume so far
    command = list(args)
    try:
        while True:
            read_end, write_end = os.pipe()
            try:
                process = subprocess.Popen(_child_command(command), env={**os.environ, _CHANNEL: str(write_end)},
                                           pass_fds=(write_end,), process_group=0,
                                           preexec_fn=_ending_with(os.getpid()) if sys.platform == "linux" else None)
            except OSError as exc:
                os.close(read_end)
                return _say(f"qbench: error: cannot start the command's process: {exc}")
            finally:
                os.close(write_end)
            child.append(process)
            if received and not forwarded:  # a signal that came before there was a child to pass it on to
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(received[-1])
            code = process.wait()
            run, finished = _announced(read_end)
            passed_on = code < 0 and -code in received  # a signal sent to this process ended it: no fault of its job
            if run is not None and finished is None and not passed_on:  # it ended inside the sweep of `run`: say how
                _record_death(run, cause(-code) if code < 0 else f"exit status {code} before qbench finished the "
                              "command (exit() inside a library or the recipe's code)")  # fmt: skip
            jobs = _going_on(args, code, run, finished, died, stopped=bool(received))
            if not jobs or run is None:  # none without a run
                break
            died.update(dict.fromkeys(jobs, cause(-code)))
            _say(f"qbench: the `qbench sweep` process died running {', '.join(jobs)}: {cause(-code)} (the Python stack "
                 f"at that moment is above); going on with the other jobs: `--resume` of {run} records "
                 f"{'it' if len(jobs) == 1 else 'them'} failed ({STOP_ON_CRASH} stops here instead)")  # fmt: skip
            command = _resumed(args, died, run)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    verdict = _verdict(args, code, run, finished, passed_on)
    if died and finished is not None:  # a crashed variant is no pass, even one the gate does not judge
        return _say(f"qbench: error: the sweep went on after its process died in "
                    f"{'; '.join(f'{job} ({how})' for job, how in died.items())}: recorded failed, which is no pass "
                    "(exit 2); `qbench sweep --resume --rerun-failed` runs it again once the cause is fixed")
    return verdict


def _verdict(args: Sequence[str], code: int, run: Path | None, finished: int | None, passed_on: bool) -> int:
    """The exit code of the command whose (last) process ended with `code` having announced `run` and `finished`."""
    if code in CODES and (finished == code or code == EXIT_ERROR):
        return code
    if code in CODES:  # a library's exit() or os._exit() in user code: no verdict, whatever the status says
        return _say(f"qbench: error: the command's process ended with status {code} before qbench finished the "
                    "command (exit() called inside a library or "
                    "the recipe's own code), so it is no verdict")  # fmt: skip
    if passed_on:  # the signal passed on ended it before its own handling was in place (SIGHUP: none)
        return _say("qbench: error: interrupted")
    if code >= 0:
        return _say(f"qbench: error: the command's process ended with status {code}, not a "
                    f"verdict{address_space_note()}")
    return _crashed(args, -code, run)


def _going_on(args: Sequence[str], code: int, run: Path | None, finished: int | None, died: Mapping[str, str], *,
              stopped: bool) -> list[str]:  # fmt: skip
    """The jobs a sweep's process that ended with `code` died running, when the sweep goes on without them (a
    `--resume` of `run` records them failed and runs every other job); [] when it stops.

    It goes on after a fault (`GOING_ON`: a native library's crash, the out-of-memory killer) inside a job of a
    sweep's own process (marked started in `run` and not recorded), unless `STOP_ON_CRASH` was given or a signal
    came to this process (the user stops). Each resume records at least one more job (a job that died before is
    never run again by it, so dying there again is no progress and stops it), hence at most as many resumes as the
    plan has jobs. A crash outside every job (opening the sweep's tracking, writing its reports) stops it: no job is
    to blame, and a resume would most likely meet it again."""
    if finished is not None or stopped or run is None or code >= 0 or -code not in GOING_ON or STOP_ON_CRASH in args:
        return []
    jobs = _started_jobs(run)
    return [] if not jobs or set(jobs) & set(died) else jobs


def _started_jobs(run: Path) -> list[str]:
    """The jobs marked started in the run folder `run` and not recorded: those its sweep's process died running."""
    jobs = []
    for mark in sorted((run / JOBS_FOLDER).glob(f"*{STARTED}")):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            jobs.append(str(json.loads(mark.read_text())["job"]))
    return jobs


def _resumed(args: Sequence[str], died: Mapping[str, str], run: Path) -> list[str]:
    """`qbench ARGS` as a `--resume` of the run folder `run` (`RESUME_RUN`) told the jobs in `died` (`KEEP_FAILED`),
    which it never runs again (`--rerun-failed` would) and whose crash its gate calls no pass, as this command's
    exit code does (`qbench sweep --gate`'s report files said pass beside exit 2)."""
    resumed = [*args, *([] if "--resume" in args else ["--resume"]), RESUME_RUN, str(run)]
    return resumed + [word for job in died for word in (KEEP_FAILED, job)]


def address_space_note() -> str:
    """'; ulimit -v lets this process map at most 390 MiB' when an address-space limit is set (RLIMIT_AS), else
    '': a limit in a CI step's shell is a cause of a MemoryError, or of a native library that could not allocate
    and ended the process (`cannot allocate memory for thread-local data: ABORT`, status 127), which the error
    itself does not name. `resource` is imported with this module: out of memory, loading it failed too."""
    with contextlib.suppress(OSError, ValueError):
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit != resource.RLIM_INFINITY:
            return f"; ulimit -v lets this process map at most {limit / 2**20:.0f} MiB"
    return ""


def _open_standard_descriptors() -> None:
    """Give a standard descriptor that is closed (`qbench gate ... >&-`, `0<&-`, `2>&-` in a CI step) the null device,
    as daemons do. Else the next file or pipe opened takes its number: the pipe to the child became the child's
    stdout or stderr, and a gate that passed ended with exit 2 (`AttributeError: 'NoneType' object has no attribute
    'write'`, or a status 1 that is no verdict). What a closed stream would have shown is dropped, as for a reader
    that went away (qbench.console.ForgivingStream)."""
    for descriptor, flags in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(descriptor)
        except OSError:
            opened = os.open(os.devnull, flags)
            if opened != descriptor:  # not the lowest number free: cannot happen, each lower one is checked first
                os.dup2(opened, descriptor)
                os.close(opened)
            os.set_inheritable(descriptor, True)  # os.open's descriptors are not: the child would find it closed


def _ending_with(parent: int) -> Callable[[], None]:
    """For the child, before it runs (Linux): SIGTERM when `parent` dies. In a process group of its own, the child is
    out of reach of a signal sent to the parent's group (a CI job's timeout killing the step), and a parent killed
    outright (SIGKILL) passes nothing on: the child would go on alone, holding the run folder and the CPUs."""

    def arrange() -> None:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the arrangement was made
            os.kill(os.getpid(), signal.SIGTERM)

    return arrange


def _child_command(args: Sequence[str]) -> list[str]:
    """This interpreter on the child module, with this one's options and the same first entry on sys.path as here:
    the current folder only when this process had it (`python -m qbench.cli`), never for the installed script
    (`-P`). The options are the ones multiprocessing passes on to its children (`-X dev`, `-W`, `-O`, `-I`...): a CI
    job running `python -X dev -W error::DeprecationWarning -m qbench.cli` asks for them on the command's work, all
    of it in the child; before, they applied to this process alone, which runs none of it."""
    options = subprocess._args_from_interpreter_flags()  # noqa: SLF001 - what multiprocessing.util uses, since 3.x
    safe = sys.flags.safe_path or sys.flags.isolated or (sys.path[0] not in ("", os.getcwd()))
    if safe and "-P" not in options and "-I" not in options:
        options.append("-P")
    return [sys.executable, *options, "-m", CHILD_MODULE, *args]


def _announced(read_end: int) -> tuple[Path | None, int | None]:
    """The last run folder the child announced, and the exit code it announced finishing with (None: it did not
    finish the command); read without waiting: a process it forked may hold the pipe."""
    os.set_blocking(read_end, False)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := os.read(read_end, 65536):
            data += chunk
    os.close(read_end)
    run, finished = None, None
    for line in data.decode(errors="replace").splitlines():
        kind, _, value = line.partition(" ")
        if kind == "run":
            run = Path(value)
        elif kind == "exit" and value.lstrip("-").isdigit():
            finished = int(value)
    return run, finished


def _crashed(args: Sequence[str], signum: int, run: Path | None) -> int:
    command = " ".join(["qbench", *[a for a in args if not a.startswith("-")][:1]])
    what = (f"qbench: error: the `{command}` process died: {cause(signum)} (the Python stack at that moment is above"
            f"{address_space_note()})")
    if run is None:
        return _say(f"{what}; run the command again once the cause is fixed")
    if not _started_jobs(run):
        return _say(f"{what}; the results so far stay in {run}; it died outside every job of its own process "
                    "(opening the sweep's tracking, writing its analysis or reports, driving a cluster's jobs), so it "
                    "does not go on by itself: once the cause is fixed, `qbench sweep --resume` takes up the jobs "
                    "recorded")  # fmt: skip
    return _say(f"{what}; the results so far stay in {run}: `qbench sweep --resume` goes on, recording the job it was "
                "running as failed (`--resume --rerun-failed` runs it again)")  # fmt: skip


def _record_death(run: Path, how: str) -> None:
    """Write `DIED_FILE` in the sweep's run folder: the job its process was running ended it, as `how` says. A child
    that ended by itself without finishing the command always leaves one, so a resume can tell such a job from one
    whose process was killed with this one (`supervised`)."""
    with contextlib.suppress(OSError):
        (run / DIED_FILE).write_text(json.dumps({"cause": how}) + "\n")


def supervised() -> bool:
    """Whether this process is the child of a supervising `qbench` process (which records how it ends, `DIED_FILE`),
    not qbench used as a library."""
    return _channel is not None


def _say(line: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)
    return EXIT_ERROR


def start_child() -> None:
    """In the child, first thing: the Python stack goes to stderr on a fatal signal, and the pipe to the parent is
    taken out of the environment (no process the command starts inherits it)."""
    global _channel
    faulthandler.enable()
    fd = os.environ.pop(_CHANNEL, None)
    _channel = int(fd) if fd is not None and fd.isdigit() else None


def announce_run(folder: Path) -> None:
    """Tell the supervising parent the run folder a sweep writes (nothing when qbench is used as a library)."""
    _announce(f"run {folder}")


def announce_exit(code: int) -> None:
    """Tell the supervising parent the command finished with `code`: an exit status 0 or 1 it was not told of came
    from an exit() inside a library or the recipe's code, which is no verdict."""
    _announce(f"exit {code}")


def end_child(code: int) -> NoReturn:
    """End the command's process with `code` (announced first, see announce_exit), without the interpreter's teardown
    where nothing needs it.

    Tearing down the interpreter of a sweep (some 2,600 modules: MLflow, SQLAlchemy, pandas, ONNX Runtime, matplotlib)
    took 0.6 s after the command had written everything, 7 % of a `qbench sweep` of the digits demo, and whoever
    waits on the process waits for it. The exit handlers still run (logging's flush, temporary folders' clean-up,
    MLflow's, Ray's and multiprocessing's shutdowns) and the standard streams are flushed; the ordinary exit is kept
    while a thread that is no daemon is alive (the interpreter would wait for it), or when a stream cannot be flushed
    (its exit status then says so, as before)."""
    announce_exit(code)
    main = threading.main_thread()
    if any(t is not main and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code)


def _announce(line: str) -> None:
    if _channel is not None:
        with contextlib.suppress(OSError):
            os.write(_channel, f"{line}\n".encode())
