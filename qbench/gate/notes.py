"""What the gate says beside its checks, as notes a passing verdict carries: tolerances that are shares of FP32's
figure, an FP32 reference giving NaN/inf on some rows, a variant chosen or calibrated on the rows that judge it, a
reference whose weights are stored rounded, a variant that computes as the reference does (its pass says nothing about
its precision), and model outputs no figure compares."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

from qbench.errors import QbenchError, first_named, named_some, one_line
from qbench.gate.tolerance import DEFAULT_MAX_DROP, DEFAULT_MAX_SLICE_DROP, is_relative, reference_tolerances
from qbench.recipe.spec import GateSpec
from qbench.results.schema import AccuracyResult, SweepResults, VariantResult
from qbench.tasks.selection import NAMED_LEFT_OUT
from qbench.validate.catalogue import (
    DECISION_METRICS,
    METRICS,
    ONE_CLASS_OUTPUTS,
    OUTPUT_SEPARATOR,
    SHARED_COSINES,
    UNCOMPARED_OUTPUTS,
)
from qbench.variants.base import lowered_nothing


def tolerance_notes(results: SweepResults, spec: GateSpec, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """A note per backend judged where the tolerances are shares of FP32's figure: what they came to there; and one
    where a recipe's own metric of undeclared units is judged on the absolute defaults (0.01 may mean nothing)."""
    info = METRICS.get(spec.metric)
    stated = spec.max_drop is not None or spec.max_slice_drop is not None or spec.tolerance != "auto"
    notes = [] if stated or info is None or not info.custom or info.data_units else [
        f"tolerances: the defaults, max_drop {DEFAULT_MAX_DROP:g} and max_slice_drop {DEFAULT_MAX_SLICE_DROP:g}, as "
        f"drops in {spec.metric}'s own units (a recipe's own metric: set data_units: true in metrics: for shares of "
        "FP32's figure, or state gate.max_drop and gate.max_slice_drop)"]  # fmt: skip
    notes += vacuous_tolerances(spec, _references(results, pairs))
    for backend in dict.fromkeys(b for _, b in pairs):
        with contextlib.suppress(QbenchError):  # unformed: each variant's problem says why
            basis = reference_tolerances(results.find(results.reference, backend), spec).basis
            notes += [f"tolerances on {backend}: {basis}"] if basis else []
    return notes


def vacuous_tolerances(spec: GateSpec, references: Sequence[VariantResult] = ()) -> list[str]:
    """A note per stated absolute tolerance no drop can exceed, so no variant can breach it, however wrong: one at
    least the gate metric's whole range (accuracy's 0..1: `max_drop: 1` meant as 1 % passed a variant whose accuracy
    fell from 1.0 to 0.776 with no word said), or, on a backend, at least the room FP32's own figure leaves (`max_drop:
    0.5` meant as 0.5 % on an FP32 accuracy of 0.45 passed a variant scoring 0.05, unsaid): FP32's figure to the
    metric's worst end, overall, and on each slice for max_slice_drop (where FP32's figure is its worst, the gate judges
    nothing: qbench.gate.resolution.unjudged_scopes). A note, not an error: a recipe may leave the verdict to the SLO
    on purpose. `references`: FP32's result on each backend judged."""
    info = METRICS.get(spec.metric)
    span = info.high - info.low if info is not None else math.inf
    if info is None or is_relative(spec):
        return []
    stated = [(field, value) for field, value in (("max_drop", spec.max_drop), ("max_slice_drop", spec.max_slice_drop))
              if value is not None]  # fmt: skip
    notes = [f"tolerances: gate.{field} {value:g} is {spec.metric}'s whole range ({info.low:g}..{info.high:g}) or "
             f"more, so no drop of it can breach {'overall' if field == 'max_drop' else 'on a slice'} (a tolerance in "
             f"percent? {value:g} % is {value / 100:g})"
             for field, value in stated if value >= span]  # fmt: skip
    worst = info.low if info.higher_is_better else info.high
    for reference in references if math.isfinite(worst) else ():
        for field, value in stated:
            if reference.accuracy is None or value >= span:  # the whole range: said above
                continue
            scopes = [reference.accuracy.overall] if field == "max_drop" else [
                scope for scope in reference.accuracy.slices if scope.judged_count(spec.metric) >= spec.min_slice_size]
            within_room = [f"{scope.name} ({scope.metrics[spec.metric]:.4g})" for scope in scopes
                           if 0 < abs(worst - scope.metrics.get(spec.metric, math.nan)) <= value]  # fmt: skip
            if within_room:
                where = within_room[0] if field == "max_drop" else \
                    f"on slice{'s' * (len(within_room) > 1)} {named_some(within_room)}"  # fmt: skip
                notes.append(f"tolerances on {reference.backend}: gate.{field} {value:g} is at least the most "
                             f"{spec.metric} can drop from FP32's figure {where}, to {worst:g} at worst, so no drop "
                             "of it can breach there")  # fmt: skip
    return notes


def _references(results: SweepResults, pairs: Sequence[tuple[str, str]]) -> list[VariantResult]:
    """FP32's result on each backend the gated pairs run on, once each, in their order; none where it is missing (the
    gate's problems say so)."""
    found = (results.find(results.reference, backend) for backend in dict.fromkeys(b for _, b in pairs))
    return [reference for reference in found if reference is not None]


def nonfinite_reference(results: SweepResults, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """A note per backend whose FP32 reference gives NaN/inf on some evaluation rows: there a variant is held only
    to adding no NaN/inf of its own, and every variant's metrics (FP32's own agreement too) count those rows as
    misses, so the drops are measured on the other rows."""
    notes = []
    for reference in _references(results, pairs):
        if reference.accuracy is not None and reference.accuracy.nonfinite_outputs:
            notes.append(f"{nonfinite_reference_rows(reference.key, reference.accuracy)}: on those rows variants are "
                         "only checked not to add NaN/inf, and every variant's metrics count them as "
                         "misses")  # fmt: skip
    return notes


def constant_reference(results: SweepResults, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """A note per backend whose FP32 reference gives the same output on every evaluation row (an evaluated output
    whose spread over them is 0, metrics.spread): its figures do not depend on the inputs, so a variant passes by
    giving that answer too, and a drop against it says nothing of how the variant computes on inputs that vary. A
    note, not a refusal: the figures are sound measurements of what the model computes on these rows (a model, or one
    of its outputs, may be constant there by design); what they cannot show is said with the verdict. Where other
    outputs vary, the inputs do reach the model: the note names the constant outputs alone and what their figures
    cannot show, not a model that ignores its inputs."""
    notes = []
    for reference in _references(results, pairs):
        accuracy = reference.accuracy
        if accuracy is None or accuracy.overall.size < 2:
            continue
        spreads = accuracy.overall.spread
        constant = [output for output, spread in spreads.items() if spread == 0]
        if not constant:
            continue
        rows = accuracy.overall.size
        named = ", ".join(repr(o) for o in constant if o)
        varying = [output for output, spread in spreads.items() if math.isfinite(spread) and spread > 0]
        if varying:
            notes.append(f"{reference.key}'s {'outputs' if len(constant) > 1 else 'output'} {named} "
                         f"{'are' if len(constant) > 1 else 'is'} the same on all {rows} evaluation rows (spread 0 "
                         f"across them) while {', '.join(map(repr, varying))} vary: figures on "
                         f"{'them' if len(constant) > 1 else 'it'} do not depend on the inputs, so a variant passes "
                         "there by giving that value too (an output constant by design, or one these rows never move)")
            continue
        what = f"outputs {named} spread" if len(constant) > 1 else f"output {named} spreads" if named else \
            "its output spreads"
        notes.append(f"{reference.key} gives the same answer on all {rows} evaluation rows "
                     f"({what} 0 across them): its "
                     "figures do not depend on the inputs, so a variant passes by giving that answer too and a "
                     "drop against it says nothing of how a variant computes on inputs that vary; check that "
                     "data.inputs feed what the model reads and that the model is the trained one")  # fmt: skip
    return notes


def nonfinite_reference_rows(key: str, accuracy: AccuracyResult) -> str:
    """'fp32@<backend> gives NaN/inf on 25 of 99 evaluation rows (kind=neg 9, kind=zero 16)' (the gate's note, the
    sweep's warning)."""
    where = ", ".join(f"{s.name} {s.nonfinite_outputs}" for s in accuracy.slices if s.nonfinite_outputs)
    return (f"{key} gives NaN/inf on {accuracy.nonfinite_outputs} of {accuracy.rows} evaluation rows"
            f"{f' ({where})' if where else ''}")


def chosen_on_judged_rows(results: SweepResults, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """A note per gated variant that a search chose among candidates on the evaluation rows themselves (no selection
    rows: qbench.selection_rows), or on selection rows some of which feed the model what evaluation rows feed it
    (kept apart by position, copied by content): the best of several tries on those inputs, its figures flatter it."""

    def chosen_on(rows: str) -> list[str]:
        return [f"{v}@{b}" for v, b in pairs
                if (found := results.find(v, b)) is not None
                and found.params.get("search.chosen_on") == rows]  # fmt: skip

    notes = [f"{key} was chosen among candidates on the evaluation rows that judge it: the best of several tries on "
             "those rows, its pass is optimistic (no calibration row with labels was left out of the evaluation to "
             "choose on)"
             for key in chosen_on("evaluation")]  # fmt: skip
    record = results.calibration
    shared = record.selection_overlap_rows if record is not None else None
    if shared:
        notes += [f"{key} was chosen among candidates on {record.selection_rows} selection rows of which {shared} "
                  "feed the model what evaluation rows feed it (the same inputs in both files, or twice in the "
                  "table): the choice saw inputs that judge it, its pass may be optimistic"
                  for key in chosen_on("selection")]  # fmt: skip
    return notes


def fitted_on_judged_rows(results: SweepResults, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """A note per gated variant fitted on calibration rows (static INT8/FP8, QAT, ModelOpt: `calibration_rows` > 0)
    where some of those rows feed the model what evaluation rows feed it (`data.calibration.overlap: allow`, a copy in
    `data.calibration.path`, a row repeated in the table): judged partly on rows it was fitted on, its figures flatter
    it. The sweep warns of the overlap; without this note a standalone `qbench gate` passed such a variant silently."""
    shared = results.calibration.evaluation_overlap_rows if results.calibration is not None else None
    if not shared:
        return []
    fitted = [f"{v}@{b}" for v, b in pairs
              if (found := results.find(v, b)) is not None and found.params.get("calibration_rows")]  # fmt: skip
    allowed = results.calibration.overlap == "allow"
    where = "data.calibration.overlap: allow" if allowed else "the same inputs twice in the table, or in both files"
    return [f"{key} was calibrated on rows that also judge it ({shared} of its {results.calibration.size} calibration "
            f"rows feed the model what evaluation rows feed it; {where}): its pass may be optimistic"
            for key in fitted]  # fmt: skip


def rounded_reference(results: SweepResults, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """Once, where the reference stores its weights in a smaller type (qbench.preflight.precision.stored_weights):
    every check here measures from that rounding."""
    stored = next((r.params["stored_weights"] for r in _references(results, pairs) if "stored_weights" in r.params),
                  None)
    return [f"the reference {results.reference} {stored}"] if stored else []


def unlowered(results: SweepResults, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """A note per gated variant computing as the reference does: its graph is the reference's own, or no node in it was
    quantized (a tree ensemble or float64 graph asked for INT8), no op of its torch form ran in its type (torch_trace's
    `runtime.lowered_ops`), or no contraction was lowered (`lowered_contractions`: MatMuls all in FP32 control flow,
    the condition lowered; or none in the graph, whose ONNX-ML predictors stay FP32: `fp32_predictors`). It passes,
    but its pass says nothing about that precision."""
    notes = []
    for variant, backend in pairs:
        found, reference = results.find(variant, backend), results.find(results.reference, backend)
        if found is None or reference is None or found.status != "ok" or found.precision == reference.precision:
            continue  # a variant that did not run computes in nothing: its failure is the finding
        counted_for = found.params.get("integer_kernels_of", backend)  # INT8 kernels are counted for one runtime
        same = found.params.get("identical_to") == results.reference or (
            lowered_nothing(found.params) and counted_for == backend) or found.params.get("runtime.lowered_ops") == 0
        weak = str(found.params.get("runtime.network", "")).startswith("weakly typed")  # TensorRT picks types itself
        contractions, predictors = found.params.get("contractions", 0), found.params.get("fp32_predictors", 0)
        kept = not weak and found.params.get("lowered_contractions") == 0 and (contractions > 0 or predictors > 0)
        if same or kept:
            why = (f"nothing in the graph was lowered to {found.precision}" if same
                   else f"none of its {contractions} contractions (MatMul, Conv...) was lowered" if contractions
                   else f"no contraction in the graph, and its {predictors} ONNX-ML predictor(s) stay "
                   "FP32")  # fmt: skip
            readers = [] if same else found.params.get("fp32_nodes_reading_lowered", [])
            after = {} if same or contractions else found.params.get("lowered_after_predictors", {})
            notes.append(computed_after_note(found, reference, predictors, after, readers) if after
                         else rounded_inputs_note(found, reference, why, readers) if readers
                         else f"{variant}@{backend} computes in {computed_in(reference)} ({why}): its pass says "
                         f"nothing about {found.precision}")  # fmt: skip
    return notes


def computed_in(reference: VariantResult) -> str:
    """What the reference computes in: its precision, or what its build found instead (`computes_in`: a float64
    graph, which no conversion or quantizer touches, so a variant left as it computes in float64, not FP32)."""
    return str(reference.params.get("computes_in", reference.precision))


def computed_after_note(
    found: VariantResult, reference: VariantResult, predictors: int, after: dict[str, int], readers: Sequence[str]
) -> str:
    """The note of a variant whose ONNX-ML predictors stay in the reference's precision but whose lowered nodes compute
    on what they give (`lowered_after_predictors`: an IsolationForest's score from its trees' path lengths). Its pass
    measures that arithmetic in its precision: an IsolationForest's BF16 scores moved by 0.0026 and its precision at
    FP32's threshold by 0.0122, where the note said it computed in FP32 and its pass said nothing about BF16."""
    computed = ", ".join(f"{count} {op}" for op, count in after.items())
    shown = first_named(readers, 3)
    also = (f"; its {reference.precision.upper()} node(s) {shown} also read values it rounds to {found.precision}"
            if readers else "")
    return (f"{found.key} keeps its {predictors} ONNX-ML predictor(s) in {reference.precision} (no contraction in the "
            f"graph), but computes on what they give in {found.precision} ({computed}): its pass measures "
            f"{found.precision} in that arithmetic after the predictors, not in them{also}")


def rounded_inputs_note(found: VariantResult, reference: VariantResult, why: str, readers: Sequence[str]) -> str:
    """The note of a variant computing as the reference does whose FP32 nodes read values it lowered (a MinMaxScaler
    lowered in front of FP32 trees: `fp32_nodes_reading_lowered`). Its figures measure that rounding (a feature moved
    across a tree's threshold): a BF16 pipeline's probabilities moved by up to 0.33 where the note said its pass
    said nothing about BF16, as if the variant were the FP32 model."""
    lowered = ", ".join(f"{count} {op}" for op, count in found.params.get("lowered_op_types", {}).items())
    shown = first_named(readers, 3)
    return (f"{found.key} computes in {computed_in(reference)} ({why}), but its {reference.precision.upper()} node(s) "
            f"{shown} read values it rounds to {found.precision} ({lowered} lowered): its pass measures that rounding "
            f"of their inputs (a value moved across a threshold), not {found.precision} arithmetic")


def ungated(results: SweepResults, spec: GateSpec, gated: Sequence[tuple[str, str]]) -> list[str]:
    """One note naming the variants that gate.applies_to leaves out, with their precision (and, for one that did not
    run, its status and why): the verdict says nothing of them, and an INT8 build named outside the globs (`quant-a`
    beside `int8-*`) is otherwise missed, as was one whose build failed or crashed the sweep's process (which
    `qbench sweep --gate` calls no pass, exit 2, where `qbench gate` on its results passed without a word)."""
    judged = set(gated)
    left = [f"{v.key} ({v.precision})" if v.status == "ok" else
            f"{v.key} ({v.precision}, {v.status}: {one_line(v.error or 'no reason recorded')})"
            for v in results.variants
            if v.variant != results.reference and (v.variant, v.backend) not in judged
            and not spec.applies(v.variant)]  # fmt: skip
    if not left:
        return []
    return [f"not judged by this gate (gate.applies_to: {', '.join(spec.applies_to)}): {', '.join(left)}"]


def skipped_by_backend(results: SweepResults, spec: GateSpec) -> list[str]:
    """One note naming the variants gate.applies_to picks that a backend could not run (status skipped: an ONNX
    Runtime INT8 form on a torch backend), with why: nothing judges them there, and a pass said
    '2 variants × 4 scopes' as if every variant asked for had been judged."""
    left = [f"{v.key} ({one_line(v.error or 'no reason recorded')})" for v in results.variants
            if v.status == "skipped" and v.variant != results.reference and spec.applies(v.variant)]  # fmt: skip
    return [f"not judged, as its backend cannot run it (status skipped): {named_some(left, '; ')}"] if left else []


def uncompared_outputs(results: SweepResults, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """One note naming the model's outputs that no figure compares with FP32 (FP32's `outputs_not_compared`, which the
    sweep records: qbench.tasks.selection.outputs_left_out): the verdict does not cover them, and a variant that breaks
    one passes. Results and the report said so in FP32's notes, but a CI log showed the pass alone. Once for every
    backend: each runs the same model's outputs."""
    left = list(dict.fromkeys(name for reference in _references(results, pairs)
                              for name in reference.params.get(UNCOMPARED_OUTPUTS, [])))  # fmt: skip
    if not left:
        return []
    them = "them" if len(left) > 1 else "it"
    named = first_named([repr(name) for name in left], NAMED_LEFT_OUT)
    return [f"output{'s' if len(left) > 1 else ''} {named} not compared with FP32 (no figure reads {them}): this "
            f"verdict does not cover {them}, a variant changing {them} passes; list the outputs to judge in "
            "model.outputs"]  # fmt: skip


def one_class_reference(results: SweepResults, spec: GateSpec, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """A note per backend where the gate metric is a decision figure (accuracy, agreement, flip_rate) of an output FP32
    puts in one class on every evaluation row at a split its graph does not state (qbench.validate.accuracy.
    one_class_readings): a variant passes unless it carries a score across that split, so its pass says little."""
    output, _, figure = spec.metric.rpartition(OUTPUT_SEPARATOR)
    if figure not in DECISION_METRICS:
        return []
    notes = []
    for reference in _references(results, pairs):
        found = reference.params.get(ONE_CLASS_OUTPUTS, [])
        if (output or (found[0] if len(found) == 1 else None)) in found:
            notes.append(f"{reference.key} decides every evaluation row one class on output {output or found[0]!r} "
                         f"(its notes say why): {spec.metric} moves only where a variant carries a score across the "
                         "split, so a pass on it says little about the variant")  # fmt: skip
    return notes


def cosine_without_room(results: SweepResults, spec: GateSpec, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """A note per backend where the gate metric is cosine and FP32's vectors share so much of one direction
    (SHARED_COSINES, over every evaluation row) that a variant answering another row's vector would drop it by no
    more than a tolerance: the check cannot tell a variant confusing rows from FP32. A small Whisper encoder's
    mean-pooled vectors share 0.99987, so under max_drop 0.01 an INT8 build keeping 72 % of what tells rows apart
    (nearest-neighbour agreement 0.54) passed on a drop of 1.8e-05 with no word said. A note, not an error: the
    figures are sound; what the tolerance judges is said with the verdict."""
    output, _, figure = spec.metric.rpartition(OUTPUT_SEPARATOR)
    if figure != "cosine":
        return []
    notes = []
    for reference in _references(results, pairs):
        shared = reference.params.get(SHARED_COSINES) or {}  # output -> a number or null (results_fields)
        value = shared.get(output) if output else next(iter(shared.values())) if len(shared) == 1 else None
        if value is None or not math.isfinite(value):
            continue
        room = 1.0 - value
        try:
            tolerances = reference_tolerances(reference, spec)
        except QbenchError:
            continue  # unformed: the gate's problems say why
        loose = [f"max_drop {tolerances.max_drop:.4g}"] if tolerances.max_drop >= room else []
        if tolerances.slice_drops is None and tolerances.max_slice_drop >= room:
            loose.append(f"max_slice_drop {tolerances.max_slice_drop:.4g}")
        if loose:
            notes.append(f"{reference.key}'s vectors{f' on output {output!r}' if output else ''} share a cosine of "
                         f"{value:.6g} across the evaluation rows: a variant answering another row's vector scores "
                         f"about that, a drop of {room:.2g}, within {' and '.join(loose)}, so {spec.metric} cannot "
                         "tell a variant confusing rows from FP32; gate on nn_agreement, or state tolerances below "
                         f"{room:.2g}")  # fmt: skip
    return notes


LABEL_ERRORS = ("mae", "rmse", "r2", "r2_min", "max_error")
"""Regression figures against the labels: blind to a variant's changes smaller than FP32's own errors there."""


def reference_worse_than_the_mean(results: SweepResults, spec: GateSpec, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """A note per backend where the gate metric is a regression error against the labels and FP32 predicts them worse
    than their own mean would (R² below 0 over every evaluation row): labels in other units, another target or a shift
    are likelier than a model anyone ships, and a drop against them cannot see a variant's changes smaller than FP32's
    own errors (targets scaled by 100 and shifted by 1000 passed an INT8 variant on MAE and on relative R², FP32's R²
    -55). A note, not an error: an evaluation set drifted from the training data is read so legitimately."""
    output, separator, figure = spec.metric.rpartition(OUTPUT_SEPARATOR)
    if figure not in LABEL_ERRORS:
        return []
    key = f"{output}{separator}r2"
    notes = []
    for reference in _references(results, pairs):
        r2 = None if reference.accuracy is None else reference.accuracy.overall.metrics.get(key)
        if r2 is not None and r2 < 0:
            notes.append(f"{reference.key} predicts the labels worse than their mean does (R² {r2:.4g} over every "
                         f"evaluation row): labels in other units, of another target or shifted? A drop in "
                         f"{spec.metric} against them cannot see a variant's changes smaller than FP32's own errors; "
                         "check data.label, or gate on agreement (FP32's outputs as the truth)")  # fmt: skip
    return notes
