"""A Ray cluster whose head stops while a sweep runs on it (its GCS killed: `ray stop` on the head, the head's pod or
node gone): the sweep stops in one line, exit 2, its run folder kept for `--resume`, instead of Ray's core ending
the driver process a minute later with its own log and exit status 1. The cluster is Ray's own test cluster (one
node bound to 127.0.0.1, started and stopped by the test). And a head that refuses the driver (Ray's token
authentication) named as such."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from probe_project import probe_calls, write_probe_recipe
from ray_processes import child_pids, stopped_without_survivors

from qbench.errors import QbenchError
from qbench.execute import ray_executor
from qbench.execute.plan import TIMING_RESOURCE
from qbench.execute.records import JOBS_FOLDER
from qbench.runs import INCOMPLETE_MARKER
from qbench.sweep.runner import run_sweep

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
from ray.cluster_utils import Cluster  # noqa: E402


@pytest.fixture
def one_node() -> Iterator[Cluster]:
    before = child_pids()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {TIMING_RESOURCE: 1}, "node_ip_address": "127.0.0.1", "include_dashboard": False,
        "object_store_memory": 80 * 1024 * 1024})  # fmt: skip
    started: list[int] = []

    def stop() -> None:
        """The cluster's stop, then its processes still waiting for the killed head (its raylet gives up on the GCS
        only after a minute), ended by their pids."""
        cluster.shutdown()
        for pid in started:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass

    with stopped_without_survivors(stop, before) as pids:
        started.extend(pids)
        yield cluster


def test_a_head_that_stops_mid_sweep_stops_the_sweep_in_one_line_and_keeps_the_run(
    one_node: Cluster, user_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_executor, "HEAD_CHECK_SECONDS", 1.0)
    monkeypatch.setattr(ray_executor, "HEAD_GONE_SECONDS", 3.0)
    recipe = write_probe_recipe(user_project, tmp_path, variants=["fp16"],
                                executor={"kind": "ray", "address": one_node.address})  # fmt: skip
    (tmp_path / "hold_after").write_text("0")  # FP32's measurement waits in its worker, the builds recorded
    killed: list[float] = []

    def kill_the_head() -> None:
        deadline = time.monotonic() + 120
        while not probe_calls(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.1)
        one_node.head_node.kill_gcs_server()
        killed.append(time.monotonic())

    killer = threading.Thread(target=kill_the_head, daemon=True)
    killer.start()
    with pytest.raises(QbenchError, match=r"^the Ray cluster's head at 127\.0\.0\.1:\d+ stopped: it accepted no "
                                          r"connection for \d+ s while 1 job\(s\) were out; restart the cluster"):
        run_sweep(recipe, track=False)
    killer.join(timeout=5)
    assert killed and time.monotonic() - killed[0] < 30  # Ray's core would end the process at 60 s
    (run,) = (tmp_path / "reports" / "tumour-mlp").glob("2*")
    assert (run / INCOMPLETE_MARKER).is_file()
    assert {p.name for p in (run / JOBS_FOLDER).glob("build_*.json")} == {"build_fp32.json", "build_fp16.json"}



def test_joining_a_cluster_that_refuses_the_driver_names_rays_token_authentication(
    user_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head started with token authentication (`ray start` turns it on where ~/.ray/auth_token exists) accepts the
    connection and refuses a driver joining by address without RAY_AUTH_MODE=token: Ray retries for 20 s, then says
    only 'Failed to connect'. (Ray caches its authentication mode per process, so the refusal is Ray's error here.)"""
    import socket

    from qbench.recipe.spec import load_recipe

    listening = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{listening.getsockname()[1]}"
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)

    def refused(**options: object) -> None:
        raise ConnectionError(f"Failed to connect to Ray cluster at {options['address']}")

    monkeypatch.setattr(ray, "init", refused)
    recipe = load_recipe(write_probe_recipe(user_project, tmp_path, variants=["fp16"],
                                            executor={"kind": "ray", "address": address}))  # fmt: skip
    with listening:
        with pytest.raises(QbenchError) as caught:
            ray_executor.RayExecutor(recipe, store=None, inputs={})  # type: ignore[arg-type]
        assert str(caught.value) == (
            f"executor.address: cannot join the Ray cluster at {address!r}: Failed to connect to Ray cluster at "
            f"{address}; if the cluster uses Ray's token authentication, set RAY_AUTH_MODE=token (with its token in "
            "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token) for the sweep")
        monkeypatch.setenv("RAY_AUTH_MODE", "token")  # set: the refusal is something else, said as Ray says it
        with pytest.raises(QbenchError, match=r"Failed to connect to Ray cluster at [\d.:]+$"):
            ray_executor.RayExecutor(recipe, store=None, inputs={})  # type: ignore[arg-type]
