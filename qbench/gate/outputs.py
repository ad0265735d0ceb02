"""The gate's checks of evaluated outputs beside its metric.

Notes on outputs it does not judge: gate.metric names one output ('logits/accuracy'), so a variant that broke another
('aux') would pass unremarked. Each such output is held, as a note and never a verdict, to the tolerances the gate
would use for it, on the scopes the gate judges its own metric on: overall and every slice of at least
gate.min_slice_size. A break on one slice alone is as much a finding as one overall. A recipe's own metric over some
outputs ('cls_acc' with `outputs: [logits]`, one head of a multi-task model) gates those outputs alone: the recipe's
other metrics over outputs it does not read ('price_mae' over the regression head) are held the same way, and so is
an evaluated output no such figure covers, by its agreement with FP32 (before, with such a gate.metric, an INT8
variant whose regression head's MAE went from 0.0101 to 1.30 passed with no word said). A figure of another kind
than gate.metric's is held to its own default tolerances where the recipe's are drops in gate.metric's units
(_held_spec).

Collapsed outputs, a breach whatever the metric: a variant whose output is (nearly) the same on every row no longer
depends on its inputs, yet scores well on a metric a constant answer scores well on: accuracy on imbalanced classes
(ties go to the first class, the majority one), an error of a constant near the mean of low-variance targets, the
cosine of one vector with embeddings sharing a dominant direction. Such a variant is measured correctly, and broken:
it breaches, as a variant giving NaN/inf does. It is judged on the scopes the gate judges its metric on: a variant can
collapse on one slice alone (INT8 calibrated on one input regime clamps every row of another to one value), while
the other slices' rows keep its overall spread well above a tenth of FP32's. A variant saturating the few extreme rows
FP32's spread rests on (FP8's 448) falls below a tenth too: the breach says what was measured, not which.

Lost components, a breach whatever the metric: a PARTLY broken variant keeps its spread and most rows, yet lost one
kind of answer FP32 gives (qbench.validate.kept): a class it no longer decides (a collapsed logit or bias, one
label never switched on), the extreme rows of a target clamped at the calibration sample's range, a few embedding
dimensions stuck at a constant. A rare class, a 5 % tail, 3 of 32 dimensions move an overall figure less than a
tolerance, and no slice the recipe defines need isolate them. Judged on the same scopes, as a breach: the variant
gives wrong answers on every row of that kind, which no tolerance on an average was meant to allow. It is judged on
the output gate.metric names (every output where it names none); another output's loss is a note, as its drops are."""

from __future__ import annotations

import math
from collections.abc import Sequence

from qbench.errors import QbenchError
from qbench.gate.tolerance import Tolerances, reference_tolerances
from qbench.recipe.spec import GateSpec
from qbench.results.schema import Kept, SliceMetrics, SweepResults, VariantResult
from qbench.validate.catalogue import OUTPUT_SEPARATOR, drop, within
from qbench.validate.kept import across, comparable, lost

_UNFORMED = Tolerances(0.0, 0.0)  # a relative share of FP32's 0 cannot be formed: any drop is remarked

COLLAPSED = 0.1
"""An output whose spread across the evaluation rows (metrics.spread) is under this share of FP32's has collapsed.
Rounding to a precision adds noise to an output and leaves its spread within a few percent of FP32's; only a broken
variant (collapsed scales, values clamped to one bound, a layer giving one value) loses nine tenths of it."""

RESOLVED_SPREAD = 1 / 256
"""A slice on which FP32's output varies by under this share of its variation over every evaluation row (its overall
spread) varies by less than one step of an 8-bit integer grid spanning the output's values: an INT8 variant whose
output is quantized rounds all of it to one value by construction (a detector's scores on images without an object,
all within 1e-3 of 0, become 0), so losing it is rounding, not a collapse, and that slice's spread is not judged for an
INT8 variant (as one where FP32's is 0). A float format (FP16, BF16, FP8) keeps its relative precision near 0: such a
variant losing that variation is still judged."""

SPREAD_METRIC = "output_spread"


def collapsed_outputs(
    reference: SliceMetrics, own: SliceMetrics, grid_overall: SliceMetrics | None = None
) -> tuple[list[tuple[str, float, float]], list[str]]:
    """On one scope (overall, or a slice: the gate passes those it judges), (check name, FP32's spread, the
    variant's) for each evaluated output whose spread collapsed (COLLAPSED), and why it cannot be told: FP32's spread
    is recorded and the variant's is not (results edited, or written by another qbench); where neither is recorded
    nothing is judged here (results from before spreads were are refused as a whole: qbench.results.evidence). An
    output FP32 itself gives one value for on the scope (spread 0, or no finite row) has nothing to collapse; a variant
    with NaN/inf on every row of it (no spread) breaches on its NaN/inf outputs. Rounding keeps an output's variation
    unless all of it lies below the precision's step for every value of the output (small probabilities keep their
    relative precision), so an honest variant keeps nearly all of FP32's spread. For an INT8 variant (`grid_overall`:
    FP32's overall scope), an output FP32 varies by under RESOLVED_SPREAD of its overall spread on a slice is not
    judged there: no 8-bit grid over the output's values resolves that variation."""
    collapsed, problems = [], []
    where = "" if reference.name == "overall" else f" on slice {reference.name}"
    for output, ref_spread in reference.spread.items():
        name = f"{output}{OUTPUT_SEPARATOR}{SPREAD_METRIC}" if output and len(reference.spread) > 1 else SPREAD_METRIC
        impossible = [f"{who}'s {name}{where} is {spread:g}, {why}" for who, scope, spread in
                      (("FP32", reference, ref_spread), ("the variant", own, own.spread.get(output, 0.0)))
                      if (why := _impossible_spread(spread, scope, own.spread.get(output, 0.0) if scope is reference
                                                    else ref_spread))]  # fmt: skip
        if impossible:  # an edited figure: neither may hide the other's collapse (NaN or negative skipped the check)
            problems += [f"{text}: written by another qbench, or edited" for text in impossible]
            continue
        if not (math.isfinite(ref_spread) and ref_spread > 0):
            continue
        whole = grid_overall.spread.get(output, math.nan) if grid_overall is not None else math.nan
        if ref_spread < RESOLVED_SPREAD * whole:  # below one 8-bit step of its variation: rounding, no collapse
            continue
        if output not in own.spread:
            problems.append(f"the results record no {name}{where} for this variant (FP32's is {ref_spread:.4g}): "
                            "written by another qbench, or edited")  # fmt: skip
        elif own.spread[output] < COLLAPSED * ref_spread:  # NaN (no finite row) is no collapse
            collapsed.append((name, ref_spread, own.spread[output]))
    return collapsed, problems


def _impossible_spread(spread: float, scope: SliceMetrics, other: float) -> str:
    """Why a recorded spread is one metrics.spread cannot give, '' where it can: never negative nor infinite, and NaN
    only where no row of the scope is finite or the output is no numbers, in which case the other result's spread of
    the same output (`other`, measured on the same rows) is not a number either."""
    if spread < 0 or math.isinf(spread):
        return "a spread is a root of a sum of squares (0 or more, finite)"
    if math.isnan(spread) and scope.nonfinite_outputs < scope.size and math.isfinite(other):
        return (f"NaN on a scope with {scope.size - scope.nonfinite_outputs} rows of finite outputs, where the other "
                f"result's is {other:g} (a spread is NaN only where no row is finite, or the output holds no numbers)")
    return ""


def lost_components(reference: SliceMetrics, own: SliceMetrics, gated: str,
                    scopes: int) -> tuple[list[tuple[str, Kept]], list[str]]:  # fmt: skip
    """On one scope of the `scopes` the gate judges, (check name, the variant's Kept record, its chance corrected over
    them: qbench.validate.kept.across) for each output judged (`gated`, the output gate.metric names, or every one
    where that is '') whose record of what it kept (qbench.validate.kept) says it lost one, and
    why it cannot be told: FP32 records a component to judge and the variant's results record none, or one of a rule
    not judged with FP32's (edited, or written by another qbench; qbench.validate.kept.comparable). Where FP32 records
    none (no class decided on enough rows, no tail reaching past its plateau) nothing is judged; results from before
    qbench recorded any are refused as a whole (qbench.results.evidence). A record the variant lacks where it gives
    NaN/inf on rows FP32 is finite on is no sign of editing: those rows leave too few to judge (a regression output
    beyond FP16's range on every row of a slice), and the gate breaches on them already (nonfinite_outputs)."""
    found, problems = [], []
    where = "" if reference.name == "overall" else f" on slice {reference.name}"
    own_nonfinite = own.new_nonfinite_outputs > 0 or own.nonfinite_outputs > reference.nonfinite_outputs
    for output, ref_kept in reference.kept.items():
        if gated and output != gated:
            continue
        record = own.kept.get(output)
        named = output and len(reference.kept) > 1
        if record is None and own_nonfinite:
            continue
        if record is None or not comparable(ref_kept.rule, record.rule):
            name = f"{output}{OUTPUT_SEPARATOR}{ref_kept.rule}" if named else ref_kept.rule
            problems.append(f"the results record no {name}{where} for this variant (FP32's records "
                            f"{ref_kept.component}): written by another qbench, or edited")  # fmt: skip
        elif lost(record := across(record, scopes)):  # a NaN share (no figure) is no keep: fail closed
            found.append((f"{output}{OUTPUT_SEPARATOR}{record.rule}" if named else record.rule, record))
    return found, problems


def other_output_kept_notes(results: SweepResults, spec: GateSpec, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """A note per gated variant@backend and other evaluated output (not the one gate.metric names) that lost a
    component (lost_components) on some scope the gate judges, naming the first such scope (overall first)."""
    gated = {metric.rpartition(OUTPUT_SEPARATOR)[0] for metric in spec.gated_metrics}
    notes = []
    for variant, backend in pairs:
        reference, found = results.find(results.reference, backend), results.find(variant, backend)
        if "" in gated or reference is None or reference.accuracy is None or found is None or found.accuracy is None:
            continue  # no other output, or no figures: the gate's problems say why
        scopes = [(reference.accuracy.overall, found.accuracy.overall)]
        scopes += [(s, found.accuracy.slice(s.name)) for s in reference.accuracy.slices
                   if s.judged_count(spec.metric) >= spec.min_slice_size]  # fmt: skip
        for output in reference.accuracy.overall.kept:
            if output in gated:
                continue
            for ref_scope, own_scope in scopes:
                lost = lost_components(ref_scope, own_scope, output, len(scopes))[0] if own_scope else []
                if lost:
                    kept = lost[0][1]
                    where = "overall" if ref_scope.name == "overall" else f"on slice {ref_scope.name}"
                    notes.append(f"{found.key}: output {output} lost {kept.component} {where} ({kept.rule}: FP32 "
                                 f"{kept.reference:.4g}, the variant {kept.own:.4g}; not gated: {gated_text(spec)})")
                    break
    return notes


FALLBACK_KIND = "agreement"
"""The figure an evaluated output is held to where the gated metric's kind is not recorded for it and no metric of the
recipe's own reads it: rows (or values) agreeing with FP32's, recorded per output by every task that reads outputs
separately (classification, regression, structured, multilabel)."""


def gated_outputs(results: SweepResults, metric: str) -> tuple[frozenset[str], str]:
    """(the outputs `metric` judges, its kind on other outputs or ''): 'logits/accuracy' judges logits, and 'accuracy'
    is its kind; a recipe's own metric with `outputs` judges those, with no kind of its own elsewhere. Empty where the
    metric names no output (one output evaluated: there is no other)."""
    output, separator, kind = metric.rpartition(OUTPUT_SEPARATOR)
    if separator:
        return frozenset({output}), kind
    return frozenset(_joint_metrics(results).get(metric, ())), ""


def _joint_metrics(results: SweepResults) -> dict[str, tuple[str, ...]]:
    """The recipe's own metrics computed over several outputs together (`outputs`), name -> those outputs, as the
    results record the recipe; malformed entries are skipped (the gate's checks of the recorded recipe name them)."""
    resolved = results.recipe.get("resolved")
    entries = resolved.get("metrics") if isinstance(resolved, dict) else None
    return {entry["name"]: tuple(entry["outputs"]) for entry in (entries if isinstance(entries, list) else [])
            if isinstance(entry, dict) and isinstance(entry.get("name"), str)
            and isinstance(entry.get("outputs"), list)
            and all(isinstance(o, str) for o in entry["outputs"])}  # fmt: skip


def gated_text(spec: GateSpec) -> str:
    """'gate.metric is cls_acc', or 'gate.metrics are cls_acc, price_mae': what a note on an ungated figure cites."""
    if len(spec.gated_metrics) == 1:
        return f"gate.metric is {spec.metric}"
    return f"gate.metrics are {', '.join(spec.gated_metrics)}"


def _held(results: SweepResults, reference: VariantResult, metrics: Sequence[str]) -> list[tuple[str, str]]:
    """(metric, what it is of: "output aux's accuracy" or "price_mae (over price)") for each figure of FP32's that
    holds an output none of the gated `metrics` reads: a gated kind on each other output, the recipe's own metrics
    over other outputs only, and FALLBACK_KIND on an other output neither covers."""
    judged = [gated_outputs(results, metric) for metric in metrics]
    if any(not outputs for outputs, _ in judged):  # a metric of every output (one evaluated): there is no other
        return []
    gated = frozenset().union(*(outputs for outputs, _ in judged))
    kinds = list(dict.fromkeys(kind for _, kind in judged if kind))
    assert reference.accuracy is not None
    recorded = reference.accuracy.overall.metrics
    joint = {name: outputs for name, outputs in _joint_metrics(results).items()
             if name not in metrics and name in recorded and not gated & set(outputs)}  # fmt: skip
    covered = {output for outputs in joint.values() for output in outputs}
    held = []
    evaluated = dict.fromkeys(name.rpartition(OUTPUT_SEPARATOR)[0] for name in recorded if OUTPUT_SEPARATOR in name)
    for output in (o for o in evaluated if o not in gated):
        held_kinds = kinds + ([FALLBACK_KIND] if output not in covered else [])
        own_kind = next((k for k in held_kinds if f"{output}{OUTPUT_SEPARATOR}{k}" in recorded), None)
        if own_kind is not None:
            held.append((f"{output}{OUTPUT_SEPARATOR}{own_kind}", f"output {output}'s {own_kind}"))
    held += [(name, f"{name} (over {', '.join(outputs)})") for name, outputs in joint.items()]
    return held


def other_output_notes(results: SweepResults, spec: GateSpec, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """A note per gated variant@backend and figure holding an output gate.metric does not read (_held: 'aux/accuracy'
    beside 'logits/accuracy'; 'price_mae' over price beside 'cls_acc' over logits) that dropped past its tolerance on
    some scope, naming the worst scope (the largest drop) and how many scopes dropped past theirs."""
    notes = []
    for variant, backend in pairs:
        reference, found = results.find(results.reference, backend), results.find(variant, backend)
        if reference is None or reference.accuracy is None or found is None or found.accuracy is None:
            continue  # no figures: the gate's problems say why
        for metric, what in _held(results, reference, spec.gated_metrics):
            note = _output_note(reference, found, _held_spec(spec, metric))
            notes += [f"{found.key}: {what} dropped {note}; not gated: {gated_text(spec)})"] if note else []
    return notes


def _held_spec(spec: GateSpec, metric: str) -> GateSpec:
    """The gate spec an ungated `metric` is held to: the recipe's tolerances where `metric` is gate.metric's kind on
    another output ('aux/accuracy' beside 'logits/accuracy': the same units) or they are shares of FP32's figure
    (`gate.tolerance: relative`: shares of any metric); else that metric's own defaults (qbench.gate.tolerance), as the
    recipe's stated drops are in gate.metric's units: `max_drop: 0.05` meant for an accuracy held an MAE of 0.001 to
    a drop of 0.05 (a fiftyfold rise unremarked) and an MAE of 100 to one of 0.05 (0.1 % remarked). With several gated
    metrics (gate.metrics), the tolerances of the first of `metric`'s kind."""
    specs = spec.per_metric()
    same = next((one for one in specs if one.metric.rpartition(OUTPUT_SEPARATOR)[2]
                 == metric.rpartition(OUTPUT_SEPARATOR)[2]), None)  # fmt: skip
    if same is not None or specs[0].tolerance == "relative":
        return (same or specs[0]).model_copy(update={"metric": metric})
    return specs[0].model_copy(update={"metric": metric, "max_drop": None, "max_slice_drop": None,
                                       "tolerance": "auto"})  # fmt: skip


def _output_note(reference: VariantResult, found: VariantResult, spec: GateSpec) -> str:
    """'0.5000 > 0.02 on slice kind=b (FP32 0.9 → 0.4; 1 of 3 scopes' for the worst scope where `spec.metric`
    dropped past its tolerance, '' where it dropped past none."""
    try:
        tolerances = reference_tolerances(reference, spec)
    except QbenchError:
        tolerances = _UNFORMED
    assert reference.accuracy is not None and found.accuracy is not None
    scopes = [(reference.accuracy.overall, found.accuracy.overall, tolerances.max_drop)]
    scopes += [(s, found.accuracy.slice(s.name), tolerances.on_slice(s.name)) for s in reference.accuracy.slices
               if s.judged_count(spec.metric) >= spec.min_slice_size]  # fmt: skip
    beyond = []
    for ref_scope, own_scope, tolerance in scopes:
        lost = _lost(spec.metric, ref_scope, own_scope)
        if lost is not None and not within(lost[0], tolerance, lost[1], lost[2]):
            beyond.append((lost, tolerance, ref_scope.name))
    if not beyond:
        return ""
    (lost, ref_value, value), tolerance, name = max(beyond, key=lambda entry: entry[0][0])
    where = "overall" if name == "overall" else f"on slice {name}"
    return (f"{lost:.4f} > {tolerance:.4g} {where} (FP32 {ref_value:.4g} → {value:.4g}; {len(beyond)} of "
            f"{len(scopes)} scopes past the tolerance")


def _lost(metric: str, ref: SliceMetrics, own: SliceMetrics | None) -> tuple[float, float, float] | None:
    """(drop, FP32's figure, the variant's) on one scope; None where FP32's figure is not finite (nothing to hold
    the variant to) or the variant lacks the slice (the gate's own checks name a missing slice). A variant's
    NaN/inf figure against a finite FP32 one is an infinite drop."""
    ref_value = ref.metrics.get(metric, math.nan)
    if own is None or not math.isfinite(ref_value):
        return None
    value = own.metrics.get(metric, math.nan)
    return (drop(metric, ref_value, value) if math.isfinite(value) else math.inf), ref_value, value
