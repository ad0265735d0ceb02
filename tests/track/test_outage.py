"""Tracking stores that fail a sweep, on real `mlflow server`s. One that dies while a sweep runs (stopped after the
first variant is logged): the sweep still measures every variant, writes complete results, does not sit in MLflow's
back-off, and exits 2 saying that MLflow lacks the results. One whose artifact store this machine cannot write: an
error before anything is measured. An auth proxy that starts refusing while saved results are logged: one failure."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import pytest
import yaml
from auth_proxy import refusing_proxy
from mlflow.entities import LoggedModelStatus
from mlflow.tracking import MlflowClient
from server_processes import start_mlflow_server, stop_process_group
from test_tracker import artifacts_for, small_sweep, write_recipe
from tracking_hooks import in_tracking_process

from qbench.cli.app import main
from qbench.errors import QbenchError
from qbench.gate.evaluate import evaluate_gate
from qbench.results.schema import read_results
from qbench.sweep.runner import _Progress
from qbench.track.saved import log_sweep
from qbench.track.store import BOUNDED_RETRIES
from tests.explain.test_sensitivity import INT8, write_fragile_project

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="stops the server's process group via /proc")  # fmt: skip


def test_a_tracking_server_dying_mid_sweep_costs_mlflow_not_the_measurements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "server").mkdir()
    url, server = start_mlflow_server(tmp_path / "server")
    try:
        recipe = write_fragile_project(tmp_path / "project", [INT8, {"name": "fp16", "precision": "fp16"}], fragile=())
        raw = yaml.safe_load(recipe.read_text())
        raw["tracking"] = {"uri": url}
        # INT8 loses a few of the 200 rows, a pass their upper bound does not resolve: noted, so that it registers
        raw["gate"] = {**raw["gate"], "unresolved": "note"}
        recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
        monkeypatch.chdir(tmp_path / "project")
        for name in BOUNDED_RETRIES:
            monkeypatch.delenv(name, raising=False)

        died_at: list[float] = []
        finished = _Progress.finished

        def logged_then_the_server_dies(self: _Progress, *args: object, **kwargs: bool) -> None:
            finished(self, *args, **kwargs)
            if not died_at:
                assert self.tracker is not None
                self.tracker.settle()  # the tracking process has logged the variant
                assert not stop_process_group(server), "the mlflow server survived its stop"
                died_at.append(time.monotonic())

        monkeypatch.setattr(_Progress, "finished", logged_then_the_server_dies)
        code = main(["sweep", str(recipe), "--gate"])
        after_death = time.monotonic() - died_at[0]
    finally:
        stop_process_group(server)

    err = capsys.readouterr().err
    assert code == 2
    assert f"MLflow tracking at {url} failed" in err and "the results are complete in" in err
    [results_path] = (tmp_path / "project" / "reports").glob("fragile/*/results.json")
    results = read_results(results_path)
    assert results.complete and sorted(v.variant for v in results.variants) == ["fp16", "fp32", "int8"]
    assert all(v.status == "ok" for v in results.variants)
    assert (results_path.parent / "report.md").is_file()
    assert after_death < 60, after_death  # MLflow's default back-off spends minutes on each call
    assert not set(BOUNDED_RETRIES) & set(os.environ)  # the bound ends with the sweep's runs
    run_dir = results_path.parent
    assert f"qbench track {recipe} {run_dir}" in err
    assert not [r.getMessage() for r in caplog.records if r.name == "urllib3.connectionpool"]  # qbench's line says it

    # nothing is lost: with the server back (same store), the saved run goes to MLflow and its winner registers
    url, server = start_mlflow_server(tmp_path / "server")
    try:
        raw["tracking"] = {"uri": url}
        recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
        capsys.readouterr()
        assert main(["track", str(recipe), str(run_dir)]) == 0
        assert capsys.readouterr().out == ""  # MLflow's "View run <url>" per run ended goes to stderr, as the sweep's
        client = MlflowClient(url)
        experiment_id = client.get_experiment_by_name("fragile").experiment_id
        [parent] = client.search_runs([experiment_id], f"tags.`qbench.run_dir` = '{run_dir}' and "
                                      "attributes.status = 'FINISHED'")  # fmt: skip
        children = client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
        by_key = {f"{c.data.tags['qbench.variant']}@{c.data.tags['qbench.backend']}": c for c in children}
        assert sorted(by_key) == sorted(v.key for v in results.variants)
        for variant in results.variants:
            child = by_key[variant.key]
            assert child.info.status == "FINISHED" and child.outputs.model_outputs
            assert child.data.metrics["agreement"] == variant.accuracy.overall.metrics["agreement"]
        assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"recipe.yaml", "results.json",
                                                                               "report.md"}
        assert parent.info.run_name == f"fragile sweep {run_dir.name}"  # as the sweep named its run
        # `qbench track`'s, not the sweep's
        assert not [key for key in parent.data.metrics if key.startswith("system/")]
        # the runs the sweep opened before the server died are ended FAILED, each pointing at the run holding the
        # results: the one it had logged completely (FINISHED, its model READY) too, else the UI shows it twice
        [left] = [r for r in client.search_runs([experiment_id], f"tags.`qbench.run_dir` = '{run_dir}'")
                  if r.info.run_id != parent.info.run_id]  # fmt: skip
        left_children = client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{left.info.run_id}'")
        left_models = [m for run in left_children for m in client.search_logged_models(
            [experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'")]  # fmt: skip
        assert left_children and left_models  # the first variant was logged, its model with it
        for run in (left, *left_children):
            assert run.info.status == "FAILED", (run.info.run_name, run.info.status)
            assert parent.info.run_id in run.data.tags["qbench.gate"], run.data.tags["qbench.gate"]
        for model in left_models:
            assert model.status == LoggedModelStatus.FAILED, (model.name, model.status)
            assert parent.info.run_id in model.tags["qbench.gate"], model.tags
        assert {m.status for m in client.search_logged_models([experiment_id])
                if m.source_run_id in {c.info.run_id for c in children}} == {LoggedModelStatus.READY}  # fmt: skip
        assert main(["track", str(recipe), str(run_dir)]) == 0  # logged once: the second call logs nothing
        assert main(["gate", str(recipe), "--register", "fragile-model"]) == 0
        assert client.get_model_version_by_alias("fragile-model", "candidate").run_id in {
            c.info.run_id for c in children}  # fmt: skip
    finally:
        stop_process_group(server)
    assert "is in MLflow already" in capsys.readouterr().err


def test_an_artifact_store_the_client_cannot_write_is_an_error_before_anything_is_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server that does not proxy artifacts hands out its own artifact root, which the client writes itself: here a
    folder below a file (on a CI runner: the server's disk, an s3:// bucket without boto3). Before, every variant's
    model failed with a warning and the sweep exited 2 only after measuring everything."""
    (tmp_path / "server").mkdir()
    (tmp_path / "not-a-folder").write_text("a file")
    unwritable = tmp_path / "not-a-folder" / "artifacts"
    url, server = start_mlflow_server(tmp_path / "server", ["--no-serve-artifacts", "--default-artifact-root",
                                                             str(unwritable)])  # fmt: skip
    try:
        recipe = write_fragile_project(tmp_path / "project", [INT8], fragile=())
        raw = yaml.safe_load(recipe.read_text())
        raw["tracking"] = {"uri": url}
        recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
        monkeypatch.chdir(tmp_path / "project")
        measured: list[object] = []
        monkeypatch.setattr(_Progress, "started", lambda self, *args: measured.append(args))
        code = main(["sweep", str(recipe)])
        [parent] = MlflowClient(url).search_runs([MlflowClient(url).get_experiment_by_name("fragile").experiment_id])
    finally:
        stop_process_group(server)

    err = capsys.readouterr().err
    assert code == 2 and not measured
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert f"MLflow at {url} stores this sweep's artifacts in {unwritable}" in line and "--serve-artifacts" in line
    assert parent.info.status == "FAILED" and parent.data.tags["qbench.gate"].startswith("not evaluated")


def test_a_sqlite_store_filling_up_mid_sweep_ends_every_run_and_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real sqlite store that fills up once the first variant is logged (`PRAGMA max_page_count`: no page more, as
    on a full disk; updates in place still succeed). The variant whose logging failed was dropped from the runs to end
    before it was ended, so it stayed RUNNING for ever; and MLflow printed a traceback per failed database call
    beside qbench's line. Now every run is ended (the parent and that child FAILED), stderr has no traceback, the
    results and reports are complete and the exit code is 2 (docs/mlflow.md: MLflow lacks them). The store is written
    by the sweep's tracking process: a sitecustomize module there caps each connection's pages once the test says so."""
    from user_model import make_user_project

    recipe = make_user_project(tmp_path)
    raw = yaml.safe_load(recipe.read_text())
    raw["variants"] = [{"name": "fp16", "precision": "fp16"},
                       {"name": "int8", "precision": "int8", "calibrator": "minmax"}]
    raw["latency"] = {"batch_sizes": [1], "warmup": 1, "iterations": 3, "threads": 1, "stability": None}
    raw["gate"] = {"metric": "agreement", "max_drop": 1.0, "max_slice_drop": 1.0, "applies_to": ["*"]}
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    full = tmp_path / "full"
    in_tracking_process(tmp_path / "hook", monkeypatch, f"""
        import pathlib, sqlalchemy.event
        from sqlalchemy.pool import Pool
        def no_page_more(connection, *args):
            if pathlib.Path({str(full)!r}).exists():
                connection.execute("PRAGMA max_page_count = 1")  # = its size now
        sqlalchemy.event.listen(Pool, "checkout", no_page_more)
    """)  # fmt: skip
    finished = _Progress.finished

    def logged_then_full(self: _Progress, *args: object, **kwargs: bool) -> None:
        finished(self, *args, **kwargs)
        assert self.tracker is not None
        self.tracker.settle()  # the tracking process has logged the variant
        full.touch()

    monkeypatch.setattr(_Progress, "finished", logged_then_full)
    code = main(["sweep", str(recipe)])

    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "SQLAlchemy database error" not in err
    (run_dir,) = (tmp_path / "reports" / "tumour-mlp").iterdir()
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert line == (f"error: MLflow tracking at sqlite:///{tmp_path / 'mlflow.db'} failed: database or disk is full; "
                    f"the results are complete in {run_dir}, not in MLflow (log them there with `qbench track {recipe} "
                    f"{run_dir}`)")  # fmt: skip
    results = read_results(run_dir / "results.json")
    assert results.complete and [(v.variant, v.status) for v in results.variants] == [
        ("fp32", "ok"), ("fp16", "ok"), ("int8", "ok")]  # fmt: skip
    assert {"report.md", "report.html", "frontier.svg"} <= {p.name for p in run_dir.iterdir()}
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("tumour-mlp").experiment_id])
    assert {r.info.run_name: r.info.status for r in runs} == {
        f"tumour-mlp sweep {run_dir.name}": "FAILED", "fp32 · ort-cpu": "FINISHED", "fp16 · ort-cpu": "FAILED"}
    assert all(r.info.end_time is not None for r in runs)
    assert main(["gate", str(recipe)]) == 0  # the complete results on disk are judged



def test_an_auth_proxy_refusing_the_logging_of_saved_results_is_reported_once_and_stops_the_logging(
    mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`qbench track` (log_sweep) logs each variant inside the sweep run's closing step. A proxy in front of a real
    server starts answering 403 at the first variant's metrics: before, the variant's failure was reported and its
    runs ended, then the closing step went on, failed again on the sweep's own metrics, reported a second failure
    and ended the runs a second time (4 requests refused: against a server that hangs instead, each one is a bounded
    retry's wait). Now the first failure stops the logging: one warning, one attempt to end the runs. The URI's
    password (MLflow's client sends it as basic auth) is in neither: before, both lines printed it."""
    monkeypatch.chdir(tmp_path)
    with refusing_proxy(mlflow_server, refuse_from="/runs/log-batch") as proxy:
        uri = proxy.url.replace("http://", "http://ci:s3cret@")
        recipe = write_recipe(tmp_path, {"uri": uri, "experiment": "refused-mid-logging"})
        results = small_sweep()
        with caplog.at_level(logging.WARNING, logger="qbench.track.tracker"), pytest.raises(QbenchError, match="403") as raised:
            log_sweep(results, recipe, gate=evaluate_gate(results, recipe.gate), artifacts=artifacts_for(tmp_path))
    warnings = [r.getMessage() for r in caplog.records if "the sweep goes on without MLflow" in r.getMessage()]
    assert len(warnings) == 1 and str(raised.value) in warnings[0], warnings
    assert "s3cret" not in warnings[0] and f"MLflow tracking at {proxy.url} failed" in warnings[0]
    assert proxy.refused[0].startswith("POST /api/2.0/mlflow/runs/log-batch")
    assert len(proxy.refused) == 2, proxy.refused  # the refused metrics, then the first call that would end the runs
