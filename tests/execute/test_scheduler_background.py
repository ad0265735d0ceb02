"""Jobs beside a busy background worker (qbench.validate.background: the MLflow logging process): while it has work
left, builds that time nothing go before measurements, and a job that times starts only once it has settled. Without
one, jobs run in plan order."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import pytest
from probe_project import VARIANTS, write_probe_recipe

from qbench.execute.records import JOBS_FOLDER
from qbench.sweep.runner import _Progress, run_sweep
from qbench.validate.background import settled_before_timing

PLAN_ORDER = ["build:fp32", "measure:fp32@onnxruntime-cpu", "build:fp16", "measure:fp16@onnxruntime-cpu",
              "build:int8-minmax", "measure:int8-minmax@onnxruntime-cpu"]  # fmt: skip


class SlowToSettle:
    """Busy until it is first settled (a tracking process still opening the runs), then idle; records, at each
    settle, the jobs the sweep had recorded as finished."""

    def __init__(self, reports: Path) -> None:
        self.reports = reports
        self.settled_after: list[set[str]] = []

    def busy(self) -> bool:
        return not self.settled_after

    def hand_over(self) -> None:
        """Holds nothing."""

    def settle(self, *, keep_held: bool = False) -> None:
        self.settled_after.append({json.loads(p.read_text())["job"]
                                   for p in self.reports.glob(f"*/{JOBS_FOLDER}/*.json")})


def started_order(jobs: Path) -> list[str]:
    """The run folder's finished jobs, in the order they started."""
    records = [json.loads(path.read_text()) for path in jobs.glob("*.json")]
    return [r["job"] for r in sorted(records, key=lambda r: r["times"]["started"])]



def test_builds_go_first_while_a_background_worker_is_busy_and_a_measurement_waits_for_it(
    user_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    worker = SlowToSettle(tmp_path / "reports" / "tumour-mlp")
    with ExitStack() as registered:  # from where the sweep opens its MLflow runs, as the tracking process is
        monkeypatch.setattr(_Progress, "open_tracker", lambda *_, **__: registered.enter_context(
            settled_before_timing(worker)))  # fmt: skip
        outcome = run_sweep(recipe, track=False)
    order = started_order(outcome.run_dir / JOBS_FOLDER)
    assert order == ["build:fp32", "build:fp16", "build:int8-minmax", "measure:fp32@onnxruntime-cpu",
                     "measure:fp16@onnxruntime-cpu", "measure:int8-minmax@onnxruntime-cpu"]  # fmt: skip
    # the first settle (the scheduler's, before FP32's measurement) came once every build was done
    assert worker.settled_after[0] == {"build:fp32", "build:fp16", "build:int8-minmax"}
    assert len(worker.settled_after) == 2 * 3  # the scheduler's and measure's own, per measurement
    assert [v.status for v in outcome.results.variants] == ["ok", "ok", "ok"]


def test_without_a_background_worker_jobs_run_in_plan_order(user_project: Path, tmp_path: Path) -> None:
    outcome = run_sweep(write_probe_recipe(user_project, tmp_path, variants=VARIANTS), track=False)
    assert started_order(outcome.run_dir / JOBS_FOLDER) == PLAN_ORDER
