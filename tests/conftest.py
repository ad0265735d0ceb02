"""Shared fixtures.

digits_project: the digits demo (model, parquet, recipe) built once per test session.

mlflow_server: a real `mlflow server` on 127.0.0.1, started once per test session
with its own sqlite store and artifact folder; yields its http URI. It runs as a
tree of processes whose workers outlive a SIGTERM to the parent, so it is
started in its own process group and the whole group is stopped; teardown fails
if any process of that group is still alive.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

_HEALTH_TIMEOUT_S = 180.0  # a loaded CI machine can take a minute to start the server
_STOP_TIMEOUT_S = 15.0


def _free_port() -> int:
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


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not sys.platform.startswith("linux"):
        pytest.skip("the mlflow_server fixture checks its processes through /proc (Linux only)")
    root = tmp_path_factory.mktemp("mlflow_server")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = root / "server.log"
    command = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{(root / 'server.db').as_posix()}",
        "--artifacts-destination", str(root / "artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    with log.open("w") as log_file:
        process = subprocess.Popen(command, cwd=root, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(url, process, log)
        yield url
    finally:
        leftover = stop_process_group(process)
        if leftover:
            pytest.fail(f"mlflow server processes survived the stop: {leftover}")


@pytest.fixture(scope="session")
def digits_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with models/digits.onnx, data/digits.parquet and recipes/digits.yaml (the repository's recipe)."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    from qbench.demo.digits import RECIPE_FILE, make_digits_demo

    root = tmp_path_factory.mktemp("digits_project")
    paths = make_digits_demo(root, seed=0)
    if paths.get("recipe") != root / RECIPE_FILE:
        pytest.fail(f"make_digits_demo did not copy {RECIPE_FILE} into {root}: {paths}")
    return root


def _nvidia_gpu_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `@pytest.mark.gpu` tests, with the reason, where torch sees no NVIDIA GPU."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_items and not _nvidia_gpu_visible():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def isolated_qbench_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Exports and engines go to a temporary cache, never the user's ~/.cache/qbench."""
    cache = tmp_path_factory.mktemp("qbench_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QBENCH_CACHE_DIR", str(cache))
        yield cache
