"""One gated metric on one scope (overall or a slice) of a variant against FP32: a `GateCheck` that passes, breaches,
or is skipped saying why (a slice under gate.min_slice_size, a metric the data leaves undefined for FP32 too, FP32 at
its metric's worst), or nothing where there is nothing to judge; `qbench.gate.evaluate` gathers them for every gated
variant, backend, metric and scope."""

from __future__ import annotations

import math
from dataclasses import dataclass

from qbench.gate.resolution import NOT_JUDGED
from qbench.recipe.spec import GateSpec
from qbench.results.schema import SliceMetrics
from qbench.validate.catalogue import METRICS, OUTPUT_SEPARATOR, drop, within

UNDER_MIN_SIZE = "under min_slice_size"  # the reason a slice smaller than gate.min_slice_size is not judged


@dataclass(frozen=True)
class GateCheck:
    variant: str
    backend: str
    scope: str  # "overall" or a slice name
    metric: str
    reference: float
    observed: float
    drop: float
    tolerance: float
    size: int
    status: str  # "pass" | "breach" | "skipped" (not judged: `reason` says why)
    # why a skipped check was not judged (UNDER_MIN_SIZE, or the metric is undefined there); a *_kept check's
    # component ("class 3", "column 0 top": qbench.validate.kept)
    reason: str = ""
    detail: str = ""  # a *_kept check's chance of its losses (qbench.validate.kept.chance_text)


def nonfinite_reference_hint(metric: str, ref: SliceMetrics) -> str:
    """Why `metric` is NaN where FP32 gives NaN/inf on some rows, and the metrics of the same output FP32 reports on
    this scope that count such rows (the catalogue says which) and are defined there: what to gate on instead."""
    output = metric.rpartition(OUTPUT_SEPARATOR)[0]
    counting = [name for name, value in ref.metrics.items()
                if name.rpartition(OUTPUT_SEPARATOR)[0] == output and name in METRICS
                and METRICS[name].counts_nonfinite_rows and math.isfinite(value)]  # fmt: skip
    where = f" (FP32 itself gives NaN/inf on {ref.nonfinite_outputs} of its {ref.size} rows"
    if counting:
        return f"{where}: gate on a metric that counts such rows: {', '.join(counting)})"
    return (f"{where}, and none of its metrics here counts such rows: make FP32 finite there, or leave those rows out "
            "with data.evaluation.filter)")


def _at_worst(metric: str, value: float) -> bool:
    """FP32's figure is its metric's worst (accuracy or F1 0): no variant can do worse, so a drop cannot show."""
    info = METRICS[metric]
    worst = info.low if info.higher_is_better else info.high
    return math.isfinite(worst) and value == worst


def undefined_for_fp32(metric: str, ref: SliceMetrics, own: SliceMetrics) -> bool:
    """The metric is NaN/inf on this scope for FP32 and the variant alike, and FP32 gives no NaN/inf output there:
    the data leaves it undefined (R² of a constant target, a one-row nn_agreement), so there is nothing to compare."""
    return (ref.nonfinite_outputs == 0 and not math.isfinite(ref.metrics.get(metric, math.nan))
            and metric in own.metrics and not math.isfinite(own.metrics[metric]))  # fmt: skip


def too_small(scope: SliceMetrics, spec: GateSpec) -> bool:
    """A slice whose gated figure rests on fewer rows (or scored units) than min_slice_size is reported, not judged
    (the overall scope always is)."""
    return scope.name != "overall" and scope.judged_count(spec.metric) < spec.min_slice_size


def check_scope(
    variant: str, backend: str, spec: GateSpec, ref: SliceMetrics, own: SliceMetrics, tolerance: float,
    *, explained: bool = False, either_way: bool = False,
) -> GateCheck | None:
    """One metric check; None when it cannot be judged. `explained`: the variant has more NaN/inf outputs
    than FP32 here, so a NaN metric is the variant's own failure (a breach), not unusable results. `either_way`: FP32
    on a later backend against the first's, where a gain beyond the tolerance breaches as a loss does: the same model
    scoring 0.9 on one backend and 0.878 on the first says one of them computes it wrong, and the first's variants,
    judged against its FP32, passed with it. A slice too
    small to judge, or one where the data leaves the metric undefined for FP32 too, is a skipped check saying why
    (never a pass); on the overall scope an undefined metric leaves nothing to judge (None)."""
    ref_value = ref.metrics.get(spec.metric, math.nan)
    value = own.metrics.get(spec.metric, math.nan)
    finite = math.isfinite(ref_value) and math.isfinite(value)
    observed_drop = drop(spec.metric, ref_value, value) if finite else math.inf
    # min_slice_size comes first: a slice too small to judge may have no metric value at all
    if too_small(own, spec):
        reason = UNDER_MIN_SIZE
    elif own.name != "overall" and undefined_for_fp32(spec.metric, ref, own):
        reason = f"{NOT_JUDGED}{spec.metric} is undefined on this scope for FP32 too"
    elif finite and not either_way and _at_worst(spec.metric, ref_value):
        reason = f"{NOT_JUDGED}FP32's {spec.metric} is {ref_value:g} here, its worst: no drop can show"
    elif not finite and not (explained and math.isfinite(ref_value)):
        return None
    else:
        status = "pass" if within(abs(observed_drop) if either_way else observed_drop, tolerance, ref_value,
                                  value) else "breach"  # fmt: skip
        return GateCheck(variant, backend, own.name, spec.metric, ref_value, value, observed_drop, tolerance,
                         own.judged_count(spec.metric), status)  # fmt: skip
    return GateCheck(variant, backend, own.name, spec.metric, ref_value, value, observed_drop, tolerance,
                     own.judged_count(spec.metric), "skipped", reason)  # fmt: skip
