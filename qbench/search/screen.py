"""How the search reads its rows and verdicts: which selection rows it screens on, and a gate verdict as one number.

- `screening_indices`: the screening rows, spread over the selection rows, with a few of every slice.
- `gate_excess`: a full evaluation's verdict, largest drop / tolerance (select.excess).
- `screen_excess`: a screen's verdict, each share-of-rows drop less one row where the screen sampled its scope.
- `worst_slice`: the judged slice furthest from its tolerance.
- `overall_drop`, `overall_metric`, `p50s`: a verdict's overall drop, a result's overall figure and p50s by batch size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from qbench.gate import GateReport
from qbench.results import AccuracyResult, SliceMetrics, VariantResult
from qbench.search import select
from qbench.validate.catalogue import METRICS

MIN_SLICE_ROWS = 3  # screening rows taken from every slice (when it has them)


def screening_indices(slices: Mapping[str, np.ndarray], rows: int, wanted: int, per_slice: int = MIN_SLICE_ROWS) -> np.ndarray:
    """About `wanted` row indices spread evenly over `rows`, plus at least `per_slice` rows of every slice
    (all of a smaller one), sorted."""
    picked = set(np.linspace(0, rows - 1, num=min(wanted, rows)).round().astype(int).tolist())
    for mask in slices.values():
        members = np.flatnonzero(mask)
        if len(members):
            picked |= set(members[np.linspace(0, len(members) - 1, num=min(per_slice, len(members))).round().astype(int)].tolist())
    return np.asarray(sorted(picked), dtype=int)


def gate_excess(verdict: GateReport) -> float:
    """The gate's verdict as one number: largest drop / tolerance over its judged accuracy checks."""
    if verdict.problems:
        return math.inf
    return select.excess([(c.drop, c.tolerance) for c in verdict.checks if c.status != "skipped" and c.scope != "slo"])


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
        scope, whole = (_scope(accuracy, c.scope) for accuracy in (result.accuracy, full))
        sampled = share and scope is not None and whole is not None and scope.size < whole.size
        count = scope.denominators.get(metric, scope.size) if sampled and scope is not None else 0
        checks.append((select.beyond_one_unit(c.drop, count), c.tolerance))
    return select.excess(checks)


def _scope(accuracy: AccuracyResult | None, name: str) -> SliceMetrics | None:
    if accuracy is None:
        return None
    return accuracy.overall if name == "overall" else accuracy.slice(name)


def worst_slice(verdict: GateReport) -> tuple[str | None, float | None]:
    """The slice whose drop in the gate's metric is furthest from its tolerance, and that drop (the report's 'worst
    slice (drop)' and what `select.needed` measures against max_slice_drop: another check's figure is no such drop)."""
    judged = [c for c in verdict.checks
              if c.scope not in ("overall", "slo") and c.status != "skipped" and c.metric == verdict.metric]  # fmt: skip
    worst = max(judged, key=lambda c: c.drop / c.tolerance if c.tolerance > 0 else c.drop, default=None)
    return (worst.scope, worst.drop) if worst else (None, None)


def overall_drop(verdict: GateReport) -> float | None:
    return next((c.drop for c in verdict.checks if c.scope == "overall" and c.metric == verdict.metric), None)


def overall_metric(result: VariantResult, metric: str) -> float | None:
    return result.accuracy.overall.metrics.get(metric) if result.accuracy else None


def p50s(result: VariantResult) -> dict[int, float]:
    return {p.batch_size: p.p50_ms for p in result.latency.points} if result.latency else {}
