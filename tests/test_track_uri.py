"""The MLflow store a run folder records its sweep logged to, and how a later command finds it (qbench.track_uri)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from auth_proxy import refusing_proxy
from server_processes import free_port
from tiny_linear import make_linear_project

from qbench.errors import QbenchError
from qbench.recipe import load_recipe
from qbench.runs import TRACKING_FILE, record_tracking
from qbench.track_uri import check_reachable, run_store_uri


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


def test_a_server_reached_with_a_password_in_its_uri_or_behind_an_auth_proxy_answers(mlflow_server: str) -> None:
    """The fail-fast probe sent `http://ci:s3cret@host/health` to a host named `ci:s3cret@host` and refused a server
    MLflow's client reaches with those credentials as one that "does not answer", printing the password; a proxy
    answering 403 to a request without credentials was "does not answer (HTTP Error 403)"; start it". An HTTP answer
    is now an answer (the refusal of MLflow's own calls is MLflow's error, naming the status), and a server that does
    not answer is named without the password."""
    with_password = mlflow_server.replace("http://", "http://ci:s3cret@")
    check_reachable(with_password)
    with refusing_proxy(mlflow_server, refuse_from="/") as proxy:
        check_reachable(proxy.url)
        assert proxy.refused == ["GET /health"]
    closed = f"http://ci:s3cret@127.0.0.1:{free_port()}"
    with pytest.raises(QbenchError, match="does not answer") as raised:
        check_reachable(closed)
    assert "s3cret" not in str(raised.value) and closed.replace("ci:s3cret@", "") in str(raised.value)
