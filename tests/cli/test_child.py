"""The supervised child: a tracked sweep's MLflow logging process is started before the command line's imports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qbench.cli.child import tracks_a_sweep

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("args", "tracked"),
    [
        (["sweep", "r.yaml"], True),
        (["--debug", "sweep", "r.yaml", "--gate"], True),
        (["sweep", "r.yaml", "--no-track", "--track"], True),
        (["sweep", "r.yaml", "--track", "--no-track"], False),
        (["sweep", "r.yaml", "--no-track"], False),
        (["sweep", "r.yaml", "--plan"], False),
        (["sweep", "--help"], False),
        (["gate", "r.yaml"], False),
        (["explain", "sweep"], False),
        ([], False),
    ],
)
def test_only_a_sweep_that_logs_starts_the_logging_process(args, tracked):
    assert tracks_a_sweep(args) is tracked


def test_the_logging_process_is_started_before_the_command_line_is_imported(tmp_path):
    """prestart, replaced here by a probe, runs while qbench.cli.app (typer, rich, pandas) is not imported yet; the
    command then fails on its missing recipe as it would have (exit 2)."""
    probe = (
        "import runpy, sys\n"
        "import qbench.track.process as tp\n"
        "tp.prestart = lambda level=None: print('prestart; cli_app "
        "imported:', 'qbench.cli.app' in sys.modules, flush=True)\nsys.argv = ['qbench', 'sweep', 'missing.yaml']\n"
        "runpy.run_module('qbench.cli.child', run_name='__main__')\n"
    )
    done = _run_probe(probe, tmp_path)
    assert done.stdout.splitlines()[0] == "prestart; cli_app imported: False"
    assert done.returncode == 2
    assert "missing.yaml" in done.stderr


def _run_child(tmp_path: Path, worker_command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m qbench.cli.child sweep missing.yaml ARGS`, the logging process's command replaced by
    `worker_command` (a lambda of calls, answers, level)."""
    probe = (
        "import runpy, sys\n"
        "import qbench.track.process as tp\n"
        f"tp._worker_command = {worker_command}\n"
        f"sys.argv = ['qbench', 'sweep', 'missing.yaml', *{list(args)!r}]\n"
        "runpy.run_module('qbench.cli.child', run_name='__main__')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@pytest.mark.parametrize(("args", "level"), [((), 20), (("--debug",), 10)])
def test_the_logging_process_passes_on_what_the_command_logs(tmp_path, args, level):
    """The logging process passes on records at the level it is started with: started here before the command line
    set the `qbench` logger's (INFO, DEBUG with --debug), it took Python's default, WARNING, and dropped the MLflow
    lines a tracked sweep logs at INFO ('MLflow: resuming the interrupted sweep's run ...')."""
    shown = "lambda calls, answers, level: (print('level', level, flush=True), [sys.executable, '-c', 'pass'])[1]"
    done = _run_child(tmp_path, shown, *args)
    assert done.stdout.splitlines()[0] == f"level {level}", done.stderr
    assert done.returncode == 2


def test_a_logging_process_that_cannot_start_is_the_sweeps_one_line(tmp_path):
    """It raised before the command line was running: a traceback and exit status 1, which the `qbench` process
    reads as an exit() inside a library. The sweep starts one itself and says why it cannot, in one line (exit 2)."""
    refused = "lambda *_: (_ for _ in ()).throw(OSError(24, 'Too many open files'))"
    done = _run_child(tmp_path, refused)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: cannot start the MLflow logging process: [Errno 24] Too many open files")


def test_the_command_lines_imports_run_uncollected_and_are_frozen_before_the_command(tmp_path):
    """The child ends with its command: its imports (the logging process's start, then typer, rich, pydantic) run
    without the garbage collector and what they made is frozen out of its sight before the command runs
    (qbench.startup); the collector is on again for the command itself."""
    probe = (
        "import gc, runpy, sys\n"
        "import qbench.cli.app, qbench.track.process as tp\n"
        "tp.prestart = lambda level=None: print('prestart collects:', gc.isenabled(), flush=True)\n"
        "qbench.cli.app.main = lambda: print('command collects:', gc.isenabled(), 'frozen:', gc.get_freeze_count() > 0,"
        " flush=True) or 0\n"
        "sys.argv = ['qbench', 'sweep', 'missing.yaml']\n"
        "runpy.run_module('qbench.cli.child', run_name='__main__')\n"
    )
    done = _run_probe(probe, tmp_path)
    assert done.stdout.splitlines() == ["prestart collects: False", "command collects: True frozen: True"], done.stderr
    assert done.returncode == 0


def _run_probe(probe: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`probe` run by a fresh interpreter in `cwd` with this checkout's qbench first on the path."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
