"""Log a sweep to MLflow: one parent run per sweep, one nested child run per variant x backend.

Stores: the recipe's `tracking.uri`, else a sqlite file in the working
directory (MLflow 3's plain `file:` store refuses to run without an opt-in).
A sqlite store would put artifacts in ./mlruns of whatever directory the
process runs in, so qbench creates its experiments with an explicit artifact
location next to the database (`<db folder>/mlartifacts/<experiment>`);
`ui_command` serves the same root. Tracking servers (http/https) choose their own.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from mlflow.utils.validation import (
    MAX_ENTITY_KEY_LENGTH,
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VAL_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VAL_LENGTH,
)

from qbench.errors import QbenchError
from qbench.frontier import speedup
from qbench.gate import GateReport
from qbench.recipe import Recipe, StabilitySpec
from qbench.results import SliceMetrics, SweepResults, VariantResult, non_default_session_options, to_json
from qbench.slo import serving_metrics

T = TypeVar("T")

_ARTIFACT_FOLDER = "mlartifacts"
_DISALLOWED = re.compile(r"[^\w\-. :/]")  # MLflow keys: alphanumerics, _ - . space : /
_GATE_VERDICTS = {0: "pass", 1: "breach", 2: "unusable"}
_DESCRIPTION_TAG = "mlflow.note.content"  # shown as the run's description in the MLflow UI


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


def experiment_name(recipe: Recipe) -> str:
    return recipe.tracking.experiment or recipe.name


def _experiment_id(client: MlflowClient, name: str, uri: str) -> str:
    existing = client.get_experiment_by_name(name)
    if existing is None:
        root = artifact_root(uri)
        folder = re.sub(r"[^\w.-]", "_", name)
        return client.create_experiment(name, artifact_location=f"{root}/{folder}" if root else None)
    if existing.lifecycle_stage == "deleted":
        raise QbenchError(
            f"MLflow experiment {name!r} in {uri} is deleted: restore it in the MLflow UI, "
            "or set tracking.experiment in the recipe to another name"
        )
    return existing.experiment_id


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


# -- names and values -----------------------------------------------------------------------------


def sanitise_name(name: str) -> str:
    """A metric/param key MLflow accepts: allowed characters only, and a path that normalises to itself."""
    parts = [_DISALLOWED.sub("_", part) or "_" for part in name.split("/")]
    key = "/".join("_" if set(part) <= {"."} else part for part in parts)
    return ("_" + key if key.startswith("..") else key)[:MAX_ENTITY_KEY_LENGTH].rstrip("/")


def unique_names(names: Iterable[str], clean: Callable[[str], str] = sanitise_name) -> dict[str, str]:
    """Map each name to its cleaned form; names that clean to the same key get _2, _3... suffixes."""
    mapping: dict[str, str] = {}
    taken: set[str] = set()
    for name in dict.fromkeys(names):
        base = candidate = clean(name)
        count = 1
        while candidate in taken:
            count += 1
            candidate = f"{base}_{count}"
        mapping[name] = candidate
        taken.add(candidate)
    return mapping


def _slice_segment(name: str) -> str:
    """A slice name as one path segment of a metric key (a '/' in the name would make a new level)."""
    return sanitise_name(name.replace("/", "_"))[:120]


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text[:MAX_PARAM_VAL_LENGTH]


def _tag_value(value: str) -> str:
    return value[:MAX_TAG_VAL_LENGTH]


# -- what gets logged -----------------------------------------------------------------------------


def _latency_metrics(results: SweepResults, variant: VariantResult) -> dict[str, float]:
    latency = variant.latency
    if latency is None:
        return {}
    metrics = {
        "cold_start_ms": latency.session_create_ms + latency.first_run_ms,
        "session_create_ms": latency.session_create_ms,
        "first_run_ms": latency.first_run_ms,
    }
    for p in latency.points:
        bs = p.batch_size
        metrics |= {f"latency_p50_ms_b{bs}": p.p50_ms, f"latency_p95_ms_b{bs}": p.p95_ms,
                    f"latency_p99_ms_b{bs}": p.p99_ms, f"latency_mean_ms_b{bs}": p.mean_ms,
                    f"throughput_b{bs}": p.items_per_s, f"speedup_b{bs}": speedup(results, variant, bs),
                    f"latency.b{bs}.spread": p.spread, f"latency.b{bs}.iqr_ratio": p.iqr_ratio}  # fmt: skip
        if p.stable is not None:  # None: fixed-count timing, not judged
            metrics[f"latency.b{bs}.stable"] = float(p.stable)
    return metrics


def _scope_metrics(scope: SliceMetrics, prefix: str) -> dict[str, float]:
    metrics = {f"{prefix}{name}": value for name, value in scope.metrics.items()}
    return metrics | {f"{prefix}drop_{name}": value for name, value in scope.drops.items()}


def _accuracy_metrics(variant: VariantResult) -> dict[str, float]:
    accuracy = variant.accuracy
    if accuracy is None:
        return {}
    metrics = {"eval_rows": float(accuracy.rows), "nonfinite_outputs": float(accuracy.nonfinite_outputs)}
    metrics |= _scope_metrics(accuracy.overall, "")
    segments = unique_names((s.name for s in accuracy.slices), _slice_segment)
    for scope in accuracy.slices:
        prefix = f"slice/{segments[scope.name]}/"
        metrics |= _scope_metrics(scope, prefix) | {f"{prefix}size": float(scope.size)}
    return metrics


def _variant_metrics(results: SweepResults, variant: VariantResult) -> dict[str, float]:
    metrics: dict[str, float] = {}
    if variant.model_bytes is not None:
        metrics["model_mb"] = variant.model_bytes / 1e6
    if variant.build_seconds is not None:
        metrics["build_seconds"] = variant.build_seconds
    return metrics | _latency_metrics(results, variant) | _accuracy_metrics(variant) | serving_metrics(variant)


def _uses_calibration(variant: VariantResult) -> bool:
    """Static int8 and fp8 variants are calibrated; dynamic int8 and float casts are not."""
    return variant.precision in ("int8", "fp8") and variant.params.get("calibrator") != "dynamic"


def _variant_params(results: SweepResults, variant: VariantResult) -> dict[str, str]:
    keys = unique_names(variant.params)
    params = {keys[k]: _param_value(v) for k, v in variant.params.items()}
    params |= {"variant": variant.variant, "precision": variant.precision, "backend": variant.backend,
               "fidelity.accuracy": variant.fidelity.accuracy, "fidelity.latency": variant.fidelity.latency}  # fmt: skip
    if variant.fidelity.method:
        params["fidelity.method"] = _param_value(variant.fidelity.method)
    if variant.evaluated_model_path:
        params["evaluated_model_path"] = _param_value(variant.evaluated_model_path)
    calibration = results.calibration
    if calibration is not None and _uses_calibration(variant):
        params |= {"calibration.samples": str(calibration.size), "calibration.seed": str(calibration.seed),
                   "calibration.row_ids_sha256": calibration.row_ids_sha256}  # fmt: skip
    return params


def _variant_tags(variant: VariantResult, gate: GateReport | None) -> dict[str, str]:
    tags = {
        "qbench.status": variant.status,
        "qbench.gate": gate.status_of(variant.variant, variant.backend) if gate else "not evaluated",
        "qbench.variant": variant.variant,
        "qbench.backend": variant.backend,
        "qbench.precision": variant.precision,
        "qbench.fidelity": "emulated" if variant.fidelity.emulated else variant.fidelity.accuracy,
    }
    if variant.status != "ok":
        tags["qbench.error"] = _tag_value(variant.error or "no error message")
    needed = non_default_session_options(variant.params)
    if needed:
        tags["qbench.session_options"] = ", ".join(f"{k}={v}" for k, v in needed.items()) + " (not ORT's defaults)"
    if variant.notes:
        tags["qbench.notes"] = _tag_value(" | ".join(variant.notes))
    return tags


def _stability_param(stability: StabilitySpec | None) -> str:
    """The adaptive-timing settings in one line ('off' for fixed-count timing)."""
    if stability is None:
        return "off"
    return ",".join(f"{name}={value}" for name, value in stability.model_dump().items())


def _sweep_params(results: SweepResults, recipe: Recipe) -> dict[str, str]:
    gate, latency, env = recipe.gate, recipe.latency, results.environment
    params = {
        "recipe.name": str(results.recipe.get("name", recipe.name)),
        "recipe.sha256": str(results.recipe.get("sha256") or recipe.sha256),
        "task": str(results.recipe.get("task", recipe.task)),
        "reference": results.reference,
        "backends": ",".join(results.backends()),
        "gate.metric": gate.metric,
        "gate.max_drop": str(gate.max_drop),
        "gate.max_slice_drop": str(gate.max_slice_drop),
        "gate.applies_to": ",".join(gate.applies_to),
        "gate.min_slice_size": str(gate.min_slice_size),
        "evaluation.rows": str(results.evaluation_rows),
        "latency.batch_sizes": ",".join(str(b) for b in latency.batch_sizes),
        "latency.warmup": str(latency.warmup),
        "latency.iterations": str(latency.iterations),
        "latency.threads": str(latency.threads or "default"),
        "latency.stability": _stability_param(latency.stability),
        "env.cpu": str(env.get("cpu", "unknown")),
        "env.cpu_flags": ",".join(env.get("cpu_flags", [])),
    }
    params |= {f"env.{name}": str(version) for name, version in env.get("packages", {}).items()}
    if results.calibration is not None:
        c = results.calibration
        params |= {
            "calibration.size": str(c.size),
            "calibration.seed": str(c.seed),
            "calibration.stratify_by": str(c.stratify_by),
            "calibration.row_ids_sha256": c.row_ids_sha256,
        }
    return {sanitise_name(k): _param_value(v) for k, v in params.items()}


def _sweep_tags(results: SweepResults, gate: GateReport | None) -> dict[str, str]:
    from qbench.report import frontier_text

    verdict = _GATE_VERDICTS.get(gate.exit_code, "unusable") if gate else "not evaluated"
    return {
        "qbench.version": results.qbench_version,
        "qbench.gate": verdict,
        "qbench.recipe": str(results.recipe.get("name", "")),
        "qbench.created_at": results.created_at,
        _DESCRIPTION_TAG: _tag_value(frontier_text(results)),
    }


def _sweep_metrics(results: SweepResults, gate: GateReport | None) -> dict[str, float]:
    metrics = {f"time/{sanitise_name(phase)}_s": seconds for phase, seconds in results.timings.items()}
    metrics["variants_ok"] = float(sum(v.status == "ok" for v in results.variants))
    metrics["variants_failed"] = float(sum(v.status != "ok" for v in results.variants))
    if gate is not None:
        metrics["gate_breaches"] = float(len(gate.breaches))
    for what, counts in results.dropped_nonfinite.items():
        metrics |= {f"dropped_nonfinite/{what}/{sanitise_name(column)}": float(n) for column, n in counts.items()}
    return metrics | _range_metrics(results)


def _range_metrics(results: SweepResults) -> dict[str, float]:
    """range.<slice>.<format>_overflow_tensors for raw format limits, range.<variant>.<slice>.clipped_share."""
    analysis = results.ranges
    if analysis is None:
        return {}
    segments = unique_names(analysis.abs_max, _slice_segment)
    metrics = {f"range.{segments[scope]}.{check.format}_overflow_tensors": float(len(peaks))
               for check in analysis.limits if check.scaled_by is None for scope, peaks in check.over.items()}  # fmt: skip
    metrics |= {f"range.{sanitise_name(r.variant)}.{segments[r.scope]}.clipped_share": r.share for r in analysis.clipping}
    return metrics


# -- logging --------------------------------------------------------------------------------------


def _chunks(items: Sequence[T], size: int) -> Iterable[Sequence[T]]:
    return (items[i : i + size] for i in range(0, len(items), size))


def _log(client: MlflowClient, run_id: str, metrics: Mapping[str, float], params: Mapping[str, str],
         tags: Mapping[str, str]) -> None:  # fmt: skip
    """log_batch within MLflow's per-request limits. NaN/inf metrics are not logged: a tag names them."""
    now = int(time.time() * 1000)
    finite = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(v)}
    missing = sorted(k for k in metrics if k not in finite)
    all_tags = dict(tags) | ({"qbench.missing_metrics": _tag_value(", ".join(missing))} if missing else {})
    for chunk in _chunks([Metric(k, v, now, 0) for k, v in finite.items()], MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=chunk)
    for chunk in _chunks([Param(k, v) for k, v in params.items()], MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, params=chunk)
    for chunk in _chunks([RunTag(k, v) for k, v in all_tags.items()], MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, tags=chunk)


def _artifact_paths(recipe: Recipe, artifacts: Sequence[Path]) -> list[Path]:
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


def _log_variant(client: MlflowClient, experiment_id: str, parent_id: str, results: SweepResults,
                 variant: VariantResult, gate: GateReport | None) -> str:  # fmt: skip
    run = client.create_run(experiment_id, run_name=variant.key, tags={MLFLOW_PARENT_RUN_ID: parent_id})
    run_id = run.info.run_id
    metrics, params = _variant_metrics(results, variant), _variant_params(results, variant)
    _log(client, run_id, metrics, params, _variant_tags(variant, gate))
    client.set_terminated(run_id, status="FINISHED" if variant.status == "ok" else "FAILED")
    return run_id


def log_sweep(results: SweepResults, recipe: Recipe, *, gate: GateReport | None, artifacts: Sequence[Path]) -> str:
    """Log the sweep as a parent run with one child run per variant x backend; returns the parent run id.

    MLflow problems (unreachable server, rejected value) become a QbenchError naming the store.
    """
    uri = resolve_tracking_uri(recipe)
    paths = _artifact_paths(recipe, artifacts)
    try:
        client = MlflowClient(tracking_uri=uri)
        experiment_id = _experiment_id(client, experiment_name(recipe), uri)
        name = f"{results.recipe.get('name', recipe.name)} sweep {results.created_at}"
        parent_id = client.create_run(experiment_id, run_name=name).info.run_id
    except MlflowException as exc:
        raise QbenchError(f"MLflow tracking at {uri} failed: {exc.message}") from exc
    try:
        metrics, params = _sweep_metrics(results, gate), _sweep_params(results, recipe)
        _log(client, parent_id, metrics, params, _sweep_tags(results, gate))
        for variant in results.variants:
            _log_variant(client, experiment_id, parent_id, results, variant, gate)
        _log_artifacts(client, parent_id, paths)
        if results.ranges is not None:
            client.log_text(parent_id, to_json(results.ranges), "ranges.json")
    except MlflowException as exc:
        with contextlib.suppress(MlflowException):  # the store may be the thing that failed
            client.set_terminated(parent_id, status="FAILED")
        raise QbenchError(f"MLflow tracking at {uri} failed: {exc.message}") from exc
    client.set_terminated(parent_id, status="FINISHED")
    return parent_id


def log_run(
    recipe: Recipe, run_name: str, *, params: Mapping[str, Any], metrics: Mapping[str, float], artifacts: Sequence[Path]
) -> str:
    """One stand-alone run in the recipe's experiment (e.g. `explain <variant>`): params, metrics, the recipe
    and `artifacts`; returns its id. MLflow problems become a QbenchError naming the store."""
    uri = resolve_tracking_uri(recipe)
    paths = _artifact_paths(recipe, artifacts)
    try:
        client = MlflowClient(tracking_uri=uri)
        run_id = client.create_run(_experiment_id(client, experiment_name(recipe), uri), run_name=run_name).info.run_id
        _log(client, run_id, metrics, {sanitise_name(k): _param_value(v) for k, v in params.items()}, {})
        _log_artifacts(client, run_id, paths)
        client.set_terminated(run_id, status="FINISHED")
    except MlflowException as exc:
        raise QbenchError(f"MLflow tracking at {uri} failed: {exc.message}") from exc
    return run_id
