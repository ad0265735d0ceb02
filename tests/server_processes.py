"""Server processes the tests start and must stop: a free port on 127.0.0.1, waiting for /health, the members of a
process group, stopping a whole group (a helper module, not a conftest: conftest modules of different test folders
share one name)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

_HEALTH_TIMEOUT_S = 180.0  # a loaded CI machine can take a minute to start the server
_STOP_TIMEOUT_S = 15.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`, read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended while we looked
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def wait_healthy(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + _HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    tail = log.read_text()[-3000:]
    raise RuntimeError(f"mlflow server did not answer /health within {_HEALTH_TIMEOUT_S:.0f} s:\n{tail}")


def stop_process_group(process: subprocess.Popen) -> list[int]:
    """SIGTERM the whole group, SIGKILL what is left after a grace period; returns pids still alive after that."""
    pgid = process.pid  # start_new_session=True: the leader's pid is the group id
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None and not group_members(pgid):
                return []
            time.sleep(0.2)
    process.wait(timeout=5)
    return group_members(pgid)


def start_mlflow_server(root: Path, artifacts: list[str] | None = None) -> tuple[str, subprocess.Popen]:
    """A real `mlflow server` on a free port of 127.0.0.1 with its store and artifacts under `root`, in its own process
    group (stop it with stop_process_group), answering /health; returns its URL and process. `artifacts`: the
    server's artifact options instead of proxied artifacts in `root/artifacts`.

    Without MLflow's job runner (MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false; it is on by default): its consumers, eight
    more MLflow imports, only slow the start on a loaded runner, and no test here runs a server-side job."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = root / "server.log"
    command = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{(root / 'server.db').as_posix()}",
        *(artifacts if artifacts is not None else ["--artifacts-destination", str(root / "artifacts")]),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    with log.open("w") as log_file:
        process = subprocess.Popen(command, cwd=root, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # fmt: skip
    try:
        wait_healthy(url, process, log)
    except BaseException:
        stop_process_group(process)
        raise
    return url, process
