"""A variant's ONNX model as an MLflow LoggedModel: its signature (batch dimension -1, int64 and string inputs, outputs
that are no tensors) and a logged model that pyfunc loads and runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from qbench.track.models import log_variant_model, onnx_signature


def _save(graph: object, path: Path, *, ml: bool = False) -> Path:
    import onnx

    opsets = [helper.make_opsetid("", 17), *([helper.make_opsetid("ai.onnx.ml", 3)] if ml else [])]
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return path


def test_onnx_signature_has_dynamic_batch_and_keeps_the_inputs_when_an_output_is_no_tensor(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.INT64, ["batch", 7])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, ["batch", 7])
    signature = onnx_signature(_save(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y]),
                                     tmp_path / "id.onnx"))  # fmt: skip
    (spec,) = signature.inputs.inputs
    assert (spec.name, spec.type, tuple(spec.shape)) == ("x", np.dtype("int64"), (-1, 7))
    # a sequence output (a classifier's ZipMap, say): the inputs are still described, the outputs are not
    sequence = helper.make_tensor_sequence_value_info("s", TensorProto.INT64, None)
    graph = helper.make_graph([helper.make_node("SequenceConstruct", ["x"], ["s"])], "g", [x], [sequence])
    signature = onnx_signature(_save(graph, tmp_path / "seq_out.onnx"))
    assert [s.name for s in signature.inputs.inputs] == ["x"] and signature.outputs is None
    graph = helper.make_graph([helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)], "g", [sequence], [y])
    assert onnx_signature(_save(graph, tmp_path / "seq_in.onnx")) is None  # an input that is no tensor: none at all


def test_a_model_with_string_inputs_is_logged_with_its_signature_and_serves_text(tmp_path: Path) -> None:
    """String inputs (a text model: an ai.onnx.ml LabelEncoder here) had no signature at all before."""
    import mlflow
    from mlflow.tracking import MlflowClient
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    text = helper.make_tensor_value_info("text", TensorProto.STRING, ["batch", 1])
    label = helper.make_tensor_value_info("label", TensorProto.INT64, ["batch", 1])
    encoder = helper.make_node("LabelEncoder", ["text"], ["label"], domain="ai.onnx.ml", keys_strings=["a", "b"],
                               values_int64s=[1, 2], default_int64=0)  # fmt: skip
    model = _save(helper.make_graph([encoder], "g", [text], [label]), tmp_path / "text.onnx", ml=True)
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("text", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment_id).info.run_id
    model_id = log_variant_model(client, experiment_id, run_id, model, name="text", tags={})
    with _use_tracking_uri(uri):  # `models:/<id>` is looked up in the global tracking store
        loaded = mlflow.pyfunc.load_model(f"models:/{model_id}")
    [spec] = loaded.metadata.signature.inputs.inputs
    assert (spec.name, spec.type, tuple(spec.shape)) == ("text", np.dtype(object), (-1, 1))
    [out] = loaded.metadata.signature.outputs.inputs
    assert (out.name, out.type) == ("label", np.dtype("int64"))
    predicted = loaded.predict(np.array([["b"], ["a"], ["unseen"]], dtype=object))
    assert predicted["label"].ravel().tolist() == [2, 1, 0]



def test_the_logged_model_serves_with_the_providers_and_optimisation_level_it_was_measured_with(tmp_path: Path) -> None:
    """MLflow's defaults declared CUDA before CPU and ORT's full optimisation, whatever the variant was validated with
    (a ModelOpt FP8 Q/DQ graph is measured at `basic`: ORT mis-optimises its pattern at `all`)."""
    import mlflow
    import onnxruntime as ort
    from mlflow.tracking import MlflowClient
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    model = _save(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]), tmp_path / "relu.onnx")
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("relu", artifact_location=(tmp_path / "artifacts").as_uri())
    measured = {"runtime.runtime": "onnxruntime", "runtime.providers": ["CPUExecutionProvider"],
                "runtime.graph_optimization_level": "basic"}  # fmt: skip
    model_id = log_variant_model(client, experiment_id, client.create_run(experiment_id).info.run_id, model,
                                 name="relu", tags={}, measured=measured)  # fmt: skip
    with _use_tracking_uri(uri):
        loaded = mlflow.pyfunc.load_model(f"models:/{model_id}")
    flavor = loaded.metadata.flavors["onnx"]
    assert flavor["providers"] == ["CPUExecutionProvider"]
    session = loaded.get_raw_model()
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert session.get_session_options().graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    # a variant measured on another runtime (torch) declares nothing of ONNX Runtime's
    torch_model = log_variant_model(client, experiment_id, client.create_run(experiment_id).info.run_id, model,
                                    name="relu-torch", tags={}, measured={"runtime.runtime": "torch"})  # fmt: skip
    with _use_tracking_uri(uri):
        assert not mlflow.pyfunc.load_model(f"models:/{torch_model}").metadata.flavors["onnx"].get("onnx_session_options")


def test_logging_a_model_parses_it_once_and_scans_no_installed_distribution(tmp_path: Path, monkeypatch) -> None:
    """Each variant's model was parsed twice (once for its signature), and the first logged in a process paid MLflow's
    check of the pinned requirements against this environment: a scan of every installed distribution's files. The
    MLmodel folder keeps the requirements and signature all the same."""
    import onnx
    from mlflow.tracking import MlflowClient
    from mlflow.utils import environment, requirements_utils

    loads: list[object] = []
    scans: list[object] = []
    real_load, real_scan = onnx.load, requirements_utils.importlib_metadata.packages_distributions
    monkeypatch.setattr(onnx, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    monkeypatch.setattr(requirements_utils.importlib_metadata, "packages_distributions",
                        lambda: scans.append(1) or real_scan())  # fmt: skip
    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", None)  # as in a fresh process
    check = environment.warn_dependency_requirement_mismatches
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    model = _save(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]), tmp_path / "relu.onnx")
    client = MlflowClient(f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}")
    experiment_id = client.create_experiment("relu", artifact_location=(tmp_path / "artifacts").as_uri())
    model_id = log_variant_model(client, experiment_id, client.create_run(experiment_id).info.run_id, model,
                                 name="relu", tags={})  # fmt: skip
    assert (len(loads), scans) == (1, [])
    assert environment.warn_dependency_requirement_mismatches is check  # MLflow's check is back for everyone else
    folder = Path(client.get_logged_model(model_id).artifact_location.removeprefix("file://"))
    pins = (folder / "requirements.txt").read_text().split()
    assert f"onnx=={onnx.__version__}" in pins and any(p.startswith("mlflow==") for p in pins)
    assert "signature:" in (mlmodel := (folder / "MLmodel").read_text()) and "[-1, 3]" in mlmodel


def test_a_full_artifact_store_fails_the_logging_while_an_unreadable_model_only_fails_its_model(
    tmp_path: Path, monkeypatch
) -> None:
    """A model whose upload met a full disk was logged as a warning, the LoggedModel FAILED, and the sweep ended its
    runs FINISHED and exited 0 with MLflow lacking every model. Now the error propagates (the tracker counts it as
    the store failing: exit 2); a model file that is no model still costs only its LoggedModel."""
    import errno
    import os

    import pytest
    from mlflow.entities import LoggedModelStatus
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository
    from mlflow.tracking import MlflowClient

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    model = _save(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]), tmp_path / "relu.onnx")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    client = MlflowClient(f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}")
    experiment_id = client.create_experiment("relu", artifact_location=(tmp_path / "artifacts").as_uri())

    def full(repository: object, local_file: str, artifact_path: str | None = None) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "artifacts" / "model.onnx"))

    run_id = client.create_run(experiment_id).info.run_id
    assert client.get_logged_model(log_variant_model(client, experiment_id, run_id, garbage, name="garbage",
                                                     tags={})).status == LoggedModelStatus.FAILED  # fmt: skip
    monkeypatch.setattr(LocalArtifactRepository, "log_artifact", full)
    with pytest.raises(OSError, match="No space left on device"):
        log_variant_model(client, experiment_id, run_id, model, name="relu", tags={})
    [failed] = [m for m in client.search_logged_models([experiment_id]) if m.name == "relu"]
    assert failed.status == LoggedModelStatus.FAILED
