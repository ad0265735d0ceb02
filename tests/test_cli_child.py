"""The supervised child: a tracked sweep's MLflow logging process is started before the command line's imports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qbench.cli_child import tracks_a_sweep

REPO = Path(__file__).resolve().parents[1]


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
    """prestart, replaced here by a probe, runs while qbench.cli_app (typer, rich, pandas) is not imported yet; the
    command then fails on its missing recipe as it would have (exit 2)."""
    probe = (
        "import runpy, sys\n"
        "import qbench.track_process as tp\n"
        "tp.prestart = lambda: print('prestart; cli_app imported:', 'qbench.cli_app' in sys.modules, flush=True)\n"
        "sys.argv = ['qbench', 'sweep', 'missing.yaml']\n"
        "runpy.run_module('qbench.cli_child', run_name='__main__')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.stdout.splitlines()[0] == "prestart; cli_app imported: False"
    assert done.returncode == 2
    assert "missing.yaml" in done.stderr
