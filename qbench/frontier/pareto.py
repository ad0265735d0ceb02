"""The latency–accuracy frontier: which variants no other variant beats on both speed and accuracy.

A variant is on the frontier of its backend at a batch size when no other
variant there is at least as fast *and* at least as accurate, and strictly
better on one of the two. Identical points (same p50 and same metric) do not
dominate each other: both stay, ordered by name, so the result is deterministic.
Variants whose measured models are identical (equal `model_sha256`) are one point: timing
noise must not put one on the frontier and its twin off it, so on each backend and batch
size they share the median of their p50s and the worst of their metrics.

"Faster" means faster beyond the timing noise (`timing_margin`), here as in every speed claim a report
makes: p50s closer than that are the same speed. In an A/A test (FP32's graph re-saved with an Identity
inserted, swept as a variant), with any lower p50 counting as faster, the copy took FP32's place on the
frontier in 14 of 30 frontiers, as if computing the same thing had made it faster.

A point timed while other processes kept the CPUs busy (qbench.validate.contention) has a speed that compares
loads, not variants (a probe on a loaded 2-core machine showed an FP16 LSTM 158x faster than FP32 that a quiet
loop did not): its speed is compared with no other point's, so it is on the frontier, or off it, by its metric alone,
and it pushes no quiet point off (it is not shown to be as fast as one).

Latencies timed on different kinds of machine (a cluster's nodes) compare the machines, not the
variants: each kind of machine a backend was timed on has a frontier of its own.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qbench.environment import machine_kind
from qbench.errors import QbenchError, expected_one_of
from qbench.gate.tolerance import Tolerances, resolve_tolerances
from qbench.results.schema import FrontierPoint, SweepResults, VariantResult
from qbench.search.select import TIE
from qbench.validate.catalogue import METRICS
from qbench.validate.contention import contended

if TYPE_CHECKING:  # pragma: no cover
    from qbench.recipe.spec import GateSpec


@dataclass(frozen=True)
class _Candidate:
    point: FrontierPoint
    score: float  # the metric, sign-flipped for lower-is-better metrics: higher score is better
    model_sha256: str | None = None
    spread: float = math.nan  # the spread of the point's timing windows (NaN: not measured)
    contended: bool = False  # timed beside other processes' load: its speed is compared with no other point's


def _check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise QbenchError(f"frontier metric {expected_one_of(metric, METRICS)}")


def overall_metric(variant: VariantResult, metric: str) -> float:
    """The variant's overall value of `metric`, NaN when it was not measured."""
    if variant.accuracy is None:
        return math.nan
    return variant.accuracy.overall.metrics.get(metric, math.nan)


def timed_on(variant: VariantResult) -> str:
    """The kind of machine `variant`'s latency was timed on ('' when not recorded)."""
    return machine_kind(variant.latency.machine) if variant.latency is not None else ""


def _candidates(variants: Sequence[VariantResult], metric: str) -> list[_Candidate]:
    """Every (ok variant, batch size) with a finite p50 and a finite metric."""
    sign = 1.0 if METRICS[metric].higher_is_better else -1.0
    found = []
    for variant in variants:
        value = overall_metric(variant, metric)
        if variant.status != "ok" or variant.latency is None or not math.isfinite(value):
            continue
        for timing in variant.latency.points:
            if math.isfinite(timing.p50_ms):
                point = FrontierPoint(variant.backend, timing.batch_size, variant.variant, timing.p50_ms, value,
                                      timed_on(variant))  # fmt: skip
                found.append(_Candidate(point, sign * value, variant.model_sha256, timing.spread, contended(timing)))
    return _identical_as_one(found)


def _identical_as_one(candidates: list[_Candidate]) -> list[_Candidate]:
    """Candidates of one model (same backend, batch size, kind of machine and digest) take the median p50 and the
    worst metric."""
    same_model: dict[object, list[_Candidate]] = {}
    for c in candidates:
        key = (c.point.backend, c.point.batch_size, c.point.machine, c.model_sha256) if c.model_sha256 else id(c)
        same_model.setdefault(key, []).append(c)
    shared = []
    for members in same_model.values():
        p50 = float(statistics.median(m.point.p50_ms for m in members))
        worst = min(members, key=lambda m: m.score)
        spread = max((m.spread for m in members if math.isfinite(m.spread)), default=math.nan)
        loaded = any(m.contended for m in members)
        shared += [dataclasses.replace(m, point=dataclasses.replace(m.point, p50_ms=p50, metric=worst.point.metric),
                                       score=worst.score, spread=spread,
                                       contended=loaded) for m in members]  # fmt: skip
    return shared


def timing_margin(*spreads: float, contended: bool = False) -> float:
    """How far apart (relative) two timings may be and still not say which is faster: the search's tie margin, TIE,
    or the largest finite spread of their timing windows when that is more; infinite when one was `contended` (timed
    beside other processes' load, qbench.validate.contention): no gap between such timings says which is faster."""
    if contended:
        return math.inf
    return max([TIE, *(s for s in spreads if s is not None and math.isfinite(s))])


def faster_beyond_noise(p50_ms: float, other_p50_ms: float, margin: float) -> bool:
    """Whether `p50_ms` is faster than `other_p50_ms` by more than `margin` (relative to the slower one); never with
    an infinite margin."""
    return math.isfinite(margin) and p50_ms < other_p50_ms * (1.0 - margin)


def _dominates(a: _Candidate, b: _Candidate) -> bool:
    """`a` is at least as good as `b` on both axes and better on one, speed judged beyond the timing noise.

    Acyclic, so every group keeps a frontier: a cycle would need equal scores all round, and then each step
    would need a strictly lower p50. A point timed beside other processes' load is not shown to be as fast as a quiet
    one, so it dominates no quiet one (a contended FP32 timed 0.01 more accurate pushed a quiet variant 160x faster
    off); another contended one it dominates by its metric alone, neither speed counting."""
    if a.contended and not b.contended:
        return False
    margin = timing_margin(a.spread, b.spread, contended=a.contended or b.contended)
    faster = faster_beyond_noise(a.point.p50_ms, b.point.p50_ms, margin)
    slower = faster_beyond_noise(b.point.p50_ms, a.point.p50_ms, margin)
    return not slower and a.score >= b.score and (faster or a.score > b.score)


def _sort_key(point: FrontierPoint) -> tuple[str, int, str, float, str]:
    return point.backend, point.batch_size, point.machine, point.p50_ms, point.variant


def compute_frontier(variants: Sequence[VariantResult], metric: str) -> tuple[FrontierPoint, ...]:
    """Pareto-optimal variants over (p50 latency, `metric`) per backend, batch size and kind of timing machine, p50s
    within the timing noise of each other counting as the same speed.

    Only variants with status "ok" and finite values take part. The result is
    sorted by backend, batch size, machine, p50 latency, then variant name.
    """
    _check_metric(metric)
    groups: dict[tuple[str, int, str], list[_Candidate]] = {}
    for candidate in _candidates(variants, metric):
        point = candidate.point
        groups.setdefault((point.backend, point.batch_size, point.machine), []).append(candidate)
    frontier = [
        candidate.point
        for group in groups.values()
        for candidate in group
        if not any(_dominates(other, candidate) for other in group)
    ]
    return tuple(sorted(frontier, key=_sort_key))


def frontier_of(results: SweepResults) -> tuple[FrontierPoint, ...]:
    """The frontier stored in the results, or computed over the gate metric when none was stored."""
    return results.frontier or compute_frontier(results.variants, results.gate_metric)


def reference_value(results: SweepResults, backend: str, metric: str) -> float:
    """The FP32 reference's overall `metric` on `backend` (NaN when the reference is missing or failed)."""
    reference = results.find(results.reference, backend)
    if reference is None or reference.status != "ok":
        return math.nan
    return overall_metric(reference, metric)


def gate_threshold(results: SweepResults, gate: GateSpec) -> float | None:
    """The gate metric's worst allowed value: the reference's value worsened by the gate's overall tolerance.

    Taken on the first backend whose reference has a finite value; None when none has (`gate_tolerances`).
    """
    resolved = gate_tolerances(results, gate)
    if resolved is None:
        return None
    value, tolerances = resolved
    higher = METRICS[results.gate_metric].higher_is_better
    return value - tolerances.max_drop if higher else value + tolerances.max_drop


def gate_tolerances(results: SweepResults, gate: GateSpec,
                    metric: str | None = None) -> tuple[float, Tolerances] | None:
    """The reference's gate-metric figure (`metric`'s, for another gated metric: `gate` is then its own single-metric
    spec) on the first backend where it is finite, and the gate's tolerances resolved against it
    (qbench.gate.tolerance); None when no backend has one, or a relative tolerance of it is unformed."""
    for backend in results.backends():
        value = reference_value(results, backend, metric or results.gate_metric)
        if math.isfinite(value):
            try:
                return value, resolve_tolerances(gate, value)
            except QbenchError:
                return None
    return None


def speedup(results: SweepResults, variant: VariantResult, batch_size: int) -> float:
    """How many times faster than the FP32 reference on the same backend at `batch_size` (p50); NaN if unknown, and
    when the two were timed on machines of different kinds (that ratio compares machines, not precisions)."""
    reference = results.find(results.reference, variant.backend)
    if reference is None or reference.latency is None or variant.latency is None:
        return math.nan
    kinds = {machine_kind(reference.latency.machine), machine_kind(variant.latency.machine)}
    if len(kinds - {""}) > 1:
        return math.nan
    ours, theirs = variant.latency.at(batch_size), reference.latency.at(batch_size)
    if ours is None or theirs is None or ours.p50_ms <= 0:
        return math.nan
    return theirs.p50_ms / ours.p50_ms


def speedup_contended(results: SweepResults, variant: VariantResult, batch_size: int) -> bool:
    """Whether `variant` or the FP32 reference on its backend was timed at `batch_size` beside other processes' load
    (qbench.validate.contention): their speed-up then compares loads, not variants."""
    reference = results.find(results.reference, variant.backend)
    return any(contended(v.latency.at(batch_size)) for v in (variant, reference) if v is not None and v.latency)


def slower_than_reference(results: SweepResults, variant: VariantResult) -> str | None:
    """'0.85× at batch 1, 0.75× at batch 8' when `variant` ran slower than FP32 on its backend at every batch size
    both timed, each beyond the timing noise (the larger of the search's tie margin, TIE, and the two points'
    window spreads; no batch size where either was timed beside other processes' load says so); None when it is faster,
    or as fast within the noise, at some batch size, or no speed-up can be given."""
    if variant.variant == results.reference or variant.status != "ok" or variant.latency is None:
        return None
    reference = results.find(results.reference, variant.backend)
    if reference is None or reference.latency is None:
        return None
    slower = []
    for point in variant.latency.points:
        theirs, factor = reference.latency.at(point.batch_size), speedup(results, variant, point.batch_size)
        if theirs is None or not math.isfinite(factor):
            continue
        if factor >= 1.0 - timing_margin(point.spread, theirs.spread, contended=contended(point) or contended(theirs)):
            return None
        slower.append(f"{factor:.2f}× at batch {point.batch_size}")
    return ", ".join(slower) or None


def slower_than_reference_notes(results: SweepResults, keys: Collection[str] | None = None) -> list[str]:
    """A note per variant (of `keys`, variant@backend, when given) that runs slower than FP32 at every batch size
    timed: a lower precision that pays off in no latency is no reason to ship it, whatever its accuracy."""
    notes = []
    for variant in results.variants:
        slower = slower_than_reference(results, variant) if keys is None or variant.key in keys else None
        if slower:
            notes.append(f"{variant.key} runs slower than {results.reference} at every batch size timed ({slower}): "
                         f"for speed, {results.reference} is the better choice on {variant.backend}")  # fmt: skip
    return notes


def timing_kinds(results: SweepResults, backend: str) -> dict[str, list[str]]:
    """Machine kind -> the variants of `backend` timed on it (measurements that recorded their machine)."""
    by_kind: dict[str, list[str]] = {}
    for variant in results.variants:
        if variant.backend == backend and variant.status == "ok" and variant.latency is not None:
            kind = machine_kind(variant.latency.machine)
            if kind:
                by_kind.setdefault(kind, []).append(variant.variant)
    return by_kind


def mixed_timing_machines(results: SweepResults) -> list[str]:
    """A note per backend whose measurements were timed on machines of more than one kind (a cluster's nodes):
    their latencies cannot be compared with each other, so speed-ups across them are not computed."""
    notes = []
    for backend in results.backends():
        by_kind = timing_kinds(results, backend)
        if len(by_kind) > 1:
            where = "; ".join(f"{', '.join(names)} on {kind}" for kind, names in by_kind.items())
            notes.append(f"{backend} timed its variants on {len(by_kind)} kinds of machine ({where}): latencies across "
                         "them compare machines, not precisions, and no speed-up is given between them; time every "
                         "variant of a backend on one kind of node")  # fmt: skip
    return notes
