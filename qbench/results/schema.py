"""Typed, frozen results of a sweep, and their JSON form (results.json).

Schema (version 1), documented in reports/README.md:

    SweepResults
      schema_version, qbench_version, created_at, recipe {name, path, sha256, task},
      environment {...}, calibration CalibrationRecord, evaluation_rows,
      gate_metric, gate_metrics [every gated metric, gate_metric first, where gate.metrics gates several; absent in
      results from before: gate_metric alone], reference, variants [VariantResult], frontier [FrontierPoint],
      timings {phase: seconds} (prepare, build, store, track, inference, simulation, jobs, ranges, report, total),
      dropped_nonfinite {evaluation|calibration: {input column: rows left out for NaN/inf}},
      kept_nonfinite {evaluation|calibration|selection|slice:<name>: {input column: rows fed with NaN/inf}},
      distinct_inputs {overall|<slice>: distinct inputs its rows feed the model, for scopes whose rows repeat some},
      ranges RangeAnalysis | null, inputs {input: {path, sha256}}, complete, finished_at,
      evidence [name]: the kinds of evidence the sweep recorded (results/evidence.py; absent: none),
      digest (sha256 of the canonical JSON of everything else; checked on reading)
    VariantResult
      variant, backend, precision, status ok|failed|skipped, error (or skip reason), params {...},
      model_path, model_bytes, model_sha256, build_seconds, notes [...],
      fidelity Fidelity, evaluated_model_path (the model whose outputs were scored, when not model_path),
      accuracy AccuracyResult | null, latency LatencyResult | null, serving ServingResult | null (results/serving.py)
    Fidelity: accuracy native|emulated|unknown, latency native|emulated|unknown, method (how it was emulated)
    AccuracyResult: rows, nonfinite_outputs, overall SliceMetrics, slices [SliceMetrics]
    SliceMetrics: name, size, metrics {m: value}, intervals {m: [lo, hi]}, drops {m: drop vs FP32},
      drop_intervals {m: [lo, hi] of the drop, paired row by row with FP32 (regression's mae, rmse, r2)},
      nonfinite_outputs, new_nonfinite_outputs, denominators {m: count its rate is a share of, when not size},
      changed_together {m: changed units a changed unit shares its row with, weighted by changes (tokens)},
      spread {output: how much it varies across the scope's rows (metrics.spread)},
      kept {output: Kept {rule, component, reference, own, chance, elsewhere}: what it kept least of, or lost
        (validate/kept.py)},
      raised {m: what a custom metric raised on this scope; m is NaN there}
    LatencyResult: threads, session_create_ms, first_run_ms, points [LatencyPoint]
    LatencyPoint: batch_size, warmup, iterations, p50_ms, p95_ms, p99_ms, mean_ms, items_per_s,
      window_p50_ms [..], window_p99_ms [..], spread, iqr_ratio, stable true|false|null
    RangeAnalysis (results/ranges.py): rows, seconds, nodes, abs_max, limits, clipping, warnings, unattributed
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import qbench
from qbench.errors import QbenchError, short_repr
from qbench.files import write_atomically
from qbench.results.evidence import RECORDED, evidence_from_dict
from qbench.results.fields import checked_params, known_fields, unique_json
from qbench.results.kept import Kept as Kept
from qbench.results.kept import kept_from_dict
from qbench.results.ranges import ClipRecord as ClipRecord
from qbench.results.ranges import CoverageWarning as CoverageWarning
from qbench.results.ranges import LimitCheck as LimitCheck
from qbench.results.ranges import RangeAnalysis, bounds, counts, figures, ranges_from_dict
from qbench.results.ranges import TensorPeak as TensorPeak
from qbench.results.search import SearchReport, search_from_dict
from qbench.results.serving import ServingResult, serving_from_dict

SCHEMA_VERSION = 1
DIGEST_FIELD = "digest"


@dataclass(frozen=True)
class SliceMetrics:
    name: str
    size: int
    metrics: dict[str, float]
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    drops: dict[str, float] = field(default_factory=dict)
    # metric -> 95 % interval of its drop from FP32's outputs on the same rows, each row's change paired with FP32's
    # (metrics_targets.drop_intervals): what the gate's resolution rule reads for figures in the data's units
    drop_intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    nonfinite_outputs: int = 0  # rows of this scope whose output holds NaN or inf
    # of those, rows where FP32's output is finite: NaN/inf the variant brought in (fewer elsewhere cannot offset them)
    new_nonfinite_outputs: int = 0
    # metric -> how many units its figure rests on, where those are not the scope's rows (a token-classification
    # output's accuracy is a share of the scope's scored tokens, its kl_mean a mean over them; an embedding's
    # nn_agreement of its sampled query rows): the gate checks a rate against that count, min_slice_size counts it
    denominators: dict[str, int] = field(default_factory=dict)
    # metric counting units whose decision is FP32's, where a row holds several (a token classification's agreement)
    # -> how many changed units a changed unit shares its row with, weighted by changes (sum over rows of c^2 / sum of
    # c, c a row's changed units; 1: one a row at most): a row's tokens flip together, so the gate widens the drop's
    # interval by it (qbench.gate.resolution); absent: each changed unit a row of its own
    changed_together: dict[str, float] = field(default_factory=dict)
    # evaluated output -> how much it varies across the scope's rows (metrics.spread): a variant whose outputs barely
    # vary where FP32's do no longer depends on its inputs there, whatever a metric a constant answer scores well on
    # says (the gate's output_spread check, overall and per slice: an input regime past the calibrated range can
    # clamp one slice's rows to one answer while the others still vary)
    spread: dict[str, float] = field(default_factory=dict)
    # evaluated output -> the component (a class, a target's tail, a dimension, a row) of FP32's behaviour it kept least of
    # on the scope's rows (qbench.validate.kept): the gate's *_kept checks; absent where FP32 gives none to judge
    kept: dict[str, Kept] = field(default_factory=dict)
    raised: dict[str, str] = field(default_factory=dict)  # custom metric -> what it raised here (it is NaN here)

    def judged_count(self, metric: str) -> int:
        """How many units `metric`'s figure rests on, for count-based rules (min_slice_size): the scope's rows, or
        its denominator where fewer (a slice of 3,000 rows whose nn_agreement is scored on 3 sampled rows: 3)."""
        count = self.denominators.get(metric, self.size)
        return min(self.size, count) if isinstance(count, int) and not isinstance(count, bool) else self.size


@dataclass(frozen=True)
class AccuracyResult:
    rows: int
    nonfinite_outputs: int
    overall: SliceMetrics
    slices: tuple[SliceMetrics, ...] = ()

    def slice(self, name: str) -> SliceMetrics | None:
        return next((s for s in self.slices if s.name == name), None)


@dataclass(frozen=True)
class LatencyPoint:
    batch_size: int
    warmup: int
    iterations: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    items_per_s: float
    # adaptive timing (latency.stability); defaults describe a fixed-count measurement
    window_p50_ms: tuple[float, ...] = ()  # one p50 per closed window, in order
    window_p99_ms: tuple[float, ...] = ()  # one p99 per closed window of at least 100 runs
    spread: float = math.nan  # (max - min) / median of the last `windows` window p50s
    iqr_ratio: float = math.nan  # interquartile range / median of every timed run
    stable: bool | None = None  # the last windows agreed; None: not judged (stability: null)
    others_cpus: float = math.nan  # CPUs other processes kept busy while timed (qbench.validate.contention)
    # what was timed (qbench.validate.latency.timed_batches): distinct batches of evaluation rows run in rotation,
    # and input name -> {"min", "p50", "max"} shape over them for inputs whose shape varied (text cut per batch)
    batches: int = 1
    shapes: dict[str, dict[str, list[int]]] = field(default_factory=dict)


@dataclass(frozen=True)
class LatencyResult:
    threads: int | None
    session_create_ms: float
    first_run_ms: float
    points: tuple[LatencyPoint, ...]
    machine: dict[str, Any] = field(default_factory=dict)  # where the timings ran (qbench.environment.timing_machine)

    def at(self, batch_size: int) -> LatencyPoint | None:
        return next((p for p in self.points if p.batch_size == batch_size), None)


@dataclass(frozen=True)
class CalibrationRecord:
    size: int
    seed: int
    stratify_by: str | None
    row_ids_sha256: str
    per_slice_counts: dict[str, int]
    # data.calibration.overlap; evaluation rows held out as calibration rows; calibration rows whose inputs equal an
    # evaluation row's (same position, a repeated row, a copy in a calibration file). None: not recorded (older)
    overlap: str | None = None
    held_out_rows: int | None = None
    evaluation_overlap_rows: int | None = None
    # rows searches chose among candidates on (qbench.selection_rows: none fitted on, none at an evaluation row's
    # position), those drawn for calibration, those feeding what an evaluation row feeds; None: no choice made
    selection_rows: int | None = None
    selection_from_sample: int | None = None
    selection_overlap_rows: int | None = None


NATIVE = "native"
EMULATED = "emulated"
UNKNOWN = "unknown"  # results written before qbench recorded fidelity


@dataclass(frozen=True)
class Fidelity:
    """Whether each figure comes from the precision running natively on the backend, or from an emulation.

    accuracy: "emulated" when the backend cannot compute the format (FP16 on ONNX Runtime's CPU
        provider, BF16 and FP8 anywhere they are simulated): the scored outputs come from a graph
        that rounds every tensor to the format, faithful to its overflow and underflow.
    latency: "emulated" when the timed model does not run the format's own kernels (FP16 on CPU
        is upcast to FP32 by the runtime; BF16/FP8 simulations): not the figure of native hardware.
    """

    accuracy: str = NATIVE
    latency: str = NATIVE
    method: str = ""

    @property
    def emulated(self) -> bool:
        return EMULATED in (self.accuracy, self.latency)


_RUNTIME_DEFAULTS = {"graph_optimization_level": "all"}  # ONNX Runtime's defaults, as `runtime.*` params record them


def non_default_session_options(params: dict[str, Any]) -> dict[str, str]:
    """Session options a variant was measured with that differ from ONNX Runtime's defaults.

    A user loading the saved model with default options would not get the measured outputs;
    the model declares these in its metadata_props (qbench.variants.onnx_utils).
    """
    return {key: str(params[f"runtime.{key}"]) for key, default in _RUNTIME_DEFAULTS.items()
            if params.get(f"runtime.{key}", default) != default}  # fmt: skip


@dataclass(frozen=True)
class VariantResult:
    variant: str
    backend: str
    precision: str
    status: str  # "ok" | "failed" | "skipped" (the backend cannot run this variant; `error` says why)
    params: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    model_path: str | None = None
    model_bytes: int | None = None
    model_sha256: str | None = None  # content digest of the measured model (qbench.provenance.model_sha256)
    build_seconds: float | None = None
    notes: tuple[str, ...] = ()
    accuracy: AccuracyResult | None = None
    latency: LatencyResult | None = None
    fidelity: Fidelity = field(default_factory=Fidelity)
    evaluated_model_path: str | None = None  # set when accuracy was scored on another graph (an emulation)
    serving: ServingResult | None = None  # pre-processing split, load, cost, bound (qbench.results.serving)

    @property
    def key(self) -> str:
        """Unique within a sweep: '<variant>@<backend>'."""
        return f"{self.variant}@{self.backend}"


@dataclass(frozen=True)
class FrontierPoint:
    backend: str
    batch_size: int
    variant: str
    p50_ms: float
    metric: float
    machine: str = ""  # the kind of machine its latency was timed on (qbench.environment.machine_kind): a backend
    # timed on several kinds (a cluster's nodes) has one frontier per kind; '' when not recorded


@dataclass(frozen=True)
class SweepResults:
    qbench_version: str
    created_at: str
    recipe: dict[str, Any]
    environment: dict[str, Any]
    calibration: CalibrationRecord | None
    evaluation_rows: int
    gate_metric: str
    reference: str
    variants: tuple[VariantResult, ...]
    frontier: tuple[FrontierPoint, ...] = ()
    timings: dict[str, float] = field(default_factory=dict)
    # rows left out for NaN/inf inputs (data.nonfinite_inputs: drop): {"evaluation"|"calibration": {column: rows}}
    dropped_nonfinite: dict[str, dict[str, int]] = field(default_factory=dict)
    # rows fed with NaN/inf inputs (data.nonfinite_inputs: keep): {"evaluation"|"calibration"|"selection"|"slice:<name>": {column: rows}}
    kept_nonfinite: dict[str, dict[str, int]] = field(default_factory=dict)
    # scope ("overall" or a slice) -> the distinct inputs its rows feed the model, only where copies repeat some: the
    # gate's resolution rule counts those (a variant gets every copy of an input alike)
    distinct_inputs: dict[str, int] = field(default_factory=dict)
    ranges: RangeAnalysis | None = None
    # input name -> {path, sha256} of every file the results were made from (see qbench.provenance)
    inputs: dict[str, dict[str, str]] = field(default_factory=dict)
    complete: bool = True  # False while a sweep is still writing (or was interrupted): never judged
    finished_at: str | None = None  # UTC, microseconds: when the measurements ended (orders the runs)
    search: SearchReport | None = None  # the recipe's INT8 search: every candidate and its verdict
    # the kinds of evidence the sweep recorded (qbench.results.evidence): a check whose kind is missing cannot be
    # applied, as in results written before qbench recorded it
    evidence: tuple[str, ...] = RECORDED
    # every gated metric (gate.metrics), gate_metric first, where the recipe gates several; () for one (and in results
    # written before qbench gated several)
    gate_metrics: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION

    def find(self, variant: str, backend: str) -> VariantResult | None:
        return next((v for v in self.variants if v.variant == variant and v.backend == backend), None)

    def backends(self) -> list[str]:
        return list(dict.fromkeys(v.backend for v in self.variants))


# -- JSON round trip ------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """Dataclasses to dicts; NaN/inf become null so the file is strict JSON (and fails the gate)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _jsonable(value.item())
    return value


def to_jsonable(value: Any) -> Any:
    """`value` (results, one of their parts) as strict-JSON-ready Python values."""
    return _jsonable(value)


def canonical_sha256(value: Any) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of a JSON value."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()).hexdigest()


def content_digest(raw: dict[str, Any]) -> str:
    """The digest results.json carries: over everything in it but the digest itself."""
    return canonical_sha256({k: v for k, v in raw.items() if k != DIGEST_FIELD})


def to_json(results: SweepResults | RangeAnalysis | SearchReport) -> str:
    """Strict JSON of the results (or of one of their sections); whole results carry their content digest."""
    raw = _jsonable(results)
    if isinstance(results, SweepResults):
        raw[DIGEST_FIELD] = content_digest(raw)
    return json.dumps(raw, indent=2, allow_nan=False)


def write_results(results: SweepResults, path: Path, *, what: str = "the results") -> Path:
    """Write atomically (qbench.files): a crash or a full disk mid-write never leaves a half file that looks like
    results, and an earlier results file stays as it was. `what` names the write in an error."""
    return write_atomically(path, to_json(results), what=what)


def _slice(raw: dict[str, Any], where: str) -> SliceMetrics:
    raw = known_fields(raw, SliceMetrics, where)
    return SliceMetrics(
        name=raw["name"],
        size=int(raw["size"]),
        metrics=figures(raw["metrics"]),
        intervals=bounds(raw.get("intervals")),
        drops=figures(raw.get("drops")),
        drop_intervals=bounds(raw.get("drop_intervals")),
        nonfinite_outputs=int(raw["nonfinite_outputs"]),
        new_nonfinite_outputs=int(raw.get("new_nonfinite_outputs", 0)),
        denominators=counts(raw.get("denominators")),
        changed_together=figures(raw.get("changed_together"), "changed_together"),
        spread=figures(raw.get("spread"), "spread"),
        kept={output: kept_from_dict(value, f"{where}.kept.{output}") for output, value in (raw.get("kept") or {}).items()},
        raised={str(name): str(why) for name, why in (raw.get("raised") or {}).items()},
    )  # fmt: skip


def _accuracy(raw: dict[str, Any] | None, where: str) -> AccuracyResult | None:
    if raw is None:
        return None
    raw = known_fields(raw, AccuracyResult, where)
    return AccuracyResult(
        rows=int(raw["rows"]),
        nonfinite_outputs=int(raw["nonfinite_outputs"]),
        overall=_slice(raw["overall"], f"{where}.overall"),
        slices=tuple(_slice(s, f"{where}.slices[{i}]") for i, s in enumerate(raw.get("slices", []))),
    )


def _latency(raw: dict[str, Any] | None, where: str) -> LatencyResult | None:
    if raw is None:
        return None
    raw = known_fields(raw, LatencyResult, where)
    return LatencyResult(
        threads=raw.get("threads"), session_create_ms=raw["session_create_ms"], first_run_ms=raw["first_run_ms"],
        points=tuple(_latency_point(p, f"{where}.points[{i}]") for i, p in enumerate(raw["points"])),
        machine=dict(raw.get("machine") or {}),
    )  # fmt: skip


_TIMES = ("p50_ms", "p95_ms", "p99_ms", "mean_ms", "items_per_s", "spread", "iqr_ratio", "others_cpus")


def _latency_point(raw: dict[str, Any], where: str) -> LatencyPoint:
    """Files written before adaptive timing have no window fields: they read as not judged. Every timing is a
    number or null (NaN), so what reads them (the gate's checks, the frontier's notes) compares numbers."""
    raw = known_fields(raw, LatencyPoint, where)
    times = figures({k: raw[k] for k in _TIMES if k in raw}, f"{where}:")
    windows = {k: tuple(figures(dict(enumerate(raw[k])), f"{where}.{k}").values())
               for k in ("window_p50_ms", "window_p99_ms") if k in raw}  # fmt: skip
    return LatencyPoint(**{**raw, **times, **windows})


def _distinct_inputs(raw: object) -> dict[str, int]:
    """results.json's `distinct_inputs`: scope -> a whole number of inputs >= 1."""
    if not isinstance(raw, dict) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                            for n in raw.values()):  # fmt: skip
        raise QbenchError(f"distinct_inputs: got {short_repr(raw)}, expected scope -> a whole number of inputs >= 1")
    return raw


def from_dict(raw: dict[str, Any]) -> SweepResults:
    """Rebuild results from parsed JSON. Raises QbenchError if the schema version is not this one."""
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise QbenchError(f"results schema_version {version!r} is not supported (expected {SCHEMA_VERSION})")
    raw = known_fields(raw, SweepResults, "results", extra=(DIGEST_FIELD,))
    calibration = raw.get("calibration")
    return SweepResults(
        schema_version=version,
        qbench_version=raw["qbench_version"],
        created_at=raw["created_at"],
        recipe=raw["recipe"],
        environment=raw.get("environment", {}),
        calibration=(CalibrationRecord(**known_fields(calibration, CalibrationRecord, "calibration"))
                     if calibration else None),  # fmt: skip
        evaluation_rows=int(raw["evaluation_rows"]),
        gate_metric=raw["gate_metric"],
        reference=raw["reference"],
        variants=tuple(variant_from_dict(v, f"variants[{i}]") for i, v in enumerate(raw["variants"])),
        frontier=tuple(FrontierPoint(**known_fields(p, FrontierPoint, f"frontier[{i}]"))
                       for i, p in enumerate(raw.get("frontier", []))),  # fmt: skip
        timings=raw.get("timings", {}),
        dropped_nonfinite=raw.get("dropped_nonfinite", {}),
        kept_nonfinite=raw.get("kept_nonfinite", {}),
        distinct_inputs=_distinct_inputs(raw.get("distinct_inputs", {})),
        ranges=ranges_from_dict(raw.get("ranges"), "ranges"),
        inputs=raw.get("inputs", {}),
        complete=raw.get("complete") is True,
        finished_at=raw.get("finished_at"),
        search=search_from_dict(raw.get("search"), "search"),
        evidence=evidence_from_dict(raw.get("evidence")),
        gate_metrics=tuple(str(m) for m in raw.get("gate_metrics") or ()),
    )


def variant_from_dict(v: dict[str, Any], where: str = "variant") -> VariantResult:
    """One variant x backend result from its parsed JSON (as results.json and job records hold it)."""
    v = known_fields(v, VariantResult, where)
    return VariantResult(
        variant=v["variant"],
        backend=v["backend"],
        precision=v["precision"],
        status=v["status"],
        params=checked_params(v.get("params", {}), f"{where}.params"),
        error=v.get("error"),
        model_path=v.get("model_path"),
        model_bytes=v.get("model_bytes"),
        model_sha256=v.get("model_sha256"),
        build_seconds=v.get("build_seconds"),
        notes=tuple(v.get("notes", [])),
        accuracy=_accuracy(v.get("accuracy"), f"{where}.accuracy"),
        latency=_latency(v.get("latency"), f"{where}.latency"),
        fidelity=(Fidelity(**known_fields(v["fidelity"], Fidelity, f"{where}.fidelity")) if "fidelity" in v
                  else Fidelity(UNKNOWN, UNKNOWN)),  # fmt: skip
        evaluated_model_path=v.get("evaluated_model_path"),
        serving=serving_from_dict(v.get("serving"), f"{where}.serving"),
    )


def read_results(path: Path, *, partial: bool = False) -> SweepResults:
    """Load results.json; any problem is a QbenchError naming the file: missing, not JSON, wrong shape,
    content that does not match its digest (edited or corrupted after the sweep), or an incomplete sweep (unless
    `partial`: an interrupted sweep's variants, to be shown, never judged)."""
    if not path.is_file():
        raise QbenchError(f"{path}: results file not found")
    raw: Any = None
    try:
        raw = unique_json(path.read_text(), parse_constant=_reject_constant)
        if not isinstance(raw, dict):
            raise QbenchError(f"expected a JSON object of results, got a {type(raw).__name__}")
        _check_digest(raw)
        if raw.get("complete") is not True and not partial:
            raise QbenchError(f"complete: got {raw.get('complete')!r}, expected true (the sweep was interrupted "
                              "or is still running): re-run `qbench sweep`")  # fmt: skip
        return from_dict(raw)
    except QbenchError as exc:
        raise QbenchError(f"{path}: {exc}{_written_by_another(raw)}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, LookupError, TypeError, ValueError, AttributeError) as exc:
        raise QbenchError(f"{path}: not a valid qbench results file ({type(exc).__name__}: {exc})"
                          f"{_written_by_another(raw)}") from None  # fmt: skip


def _written_by_another(raw: Any) -> str:
    """Results an older or newer qbench wrote (CI judging a cached run after an upgrade): which one, the likeliest
    reason they do not read here."""
    version = raw.get("qbench_version") if isinstance(raw, dict) else None
    if not isinstance(version, str) or version == qbench.__version__:
        return ""
    return (f"; written by qbench {short_repr(version)}, this is qbench {qbench.__version__}: judge them with that "
            "version, or re-run `qbench sweep` with this one")  # fmt: skip


def _reject_constant(name: str) -> float:
    """qbench writes strict JSON (NaN/inf as null): a bare NaN or Infinity was not written by it."""
    raise QbenchError(f"holds {name}, which qbench never writes (non-finite values are written as null)")


def _check_digest(raw: dict[str, Any]) -> None:
    recorded = raw.get(DIGEST_FIELD)
    if not isinstance(recorded, str):
        raise QbenchError(f"{DIGEST_FIELD}: missing: results without their content digest cannot be trusted")
    if recorded != content_digest(raw):
        raise QbenchError(f"{DIGEST_FIELD}: does not match the file's content (edited or corrupted after the sweep)")
