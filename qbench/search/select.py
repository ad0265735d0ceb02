"""The search's decisions, as pure functions over measured figures (no model is run here).

- `excess`: how far a candidate is from the gate: the largest drop / tolerance over the gate's
  checks, overall and on every judged slice (at most 1 passes, inf when a drop is unknown).
- `beyond_one_unit`: a screening drop less the one row (or scored item) a share-of-rows metric can move by on
  the few screening rows: the screen cannot tell one row's change from a drop the full evaluation would pass.
- `speedup`: FP32 p50 / candidate p50, geometric mean over the timed batch sizes.
- `evaluation_order`: which screened candidates deserve a full evaluation, fastest first, a screen that only came
  near the gate after those that cleared it at a similar speed.
- `may_win`: whether a candidate can still beat the fastest passing one (timings within
  `TIE` of each other are treated as equal: the machine is noisy).
- `timing_noise`: how far a speed-up estimate may be off, from one model's repeated timings over the
  search: estimates that close may still rank either way, so `may_win` widens its margin to it.
- `choose`: the fastest candidate whose full evaluation passed the gate (ties broken by accuracy, not noise), a pass
  resolved on the selection rows before any unresolved one (`passing`, qbench.gate.resolution: the rule
  `calibrator: auto` and `fallback:` choose by too).
- `keep_float_bases`: which failing candidates get nodes kept in floating point.
- `closest` / `needed`: when none passed, the candidate nearest to passing and what it would take; `nearness`: the
  excess a candidate is judged by (its full evaluation's, else its screening's).
- `tie_note`: why the pick was kept over a passing candidate timed a shade faster (the tie rule), in words.
- `slower_than_reference`: the chosen candidate does not beat FP32 beyond the timing noise, at every batch size or
  at some (INT8 may not pay off on a backend).
- `why_none`: why a search kept no candidate at all, in words.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from qbench.gate.resolution import passing
from qbench.report.grid import compared, percent
from qbench.results.search import CandidateRecord
from qbench.variants.base import NO_RANGE

SCREEN_SLACK = 1.5  # a candidate whose screening excess is at most this is evaluated in full
TIE = 0.05  # speed-ups this close (relative) are a tie on a shared machine


def excess(checks: Sequence[tuple[float, float]]) -> float:
    """Largest drop / tolerance over (drop, tolerance) checks (a zero tolerance allows no drop; inf: no check
    or an unknown drop)."""

    def ratio(drop: float, tolerance: float) -> float:
        if not math.isfinite(drop):
            return math.inf
        if tolerance > 0:
            return max(drop, 0.0) / tolerance
        return 0.0 if drop <= 0 else math.inf

    return max((ratio(d, t) for d, t in checks), default=math.inf)


def beyond_one_unit(drop: float, count: int) -> float:
    """A share-of-rows drop on a scope of `count` rows (or scored items) less one of them, never below 0 (a gain is
    kept as it is).

    A screen samples a few rows of each scope, so a single changed row is a large drop there (1 of 3 rows of a
    small slice is 0.33) though the same row on the full scope may be far within the tolerance: judging the screen
    at full strength dismissed candidates that pass. Two changed rows are still counted as one: evidence enough to
    skip the full evaluation."""
    if count <= 0 or not math.isfinite(drop) or drop <= 0:
        return drop
    return max(drop - 1.0 / count, 0.0)


def speedup(reference_p50: Mapping[int, float], candidate_p50: Mapping[int, float]) -> float:
    """Geometric mean over the batch sizes both were timed at of reference p50 / candidate p50 (NaN: none)."""
    ratios = [reference_p50[b] / candidate_p50[b] for b in reference_p50
              if b in candidate_p50 and candidate_p50[b] > 0 and math.isfinite(candidate_p50[b])]  # fmt: skip
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else math.nan


def per_batch(reference_p50: Mapping[int, float], candidate_p50: Mapping[int, float]) -> dict[str, float]:
    """`speedup` at each batch size both were timed at, keyed "b<batch>"."""
    ratios = {f"b{b}": speedup({b: reference_p50[b]}, {b: p}) for b, p in candidate_p50.items() if b in reference_p50}
    return {key: value for key, value in ratios.items() if math.isfinite(value)}


def _speed(record: CandidateRecord) -> float:
    return record.speedup if record.speedup is not None and math.isfinite(record.speedup) else -math.inf


def evaluation_order(records: Sequence[CandidateRecord], slack: float = SCREEN_SLACK, tie: float = TIE) -> list[int]:
    """Indices of screened, not yet evaluated candidates within `slack` of the gate and not certain to fail, in the
    order the budget should go to them: fastest first, except that a candidate whose screen only came near the gate
    (excess over 1, within the slack) goes after those whose screen cleared it at a speed within `tie` of its own
    (or faster). The first to pass bars every slower one (`may_win`), so the budget must reach the likeliest answer
    first: a risky candidate screened a shade faster was evaluated first, failed, and left a passing one screened
    within the tie of it unevaluated for want of time."""
    left = sorted((i for i, r in enumerate(records) if r.stage == "screened" and r.failure_certain is None
                   and r.screen_excess is not None and r.screen_excess <= slack),
                  key=lambda i: (-_speed(records[i]), records[i].screen_excess))  # fmt: skip
    order = []
    while left:
        # within the tie of the fastest, itself always (a tie of 100 % or more bars a candidate without a speed-up
        # even from itself: -inf against -inf times a factor <= 0)
        similar = [i for i in left if i == left[0] or may_win(records[i], records[left[0]], tie)]
        cleared = [i for i in similar if records[i].screen_excess <= 1.0]
        order.append((cleared or similar)[0])
        left.remove(order[-1])
    return order


def may_win(candidate: CandidateRecord, best: CandidateRecord | None, tie: float = TIE) -> bool:
    """Whether `candidate` could still be chosen over `best` (the fastest passing so far): it is not slower
    beyond the tie margin. Without a passing candidate, anything may win."""
    return best is None or _speed(candidate) >= _speed(best) * (1.0 - tie)


def timing_noise(timings: Sequence[Mapping[int, float]]) -> float:
    """How far apart two speed-up estimates can be without saying which is faster, from repeated timings of one model:
    twice the median relative deviation of the timings from their median (a speed-up divides two timings, each off
    by about that much), each timing the geometric mean of its p50s over the batch sizes every timing has. 0 with
    fewer than two usable timings.

    The search times FP32 again beside every candidate, so FP32's own figures show the machine's changing load. The
    median keeps one outlier (a pause during one timing) from widening the margin to every candidate."""
    shared = set.intersection(*(set(t) for t in timings)) if timings else set()
    means = [math.exp(sum(math.log(t[b]) for b in shared) / len(shared)) for t in timings
             if shared and all(t[b] > 0 and math.isfinite(t[b]) for b in shared)]  # fmt: skip
    if len(means) < 2:
        return 0.0
    middle = statistics.median(means)
    return 2.0 * statistics.median(abs(m / middle - 1.0) for m in means)


def fastest_passing(records: Sequence[CandidateRecord]) -> int | None:
    """The candidate with a firm pass (`CandidateRecord.firm_pass`) and the highest measured speed-up (None if none):
    the bar `may_win` measures against. A pass another candidate may resolve better is no bar: a Llama-style model's
    search stopped at a candidate passing by a thin margin on 72 heavy-tailed rows (drop 0.0044, tolerance 0.005, the
    drop's interval reaching past it), which then breached on the evaluation rows (0.0147), and slower candidates
    were never evaluated. A pass short of rows alone is one: no candidate on the same rows could resolve it."""
    firm = [i for i, r in enumerate(records) if r.firm_pass]
    return max(firm, key=lambda i: _speed(records[i]), default=None)


def choose(records: Sequence[CandidateRecord], tie: float = TIE) -> int | None:
    """The fastest of the `passing` candidates (a resolved pass ranks before every unresolved one); None if none
    passed.

    Candidates within the tie margin of the fastest are equally fast on a noisy machine, so the pick among them
    must not follow the noise: the one furthest inside the gate (smallest excess) wins, then the one with fewer
    nodes kept in float, then the one tried first."""
    among = passing(records)
    if not among:
        return None
    best = max(among, key=lambda i: _speed(records[i]))
    bar = _speed(records[best]) * (1.0 - tie) if math.isfinite(_speed(records[best])) else -math.inf
    tied = [i for i in among if _speed(records[i]) >= bar]
    return min(tied, key=lambda i: (records[i].excess if records[i].excess is not None else math.inf,
                                    len(records[i].keep_float), i))  # fmt: skip


def tie_note(records: Sequence[CandidateRecord], chosen: int, tie: float = TIE) -> str | None:
    """Why `chosen` (by `choose`) was kept over a passing candidate timed faster, in words; None when it is the
    fastest."""
    among = passing(records)
    faster = max(among, key=lambda i: _speed(records[i]), default=chosen)
    if faster == chosen or _speed(records[faster]) <= _speed(records[chosen]):
        return None
    pick, other = records[chosen], records[faster]
    if pick.excess != other.excess:
        why = (f"the larger accuracy margin (largest drop / tolerance {_figure(pick.excess)} against "
               f"{_figure(other.excess)})")
    else:
        why = "fewer float nodes" if len(pick.keep_float) < len(other.keep_float) else "the one tried first"
    return (f"{pick.label} ({_speed(pick):.2f}×) was chosen over {other.label} ({_speed(other):.2f}×): within the "
            f"{tie:.0%} tie, where timings do not say which is faster, the pick goes to {why}")


def _figure(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "n/a"


def slower_than_reference(record: CandidateRecord, tie: float = TIE) -> str | None:
    """Why shipping this candidate for speed would be a mistake, or None: it is slower than FP32 beyond the tie margin
    (INT8 kernels on some backends and models, e.g. small convolutions on CPU, run slower than FP32). The search passes
    the margin its ranking uses (TIE, or the timing noise it measured when that is more): an estimate within the noise
    of 1 does not say the candidate is slower.

    Judged per batch size where the record has them: a GRU model's pick ran at 0.72x FP32 at batch 1 and 1.02-1.13x
    at batch 32, a geometric mean of 0.85x, and "FP32 is the faster choice" was wrong for batch 32. Slower at only
    some batch sizes is said for those."""
    speed = _speed(record)
    batches = {key: value for key, value in record.speedups.items() if math.isfinite(value)}
    if not batches:
        batches = {"overall": speed} if math.isfinite(speed) else {}
    slower = {key: value for key, value in batches.items() if value < 1.0 - tie}
    if not slower:
        return None
    if len(slower) == len(batches):
        return (f"the fastest passing candidate runs at {speed:.2f}× FP32: no INT8 candidate beat FP32 on this "
                "backend, so FP32 (or FP16) is the faster choice here")  # fmt: skip
    shown = ", ".join(f"batch {key[1:]} ({value:.2f}×)" for key, value in slower.items())
    return f"the fastest passing candidate is slower than FP32 at {shown}: there FP32 (or FP16) is the faster choice"


def picked(records: Sequence[CandidateRecord], unresolved: str,
           tie: float = TIE) -> tuple[int | None, int | None, bool]:
    """(the candidate chosen, None where none passes as the gate would count it on the same figures under
    `gate.unresolved: unresolved`; the one kept, the closest where none is chosen; whether its pass is unresolved: too
    few rows, or a scope no gated metric judges, JudgedPass.counted)."""
    chosen = choose(records, tie)
    pick = chosen if chosen is not None else closest(records)
    thin = chosen is not None and not records[chosen].resolved_pass
    return (chosen if chosen is None or records[chosen].counted(unresolved) else None), pick, thin


def outcome(chosen: int | None, pick: int | None, thin: bool) -> str:
    """The report's outcome; 'unresolved': the pick passed, but the gate would not count that pass on the same
    figures under `gate.unresolved: fail` (too few selection rows, or a scope no gated metric judges)."""
    if chosen is not None:
        return "passed"
    if pick is None:
        return "nothing built"
    return "unresolved" if thin else "unreachable"


def why_none(records: Sequence[CandidateRecord], float_layers: Mapping[str, int] | None = None) -> str:
    """Why no candidate could be kept: nothing to quantize in the graph, or what each candidate ran into.

    `float_layers`: the graph's layers holding weights that quantizers may leave float whole (recurrent layers,
    other-domain operators, Linear layers inside If/Loop/Scan bodies; integer_kernels.float_weighted_layers). Where
    the graph has them, its weights are there, and "no layer with constant weights" would be false: a GRU classifier
    without a Linear head was told it had no MatMul, Gemm or Conv with constant weights, "e.g. a tree ensemble"."""
    tried = [r for r in records if r.stage != "skipped"]
    if tried and all(r.stage == "not applicable" for r in tried):
        if any(NO_RANGE in r.verdict for r in tried):  # the graph has nodes to quantize; the sample gave no range
            return (f"the INT8 search quantized nothing: the nodes it would quantize {NO_RANGE} (a tensor 0 on every "
                    "calibration row, or holding NaN/inf there); calibrate on rows where they vary "
                    "(data.calibration)")  # fmt: skip
        if float_layers:
            layers = ", ".join(f"{count} {op}" for op, count in float_layers.items())
            techniques = ", ".join(dict.fromkeys(r.technique for r in tried))
            nested = any("inside If/Loop/Scan" in op for op in float_layers)
            hint = (" (quantization rewrites the main graph only: export each branch as a model of its own, as "
                    "optimum's unmerged decoder_model.onnx and decoder_with_past_model.onnx are)") if nested else ""
            if any("(float64)" in op for op in float_layers):
                hint += (" (ONNX Runtime's quantizers leave float64 layers as they are: convert the model with float32 "
                         "inputs and weights, skl2onnx's FloatTensorType, to quantize it)")  # fmt: skip
            return (f"the INT8 search found nothing to quantize: every candidate left the graph as FP32's; its "
                    f"weights are in {layers}, which none of the techniques tried ({techniques}) lowers to INT8; there "
                    f"is no INT8 variant of this model{hint}")  # fmt: skip
        return ("the INT8 search found nothing to quantize: every candidate left the graph as FP32's (no MatMul, "
                "Gemm or Conv with constant weights, e.g. a tree ensemble); the search has no INT8 variant of this "
                "model (a static INT8 variant may still quantize its elementwise ops: its params say "
                "which)")  # fmt: skip
    reasons = "; ".join(f"{r.label}: {r.verdict}" for r in tried if r.stage != "not applicable")
    return f"the INT8 search could not build and run any candidate ({reasons or 'none was tried'})"


def nearness(record: CandidateRecord) -> float:
    """The excess a candidate is judged by: its full evaluation's, else its screening's (inf: unmeasured, or any
    drop against a zero tolerance)."""
    value = record.excess if record.excess is not None else record.screen_excess
    return value if value is not None else math.inf


def _gap(record: CandidateRecord) -> float:
    """The largest drop measured, overall or on the worst slice: what orders candidates whose excess is the same
    (every drop against a zero tolerance is an infinite excess); inf when no finite drop was measured."""
    drops = [record.drop, record.worst_slice_drop] if record.excess is not None else [record.screen_drop]
    finite = [d for d in drops if d is not None and math.isfinite(d)]
    return max(finite) if finite else math.inf


def _measured(record: CandidateRecord) -> bool:
    return math.isfinite(nearness(record)) or math.isfinite(_gap(record))


def closest(records: Sequence[CandidateRecord]) -> int | None:
    """The measured candidate nearest to passing (smallest excess; then one judged on every row over one only
    screened, the smallest drop, the faster); None if none was measured."""
    measured = [i for i, r in enumerate(records) if _measured(r)]
    if not measured:
        return None
    return min(measured, key=lambda i: (nearness(records[i]), not records[i].evaluated, _gap(records[i]),
                                        -_speed(records[i])))  # fmt: skip


def keep_float_bases(records: Sequence[CandidateRecord], tie: float = TIE) -> list[int]:
    """Bases for keep-float candidates: measured candidates without float nodes that failed (or passed, not firmly)
    and may still beat the fastest firm pass (`may_win`), fastest first: keeping nodes float only slows a candidate
    down, so the fastest failing ones have the most room to pass and still win.

    A slower candidate passing is no reason to stop: on a 1-D conv net a SmoothQuant candidate passed at 0.94x FP32
    while ORT static, screened at 1.2x, failed by 20 % and passed at 1.3x with one Conv kept float."""
    best = fastest_passing(records)
    bar = records[best] if best is not None else None
    bases = [i for i, r in enumerate(records)
             if not r.keep_float and not r.firm_pass and _measured(r) and may_win(r, bar, tie)]  # fmt: skip
    return sorted(bases, key=lambda i: (-_speed(records[i]), nearness(records[i]), _gap(records[i])))


def needed(record: CandidateRecord, max_drop: float, max_slice_drop: float, *, budget_exhausted: bool,
           keep_float_exhausted: bool) -> str:  # fmt: skip
    """What the closest candidate lacks, in words: the drops over tolerance and what could close the gap."""
    gaps = []
    drop = record.drop if record.drop is not None else record.screen_drop
    if drop is not None and drop > max_drop:
        gaps.append(f"overall drop {compared(drop, max_drop)[0]} > {max_drop:g} "
                    f"(cut it by {percent(1 - max_drop / drop)})")  # fmt: skip
    slice_drop = record.worst_slice_drop
    if record.worst_slice is not None and slice_drop is not None and slice_drop > max_slice_drop:
        cut = 1 - max_slice_drop / record.worst_slice_drop
        shown = compared(record.worst_slice_drop, max_slice_drop)[0]
        gaps.append(f"{record.worst_slice} drop {shown} > {max_slice_drop:g} (cut it by {percent(cut)})")
    if not gaps and record.passed is False and record.verdict.startswith("fail: "):
        gaps.append(record.verdict.removeprefix("fail: "))  # no gap in gate.metric: another gated metric's, a problem
    ways = []
    if keep_float_exhausted:
        ways.append("more nodes in floating point than search.max_keep_float allows")
    if budget_exhausted:
        ways.append("a larger search.time_budget_s (candidates were left untried)")
    loosened = [f"max_drop ≥ {compared(drop, max_drop)[0]}"] if drop is not None and drop > max_drop else []
    if record.worst_slice_drop is not None and record.worst_slice_drop > max_slice_drop:
        loosened.append(f"max_slice_drop ≥ {compared(record.worst_slice_drop, max_slice_drop)[0]}")
    if loosened:
        ways.append("a looser gate (" + ", ".join(loosened) + ")")
    ways.append("a technique the search does not try (e.g. QAT)")
    return f"{'; '.join(gaps) or 'no measured gap'}; would need {' or '.join(ways)}"
