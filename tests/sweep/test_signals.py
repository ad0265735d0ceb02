"""A signal while a sweep ends (its results complete, its MLflow runs being logged or logged already): the exit is
2 with one line, and MLflow is left as it is, or the line says how to log what it lacks. A signal right after a build
returns: the build is recorded, and `--resume` takes that run up.

Each sweep runs as a real process that signals itself right after one of qbench's functions returns."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from signalled import run_signalled
from user_model import make_fp16_project

from qbench.cli.app import main
from qbench.execute.records import read_records

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The user's project with FP16 only, timed briefly, tracked in a sqlite store; returns its recipe."""
    return make_fp16_project(tmp_path)


def signalled_sweep(recipe: Path, hook: str, *options: str) -> tuple[int, str, Path]:
    """`qbench sweep RECIPE [OPTIONS]` that gets SIGTERM right after `hook` (module:function) returns: (status, its
    last error line, the run folder)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"}
    done = run_signalled(hook, signal.SIGTERM, "sweep", str(recipe), *options, env=env, cwd=recipe.parent)
    [run_dir] = (recipe.parent / "reports" / "tumour-mlp").iterdir()
    return done.returncode, done.stderr.strip().splitlines()[-1], run_dir


def sweep_runs(recipe: Path) -> list:
    client = MlflowClient(f"sqlite:///{recipe.parent / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tumour-mlp")
    return [run for run in client.search_runs([experiment.experiment_id]) if " sweep " in run.info.run_name]


def test_a_signal_while_mlflow_logs_the_finished_sweep_says_how_to_log_it(project: Path) -> None:
    """The signal lands as the tracking process has logged the sweep, before the sweep lets go of its runs."""
    code, line, run_dir = signalled_sweep(project, "qbench.track.process:RemoteTracker.close")
    assert code == 2
    assert line.endswith(f"sweep interrupted by SIGTERM: the results are complete in {run_dir}, not in MLflow "
                         f"(log them there with `qbench track {project} {run_dir}`)")  # fmt: skip
    assert main(["track", str(project), str(run_dir)]) == 0
    assert sorted(run.info.status for run in sweep_runs(project)) == ["FINISHED", "KILLED"]


def test_a_signal_once_mlflow_has_the_whole_sweep_leaves_its_runs_finished(project: Path) -> None:
    # after the MLflow logging ended
    code, line, run_dir = signalled_sweep(project, "qbench.sweep.runner:_with_timings")
    assert code == 2
    assert line.endswith(f"sweep interrupted by SIGTERM: the results are complete in {run_dir}")
    [parent] = sweep_runs(project)
    assert (parent.info.status, parent.data.tags["qbench.gate"]) == ("FINISHED", "pass")


def test_a_signal_right_after_the_first_build_leaves_it_for_resume(project: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """The build was in the store but not recorded when the signal landed: `--resume` found "no finished job" in the
    interrupted run, left it INCOMPLETE and opened a second MLflow sweep beside its KILLED one. The line named a
    results.json that no variant had written, then said "no variant run finished" of a run that recorded its build:
    it now counts the finished jobs the run folder records."""
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "store"))  # empty: no other test's build of FP16 in it
    code, line, run_dir = signalled_sweep(project, "qbench.execute.executors:run_build")
    assert code == 2
    assert line == (f"error: sweep interrupted by SIGTERM: no variant run in results.json; {run_dir} is marked "
                    f"incomplete; 1 finished job recorded in {run_dir / 'jobs'}, which `qbench sweep {project} "
                    "--resume` reuses")  # fmt: skip
    [build] = read_records(run_dir).values()
    assert (build.job, build.error) == ("build:fp32", None) and build.manifest is not None
    with caplog.at_level(logging.INFO, logger="qbench"):
        assert main(["sweep", str(project), "--resume"]) == 0
    assert f"resuming: 1 of 4 jobs reused from the build store and {run_dir}" in caplog.text
    [parent] = sweep_runs(project)
    assert (parent.info.status, parent.data.tags["qbench.resumed_from"]) == ("FINISHED", str(run_dir.resolve()))


def measured_content(run_dir: Path) -> dict[str, dict]:
    """Each variant run's results, but for what differs between two runs of the same jobs (timings, files, notes)."""
    variants = json.loads((run_dir / "results.json").read_text())["variants"]
    timed = {"latency", "serving", "build_seconds", "model_path", "evaluated_model_path", "notes"}
    return {f"{v['variant']}@{v['backend']}": {k: x for k, x in v.items() if k not in timed} for v in variants}


def test_a_signal_right_after_a_measurement_returns_leaves_it_for_resume(project: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """FP32's measurement was done but recorded only after the job had returned: a signal in between lost it, and
    `--resume` measured it again. The resumed sweep's results are those of a sweep never interrupted."""
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "store"))
    # untracked, the jobs run in plan order (tracked, builds go first while the MLflow runs open, for as long as that
    # takes)
    code, line, run_dir = signalled_sweep(project, "qbench.execute.executors:run_measure", "--no-track")
    assert code == 2
    assert line.endswith(f"incomplete; 2 finished jobs recorded in {run_dir / 'jobs'}, which `qbench sweep {project} "
                         "--resume` reuses")  # fmt: skip
    records = read_records(run_dir)
    assert sorted(records) == ["build:fp32", "measure:fp32@onnxruntime-cpu"]
    measured = records["measure:fp32@onnxruntime-cpu"]
    assert measured.result is not None and measured.result.status == "ok" and measured.outputs is not None
    with caplog.at_level(logging.INFO, logger="qbench"):
        assert main(["sweep", str(project), "--resume"]) == 0
    assert f"resuming: 2 of 4 jobs reused from the build store and {run_dir}" in caplog.text
    resumed = next(folder for folder in run_dir.parent.iterdir() if folder != run_dir)
    assert main(["sweep", str(project)]) == 0
    [whole] = set(run_dir.parent.iterdir()) - {run_dir, resumed}
    assert measured_content(resumed) == measured_content(whole)


def test_a_resume_stopped_while_it_takes_over_the_finished_jobs_loses_none_of_them(
        project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """The first run measured everything; its resume, stopped after it had recorded only the builds it took over,
    was the newest run of the plan, so the next resume took up that one alone and measured everything again."""
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "store"))
    code, _, first = signalled_sweep(project, "qbench.sweep.runner:_range_analysis")  # every job recorded
    assert code == 2 and len(read_records(first)) == 4
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"}
    done = run_signalled("qbench.execute.scheduler:decide_measure", signal.SIGINT, "sweep", str(project), "--resume",
                         env=env, cwd=project.parent)  # fmt: skip
    assert done.returncode == 2 and "interrupted by SIGINT" in done.stderr.strip().splitlines()[-1]
    [second] = set(first.parent.iterdir()) - {first}
    assert sorted(os.listdir(second / "jobs")) == ["build_fp32.json"]
    with caplog.at_level(logging.INFO, logger="qbench"):
        assert main(["sweep", str(project), "--resume"]) == 0
    assert f"resuming: 4 of 4 jobs reused from the build store and {second}" in caplog.text
    [resumed] = set(first.parent.iterdir()) - {first, second}
    notes = [v["notes"] for v in json.loads((resumed / "results.json").read_text())["variants"]]
    assert all(f"resumed: measured by the interrupted run {first.name}" in n for n in notes)
