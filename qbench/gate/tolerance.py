"""The gate's tolerances as judged: `gate.max_drop` / `gate.max_slice_drop` resolved against FP32's own figure.

An absolute drop of 0.01 is a clear statement for a rate (accuracy, agreement, F1, cosine), but for a metric in the
data's units (an MAE, an output's largest error) it is arbitrary: 0.01 is nothing on a target of ~40 and a doubling
on a target of ~1e-4. So where the recipe states no tolerance and the gate metric is in the data's units
(`MetricInfo.data_units`), the defaults are read as shares of FP32's overall figure; `gate.tolerance: relative`
reads stated ones that way too, `absolute` keeps the defaults absolute. A relative slice tolerance is a share of
FP32's figure on that slice, not overall: a slice whose FP32 MAE is 10x the overall one would otherwise be held to a
tenth of its own scale's share (and one at 0.1x get ten times it). A relative tolerance of a figure that is 0 or not
finite cannot be formed: that fails closed, asking for an explicit tolerance (overall, or on a slice the gate judges).
The gate, the INT8 search, `fallback:` and `qbench explain` all judge with what `resolve_tolerances` gives.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from qbench.errors import QbenchError
from qbench.recipe.spec import GateSpec
from qbench.results.schema import VariantResult
from qbench.validate.catalogue import METRICS

DEFAULT_MAX_DROP = 0.01
DEFAULT_MAX_SLICE_DROP = 0.02


@dataclass(frozen=True)
class Tolerances:
    """The largest allowed drops, overall and on each slice, in the gate metric's own units; `basis` says how they
    were formed when they are shares of FP32's figure ('' when they are the recipe's absolute values).

    `max_slice_drop` is the drop allowed on every slice, or, where `slice_drops` is set (relative tolerances), the
    share of FP32's figure on each slice that `slice_drops` holds resolved by slice name."""

    max_drop: float
    max_slice_drop: float
    basis: str = ""
    slice_drops: Mapping[str, float] | None = None

    def on_slice(self, name: str) -> float:
        """The largest allowed drop on slice `name`; NaN (never a pass) for a relative one where FP32's figure on
        the slice is not finite or the slice is too small to judge (the gate judges nothing there)."""
        return self.max_slice_drop if self.slice_drops is None else self.slice_drops.get(name, math.nan)


def is_relative(gate: GateSpec) -> bool:
    """Whether `gate`'s tolerances are shares of FP32's overall figure rather than drops in the metric's units."""
    if gate.tolerance != "auto":
        return gate.tolerance == "relative"
    stated = gate.max_drop is not None or gate.max_slice_drop is not None
    return not stated and gate.metric in METRICS and METRICS[gate.metric].data_units


def resolve_tolerances(gate: GateSpec, reference: float, slices: Mapping[str, float] | None = None) -> Tolerances:
    """The tolerances `gate` sets, given FP32's overall figure of the gate metric (`reference`, on the rows judged)
    and its figure on each slice the gate judges (`slices`, by name).

    Raises QbenchError (one line, naming the fields to set) when they are relative and `reference`, or a slice's
    figure, is 0 or not finite (a slice's NaN is left to the gate: the metric is undefined there)."""
    max_drop = DEFAULT_MAX_DROP if gate.max_drop is None else gate.max_drop
    max_slice_drop = DEFAULT_MAX_SLICE_DROP if gate.max_slice_drop is None else gate.max_slice_drop
    if not is_relative(gate):
        return Tolerances(max_drop, max_slice_drop)
    if not math.isfinite(reference) or reference == 0:
        raise QbenchError(_unformed(gate, _why(gate), f"FP32's overall {gate.metric} is {reference:g}"))
    slices = dict(slices or {})
    zero = next((name for name, value in slices.items() if value == 0 or math.isinf(value)), None)
    if zero is not None:
        raise QbenchError(_unformed(gate, f"{_why(gate)} on each slice", f"FP32's {gate.metric} on slice {zero!r} is "
                                    f"{slices[zero]:g}"))  # fmt: skip
    resolved = max_drop * abs(reference)
    basis = (f"max_drop {resolved:.4g} = {max_drop * 100:g} % of FP32's {gate.metric} {reference:.4g}, "
             f"max_slice_drop {max_slice_drop * 100:g} % of FP32's {gate.metric} on each slice")
    drops = {name: max_slice_drop * abs(value) for name, value in slices.items() if math.isfinite(value)}
    return Tolerances(resolved, max_slice_drop, basis, drops)


def _why(gate: GateSpec) -> str:
    return ("gate.tolerance is relative" if gate.tolerance == "relative" else
            f"gate.max_drop and gate.max_slice_drop are not set and {gate.metric} is in the data's units, so their "
            "defaults are shares of FP32's figure")  # fmt: skip


def _unformed(gate: GateSpec, why: str, figure: str) -> str:
    return (f"{why}, but {figure}: no relative tolerance can be formed; expected gate.max_drop and "
            f"gate.max_slice_drop set to drops in {gate.metric}'s own units (and gate.tolerance not relative)")


def reference_tolerances(reference: VariantResult | None, gate: GateSpec) -> Tolerances:
    """`resolve_tolerances` against the FP32 result a candidate is judged against (its overall gate-metric figure,
    NaN when it has none, and its figure on each slice large enough to judge: gate.min_slice_size)."""
    accuracy = reference.accuracy if reference is not None else None
    if accuracy is None:
        return resolve_tolerances(gate, math.nan)
    slices = {s.name: s.metrics.get(gate.metric, math.nan) for s in accuracy.slices
              if s.judged_count(gate.metric) >= gate.min_slice_size}  # fmt: skip
    return resolve_tolerances(gate, accuracy.overall.metrics.get(gate.metric, math.nan), slices)


GivenTolerances = Tolerances | Mapping[str, Tolerances] | None
"""Tolerances resolved once for many candidates judged against one FP32 figure (qbench.search): gate.metric's, or
each gated metric's by name (`tolerances_by_metric`)."""


def tolerances_by_metric(reference: VariantResult | None, gate: GateSpec,
                         primary: Tolerances | None = None) -> dict[str, Tolerances]:  # fmt: skip
    """`reference_tolerances` of each metric `gate` judges (gate.metrics), by name; gate.metric's `primary` where
    they are resolved already."""
    return {one.metric: primary if primary is not None and one.metric == gate.metric else
            reference_tolerances(reference, one) for one in gate.per_metric()}  # fmt: skip


def given_for(tolerances: GivenTolerances, one: GateSpec, gate: GateSpec) -> Tolerances | None:
    """The resolved tolerances for gated metric `one` of `gate`; None where they are to be resolved against FP32."""
    if tolerances is None or isinstance(tolerances, Tolerances):
        return tolerances if one.metric == gate.metric else None
    return tolerances.get(one.metric)
