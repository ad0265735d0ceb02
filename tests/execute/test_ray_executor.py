"""Sweeps through a real Ray cluster of this machine (2 CPUs, one timing slot), started once for the module
and stopped after: the same figures as the local executor, an MLflow child per job, a worker killed
mid-job and its job run again, a job whose workers keep dying recorded failed, an interrupted Ray
sweep resumed. The tumour MLP and its table are built in the test; a probe metric (probe_project.py)
sees each measure job's process."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient
from probe_project import VARIANTS, figures, probe_calls, write_probe_recipe
from ray_processes import child_pids, stopped_without_survivors

from qbench.environment import machine_kind, timing_machine
from qbench.errors import QbenchError
from qbench.execute.plan import TIMING_RESOURCE
from qbench.execute.records import JOBS_FOLDER
from qbench.runs import INCOMPLETE_MARKER
from qbench.sweep.runner import run_sweep

# Ray on Linux turns `_node_ip_address="127.0.0.1"` into the machine's routable address and listens on every
# interface; with this variable (read when ray is imported) it runs as a one-node cluster bound to 127.0.0.1.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

RAY = {"kind": "ray"}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[list[int]]:
    """A local Ray cluster bound to 127.0.0.1 (its GCS, raylet and workers are this process's children), stopped
    after the module; teardown fails if any of its processes survives."""
    before = child_pids()
    ray.init(address="local", num_cpus=2, resources={TIMING_RESOURCE: 1}, _node_ip_address="127.0.0.1",
             include_dashboard=False,
             log_to_driver=False, object_store_memory=100 * 1024 * 1024, configure_logging=False)  # fmt: skip
    with stopped_without_survivors(ray.shutdown, before) as started:
        assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}
        yield started


@pytest.fixture
def ray_recipe(ray_cluster: list[int], user_project: Path, tmp_path: Path) -> Path:
    """The VARIANTS sweep on the Ray cluster, written in the test's tmp_path (where the probe's files go)."""
    return write_probe_recipe(user_project, tmp_path, variants=VARIANTS, executor=RAY)


def _record(run_dir: Path, job: str) -> dict:
    return json.loads((run_dir / JOBS_FOLDER / f"{job.replace(':', '_')}.json").read_text())


def _kill_the_hung_worker(target: Path) -> tuple[threading.Thread, list[int]]:
    """Makes the first measure job (FP32's) stop in its worker (probe_project's `hang_once`) and starts a thread
    that SIGKILLs that worker; the thread, and the list it appends the killed pid to."""
    (target / "hang_once").write_text("")
    killed: list[int] = []

    def kill_the_worker() -> None:
        pid_file = target / "worker.pid"
        deadline = time.monotonic() + 120
        while not pid_file.is_file() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)  # the pid is written before the job sleeps
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_the_worker, daemon=True)
    killer.start()
    return killer, killed


def test_a_ray_sweep_gives_the_local_figures_and_an_mlflow_child_per_job(
    ray_recipe: Path, tmp_path: Path, local_figures: tuple[dict, int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="qbench")
    expected, _ = local_figures
    started = time.perf_counter()
    outcome = run_sweep(ray_recipe)
    print(f"ray sweep: {time.perf_counter() - started:.1f} s")
    assert figures(outcome.results) == expected
    workers = set(probe_calls(tmp_path))
    assert workers and os.getpid() not in workers  # every measurement ran in a Ray worker
    shown = caplog.text
    assert "6 jobs (6 to run) on Ray cluster of 1 node, 2 CPUs" in shown
    assert "[6/6 jobs done · 0 running · 0 left]" in shown
    times = _record(outcome.run_dir, "measure:int8-minmax@onnxruntime-cpu")["times"]  # the worker's start and end
    assert times["submitted"] < times["started"] < times["ended"] < times["recorded"]

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tumour-mlp")
    runs = client.search_runs([experiment.experiment_id], run_view_type=ViewType.ALL)
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert parent.info.run_id == outcome.mlflow_run_id and parent.info.status == "FINISHED"
    assert set(children) == {"fp32 · ort-cpu", "fp16 · ort-cpu", "int8-minmax · ort-cpu"}
    assert {r.info.status for r in children.values()} == {"FINISHED"}
    int8 = outcome.results.find("int8-minmax", "onnxruntime-cpu")
    assert children["int8-minmax · ort-cpu"].data.metrics["probe"] == int8.accuracy.overall.metrics["probe"]
    kind = machine_kind(timing_machine())  # the workers run here: this machine's kind, its quota in it where it has one
    assert {r.data.tags["qbench.timed_on"] for r in children.values()} == {kind}
    assert {p.machine for p in outcome.results.frontier} == {kind}


def test_a_worker_killed_mid_job_is_replaced_and_the_job_runs_again(
    ray_recipe: Path, tmp_path: Path, local_figures: tuple[dict, int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="qbench")
    expected, _ = local_figures
    killer, killed = _kill_the_hung_worker(tmp_path)
    outcome = run_sweep(ray_recipe, track=False)
    killer.join(timeout=5)
    assert killed and killed[0] != os.getpid()
    assert figures(outcome.results) == expected
    record = _record(outcome.run_dir, "measure:fp32@onnxruntime-cpu")
    assert record["attempts"] == 2 and record["result"]["status"] == "ok"
    assert _record(outcome.run_dir, "measure:fp16@onnxruntime-cpu")["attempts"] == 1
    shown = " ".join(caplog.text.split())
    assert "worker lost running measure:fp32@onnxruntime-cpu" in shown and "(attempt 2 of 3)" in shown


def test_a_job_whose_worker_keeps_dying_is_recorded_failed_and_the_gate_fails_closed(
    ray_cluster: list[int], user_project: Path, tmp_path: Path
) -> None:
    recipe = write_probe_recipe(user_project, tmp_path, variants=["fp16"], executor={**RAY, "retries": 0})
    killer, killed = _kill_the_hung_worker(tmp_path)
    outcome = run_sweep(recipe, track=False)
    killer.join(timeout=5)
    assert killed and killed[0] != os.getpid()
    fp32 = outcome.results.find("fp32", "onnxruntime-cpu")
    assert fp32.status == "failed" and fp32.error.startswith("worker lost 1 times, last: WorkerCrashedError")
    assert _record(outcome.run_dir, "measure:fp32@onnxruntime-cpu")["attempts"] == 1
    assert outcome.gate.exit_code != 0


def test_a_job_past_executor_timeout_fails_its_worker_ends_and_resume_runs_it_again(
    ray_cluster: list[int], user_project: Path, tmp_path: Path, local_figures: tuple[dict, int]
) -> None:
    """A job that hangs on its worker (FP32's measurement sleeps 120 s: a stuck native call, a stalled mount) fails
    at `executor.timeout_s` rather than holding the sweep, its hung worker ends, the gate fails closed, and
    `--resume` measures it again (a timeout is a reason outside the variant)."""
    expected, _ = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS, executor={**RAY, "timeout_s": 15})
    (tmp_path / "hang_once").write_text("")
    started = time.monotonic()
    outcome = run_sweep(recipe, track=False)
    assert time.monotonic() - started < 100  # the hang alone is 120 s
    fp32 = outcome.results.find("fp32", "onnxruntime-cpu")
    assert fp32.status == "failed"
    assert fp32.error.startswith("timed out: still running after executor.timeout_s = 15 s on node")
    record = _record(outcome.run_dir, "measure:fp32@onnxruntime-cpu")
    assert record["attempts"] == 1 and record["environment"] == fp32.error  # not retried; outside the variant
    assert outcome.gate.exit_code == 2
    hung = int((tmp_path / "worker.pid").read_text())
    deadline = time.monotonic() + 10
    while psutil.pid_exists(hung) and psutil.Process(hung).status() != "zombie" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(hung) or psutil.Process(hung).status() == "zombie"

    resumed = run_sweep(recipe, track=False, resume=True)
    assert figures(resumed.results) == expected


def _settled_probe_count(folder: Path, quiet_s: float = 2.0, limit_s: float = 60.0) -> int:
    """The probe-call count once no call has come for `quiet_s` (Ray ends the workers of an interrupted sweep
    asynchronously)."""
    deadline = time.monotonic() + limit_s
    count, since = len(probe_calls(folder)), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.1)
        now = len(probe_calls(folder))
        if now != count:
            count, since = now, time.monotonic()
    return count


def test_an_interrupted_ray_sweep_resumes_without_measuring_a_finished_job_twice(
    ray_recipe: Path, tmp_path: Path, local_figures: tuple[dict, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jobs out when the sweep stops end with its cluster, never by ray.cancel: a cancel racing a worker's
    reply of completion aborts the driver in Ray's core (exit 1, no message)."""
    expected, per_job = local_figures
    cancels: list[object] = []
    monkeypatch.setattr(ray, "cancel", lambda ref, **options: cancels.append(ref))

    (tmp_path / "hold_after").write_text(str(per_job))  # FP32 measures; the later jobs wait in their workers

    def interrupt_once_a_later_job_is_held() -> None:
        while len(probe_calls(tmp_path)) <= per_job:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)  # to the driver: raised in its main thread while it waits for jobs

    threading.Thread(target=interrupt_once_a_later_job_is_held, daemon=True).start()
    try:
        with pytest.raises(QbenchError, match="interrupted by SIGINT"):
            run_sweep(ray_recipe, track=False)
    finally:
        (tmp_path / "hold_after").unlink()
    (interrupted,) = (tmp_path / "reports" / "tumour-mlp").glob("2*")
    finished = [p for p in (interrupted / JOBS_FOLDER).glob("measure_*.json")]
    assert len(finished) == 1  # FP32's; the held jobs ended with the cluster
    assert cancels == []
    before = _settled_probe_count(tmp_path)  # a cancelled job's worker may still be ending: count after it has

    outcome = run_sweep(ray_recipe, track=False, resume=True)
    assert len(probe_calls(tmp_path)) - before == (3 - len(finished)) * per_job
    assert figures(outcome.results) == expected
    resumed = [v.key for v in outcome.results.variants if any(n.startswith("resumed") for n in v.notes)]
    assert len(resumed) == len(finished)


def test_starting_and_stopping_a_local_ray_cluster_keeps_the_sweeps_signal_handlers(tmp_path: Path) -> None:
    """Ray's driver start-up installs its own SIGTERM handler (a bare sys.exit), and its core worker's stop sets
    SIGTERM's action to the default behind Python's back (getsignal still names the old handler): qbench puts its
    own back both times, so a stopped sweep is an interruption (marker, partial results, --resume), not a
    SystemExit or a death by the signal."""
    script = """
import os, signal, sys
import ray
from qbench.execute.ray_executor import keeping_signal_handlers
got = []
def mine(signum, frame): got.append(signum)
signal.signal(signal.SIGTERM, mine)
with keeping_signal_handlers():
    ray.init(address="local", num_cpus=1, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False,
             object_store_memory=80 * 1024 * 1024, configure_logging=False)
try:
    print("started: " + ("kept" if signal.getsignal(signal.SIGTERM) is mine else "replaced"), flush=True)
finally:
    with keeping_signal_handlers(hold=True):
        ray.shutdown()
os.kill(os.getpid(), signal.SIGTERM)  # killed here if the default action was left behind
print("stopped: " + ("kept" if got == [signal.SIGTERM] else f"handler got {got}"), flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip().splitlines()[-2:] == ["started: kept", "stopped: kept"]


SWEEP_SIGNALLED = """
import functools, os, signal, sys
import ray
import ray._private.worker
import qbench.sweep.runner
from qbench.cli.app import main

ray.init = functools.partial(ray.init, _node_ip_address="127.0.0.1", object_store_memory=80 * 1024 * 1024)
if sys.argv[1] == "starting":  # once Ray's start-up has put its own SIGTERM handler in
    connect = ray._private.worker.connect
    def signalled_connect(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return connect(*args, **kwargs)
    ray._private.worker.connect = signalled_connect
else:  # "stopped": every job done and the executor closed (its cluster stopped), the results not yet written
    range_analysis = qbench.sweep.runner._range_analysis
    def signalled_range_analysis(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return range_analysis(*args, **kwargs)
    qbench.sweep.runner._range_analysis = signalled_range_analysis
sys.exit(main(["sweep", sys.argv[2], "--no-track"]))
"""


def _session_processes(sid: int) -> list[int]:
    """The live (not zombie) processes of session `sid`: what a sweep started as a session leader left running."""
    alive = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) == sid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except (OSError, psutil.Error):
            pass
    return alive


@pytest.mark.parametrize("moment", ["starting", "stopped"])
def test_a_sigterm_while_ray_starts_or_after_it_stopped_is_an_interruption_exit_2(
    moment: str, user_project: Path, tmp_path: Path
) -> None:
    """`qbench sweep` on a local Ray cluster it starts (on 127.0.0.1) gets SIGTERM at a set moment: while Ray
    starts (Ray's own handler in place: it was a SystemExit(15), then a crash at the interpreter's exit) or after
    the cluster stopped (Ray's core had set SIGTERM's action to the default: death by the signal). Either way the
    contract holds: exit 2, the run folder marked interrupted, no Ray process left."""
    recipe = write_probe_recipe(user_project, tmp_path, variants=["fp16"], executor=RAY)
    process = subprocess.Popen([sys.executable, "-c", SWEEP_SIGNALLED, moment, str(recipe)], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                               env={**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
                                    "PYTHONPATH": str(Path(__file__).resolve().parents[2])})  # fmt: skip
    try:
        _, err = process.communicate(timeout=240)
    finally:
        deadline = time.monotonic() + 30
        while (left := _session_processes(process.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert process.returncode == 2, (process.returncode, err[-3000:])
    assert "interrupted by SIGTERM" in " ".join(err.split()), err[-3000:]
    (run,) = (tmp_path / "reports" / "tumour-mlp").glob("2*")
    assert json.loads((run / INCOMPLETE_MARKER).read_text())["state"] == "interrupted by SIGTERM"
    assert not left, f"Ray processes outlived the sweep: {left}"


def test_ray_imported_by_qbench_leaves_its_failure_signal_handler_out_of_the_driver_only(tmp_path: Path) -> None:
    """That C++ handler takes SIGTERM while Ray starts (the sweep's handler never saw it; a crash followed on exit):
    the driver goes without it, and the variable is not left for the processes Ray starts (their handlers stay)."""
    script = """
import os
from qbench.execute.executors import import_ray
ray = import_ray()
from ray._private import ray_constants
print(ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER" in os.environ)
"""
    env = {k: v for k, v in os.environ.items() if k != "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False"]


def test_a_qbench_error_raised_on_a_worker_is_its_own_one_line_message() -> None:
    from qbench.execute.ray_executor import job_failed

    full = QbenchError("cannot write to the build store /mnt/builds: No space left on device; free space there")
    raised = ray.exceptions.RayTaskError("_build_task", "Traceback (most recent call last):\n  File \"jobs.py\"", full)
    assert str(job_failed("build:fp16", raised)) == f"job build:fp16 failed on the cluster: {full}"


def test_an_error_raised_on_a_worker_is_one_line_without_its_traceback() -> None:
    from qbench.execute.ray_executor import job_failed

    missing = FileNotFoundError(2, "No such file or directory")
    raised = ray.exceptions.RayTaskError("_build_task", "Traceback (most recent call last):\n  File \"jobs.py\"\n",
                                         missing)  # fmt: skip
    assert str(job_failed("build:fp32", raised)) == ("job build:fp32 failed on the cluster: FileNotFoundError: "
                                                     "[Errno 2] No such file or directory")  # fmt: skip


def test_a_node_that_cannot_read_the_inputs_says_so_in_one_line(user_project: Path, tmp_path: Path) -> None:
    """The worker's own preparation, on a node where neither the build store's copies nor the user's files exist:
    a FileNotFoundError traceback before; now what is missing and what every node needs."""
    from qbench.execute.ray_executor import _worker_prepared
    from qbench.execute.store import BuildStore
    from qbench.provenance import input_digests
    from qbench.recipe.spec import load_recipe

    recipe = load_recipe(write_probe_recipe(user_project, tmp_path, variants=VARIANTS))
    inputs = input_digests(recipe)
    elsewhere = {name: replace(entry, path=str(tmp_path / "not-mounted" / Path(entry.path).name))
                 for name, entry in inputs.items()}  # fmt: skip
    with pytest.raises(QbenchError) as caught:
        _worker_prepared(recipe, elsewhere, BuildStore(str(tmp_path / "empty-store")))
    message = str(caught.value)
    assert message.startswith(f"node {socket.gethostname()} cannot read the sweep's inputs: No such file or "
                              f"directory: {tmp_path / 'not-mounted'}/")  # fmt: skip
    assert message.endswith("expected the recipe, its model and data files and the build store at the same paths on "
                            "every node (a shared mount, or baked into the image)")  # fmt: skip


def test_rays_unhandled_error_tracebacks_are_off_while_the_executor_is_connected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Ray logs a task's whole traceback when a failed result is dropped unread (the jobs a stopped sweep gave up
    on): its documented switch is on while connected, Ray's own behaviour back after, and a user's value kept."""
    from qbench.execute.ray_executor import unhandled_errors_ignored

    monkeypatch.delenv("RAY_IGNORE_UNHANDLED_ERRORS", raising=False)
    with unhandled_errors_ignored():
        assert os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] == "1"
    assert "RAY_IGNORE_UNHANDLED_ERRORS" not in os.environ
    monkeypatch.setenv("RAY_IGNORE_UNHANDLED_ERRORS", "0")
    with unhandled_errors_ignored():
        assert os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] == "0"
    assert os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] == "0"
