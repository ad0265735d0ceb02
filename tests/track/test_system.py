from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from sampled import wait_for_samples
from test_tracker import write_recipe

from qbench.track.store import resolve_tracking_uri
from qbench.track.system import PREFIX, SystemSampler
from qbench.track.tracker import SweepTracker


def test_samples_are_steps_in_time_order_named_as_mlflows() -> None:
    sampler = SystemSampler(interval_s=0.05, first_step=7)
    sampler.start()
    wait_for_samples(sampler._samples, 2)
    metrics = sampler.finish()
    cpu = [m for m in metrics if m.key == f"{PREFIX}cpu_utilization_percentage"]
    assert len(cpu) >= 3  # the interval's samples and a last one at finish
    assert [m.step for m in cpu] == list(range(7, 7 + len(cpu)))
    assert [m.timestamp for m in cpu] == sorted(m.timestamp for m in cpu)
    assert all(0 <= m.value <= 100 for m in cpu)
    assert any(m.key == f"{PREFIX}system_memory_usage_megabytes" and m.value > 0 for m in metrics)
    assert sampler.finish() == []


def test_the_store_gets_system_metrics_once_when_the_sweep_ends(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """While the sweep runs (and its latency is timed), sampling writes nothing to the store; the parent run gets
    every sample when the sweep ends, however it ends."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.05")
    recipe = write_recipe(tmp_path)
    client = MlflowClient(tracking_uri=resolve_tracking_uri(recipe))
    tracker = SweepTracker.open(recipe, "sampled sweep")
    wait_for_samples(tracker._sampler._samples, 3)
    assert not any(key.startswith(PREFIX) for key in client.get_run(tracker.parent_id).data.metrics)
    tracker.abort("KILLED", "test over")
    history = client.get_metric_history(tracker.parent_id, f"{PREFIX}cpu_utilization_percentage")
    assert sorted(m.step for m in history) == list(range(len(history))) and len(history) >= 4
