"""The gate's tolerances as judged: `gate.max_drop` / `gate.max_slice_drop` resolved against FP32's own figure.

An absolute drop of 0.01 is a clear statement for a rate (accuracy, agreement, F1, cosine), but for a metric in the
data's units (an MAE, an output's largest error) it is arbitrary: 0.01 is nothing on a target of ~40 and a doubling
on a target of ~1e-4. So where the recipe states no tolerance and the gate metric is in the data's units
(`MetricInfo.data_units`), the defaults are read as shares of FP32's overall figure; `gate.tolerance: relative`
reads stated ones that way too, `absolute` keeps the defaults absolute. A relative tolerance of a figure that is 0
or not finite cannot be formed: that fails closed, asking for an explicit tolerance. The gate, the INT8 search,
`fallback:` and `qbench explain` all judge with what `resolve_tolerances` gives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qbench.errors import QbenchError
from qbench.recipe import GateSpec
from qbench.results import VariantResult
from qbench.validate.catalogue import METRICS

DEFAULT_MAX_DROP = 0.01
DEFAULT_MAX_SLICE_DROP = 0.02


@dataclass(frozen=True)
class Tolerances:
    """The largest allowed drops, overall and on each slice, in the gate metric's own units; `basis` says how they
    were formed when they are shares of FP32's figure ('' when they are the recipe's absolute values)."""

    max_drop: float
    max_slice_drop: float
    basis: str = ""


def is_relative(gate: GateSpec) -> bool:
    """Whether `gate`'s tolerances are shares of FP32's overall figure rather than drops in the metric's units."""
    if gate.tolerance != "auto":
        return gate.tolerance == "relative"
    stated = gate.max_drop is not None or gate.max_slice_drop is not None
    return not stated and gate.metric in METRICS and METRICS[gate.metric].data_units


def resolve_tolerances(gate: GateSpec, reference: float) -> Tolerances:
    """The tolerances `gate` sets, given FP32's overall figure of the gate metric (`reference`, on the rows judged).

    Raises QbenchError (one line, naming the fields to set) when they are relative and `reference` is 0 or not
    finite."""
    max_drop = DEFAULT_MAX_DROP if gate.max_drop is None else gate.max_drop
    max_slice_drop = DEFAULT_MAX_SLICE_DROP if gate.max_slice_drop is None else gate.max_slice_drop
    if not is_relative(gate):
        return Tolerances(max_drop, max_slice_drop)
    if not math.isfinite(reference) or reference == 0:
        why = ("gate.tolerance is relative" if gate.tolerance == "relative" else
               f"gate.max_drop and gate.max_slice_drop are not set and {gate.metric} is in the data's units, so their "
               "defaults are shares of FP32's figure")  # fmt: skip
        raise QbenchError(f"{why}, but FP32's overall {gate.metric} is {reference:g}: no relative tolerance can be "
                          f"formed; expected gate.max_drop and gate.max_slice_drop set to drops in {gate.metric}'s "
                          "own units (and gate.tolerance not relative)")  # fmt: skip
    scale = abs(reference)
    resolved = Tolerances(max_drop * scale, max_slice_drop * scale)
    basis = (f"max_drop {resolved.max_drop:.4g} = {max_drop * 100:g} % of FP32's {gate.metric} {reference:.4g}, "
             f"max_slice_drop {resolved.max_slice_drop:.4g} = {max_slice_drop * 100:g} % of it")
    return Tolerances(resolved.max_drop, resolved.max_slice_drop, basis)


def reference_tolerances(reference: VariantResult | None, gate: GateSpec) -> Tolerances:
    """`resolve_tolerances` against the FP32 result a candidate is judged against (its overall gate-metric figure,
    NaN when it has none)."""
    overall = reference.accuracy.overall.metrics if reference is not None and reference.accuracy is not None else {}
    return resolve_tolerances(gate, overall.get(gate.metric, math.nan))


def as_absolute(gate: GateSpec, tolerances: Tolerances) -> GateSpec:
    """`gate` with `tolerances` stated as absolute drops: what judges many candidates against one FP32 figure (the
    INT8 search's screening rows and `fallback:` judge with the tolerances resolved once, on the rows chosen on)."""
    return gate.model_copy(update={"max_drop": tolerances.max_drop, "max_slice_drop": tolerances.max_slice_drop,
                                   "tolerance": "absolute"})  # fmt: skip
