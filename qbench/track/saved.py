"""Log a saved sweep (its run folder) to MLflow after the fact: `qbench track RECIPE RUN_DIR`.

A sweep run with --no-track, or one whose tracking store failed while it ran, has complete results on disk
and none (or a FAILED part) in MLflow; `qbench gate --register` finds a sweep's runs by the run folder
tagged on a FINISHED parent run, so such results could never be registered. Logging the folder makes the
parent run (tagged with the folder), one child run per variant x backend with its logged model, and the
reports as artifacts, as a tracked sweep would have (no system metrics: the sweep's samples were not saved, and
samples taken now would describe the logging); a folder already logged is not logged twice. The runs the sweep left
when its store failed (a parent still RUNNING, children with a pending verdict, RUNNING or FINISHED) and their models
are ended FAILED then, pointing at the new parent run, so the UI shows no sweep in progress that ended long ago and no
variant twice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from mlflow.entities import LoggedModelStatus, Metric, Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from qbench.errors import QbenchError
from qbench.gate.evaluate import GateReport
from qbench.recipe.spec import Recipe
from qbench.results.schema import SweepResults
from qbench.runs import RESULTS_FILE, describe_run, record_tracking
from qbench.track.content import GATE_TAG, sweep_gate_tags, tag_value
from qbench.track.store import (
    after_logged,
    bounded_retries,
    end_time,
    existing_experiment,
    finished_sweep_run,
    open_experiment,
    search_literal,
    store_failure,
    unfinished_sweep_runs,
)
from qbench.track.tracker import SweepTracker, artifact_paths, children_of, log_gate
from qbench.track.uri import resolve_tracking_uri, run_store_uri

logger = logging.getLogger(__name__)

# what a tracked sweep logs, if written (frontier.png: the plot of a folder swept before frontier.svg replaced it)
REPORT_FILES = (RESULTS_FILE, "report.md", "report.html", "frontier.svg", "frontier.png")


def log_sweep(results: SweepResults, recipe: Recipe, *, gate: GateReport | None, artifacts: Sequence[Path]) -> str:
    """Log saved results as a parent run with one child per variant x backend (tagged with the run folder when
    `artifacts` holds its results.json). Returns the parent run id; nothing is logged when an artifact is missing.
    """
    artifact_paths(recipe, artifacts)
    run_dirs = {Path(a).parent for a in artifacts if Path(a).name == RESULTS_FILE}
    run_dir = run_dirs.pop() if len(run_dirs) == 1 else None
    label = run_dir.name if run_dir is not None else results.created_at  # the folder: named as its sweep names it
    tracker = SweepTracker.open(recipe, f"{results.recipe.get('name', recipe.name)} sweep {label}", run_dir=run_dir,
                                system_metrics=False)  # fmt: skip
    run_id = tracker.close(results, recipe, gate, artifacts)
    if run_id is None:
        raise QbenchError(tracker.failure or "MLflow tracking failed")
    return run_id


def logged_sweep_run(recipe: Recipe, run_dir: Path) -> str | None:
    """The id of a FINISHED MLflow sweep run tagged with `run_dir` in the recipe's experiment, if there is one."""
    with bounded_retries():
        client, uri, experiment_id = open_experiment(recipe)
        try:
            found = finished_sweep_run(client, experiment_id, run_dir)
        except (MlflowException, OSError) as exc:
            raise QbenchError(store_failure(uri, exc)) from exc
    return found.info.run_id if found else None


def tag_gate_verdict(recipe: Recipe, run_dir: Path, gate: GateReport, results: SweepResults) -> str | None:
    """Tag the MLflow runs of the sweep saved in `run_dir` (the newest finished sweep run tagged with it, and its
    variants' runs) with `gate`'s verdict on `results`, its notes and the cheapest variant as a sweep tags them,
    replacing the ones there: the UI shows the latest verdict on those results, as the CI job that ran `qbench gate`
    saw it. Returns the sweep run's id; None where the recipe's store holds no such run (the sweep was not tracked,
    or tracked elsewhere). A store that fails is a QbenchError naming it."""
    found = existing_experiment(recipe, run_store_uri(recipe, run_dir))
    if found is None:
        return None
    client, uri, experiment_id = found
    with bounded_retries():
        try:
            parent = finished_sweep_run(client, experiment_id, run_dir)
            if parent is None:
                return None
            children = children_of(client, experiment_id, parent.info.run_id)
            log_gate(client, {key: run.info.run_id for key, run in children.items()}, gate)
            step, stamp = after_logged(parent)  # after the sweep's count, whatever clock logged that
            breaches = Metric("gate_breaches", float(len(gate.breaches)), stamp, step)  # as sweep_metrics
            tags = [RunTag(k, v) for k, v in sweep_gate_tags(results, gate).items()]  # the cheapest follows the verdict
            client.log_batch(parent.info.run_id, [breaches], tags=tags)
        except (MlflowException, OSError) as exc:
            raise QbenchError(store_failure(uri, exc)) from exc
    return parent.info.run_id


def track_run_folder(recipe: Recipe, run_dir: Path) -> tuple[str, bool]:
    """Log the complete sweep saved in `run_dir` (a run of `recipe`) with its gate verdict; returns the parent run id
    and whether it was logged now: a folder the store holds already is logged once, so a retried CI job that tracks
    it again gets its run, not an error.

    Refused (QbenchError) for an incomplete run or another recipe's run.
    """
    from qbench.gate.run import run_gate

    run = describe_run(run_dir)
    if run is None:
        raise QbenchError(f"{run_dir}: no {RESULTS_FILE}; expected a sweep's run folder")
    if not run.complete:
        raise QbenchError(f"{run_dir} is an incomplete run ({run.state}): finish it with `qbench sweep <recipe> "
                          "--resume`, then track that run")  # fmt: skip
    gate, results = run_gate(recipe, run_dir / RESULTS_FILE)
    if results.recipe.get("name") != recipe.name:
        raise QbenchError(f"{run_dir} is a run of recipe {results.recipe.get('name')!r}, not of {recipe.name!r}")
    existing = logged_sweep_run(recipe, run_dir)
    if existing is not None:
        return existing, False
    artifacts = [run_dir / name for name in REPORT_FILES if (run_dir / name).is_file()]
    # first: a folder logged but not marked would be left untagged by `qbench gate`
    record_tracking(run_dir, True, resolve_tracking_uri(recipe))
    run_id = log_sweep(results, recipe, gate=gate, artifacts=artifacts)
    _end_failed_attempts(recipe, run_dir, run_id)
    return run_id, True


def _end_failed_attempts(recipe: Recipe, run_dir: Path, logged_as: str) -> None:
    """End FAILED every run of `run_dir`'s sweep attempt whose store went away mid-sweep, and the models they logged,
    tagging each with where the results are now instead of a pending verdict. Those left RUNNING (nothing could end
    them) and those the attempt finished before the store went away alike: a FINISHED child of that attempt, and its
    READY model, would stand in the UI beside the same variant's logged runs and models as a second result.
    Best effort: the results are logged already, so a store failing here is a warning."""
    verdict = tag_value(f"not evaluated (the sweep's MLflow logging failed; its results are in run {logged_as})")
    with bounded_retries(resolve_tracking_uri(recipe)):
        client, uri, experiment_id = open_experiment(recipe)
        try:
            for parent in unfinished_sweep_runs(client, experiment_id, run_dir, keep=logged_as):
                children = client.search_runs(
                    [experiment_id], f"tags.`{MLFLOW_PARENT_RUN_ID}` = {search_literal(parent.info.run_id)}")
                for run in (*children, parent):
                    client.set_tag(run.info.run_id, GATE_TAG, verdict)
                    if run.info.status not in ("FAILED", "KILLED"):
                        client.set_terminated(run.info.run_id, status="FAILED", end_time=end_time(run))
                    _fail_models(client, run, verdict)
                logger.info("MLflow: ended the sweep run %s left by the failed logging of %s", parent.info.run_id,
                            run_dir)  # fmt: skip
        except (MlflowException, OSError) as exc:
            logger.warning("%s; the runs its sweep left in MLflow are not ended", store_failure(uri, exc))


def _fail_models(client: MlflowClient, run: Run, verdict: str) -> None:
    """Mark FAILED the models `run` created (READY, or PENDING where the store went away during the upload), tagged
    with `verdict`; a model it only links to, created by another run, is left alone."""
    created = client.search_logged_models([run.info.experiment_id],
                                          filter_string=f"source_run_id = {search_literal(run.info.run_id)}")
    for model in created:
        client.set_logged_model_tags(model.model_id, {GATE_TAG: verdict})
        if model.status != LoggedModelStatus.FAILED:
            client.finalize_logged_model(model.model_id, LoggedModelStatus.FAILED)

