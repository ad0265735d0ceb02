"""The supervising `qbench` process: its child's exit codes become the contract's, and the child does not outlive it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qbench.supervisor import DIED_FILE, cause

REPO = Path(__file__).resolve().parents[1]


def _supervised(tmp_path: Path, child_code: str, args: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    """A parent running `supervise(args)` over a child module holding `child_code`."""
    (tmp_path / "qbench_test_child.py").write_text(child_code)
    parent = ("import sys, qbench.supervisor as s\ns.CHILD_MODULE = 'qbench_test_child'\n"
              f"sys.exit(s.supervise({list(args)!r}))\n")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    return subprocess.Popen([sys.executable, "-c", parent], env=env, stderr=subprocess.PIPE, text=True)


def test_a_status_outside_the_contract_is_exit_2_with_a_line(tmp_path):
    parent = _supervised(tmp_path, "import os\nos._exit(3)\n")
    _, stderr = parent.communicate(timeout=60)
    assert parent.returncode == 2
    assert stderr.strip().splitlines()[-1] == "qbench: error: the command's process ended with status 3, not a verdict"


def test_a_child_dead_of_a_signal_is_exit_2_naming_it(tmp_path):
    parent = _supervised(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    _, stderr = parent.communicate(timeout=60)
    assert parent.returncode == 2
    assert "died: segmentation fault (SIGSEGV) inside a native library" in stderr.strip().splitlines()[-1]


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's (prctl)")
def test_the_child_ends_when_the_parent_is_killed_outright(tmp_path):
    """In a process group of its own, the child is out of reach of a kill aimed at the parent's group: a CI step's
    timeout would leave it running alone. It gets SIGTERM when the parent dies."""
    pid_file = tmp_path / "child.pid"
    parent = _supervised(tmp_path, f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                                   "time.sleep(120)\n")  # fmt: skip
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    parent.kill()
    parent.communicate(timeout=30)
    deadline = time.monotonic() + 20
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Running (a zombie left unreaped by this container's init counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_causes_are_named_in_words():
    assert cause(signal.SIGKILL) == "killed (SIGKILL), often the out-of-memory killer"
    assert cause(signal.SIGUSR1) == "killed by SIGUSR1"
    assert cause(200) == "killed by signal 200"


def test_a_status_of_0_or_1_the_child_did_not_announce_is_no_verdict(tmp_path):
    """A library's exit() or os._exit() in the recipe's code ends the process with a status that reads as pass (0) or
    breach (1): only a status the command announced finishing with is one."""
    for status in (0, 1):
        parent = _supervised(tmp_path, f"import os\nos._exit({status})\n")
        _, stderr = parent.communicate(timeout=60)
        assert parent.returncode == 2, status
        assert stderr.strip().splitlines()[-1] == (
            f"qbench: error: the command's process ended with status {status} before qbench finished the command "
            "(exit() called inside a library or the recipe's own code), so it is no verdict")


@pytest.mark.parametrize("ending", ["os._exit(3)", "os._exit(2)", "os.kill(os.getpid(), signal.SIGABRT)"])
def test_a_sweep_that_ends_before_finishing_leaves_how_in_its_run_folder(tmp_path, ending):
    """However the sweep's process ends without finishing the command (a signal, an exit inside a library: 2 too),
    the run folder says how: `--resume` then records the job it was running failed. Without a record, that job died
    with the supervising process (the whole tree killed from outside) and runs again (qbench.execute.records); an
    exit status used to leave none, and such a job would have run again to exit again."""
    run = tmp_path / "run"
    run.mkdir()
    parent = _supervised(tmp_path, "import os, signal\nfrom qbench.supervisor import announce_run, start_child\n"
                                   f"start_child()\nannounce_run({str(run)!r})\n{ending}\n")  # fmt: skip
    parent.communicate(timeout=60)
    assert parent.returncode == 2
    how = json.loads((run / DIED_FILE).read_text())["cause"]
    expected = "aborted (SIGABRT) by a native library" if "SIGABRT" in ending else \
        f"exit status {ending[-2]} before qbench finished the command (exit() inside a library or the recipe's code)"
    assert how == expected


def test_a_signal_passed_on_to_the_sweep_leaves_no_record_of_a_death(tmp_path):
    """SIGHUP (the terminal closed) reaches the parent, which passes it on; the sweep's process has no handler for it
    and ends. That is no fault of the job it was running, which a resume runs again (qbench.execute.records), but the
    parent recorded 'killed by SIGHUP' in the run folder, so `--resume` recorded that job failed."""
    run, ready = tmp_path / "run", tmp_path / "ready"
    run.mkdir()
    parent = _supervised(tmp_path, "import time\nfrom qbench.supervisor import announce_run, start_child\n"
                                   f"start_child()\nannounce_run({str(run)!r})\nopen({str(ready)!r}, 'w').close()\n"
                                   "time.sleep(120)\n")  # fmt: skip
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    parent.send_signal(signal.SIGHUP)
    _, stderr = parent.communicate(timeout=60)
    assert parent.returncode == 2
    assert stderr.strip().splitlines()[-1] == "qbench: error: interrupted"
    assert not (run / DIED_FILE).exists()


def test_a_finished_sweep_leaves_no_record_of_a_death(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    parent = _supervised(tmp_path,
                         "import sys\nfrom qbench.supervisor import announce_exit, announce_run, start_child\n"
                                   f"start_child()\nannounce_run({str(run)!r})\nannounce_exit(2)\nsys.exit(2)\n")  # fmt: skip
    parent.communicate(timeout=60)
    assert parent.returncode == 2 and not (run / DIED_FILE).exists()


def test_the_status_a_finished_command_announces_is_returned(tmp_path):
    parent = _supervised(tmp_path, "import sys\nfrom qbench.supervisor import announce_exit, start_child\n"
                                   "start_child()\nannounce_exit(1)\nsys.exit(1)\n")  # fmt: skip
    parent.communicate(timeout=60)
    assert parent.returncode == 1


_ENDING = """import atexit, os, sys, threading, time
from qbench.supervisor import end_child, start_child
class Torn:
    def __del__(self):
        os.write(2, b"torn down\\n")
kept = Torn()  # finalised by the interpreter's teardown only
atexit.register(lambda: os.write(2, b"exit handler ran\\n"))
start_child()
if "{thread}" == "busy":
    threading.Thread(target=lambda: (time.sleep(0.3), os.write(2, b"thread finished\\n"))).start()
print("unflushed", end="")
end_child(1)
"""


def test_a_finished_command_ends_without_the_interpreter_teardown_but_with_its_exit_handlers(tmp_path):
    """The child's teardown of a sweep's modules took 0.6 s after everything was written (7 % of a digits sweep):
    it is skipped, the exit handlers and the streams' flush are not, nor the wait for a thread that is no daemon."""
    parent = _supervised(tmp_path, _ENDING.format(thread="none"))
    _, stderr = parent.communicate(timeout=60)
    assert parent.returncode == 1
    assert "exit handler ran" in stderr and "torn down" not in stderr
    busy = _supervised(tmp_path, _ENDING.format(thread="busy"))
    _, stderr = busy.communicate(timeout=60)
    assert busy.returncode == 1
    assert "thread finished" in stderr and "exit handler ran" in stderr


def test_the_ending_child_flushes_what_it_printed(tmp_path):
    (tmp_path / "child.py").write_text(_ENDING.format(thread="none"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    done = subprocess.run([sys.executable, str(tmp_path / "child.py")], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert (done.returncode, done.stdout) == (1, "unflushed")


def test_the_child_runs_with_the_interpreter_options_the_command_was_given(tmp_path):
    """`python -X dev -W error::DeprecationWarning -m qbench.cli ...` (a CI job's strict run) applied both to the
    supervising process alone: the command's work, all of it in the child, ran without them."""
    (tmp_path / "qbench_test_child.py").write_text(
        "import os, sys\nprint('child', sys.flags.dev_mode, sys.flags.optimize, sys.warnoptions, file=sys.stderr)\n"
        "sys.stderr.flush()\nos._exit(3)\n")  # fmt: skip
    parent = "import sys, qbench.supervisor as s\ns.CHILD_MODULE = 'qbench_test_child'\nsys.exit(s.supervise([]))\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    env.pop("PYTHONWARNINGS", None)
    env.pop("PYTHONDEVMODE", None)
    done = subprocess.run([sys.executable, "-X", "dev", "-W", "error::DeprecationWarning", "-O", "-c", parent],
                          env=env, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2
    assert "child True 1 ['default', 'error::DeprecationWarning']" in done.stderr.splitlines()  # as in the parent


_SWEEP = """import json, os, signal, sys
from pathlib import Path
from qbench.supervisor import announce_exit, announce_run, start_child
start_child()
log = Path({log!r})
attempt = len(log.read_text().splitlines()) if log.exists() else 0
with log.open("a") as lines:
    lines.write(" ".join(sys.argv[1:]) + "\\n")
run = Path({runs!r}) / str(attempt)
(run / "jobs").mkdir(parents=True)
announce_run(run)
job = {jobs!r}[attempt]
if job == "finish":
    announce_exit(0)
    sys.exit(0)
if job is not None:
    (run / "jobs" / f"{{job}}.started").write_text(json.dumps({{"job": job, "attempts": 1}}))
os.kill(os.getpid(), {signum})
"""


def _sweep_dying(tmp_path: Path, jobs: list[str | None], signum: int = signal.SIGSEGV,
                 args: tuple[str, ...] = ("sweep",)
                 ) -> tuple[int, list[str], list[str]]:  # fmt: skip
    """A supervised sweep whose attempt N dies of `signum` in the job jobs[N] (None: outside every job), or finishes
    (exit 0) where jobs[N] is 'finish': its exit code, stderr lines, and each attempt's arguments."""
    log = tmp_path / "attempts.log"
    parent = _supervised(tmp_path, _SWEEP.format(log=str(log), runs=str(tmp_path / "runs"), jobs=jobs,
                                                 signum=int(signum)), args)  # fmt: skip
    _, stderr = parent.communicate(timeout=120)
    return parent.returncode, stderr.strip().splitlines(), log.read_text().splitlines()


def test_a_sweep_dying_in_a_job_goes_on_as_a_resume_once_per_job_until_it_finishes(tmp_path):
    code, stderr, attempts = _sweep_dying(tmp_path, ["measure:a", "build:b", "measure:c", "finish"],
                                          args=("sweep", "r.yaml", "--gate"))  # fmt: skip
    # each resume takes up the run folder of the process that died, not the newest of its plan (qbench.supervisor)
    assert attempts == ["sweep r.yaml --gate"] + ["sweep r.yaml --gate --resume --resume-run "
                                                  f"{tmp_path / 'runs' / str(n)}"
                                                  for n in range(3)]  # fmt: skip
    going_on = [line for line in stderr if "going on with the other jobs" in line]
    assert [line.split(" died running ")[1].split(": segmentation fault")[0] for line in going_on] == [
        "measure:a", "build:b", "measure:c"]
    assert all(json.loads((tmp_path / "runs" / str(n) / DIED_FILE).read_text())["cause"].startswith("segmentation")
               for n in range(3))  # fmt: skip
    assert code == 2  # the last one finished with exit 0: a variant that crashed is no pass
    assert stderr[-1].startswith("qbench: error: the sweep went on after its process died in measure:a (segmentation "
                                 "fault (SIGSEGV) inside a native library); build:b (")  # fmt: skip


def test_a_resume_dying_in_the_job_it_died_in_before_ends_the_command(tmp_path):
    """No progress: each resume must record one more job; the same job again (a --resume that ran it again) stops."""
    code, stderr, attempts = _sweep_dying(tmp_path, ["measure:a", "measure:a", "finish"])
    assert code == 2 and len(attempts) == 2
    assert stderr[-1].startswith("qbench: error: the `qbench sweep` process died: segmentation fault (SIGSEGV)")
    assert "`qbench sweep --resume` goes on, recording the job it was running as failed" in stderr[-1]


def test_a_sweep_dying_outside_every_job_ends_the_command(tmp_path):
    """Opening the sweep's tracking or writing its reports, no job is to blame, and a resume would most likely die at
    the same place: it is not started."""
    code, stderr, attempts = _sweep_dying(tmp_path, [None, "finish"])
    assert code == 2 and len(attempts) == 1
    assert "it died outside every job of its own process" in stderr[-1] and "does not go on by itself" in stderr[-1]


@pytest.mark.parametrize(("signum", "goes_on"), [(signal.SIGKILL, True), (signal.SIGABRT, True), (signal.SIGBUS, True),
                                                 (signal.SIGTERM, False), (signal.SIGUSR1, False)])  # fmt: skip
def test_the_sweep_goes_on_after_a_native_fault_or_the_out_of_memory_killer_only(tmp_path, signum, goes_on):
    """SIGTERM or another signal this process did not pass on was sent by someone to the sweep's process alone: that
    asks it to stop, not to go on."""
    code, _, attempts = _sweep_dying(tmp_path, ["measure:a", "finish"], signum=signum)
    assert code == 2 and len(attempts) == (2 if goes_on else 1)


def test_stop_on_crash_ends_the_command_at_the_first_crash(tmp_path):
    code, stderr, attempts = _sweep_dying(tmp_path, ["measure:a", "finish"],
                                          args=("sweep", "r.yaml", "--stop-on-crash"))
    assert code == 2 and attempts == ["sweep r.yaml --stop-on-crash"]
    assert "`qbench sweep --resume` goes on" in stderr[-1]


def test_a_resume_of_failed_jobs_after_a_crash_is_told_which_jobs_died_in_this_command(tmp_path):
    _, _, attempts = _sweep_dying(tmp_path, ["measure:a", "build:b", "finish"],
                                  args=("sweep", "--resume", "--rerun-failed"))
    runs = tmp_path / "runs"
    assert attempts == ["sweep --resume --rerun-failed",
                        f"sweep --resume --rerun-failed --resume-run {runs / '0'} --keep-failed measure:a",
                        "sweep --resume --rerun-failed --resume-run "
                        f"{runs / '1'} --keep-failed measure:a --keep-failed build:b"]  # fmt: skip
