"""Faults leave nothing half-done: real signals to a real `qbench sweep`, concurrent sweeps into one new
sqlite store, and `qbench ui` stopping the MLflow server with all its workers.

The sweeps run a user's own model (tests/user_model.py) in subprocesses, so the signal goes to a real
process, and are read back from disk and with MlflowClient.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient
from server_processes import free_port, group_members, wait_healthy
from user_model import make_user_project

from qbench.cli.app import main
from qbench.runs import INCOMPLETE_MARKER, RESULTS_FILE

REPO = Path(__file__).resolve().parents[1]
WAIT_S = 60.0


@pytest.fixture(scope="module")
def user_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's model and table, built once; each test writes its own recipe, store and reports next to it."""
    return make_user_project(tmp_path_factory.mktemp("user_project")).parent


def write_recipe(project: Path, target: Path, variants: list[str], iterations: int) -> Path:
    """The user's recipe: absolute paths, only `variants`, exactly `iterations` timed runs at batch 1, a store in
    `target`."""
    recipe = yaml.safe_load((project / "qbench.yaml").read_text())
    recipe["model"]["path"] = str(project / recipe["model"]["path"])
    recipe["data"]["path"] = str(project / recipe["data"]["path"])
    recipe["variants"] = [v for v in recipe["variants"] if v["name"] in variants]
    recipe["latency"] = {"batch_sizes": [1], "warmup": 1, "iterations": iterations, "threads": 1, "stability": None}
    recipe["tracking"]["uri"] = f"sqlite:///{target / 'mlflow.db'}"
    recipe["output_dir"] = str(target / "reports")
    path = target / "qbench.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def qbench_process(*args: str, cwd: Path, **popen: Any) -> subprocess.Popen[str]:
    """`python -m qbench.cli ARGS` with this checkout's qbench, wide output (no folded lines), merged streams."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"}
    env.pop("MLFLOW_TRACKING_URI", None)
    streams: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} | popen
    return subprocess.Popen([sys.executable, "-m", "qbench.cli", *args], cwd=cwd, env=env, text=True, **streams)


class OutputReader:
    """Collects a process's output on a thread, so the test can wait for a line without blocking on the pipe."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()

    def wait_for(self, text: str, timeout_s: float = WAIT_S) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: any(text in line for line in self.lines), timeout=timeout_s):
                raise AssertionError(f"no line with {text!r} within {timeout_s:.0f} s:\n{self.text()[-3000:]}")

    def text(self) -> str:
        self._thread.join(timeout=5)
        return "".join(self.lines)


def wait_for_run(store: Path, name: str, timeout_s: float = WAIT_S) -> None:
    """Wait until the store holds a run named `name` (a sweep's variant run opens as its measurement starts)."""
    deadline = time.monotonic() + timeout_s
    while name not in {run.info.run_name for run in runs_of(store)}:
        if time.monotonic() > deadline:
            raise AssertionError(f"no run {name!r} in {store} within {timeout_s:.0f} s")
        time.sleep(0.1)


def runs_of(store: Path, experiment: str = "tumour-mlp") -> list[Any]:
    client = MlflowClient(f"sqlite:///{store}")
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r} in {store}"
    return client.search_runs([found.experiment_id], run_view_type=ViewType.ALL)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_sweep_ends_runs_killed_and_keeps_what_finished(
    user_project: Path, tmp_path: Path, signum: signal.Signals, capsys: pytest.CaptureFixture[str]
) -> None:
    # fp16's 200k timed runs take far longer than the test waits: the signal always lands inside fp16
    recipe = write_recipe(user_project, tmp_path, ["fp16", "int8-minmax"], iterations=200_000)
    process = qbench_process("sweep", str(recipe), cwd=tmp_path)
    output = OutputReader(process)
    output.wait_for("done: fp32@onnxruntime-cpu")
    output.wait_for("build:fp16: built")
    wait_for_run(tmp_path / "mlflow.db", "fp16 · ort-cpu")  # opened as fp16's measurement starts
    sent = time.monotonic()
    process.send_signal(signum)
    code = process.wait(timeout=30)
    stop_s = time.monotonic() - sent
    shown = output.text()

    assert code == 2
    assert f"sweep interrupted by {signum.name}" in shown and "Traceback" not in shown
    (run_dir,) = (tmp_path / "reports" / "tumour-mlp").iterdir()
    assert str(run_dir / RESULTS_FILE) in shown
    marker = json.loads((run_dir / INCOMPLETE_MARKER).read_text())
    assert marker["state"] == f"interrupted by {signum.name}"
    partial = json.loads((run_dir / RESULTS_FILE).read_text())
    assert partial["complete"] is False and partial["finished_at"] is None
    (fp32,) = partial["variants"]  # what finished is on disk, measured
    assert fp32["variant"] == "fp32" and fp32["status"] == "ok" and fp32["accuracy"]["rows"] == 229

    runs = {run.info.run_name: run for run in runs_of(tmp_path / "mlflow.db")}
    parent = runs.pop(f"tumour-mlp sweep {run_dir.name}")
    assert parent.info.status == "KILLED" and parent.info.end_time is not None
    assert {name: run.info.status for name, run in runs.items()} == {
        "fp32 · ort-cpu": "FINISHED", "fp16 · ort-cpu": "KILLED",
    }  # fmt: skip
    assert all(run.data.tags["mlflow.parentRunId"] == parent.info.run_id for run in runs.values())
    logged_accuracy = runs["fp32 · ort-cpu"].data.metrics["accuracy"]
    assert logged_accuracy == pytest.approx(fp32["accuracy"]["overall"]["metrics"]["accuracy"])
    verdicts = {run.data.tags.get("qbench.gate") for run in [parent, *runs.values()]}
    assert verdicts == {f"not evaluated (sweep interrupted by {signum.name})"}

    capsys.readouterr()
    assert main(["gate", str(recipe)]) == 2  # the newest run is incomplete: the gate refuses it
    refused = " ".join(capsys.readouterr().err.split())
    assert str(run_dir) in refused and "incomplete" in refused
    print(f"{signum.name}: the sweep exited 2 {stop_s:.2f} s after the signal")


@pytest.mark.slow
def test_a_crash_ends_the_runs_failed_and_keeps_every_measured_variant(
    user_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import qbench.sweep.runner

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("simulated crash after the measurements")

    monkeypatch.setattr(qbench.sweep.runner, "evaluate_gate", crash)
    recipe = write_recipe(user_project, tmp_path, ["int8-minmax"], iterations=5)
    with pytest.raises(RuntimeError, match="simulated crash"):
        qbench.sweep.runner.run_sweep(recipe)
    (run_dir,) = (tmp_path / "reports" / "tumour-mlp").iterdir()
    state = json.loads((run_dir / INCOMPLETE_MARKER).read_text())["state"]
    assert state.startswith("failed: RuntimeError: simulated crash after the measurements")
    partial = json.loads((run_dir / RESULTS_FILE).read_text())
    assert partial["complete"] is False
    assert [(v["variant"], v["status"]) for v in partial["variants"]] == [("fp32", "ok"), ("int8-minmax", "ok")]
    runs = runs_of(tmp_path / "mlflow.db")
    assert sorted(run.info.status for run in runs) == ["FAILED", "FINISHED", "FINISHED"]  # the parent failed
    (parent,) = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    assert parent.info.status == "FAILED" and parent.data.tags["qbench.gate"].startswith("not evaluated (sweep failed")


@pytest.mark.slow
def test_the_gate_prefers_the_newest_recorded_run_and_refuses_an_incomplete_one(
    user_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = write_recipe(user_project, tmp_path, ["int8-minmax"], iterations=5)
    untracked = (f"import sys; from qbench.cli.app import main; code = main(['sweep', {str(recipe)!r}, '--no-track']); "
                 "print('mlflow loaded:', 'mlflow' in sys.modules); sys.exit(code)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", untracked], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=2 * WAIT_S)  # fmt: skip
    assert done.returncode == 0 and "mlflow loaded: False" in done.stdout, done.stderr[-3000:]
    assert not (tmp_path / "mlflow.db").exists()
    root = tmp_path / "reports" / "tumour-mlp"
    (complete,) = root.iterdir()
    # a folder whose name sorts last but whose results were finished earlier is not the latest
    early = root / "99999999-999999-aaaaaa"
    raw = json.loads((complete / RESULTS_FILE).read_text())
    early.mkdir()
    (early / RESULTS_FILE).write_text(json.dumps({**raw, "finished_at": "2001-01-01T00:00:00.000000+00:00"}))
    assert main(["gate", str(recipe)]) == 0  # judged on the complete run, not the later one
    assert raw["created_at"] in capsys.readouterr().out
    # a sweep that started after the complete one finished and never ended: fail closed, naming it
    late = root / "00000000-000000-bbbbbb"
    late.mkdir()
    (late / INCOMPLETE_MARKER).write_text(json.dumps({"started_at": "2999-01-01T00:00:00+00:00", "state": "running"}))
    assert main(["gate", str(recipe)]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"{late}, is incomplete (running): wait for it to finish, or judge an older run with --results FILE" in said
    # the same run whose sweep process is gone from this machine: killed, and the way to finish it
    marker = {"started_at": "2999-01-01T00:00:00+00:00", "state": "running", "pid": 2**22 + 1,
              "host": socket.gethostname()}  # fmt: skip
    (late / INCOMPLETE_MARKER).write_text(json.dumps(marker))
    assert main(["gate", str(recipe)]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"is incomplete (killed: its sweep (pid {2**22 + 1}) ended without finishing): finish it with `qbench sweep" in said
    assert "--resume` (or re-run without --resume)" in said


@pytest.mark.slow
def test_concurrent_sweeps_into_one_new_sqlite_store(user_project: Path, tmp_path: Path) -> None:
    recipe = write_recipe(user_project, tmp_path, ["int8-minmax"], iterations=5)
    processes = [qbench_process("sweep", str(recipe), cwd=tmp_path) for _ in range(3)]
    outputs = [OutputReader(p) for p in processes]
    codes = [p.wait(timeout=120) for p in processes]
    assert codes == [0, 0, 0], "\n".join(o.text()[-2000:] for o in outputs)
    folders = sorted((tmp_path / "reports" / "tumour-mlp").iterdir())
    assert len(folders) == 3 and not any((f / INCOMPLETE_MARKER).exists() for f in folders)
    runs = runs_of(tmp_path / "mlflow.db")
    parents = {r.info.run_name for r in runs if "mlflow.parentRunId" not in r.data.tags}
    assert parents == {f"tumour-mlp sweep {f.name}" for f in folders}
    assert len(runs) == 3 * 3 and {r.info.status for r in runs} == {"FINISHED"}  # parent, fp32, int8-minmax each


def _children_of(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.fixture
def ui_process(user_project: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, Path]]:
    """`qbench ui` on a free port, its output (the server's log) in a file; killed if the test leaves it running."""
    recipe = write_recipe(user_project, tmp_path, ["fp16"], iterations=5)
    port, log = free_port(), tmp_path / "ui.log"
    with log.open("w") as log_file:
        process = qbench_process("ui", str(recipe), "--port", str(port), cwd=tmp_path, stdout=log_file)
    try:
        yield process, port, log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process groups from /proc")
def test_ui_passes_sigterm_on_to_the_server_and_all_its_workers(
    ui_process: tuple[subprocess.Popen[str], int, Path],
) -> None:
    process, port, log = ui_process
    wait_healthy(f"http://127.0.0.1:{port}", process, log)
    (command,) = _children_of(process.pid)  # the supervised child that runs the command (qbench.supervisor)
    (server,) = _children_of(command)
    assert os.getpgid(server) == server != os.getpgid(command)  # the server leads a group of its own
    assert len(group_members(server)) > 1  # the server and its workers
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    while group_members(server) and time.monotonic() - sent < 20:
        time.sleep(0.1)
    stop_s = time.monotonic() - sent
    print(f"ui: the server's group was gone {stop_s:.2f} s after SIGTERM")
    assert group_members(server) == []
    assert stop_s < 20
