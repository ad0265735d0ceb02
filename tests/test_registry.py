"""`qbench gate --register`: the gate's winners become model versions in a real MLflow server's registry.

One tiny sweep is logged to the `mlflow_server` fixture (a real `mlflow server`, sqlite backend, on
127.0.0.1); the gate then registers from its runs, and a failing gate must leave the registry alone.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from sweep_factory import default_variants, make_sweep, make_variant
from tiny_linear import make_linear_project, strict_copy

from qbench.cli import main
from qbench.errors import QbenchError
from qbench.gate import evaluate_gate, latest_results
from qbench.recipe import GateSpec, load_recipe
from qbench.results import SweepResults, read_results
from qbench.track_registry import best_passing, check_alias, register_best

MODEL = "linear-classifier"


@dataclasses.dataclass(frozen=True)
class Swept:
    recipe: Path
    results: SweepResults
    run_dir: Path
    client: MlflowClient


@pytest.fixture(scope="module")
def swept(mlflow_server: str, tmp_path_factory: pytest.TempPathFactory) -> Swept:
    root = tmp_path_factory.mktemp("registry_project")
    recipe = make_linear_project(root, mlflow_server, experiment="registry-test")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        assert main(["sweep", str(recipe)]) == 0
    path = latest_results(load_recipe(recipe))
    return Swept(recipe, read_results(path), path.parent, MlflowClient(mlflow_server))


def _child_run(swept: Swept, variant: str) -> str:
    experiment = swept.client.get_experiment_by_name("registry-test")
    runs = swept.client.search_runs([experiment.experiment_id], f"tags.`qbench.variant` = '{variant}'")
    (run,) = runs
    return run.info.run_id


def test_gate_registers_the_fastest_passing_variant_and_only_a_pass_moves_the_alias(
    swept: Swept, mlflow_server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client = swept.client
    # the loose gate passes int8-minmax and fp16 (FP32 is the reference, not a candidate): the faster at b1 wins
    candidates = [v for v in swept.results.variants if v.variant != "fp32"]
    winner = min(candidates, key=lambda v: v.latency.at(1).p50_ms)
    assert main(["gate", str(swept.recipe), "--register", MODEL]) == 0
    assert f"registered {winner.variant}@onnxruntime-cpu as {MODEL} version 1" in capsys.readouterr().out

    version = client.get_model_version_by_alias(MODEL, "candidate")
    winner_run = _child_run(swept, winner.variant)
    (output,) = client.get_run(winner_run).outputs.model_outputs
    assert (version.version, version.run_id, version.source) == ("1", winner_run, f"models:/{output.model_id}")
    assert version.tags["qbench.variant"] == winner.variant and version.tags["qbench.backend"] == "onnxruntime-cpu"
    logged = client.get_logged_model(output.model_id)
    assert logged.source_run_id == winner_run and logged.status.to_int() == 2  # READY

    # `models:/NAME@candidate` loads the variant's ONNX model: same outputs as the file qbench measured
    import mlflow.pyfunc
    import onnxruntime

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    rows = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    served = mlflow.pyfunc.load_model(f"models:/{MODEL}@candidate").predict({"x": rows})["logits"]
    session = onnxruntime.InferenceSession(winner.model_path, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(served, session.run(None, {"x": rows})[0])

    # a breaching gate (exit 1) registers nothing and leaves the alias on version 1
    strict = strict_copy(swept.recipe)
    assert main(["gate", str(strict), "--register", MODEL]) == 1
    assert "not registered" in capsys.readouterr().err
    assert client.get_model_version_by_alias(MODEL, "candidate").version == "1"
    assert [v.version for v in client.search_model_versions(f"name = '{MODEL}'")] == ["1"]

    # the next passing gate adds version 2 and moves the alias; a custom alias points at it too
    assert main(["gate", str(swept.recipe), "--register", MODEL, "--alias", "staging"]) == 0
    assert client.get_model_version_by_alias(MODEL, "staging").version == "2"
    assert client.get_model_version_by_alias(MODEL, "candidate").version == "1"


def test_registering_a_run_folder_mlflow_never_saw_is_refused(swept: Swept, tmp_path: Path) -> None:
    recipe = load_recipe(swept.recipe)
    gate = evaluate_gate(swept.results, recipe.gate)
    with pytest.raises(QbenchError, match="no finished MLflow sweep run"):
        register_best(recipe, swept.results, gate, tmp_path, name="never-registered")
    with pytest.raises(MlflowException):
        swept.client.get_registered_model("never-registered")


def test_best_passing_skips_breaching_and_reference_variants_per_backend() -> None:
    # int8_minmax is fastest but loses 0.04 on the dark slice (tolerance 0.02); fp16 (1.1 ms) beats fp8 (6 ms)
    gpu = [make_variant("fp32", "fp32", backend="onnxruntime-cuda", p50_by_batch={1: 0.5}),
           make_variant("fp16", "fp16", backend="onnxruntime-cuda", p50_by_batch={1: 0.3}),
           make_variant("fp8_e4m3", "fp8", backend="onnxruntime-cuda", p50_by_batch={1: 0.2})]  # fmt: skip
    results = make_sweep([*default_variants(), *gpu])
    gate = evaluate_gate(results, GateSpec(max_drop=0.01, max_slice_drop=0.02))
    best = best_passing(results, gate, batch_size=1)
    assert {backend: v.variant for backend, v in best.items()} == {"onnxruntime-cpu": "fp16",
                                                                   "onnxruntime-cuda": "fp8_e4m3"}  # fmt: skip
    assert best_passing(results, gate, batch_size=32) == {"onnxruntime-cpu": results.find("fp16", "onnxruntime-cpu")}


def test_a_failing_gate_is_refused_by_the_library_too(swept: Swept) -> None:
    recipe = load_recipe(strict_copy(swept.recipe))
    gate = evaluate_gate(swept.results, recipe.gate)
    assert gate.exit_code == 1
    with pytest.raises(QbenchError, match="nothing registered, no alias moved"):
        register_best(recipe, swept.results, gate, swept.run_dir, name=MODEL)


@pytest.mark.parametrize("alias", ["latest", "v3", "has space", ""])
def test_aliases_mlflow_would_reject_are_refused_up_front(alias: str) -> None:
    with pytest.raises(QbenchError, match="--alias"):
        check_alias(alias)
