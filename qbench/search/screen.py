"""How the search reads its rows and verdicts: which selection rows it screens on, and a gate verdict as one number.

- `screening_indices`: the screening rows, spread over the selection rows, with a few of every slice.
- `evaluated_record`: a candidate's record with a full evaluation's figures and the gate's verdict on them.
- `gate_excess`: a full evaluation's verdict, largest drop / tolerance (select.excess).
- `screen_excess`: a screen's verdict, each share-of-rows drop less one row where the screen sampled its scope.
- `worst_slice`: the judged slice furthest from its tolerance.
- `overall_drop`, `overall_metric`, `p50s`: a verdict's overall drop, a result's overall figure and p50s by batch size.
- `progress_line`: the log's line on a candidate screened or evaluated.
- `ScreenOutputs`: the outputs screening gave, taken by the measurements of every row instead of running those again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from qbench.errors import one_line
from qbench.gate.evaluate import GateReport
from qbench.gate.report import failure_reasons
from qbench.gate.resolution import unresolved_reasons
from qbench.results.schema import AccuracyResult, SliceMetrics, VariantResult
from qbench.results.search import CandidateRecord
from qbench.search import select
from qbench.validate.catalogue import METRICS
from qbench.validate.measure import Measured
from qbench.validate.reuse import KnownOutputs

MIN_SLICE_ROWS = 3  # screening rows taken from every slice (when it has them)
VERDICT_CHARS = 300  # a verdict is a table cell: an ORT error's newlines collapsed, cut there


def screening_indices(slices: Mapping[str, np.ndarray], rows: int, wanted: int,
                      per_slice: int = MIN_SLICE_ROWS) -> np.ndarray:
    """About `wanted` row indices spread evenly over `rows`, plus at least `per_slice` rows of every slice
    (all of a smaller one), sorted."""
    picked = set(np.linspace(0, rows - 1, num=min(wanted, rows)).round().astype(int).tolist())
    for mask in slices.values():
        members = np.flatnonzero(mask)
        if len(members):
            spread = np.linspace(0, len(members) - 1, num=min(per_slice, len(members))).round().astype(int)
            picked |= set(members[spread].tolist())
    return np.asarray(sorted(picked), dtype=int)


def gate_excess(verdict: GateReport) -> float:
    """The gate's verdict as one number: largest drop / tolerance over its judged accuracy checks."""
    if verdict.problems:
        return math.inf
    return select.excess([(c.drop, c.tolerance) for c in verdict.checks if c.status != "skipped" and c.scope != "slo"])


def evaluated_record(record: CandidateRecord, verdict: GateReport, result: VariantResult) -> CandidateRecord:
    """`record` with a full evaluation's figures and the gate's `verdict` on them (qbench.gate.evaluate.judge): its
    pass, and why that pass is no evidence where the gate would hold it (`unresolved`: JudgedPass.counted)."""
    passed = verdict.exit_code == 0
    unresolved = unresolved_reasons(passed, verdict)
    if not passed:
        said = one_line(f"fail: {'; '.join(failure_reasons(verdict))}", VERDICT_CHARS)
    else:
        said = one_line(f"pass, unresolved: {unresolved}", VERDICT_CHARS) if unresolved else "pass (resolved)"
    slice_name, slice_drop = worst_slice(verdict)
    return record.with_(
        stage="evaluated", metric=overall_metric(result, verdict.metric), drop=overall_drop(verdict),
        worst_slice=slice_name, worst_slice_drop=slice_drop, excess=gate_excess(verdict), passed=passed,
        unresolved=unresolved, unresolved_on_spread=bool(unresolved) and verdict.unresolved_on_spread, verdict=said,
    )  # fmt: skip


def screen_excess(verdict: GateReport, result: VariantResult, full: AccuracyResult | None) -> float:
    """`gate_excess` on the screening rows, each share-of-rows drop less one row of its scope there when the screen
    holds only some of the scope's rows in `full` (FP32 on every selection row; select.beyond_one_unit): how
    promising a screened candidate is, not whether it passes. A scope the screen holds whole (a slice of 1 to 3
    rows) is judged as the gate will judge it."""
    if verdict.problems or result.accuracy is None:
        return math.inf
    checks = []
    for c in verdict.checks:
        if c.status == "skipped" or c.scope == "slo":
            continue
        # a gated metric's check (gate.metrics) by its own kind of drop; any other check as gate.metric's
        metric = c.metric if c.metric in verdict.gated_metrics else verdict.metric
        share = (info := METRICS.get(metric)) is not None and info.share_of_rows
        scope, whole = (scope_of(accuracy, c.scope) for accuracy in (result.accuracy, full))
        sampled = share and scope is not None and whole is not None and scope.size < whole.size
        count = scope.denominators.get(metric, scope.size) if sampled and scope is not None else 0
        checks.append((select.beyond_one_unit(c.drop, count), c.tolerance))
    return select.excess(checks)


def scope_of(accuracy: AccuracyResult | None, name: str) -> SliceMetrics | None:
    """The figures of scope `name` ('overall' or a slice's) in `accuracy` (None: none there)."""
    if accuracy is None:
        return None
    return accuracy.overall if name == "overall" else accuracy.slice(name)


def worst_slice(verdict: GateReport) -> tuple[str | None, float | None]:
    """The slice whose drop in the gate's metric is furthest from its tolerance, and that drop (the report's 'worst
    slice (drop)' and what `select.needed` measures against max_slice_drop: another check's figure is no such drop)."""
    judged = [c for c in verdict.checks
              if c.scope not in ("overall", "slo") and c.status != "skipped"
              and c.metric == verdict.metric]  # fmt: skip
    worst = max(judged, key=lambda c: c.drop / c.tolerance if c.tolerance > 0 else c.drop, default=None)
    return (worst.scope, worst.drop) if worst else (None, None)


def overall_drop(verdict: GateReport) -> float | None:
    return next((c.drop for c in verdict.checks if c.scope == "overall" and c.metric == verdict.metric), None)


def overall_metric(result: VariantResult, metric: str) -> float | None:
    return result.accuracy.overall.metrics.get(metric) if result.accuracy else None


def progress_line(record: CandidateRecord, metric: str, *, screened_rows: int | None = None) -> str:
    """The log's line on a candidate just screened (on `screened_rows` rows) or, without them, evaluated."""
    r = record
    if screened_rows is None:
        return f"  evaluate {r.label}: {metric} {r.metric:.4f}, {r.verdict}"
    speed = f"{r.speedup:.2f}× FP32" if r.speedup is not None and math.isfinite(r.speedup) else "speed n/a"
    return (f"  screen {r.label}: {metric} {r.screen_metric:.4f} on {screened_rows} rows (excess "
            f"{r.screen_excess:.2f}), {speed}")


def p50s(result: VariantResult) -> dict[int, float]:
    return {p.batch_size: p.p50_ms for p in result.latency.points} if result.latency else {}


class ScreenOutputs:
    """The screening rows' outputs, taken instead of running those rows again (qbench.validate.reuse): FP32's from its
    run on every row, for its screen; a candidate's from its screen, for its evaluation, where its rows were seen not
    to depend on their batch (any other is run on every row, as it would be without them). `reused_rows` counts the
    rows handed over (an evaluation that finds its rows do depend on their batch after all runs them anyway)."""

    enabled = True  # False: every measurement runs all of its rows (what taking them must agree with)

    def __init__(self, indices: np.ndarray) -> None:
        self.indices = indices  # the screening rows' positions in the rows candidates are judged on
        self.kept: dict[int, KnownOutputs] = {}
        self.reused_rows = 0

    def of_fp32(self, fp32: Measured) -> KnownOutputs | None:
        """FP32's outputs on the screening rows, from `fp32` (FP32 on every row judged on)."""
        if not self.enabled or fp32.outputs is None:
            return None
        return self._taken(KnownOutputs.of_rows(fp32.outputs, self.indices))

    def keep(self, index: int, screened: Measured) -> None:
        """Candidate `index`'s screen, kept for its evaluation when its rows did not depend on their batch there."""
        if self.enabled and screened.rows_independent and screened.outputs is not None:
            self.kept[index] = KnownOutputs(self.indices, screened.outputs)

    def take(self, index: int) -> KnownOutputs | None:
        """Candidate `index`'s screening outputs, for its evaluation (once: they are dropped then)."""
        known = self.kept.pop(index, None)
        return None if known is None else self._taken(known)

    def _taken(self, known: KnownOutputs) -> KnownOutputs:
        self.reused_rows += known.count
        return known
