"""Log a sweep to MLflow as it runs: one parent run per sweep, one nested child run per variant x backend.

`SweepTracker` is driven by the sweep: the parent run opens when the sweep starts, each child run
when work on its variant starts and ends when its result is in, so the MLflow UI shows progress and
real durations; an interrupted sweep ends its runs KILLED, a crashed one FAILED (never left RUNNING,
never tagged pass). What is logged (keys, metrics, params, tags) is in qbench.track_content.

Stores: the recipe's `tracking.uri`, else a sqlite file in the working
directory (MLflow 3's plain `file:` store refuses to run without an opt-in).
A sqlite store would put artifacts in ./mlruns of whatever directory the
process runs in, so qbench creates its experiments with an explicit artifact
location next to the database (`<db folder>/mlartifacts/<experiment>`);
`ui_command` serves the same root. Tracking servers (http/https) choose their own.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from mlflow.utils.validation import MAX_ENTITIES_PER_BATCH, MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH

import qbench
from qbench.errors import QbenchError, one_line
from qbench.gate import GateReport
from qbench.recipe import Recipe
from qbench.results import SweepResults, VariantResult, to_json
from qbench.track_content import (
    GATE_TAG,
    param_value,
    run_name,
    sanitise_name,
    sweep_metrics,
    sweep_params,
    sweep_tags,
    tag_value,
    uses_calibration,
    variant_metrics,
    variant_params,
    variant_tags,
)
from qbench.track_datasets import DatasetInputs, SweepData, dataset_inputs
from qbench.track_models import link_variant_model, log_variant_model, logged_model_name

try:  # POSIX; elsewhere concurrent first use of one new sqlite store is not serialised
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

T = TypeVar("T")

logger = logging.getLogger(__name__)

_ARTIFACT_FOLDER = "mlartifacts"
_PENDING = "pending (sweep running)"
# The MLflow 3 UI opens an experiment in its model-training view (runs, models, charts) when this tag
# says so; without it, it infers the kind and may open the GenAI (traces) view.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"
RUN_DIR_TAG = "qbench.run_dir"  # the sweep's run folder: `qbench gate --register` finds the runs by it
SYSTEM_METRICS_INTERVAL_S = 1.0
MODEL_METRIC_GROUPS = ("acc/", "lat/", "speedup/", "throughput/", "cost.", "model_mb")  # also on the LoggedModel
FAILURE_CHARS = 400  # a store's failure in one line: MLflow's connection errors run to several lines


# -- stores ---------------------------------------------------------------------------------------


def resolve_tracking_uri(recipe: Recipe) -> str:
    """The recipe's tracking URI (a relative sqlite path is relative to the recipe), else $MLFLOW_TRACKING_URI,
    else `sqlite:///<absolute cwd>/mlflow.db`."""
    if recipe.tracking_uri:
        return recipe.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return "sqlite:///" + (Path.cwd() / "mlflow.db").as_posix()


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast when a tracking server does not answer (MLflow's own retries take minutes)."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s):
            return
    except (urllib.error.URLError, OSError) as exc:
        raise QbenchError(f"MLflow tracking server {uri} does not answer ({exc}); start it or use --no-track") from None


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a sqlite URI (relative paths resolved against the cwd); None for other stores."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0]).resolve()


def artifact_root(uri: str) -> str | None:
    """Where qbench puts artifacts for a sqlite store (a file URI next to the database); None for other stores."""
    database = _sqlite_file(uri)
    return (database.parent / _ARTIFACT_FOLDER).as_uri() if database else None


def _is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def search_literal(value: str) -> str:
    """`value` as a quoted string in an MLflow search filter."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def finished_sweep_run(client: MlflowClient, experiment_id: str, run_dir: Path) -> Run | None:
    """The newest FINISHED sweep run tagged with the run folder `run_dir`, if any (a sweep's runs are found by it)."""
    tag = f"tags.`{RUN_DIR_TAG}` = {search_literal(str(run_dir.resolve()))}"
    found = client.search_runs([experiment_id], f"{tag} and attributes.status = 'FINISHED'",
                               order_by=["attributes.start_time DESC"], max_results=1)  # fmt: skip
    return found[0] if found else None


def experiment_name(recipe: Recipe) -> str:
    return recipe.tracking.experiment or recipe.name


def _experiment_id(client: MlflowClient, name: str, uri: str) -> str:
    existing = client.get_experiment_by_name(name)
    if existing is None:
        root = artifact_root(uri)
        folder = re.sub(r"[^\w.-]", "_", name)
        try:
            return client.create_experiment(
                name, artifact_location=f"{root}/{folder}" if root else None, tags={EXPERIMENT_KIND_TAG: TRAINING_KIND}
            )
        except MlflowException as exc:  # another sweep created it just now (a server store is not locked)
            existing = client.get_experiment_by_name(name)
            if exc.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS) or existing is None:
                raise
    if existing.lifecycle_stage == "deleted":
        raise QbenchError(
            f"MLflow experiment {name!r} in {uri} is deleted: restore it in the MLflow UI, "
            "or set tracking.experiment in the recipe to another name"
        )
    if EXPERIMENT_KIND_TAG not in existing.tags:  # made before qbench set it; a kind set by the user is kept
        client.set_experiment_tag(existing.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
    return existing.experiment_id


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Serialise the first use of a sqlite store across processes (an exclusive lock on `<db>.lock`).

    MLflow creates and migrates a new sqlite database on first use, and two processes doing that at
    once fail; creating the experiment races the same way.
    """
    database = _sqlite_file(uri)
    if database is None or fcntl is None:
        yield
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{database}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# A tracking server that fails or stops answering must cost a sweep seconds, not MLflow's default back-off (7
# retries, minutes per call; the system-metrics thread's calls too): while qbench talks to a store, retries are these.
BOUNDED_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                   "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}  # fmt: skip


@contextlib.contextmanager
def bounded_retries() -> Iterator[None]:
    """MLflow's HTTP retries bounded by BOUNDED_RETRIES while the block runs; a variable the user set wins."""
    added = {name: value for name, value in BOUNDED_RETRIES.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def open_experiment(recipe: Recipe) -> tuple[MlflowClient, str, str]:
    """A client of the recipe's store, the store's URI and the recipe's experiment id (created when new)."""
    uri = resolve_tracking_uri(recipe)
    try:
        with _store_lock(uri), bounded_retries():
            client = MlflowClient(tracking_uri=uri)
            return client, uri, _experiment_id(client, experiment_name(recipe), uri)
    except (MlflowException, OSError) as exc:
        raise QbenchError(store_failure(uri, exc)) from exc


def ui_command(uri: str, host: str = "127.0.0.1", port: int = 5000) -> list[str]:
    """The `mlflow ui` command line that serves `uri`, with the artifact root qbench logs to for sqlite stores."""
    if _is_server(uri):
        raise QbenchError(f"{uri} is a tracking server already: open it in a browser")
    database = _sqlite_file(uri)
    store = f"sqlite:///{database.as_posix()}" if database else uri
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store]
    root = artifact_root(uri)
    if root is not None:
        command += ["--default-artifact-root", root]
    return command + ["--host", host, "--port", str(port)]


# -- logging --------------------------------------------------------------------------------------


def _batches(metrics: Sequence[Metric], params: Sequence[Param], tags: Sequence[RunTag]) -> Iterator[dict[str, list]]:
    """Metrics, params and tags packed into as few log_batch requests as MLflow's per-request limits allow
    (each request is a store transaction: on a sqlite store, the bulk of a variant's logging time)."""
    queues = {"metrics": list(metrics), "params": list(params), "tags": list(tags)}
    limits = {"metrics": MAX_METRICS_PER_BATCH, "params": MAX_PARAMS_TAGS_PER_BATCH, "tags": MAX_PARAMS_TAGS_PER_BATCH}
    while any(queues.values()):
        room, request = MAX_ENTITIES_PER_BATCH, {}
        for kind, queue in queues.items():
            take = min(limits[kind], room, len(queue))
            request[kind], queues[kind] = queue[:take], queue[take:]
            room -= take
        yield request


def _log(client: MlflowClient, run_id: str, metrics: Mapping[str, float], params: Mapping[str, str],
         tags: Mapping[str, str], model_id: str | None = None) -> None:  # fmt: skip
    """log_batch within MLflow's per-request limits. NaN/inf metrics are not logged: a tag names them.

    With `model_id`, the headline metrics (MODEL_METRIC_GROUPS) are also the LoggedModel's, shown on its page in
    the UI; the rest (every slice's figures) stay on the run: the store writes each model metric a second time."""
    now = int(time.time() * 1000)
    finite = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(v)}
    missing = sorted(k for k in metrics if k not in finite)
    all_tags = dict(tags) | ({"qbench.missing_metrics": tag_value(", ".join(missing))} if missing else {})
    entries = [Metric(k, v, now, 0, model_id=model_id if k.startswith(MODEL_METRIC_GROUPS) else None)
               for k, v in finite.items()]  # fmt: skip
    for request in _batches(entries, [Param(k, v) for k, v in params.items()],
                            [RunTag(k, v) for k, v in all_tags.items()]):  # fmt: skip
        client.log_batch(run_id, **request)


def artifact_paths(recipe: Recipe, artifacts: Sequence[Path]) -> list[Path]:
    """The recipe file and the given artifacts, each once; a missing one is an error."""
    paths = ([recipe.source] if recipe.source.is_file() else []) + [Path(a) for a in artifacts]
    unique = list({p.resolve(): p for p in paths}.values())
    for path in unique:
        if not path.exists():
            raise QbenchError(f"cannot log artifact {path}: no such file or folder")
    return unique


def _log_artifacts(client: MlflowClient, run_id: str, paths: Sequence[Path]) -> None:
    for path in paths:
        if path.is_dir():
            client.log_artifacts(run_id, str(path), artifact_path=path.name)
        else:
            client.log_artifact(run_id, str(path))


def _check_artifact_store(client: MlflowClient, uri: str, run_id: str, artifact_uri: str, recipe: Recipe) -> None:
    """Write the recipe into the new parent run before anything is measured: the client writes a server's artifacts
    itself unless the server proxies them, so a store it cannot reach (the server's disk, s3:// without boto3) would
    fail every model and report only after the whole sweep. A failure ends the run FAILED: a QbenchError."""
    if _is_server(uri) and urllib.parse.urlparse(artifact_uri).scheme in ("", "file"):
        logger.warning("MLflow at %s stores artifacts in %s, a folder this machine writes itself: the MLflow UI shows "
                       "them only if the server reads the same folder (start it with --serve-artifacts to send "
                       "artifacts through the server)", uri, artifact_uri)  # fmt: skip
    try:
        if recipe.source.is_file():
            client.log_artifact(run_id, str(recipe.source))
        else:  # a recipe made in memory: its settings
            client.log_text(run_id, recipe.model_dump_json(indent=2), "recipe.json")
    except Exception as exc:  # noqa: BLE001 - artifact stores raise their own types (ImportError, botocore's, ...)
        with contextlib.suppress(Exception):
            client.set_tag(run_id, GATE_TAG, "not evaluated (sweep failed: artifact store not writable)")
            client.set_terminated(run_id, status="FAILED", end_time=_now_ms())
        raise QbenchError(one_line(
            f"MLflow at {uri} stores this sweep's artifacts in {artifact_uri}, which this machine cannot write "
            f"({type(exc).__name__}: {exc}); start the server with --serve-artifacts, give this machine access to "
            "that store, or use --no-track", FAILURE_CHARS * 2)) from exc  # fmt: skip


def _now_ms() -> int:
    return int(time.time() * 1000)


def _system_metrics(run_id: str, uri: str) -> Any | None:
    """MLflow's system metrics monitor (CPU, memory, disk, network; GPU when NVML answers) sampling into `run_id`."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(run_id, sampling_interval=SYSTEM_METRICS_INTERVAL_S, tracking_uri=uri)
    except ImportError as exc:  # psutil missing
        logger.warning("no system metrics for the sweep run: %s (pip install psutil)", exc)
        return None
    monitor.start()
    return monitor


class SweepTracker:
    """The MLflow runs of one sweep, driven while it runs (see the module docstring).

    A store that fails while the sweep runs does not stop it: the first failure is kept in `failure` (one line
    naming the store), the runs are ended FAILED as far as the store still answers, and every later call is
    skipped, so the sweep measures everything and writes its results; the caller says that MLflow has not got
    them. Failing to open the parent run is a QbenchError (nothing was measured yet).
    """

    def __init__(self, client: MlflowClient, uri: str, experiment_id: str, parent_id: str) -> None:
        self._client = client
        self._uri = uri
        self._experiment_id = experiment_id
        self.parent_id = parent_id
        self._running: dict[str, str] = {}  # variant@backend -> run id of a child not ended yet
        self._children: dict[str, str] = {}  # variant@backend -> run id, every child
        self._models: dict[str, str] = {}  # variant -> LoggedModel id (logged once, linked from every backend)
        self._datasets: DatasetInputs | None = None
        self._monitor: Any | None = None
        self._retries = contextlib.ExitStack()  # bounded HTTP retries while the sweep's runs are open
        self.failure: str | None = None

    @classmethod
    def open(cls, recipe: Recipe, run_name: str, *, run_dir: Path | None = None,
             data: SweepData | None = None) -> SweepTracker:  # fmt: skip
        """Create the sweep's parent run (RUNNING from now, sampling system metrics) in the recipe's experiment.

        `run_dir` tags the parent with the sweep's run folder; `data` logs what it measures on as datasets.
        """
        retries = contextlib.ExitStack()
        retries.enter_context(bounded_retries())
        try:
            client, uri, experiment_id = open_experiment(recipe)
            tags = {"qbench.version": qbench.__version__, "qbench.recipe": recipe.name, GATE_TAG: _PENDING}
            if run_dir is not None:
                tags[RUN_DIR_TAG] = tag_value(str(run_dir.resolve()))
            try:
                parent = client.create_run(experiment_id, run_name=run_name, tags=tags)
            except (MlflowException, OSError) as exc:
                raise QbenchError(store_failure(uri, exc)) from exc
            _check_artifact_store(client, uri, parent.info.run_id, parent.info.artifact_uri, recipe)
        except BaseException:
            retries.close()
            raise
        tracker = cls(client, uri, experiment_id, parent.info.run_id)
        tracker._retries = retries
        tracker._monitor = _system_metrics(tracker.parent_id, uri)
        if data is not None:
            tracker._mlflow(lambda: tracker._log_datasets(data))
        return tracker

    def _log_datasets(self, data: SweepData) -> None:
        self._datasets = dataset_inputs(data)
        self._client.log_inputs(self.parent_id, datasets=self._datasets.sweep)

    def variant_started(self, variant: str, backend: str) -> None:
        """Open the child run of one variant on one backend."""
        self._mlflow(lambda: self._start_child(variant, backend))

    def _start_child(self, variant: str, backend: str) -> str:
        tags = {MLFLOW_PARENT_RUN_ID: self.parent_id, GATE_TAG: _PENDING, "qbench.variant": variant,
                "qbench.backend": backend}  # fmt: skip
        run = self._client.create_run(self._experiment_id, run_name=run_name(variant, backend), tags=tags)
        key = f"{variant}@{backend}"
        self._running[key] = self._children[key] = run.info.run_id
        return run.info.run_id

    def variant_finished(self, results: SweepResults, variant: VariantResult) -> None:
        """Log one variant's result, datasets and model into its child run (opened now if it was not); end the run."""

        def log() -> None:
            run_id = self._running.pop(variant.key, None) or self._start_child(variant.variant, variant.backend)
            self._running.pop(variant.key, None)
            model_id = self._model_of(variant, run_id)
            if self._datasets is not None:
                self._client.log_inputs(run_id, datasets=self._datasets.variant(uses_calibration(variant)))
            _log(self._client, run_id, variant_metrics(results, variant), variant_params(results, variant),
                 variant_tags(variant), model_id=model_id)  # fmt: skip
            self._client.set_terminated(run_id, status="FINISHED" if variant.status == "ok" else "FAILED")

        self._mlflow(log)

    def _model_of(self, variant: VariantResult, run_id: str) -> str | None:
        """The variant's LoggedModel, logged from this run the first time, linked to it afterwards; None if unmeasured."""
        if variant.status != "ok" or not variant.model_path or not Path(variant.model_path).is_file():
            return None
        model_id = self._models.get(variant.variant)
        if model_id is not None:
            link_variant_model(self._client, run_id, model_id)
            return model_id
        tags = {"qbench.variant": variant.variant, "qbench.precision": variant.precision}
        model_id = log_variant_model(self._client, self._experiment_id, run_id, Path(variant.model_path),
                                     name=logged_model_name(variant.variant), tags=tags, measured=variant.params)  # fmt: skip
        self._models[variant.variant] = model_id
        return model_id

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            self._monitor.finish()
            self._monitor = None

    def _release(self) -> None:
        """Stop sampling system metrics and lift the bounded retries: the sweep's runs are ended."""
        try:
            self._stop_monitor()
        finally:
            self._retries.close()

    def close(self, results: SweepResults, recipe: Recipe, gate: GateReport | None,
              artifacts: Sequence[Path]) -> str | None:  # fmt: skip
        """Log the sweep's params, metrics, gate verdicts and artifacts; end the parent FINISHED; returns its id
        (None when the store failed: see `failure`)."""
        logged_at_open = recipe.source.resolve() if recipe.source.is_file() else None  # see _check_artifact_store
        paths = [p for p in artifact_paths(recipe, artifacts) if p.resolve() != logged_at_open]

        def log() -> None:
            for variant in results.variants:
                if variant.key not in self._children:  # results logged after the fact (log_sweep)
                    self.variant_finished(results, variant)
            _log(self._client, self.parent_id, sweep_metrics(results, gate), sweep_params(results, recipe),
                 sweep_tags(results, gate))  # fmt: skip
            for variant in results.variants:
                verdict = gate.status_of(variant.variant, variant.backend) if gate else "not evaluated"
                self._client.set_tag(self._children[variant.key], GATE_TAG, verdict)
            _log_artifacts(self._client, self.parent_id, paths)
            if results.ranges is not None:
                self._client.log_text(self.parent_id, to_json(results.ranges), "ranges.json")
            if results.search is not None:
                self._client.log_text(self.parent_id, to_json(results.search), "search.json")
            self._stop_monitor()
            self._client.set_terminated(self.parent_id, status="FINISHED")

        self._mlflow(log)
        self._release()
        return None if self.failure else self.parent_id

    def abort(self, status: str, reason: str) -> None:
        """End the parent and every open child with `status` (KILLED or FAILED); no run keeps a gate verdict.

        Best effort: the store may be what failed, so the first error ends the attempt (each further call would
        wait for its own retries), and nothing is raised.
        """
        verdict = tag_value(f"not evaluated (sweep {reason})")
        calls: list[Callable[[], object]] = [
            self._stop_monitor,
            *(lambda r=run_id: self._client.set_terminated(r, status=status, end_time=_now_ms())
              for run_id in self._running.values()),
            *(lambda r=run_id: self._client.set_tag(r, GATE_TAG, verdict) for run_id in self._children.values()),
            lambda: self._client.set_tag(self.parent_id, GATE_TAG, verdict),
            lambda: self._client.set_terminated(self.parent_id, status=status, end_time=_now_ms()),
        ]  # fmt: skip
        self._running.clear()
        try:
            for call in calls:
                call()
        except Exception as exc:  # noqa: BLE001 - best effort, see above
            logger.debug("ending the MLflow runs stopped at: %s", exc)
        finally:
            self._release()

    def _mlflow(self, call: Callable[[], T]) -> T | None:
        """Run one step of logging; after the store's first failure, none (see the class docstring)."""
        if self.failure is not None:
            return None
        try:
            return call()
        except (MlflowException, OSError) as exc:  # OSError: requests' connection errors, a full or read-only disk
            self.failure = store_failure(self._uri, exc)
            logger.warning("%s; the sweep goes on without MLflow (its runs are ended FAILED where the store answers)",
                           self.failure)  # fmt: skip
            self.abort("FAILED", "failed: MLflow error")
            return None


def store_failure(uri: str, exc: BaseException) -> str:
    """What failed, in one line naming the store (MLflow's connection errors run to several lines)."""
    message = exc.message if isinstance(exc, MlflowException) else str(exc)
    return one_line(f"MLflow tracking at {uri} failed: {message}", FAILURE_CHARS)


def log_run(
    recipe: Recipe, run_name: str, *, params: Mapping[str, Any], metrics: Mapping[str, float], artifacts: Sequence[Path]
) -> str:
    """One stand-alone run in the recipe's experiment (e.g. `explain <variant>`): params, metrics, the recipe
    and `artifacts`; returns its id. MLflow problems become a QbenchError naming the store."""
    paths = artifact_paths(recipe, artifacts)
    with bounded_retries():
        client, uri, experiment_id = open_experiment(recipe)
        try:
            run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
            _log(client, run_id, metrics, {sanitise_name(k): param_value(v) for k, v in params.items()}, {})
            _log_artifacts(client, run_id, paths)
            client.set_terminated(run_id, status="FINISHED")
        except (MlflowException, OSError) as exc:
            raise QbenchError(store_failure(uri, exc)) from exc
    return run_id
