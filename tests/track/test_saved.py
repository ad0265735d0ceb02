"""`qbench track RECIPE RUN_DIR`: a sweep run with --no-track is logged afterwards as a tracked sweep logs it (the
store read back with MlflowClient matches results.json), once, and its winner can then be registered."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from tiny_linear import make_linear_project

from qbench.cli.app import main
from qbench.runs import TRACKING_FILE, mark_incomplete


def test_an_untracked_sweep_is_logged_afterwards_once_and_registers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    recipe = make_linear_project(tmp_path, uri)
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(recipe), "--no-track"]) == 0
    [results_path] = (tmp_path / "reports").glob("linear/*/results.json")
    run_dir = results_path.parent
    assert main(["gate", str(recipe), "--register", "linear-model"]) == 2  # not tracked: nothing to register from
    assert json.loads((run_dir / TRACKING_FILE).read_text()) == {"mlflow": False}  # `qbench gate` need not look
    assert main(["track", str(recipe), str(run_dir)]) == 0

    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name("linear").experiment_id
    [parent] = client.search_runs([experiment_id], f"tags.`qbench.run_dir` = '{run_dir}'")
    assert parent.info.status == "FINISHED" and parent.data.tags["qbench.gate"] == "pass"
    children = client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    saved = json.loads(results_path.read_text())
    logged = {(c.data.tags["qbench.variant"], c.data.tags["qbench.backend"]): c for c in children}
    assert sorted(logged) == sorted((v["variant"], v["backend"]) for v in saved["variants"])
    for variant in saved["variants"]:
        child = logged[variant["variant"], variant["backend"]]
        assert child.data.metrics["kl_mean"] == variant["accuracy"]["overall"]["metrics"]["kl_mean"]
        assert child.data.metrics["lat/p50_ms/b4"] == variant["latency"]["points"][1]["p50_ms"]
        assert child.outputs.model_outputs, variant["variant"]
    assert {"linear.yaml", "results.json", "report.md", "frontier.svg"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id)}  # fmt: skip

    capsys.readouterr()
    assert main(["track", str(recipe), str(run_dir)]) == 0  # a retried CI job: the run it logged, nothing twice
    assert f"{run_dir} is in MLflow already, nothing logged; MLflow run: {parent.info.run_id} " in capsys.readouterr().err
    assert [r.info.run_id for r in client.search_runs([experiment_id], f"tags.`qbench.run_dir` = '{run_dir}'")] == [
        parent.info.run_id]  # fmt: skip
    assert main(["gate", str(recipe), "--register", "linear-model"]) == 0
    # logged after the fact, the folder is looked for again: its runs carry this verdict
    assert f"MLflow: gate verdict tagged on sweep run {parent.info.run_id}" in capsys.readouterr().err
    version = client.get_model_version_by_alias("linear-model", "candidate")
    assert version.run_id in {c.info.run_id for c in children}

    mark_incomplete(run_dir, "interrupted by SIGINT")
    assert main(["track", str(recipe), str(run_dir)]) == 2
    assert "is an incomplete run (interrupted by SIGINT)" in capsys.readouterr().err


def test_a_model_file_replaced_after_the_sweep_is_neither_passed_nor_logged_as_the_model_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run folder's copy of a variant's model is what ships (export, track, registry): one that is no longer
    the model measured makes the results unusable, and `qbench track` does not log it as that variant's model."""
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    recipe = make_linear_project(tmp_path, uri)
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(recipe), "--no-track"]) == 0
    [results_path] = (tmp_path / "reports").glob("linear/*/results.json")
    saved = json.loads(results_path.read_text())
    [replaced] = {v["model_path"] for v in saved["variants"] if v["variant"] == "int8-minmax"}
    Path(replaced).write_bytes((tmp_path / "linear.onnx").read_bytes())  # FP32's graph where INT8's was measured

    capsys.readouterr()
    assert main(["gate", "--results", str(results_path)]) == 2
    assert f"the model file {replaced} is not the model measured" in capsys.readouterr().out
    assert main(["track", str(recipe), str(results_path.parent)]) == 0

    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name("linear").experiment_id
    children = client.search_runs([experiment_id], "tags.`qbench.variant` = 'int8-minmax'")
    assert children and all(not child.outputs.model_outputs for child in children)
    assert main(["gate", str(recipe), "--register", "linear-model"]) == 2
    assert not client.search_registered_models()


def test_gate_and_registry_find_a_default_store_from_another_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tracking.uri` unset: a sweep logs to the mlflow.db of its working directory. `qbench gate` run from another
    one (a later CI step) looked there, tagged nothing without a word, and `--register` exited 2 ('the sweep was not
    tracked') after creating an empty mlflow.db where it ran. The run folder records its sweep's store."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    recipe = make_linear_project(tmp_path, None)  # type: ignore[arg-type]
    monkeypatch.chdir(work)
    assert main(["sweep", str(recipe)]) == 0
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["gate", str(recipe), "--register", "linear-model"]) == 0
    client = MlflowClient(f"sqlite:///{(work / 'mlflow.db').as_posix()}")
    [parent] = client.search_runs([client.get_experiment_by_name("linear").experiment_id],
                                  "tags.`qbench.run_dir` LIKE '%'")  # fmt: skip
    assert f"MLflow: gate verdict tagged on sweep run {parent.info.run_id}" in capsys.readouterr().err
    version = client.get_model_version_by_alias("linear-model", "candidate")  # a variant's run of that sweep
    assert client.get_run(version.run_id).data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert not list(elsewhere.iterdir())  # no store made where the gate ran


def test_a_tracked_run_folder_gated_at_another_path_is_tagged_and_registers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CI job sweeps into a shared store and uploads reports/; a later job downloads it into a checkout at another
    path and runs `qbench gate --register`. The store's runs are tagged with the run folder's path on the sweeping
    machine, so none was found: the verdict tagged nothing and `--register` exited 2 ('the sweep was not tracked')."""
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"  # a shared store: both jobs reach it
    swept_in, gated_in = tmp_path / "job-1", tmp_path / "job-2"
    swept_in.mkdir()
    recipe = make_linear_project(swept_in, uri)
    raw = yaml.safe_load(recipe.read_text())
    raw["output_dir"] = "reports"
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["sweep", str(recipe)]) == 0
    shutil.move(swept_in, gated_in)
    capsys.readouterr()

    assert main(["gate", str(gated_in / "linear.yaml"), "--register", "linear-model"]) == 0
    client = MlflowClient(uri)
    [parent] = client.search_runs([client.get_experiment_by_name("linear").experiment_id],
                                  "tags.`qbench.run_dir` LIKE '%'")  # fmt: skip
    assert f"MLflow: gate verdict tagged on sweep run {parent.info.run_id}" in capsys.readouterr().err
    version = client.get_model_version_by_alias("linear-model", "candidate")  # a variant's run of that sweep
    assert client.get_run(version.run_id).data.tags["mlflow.parentRunId"] == parent.info.run_id
