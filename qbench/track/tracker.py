"""Log a sweep to MLflow as it runs: one parent run per sweep, one nested child run per variant x backend.

`SweepTracker` is driven by the sweep: the parent run opens when the sweep starts, each child run
when work on its variant starts and ends when its result is in, so the MLflow UI shows progress and
real durations; an interrupted sweep ends its runs KILLED, a crashed one FAILED (never left RUNNING,
never tagged pass). A resumed sweep (`resumes`) takes over the interrupted sweep's parent run rather than opening a
second one, so the experiment lists each variant x backend once: see SweepTracker.open. What is logged (keys, metrics,
params, tags) is in qbench.track.content.

Which store, its experiment and the UI command that serves it: qbench.track.store.
"""

from __future__ import annotations

import contextlib
import logging
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from mlflow.utils.validation import MAX_ENTITIES_PER_BATCH, MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH

import qbench
from qbench.errors import QbenchError, one_line
from qbench.gate.evaluate import GateReport
from qbench.provenance import model_sha256
from qbench.recipe.spec import Recipe
from qbench.results.schema import SweepResults, VariantResult, to_json
from qbench.runs import describe_run, without_password
from qbench.sweep.data import SweepData
from qbench.track.content import (
    GATE_TAG,
    clean_keys,
    gate_tags,
    param_value,
    run_name,
    sweep_metrics,
    sweep_params,
    sweep_tags,
    tag_value,
    uses_calibration,
    variant_metrics,
    variant_params,
    variant_tags,
)
from qbench.track.datasets import DatasetInputs, dataset_inputs
from qbench.track.models import link_variant_model, log_variant_model, logged_model_name
from qbench.track.store import (
    FAILURE_CHARS,
    RUN_DIR_TAG,
    after_logged,
    bounded_retries,
    end_time,
    is_server,
    now_ms,
    open_experiment,
    search_literal,
    store_failure,
)
from qbench.track.system import PREFIX as SYSTEM_PREFIX
from qbench.track.system import SystemSampler
from qbench.track.upload import files_to_upload, upload_all
from qbench.track.uri import resolve_tracking_uri

T = TypeVar("T")

logger = logging.getLogger(__name__)

_PENDING = "pending (sweep running)"
RESUMED_FROM_TAG = "qbench.resumed_from"  # on a parent run taken over by a resumed sweep: the interrupted run folder
MODEL_METRIC_GROUPS = ("acc/", "lat/", "speedup/", "throughput/", "cost.", "model_mb")  # also on the LoggedModel


# -- logging --------------------------------------------------------------------------------------


def _batches(metrics: Sequence[Metric], params: Sequence[Param], tags: Sequence[RunTag]) -> Iterator[dict[str, list]]:
    """Metrics, params and tags packed into as few log_batch requests as MLflow's per-request limits allow. A sqlite
    store commits each kind a request holds (params, metrics, a LoggedModel's metrics, tags) in a transaction of its
    own, each a wait for the disk (the bulk of a variant's logging time): one request writes each kind once."""
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
         tags: Mapping[str, str], model_id: str | None = None, at: tuple[int, int] | None = None,
         samples: Sequence[Metric] = ()) -> None:  # fmt: skip
    """log_batch within MLflow's per-request limits. NaN/inf metrics are not logged: a tag names them. The metrics
    go at step 0, now, or `at` (step, time stamp in ms: track_store.after_logged for a run that holds figures);
    `samples`, metrics with their own steps and time stamps (system metrics), go in the same requests.

    With `model_id`, the headline metrics (MODEL_METRIC_GROUPS) are also the LoggedModel's, shown on its page in
    the UI; the rest (every slice's figures) stay on the run: the store writes each model metric a second time."""
    step, now = at if at is not None else (0, now_ms())
    metrics = clean_keys(metrics)
    finite = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(v)}
    missing = sorted(k for k in metrics if k not in finite)
    all_tags = dict(tags) | ({"qbench.missing_metrics": tag_value(", ".join(missing))} if missing else {})
    entries = [Metric(k, v, now, step, model_id=model_id if k.startswith(MODEL_METRIC_GROUPS) else None)
               for k, v in finite.items()]  # fmt: skip
    for request in _batches([*entries, *samples], [Param(k, v) for k, v in clean_keys(params).items()],
                            [RunTag(k, v) for k, v in clean_keys(all_tags).items()]):  # fmt: skip
        client.log_batch(run_id, **request)


def log_gate(client: MlflowClient, children: Mapping[str, str], gate: GateReport | None) -> None:
    """Tag each variant's run (`children`: variant@backend -> run id) with the gate's verdict on it and its notes
    (qbench.track.content.gate_tags); the sweep's run has them in its sweep tags."""
    for key, run_id in children.items():
        _log(client, run_id, {}, {}, gate_tags(gate, key))


def artifact_paths(recipe: Recipe, artifacts: Sequence[Path]) -> list[Path]:
    """The recipe file and the given artifacts, each once; a missing one is an error."""
    paths = ([recipe.source] if recipe.source.is_file() else []) + [Path(a) for a in artifacts]
    unique = list({p.resolve(): p for p in paths}.values())
    for path in unique:
        if not path.exists():
            raise QbenchError(f"cannot log artifact {path}: no such file or folder")
    return unique


def _log_artifacts(client: MlflowClient, run_id: str, paths: Sequence[Path]) -> None:
    """The files (a folder: in a folder of its name) uploaded together (qbench.track.upload)."""
    upload_all(lambda file, folder: client.log_artifact(run_id, file, folder), files_to_upload(paths))


def _check_artifact_store(client: MlflowClient, uri: str, run_id: str, artifact_uri: str, recipe: Recipe) -> None:
    """Write the recipe into the new parent run before anything is measured: the client writes a server's artifacts
    itself unless the server proxies them, so a store it cannot reach (the server's disk, s3:// without boto3) would
    fail every model and report only after the whole sweep. A failure ends the run FAILED: a QbenchError."""
    if is_server(uri) and urllib.parse.urlparse(artifact_uri).scheme in ("", "file"):
        logger.warning("MLflow at %s stores artifacts in %s, a folder this machine writes itself: the MLflow UI shows "
                       "them only if the server reads the same folder (start it with --serve-artifacts to send "
                       "artifacts through the server)", without_password(uri), artifact_uri)  # fmt: skip
    try:
        if recipe.source.is_file():
            client.log_artifact(run_id, str(recipe.source))
        else:  # a recipe made in memory: its settings
            client.log_text(run_id, recipe.model_dump_json(indent=2), "recipe.json")
    except Exception as exc:  # noqa: BLE001 - artifact stores raise their own types (ImportError, botocore's, ...)
        with contextlib.suppress(Exception):
            client.set_tag(run_id, GATE_TAG, "not evaluated (sweep failed: artifact store not writable)")
            client.set_terminated(run_id, status="FAILED", end_time=now_ms())
        raise QbenchError(one_line(
            f"MLflow at {without_password(uri)} stores this sweep's artifacts in {artifact_uri}, which this machine "
            f"cannot write ({type(exc).__name__}: {one_line(exc, FAILURE_CHARS)}); start the server with "
            "--serve-artifacts, give this machine access to that store, or use --no-track")) from exc  # fmt: skip


def _system_sampler(first_step: int) -> SystemSampler | None:
    """The sweep's system metrics sampler, started (see qbench.track.system); None without psutil."""
    try:
        sampler = SystemSampler(first_step=first_step)
    except ImportError as exc:  # psutil missing
        logger.warning("no system metrics for the sweep run: %s (pip install psutil)", exc)
        return None
    sampler.start()
    return sampler


def _next_system_step(client: MlflowClient, run_id: str) -> int:
    """The step after the last system metric sample of a run taken over from an interrupted sweep."""
    history = client.get_metric_history(run_id, f"{SYSTEM_PREFIX}cpu_utilization_percentage")
    return max((m.step for m in history), default=-1) + 1


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
        self._earlier: dict[str, Run] = {}  # variant@backend -> child run of the interrupted sweep this one resumes
        self._earlier_params: dict[str, str] = {}  # the params a finished sweep this one resumes logged (immutable)
        self._taken_over: Run | None = None  # the parent run of the sweep this one resumes, as it was taken over
        self._datasets: DatasetInputs | None = None
        self._sampler: SystemSampler | None = None
        self._retries = contextlib.ExitStack()  # bounded HTTP retries while the sweep's runs are open
        self.failure: str | None = None

    @classmethod
    def open(cls, recipe: Recipe, run_name: str, *, run_dir: Path | None = None, data: SweepData | None = None,
             resumes: Path | None = None, system_metrics: bool = True) -> SweepTracker:  # fmt: skip
        """Create the sweep's parent run (RUNNING from now, sampling system metrics) in the recipe's experiment.

        `system_metrics` False: no sampling, for results logged after their sweep (`qbench track`), whose samples
        would describe the logging process, not the sweep.

        `run_dir` tags the parent with the sweep's run folder; `data` logs what it measures on as datasets.
        `resumes`, the run folder of the sweep this one resumes (interrupted, or finished with jobs failed for
        reasons outside their variants): its parent run, if it has one, is reopened instead (renamed, tagged with
        `run_dir`), keeping its children: a reused result's child is kept as logged, a job measured again replaces
        its child (see variant_finished).
        """
        retries = contextlib.ExitStack()
        retries.enter_context(bounded_retries(resolve_tracking_uri(recipe)))
        try:
            client, uri, experiment_id = open_experiment(recipe)
            tags = {"qbench.version": qbench.__version__, "qbench.recipe": recipe.name, GATE_TAG: _PENDING}
            if run_dir is not None:
                tags[RUN_DIR_TAG] = tag_value(str(run_dir.resolve()))
            try:
                earlier = _resumed_parent(client, experiment_id, resumes) if resumes is not None else None
                if earlier is None:
                    parent = client.create_run(experiment_id, run_name=run_name, tags=tags)
                else:
                    parent = earlier
                    tags[RESUMED_FROM_TAG] = tag_value(str(resumes.resolve()))  # type: ignore[union-attr]
                    client.update_run(parent.info.run_id, status="RUNNING", name=run_name)
                    _log(client, parent.info.run_id, {}, {}, tags)
            except (MlflowException, OSError) as exc:
                raise QbenchError(store_failure(uri, exc)) from exc
            _check_artifact_store(client, uri, parent.info.run_id, parent.info.artifact_uri, recipe)
        except BaseException:
            retries.close()
            raise
        tracker = cls(client, uri, experiment_id, parent.info.run_id)
        tracker._retries = retries
        if earlier is not None:
            tracker._taken_over, tracker._earlier_params = earlier, dict(earlier.data.params)
            tracker._earlier = tracker._mlflow(lambda: children_of(client, experiment_id, tracker.parent_id)) or {}
            logger.info("MLflow: resuming the interrupted sweep's run %s (%d variant runs logged there)",
                        tracker.parent_id, len(tracker._earlier))  # fmt: skip
        tracker._mlflow(lambda: _end_killed_sweeps(client, experiment_id, tracker.parent_id))
        first_step = tracker._mlflow(lambda: _next_system_step(client, tracker.parent_id)) if earlier is not None else 0
        tracker._sampler = _system_sampler(first_step or 0) if system_metrics else None
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
        replaced = self._earlier.pop(f"{variant}@{backend}", None)
        if replaced is not None:  # measured again: the interrupted sweep's run of it goes (the UI hides deleted runs)
            if replaced.info.status == "RUNNING":
                # its sweep was killed (SIGKILL, out of memory) before it could end it
                self._client.set_terminated(replaced.info.run_id, status="KILLED", end_time=end_time(replaced))
            self._client.delete_run(replaced.info.run_id)
        tags = {MLFLOW_PARENT_RUN_ID: self.parent_id, GATE_TAG: _PENDING, "qbench.variant": variant,
                "qbench.backend": backend}  # fmt: skip
        run = self._client.create_run(self._experiment_id, run_name=run_name(variant, backend), tags=tags)
        key = f"{variant}@{backend}"
        self._running[key] = self._children[key] = run.info.run_id
        return run.info.run_id

    def variant_finished(self, results: SweepResults, variant: VariantResult, *, reused: bool = False) -> None:
        """Log one variant's result, datasets and model into its child run (opened now if it was not); end the run.

        A result `reused` from the interrupted sweep this one resumes is in its child run already: that run is kept
        as it is (its model too, which the variant's other backends link to), nothing is logged twice."""
        self._mlflow(lambda: self._log_variant(results, variant, reused=reused))

    def _log_variant(self, results: SweepResults, variant: VariantResult, *, reused: bool,
                     verdict: Mapping[str, str] | None = None) -> None:  # fmt: skip
        """variant_finished's logging, raising the store's failure to the one `_mlflow` call around it: `close`
        logs results no child holds yet in its own call, which must stop at the first failure (a nested `_mlflow`
        would report it and end the runs, and `close` would go on to fail, report and end them again). `verdict`,
        the gate's tags where the gate came first (`close`): written with the variant's own tags, in one transaction.
        """
        earlier = self._earlier.get(variant.key)
        if reused and earlier is not None and earlier.info.status in ("FINISHED", "FAILED"):  # ended by this method
            del self._earlier[variant.key]
            self._children[variant.key] = earlier.info.run_id
            if earlier.outputs is not None and earlier.outputs.model_outputs:
                self._models.setdefault(variant.variant, earlier.outputs.model_outputs[0].model_id)
            return
        run_id = self._running.get(variant.key) or self._start_child(variant.variant, variant.backend)
        model_id = self._model_of(variant, run_id)
        if self._datasets is not None:
            self._client.log_inputs(run_id, datasets=self._datasets.variant(uses_calibration(variant)))
        _log(self._client, run_id, variant_metrics(results, variant), variant_params(results, variant),
             variant_tags(variant) | dict(verdict or {}), model_id=model_id)  # fmt: skip
        self._client.set_terminated(run_id, status="FINISHED" if variant.status == "ok" else "FAILED")
        del self._running[variant.key]  # only once ended: a store failing before that has `abort` end it FAILED

    def _model_of(self, variant: VariantResult, run_id: str) -> str | None:
        """The variant's LoggedModel, logged from this run the first time, linked to it afterwards; None if unmeasured
        or if its file is no longer the model measured (replaced after the sweep: `qbench track` of an edited run)."""
        if variant.status != "ok" or not variant.model_path or not Path(variant.model_path).is_file():
            return None
        if variant.model_sha256 and model_sha256(Path(variant.model_path)) != variant.model_sha256:
            return None
        model_id = self._models.get(variant.variant)
        if model_id is not None:
            link_variant_model(self._client, run_id, model_id)
            return model_id
        tags = {"qbench.variant": variant.variant, "qbench.precision": variant.precision}
        model_id = log_variant_model(self._client, self._experiment_id, run_id, Path(variant.model_path),
                                     name=logged_model_name(variant.variant), tags=tags,
                                     measured=variant.params)  # fmt: skip
        self._models[variant.variant] = model_id
        return model_id

    def _log_system_metrics(self) -> None:
        """Stop sampling system metrics and log the samples into the parent run (the only store write they make)."""
        if self._sampler is not None:
            samples, self._sampler = self._sampler.finish(), None
            for request in _batches(samples, [], []):
                self._client.log_batch(self.parent_id, **request)

    def _end_time(self) -> int:
        """The parent run's end: now, or its start where it was taken over from a machine whose clock is ahead."""
        return end_time(self._taken_over) if self._taken_over is not None else now_ms()

    def _release(self) -> None:
        """Stop sampling system metrics (if still sampling: a failed store) and lift the bounded retries."""
        try:
            if self._sampler is not None:
                self._sampler.finish()
                self._sampler = None
        finally:
            self._retries.close()

    def close(self, results: SweepResults, recipe: Recipe, gate: GateReport | None,
              artifacts: Sequence[Path]) -> str | None:  # fmt: skip
        """Log the sweep's params, metrics, gate verdicts and artifacts; end the parent FINISHED; returns its id
        (None when the store failed: see `failure`)."""
        logged_at_open = recipe.source.resolve() if recipe.source.is_file() else None  # see _check_artifact_store
        paths = [p for p in artifact_paths(recipe, artifacts) if p.resolve() != logged_at_open]

        def log() -> None:
            logged_before = {v.key: self._children[v.key] for v in results.variants if v.key in self._children}
            for variant in results.variants:
                if variant.key not in logged_before:  # results logged after the fact (log_sweep): with their verdict
                    self._log_variant(results, variant, reused=False, verdict=gate_tags(gate, variant.key))
            params, changed = _unlogged(sweep_params(results, recipe), self._earlier_params)
            at = after_logged(self._taken_over) if self._taken_over is not None else None  # after the first summary
            samples, self._sampler = (self._sampler.finish() if self._sampler is not None else []), None
            _log(self._client, self.parent_id, sweep_metrics(results, gate), params,
                 sweep_tags(results, gate) | changed,
                 at=at, samples=samples)  # fmt: skip
            log_gate(self._client, logged_before, gate)
            _log_artifacts(self._client, self.parent_id, paths)
            if results.ranges is not None:
                self._client.log_text(self.parent_id, to_json(results.ranges), "ranges.json")
            if results.search is not None:
                self._client.log_text(self.parent_id, to_json(results.search), "search.json")
            self._client.set_terminated(self.parent_id, status="FINISHED", end_time=self._end_time())

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
            *(lambda r=run_id: self._client.set_terminated(r, status=status, end_time=now_ms())
              for run_id in self._running.values()),
            *(lambda r=run_id: self._client.set_tag(r, GATE_TAG, verdict) for run_id in self._children.values()),
            lambda: self._client.set_tag(self.parent_id, GATE_TAG, verdict),
            lambda: self._client.set_terminated(self.parent_id, status=status, end_time=self._end_time()),
            self._log_system_metrics,  # last: the runs' ends matter more, and a failed store stops the attempt
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


def _unlogged(params: Mapping[str, str], logged: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The params not yet logged on a taken-over parent run, and as tags (`resumed.<param>`) those it logged with
    another value (the finished sweep ran on another machine): MLflow refuses to change a param."""
    changed = {f"resumed.{k}": tag_value(v) for k, v in params.items() if k in logged and logged[k] != v}
    if changed:
        logger.warning("MLflow: the resumed sweep's %s differ from the run it resumes; logged as tags resumed.<param>",
                       ", ".join(k.removeprefix("resumed.") for k in changed))  # fmt: skip
    return {k: v for k, v in params.items() if k not in logged}, changed


def _resumed_parent(client: MlflowClient, experiment_id: str, run_dir: Path) -> Run | None:
    """The newest parent run tagged with the run folder `run_dir`: an interrupted sweep's, or a finished one's whose
    jobs that failed for reasons outside their variants the resuming sweep runs again."""
    tag = f"tags.`{RUN_DIR_TAG}` = {search_literal(tag_value(str(run_dir.resolve())))}"
    found = client.search_runs([experiment_id], tag, order_by=["attributes.start_time DESC"], max_results=1)
    if not found or MLFLOW_PARENT_RUN_ID in found[0].data.tags:
        return None
    return found[0]


def _end_killed_sweeps(client: MlflowClient, experiment_id: str, keep: str) -> None:
    """End KILLED the sweep runs (and their children) still RUNNING whose sweep was killed (SIGKILL, out of memory:
    nothing could end them), as its run folder's marker tells (qbench.runs); `keep`, this sweep's own run."""
    running = client.search_runs([experiment_id], "attributes.status = 'RUNNING'")
    for run in running:
        folder = run.data.tags.get(RUN_DIR_TAG)
        if run.info.run_id == keep or MLFLOW_PARENT_RUN_ID in run.data.tags or not folder:
            continue
        described = describe_run(Path(folder))
        if described is None or not described.state.startswith("killed"):
            continue
        verdict = tag_value(f"not evaluated (sweep {described.state})")
        for ended in (*children_of(client, experiment_id, run.info.run_id).values(), run):
            client.set_tag(ended.info.run_id, GATE_TAG, verdict)
            if ended.info.status == "RUNNING":
                client.set_terminated(ended.info.run_id, status="KILLED", end_time=end_time(ended))
        logger.info("MLflow: ended the run %s of a killed sweep (%s) KILLED", run.info.run_id, folder)


def children_of(client: MlflowClient, experiment_id: str, parent_id: str) -> dict[str, Run]:
    """The child runs of `parent_id` by variant@backend (the newest where one has two)."""
    runs = client.search_runs([experiment_id], f"tags.`{MLFLOW_PARENT_RUN_ID}` = {search_literal(parent_id)}",
                              order_by=["attributes.start_time ASC"])  # fmt: skip
    return {f"{r.data.tags.get('qbench.variant')}@{r.data.tags.get('qbench.backend')}": r for r in runs}


def log_run(
    recipe: Recipe, run_name: str, *, params: Mapping[str, Any], metrics: Mapping[str, float], artifacts: Sequence[Path]
) -> str:
    """One stand-alone run in the recipe's experiment (e.g. `explain <variant>`): params, metrics, the recipe
    and `artifacts`; returns its id. MLflow problems become a QbenchError naming the store."""
    paths = artifact_paths(recipe, artifacts)
    with bounded_retries(resolve_tracking_uri(recipe)):
        client, uri, experiment_id = open_experiment(recipe)
        try:
            run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
            _log(client, run_id, metrics, {k: param_value(v) for k, v in params.items()}, {})
            _log_artifacts(client, run_id, paths)
            client.set_terminated(run_id, status="FINISHED")
        except (MlflowException, OSError) as exc:
            raise QbenchError(store_failure(uri, exc)) from exc
    return run_id
