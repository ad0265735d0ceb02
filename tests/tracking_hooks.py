"""Code run inside a sweep's tracking process (qbench.track.process), for tests of what happens there."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import psutil
import pytest

WORKER = "qbench.track.worker"


def tracking_process_hook(folder: Path, code: str) -> Path:
    """A `sitecustomize` module in `folder` (created) that runs `code` as a tracking process starts, and in no other
    process (Python imports such a module from PYTHONPATH as it starts); returns `folder`, for PYTHONPATH."""
    folder.mkdir()
    body = textwrap.indent(textwrap.dedent(code), "    ")
    (folder / "sitecustomize.py").write_text(f"import sys\nif any({WORKER!r} in a for a in sys.orig_argv):\n{body}")
    return folder


def in_tracking_process(folder: Path, monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    """Run `code` in every tracking process started from here on (tracking_process_hook)."""
    hook = tracking_process_hook(folder, code)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])]))


def tracking_processes(cwd: Path) -> list[psutil.Process]:
    """The tracking processes started in `cwd` that are still alive."""
    found = []
    for process in psutil.process_iter(["cmdline", "cwd"]):
        if process.info["cwd"] == str(cwd) and WORKER in " ".join(process.info["cmdline"] or ()):
            found.append(process)
    return found


def wait_until_gone(cwd: Path, timeout_s: float = 60.0) -> None:
    """Wait for the tracking processes started in `cwd` to end; fail the test if one is still alive."""
    deadline = time.monotonic() + timeout_s
    while (alive := tracking_processes(cwd)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive, f"tracking processes still alive after {timeout_s} s: {alive}"
