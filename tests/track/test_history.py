"""Figures logged again into a sweep's run (a resumed sweep, a later `qbench gate`) on a real `mlflow server`: they go
after the history the run holds, whatever the clock of the machine that logged it first."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from sweep_factory import default_variants, make_sweep, make_variant

from qbench.gate.evaluate import evaluate_gate
from qbench.recipe.spec import Recipe, load_recipe
from qbench.track.saved import log_sweep, tag_gate_verdict
from qbench.track.store import end_time, now_ms
from qbench.track.tracker import SweepTracker

AHEAD_S = 3600.0  # the clock of the machine that logged the sweep, ahead of this one's


def _recipe(folder: Path, uri: str) -> Recipe:
    (folder / "model.onnx").write_bytes(b"model")
    (folder / "rows.parquet").write_bytes(b"rows")
    body = {"name": "history", "model": {"path": "model.onnx"}, "task": "classification",
            "data": {"path": "rows.parquet", "inputs": {"x": "input"}, "label": "y"},
            "gate": {"metric": "accuracy", "max_drop": 0.05, "max_slice_drop": 0.1},
            "tracking": {"uri": uri, "experiment": f"history-{folder.name}"}}  # fmt: skip
    (folder / "recipe.yaml").write_text(yaml.safe_dump(body))
    return load_recipe(folder / "recipe.yaml")


def _run_folder(folder: Path, name: str) -> list[Path]:
    """A run folder's results.json and report.md (log_sweep tags the parent run with the folder)."""
    run_dir = folder / name
    run_dir.mkdir()
    artifacts = [run_dir / "results.json", run_dir / "report.md"]
    for path in artifacts:
        path.write_text(path.name)
    return artifacts


def _logged_ahead(monkeypatch: pytest.MonkeyPatch, *args, **kwargs) -> str:
    """log_sweep on a machine whose clock is AHEAD_S ahead of this one's."""
    real = time.time
    with monkeypatch.context() as patch:
        patch.setattr(time, "time", lambda: real() + AHEAD_S)
        return log_sweep(*args, **kwargs)


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)]


def test_a_resumed_sweeps_summary_goes_after_the_interrupted_ones_and_counts_every_variant(
    mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep failed int8_dynamic for a reason outside it and logged variants_failed 1; resumed on a machine whose
    clock is an hour behind, it measured int8_dynamic again. The parent's summary was logged again at step 0 with
    older time stamps: MLflow (latest = highest step, then newest time) kept showing 2 ok and 1 failed, and the
    history held two entries at one step; the parent ended before it started."""
    monkeypatch.chdir(tmp_path)
    recipe = _recipe(tmp_path, mlflow_server)
    fp32, _, int8, _, failed = default_variants()
    first = make_sweep([fp32, int8, failed])
    first_artifacts = _run_folder(tmp_path, "first")
    parent_id = _logged_ahead(monkeypatch, first, recipe, gate=evaluate_gate(first, recipe.gate),
                              artifacts=first_artifacts)  # fmt: skip

    resumed = make_sweep([fp32, int8, make_variant("int8_dynamic", "int8", params={"calibrator": "dynamic"})])
    run_dir = tmp_path / "resumed"
    tracker = SweepTracker.open(recipe, "history sweep resumed", run_dir=run_dir, resumes=first_artifacts[0].parent,
                                system_metrics=False)  # fmt: skip
    assert tracker.parent_id == parent_id
    for variant in resumed.variants:
        tracker.variant_finished(resumed, variant, reused=variant.variant != "int8_dynamic")
    assert tracker.close(resumed, recipe, evaluate_gate(resumed, recipe.gate), _run_folder(tmp_path, "resumed")) == parent_id

    client = MlflowClient(mlflow_server)
    parent = client.get_run(parent_id)
    assert parent.data.metrics["variants_ok"] == 3.0 and parent.data.metrics["variants_failed"] == 0.0
    assert _history(client, parent_id, "variants_ok") == [(0, 2.0), (1, 3.0)]
    assert _history(client, parent_id, "variants_failed") == [(0, 1.0), (1, 0.0)]
    assert parent.info.end_time >= parent.info.start_time


def test_a_later_gate_on_a_machine_whose_clock_is_behind_shows_its_breach_count(
    mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`qbench gate` in CI rewrote the verdict tags but logged gate_breaches at step 0 again: with its clock behind the
    sweep machine's, MLflow kept showing the sweep's count beside the new verdict."""
    monkeypatch.chdir(tmp_path)
    recipe = _recipe(tmp_path, mlflow_server)
    fp32, fp16, int8, _, _ = default_variants()
    results = make_sweep([fp32, fp16, int8])
    gate = evaluate_gate(results, recipe.gate)
    artifacts = _run_folder(tmp_path, "run")
    parent_id = _logged_ahead(monkeypatch, results, recipe, gate=gate, artifacts=artifacts)
    tighter = evaluate_gate(results, recipe.gate.model_copy(update={"max_drop": 0.0, "max_slice_drop": 0.0}))
    assert len(tighter.breaches) > len(gate.breaches)

    assert tag_gate_verdict(recipe, artifacts[0].parent, tighter, results) == parent_id
    client = MlflowClient(mlflow_server)
    assert client.get_run(parent_id).data.metrics["gate_breaches"] == float(len(tighter.breaches))
    assert _history(client, parent_id, "gate_breaches") == [(0, float(len(gate.breaches))),
                                                            (1, float(len(tighter.breaches)))]  # fmt: skip


def test_a_run_another_machine_started_ends_no_earlier_than_it_started(mlflow_server: str) -> None:
    """Runs qbench ends for another machine's sweep (taken over, killed, left by a failed logging) were ended at this
    machine's time: where its clock is behind, before they started."""
    client = MlflowClient(mlflow_server)
    experiment_id = client.create_experiment(f"history-ends-{time.time_ns()}")
    started = now_ms() + int(AHEAD_S * 1000)
    run = client.create_run(experiment_id, start_time=started)
    assert end_time(run) == started
    client.set_terminated(run.info.run_id, status="KILLED", end_time=end_time(run))
    ended = client.get_run(run.info.run_id).info
    assert ended.end_time >= ended.start_time
    mine = client.create_run(experiment_id)
    before = now_ms()
    assert end_time(mine) >= before  # a run this machine started: now
