"""A sweep joining a Ray cluster of two nodes (two raylets on this machine, bound to 127.0.0.1, one CPU and one
timing slot each, started by the test with Ray's own multi-node test cluster and stopped after): two
measurements run at once, one per node's timing slot, and the figures are the local executor's."""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from probe_project import VARIANTS, figures, probe_calls, write_probe_recipe
from ray_processes import child_pids, stopped_without_survivors

from qbench.errors import QbenchError
from qbench.execute.plan import TIMING_RESOURCE
from qbench.frontier.pareto import mixed_timing_machines, speedup
from qbench.sweep.runner import run_sweep

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
from ray.cluster_utils import Cluster  # noqa: E402

NODE = {"num_cpus": 1, "resources": {TIMING_RESOURCE: 1}, "node_ip_address": "127.0.0.1",
        "object_store_memory": 80 * 1024 * 1024}  # fmt: skip


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[str]:
    """The cluster's address; teardown fails if any of its processes survives."""
    before = child_pids()
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    with stopped_without_survivors(cluster.shutdown, before):
        yield cluster.address


def _release_when_held(target: Path, held: int, seen: list[int]) -> threading.Thread:
    """A thread removing `hold_after` once `held` probe calls wait on it at once (or after 90 s); `seen` gets the
    number of calls there were when it did."""

    def release() -> None:
        deadline = time.monotonic() + 90
        while len(probe_calls(target)) < held and time.monotonic() < deadline:
            time.sleep(0.05)
        seen.append(len(probe_calls(target)))
        (target / "hold_after").unlink()

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    return thread


def test_a_sweep_on_two_nodes_times_on_both_at_once_and_gives_the_local_figures(
    two_nodes: str, user_project: Path, tmp_path: Path, local_figures: tuple[dict, int],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    expected, calls_per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS,
                                executor={"kind": "ray", "address": two_nodes})  # fmt: skip
    # FP32's measurement passes; fp16's and int8's wait in their first probe call until both are waiting: that
    # needs two timing slots, one per node
    (tmp_path / "hold_after").write_text(str(calls_per_job))
    seen: list[int] = []
    releaser = _release_when_held(tmp_path, calls_per_job + 2, seen)
    caplog.set_level("INFO", logger="qbench")
    outcome = run_sweep(recipe, track=False)
    releaser.join(timeout=5)
    assert seen == [calls_per_job + 2]  # both held at once
    assert "on Ray cluster of 2 nodes, 2 CPUs" in caplog.text
    assert figures(outcome.results) == expected
    assert len(set(probe_calls(tmp_path)[calls_per_job:calls_per_job + 2])) == 2  # two worker processes
    # both nodes are this machine: one kind of machine, speed-ups given
    assert mixed_timing_machines(outcome.results) == []
    int8 = outcome.results.find("int8-minmax", "onnxruntime-cpu")
    assert math.isfinite(speedup(outcome.results, int8, 1))


def test_a_sweep_without_an_address_starts_its_own_cluster_beside_a_running_one(
    two_nodes: str, user_project: Path, tmp_path: Path, local_figures: tuple[dict, int],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Without executor.address the sweep runs on a cluster of this machine alone, even where another cluster runs
    (ray.init without an address joins the latest one started here, and refused the sweep's own num_cpus:
    'ValueError: When connecting to an existing cluster, num_cpus and num_gpus must not be provided')."""
    expected, _ = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS, executor={"kind": "ray"})
    caplog.set_level("INFO", logger="qbench")
    outcome = run_sweep(recipe, track=False)
    assert figures(outcome.results) == expected
    assert "6 jobs (6 to run) on local Ray cluster of 1 node" in caplog.text  # not the two nodes running beside it
    assert not ray.is_initialized()  # the sweep's own cluster stopped with it


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_an_address_where_no_cluster_answers_is_one_line_not_a_hang(
    scheme: str, user_project: Path, tmp_path: Path
) -> None:  # fmt: skip
    """ray.init retried a head that is down for as long as one waited (a CI job hung past its timeout)."""
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"{scheme}127.0.0.1:{port}"
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS, executor={"kind": "ray", "address": address})
    started = time.monotonic()
    with pytest.raises(QbenchError) as caught:
        run_sweep(recipe, track=False)
    assert time.monotonic() - started < 60
    assert str(caught.value).startswith(f"executor.address: cannot join the Ray cluster at '{address}': nothing "
                                        f"accepted a connection at 127.0.0.1:{port} within 10 s (")  # fmt: skip
    assert "\n" not in str(caught.value)
    assert not ray.is_initialized()
