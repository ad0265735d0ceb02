"""The MLflow store a run folder records its sweep logged to, and how a later command finds it (qbench.track.uri)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from auth_proxy import refusing_proxy
from mlflow.tracking import MlflowClient
from server_processes import free_port
from test_tracker import artifacts_for, small_sweep, write_recipe
from tiny_linear import make_linear_project

from qbench.errors import QbenchError
from qbench.gate.evaluate import evaluate_gate
from qbench.recipe.spec import load_recipe
from qbench.runs import TRACKING_FILE, record_tracking
from qbench.track.saved import log_sweep
from qbench.track.uri import check_reachable, run_store_uri


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
    answering 403 to a request without credentials was "does not answer (HTTP Error 403)"; start it". A client error
    status is now an answer (the refusal of MLflow's own calls is MLflow's error, naming the status), and a server that
    does not answer is named without the password."""
    with_password = mlflow_server.replace("http://", "http://ci:s3cret@")
    check_reachable(with_password)
    with refusing_proxy(mlflow_server, refuse_from="/") as proxy:
        check_reachable(proxy.url)
        assert proxy.refused == ["GET /health"]
    with refusing_proxy(mlflow_server, refuse_from="/", status=502) as proxy:  # its server down: no answer
        with pytest.raises(QbenchError, match="answers HTTP 502"):
            check_reachable(proxy.url)
    closed = f"http://ci:s3cret@127.0.0.1:{free_port()}"
    with pytest.raises(QbenchError, match="does not answer") as raised:
        check_reachable(closed)
    assert "s3cret" not in str(raised.value) and closed.replace("ci:s3cret@", "") in str(raised.value)


def test_results_logged_to_a_server_whose_uri_holds_a_password_print_it_nowhere(
    mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """MLflow prints "View run <name> at: <tracking uri>/#/..." as each run ends: with `user:password@` in the URI,
    a line per variant spelled the password into the CI log. Those lines are left out for such a store only."""
    monkeypatch.chdir(tmp_path)
    uri = mlflow_server.replace("http://", "http://ci:s3cret@")
    recipe = write_recipe(tmp_path, {"uri": uri, "experiment": "password-in-uri"})
    results = small_sweep()
    parent_id = log_sweep(results, recipe, gate=evaluate_gate(results, recipe.gate), artifacts=artifacts_for(tmp_path))
    printed = capsys.readouterr()
    assert MlflowClient(mlflow_server).get_run(parent_id).info.status == "FINISHED"
    assert "s3cret" not in printed.out + printed.err
    write_recipe(tmp_path, {"uri": mlflow_server, "experiment": "password-in-uri"})
    log_sweep(results, load_recipe(tmp_path / "recipe.yaml"), gate=None, artifacts=[])
    assert f"View run digits sweep {results.created_at} at: {mlflow_server}" in capsys.readouterr().out
