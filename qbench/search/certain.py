"""Whether a screened candidate's failure on every row is already certain from its screening rows alone.

    why = certain_failure(screen_verdict.checks, candidate_screen, fp32_screen, fp32_all)   # None: not certain

The screening rows are some of the rows candidates are judged on, and a candidate's outputs on them are those its full
evaluation would take (the search hands them over where its rows do not depend on their batch). For a metric that is
the mean of a bounded figure each row has on its own (MetricInfo.row_mean: cosine <= 1, a share of rows), the best
a scope's figure on every row can be is what the screened rows hold with every other row perfect. When even that
misses a check's threshold, the full evaluation can only fail: it is not run, and its time goes to the candidates
that may pass. Only certainty counts, never likelihood: a check on any other metric, or on a scope the screen left
unjudged, is never read here.

Why from the screening rows and not in chunks of the full evaluation: `measure` runs a variant's rows, its
batch-dependence check and its scoring in one go on one loaded session; cutting it into chunks would load the model
once per chunk or split the scoring the gate reads. The screen is the chunk the search has already run, at no cost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from qbench.gate.metric_check import GateCheck
from qbench.results.schema import AccuracyResult
from qbench.search.screen import scope_of
from qbench.validate.catalogue import METRICS, drop, within


def best_on_every_row(value: float, seen: int, total: int, bound: float) -> float:
    """The best mean over `total` units when `seen` of them average `value` and every other one reaches `bound`."""
    return (value * seen + bound * (total - seen)) / total


def certain_failure(checks: Iterable[GateCheck], screened: AccuracyResult, fp32_screened: AccuracyResult,
                    fp32: AccuracyResult) -> str | None:  # fmt: skip
    """Why the candidate must fail the gate on every row, or None when it may pass.

    checks: the gate's checks of the candidate on the screening rows, with the tolerances of every row (a check the
    screen skipped, too few rows there or no figure, is not read: the full evaluation may judge it otherwise);
    screened / fp32_screened: the candidate's and FP32's figures on the screening rows; fp32: FP32's on every row (its
    figure each check's threshold is taken from, and each scope's units). FP32's NaN/inf rows on the screen are not
    counted as seen for a metric that leaves them out (cosine): counting fewer seen rows only raises the bound."""
    reasons = []
    for check in checks:
        info = METRICS.get(check.metric)
        if check.status == "skipped" or check.scope == "slo" or info is None or not info.row_mean:
            continue
        seen_scope, fp32_seen, whole = (scope_of(accuracy, check.scope) for accuracy in (screened, fp32_screened, fp32))
        if seen_scope is None or fp32_seen is None or whole is None:
            continue
        value, reference = seen_scope.metrics.get(check.metric, math.nan), whole.metrics.get(check.metric, math.nan)
        bound = info.high if info.higher_is_better else info.low
        seen = seen_scope.denominators.get(check.metric, seen_scope.size)
        seen -= 0 if info.counts_nonfinite_rows else fp32_seen.nonfinite_outputs
        total = whole.denominators.get(check.metric, whole.size)
        if not (math.isfinite(value) and math.isfinite(reference) and math.isfinite(bound)) or not 0 < seen <= total:
            continue
        best = best_on_every_row(value, seen, total, bound)
        if within(drop(check.metric, reference, best), check.tolerance, reference, best):
            continue
        units = "rows" if check.metric not in whole.denominators else "scored units"
        limit = reference - check.tolerance if info.higher_is_better else reference + check.tolerance
        said = f"at most {best:.4f} < {limit:.4f}" if info.higher_is_better else f"at least {best:.4f} > {limit:.4f}"
        scope = "overall" if check.scope == "overall" else f"slice {check.scope}"
        reasons.append(f"certain to fail after {seen} of {total} {units}: {scope} {check.metric} {said}")
    return "; ".join(reasons) or None
