"""MLflow tracking: a sweep logged to a sqlite store and to a real `mlflow server`, read back with MlflowClient."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from mlflow.tracking import MlflowClient
from sweep_factory import default_variants, make_sweep

from qbench.errors import QbenchError
from qbench.gate.evaluate import GateReport, evaluate_gate
from qbench.recipe.spec import Recipe, load_recipe
from qbench.results.schema import ClipRecord, LimitCheck, RangeAnalysis, SweepResults, TensorPeak, VariantResult
from qbench.runs import INCOMPLETE_MARKER
from qbench.track.content import sanitise_name, unique_names
from qbench.track.saved import log_sweep
from qbench.track.store import artifact_root, resolve_tracking_uri, ui_command
from qbench.track.tracker import SweepTracker, _batches

CPU = "onnxruntime-cpu"


def write_recipe(folder: Path, tracking: dict[str, Any] | None = None) -> Recipe:
    (folder / "model.onnx").write_bytes(b"model")
    (folder / "rows.parquet").write_bytes(b"rows")
    body: dict[str, Any] = {
        "name": "digits",
        "model": {"path": "model.onnx"},
        "data": {"path": "rows.parquet", "inputs": {"x": "input"}, "label": "y"},
        "gate": {"metric": "accuracy", "max_drop": 0.01, "max_slice_drop": 0.02},
    }
    if tracking:
        body["tracking"] = tracking
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(body))
    return load_recipe(path)


def small_sweep() -> SweepResults:
    """FP32, INT8 (with a NaN metric) and a failed INT8 dynamic: 2 slices, 2 batch sizes."""
    fp32, _, int8, _, failed = default_variants()
    overall = dataclasses.replace(int8.accuracy.overall, metrics={**int8.accuracy.overall.metrics, "kl_mean": math.nan})
    int8 = dataclasses.replace(int8, accuracy=dataclasses.replace(int8.accuracy, overall=overall))
    b1, b32 = int8.latency.points
    points = (dataclasses.replace(b1, spread=0.01, iqr_ratio=0.03, stable=True),
              dataclasses.replace(b32, spread=0.2, iqr_ratio=0.1, stable=False))  # fmt: skip
    int8 = dataclasses.replace(int8, latency=dataclasses.replace(int8.latency, points=points))
    return dataclasses.replace(make_sweep([fp32, int8, failed]), ranges=RANGES)


# int8_minmax clips 2 of 8 values on the dark slice; one tensor there overflows FP16
RANGES = RangeAnalysis(
    rows=400, seconds=0.5, nodes={"x": "<graph input>", "conv": "Conv_0"},
    abs_max={"overall": {"x": 1.0, "conv": 7e4}, "clean": {"x": 1.0, "conv": 10.0},
             "noisy lighting=dark": {"x": 1.0, "conv": 7e4}},
    limits=(LimitCheck("fp16", 65504.0, None, {"overall": (TensorPeak("conv", "Conv_0", 7e4, 65504.0),), "clean": (),
                                              "noisy lighting=dark": (TensorPeak("conv", "Conv_0", 7e4, 65504.0),)}),),
    clipping=(ClipRecord("int8_minmax", "noisy lighting=dark", 2, 8, 0.25, "conv", "Conv_0", 0.25),),
)  # fmt: skip


def artifacts_for(folder: Path) -> list[Path]:
    paths = [folder / "results.json", folder / "report.md", folder / "frontier.svg"]
    for path in paths:
        path.write_text(path.name)
    return paths


@dataclasses.dataclass
class Logged:
    client: MlflowClient
    parent_id: str
    results: SweepResults
    gate: GateReport
    folder: Path


@pytest.fixture(scope="module")
def logged_to_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Logged]:
    """One sweep logged to the default store (sqlite in the working directory) of a fresh temp folder."""
    folder = tmp_path_factory.mktemp("sqlite_store")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        recipe = write_recipe(folder)
        results = small_sweep()
        gate = evaluate_gate(results, recipe.gate)
        parent_id = log_sweep(results, recipe, gate=gate, artifacts=artifacts_for(folder))
        client = MlflowClient(tracking_uri=resolve_tracking_uri(recipe))
        yield Logged(client, parent_id, results, gate, folder)


def children(logged: Logged) -> dict[str, Any]:
    parent = logged.client.get_run(logged.parent_id)
    runs = logged.client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{logged.parent_id}'")
    return {f"{run.data.tags['qbench.variant']}@{run.data.tags['qbench.backend']}": run for run in runs}


def test_default_store_is_sqlite_in_the_working_directory(logged_to_sqlite: Logged) -> None:
    folder = logged_to_sqlite.folder
    assert (folder / "mlflow.db").is_file()
    assert not (folder / "mlruns").exists()
    parent = logged_to_sqlite.client.get_run(logged_to_sqlite.parent_id)
    assert parent.info.artifact_uri.startswith((folder / "mlartifacts" / "digits").as_uri())
    experiment = logged_to_sqlite.client.get_experiment(parent.info.experiment_id)
    assert experiment.name == "digits"


def test_parent_run_has_params_tags_and_artifacts(logged_to_sqlite: Logged) -> None:
    client, results, gate = logged_to_sqlite.client, logged_to_sqlite.results, logged_to_sqlite.gate
    parent = client.get_run(logged_to_sqlite.parent_id)
    # as the sweep of that folder names it
    assert parent.info.run_name == f"digits sweep {logged_to_sqlite.folder.name}"
    assert not [key for key in parent.data.metrics if key.startswith("system/")]  # the logging's, not the sweep's
    assert parent.info.status == "FINISHED"
    params = parent.data.params
    assert params["recipe.sha256"] == results.recipe["sha256"]
    assert params["gate.max_slice_drop"] == "0.02"
    assert params["calibration.seed"] == str(results.calibration.seed)
    assert params["evaluation.rows"] == str(results.evaluation_rows)
    assert parent.data.tags["qbench.gate"] == {0: "pass", 1: "breach", 2: "unusable"}[gate.exit_code]
    assert parent.data.tags["qbench.version"] == results.qbench_version
    logged = {a.path for a in client.list_artifacts(logged_to_sqlite.parent_id)}
    assert logged == {"recipe.yaml", "results.json", "report.md", "frontier.svg", "ranges.json"}
    assert (logged_to_sqlite.folder / "mlartifacts").is_dir()


def test_parent_run_has_range_metrics_and_json(logged_to_sqlite: Logged) -> None:
    client, parent_id = logged_to_sqlite.client, logged_to_sqlite.parent_id
    metrics = client.get_run(parent_id).data.metrics
    assert metrics["range/noisy lighting_dark/fp16_overflow_tensors"] == 1.0
    assert metrics["range/clean/fp16_overflow_tensors"] == 0.0
    assert metrics["range/int8_minmax/noisy lighting_dark/clipped_share"] == 0.25
    local = Path(client.download_artifacts(parent_id, "ranges.json", str(logged_to_sqlite.folder)))
    assert json.loads(local.read_text())["clipping"][0]["worst_node"] == "Conv_0"


def test_one_nested_child_per_variant_and_backend(logged_to_sqlite: Logged) -> None:
    runs = children(logged_to_sqlite)
    assert set(runs) == {v.key for v in logged_to_sqlite.results.variants}
    for variant in logged_to_sqlite.results.variants:
        run = runs[variant.key]
        assert run.info.run_name == f"{variant.variant} · ort-cpu"
        assert run.data.tags["mlflow.parentRunId"] == logged_to_sqlite.parent_id
        assert run.data.tags["qbench.status"] == variant.status
        assert run.data.tags["qbench.gate"] == logged_to_sqlite.gate.status_of(variant.variant, variant.backend)
        assert run.data.params["precision"] == variant.precision
        assert run.info.status == ("FINISHED" if variant.status == "ok" else "FAILED")


def _expected_metrics(variant: VariantResult) -> dict[str, float]:
    expected = {"model_mb": variant.model_bytes / 1e6, "build_seconds": variant.build_seconds,
                "lat/cold_start_ms": variant.latency.session_create_ms + variant.latency.first_run_ms}  # fmt: skip
    for p in variant.latency.points:
        expected |= {f"lat/p50_ms/b{p.batch_size}": p.p50_ms, f"lat/p99_ms/b{p.batch_size}": p.p99_ms,
                     f"throughput/b{p.batch_size}": p.items_per_s}  # fmt: skip
    expected |= {"accuracy": variant.accuracy.overall.metrics["accuracy"],
                 "drop_accuracy": variant.accuracy.overall.drops["accuracy"]}  # fmt: skip
    for s in variant.accuracy.slices:
        segment = sanitise_name(s.name)
        expected |= {
            f"slice/{segment}/accuracy": s.metrics["accuracy"],
            f"slice/{segment}/drop_agreement": s.drops["agreement"],
            f"slice/{segment}/size": float(s.size),
        }
    return expected


def test_child_metrics_equal_the_results(logged_to_sqlite: Logged) -> None:
    runs = children(logged_to_sqlite)
    int8 = logged_to_sqlite.results.find("int8_minmax", CPU)
    metrics = runs[int8.key].data.metrics
    assert "slice/noisy lighting_dark/accuracy" in metrics  # '=' is not allowed in MLflow keys
    for key, value in _expected_metrics(int8).items():
        assert metrics[key] == pytest.approx(value), key
    params = runs[int8.key].data.params
    assert params["calibrator"] == "minmax" and params["exclude_nodes"] == '["a", "b"]'
    assert params["calibration.samples"] == str(logged_to_sqlite.results.calibration.size)


def test_latency_stability_metrics(logged_to_sqlite: Logged) -> None:
    runs = children(logged_to_sqlite)
    int8 = runs["int8_minmax@onnxruntime-cpu"].data.metrics
    assert (int8["lat/stable/b1"], int8["lat/stable/b32"]) == (1.0, 0.0)
    assert int8["lat/spread/b32"] == pytest.approx(0.2) and int8["lat/iqr_ratio/b1"] == pytest.approx(0.03)
    assert "lat/stable/b1" not in runs["fp32@onnxruntime-cpu"].data.metrics  # fixed-count timing: not judged
    params = logged_to_sqlite.client.get_run(logged_to_sqlite.parent_id).data.params
    assert "threshold=0.05" in params["latency.stability"] and "windows=3" in params["latency.stability"]


def test_nan_metrics_are_skipped_and_named_in_a_tag(logged_to_sqlite: Logged) -> None:
    run = children(logged_to_sqlite)["int8_minmax@onnxruntime-cpu"]
    assert "kl_mean" not in run.data.metrics
    assert "kl_mean" in run.data.tags["qbench.missing_metrics"].split(", ")


def test_failed_variant_is_tagged_with_its_error(logged_to_sqlite: Logged) -> None:
    failed = logged_to_sqlite.results.find("int8_dynamic", CPU)
    run = children(logged_to_sqlite)[failed.key]
    assert run.data.tags["qbench.error"] == failed.error
    assert "calibration.seed" not in run.data.params  # dynamic quantization is not calibrated
    assert not any(key.startswith("lat/") for key in run.data.metrics)


def test_second_sweep_reuses_the_experiment(logged_to_sqlite: Logged, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(logged_to_sqlite.folder)
    recipe = load_recipe(logged_to_sqlite.folder / "recipe.yaml")
    parent_id = log_sweep(make_sweep(default_variants()[:1]), recipe, gate=None, artifacts=[])
    first = logged_to_sqlite.client.get_run(logged_to_sqlite.parent_id)
    second = logged_to_sqlite.client.get_run(parent_id)
    assert second.info.experiment_id == first.info.experiment_id
    assert second.data.tags["qbench.gate"] == "not evaluated"


def test_missing_artifact_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    recipe = write_recipe(tmp_path)
    with pytest.raises(QbenchError, match="no-such.png"):
        log_sweep(small_sweep(), recipe, gate=None, artifacts=[tmp_path / "no-such.png"])
    assert not (tmp_path / "mlflow.db").exists()  # nothing logged before the check


@pytest.mark.parametrize(
    ("name", "expected"),
    [("slice/dark lighting=low", "slice/dark lighting_low"), ("a//b", "a/_/b"), ("../x", "_/x"), ("..a", "_..a"),
     ("ok_name-1.0: x", "ok_name-1.0: x"), ("é/ü", "é/ü"), ("a/./b", "a/_/b")],
)  # fmt: skip
def test_sanitise_name_gives_keys_mlflow_accepts(name: str, expected: str) -> None:
    from mlflow.utils.validation import _validate_metric_name

    assert sanitise_name(name) == expected
    _validate_metric_name(sanitise_name(name))  # raises MlflowException if MLflow would reject it


def test_unique_names_keep_colliding_names_apart_whatever_their_order() -> None:
    """The key of a name depends on the name, not on which colliding name came first: with suffixes by order,
    next week's data without one value would give another slice's figures the same MLflow key."""
    names = ["a=b", "a_b", "a?b"]
    keys = unique_names(names)
    assert keys["a_b"] == "a_b" and len(set(keys.values())) == 3
    assert all(keys[n].startswith("a_b_") and len(keys[n]) == len("a_b_") + 6 for n in ("a=b", "a?b"))
    assert unique_names(reversed(names)) == keys
    assert unique_names(["a=b", "a?b"])["a?b"] == keys["a?b"]
    assert unique_names(["a=b", "c"]) == {"a=b": "a_b", "c": "c"}


def test_batches_pack_metrics_params_and_tags_within_mlflow_limits() -> None:
    """1,500 metrics, 150 params and 30 tags: three requests (each at most 1,000 entities, 1,000 metrics and 100 params
    or tags), every entry once and in order."""
    from mlflow.entities import Metric, Param, RunTag

    metrics = [Metric(f"m{i}", float(i), 0, 0) for i in range(1500)]
    params = [Param(f"p{i}", str(i)) for i in range(150)]
    tags = [RunTag(f"t{i}", str(i)) for i in range(30)]
    requests = list(_batches(metrics, params, tags))
    assert [(len(r["metrics"]), len(r["params"]), len(r["tags"])) for r in requests] == [(1000, 0, 0), (500, 100, 30),
                                                                                        (0, 50, 0)]  # fmt: skip
    assert [m for r in requests for m in r["metrics"]] == metrics
    assert [p for r in requests for p in r["params"]] == params and [t for r in requests for t in r["tags"]] == tags
    assert [len(r["metrics"]) for r in _batches(metrics[:100], params[:10], tags[:5])] == [100]


def test_tracking_uri_and_ui_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    default = resolve_tracking_uri(write_recipe(tmp_path))
    assert default == f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    command = ui_command(default, port=5123)
    assert command[:4] == [sys.executable, "-m", "mlflow", "ui"]
    assert command[command.index("--default-artifact-root") + 1] == (tmp_path / "mlartifacts").as_uri()
    assert command[-4:] == ["--host", "127.0.0.1", "--port", "5123"]
    relative = ui_command("sqlite:///sub/x.db")
    assert relative[relative.index("--backend-store-uri") + 1] == f"sqlite:///{(tmp_path / 'sub' / 'x.db').as_posix()}"
    assert artifact_root("http://127.0.0.1:5000") is None
    with pytest.raises(QbenchError, match="browser"):
        ui_command("http://127.0.0.1:5000")
    custom = write_recipe(tmp_path, {"uri": "sqlite:///elsewhere.db", "experiment": "exp"})
    assert resolve_tracking_uri(custom) == f"sqlite:///{(tmp_path / 'elsewhere.db').as_posix()}"  # recipe-relative


def test_log_sweep_to_a_real_mlflow_server(mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    recipe = write_recipe(tmp_path, {"uri": mlflow_server, "experiment": "server-test"})
    results = small_sweep()
    gate = evaluate_gate(results, recipe.gate)
    parent_id = log_sweep(results, recipe, gate=gate, artifacts=artifacts_for(tmp_path))
    logged = Logged(MlflowClient(tracking_uri=mlflow_server), parent_id, results, gate, tmp_path)
    runs = children(logged)
    assert set(runs) == {v.key for v in results.variants}
    int8 = results.find("int8_minmax", CPU)
    for key, value in _expected_metrics(int8).items():
        assert runs[int8.key].data.metrics[key] == pytest.approx(value), key
    assert {a.path for a in logged.client.list_artifacts(parent_id)} == {
        "recipe.yaml", "results.json", "report.md", "frontier.svg", "ranges.json"
    }  # fmt: skip
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
    assert gate.exit_code == 2  # the failed variant cannot be judged: fail closed
    assert logged.client.get_run(parent_id).data.tags["qbench.gate"] == "unusable"


def test_fidelity_and_session_options_reach_the_child_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sweep_factory import make_variant

    from qbench.results.schema import EMULATED, Fidelity

    monkeypatch.chdir(tmp_path)
    recipe = write_recipe(tmp_path)
    half = dataclasses.replace(make_variant("fp16", "fp16"), fidelity=Fidelity(EMULATED, EMULATED, "FP16 rounding"))
    basic = make_variant("fp8", "fp8", params={"runtime.graph_optimization_level": "basic"})
    results = make_sweep([make_variant("fp32", "fp32"), half, basic])
    log_sweep(results, recipe, gate=None, artifacts=[])
    client = MlflowClient(resolve_tracking_uri(recipe))
    runs = client.search_runs([client.get_experiment_by_name("digits").experiment_id])
    children = {r.data.params["variant"]: r.data for r in runs if "variant" in r.data.params}
    assert children["fp16"].params["fidelity.accuracy"] == EMULATED == children["fp16"].params["fidelity.latency"]
    assert children["fp16"].params["fidelity.method"] == "FP16 rounding" and children["fp16"].tags["qbench.fidelity"] == EMULATED
    assert children["fp32"].params["fidelity.accuracy"] == "native" and children["fp32"].tags["qbench.fidelity"] == "native"
    assert children["fp8"].tags["qbench.session_options"] == "graph_optimization_level=basic (not ORT's defaults)"
    assert "qbench.session_options" not in children["fp32"].tags


def test_headline_metrics_group_under_acc_lat_and_speedup(logged_to_sqlite: Logged) -> None:
    metrics = children(logged_to_sqlite)["int8_minmax@onnxruntime-cpu"].data.metrics
    # accuracy 0.94 vs FP32 0.95; slices: clean 0.97 vs 0.97, dark 0.86 vs 0.90 -> worst slice drop 0.04
    assert metrics["acc/overall"] == pytest.approx(0.94)
    assert metrics["acc/drop"] == pytest.approx(0.01)
    assert metrics["acc/worst_slice_drop"] == pytest.approx(0.04)
    assert metrics["speedup/b32"] == pytest.approx(20.0 / 12.0) and metrics["speedup/b1"] == pytest.approx(1.0 / 0.6)
    assert metrics["lat/p99_ms/b32"] == pytest.approx(12.0 * 1.5)
    assert not any(key.startswith("latency_") for key in metrics)  # one scheme: no old-style duplicates


def test_experiment_opens_in_the_model_training_view(logged_to_sqlite: Logged, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    client = logged_to_sqlite.client
    experiment = client.get_experiment(client.get_run(logged_to_sqlite.parent_id).info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    # an experiment made before qbench tagged it gets the tag; a kind the user chose is kept
    monkeypatch.chdir(tmp_path)
    recipe = write_recipe(tmp_path, {"uri": f"sqlite:///{tmp_path / 'own.db'}", "experiment": "mine"})
    own = MlflowClient(resolve_tracking_uri(recipe))
    untagged = own.create_experiment("mine", artifact_location=(tmp_path / "art").as_uri())
    log_sweep(make_sweep(default_variants()[:1]), recipe, gate=None, artifacts=[])
    assert own.get_experiment(untagged).tags["mlflow.experimentKind"] == "custom_model_development"
    own.set_experiment_tag(untagged, "mlflow.experimentKind", "genai_development")
    log_sweep(make_sweep(default_variants()[:1]), recipe, gate=None, artifacts=[])
    assert own.get_experiment(untagged).tags["mlflow.experimentKind"] == "genai_development"


@pytest.mark.parametrize(("variant", "expected"), [("int8-p99.9", "int8-p99_9"), ("a/b:c%d'e\"f", "a_b_c_d_e_f"),
                                                   ("fp16", "fp16")])  # fmt: skip
def test_logged_model_names_are_ones_mlflow_accepts(variant: str, expected: str) -> None:
    from mlflow.utils.validation import _validate_logged_model_name

    from qbench.track.models import logged_model_name

    assert logged_model_name(variant) == expected
    _validate_logged_model_name(logged_model_name(variant))  # raises MlflowException if MLflow would reject it


@dataclasses.dataclass
class TrackedSweep:
    client: MlflowClient
    results: SweepResults
    parent: Any
    runs: dict[str, Any]  # variant -> child run
    data: Path


@pytest.fixture(scope="module")
def tracked_sweep(tmp_path_factory: pytest.TempPathFactory) -> TrackedSweep:
    """The tiny linear project swept with tracking into sqlite, system metrics sampled every 0.2 s."""
    from tiny_linear import make_linear_project

    from qbench.sweep.runner import run_sweep

    root = tmp_path_factory.mktemp("tracked_sweep")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        patch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
        outcome = run_sweep(make_linear_project(root, uri))
    client = MlflowClient(uri)
    parent = client.get_run(outcome.mlflow_run_id)
    found = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    runs = {run.data.tags["qbench.variant"]: client.get_run(run.info.run_id) for run in found}
    return TrackedSweep(client, outcome.results, parent, runs, root / "rows.parquet")


def test_each_variant_is_a_logged_onnx_model_with_its_signature(tracked_sweep: TrackedSweep,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    import mlflow

    client = tracked_sweep.client
    assert {r.info.run_name for r in tracked_sweep.runs.values()} == {"fp32 · ort-cpu", "int8-minmax · ort-cpu",
                                                                      "fp16 · ort-cpu"}  # fmt: skip
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    for name, run in tracked_sweep.runs.items():
        (output,) = run.outputs.model_outputs
        model = client.get_logged_model(output.model_id)
        assert (model.name, model.source_run_id, model.status.to_int()) == (name, run.info.run_id, 2)  # READY
        variant = tracked_sweep.results.find(name, "onnxruntime-cpu")
        model_metrics = {m.key: m.value for m in model.metrics}
        assert model_metrics["acc/overall"] == pytest.approx(variant.accuracy.overall.metrics["accuracy"])
        assert "lat/p50_ms/b1" in model_metrics and not any(k.startswith("slice/") for k in model_metrics)
        info = mlflow.models.get_model_info(f"models:/{output.model_id}")
        assert info.flavors["onnx"]["providers"] == variant.params["runtime.providers"] == ["CPUExecutionProvider"]
        (inputs,), (outputs,) = info.signature.inputs.inputs, info.signature.outputs.inputs
        assert (inputs.name, inputs.type, tuple(inputs.shape)) == ("x", np.dtype("float32"), (-1, 4))
        assert (outputs.name, outputs.type, tuple(outputs.shape)) == ("logits", np.dtype("float32"), (-1, 3))


def test_runs_show_the_datasets_they_were_measured_on(tracked_sweep: TrackedSweep) -> None:
    from tiny_linear import CALIBRATION_ROWS, ROWS

    def inputs(run: Any) -> dict[str, tuple[Any, dict[str, str]]]:
        return {i.dataset.name: (i.dataset, {t.key: t.value for t in i.tags}) for i in run.inputs.dataset_inputs}

    parent = inputs(tracked_sweep.parent)
    evaluation, tags = parent["linear-evaluation"]
    assert tags["mlflow.data.context"] == "evaluation" and json.loads(evaluation.source)["uri"] == str(tracked_sweep.data)
    assert json.loads(evaluation.profile)["features_shape"]["x"] == [ROWS, 4]
    assert json.loads(evaluation.profile)["targets_shape"] == [ROWS]
    # slices: every third row is group a
    assert json.loads(parent["linear-evaluation[group=a]"][0].profile)["features_shape"]["x"] == [40, 4]
    assert json.loads(parent["linear-evaluation[group=b]"][0].profile)["features_shape"]["x"] == [80, 4]
    assert parent["linear-evaluation[group=b]"][1]["mlflow.data.context"] == "evaluation slice"
    calibration, tags = parent["linear-calibration"]
    assert tags["mlflow.data.context"] == "calibration"
    assert json.loads(calibration.profile)["features_shape"]["x"] == [CALIBRATION_ROWS, 4]
    assert set(inputs(tracked_sweep.runs["int8-minmax"])) == {"linear-evaluation", "linear-calibration"}
    assert set(inputs(tracked_sweep.runs["fp16"])) == {"linear-evaluation"}  # FP16 is not calibrated
    assert inputs(tracked_sweep.runs["fp16"])["linear-evaluation"][0].digest == evaluation.digest


def test_the_sweep_run_records_system_metrics(tracked_sweep: TrackedSweep) -> None:
    metrics = tracked_sweep.parent.data.metrics
    assert 0 <= metrics["system/cpu_utilization_percentage"] <= 100
    assert metrics["system/system_memory_usage_megabytes"] > 0
    history = tracked_sweep.client.get_metric_history(tracked_sweep.parent.info.run_id,
                                                      "system/cpu_utilization_percentage")
    assert len(history) >= 2  # sampled through the sweep, not once


def test_a_server_that_answers_health_but_fails_every_call_is_one_error_after_a_few_tries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow's default back-off would retry a failing call 7 times (about 4 minutes) before the sweep heard of it."""
    import http.server
    import threading

    from qbench.track.store import open_experiment
    from qbench.track.uri import check_reachable

    calls: list[str] = []

    class Broken(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
            calls.append(self.path)
            self.send_response(200 if self.path == "/health" else 500)
            self.end_headers()
            self.wfile.write(b"OK" if self.path == "/health" else b'{"error_code": "INTERNAL_ERROR"}')

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        check_reachable(uri)  # /health answers
        with pytest.raises(QbenchError, match=rf"MLflow tracking at {uri} failed"):
            open_experiment(write_recipe(tmp_path, {"uri": uri}))
    finally:
        server.shutdown()
        server.server_close()
    api_calls = [path for path in calls if path != "/health"]
    assert 1 <= len(api_calls) <= 3  # the first call and at most 2 retries
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in __import__("os").environ  # the bound ends with the call


def test_a_variants_run_is_written_and_ended_when_it_finishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child run is in the store, FINISHED with its figures, once variant_finished returns (the MLflow UI shows
    the sweep's progress)."""
    monkeypatch.chdir(tmp_path)
    recipe = write_recipe(tmp_path)
    results = small_sweep()
    fp32 = results.variants[0]
    tracker = SweepTracker.open(recipe, "local sweep")
    tracker.variant_started(fp32.variant, fp32.backend)
    tracker.variant_finished(results, fp32)
    client = MlflowClient(tracking_uri=resolve_tracking_uri(recipe))
    experiment = client.get_run(tracker.parent_id).info.experiment_id
    [child] = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{tracker.parent_id}'")
    assert child.info.status == "FINISHED" and child.data.metrics
    tracker.abort("KILLED", "test over")


def test_a_new_sweep_ends_the_runs_a_killed_sweep_left_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep killed outright (SIGKILL, out of memory) cannot end its runs; the next sweep of the experiment ends them
    KILLED, as its run folder's marker shows the sweep gone. A running sweep's runs and finished ones are left."""
    monkeypatch.chdir(tmp_path)
    recipe = write_recipe(tmp_path)
    client = MlflowClient(tracking_uri=resolve_tracking_uri(recipe))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()

    def sweep_run(folder: Path, pid: int) -> tuple[str, str]:
        folder.mkdir()
        (folder / INCOMPLETE_MARKER).write_text(json.dumps({"started_at": "2026-11-27T00:00:00+00:00",
                                                            "state": "running", "pid": pid,
                                                            "host": socket.gethostname()}))  # fmt: skip
        tracker = SweepTracker.open(recipe, folder.name, run_dir=folder)
        tracker.variant_started("fp32", CPU)
        tracker._release()  # left as a killed sweep leaves them: no close, no abort
        return tracker.parent_id, tracker._children[f"fp32@{CPU}"]

    killed = sweep_run(tmp_path / "killed", dead.pid)
    alive = sweep_run(tmp_path / "alive", os.getpid())
    newest = SweepTracker.open(recipe, "next sweep", run_dir=tmp_path / "next")
    for run_id in killed:
        run = client.get_run(run_id)
        assert run.info.status == "KILLED" and run.data.tags["qbench.gate"].startswith("not evaluated (sweep killed")
    assert all(client.get_run(run_id).info.status == "RUNNING" for run_id in alive)
    assert client.get_run(newest.parent_id).info.status == "RUNNING"
    newest.abort("KILLED", "test over")


def test_each_variant_run_carries_the_gate_notes_that_concern_it(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate's notes reached MLflow only inside report.md: a variant's run said pass and nothing of, e.g., an
    output it broke that the gate does not judge. Each run now has its verdict, its own notes and those about the
    results as a whole; a variant not gated only what names it; the sweep's run every note, cut to MLflow's limit."""
    from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

    monkeypatch.chdir(tmp_path)
    recipe = write_recipe(tmp_path)
    results = small_sweep()
    gate = evaluate_gate(results, recipe.gate)
    fp32, int8, failed = (v.key for v in results.variants)
    own = f"{int8}: output aux's accuracy dropped 0.2000 > 0.01 on slice clean (FP32 0.9 → 0.7)"
    whole = "tolerances on onnxruntime-cpu: max_drop 0.01 = 1 % of FP32's mae 1"
    of_reference = f"{fp32} gives NaN/inf on 3 of 400 evaluation rows"
    long = f"{failed}: " + "x" * MAX_TAG_VAL_LENGTH
    gate = dataclasses.replace(gate, notes=(own, whole, of_reference, long))
    parent_id = log_sweep(results, recipe, gate=gate, artifacts=artifacts_for(tmp_path))
    client = MlflowClient(tracking_uri=resolve_tracking_uri(recipe))
    runs = children(Logged(client, parent_id, results, gate, tmp_path))
    assert runs[int8].data.tags["qbench.gate"] == gate.status_of(*int8.split("@"))
    assert runs[int8].data.tags["qbench.gate.notes"] == f"{own} | {whole} | {of_reference}"
    assert runs[fp32].data.tags["qbench.gate.notes"] == of_reference
    assert runs[fp32].data.tags["qbench.gate"] == "not gated"
    assert runs[failed].data.tags["qbench.gate"] == "fail"
    assert runs[failed].data.tags["qbench.gate.notes"].startswith(f"{whole} | {of_reference} | {failed}: xxx")
    assert len(runs[failed].data.tags["qbench.gate.notes"]) == MAX_TAG_VAL_LENGTH
    assert runs[failed].data.tags["qbench.gate.notes"].endswith("…")
    reasons = runs[failed].data.tags["qbench.gate.reasons"]
    assert reasons.startswith(f"UNUSABLE {failed}: variant failed") and own not in reasons
    sweep_tags = client.get_run(parent_id).data.tags
    assert sweep_tags["qbench.gate.notes"].startswith(f"{own} | {whole} | {of_reference} | {failed}")
    assert sweep_tags["qbench.gate.reasons"].startswith("gate: FAIL")


def test_metric_keys_built_from_converter_output_names_reach_mlflow(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Several evaluated outputs name their metrics 'output/metric'; a PyTorch output '/encoder/Softmax_output_0' (a
    leading slash) and a tf2onnx-style 'logits/../x y' gave keys MLflow refuses, and the whole sweep's logging failed
    (exit 2, nothing in MLflow)."""
    from sweep_factory import make_variant

    monkeypatch.chdir(tmp_path)
    recipe = write_recipe(tmp_path)
    names = {"/encoder/Softmax_output_0/accuracy": 0.9, "logits/../x y/accuracy": 0.8, "logits/_/x y/accuracy": 0.7}
    fp32 = make_variant("fp32", "fp32")
    overall = dataclasses.replace(fp32.accuracy.overall, metrics=names, drops={})
    fp32 = dataclasses.replace(fp32, accuracy=dataclasses.replace(fp32.accuracy, overall=overall))
    log_sweep(make_sweep([fp32]), recipe, gate=None, artifacts=[])
    client = MlflowClient(resolve_tracking_uri(recipe))
    runs = client.search_runs([client.get_experiment_by_name("digits").experiment_id])
    metrics = next(r.data.metrics for r in runs if r.data.params.get("variant") == "fp32")
    keys = unique_names(names)
    assert keys["/encoder/Softmax_output_0/accuracy"] == "_/encoder/Softmax_output_0/accuracy"
    assert {keys[name]: metrics[keys[name]] for name in names} == {keys[name]: value for name, value in names.items()}
    assert len(set(keys.values())) == 3  # 'logits/../x y' and 'logits/_/x y' clean alike and keep a figure each
