"""The MLflow store a run folder records its sweep logged to, and how a later command finds it (qbench.track_uri)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_linear import make_linear_project

from qbench.recipe import load_recipe
from qbench.runs import TRACKING_FILE, record_tracking
from qbench.track_uri import run_store_uri


def test_a_relative_store_in_the_environment_is_recorded_where_the_sweep_logged(tmp_path: Path, monkeypatch) -> None:
    """MLFLOW_TRACKING_URI=sqlite:///mlflow.db is relative to the working directory: recorded as given, a gate run
    from another folder looked for the store there (the one thing the record is for)."""
    recipe = load_recipe(make_linear_project(tmp_path, None))  # type: ignore[arg-type]
    work, elsewhere, run = tmp_path / "work", tmp_path / "elsewhere", tmp_path / "run"
    for folder in (work, elsewhere, run):
        folder.mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    monkeypatch.chdir(work)
    record_tracking(run, True, "sqlite:///mlflow.db")
    monkeypatch.chdir(elsewhere)
    assert run_store_uri(recipe, run) == f"sqlite:///{(work / 'mlflow.db').as_posix()}"


@pytest.mark.parametrize("uri", ["https://ci:s3cret@mlflow.example:5000", "http://:s3cret@10.0.0.1/mlflow"])
def test_a_password_in_the_store_is_not_written_in_the_run_folder(tmp_path: Path, monkeypatch, uri: str) -> None:
    """A run folder is uploaded as a CI artifact: the store's URI went into tracking.json as given, password and all.
    It is recorded without it, and a later command naming the same store uses its own URI, password included."""
    recipe = load_recipe(make_linear_project(tmp_path, None))  # type: ignore[arg-type]
    run = tmp_path / "run"
    run.mkdir()
    record_tracking(run, True, uri)
    assert "s3cret" not in (run / TRACKING_FILE).read_text()
    assert json.loads((run / TRACKING_FILE).read_text())["uri"] == uri.replace("ci:s3cret@", "").replace(":s3cret@", "")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert run_store_uri(recipe, run) == uri


def test_a_databricks_store_is_recorded_as_named(tmp_path: Path, monkeypatch) -> None:
    """'databricks' is MLflow's name for a workspace, not a folder of the working directory."""
    recipe = load_recipe(make_linear_project(tmp_path, None))  # type: ignore[arg-type]
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(tmp_path)
    record_tracking(run, True, "databricks")
    assert json.loads((run / TRACKING_FILE).read_text())["uri"] == "databricks"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "databricks")
    assert run_store_uri(recipe, run) == "databricks"
