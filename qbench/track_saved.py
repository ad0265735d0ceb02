"""Log a saved sweep (its run folder) to MLflow after the fact: `qbench track RECIPE RUN_DIR`.

A sweep run with --no-track, or one whose tracking store failed while it ran, has complete results on disk
and none (or a FAILED part) in MLflow; `qbench gate --register` finds a sweep's runs by the run folder
tagged on a FINISHED parent run, so such results could never be registered. Logging the folder makes the
parent run (tagged with the folder), one child run per variant x backend with its logged model, and the
reports as artifacts, as a tracked sweep would have; a folder already logged is not logged twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mlflow.exceptions import MlflowException

from qbench.errors import QbenchError
from qbench.gate import GateReport
from qbench.recipe import Recipe
from qbench.results import SweepResults
from qbench.runs import RESULTS_FILE, describe_run
from qbench.track import SweepTracker, artifact_paths
from qbench.track_store import bounded_retries, finished_sweep_run, open_experiment, store_failure

REPORT_FILES = (RESULTS_FILE, "report.md", "report.html", "frontier.png")  # what a tracked sweep logs, if written


def log_sweep(results: SweepResults, recipe: Recipe, *, gate: GateReport | None, artifacts: Sequence[Path]) -> str:
    """Log saved results as a parent run with one child per variant x backend (tagged with the run folder when
    `artifacts` holds its results.json). Returns the parent run id; nothing is logged when an artifact is missing.
    """
    artifact_paths(recipe, artifacts)
    run_dirs = {Path(a).parent for a in artifacts if Path(a).name == RESULTS_FILE}
    tracker = SweepTracker.open(recipe, f"{results.recipe.get('name', recipe.name)} sweep {results.created_at}",
                                run_dir=run_dirs.pop() if len(run_dirs) == 1 else None)  # fmt: skip
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


def track_run_folder(recipe: Recipe, run_dir: Path) -> str:
    """Log the complete sweep saved in `run_dir` (a run of `recipe`) with its gate verdict; returns the parent run id.

    Refused (QbenchError) for an incomplete run, another recipe's run, or a folder the store holds already.
    """
    from qbench.gate import run_gate

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
        raise QbenchError(f"{run_dir} is in MLflow already (sweep run {existing}); nothing logged")
    artifacts = [run_dir / name for name in REPORT_FILES if (run_dir / name).is_file()]
    return log_sweep(results, recipe, gate=gate, artifacts=artifacts)
