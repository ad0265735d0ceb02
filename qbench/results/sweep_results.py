"""The typed, frozen results of a sweep: one dataclass per part of results.json (qbench.results.schema documents
the fields; qbench.results.json_file writes and reads them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from qbench.results.evidence import RECORDED
from qbench.results.kept import Kept
from qbench.results.ranges import RangeAnalysis
from qbench.results.search import SearchReport
from qbench.results.serving import ServingResult

SCHEMA_VERSION = 1


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
    # evaluated output -> the component (a class, a target's tail, a dimension, a row) of FP32's behaviour it kept
    # least of on the scope's rows (qbench.validate.kept): the gate's *_kept checks; absent where FP32 gives none to
    # judge
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
    # rows fed with NaN/inf inputs (data.nonfinite_inputs: keep):
    # {"evaluation"|"calibration"|"selection"|"slice:<name>": {column: rows}}
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
