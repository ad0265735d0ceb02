"""The gate: does each gated variant stay within the accuracy tolerance, overall and on every slice?

`evaluate_gate` is pure (results + gate spec in, every check out). It fails
closed: a missing reference, a failed variant, a missing or NaN metric, or a
variant the recipe names but the results lack is a *problem* (exit 2), never a pass.
`qbench.gate.run.run_gate` first checks that the results are what the recipe asked for, intact and
fresh (qbench.gate.checks, qbench.gate.fresh, qbench.provenance), whatever the file claims.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import qbench
from qbench.errors import QbenchError, named_some, short_repr
from qbench.frontier.pareto import mixed_timing_machines, slower_than_reference_notes
from qbench.gate.checks import unmatched_globs
from qbench.gate.metric_check import GateCheck, check_scope, nonfinite_reference_hint, too_small, undefined_for_fp32
from qbench.gate.notes import (
    chosen_on_judged_rows,
    constant_reference,
    cosine_without_room,
    fitted_on_judged_rows,
    nonfinite_reference,
    one_class_reference,
    reference_worse_than_the_mean,
    rounded_reference,
    skipped_by_backend,
    tolerance_notes,
    uncompared_outputs,
    ungated,
    unlowered,
)
from qbench.gate.outputs import (
    COLLAPSED,
    collapsed_outputs,
    lost_components,
    other_output_kept_notes,
    other_output_notes,
)
from qbench.gate.resolution import interval_problems, rows_alone, unjudged_scopes, unresolved
from qbench.gate.tolerance import GivenTolerances, Tolerances, given_for, reference_tolerances
from qbench.recipe.slo import SloSpec
from qbench.recipe.spec import GateSpec
from qbench.results.evidence import names_code, unrecorded
from qbench.results.schema import SweepResults, VariantResult
from qbench.slo import SLO_METRIC, SLO_SCOPE, SloJudgement, judge_slo
from qbench.validate.catalogue import (
    OUTPUT_SEPARATOR,
    custom_metrics,
    recorded_custom_metrics,
)
from qbench.validate.kept import KEPT, chance_text

EXIT_PASS = 0
EXIT_BREACH = 1
EXIT_UNUSABLE = 2


@dataclass(frozen=True)
class GateReport:
    metric: str  # gate.metric (the first of gate.metrics): the one the frontier and the search's figures are of
    checks: tuple[GateCheck, ...] = ()
    problems: tuple[str, ...] = ()  # why the results cannot be judged (fail closed)
    gated: tuple[str, ...] = field(default=())  # variant@backend keys the gate applied to
    notes: tuple[str, ...] = ()  # what the gate did not check, at the user's request
    # (variant@backend, why) for each pass that is no evidence on some scope, too small to resolve its tolerance or
    # one no gated metric judges (qbench.gate.resolution), whether or not the gate held it (`resolve`): the whys,
    # `unresolved`, are what gate.unresolved holds
    unresolved_passes: tuple[tuple[str, str], ...] = ()
    # some of those fall short on the spread of the variant's own figures, not on the rows alone: another variant
    # judged on the same rows may resolve its pass (qbench.gate.resolution.rows_alone)
    unresolved_on_spread: bool = False
    # the problem saying a signal (SIGTERM, SIGINT: a CI timeout, a cancelled job) ended the command before its verdict
    # stood, where one did (qbench.cli.gate): the reports call that ending 'interrupted', not 'unusable'; exit code 2
    interrupted: str = ""
    # the problem that ended the command after its verdict stood, other than a signal (a registry or MLflow failure,
    # report files unwritten, an unexpected error): the reports call that ending 'error', not 'unusable' (the results
    # were judged); exit code 2
    failed_after_verdict: str = ""
    # the FP32 reference's name and the backend whose FP32 every other backend's FP32 is judged against (the first):
    # FP32 on a later backend is gated as a variant is (its key in `gated`), and where it breaches, or cannot be
    # judged, no variant of its backend passes
    reference: str = ""
    reference_backend: str = ""
    metrics: tuple[str, ...] = ()  # every gated metric, `metric` first, where gate.metrics gates several

    @property
    def gated_metrics(self) -> tuple[str, ...]:
        """Every metric the gate judged, gate.metric first."""
        return self.metrics or (self.metric,)

    @property
    def metric_text(self) -> str:
        """'cls_acc', or 'cls_acc, price_mae' where several metrics are gated: what headings say the gate is on."""
        return ", ".join(self.gated_metrics)

    @property
    def unresolved(self) -> tuple[str, ...]:
        """Why each pass gate.unresolved holds is no evidence: what the INT8 search ranks its candidates' passes by."""
        return tuple(why for _, why in self.unresolved_passes)

    @property
    def breaches(self) -> tuple[GateCheck, ...]:
        return tuple(c for c in self.checks if c.status == "breach")

    @property
    def exit_code(self) -> int:
        if self.problems:
            return EXIT_UNUSABLE
        return EXIT_BREACH if self.breaches else EXIT_PASS

    def status_of(self, variant: str, backend: str) -> str:
        """'pass', 'fail' or 'not gated' for one variant on one backend ('fail' too where its results, or the
        results as a whole, cannot be judged: fail closed)."""
        key = f"{variant}@{backend}"
        if key not in self.gated:
            return "not gated"
        owners = (*self.judged_with(variant, backend), None)
        own = [c for c in self.checks if f"{c.variant}@{c.backend}" in owners]
        unjudged = any(problem_owner(self.gated, p) in owners for p in self.problems)
        return "fail" if unjudged or any(c.status == "breach" for c in own) else "pass"

    def judged_with(self, variant: str, backend: str) -> tuple[str, ...]:
        """The keys whose checks and problems a variant's verdict rests on: its own, and its backend's FP32 where that
        is gated (a later backend's, judged against the first backend's: a variant is judged against it, so it must
        itself agree)."""
        key, fp32 = f"{variant}@{backend}", f"{self.reference}@{backend}"
        return (key, fp32) if fp32 in self.gated and fp32 != key else (key,)

    def fp32_differs(self) -> dict[str, str]:
        """Backend -> the line saying its FP32 breaches against the first backend's FP32 (`reference_backend`), for
        each later backend whose FP32 does: every variant of that backend fails with it, and none of its rows may be
        named the cheapest (qbench.report.serving)."""
        lines: dict[str, list[str]] = {}
        for check in sorted(self.breaches, key=lambda c: c.metric not in self.gated_metrics):  # gated metrics first
            if check.variant == self.reference and check.backend != self.reference_backend and check.scope != SLO_SCOPE:
                lines.setdefault(check.backend, []).append(
                    f"{check.scope} {check.metric} {check.reference:.4g} → {check.observed:.4g}"
                    if math.isfinite(check.reference) else f"{check.scope} {check.metric}")
        return {backend: f"backend {backend}'s FP32 differs from backend {self.reference_backend}'s FP32: "
                         f"{named_some(found, '; ')}; its variants cannot pass and its rows cannot be the cheapest"
                for backend, found in lines.items()}  # fmt: skip

    def fp32_problems(self, backend: str) -> list[str]:
        """The problems leaving FP32 on a later `backend` unjudged against the first backend's (the first's FP32
        unusable, a slice missing...): every variant of that backend fails with them (`status_of`), though none is
        its own, as with a breach `fp32_differs` names."""
        key = f"{self.reference}@{backend}"
        return [p for p in self.problems if key in self.gated and problem_owner(self.gated, p) == key]


def problem_owner(gated: Sequence[str], problem: str) -> str | None:
    """The variant@backend of `gated` a problem ('int8@cpu: ...') or a note ('int8@cpu computes ...') is about, or
    None when it is about the results as a whole."""
    return next((key for key in gated if problem.startswith((f"{key}: ", f"{key} "))), None)


def withheld(report: GateReport) -> GateReport:
    """What an unusable report may still say: only what the results it refused do not underlie.

    A problem about the results as a whole (stale, inconsistent, a glob that picks nothing) leaves no check and no
    note drawn from them: a CI log showing PASS lines, or a variant "the better choice", beside exit 2 would state
    what nobody judged. A problem of one variant@backend withholds that variant's passes and notes, keeping a breach
    found on its sound figures (a slice FP32 scores, beside an overall FP32's NaN leaves undefined): evidence against
    it, never for it; an SLO problem (`<key>: SLO: ...`) withholds all of its SLO checks. The other variants were
    judged on results nothing is wrong with."""
    if not report.problems:
        return report
    owners = [(problem_owner(report.gated, p), p) for p in report.problems]
    if any(owner is None for owner, _ in owners):
        return replace(report, checks=(), notes=())
    whole = {owner for owner, p in owners if not p.startswith(f"{owner}: SLO:")}
    slo = {owner for owner, p in owners if p.startswith(f"{owner}: SLO:")}
    checks = tuple(c for c in report.checks if not (f"{c.variant}@{c.backend}" in whole and c.status != "breach")
                   and not (c.scope == SLO_SCOPE and f"{c.variant}@{c.backend}" in slo))  # fmt: skip
    notes = tuple(n for n in report.notes if problem_owner(report.gated, n) not in whole)
    return replace(report, checks=checks, notes=notes)


def judge(reference: VariantResult, candidate: VariantResult, gate: GateSpec, tolerances: GivenTolerances = None,
          distinct_inputs: Mapping[str, int] | None = None) -> GateReport:  # fmt: skip
    """The gate's verdict on one candidate against FP32, as `qbench gate` would give it (for searches), but for
    gate.unresolved: a pass on too few rows, or beside a scope no gated metric judges, is still a pass here, its
    reasons in the report's `unresolved` (the INT8 search ranks a resolved pass over an unresolved one), and
    JudgedPass.counted says whether `qbench gate` counts it on the same figures. `tolerances`: resolved once for many
    candidates (on the rows chosen on), rather than against `reference`'s figures (gate.metric's alone, or each gated
    metric's by name: another is resolved against `reference`). `distinct_inputs`: of the rows judged on, as results
    record them (validate.measure.Rows.distinct_inputs): copies of an input among them count as one, as the gate
    counts them."""
    results = SweepResults(
        qbench_version=qbench.__version__, created_at="", recipe={}, environment={}, calibration=None,
        evaluation_rows=candidate.accuracy.rows if candidate.accuracy else 0, gate_metric=gate.metric,
        reference=reference.variant, variants=(reference, candidate), distinct_inputs=dict(distinct_inputs or {}),
    )  # fmt: skip
    return evaluate_gate(results, gate.model_copy(update={"applies_to": [candidate.variant]}), tolerances=tolerances,
                         resolve=False)


def evaluate_gate(
    results: SweepResults,
    spec: GateSpec,
    *,
    expected: Sequence[tuple[str, str]] | None = None,
    slo: SloSpec | None = None,
    tolerances: GivenTolerances = None,
    resolve: bool = True,
) -> GateReport:
    """Judge every gated variant × backend in `results` against `spec`; collect every violation.

    expected: (variant, backend) pairs the recipe asks for; any missing from the results is a problem.
    tolerances: resolved once, for many candidates judged against one FP32 figure (the search's screening rows):
        gate.metric's, or each gated metric's by name; by default (and for a gated metric they leave out) each
        backend's are resolved against its FP32 result (qbench.gate.tolerance).
    resolve: whether a pass needs a scope large enough to resolve its tolerance (qbench.gate.resolution): one that
        does not is a problem of its variant, or a note under `gate.unresolved: note`.
    slo: a latency budget: every variant it applies to (the reference aside) gets a check with scope
        "slo" and metric "latency.p99_ms" (reference = budget, observed = p99, drop = ms over budget).
    A variant a backend cannot run at all (status "skipped", e.g. an ONNX Runtime INT8 model on
    a torch backend) is not judged there; the report lists it with the reason. Whether results are
    what the recipe asked for, and fresh, is checked by `run_gate` (qbench.gate.run).
    """
    with custom_metrics(recorded_custom_metrics(results.recipe.get("resolved", {}))):  # the results' own directions
        return _evaluate(results, spec, expected, slo, tolerances, resolve)


def _evaluate(results: SweepResults, spec: GateSpec, expected: Sequence[tuple[str, str]] | None,
              slo: SloSpec | None, tolerances: GivenTolerances, resolve: bool) -> GateReport:  # fmt: skip
    problems: list[str] = missing_evidence(results, slo)
    unresolved_notes: list[str] = []
    small_passes: list[tuple[str, str]] = []
    on_spread = False
    pairs = list(expected) if expected is not None else [(v.variant, v.backend) for v in results.variants]
    skipped = {(v.variant, v.backend) for v in results.variants if v.status == "skipped"}
    gated = [(v, b) for v, b in pairs if v != results.reference and spec.applies(v) and (v, b) not in skipped]
    # a glob that picks no variant (a typo) would leave the variant it meant unjudged: fail closed
    names = list(dict.fromkeys(v for v, _ in pairs if v != results.reference))
    slo_globs = [("slo.applies_to", slo.applies_to)] if slo is not None and slo.applies_to is not None else []
    globs = [("gate.applies_to", spec.applies_to), *slo_globs]
    problems += [f"{field}: {why}" for name, patterns in globs
                 for field, why in unmatched_globs(name, patterns, results.reference, names)]  # fmt: skip
    if not gated:
        problems.append(f"the gate applies to no variant (applies_to: {', '.join(spec.applies_to)})")
    backends = list(dict.fromkeys(b for v, b in pairs if v == results.reference))
    first = backends[0] if backends else ""
    # FP32 on each later backend, judged against the first backend's FP32 as a variant is against its backend's
    later_fp32 = [(results.reference, b) for b in backends[1:] if (results.reference, b) not in skipped]
    checks: list[GateCheck] = []
    specs = spec.per_metric()  # every gated metric, judged by the same rules; their shared checks counted once
    for variant, backend in [*later_fp32, *gated]:
        against = first if variant == results.reference else backend
        own_checks, own_problems, unresolved_scopes, spread = [], [], [], False
        for one in specs:
            found = _judge(results, variant, backend, one, given_for(tolerances, one, spec), against)
            own_checks, own_problems = [*own_checks, *found[0]], [*own_problems, *found[1]]
            unresolved_scopes, spread = [*unresolved_scopes, *found[2]], spread or found[3]
        own_checks, own_problems = list(dict.fromkeys(own_checks)), list(dict.fromkeys(own_problems))
        unresolved_scopes = list(dict.fromkeys(unresolved_scopes))
        checks.extend(own_checks)
        problems.extend(f"{variant}@{backend}: {p}" for p in own_problems)
        # a breach blocks the variant (exit 1): its passes that are no evidence (too few rows, undefined) are then notes
        breached = any(c.status == "breach" for c in own_checks)
        held = problems if spec.unresolved == "fail" and not breached else unresolved_notes
        if _same_graph(results, variant, backend):
            continue
        # recorded held or not (`resolve`): `judge` gives the searches what the gate holds (JudgedPass.counted)
        unjudged = unjudged_scopes(own_checks)
        small_passes += [(f"{variant}@{backend}", why) for why in [unjudged, *unresolved_scopes] if why]
        on_spread |= spread
        if resolve and unjudged:
            held.append(f"{variant}@{backend}: {unjudged}")
        if resolve and unresolved_scopes:
            held.append(f"{variant}@{backend}: too few rows to resolve the tolerance: "
                        f"{named_some(unresolved_scopes, '; ')}")
    if slo is not None:
        slo_pairs = [(v, b) for v, b in pairs if v != results.reference and slo.applies(v, spec.applies_to)
                     and (v, b) not in skipped]  # fmt: skip
        batch_sizes = results.recipe.get("latency", {}).get("batch_sizes") or [1]
        judgements, slo_problems = judge_slo(results, slo, slo_pairs, batch_sizes)
        checks.extend(_slo_check(j) for j in judgements)
        problems.extend(slo_problems)
        gated += [pair for pair in slo_pairs if pair not in gated]
    per_metric = [note for one in specs for note in (*tolerance_notes(results, one, gated),
                  *one_class_reference(results, one, gated), *reference_worse_than_the_mean(results, one, gated),
                  *cosine_without_room(results, one, gated))]
    return withheld(GateReport(
        metric=spec.metric, metrics=spec.gated_metrics if len(specs) > 1 else (),
        checks=tuple(checks), problems=tuple(problems),
        gated=tuple(f"{v}@{b}" for v, b in [*later_fp32, *gated]),
        reference=results.reference, reference_backend=first,
        unresolved_passes=tuple(small_passes), unresolved_on_spread=on_spread,
        notes=(*unresolved_notes, *dict.fromkeys(per_metric), *other_output_notes(results, spec, gated),
               *other_output_kept_notes(results, spec, gated), *uncompared_outputs(results, gated),
               *unlowered(results, gated), *ungated(results, spec, gated), *skipped_by_backend(results, spec),
               *chosen_on_judged_rows(results, gated),
               *fitted_on_judged_rows(results, gated), *nonfinite_reference(results, gated),
               *constant_reference(results, gated),
               *rounded_reference(results, gated),
               *mixed_timing_machines(results),
               *slower_than_reference_notes(results, {f"{v}@{b}" for v, b in gated})),
    ))


def missing_evidence(results: SweepResults, slo: SloSpec | None) -> list[str]:
    """The one problem of results that lack a kind of evidence a check of this gate needs (qbench.results.evidence):
    written before qbench recorded it, they would pass that check unjudged. None where every kind is recorded."""
    task = results.recipe.get("task")  # a file without one (edited) needs every task's kinds
    several = len({v.backend for v in results.variants}) > 1
    lacking = unrecorded(results.evidence, slo=slo is not None, task=task if isinstance(task, str) else None,
                         several_backends=several, names_code=names_code(results.recipe.get("resolved")))  # fmt: skip
    if not lacking:
        return []
    return [f"results written by qbench {short_repr(results.qbench_version)} record no "
            f"{', '.join(e.name for e in lacking)} (this qbench's sweep records them), so these checks cannot be "
            f"applied: {'; '.join(e.checks for e in lacking)}; re-run `qbench sweep`"]  # fmt: skip


def _same_graph(results: SweepResults, variant: str, backend: str) -> bool:
    """The variant is FP32's own graph (a tree ensemble asked for INT8): it gives FP32's outputs on every input, so
    its pass rests on no sample of rows and needs no resolution."""
    found = results.find(variant, backend)
    return found is not None and found.params.get("identical_to") == results.reference


def _judge(results: SweepResults, variant: str, backend: str, spec: GateSpec, resolved: Tolerances | None = None,
           against: str | None = None) -> tuple[list[GateCheck], list[str], list[str], bool]:  # fmt: skip
    """Checks for one variant on one backend, the reasons it cannot be judged (if any) and why each of its passes
    on a scope too small to resolve the tolerance is no evidence (and whether one of those falls short on its spread,
    not on its rows alone); `resolved`: the tolerances to judge with, rather
    than those resolved against the reference's figures; `against`: the backend whose FP32 it is judged against
    (default: its own; the first backend's for FP32 on a later one)."""
    against = against or backend
    reference = results.find(results.reference, against)
    candidate = results.find(variant, backend)
    if reference is None or reference.status != "ok" or reference.accuracy is None:
        return [], [f"no usable FP32 reference on {against}"], [], False
    if candidate is None:
        return [], ["no results for this variant (partial or interrupted sweep?)"], [], False
    if candidate.status != "ok" or candidate.accuracy is None:
        return [], [f"variant failed: {candidate.error or 'no accuracy results'}"], [], False
    checks: list[GateCheck] = []
    problems: list[str] = []
    small: list[str] = []
    on_spread = False
    try:
        tolerances: Tolerances | None = resolved or reference_tolerances(reference, spec)
    except QbenchError as exc:  # a relative tolerance of nothing: no metric check, NaN/inf outputs still breach
        tolerances, problems = None, [str(exc)]
    scopes = [(reference.accuracy.overall, candidate.accuracy.overall, tolerances and tolerances.max_drop)]
    for ref_slice in reference.accuracy.slices:
        own = candidate.accuracy.slice(ref_slice.name)
        if own is None:
            problems.append(f"slice {ref_slice.name!r} missing from the results")
            continue
        scopes.append((ref_slice, own, tolerances and tolerances.on_slice(ref_slice.name)))
    # every result is measured on the same rows, so their slices are the same: one FP32 lacks would go unjudged
    problems += [f"slice {own.name!r} missing from FP32's results (the variant's has it: same rows, same slices)"
                 for own in candidate.accuracy.slices if reference.accuracy.slice(own.name) is None]  # fmt: skip
    judged_scopes = sum(not too_small(own_scope, spec) for _, own_scope, _ in scopes)
    for ref_scope, own_scope, tolerance in scopes:
        # NaN/inf on rows where FP32 is finite: a breach of its own, whatever FP32 does on other rows
        extra_nonfinite = max(own_scope.nonfinite_outputs - ref_scope.nonfinite_outputs,
                              own_scope.new_nonfinite_outputs)
        if extra_nonfinite > 0:
            checks.append(
                GateCheck(variant, backend, own_scope.name, "nonfinite_outputs", float(ref_scope.nonfinite_outputs),
                          float(own_scope.nonfinite_outputs), float(extra_nonfinite), 0.0, own_scope.size, "breach")
            )  # fmt: skip
        judged = not too_small(own_scope, spec)
        if judged:  # collapsed outputs, on every scope judged: one slice alone is a breach
            grid = reference.accuracy.overall if candidate.precision == "int8" else None  # an integer output grid
            collapsed, spread_problems = collapsed_outputs(ref_scope, own_scope, grid)
            checks += [GateCheck(variant, backend, own_scope.name, name, ref_spread, own_spread,
                                 ref_spread - own_spread, (1 - COLLAPSED) * ref_spread, own_scope.size, "breach")
                       for name, ref_spread, own_spread in collapsed]  # fmt: skip
            problems += spread_problems
            lost, kept_problems = lost_components(ref_scope, own_scope, spec.metric.rpartition(OUTPUT_SEPARATOR)[0],
                                                  judged_scopes)
            checks += [GateCheck(variant, backend, own_scope.name, name, kept.reference, kept.own, 1 - kept.share,
                                 1 - KEPT, own_scope.size, "breach", kept.component, chance_text(kept))
                       for name, kept in lost]  # fmt: skip
            problems += kept_problems + interval_problems(ref_scope, own_scope)
        if judged and 0 < ref_scope.size <= ref_scope.nonfinite_outputs:
            problems.append(f"FP32 gives NaN/inf on all {ref_scope.size} rows of {own_scope.name}: nothing to judge "
                            "the variant against there")  # fmt: skip
            continue
        if tolerance is None:
            continue
        raised = own_scope.raised.get(spec.metric) or ref_scope.raised.get(spec.metric)
        if raised and judged:  # the custom metric raised here (for FP32 or the variant): unusable, never a pass
            problems.append(f"metric {spec.metric!r} cannot be judged on {own_scope.name}: {raised}")
            continue
        check = check_scope(variant, backend, spec, ref_scope, own_scope, tolerance, explained=extra_nonfinite > 0,
                       either_way=against != backend)  # fmt: skip
        if check is not None:
            checks.append(check)
            distinct = results.distinct_inputs.get(own_scope.name)  # copies of an input are no more evidence
            why = unresolved(spec.metric, tolerance, ref_scope, own_scope, distinct) if check.status == "pass" else None
            small += [why] if why else []
            on_spread |= bool(why) and not rows_alone(spec.metric, tolerance, ref_scope, own_scope)
        elif undefined_for_fp32(spec.metric, ref_scope, own_scope):  # only overall: a slice is skipped instead
            problems.append(f"metric {spec.metric!r} is undefined on {own_scope.name} for FP32 too (NaN or inf "
                            "without NaN/inf outputs: R² of a constant target, a custom metric dividing by zero, "
                            "such as a MAPE over zero labels): nothing can be judged; gate on a metric defined "
                            "there")  # fmt: skip
        else:
            why = nonfinite_reference_hint(spec.metric, ref_scope) if ref_scope.nonfinite_outputs else ""
            problems.append(f"metric {spec.metric!r} is missing or NaN on {own_scope.name}{why}")
    return checks, problems, small, on_spread


def _slo_check(judgement: SloJudgement) -> GateCheck:
    return GateCheck(judgement.variant, judgement.backend, SLO_SCOPE, SLO_METRIC, judgement.budget_ms,
                     judgement.observed_ms, judgement.over_ms, 0.0, judgement.samples, judgement.status,
                     judgement.reason)  # fmt: skip
