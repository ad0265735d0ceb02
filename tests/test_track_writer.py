"""The MLflow writer thread: calls in order, off the caller's thread, between timed sections; errors reach drain()."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from test_explain import INT8, write_fragile_project

from qbench.recipe import load_recipe
from qbench.sweep import run_sweep
from qbench.track import SweepTracker
from qbench.track_store import resolve_tracking_uri
from qbench.track_writer import BackgroundWriter
from qbench.validate.timing_guard import GUARD


def test_calls_run_in_order_on_one_other_thread_and_drain_waits_for_them() -> None:
    writer = BackgroundWriter()
    seen: list[tuple[int, str]] = []
    for i in range(20):
        writer.submit(lambda i=i: (time.sleep(0.002), seen.append((i, threading.current_thread().name))))
    writer.drain()
    assert [i for i, _ in seen] == list(range(20))
    assert {name for _, name in seen} == {"qbench-mlflow-writer"}
    writer.stop()


def test_no_call_runs_while_a_section_is_timed() -> None:
    writer = BackgroundWriter()
    done = threading.Event()
    with GUARD.timed():
        writer.submit(done.set)
        assert not done.wait(0.2)
    writer.drain()
    assert done.is_set()
    writer.stop()


def test_the_first_unexpected_error_is_raised_by_drain_and_no_later_call_runs() -> None:
    writer = BackgroundWriter()
    later: list[int] = []

    def fails() -> None:
        raise ValueError("a bug in a logging step")

    writer.submit(fails)
    writer.submit(lambda: later.append(1))
    with pytest.raises(ValueError, match="a bug in a logging step"):
        writer.drain()
    assert later == []
    writer.stop()


def test_a_sweeps_mlflow_writes_run_on_the_writer_between_timed_sections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every variant's writes are made on the writer thread, never inside a timed section, and are all in the store
    (FINISHED, with figures) when the sweep returns."""
    recipe = write_fragile_project(tmp_path, [INT8, {"name": "fp16", "precision": "fp16"}], fragile=())
    monkeypatch.chdir(tmp_path)
    made: list[tuple[str, int]] = []
    for name in ("_start_child", "_log_variant"):
        original = getattr(SweepTracker, name)

        def recording(self: SweepTracker, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            made.append((threading.current_thread().name, GUARD._timed))  # noqa: SLF001 - must be 0 here
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(SweepTracker, name, recording)
    outcome = run_sweep(recipe, track=True)
    assert len(made) == 2 * len(outcome.results.variants) == 6
    assert {thread for thread, _ in made} == {"qbench-mlflow-writer"}
    assert all(timed == 0 for _, timed in made)
    client = MlflowClient(resolve_tracking_uri(load_recipe(recipe)))
    children = client.search_runs([client.get_run(outcome.mlflow_run_id).info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{outcome.mlflow_run_id}'")  # fmt: skip
    assert sorted(run.data.tags["qbench.variant"] for run in children) == ["fp16", "fp32", "int8"]
    assert all(run.info.status == "FINISHED" and run.data.metrics for run in children)
