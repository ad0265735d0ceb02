"""A variant's ONNX model as an MLflow 3 LoggedModel (ONNX flavour, with its signature), linked to its runs.

The model is logged once per variant, from the child run of the first backend that measured it; the
child runs of the other backends link to the same model as an output. The MLmodel folder is written
by `mlflow.onnx.save_model` with explicit pip requirements (no dependency inference, no conda
resolution), then uploaded to the LoggedModel's artifact location (its files together: qbench.track.upload), so
`models:/<model_id>` loads it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from mlflow.entities import LoggedModelOutput, LoggedModelStatus
from mlflow.exceptions import MlflowException
from mlflow.models import Model, ModelSignature
from mlflow.store.artifact.artifact_repo import ArtifactRepository
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.tracking import MlflowClient
from mlflow.types import Schema, TensorSpec
from mlflow.utils.uri import add_databricks_profile_info_to_artifact_uri

from qbench.files import write_fault
from qbench.track.upload import files_to_upload, upload_all

logger = logging.getLogger(__name__)

MODEL_TYPE = "qbench-variant"
_NOT_IN_MODEL_NAMES = re.compile(r"[/:.%\"']")  # characters MLflow refuses in a LoggedModel's name


def logged_model_name(variant: str) -> str:
    """The variant's name as a LoggedModel name: int8-p99.9 -> int8-p99_9 (its tags keep the exact name)."""
    return _NOT_IN_MODEL_NAMES.sub("_", variant) or "_"


def _tensor_spec(value: object) -> TensorSpec | None:
    """The TensorSpec of one graph input/output (unknown dimensions -1); None for non-tensors or exotic dtypes.

    A string tensor is `object`, the dtype MLflow's tensor schemas give text (and pyfunc feeds it as such)."""
    import onnx

    if not value.type.HasField("tensor_type"):  # type: ignore[attr-defined]
        return None
    tensor_type = value.type.tensor_type  # type: ignore[attr-defined]
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
        text = tensor_type.elem_type == onnx.TensorProto.STRING
        if dtype.kind not in "biufc?" and not text:  # bfloat16 / float8 map to numpy-extension types MLflow cannot name
            return None
    except (KeyError, TypeError, ValueError):
        return None
    shape = None
    if tensor_type.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tensor_type.shape.dim)
    return TensorSpec(dtype, shape, value.name)  # type: ignore[attr-defined]


def onnx_signature(model: Path | Any) -> ModelSignature | None:
    """Inputs (initializers excluded) and outputs of the ONNX graph (a file, or a loaded ModelProto: a model being
    logged is parsed once) as tensor specs; None when an input is not a tensor. Outputs that are not all tensors (a
    classifier's ZipMap: a sequence of maps) are left out of the signature rather than losing it: its inputs are what
    the UI shows and serving checks requests against."""
    import onnx

    graph = (onnx.load(str(model), load_external_data=False) if isinstance(model, Path) else model).graph
    initializers = {i.name for i in graph.initializer}
    inputs = [_tensor_spec(v) for v in graph.input if v.name not in initializers]
    outputs = [_tensor_spec(v) for v in graph.output]
    if not inputs or any(spec is None for spec in inputs):
        return None
    described = Schema(outputs) if all(spec is not None for spec in outputs) else None  # type: ignore[arg-type]
    return ModelSignature(inputs=Schema(inputs), outputs=described)  # type: ignore[arg-type]


def _pip_requirements() -> list[str]:
    import onnx
    import onnxruntime

    return [f"onnx=={onnx.__version__}", f"onnxruntime=={onnxruntime.__version__}"]


@contextlib.contextmanager
def _no_environment_check() -> Iterator[None]:
    """While saving: without MLflow's check that this environment satisfies the model's requirements. They are
    _pip_requirements, this environment's own versions, so the check can only agree; and its first run in a process
    maps every installed distribution to its modules (a scan of each one's file list: a quarter of a second or more
    of a `qbench sweep`, more with a larger environment). Nothing is changed where MLflow has no such check."""
    from mlflow.utils import environment

    name = "warn_dependency_requirement_mismatches"
    check = getattr(environment, name, None)
    if check is None:
        yield
        return
    setattr(environment, name, lambda requirements: None)
    try:
        yield
    finally:
        setattr(environment, name, check)


# ONNX Runtime's GraphOptimizationLevel values, by the names `runtime.graph_optimization_level` records
_ORT_LEVELS = {"disable": 0, "basic": 1, "extended": 2, "all": 99}


def onnx_flavor_options(measured: Mapping[str, Any]) -> dict[str, Any]:
    """The ONNX flavour's execution providers and session options as the variant was measured (its `runtime.*`
    params): `models:/` serves what was validated. Without them MLflow declares CUDA before CPU and default session
    options, so a variant validated on the CPU provider, or needing a lower optimisation level (a Q/DQ pattern ORT
    mis-optimises), would be served differently. Nothing for a variant measured on another runtime (torch, TensorRT)."""
    if measured.get("runtime.runtime") != "onnxruntime":
        return {}
    options: dict[str, Any] = {}
    providers = measured.get("runtime.providers")
    if isinstance(providers, list) and providers and all(isinstance(p, str) for p in providers):
        options["onnx_execution_providers"] = list(providers)
    level = measured.get("runtime.graph_optimization_level")
    if level in _ORT_LEVELS and level != "all":  # MLflow's loader skips a level of 0 (disable): the tag still says it
        options["onnx_session_options"] = {"graph_optimization_level": _ORT_LEVELS[level]}
    return options


def log_variant_model(
    client: MlflowClient, experiment_id: str, run_id: str, model_path: Path, *, name: str, tags: dict[str, str],
    measured: Mapping[str, Any] | None = None,
) -> str:
    """Create the LoggedModel of one variant (source: `run_id`), link it as the run's output and upload it, with the
    runtime settings it was `measured` with (its params, see onnx_flavor_options).

    Returns the model id. A model file that cannot be saved leaves the LoggedModel FAILED (logged as a
    warning) rather than failing the sweep; MLflow store errors and a full or read-only disk (the model FAILED)
    propagate: the tracking failed.
    """
    import mlflow.onnx
    import onnx

    model = client.create_logged_model(experiment_id, name=name, source_run_id=run_id, tags=tags, model_type=MODEL_TYPE)
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=0)])
    try:
        with tempfile.TemporaryDirectory(prefix="qbench-mlmodel-") as tmp:
            local = Path(tmp) / "model"
            mlflow_model = Model(artifact_path=model.artifact_location, model_uuid=model.model_id, run_id=run_id,
                                 model_id=model.model_id)  # fmt: skip
            proto = onnx.load(str(model_path))
            with _no_environment_check():
                mlflow.onnx.save_model(
                    proto, str(local), mlflow_model=mlflow_model, signature=onnx_signature(proto),
                    pip_requirements=_pip_requirements(), **onnx_flavor_options(measured or {}),
                )  # fmt: skip
            repository = _artifact_repository(client, model.artifact_location)
            upload_all(repository.log_artifact, files_to_upload(sorted(local.iterdir())))
    except MlflowException:
        raise
    except Exception as exc:  # noqa: BLE001 - an unreadable model file must not lose the sweep's measurements
        client.finalize_logged_model(model.model_id, LoggedModelStatus.FAILED)
        if write_fault(exc):  # a full or read-only artifact store (or staging folder): the tracking failed
            raise
        logger.warning("could not log the model of %s to MLflow: %s", name, exc)
        return model.model_id
    client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    return model.model_id


def _artifact_repository(client: MlflowClient, location: str) -> ArtifactRepository:
    """The artifact store at a LoggedModel's `location`, as MLflow's client reaches it."""
    uri = add_databricks_profile_info_to_artifact_uri(location, client.tracking_uri)
    return get_artifact_repository(uri, tracking_uri=client.tracking_uri)


def link_variant_model(client: MlflowClient, run_id: str, model_id: str) -> None:
    """Mark an already logged variant model as an output of another backend's run."""
    client.log_outputs(run_id, [LoggedModelOutput(model_id, step=0)])
