"""How many store writes a sweep's logging makes, and that folding them changes nothing the store holds.

A sqlite store commits (a wait for the disk) each kind of entry a log_batch request carries, so the tracker writes
a run's tags, metrics and params in as few requests as the order of events allows: a variant's gate verdict with
its own tags when the gate came first (results logged after their sweep), the sweep's system metrics with its
summary. Two ways of logging one sweep, as it runs and after it, must leave the same runs, keys and values."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from test_tracker import artifacts_for, small_sweep, write_recipe

from qbench.gate.evaluate import GateReport, evaluate_gate
from qbench.recipe.spec import Recipe
from qbench.results.schema import SweepResults
from qbench.track.content import GATE_TAG
from qbench.track.saved import log_sweep
from qbench.track.store import resolve_tracking_uri
from qbench.track.system import PREFIX as SYSTEM_PREFIX
from qbench.track.tracker import SweepTracker


@dataclasses.dataclass
class Sweep:
    recipe: Recipe
    results: SweepResults
    gate: GateReport
    artifacts: list[Path]
    run_dir: Path


@pytest.fixture
def sweep(tmp_path: Path) -> Sweep:
    (tmp_path / "recipe").mkdir()
    (tmp_path / "run").mkdir()
    recipe = write_recipe(tmp_path / "recipe")
    results = small_sweep()
    return Sweep(recipe, results, evaluate_gate(results, recipe.gate), artifacts_for(tmp_path / "run"), tmp_path / "run")


def _log_as_it_runs(sweep: Sweep) -> str:
    """The sweep's runs driven as a sweep drives them: each variant logged and ended as it finishes, before the gate."""
    tracker = SweepTracker.open(sweep.recipe, f"digits sweep {sweep.run_dir.name}", run_dir=sweep.run_dir)
    for variant in sweep.results.variants:
        tracker.variant_started(variant.variant, variant.backend)
        tracker.variant_finished(sweep.results, variant)
    parent_id = tracker.close(sweep.results, sweep.recipe, sweep.gate, sweep.artifacts)
    assert parent_id is not None, tracker.failure
    return parent_id


def _log_after(sweep: Sweep) -> str:
    return log_sweep(sweep.results, sweep.recipe, gate=sweep.gate, artifacts=sweep.artifacts)


def _content(client: MlflowClient, parent_id: str) -> dict[str, dict[str, Any]]:
    """Each run of the sweep (the sweep's as 'sweep', a variant's as variant@backend): what the store holds in it but
    ids, times and system metrics (sampled only while a sweep runs)."""
    parent = client.get_run(parent_id)
    found = client.search_runs([parent.info.experiment_id], f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent_id}'")
    runs = {"sweep": parent} | {f"{r.data.tags['qbench.variant']}@{r.data.tags['qbench.backend']}": r for r in found}
    content = {}
    for key, run in runs.items():
        metrics = {name: [m.value for m in client.get_metric_history(run.info.run_id, name)]
                   for name in run.data.metrics if not name.startswith(SYSTEM_PREFIX)}  # fmt: skip
        content[key] = {"status": run.info.status, "name": run.info.run_name, "params": run.data.params,
                        "metrics": metrics, "tags": {k: v for k, v in run.data.tags.items() if k != MLFLOW_PARENT_RUN_ID},
                        "artifacts": sorted(a.path for a in client.list_artifacts(run.info.run_id))}  # fmt: skip
    return content


def test_a_sweep_logged_as_it_runs_and_after_it_leaves_the_same_runs_keys_and_values(
    sweep: Sweep, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    contents = []
    for how, log in (("live", _log_as_it_runs), ("after", _log_after)):
        (tmp_path / how).mkdir()
        monkeypatch.chdir(tmp_path / how)  # the default store: sqlite in the working directory
        parent_id = log(sweep)
        contents.append(_content(MlflowClient(tracking_uri=resolve_tracking_uri(sweep.recipe)), parent_id))
    live, after = contents
    assert live == after
    assert set(live) == {"sweep", *(v.key for v in sweep.results.variants)}
    for variant in sweep.results.variants:  # each with its verdict and its own tags, none pending
        tags = live[variant.key]["tags"]
        assert tags[GATE_TAG] == sweep.gate.status_of(variant.variant, variant.backend)
        assert tags["qbench.status"] == variant.status


class _Requests:
    """MlflowClient.log_batch's requests, by run id: what each carried."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.by_run: dict[str, list[dict[str, list]]] = {}
        log_batch = MlflowClient.log_batch

        def spy(client: MlflowClient, run_id: str, metrics: Any = (), params: Any = (), tags: Any = (),
                **kwargs: Any) -> Any:  # fmt: skip
            self.by_run.setdefault(run_id, []).append({"metrics": list(metrics), "params": list(params),
                                                       "tags": list(tags)})  # fmt: skip
            return log_batch(client, run_id, metrics, params, tags, **kwargs)

        monkeypatch.setattr(MlflowClient, "log_batch", spy)


def test_results_logged_after_their_sweep_write_each_variants_tags_with_its_verdict(
    sweep: Sweep, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate is known before the variants' runs are written: one request each, its verdict among its tags (not a
    second request, a second commit, for the verdict alone)."""
    monkeypatch.chdir(tmp_path)
    requests = _Requests(monkeypatch)
    parent_id = _log_after(sweep)
    children = {run_id: calls for run_id, calls in requests.by_run.items() if run_id != parent_id}
    assert len(children) == len(sweep.results.variants)
    for calls in children.values():
        assert len(calls) == 1
        keys = Counter(tag.key for tag in calls[0]["tags"])
        assert keys[GATE_TAG] == 1 and keys["qbench.status"] == 1


def test_the_sweeps_system_metrics_go_with_its_summary(sweep: Sweep, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The samples are written in the request that writes the sweep's figures, not in one of their own."""
    monkeypatch.chdir(tmp_path)
    requests = _Requests(monkeypatch)
    parent_id = _log_as_it_runs(sweep)
    [summary] = requests.by_run[parent_id]
    names = {metric.key for metric in summary["metrics"]}
    assert any(name.startswith(SYSTEM_PREFIX) for name in names)
    assert "variants_ok" in names
    assert summary["tags"] and summary["params"]
