"""A tracked sweep interrupted and resumed: MLflow shows one sweep, not the finished variants twice."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from probe_project import VARIANTS, probe_calls, write_probe_recipe
from tracking_hooks import wait_until_gone

import qbench.sweep.runner as sweep_module
from qbench.errors import QbenchError
from qbench.recipe.spec import load_recipe
from qbench.sweep.runner import run_sweep
from qbench.track.content import variant_metrics
from qbench.track.store import RUN_DIR_TAG, experiment_name


def test_a_resumed_sweep_logs_into_the_interrupted_sweeps_run_each_variant_once(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int]
) -> None:
    """--resume opened a second parent run: the interrupted one stayed KILLED with its finished children, so the
    experiment showed them twice and their models were logged twice."""
    _, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    # the dry run and fp32 finished, fp16's measure job interrupted
    (tmp_path / "interrupt_at").write_text(str(2 * per_job + 1))
    with pytest.raises(QbenchError, match="interrupted by SIGINT"):
        run_sweep(recipe)
    (interrupted,) = (tmp_path / "reports" / "tumour-mlp").glob("2*")

    outcome = run_sweep(recipe, resume=True)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.get_experiment_by_name(experiment_name(load_recipe(recipe))).experiment_id
    runs = client.search_runs([experiment_id])  # the runs the UI lists (deleted ones are not)
    [parent] = [run for run in runs if MLFLOW_PARENT_RUN_ID not in run.data.tags]
    assert parent.info.run_id == outcome.mlflow_run_id and parent.info.status == "FINISHED"
    assert parent.data.tags[RUN_DIR_TAG] == str(outcome.run_dir.resolve())  # `gate --register` finds it
    assert parent.data.tags["qbench.resumed_from"] == str(interrupted.resolve())
    samples = client.get_metric_history(parent.info.run_id, "system/cpu_utilization_percentage")
    assert len(samples) >= 2 and len({m.step for m in samples}) == len(samples)  # the resumed sweep's steps go on
    children = {f"{r.data.tags['qbench.variant']}@{r.data.tags['qbench.backend']}": r for r in runs if r != parent}
    assert len(children) == len(runs) - 1 == len(outcome.results.variants)
    for variant in outcome.results.variants:
        child = children[variant.key]
        assert child.data.tags[MLFLOW_PARENT_RUN_ID] == parent.info.run_id
        assert child.info.status == "FINISHED", variant.key
        assert child.data.tags["qbench.gate"] in ("pass", "fail", "not gated"), variant.key  # not "not evaluated"
        expected = {k: v for k, v in variant_metrics(outcome.results, variant).items() if v is not None
                    and math.isfinite(v)}
        assert set(child.data.metrics) == set(expected), (variant.key, set(child.data.metrics) ^ set(expected))
        assert child.data.metrics == pytest.approx(expected), variant.key
        assert len(client.get_metric_history(child.info.run_id, "model_mb")) == 1, variant.key  # logged once
    resumed = [v.key for v in outcome.results.variants if any(n.startswith("resumed") for n in v.notes)]
    assert resumed == ["fp32@onnxruntime-cpu"]
    models = client.search_logged_models(experiment_ids=[experiment_id])
    assert sorted(m.name for m in models) == sorted({v.variant for v in outcome.results.variants}), "one model each"


def test_a_sweep_killed_outright_leaves_no_run_running_once_resumed(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int]
) -> None:
    """SIGKILL (CI's timeout after its grace period, the OOM killer) ends no MLflow run in the sweep's process: its
    tracking process ends them KILLED when the sweep's pipe to it closes. The resumed sweep takes over the parent and
    measures fp16 again; it had left the killed sweep's fp16 child RUNNING (deleted, so the UI hid it; the store's
    queries and `mlflow gc` still saw a run in progress)."""
    _, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    # the dry run and fp32 measured; fp16's measurement waits while this exists
    (tmp_path / "hold_after").write_text(str(2 * per_job))
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    # the sweep's own process (qbench.cli.child), not the `qbench` command's supervising parent: killing that one ends
    # the sweep with SIGTERM (qbench.supervisor), which ends its runs itself
    sweep = subprocess.Popen([sys.executable, "-m", "qbench.cli.child", "sweep", str(recipe)], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 600  # a loaded machine's start (imports, fp32's build and measurement) is slow
        while len(probe_calls(tmp_path)) <= 2 * per_job and sweep.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sweep.poll() is None, "the sweep ended before fp16's measurement"
        assert len(probe_calls(tmp_path)) > 2 * per_job, "fp16's measurement had not started in 10 minutes"
    finally:
        sweep.send_signal(signal.SIGKILL)
        sweep.wait(timeout=30)
        (tmp_path / "hold_after").unlink()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.get_experiment_by_name(experiment_name(load_recipe(recipe))).experiment_id
    wait_until_gone(tmp_path)  # the sweep's tracking process, which ends the runs its killed sweep left open
    killed = client.search_runs([experiment_id], run_view_type=ViewType.ALL)
    assert sorted(r.info.status for r in killed) == ["FINISHED", "KILLED", "KILLED"]  # fp32; the sweep, fp16

    outcome = run_sweep(recipe, resume=True)
    runs = client.search_runs([experiment_id], run_view_type=ViewType.ALL)
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []
    assert {r.info.run_id for r in runs if r.info.status == "FINISHED"} >= {outcome.mlflow_run_id}


def test_a_finished_run_resumed_for_a_job_failed_for_an_environment_reason_shows_each_variant_once(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resumed sweep takes over the finished sweep's parent run (FINISHED, not only an interrupted one's): the
    failed child goes, the others are kept as logged, and the parent's gate verdict is the resumed run's. Resumed on
    another machine, the parent's params (which MLflow never changes) keep the first values, the new ones as tags."""
    _, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    (tmp_path / "fail_at").write_text(f"{2 * per_job + 1} ENOSPC")
    failed = run_sweep(recipe)
    assert failed.results.find("fp16", "onnxruntime-cpu").status == "failed"
    first_cpu = failed.results.environment["cpu"]
    elsewhere = sweep_module.describe_environment
    monkeypatch.setattr(sweep_module, "describe_environment", lambda: {**elsewhere(), "cpu": "another CPU"})

    outcome = run_sweep(recipe, resume=True)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.get_experiment_by_name(experiment_name(load_recipe(recipe))).experiment_id
    runs = client.search_runs([experiment_id])
    [parent] = [run for run in runs if MLFLOW_PARENT_RUN_ID not in run.data.tags]
    assert parent.info.run_id == outcome.mlflow_run_id == failed.mlflow_run_id and parent.info.status == "FINISHED"
    assert parent.data.tags[RUN_DIR_TAG] == str(outcome.run_dir.resolve())
    assert parent.data.tags["qbench.resumed_from"] == str(failed.run_dir.resolve())
    assert parent.data.tags["qbench.gate"] == "pass"
    assert parent.data.params["env.cpu"] == first_cpu and parent.data.tags["resumed.env.cpu"] == "another CPU"
    children = {f"{r.data.tags['qbench.variant']}@{r.data.tags['qbench.backend']}": r for r in runs if r != parent}
    assert sorted(children) == sorted(v.key for v in outcome.results.variants) and len(runs) == 4
    assert {key: child.info.status for key, child in children.items()} == dict.fromkeys(children, "FINISHED")
    assert {key: child.data.tags["qbench.gate"] for key, child in children.items()} == {
        "fp32@onnxruntime-cpu": "not gated", "fp16@onnxruntime-cpu": "pass", "int8-minmax@onnxruntime-cpu": "pass"}
    models = client.search_logged_models(experiment_ids=[experiment_id])
    assert sorted(m.name for m in models) == sorted({v.variant for v in outcome.results.variants}), "one model each"
