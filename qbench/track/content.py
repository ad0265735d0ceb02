"""What a sweep logs to MLflow: keys MLflow accepts, and the metrics, params and tags of a sweep and its variants."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from mlflow.utils.validation import (
    MAX_ENTITY_KEY_LENGTH,
    MAX_PARAM_VAL_LENGTH,
    MAX_TAG_VAL_LENGTH,
)

from qbench.frontier.pareto import gate_tolerances, speedup, timed_on
from qbench.gate.evaluate import GateReport, problem_owner
from qbench.gate.report import check_line, problem_line, summary_line
from qbench.gate.report import verdict as gate_verdict
from qbench.recipe.spec import GateSpec, Recipe, StabilitySpec
from qbench.results.schema import (
    SliceMetrics,
    SweepResults,
    VariantResult,
    non_default_session_options,
)
from qbench.serving import serving_metrics

_DISALLOWED = re.compile(r"[^\w\-. :/]")  # MLflow keys: alphanumerics, _ - . space : /
GATE_TAG = "qbench.gate"  # pass | breach | interrupted | unusable on the sweep; pass | fail | not gated on a variant
GATE_NOTES_TAG = "qbench.gate.notes"  # the gate's notes that concern the run ('none' when none)
GATE_REASONS_TAG = "qbench.gate.reasons"  # why the verdict is no pass: breaches and problems ('none' on a pass)
CHEAPEST_TAG = "qbench.cheapest"  # the cheapest variant meeting accuracy and the SLO, as the report names it
_CHEAPEST_LINE = "cheapest meeting accuracy and SLO: "
_NOTE_SEPARATOR = " | "
_DESCRIPTION_TAG = "mlflow.note.content"  # shown as the run's description in the MLflow UI
_V = TypeVar("_V")


# -- names and values -----------------------------------------------------------------------------


def sanitise_name(name: str) -> str:
    """A metric/param key MLflow accepts: allowed characters only, and a path that normalises to itself."""
    parts = [_DISALLOWED.sub("_", part) or "_" for part in name.split("/")]
    key = "/".join("_" if set(part) <= {"."} else part for part in parts)
    return ("_" + key if key.startswith("..") else key)[:MAX_ENTITY_KEY_LENGTH].rstrip("/")


def unique_names(names: Iterable[str], clean: Callable[[str], str] = sanitise_name) -> dict[str, str]:
    """Map each name to its cleaned form. Names whose keys are the same but for case (`Gate=X` and `gate=x`, `Logits`
    and `logits`) collide too: a store that compares keys without case (MLflow on MySQL) would file both figures
    under one key. Colliding names are told apart by a digest of the name itself, not by their order (which changes
    with the data): a slice keeps its key from sweep to sweep, and of the colliding names already clean, the first in
    code-point order keeps the bare key (`Logits` beside `logits`): each kept its key before case counted, and with
    neither keeping it, both changed, and a lone `Logits` changed key in a sweep whose data also held `logits`."""
    cleaned = {name: clean(name) for name in dict.fromkeys(names)}
    counts = Counter(key.casefold() for key in cleaned.values())
    bare: dict[str, str] = {}  # the key without case -> the name keeping the bare key
    for name, key in sorted(cleaned.items()):
        if name == key or counts[key.casefold()] == 1:
            bare.setdefault(key.casefold(), name)
    mapping = {}
    for name, key in cleaned.items():
        if bare.get(key.casefold()) != name:
            digest = hashlib.sha256(name.encode()).hexdigest()[:6]
            key = f"{key[: MAX_ENTITY_KEY_LENGTH - 8]}_{digest}"
        mapping[name] = key
    return mapping


def clean_keys(entries: Mapping[str, _V]) -> dict[str, _V]:
    """`entries` under keys MLflow accepts: every metric, param and tag key passes here on its way to the store, so a
    key built from a name in the model or the data (an output '/encoder/Softmax_output_0' in 'output/metric') is
    cleaned however it was built (unique_names: names that clean alike keep a key each)."""
    keys = unique_names(entries)
    return {keys[name]: value for name, value in entries.items()}


def _slice_segment(name: str) -> str:
    """A slice name as one path segment of a metric key (a '/' in the name would make a new level)."""
    return sanitise_name(name.replace("/", "_"))[:120]


SLICE_KEY_PARAM = "slice_key"  # slice_key/<segment> = the slice's name, where the key does not spell it


def slice_segments(names: Iterable[str]) -> dict[str, str]:
    """Each slice name's key segment: `_slice_segment`, told apart by a digest where names clean alike."""
    return unique_names(names, _slice_segment)


def slice_key_params(segments: Mapping[str, str]) -> dict[str, str]:
    """`slice_key/<segment>` = the slice's name, for each segment that does not spell its name with '=' written '_'
    (`grp=a/b` as `grp_a_b`, an emoji as `_`, names cleaning alike told apart by a digest): the MLflow UI shows which
    slice a key such as `slice/grp___1a8b3d/accuracy` stands for, where only results.json said so."""
    return {f"{SLICE_KEY_PARAM}/{segment}": param_value(name) for name, segment in segments.items()
            if segment != name.replace("=", "_")}  # fmt: skip


def fit_value(value: str, limit: int) -> str:
    """`value` within MLflow's `limit` characters, an ellipsis marking a cut (a cut JSON list would otherwise read as
    the whole of it in the UI)."""
    return value if len(value) <= limit else value[: limit - 1] + "…"


def param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return fit_value(text, MAX_PARAM_VAL_LENGTH)


def tag_value(value: str) -> str:
    return fit_value(value, MAX_TAG_VAL_LENGTH)


# Backend name prefixes shortened in run names; a backend not listed keeps its whole name.
_BACKEND_ABBREVIATIONS = (("onnxruntime", "ort"), ("tensorrt", "trt"))


def short_backend(backend: str) -> str:
    """onnxruntime-cpu -> ort-cpu, onnxruntime-tensorrt -> ort-trt, tensorrt -> trt, torch-cpu -> torch-cpu."""
    for long, short in _BACKEND_ABBREVIATIONS:
        backend = backend.replace(long, short)
    return backend


def run_name(variant: str, backend: str) -> str:
    """A child run's name in the MLflow UI: `int8_minmax · ort-cpu` (tags keep the full names)."""
    return f"{variant} · {short_backend(backend)}"


# -- what gets logged -----------------------------------------------------------------------------


def _latency_metrics(results: SweepResults, variant: VariantResult) -> dict[str, float]:
    """lat/<figure>/b<N> for every batch size, speedup/b<N>, throughput/b<N> and the cold start under lat/."""
    latency = variant.latency
    if latency is None:
        return {}
    metrics = {
        "lat/cold_start_ms": latency.session_create_ms + latency.first_run_ms,
        "lat/session_create_ms": latency.session_create_ms,
        "lat/first_run_ms": latency.first_run_ms,
    }
    for p in latency.points:
        b = f"b{p.batch_size}"
        metrics |= {f"lat/p50_ms/{b}": p.p50_ms, f"lat/p95_ms/{b}": p.p95_ms, f"lat/p99_ms/{b}": p.p99_ms,
                    f"lat/mean_ms/{b}": p.mean_ms, f"throughput/{b}": p.items_per_s,
                    f"speedup/{b}": speedup(results, variant, p.batch_size),
                    f"lat/spread/{b}": p.spread, f"lat/iqr_ratio/{b}": p.iqr_ratio}  # fmt: skip
        if p.stable is not None:  # None: fixed-count timing, not judged
            metrics[f"lat/stable/{b}"] = float(p.stable)
    return metrics


def _headline_accuracy(results: SweepResults, variant: VariantResult) -> dict[str, float]:
    """acc/overall, acc/drop and acc/worst_slice_drop: the gate metric (accuracy, cosine, ...) as the gate sees it.

    The worst slice is the largest drop among slices the gate judges (at least gate.min_slice_size rows).
    """
    accuracy, metric = variant.accuracy, results.gate_metric
    if accuracy is None or metric not in accuracy.overall.metrics:
        return {}
    headline = {"acc/overall": accuracy.overall.metrics[metric]}
    if metric in accuracy.overall.drops:
        headline["acc/drop"] = accuracy.overall.drops[metric]
    min_size = int(results.recipe.get("gate", {}).get("min_slice_size", 0))
    drops = [s.drops[metric] for s in accuracy.slices if s.size >= min_size and metric in s.drops]
    finite = [d for d in drops if math.isfinite(d)]
    if finite:
        headline["acc/worst_slice_drop"] = max(finite)
    return headline


def _scope_metrics(scope: SliceMetrics, prefix: str) -> dict[str, float]:
    """The scope's metrics, their drops, and for a rate counted over other units than the scope's rows (sampled
    query rows, scored tokens) how many: count_<metric>."""
    metrics = {f"{prefix}{name}": value for name, value in scope.metrics.items()}
    metrics |= {f"{prefix}count_{name}": float(count) for name, count in scope.denominators.items()}
    return metrics | {f"{prefix}drop_{name}": value for name, value in scope.drops.items()}


def _accuracy_metrics(variant: VariantResult) -> dict[str, float]:
    accuracy = variant.accuracy
    if accuracy is None:
        return {}
    metrics = {"eval_rows": float(accuracy.rows), "nonfinite_outputs": float(accuracy.nonfinite_outputs)}
    metrics |= _scope_metrics(accuracy.overall, "")
    segments = slice_segments(s.name for s in accuracy.slices)
    for scope in accuracy.slices:
        prefix = f"slice/{segments[scope.name]}/"
        metrics |= _scope_metrics(scope, prefix) | {f"{prefix}size": float(scope.size)}
    return metrics


def variant_metrics(results: SweepResults, variant: VariantResult) -> dict[str, float]:
    metrics: dict[str, float] = {}
    if variant.model_bytes is not None:
        metrics["model_mb"] = variant.model_bytes / 1e6
    if variant.build_seconds is not None:
        metrics["build_seconds"] = variant.build_seconds
    return (metrics | _headline_accuracy(results, variant) | _latency_metrics(results, variant)
            | _accuracy_metrics(variant) | serving_metrics(variant))


def uses_calibration(variant: VariantResult) -> bool:
    """Whether the variant as its backend ran it was calibrated: its builder counted rows it calibrated on, or (a
    result without that count) named a calibrator other than dynamic. Dynamic int8, float casts and a torch form the
    sweep derived from the recipe's module (its results carry neither) were calibrated on nothing."""
    rows = variant.params.get("calibration_rows")
    calibrated = bool(rows) if rows is not None else variant.params.get("calibrator", "dynamic") != "dynamic"
    return variant.precision in ("int8", "fp8") and calibrated


def variant_params(results: SweepResults, variant: VariantResult) -> dict[str, str]:
    keys = unique_names(variant.params)
    params = {keys[k]: param_value(v) for k, v in variant.params.items()}
    params |= {"variant": variant.variant, "precision": variant.precision, "backend": variant.backend,
               "fidelity.accuracy": variant.fidelity.accuracy,
               "fidelity.latency": variant.fidelity.latency}  # fmt: skip
    if variant.fidelity.method:
        params["fidelity.method"] = param_value(variant.fidelity.method)
    if variant.evaluated_model_path:
        params["evaluated_model_path"] = param_value(variant.evaluated_model_path)
    if variant.accuracy is not None:
        params |= slice_key_params(slice_segments(s.name for s in variant.accuracy.slices))
    calibration = results.calibration
    if calibration is not None and uses_calibration(variant):
        params |= {"calibration.samples": str(calibration.size), "calibration.seed": str(calibration.seed),
                   "calibration.row_ids_sha256": calibration.row_ids_sha256}  # fmt: skip
    return params


def variant_tags(variant: VariantResult) -> dict[str, str]:
    """What a variant's run is tagged with when it finishes (its gate verdict comes when the sweep ends)."""
    tags = {
        "qbench.status": variant.status,
        "qbench.variant": variant.variant,
        "qbench.backend": variant.backend,
        "qbench.precision": variant.precision,
        "qbench.fidelity": "emulated" if variant.fidelity.emulated else variant.fidelity.accuracy,
    }
    if variant.status != "ok":
        tags["qbench.error"] = tag_value(variant.error or "no error message")
    needed = non_default_session_options(variant.params)
    if needed:
        tags["qbench.session_options"] = ", ".join(f"{k}={v}" for k, v in needed.items()) + " (not ORT's defaults)"
    if variant.notes:
        tags["qbench.notes"] = tag_value(" | ".join(variant.notes))
    if timed_on(variant):  # the kind of machine its latency was timed on: runs compare only within one kind
        tags["qbench.timed_on"] = tag_value(timed_on(variant))
    serving = variant.serving
    if serving is not None and serving.budget_ms is not None and serving.simulated_requests:
        settled = "not settled" if serving.simulated_undecided else "settled"
        claimed_low = ": the highest rate within the budget is claimed low" * serving.simulated_undecided
        tags["qbench.load_search"] = f"{settled} at {serving.simulated_requests:,} simulated requests{claimed_low}"
    return tags


def _stability_param(stability: StabilitySpec | None) -> str:
    """The adaptive-timing settings in one line ('off' for fixed-count timing)."""
    if stability is None:
        return "off"
    return ",".join(f"{name}={value}" for name, value in stability.model_dump().items())


def _tolerance_params(results: SweepResults, gate: GateSpec) -> dict[str, str]:
    """The gate's tolerances as judged (on the first backend with a finite FP32 figure), and how they were formed
    when they are shares of FP32's figure; with several gated metrics (gate.metrics), each further one's as
    `gate.<metric>.max_drop` and so on."""
    specs = gate.per_metric()
    params = _one_metric_tolerances(results, specs[0])
    for one in specs[1:]:
        params |= {key.replace("gate.", f"gate.{one.metric}.", 1): value
                   for key, value in _one_metric_tolerances(results, one).items()}  # fmt: skip
    return params


def _one_metric_tolerances(results: SweepResults, gate: GateSpec) -> dict[str, str]:
    """`gate`'s (one metric's) tolerances against FP32's figure of its own metric: the recipe's gate.metric may not
    be the one the sweep gated (results.gate_metric), as the gate section leaves results current."""
    resolved = gate_tolerances(results, gate, gate.metric)
    if resolved is None:
        unformed = "not formed (FP32's figure is 0 or not finite: see the gate)"
        return {"gate.max_drop": unformed, "gate.max_slice_drop": unformed, "gate.tolerance": gate.tolerance}
    tolerances = resolved[1]
    relative = tolerances.slice_drops is not None  # a share of FP32's figure on each slice
    per_slice = f"{tolerances.max_slice_drop * 100:g} % of FP32's figure on each slice" if relative else \
        f"{tolerances.max_slice_drop:.6g}"
    return {"gate.max_drop": f"{tolerances.max_drop:.6g}", "gate.max_slice_drop": per_slice,
            "gate.tolerance": tolerances.basis or "absolute"}


def sweep_params(results: SweepResults, recipe: Recipe) -> dict[str, str]:
    gate, latency, env = recipe.gate, recipe.latency, results.environment
    params = {
        "recipe.name": str(results.recipe.get("name", recipe.name)),
        "recipe.sha256": str(results.recipe.get("sha256") or recipe.sha256),
        "task": str(results.recipe.get("task", recipe.task)),
        "reference": results.reference,
        "backends": ",".join(results.backends()),
        "gate.metric": gate.metric,
        **({"gate.metrics": ",".join(gate.gated_metrics)} if gate.metrics else {}),
        **_tolerance_params(results, gate),
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
    return {sanitise_name(k): param_value(v) for k, v in params.items()} | slice_key_params(_sweep_segments(results))


def gate_tags(gate: GateReport | None, key: str | None = None) -> dict[str, str]:
    """The gate's verdict, its notes and why it is no pass, as tags: on the sweep's run (`key` None) the whole
    report's (its summary line as the reason); on a variant's run (`key`, variant@backend) what concerns that
    variant: its own notes, breaches and problems, and those about the results as a whole where the gate judged it.
    A user comparing variants in the MLflow UI sees there what the report says about each one. Every tag is written
    every time ('none' for nothing), so a later `qbench gate` leaves no tag of an earlier verdict behind."""
    if gate is None:
        return {GATE_TAG: "not evaluated"}
    if key is None:
        notes, reasons = list(gate.notes), [] if gate.exit_code == 0 else [summary_line(gate)]
        verdict = gate_verdict(gate)  # pass, breach, interrupted (a signal ended the command) or unusable
    else:
        variant, _, backend = key.rpartition("@")
        verdict = gate.status_of(variant, backend)
        judged = key in gate.gated

        def about(text: str) -> bool:  # a variant not gated: only what names it
            return problem_owner(gate.gated, text) in (key, None) if judged else problem_owner((key,), text) == key

        notes = [n for n in gate.notes if about(n)]
        reasons = [check_line(c) for c in gate.breaches if f"{c.variant}@{c.backend}" == key]
        reasons += [problem_line(p) for p in gate.problems if about(p)]
        reasons += [line for on, line in gate.fp32_differs().items() if on == backend]  # its reference is wrong
        if variant != gate.reference:  # or unjudged (FP32's own problems are listed above as its own)
            reasons += [problem_line(p) for p in gate.fp32_problems(backend)]
    return {GATE_TAG: verdict, GATE_NOTES_TAG: tag_value(_NOTE_SEPARATOR.join(notes) or "none"),
            GATE_REASONS_TAG: tag_value(_NOTE_SEPARATOR.join(reasons) or "none")}


def sweep_gate_tags(results: SweepResults, gate: GateReport | None) -> dict[str, str]:
    """The sweep run's gate tags (gate_tags) and, for results with a latency budget, the cheapest variant meeting
    accuracy and the SLO as report.md names it (it follows from the verdict: a later `qbench gate` rewrites both)."""
    from qbench.report.serving import slo_lines

    lines = [line for line in slo_lines(results, gate) if line.startswith(_CHEAPEST_LINE)] if gate is not None else []
    return gate_tags(gate) | {CHEAPEST_TAG: tag_value(line.removeprefix(_CHEAPEST_LINE)) for line in lines}


def sweep_tags(results: SweepResults, gate: GateReport | None) -> dict[str, str]:
    from qbench.report.frontier import frontier_text

    return {
        "qbench.version": results.qbench_version,
        **sweep_gate_tags(results, gate),
        "qbench.recipe": str(results.recipe.get("name", "")),
        "qbench.created_at": results.created_at,
        _DESCRIPTION_TAG: tag_value(frontier_text(results, gate.fp32_differs() if gate else None)),
    }


def sweep_metrics(results: SweepResults, gate: GateReport | None) -> dict[str, float]:
    metrics = {f"time/{sanitise_name(phase)}_s": seconds for phase, seconds in results.timings.items()}
    metrics["variants_ok"] = float(sum(v.status == "ok" for v in results.variants))
    metrics["variants_failed"] = float(sum(v.status != "ok" for v in results.variants))
    if gate is not None:
        metrics["gate_breaches"] = float(len(gate.breaches))
    for kind, figures in (("dropped_nonfinite", results.dropped_nonfinite), ("kept_nonfinite", results.kept_nonfinite)):
        for what, counts in figures.items():
            columns = unique_names(counts, _slice_segment)  # columns "a,b" and "a_b" keep a figure each
            metrics |= {f"{kind}/{_slice_segment(what)}/{columns[column]}": float(n) for column, n in counts.items()}
    scopes = _sweep_segments(results)
    metrics |= {f"distinct_inputs/{scopes[scope]}": float(n) for scope, n in results.distinct_inputs.items()}
    return metrics | _range_metrics(results, scopes) | _search_metrics(results)


def _sweep_segments(results: SweepResults) -> dict[str, str]:
    """The key segments of the slices the sweep's run logs figures of (the range analysis', those whose rows repeat
    an input): one mapping, so that a `slice_key/` param names one slice."""
    ranges = results.ranges.abs_max if results.ranges is not None else {}
    return slice_segments([*results.distinct_inputs, *ranges])


def _search_metrics(results: SweepResults) -> dict[str, float]:
    """search/seconds, search/candidates, search/passed (1 or 0) and, per candidate i, search/<i>/speedup,
    search/<i>/drop (NaN-free only: MLflow refuses nothing, but the UI plots finite values)."""
    search = results.search
    if search is None:
        return {}
    metrics = {"search/seconds": search.seconds, "search/candidates": float(len(search.candidates)),
               "search/passed": float(search.outcome == "passed")}  # fmt: skip
    for index, candidate in enumerate(search.candidates):
        for name in ("speedup", "screen_drop", "drop"):
            value = getattr(candidate, name)
            if value is not None and math.isfinite(value):
                metrics[f"search/{index}/{name}"] = float(value)
    return metrics


def _range_metrics(results: SweepResults, segments: Mapping[str, str]) -> dict[str, float]:
    """range/<slice>/<format>_overflow_tensors for raw format limits (tensors the sweep's FP16 variants keep in FP32
    or found harmless to clamp or overflow are not FP16 overflows: not counted), range/<variant>/<slice>/clipped_share.
    Path segments, not dots: names hold dots, and variant "a" with slice "b.c" read as variant "a.b" with slice "c"."""
    analysis = results.ranges
    if analysis is None:
        return {}
    variants = unique_names((r.variant for r in analysis.clipping), _slice_segment)
    metrics = {f"range/{segments[scope]}/{check.format}_overflow_tensors": float(sum(p.handled is None for p in peaks))
               for check in analysis.limits if check.scaled_by is None
               for scope, peaks in check.over.items()}  # fmt: skip
    metrics |= {f"range/{variants[r.variant]}/{segments[r.scope]}/clipped_share": r.share for r in analysis.clipping}
    return metrics
