"""Whether a gate check rests on enough rows for its pass to be evidence: the resolution rule.

A drop within tolerance on few rows says little. A variant that gets a share p of the inputs wrong leaves all n rows
of a scope untouched with probability (1 - p)^n: on 20 rows, a variant breaking 5 % of the inputs shows no drop at
all 36 % of the time, so a pass there cannot tell a sound variant from one twenty times past a max_drop of 0.01.
The gate therefore counts a pass only where the scope could have shown a drop of the tolerance, with 95 % confidence
(the confidence of the intervals qbench reports), and says which rule and which numbers it used:

- a share of rows or tokens (accuracy, agreement...) and any other metric bounded per row (F1, cosine_min: the
  `low`..`high` of the catalogue), each row moving it by at most its span: a variant changing a share
  t = tolerance / span of the rows changes none of n with probability (1 - t)^n, which must be at most 5 %
  (n >= ln 0.05 / -ln(1 - t), about 3 / t: 299 rows for a drop of 0.01, 149 for 0.02);
- a mean over rows of a comparison with FP32's own outputs (cosine, kl_mean: FP32's figure is the same on every row,
  so its interval is a point) has the variant's 95 % interval as the interval of the drop: its far end must stay
  within the tolerance, and it needs two rows at least (one row has no spread to measure);
- an error in the data's units or R² whose results record the paired interval of its drop (regression's mae, rmse,
  r2 and r2_min, over any number of targets: each row's change of error from FP32's, `drop_intervals`) is judged as
  cosine is: the far end of that interval must stay within the tolerance (a regression variant 1.5x past the
  default mae tolerance passed on 300 rows 32 % of the time when two rows sufficed);
- any other metric (max_error, a custom metric) is not bounded per row, so no row count follows from the tolerance:
  it needs two rows at least. max_error is the worst case of the rows measured, not an estimate of a population
  figure: its pass says no row of the scope moved past it, and of the population only that the share of inputs
  that would is below 1 - 0.05^(1/n) with 95 % confidence (the rows rule read the other way).

A share of rows scored against labels (accuracy, exact_match) is a difference of two noisy figures on the same rows:
a change right -> wrong offsets one wrong -> right, so a variant changing 22 % of 1,000 rows' answers, as many each
way, shows a drop of 0 while the drop's 95 % interval reaches 0.03. Where the variant's decisions changed on more
units than its drop counts (the catalogue's `decisions` companion, agreement with FP32, says how many changed), the
far end of the drop's paired interval must also be within the tolerance, where those changes are more than a
tolerance's worth of the units (were every change a loss, the drop would pass the tolerance: the pass rests on gains
offsetting losses, which the rows must show to be more than luck). Fewer changes cannot hide a breach, so the rule
leaves them alone: a variant with fewer changes, or changes all one way, is never judged more harshly than one with
more. Each unit's drop is -1, 0 or 1, 0 where the decision is FP32's, so its variance is at most changed / n - drop²
(all changed units counted as moving a right answer; a change between two wrong classes moves none, so the bound errs
towards asking for more rows).

A share of rows whose drop is within the tolerance but above 0 must also have the upper bound of that drop within it:
with k of n rows lost (net), the one-sided 95 % Clopper-Pearson bound on the share of the population's rows lost
(`upper_share`; for k = 0 it is the rows rule above). The rows rule asks only whether a change could show at all: a
variant losing 1.5 times a max_drop of 0.01 showed a drop within it on 300 rows 34 % of the time and passed.

Rows that repeat an input (the same cells in every column feeding the model) are one sample of the inputs, not
several: the rows rule counts distinct inputs, and the interval rules widen the drop's interval by
sqrt((rows - 1) / (inputs - 1)), the factor by which an interval over such rows is too narrow.

A breach is judged as before: a drop past the tolerance is evidence against the variant, however few the rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from statistics import NormalDist
from typing import TYPE_CHECKING

from qbench.errors import named_some
from qbench.gate.binomial import at_most
from qbench.validate.catalogue import METRICS, OUTPUT_SEPARATOR, drop, within

if TYPE_CHECKING:  # qbench.results imports the search's records, which mix in JudgedPass; qbench.gate imports this
    from qbench.gate.evaluate import GateReport
    from qbench.gate.metric_check import GateCheck
    from qbench.results.schema import SliceMetrics

CONFIDENCE = 0.95
# a search's `search.outcome` when its pick passed on too few selection rows and `gate.unresolved: fail` counts no such
# pass: not "tolerance unreachable" (a drop within tolerance was measured; more rows may resolve it)
PASS_UNRESOLVED = "pass unresolved"
MIN_ROWS = 2  # a mean over one row has no spread, and one row is no sample of the inputs
RESOLVE_SEARCH_LIMIT = 100  # an unresolved drop names the rows that would resolve it up to this many times the scope's
# the start of a skipped check's reason where the data leaves no drop to judge (not gate.min_slice_size's skip)
NOT_JUDGED = "not judged: "


class JudgedPass:
    """The rule applied to the candidates a choice is made among on the selection rows: the INT8 search's records and
    the tries of `calibrator: auto` and `fallback:` (qbench.fallback) mix this in. They have `passed` (the gate's
    verdict there), `unresolved` (why that pass does not resolve the tolerance: falsy when it does, or did not pass)
    and `unresolved_on_spread` (it falls short on the spread of its own figures, not on the rows alone)."""

    passed: bool | None
    unresolved: str | None
    unresolved_on_spread: bool

    @property
    def resolved_pass(self) -> bool:
        """Passed, on enough selection rows to resolve the tolerance: evidence it passes elsewhere too."""
        return bool(self.passed) and not self.unresolved

    @property
    def firm_pass(self) -> bool:
        """Passed, and no candidate judged on the same rows could show a better-resolved pass: resolved, or unresolved
        for the rows alone (every candidate on those rows is). What stops a search looking further."""
        return bool(self.passed) and not (self.unresolved and self.unresolved_on_spread)

    def counted(self, setting: str) -> bool:
        """Whether `qbench gate` passes it on the figures it was judged on, under `gate.unresolved: setting`: a
        resolved pass, or under `note` any pass (one too few rows resolve, or beside a scope no gated metric judges:
        `fail` holds those, exit 2). What a search's outcome says, so that it and the gate never disagree."""
        return self.resolved_pass or (bool(self.passed) and setting != "fail")

    @property
    def mark(self) -> str:
        """Its verdict in a path of tries: ✓ a resolved pass, ✓? one gate.unresolved holds (too few rows to resolve
        it, or a scope no gated metric judges), ✗ no pass."""
        return "✗" if not self.passed else "✓?" if self.unresolved else "✓"


class JudgedTry(JudgedPass):
    """A try with the gate's verdict on it (`verdict`), which is a candidate only where some node of it computes in
    INT8 (`lowered`: a try with every node in FP32 is the FP32 model, whose pass says nothing about INT8): the tries
    of `calibrator: auto` and `fallback:` (qbench.fallback) and those `qbench explain` chooses a calibrator among."""

    verdict: GateReport
    lowered: bool

    @property
    def passed(self) -> bool:
        return self.lowered and self.verdict.exit_code == 0

    @property
    def unresolved(self) -> str | None:
        return unresolved_reasons(self.passed, self.verdict)

    @property
    def unresolved_on_spread(self) -> bool:
        return bool(self.unresolved) and self.verdict.unresolved_on_spread


def unresolved_reasons(passed: bool, verdict: GateReport) -> str | None:
    """Why a pass does not resolve the tolerance on the rows it was judged on, one line (None: resolved, or no pass):
    the `unresolved` of a JudgedPass from the gate's `verdict` on it."""
    return "; ".join(verdict.unresolved) if passed and verdict.unresolved else None


def passing(candidates: Sequence[JudgedPass]) -> list[int]:
    """Indices of the candidates a pick is made among: those with a resolved pass, or, when none has one, those whose
    pass rests on too few selection rows (the pick is then no evidence: `unresolved_pick`)."""
    resolved = [i for i, c in enumerate(candidates) if c.resolved_pass]
    return resolved or [i for i, c in enumerate(candidates) if c.passed]


def unresolved_pick(label: str, why: str | None, setting: str) -> str:
    """The note on a pick whose pass on the selection rows does not resolve the tolerance, or leaves a scope no gated
    metric judges (`setting`: the recipe's `gate.unresolved`; under `fail` such a pass is no pass, as the gate holds
    it)."""
    counted = "so it is reported as not passing" if setting == "fail" else "its pass counts, as the gate's would"
    return (f"{label} passed on the selection rows, but its pass rests on too few of them to resolve the tolerance, "
            "or says nothing of rows no gated metric can judge, and no candidate's pass was resolved there "
            f"(gate.unresolved: {setting}: {counted}): {why}")


def unjudged_scopes(checks: Sequence[GateCheck]) -> str:
    """Why a variant's pass says nothing of some scopes it is judged on, one phrase ('' where none): no gated metric
    can show a drop there (each skipped as NOT_JUDGED: undefined for FP32 too, as R² of a constant target; or FP32's
    figure already the metric's worst, as F1 0 on rows without a positive label where FP32 predicts one) and no check
    of the scope passed or breached, so none of the variant's figures was compared with FP32's on its rows. A slice
    skipped as too small (gate.min_slice_size) is the recipe's choice, not one of these. A pass there would be a pass
    by omission (before, exit 0 with the slice shown as skipped, or passed at F1 0 -> 0), so the gate holds it as it
    holds a pass too few rows resolve (gate.unresolved)."""
    judged = {check.scope for check in checks if check.status != "skipped"}
    why: dict[str, list[str]] = {}
    for check in checks:
        if check.status == "skipped" and check.reason.startswith(NOT_JUDGED) and check.scope not in judged:
            why.setdefault(check.scope, []).append(check.reason.removeprefix(NOT_JUDGED))
    if not why:
        return ""
    scopes = [f"{scope} ({'; '.join(dict.fromkeys(reasons))})" for scope, reasons in why.items()]
    return (f"not judged on {named_some(scopes)}: no gated metric can show a drop there, so its pass says nothing of "
            "those rows; gate also on a metric that can (gate.metrics), leave those rows out (data.evaluation.filter), "
            "or set gate.unresolved: note to let the pass count with this note")


def rows_to_resolve(tolerance: float, span: float = 1.0) -> float:
    """The fewest rows on which a variant changing a share `tolerance / span` of them changes at least one with
    probability CONFIDENCE (inf for a tolerance of 0: no number of rows shows that nothing changes anywhere)."""
    share = tolerance / span
    if share >= 1:
        return 1
    if not share > 0:
        return math.inf
    return max(MIN_ROWS, math.ceil(math.log(1 - CONFIDENCE) / math.log1p(-share) - 1e-9))


def unresolved(metric: str, tolerance: float, reference: SliceMetrics, own: SliceMetrics,
               distinct: int | None = None) -> str | None:
    """Why a pass of `own` against FP32's `reference` on one scope is no evidence that the drop is within
    `tolerance` (the rule and its numbers, one phrase), or None when the scope resolves it. `distinct`: how many
    distinct inputs the scope's rows feed the model, where copies repeat some: a variant gets every copy of an input
    wrong alike, so the rows rule counts inputs (300 rows of 100 inputs each fed 3 times show no drop of a variant
    breaking 1 % of the inputs with probability 0.99^100 = 37 %, not 0.99^300 = 5 %), and the drop's intervals, which
    treat the rows as independent, are widened by sqrt((rows - 1) / (inputs - 1)) (_over_inputs)."""
    info = METRICS[metric]
    counted = own.judged_count(metric)
    # the units counted (its rows, or those of them scored: answerable questions, sampled queries) hold at most the
    # scope's distinct inputs: one unscored row among 600 copies of 200 inputs left them counted as 599 samples
    rows = min(counted, distinct) if distinct is not None else counted
    span = info.high - info.low
    where = f"{own.name} {metric} on {counted} rows"
    where += f" ({rows} distinct inputs: the others repeat them)" if rows < counted else ""
    widen = math.sqrt((counted - 1) / (rows - 1)) if MIN_ROWS <= rows < counted else 1.0
    point = drop(metric, reference.metrics.get(metric, math.nan), own.metrics.get(metric, math.nan))
    uncounted = _changes_uncounted(metric, reference, own)
    if uncounted:
        return (f"{where}: {uncounted}, so how many of its decisions changed (changes right -> wrong its drop may "
                "offset by changes wrong -> right) is unknown: results written by another qbench, or edited")
    compensated = _compensated_bound(metric, tolerance, reference, own)
    if compensated is not None:
        changed, units, bound = compensated
        bound = _over_inputs(bound, point, widen)
        together = own.changed_together.get(_companion(metric))
        of = "of them" if units == counted else f"of its {units} scored units"
        if together is not None and together > 1:
            of += f" ({together:.3g} changed together a row, weighted by changes)"
        if not within(bound, tolerance, reference.metrics.get(metric, math.nan)):
            at_this_spread = _rows_at_this_spread(metric, tolerance, reference, own, bound)
            return (f"{where}: its decisions changed on {changed} {of}, more than its drop counts (changes right -> "
                    f"wrong offset by changes wrong -> right), and the {CONFIDENCE:.0%} interval of the drop reaches "
                    f"{bound:.4g} > tolerance {tolerance:g}{at_this_spread}")
    paired = _drop_bound(metric, reference, own)
    if paired is not None and not info.share_of_rows:
        if rows < MIN_ROWS:
            return f"{where}: a mean over {rows} row has no spread; {MIN_ROWS} rows at least"
        paired = _over_inputs(paired, point, widen)
        if not within(paired, tolerance, reference.metrics.get(metric, math.nan)):
            return (f"{where}: the {CONFIDENCE:.0%} interval of the drop reaches {paired:.4g} > tolerance "
                    f"{tolerance:g}{_rows_at_this_spread(metric, tolerance, reference, own, paired)}")
        return None
    if math.isfinite(span):
        needed, share = rows_to_resolve(tolerance, span), tolerance / span
        unit = "rows" if rows == counted else "inputs"
        if rows >= needed:
            scored = own.denominators.get(metric)
            scored = scored if isinstance(scored, int) and not isinstance(scored, bool) and scored > counted else None
            return _lost_unresolved(point, share, rows, where, unit, scored) if info.share_of_rows else None
        if math.isinf(needed):
            return f"{where}: no number of rows resolves a tolerance of 0"
        return (f"{where} < {needed} needed for a drop of {tolerance:g} (a variant changing {share:.3g} of the {unit} "
                f"leaves all {rows} unchanged with probability {(1 - share) ** rows:.1%} > {1 - CONFIDENCE:.0%})")
    if rows < MIN_ROWS:
        return f"{where}: {MIN_ROWS} rows at least"
    return None


def upper_share(lost: int, rows: int) -> float:
    """The one-sided CONFIDENCE upper bound (Clopper-Pearson) on the share of the population's rows a variant loses,
    having lost `lost` of `rows`: the share p at which losing `lost` or fewer has probability 1 - CONFIDENCE. For 0
    lost it is 1 - 0.05^(1/rows), the rows rule (rows_to_resolve) read the other way."""
    if lost >= rows:
        return 1.0
    low, high = lost / rows, 1.0
    for _ in range(60):  # bisection on p: P(X <= lost | rows, p) falls as p grows
        mid = (low + high) / 2
        low, high = (mid, high) if at_most(lost, rows, mid) > 1 - CONFIDENCE else (low, mid)
    return high


def _lost_unresolved(point: float, share: float, rows: int, where: str, unit: str,
                     scored: int | None = None) -> str | None:  # fmt: skip
    """Why a share of rows whose drop is `point`, `lost` of its `rows` (net: losses less gains), does not resolve a
    tolerance of `share`, or None: the sample's drop is within the tolerance, yet a variant losing more than `share`
    of the population's rows shows a drop as small with probability over 5 % (1.5 x a max_drop of 0.01 on 300 rows:
    34 %; on 1,000 rows: 12 %), so the upper bound of the drop must be within it, as the rows rule asks where none is
    lost.

    A share of `scored` units more than the rows (tokens, frames of a sequence output) is judged as that share of the
    rows, a row's units not being independent draws; the message says so, where it called a drop of 255 of 6,000
    frames "17 of the 400 rows", which no row count holds."""
    lost = round(point * rows) if math.isfinite(point) else 0
    if lost <= 0:
        return None
    bound = upper_share(lost, rows)
    if bound <= share + 1e-12:
        return None
    needed = _rows_at_this_drop(lost / rows, share, RESOLVE_SEARCH_LIMIT * rows)
    more = f"; about {needed} {unit} would resolve it at this drop" if needed else ""
    counted = (f"{point:.4g} ({round(point * scored)} of its {scored} scored units, judged as the same share of its "
               f"{rows} {unit}: a row's units are not independent)" if scored
               else f"{lost} of the {rows} {unit} ({point:.4g})")  # fmt: skip
    return (f"{where}: its drop of {counted} is within the tolerance, but a variant "
            f"losing {share:.3g} of them shows as small a drop with probability over {1 - CONFIDENCE:.0%}: the "
            f"{CONFIDENCE:.0%} upper bound of the drop reaches {bound:.4g} > {share:g}{more}")


def _rows_at_this_drop(rate: float, share: float, limit: int) -> int | None:
    """About how many rows resolve a tolerance of `share` at a drop of `rate` of them; None where the drop is past it
    or more than `limit` rows would be needed (a drop a hair under the tolerance needs rows without end: 999 of
    100,001 against 0.01 asked for trillions, and the search for them ran for ever)."""
    if rate >= share:
        return None
    def resolves(count: int) -> bool:  # upper_share(lost, count) <= share, read off one sum instead of its bisection
        return at_most(round(rate * count), count, share) <= 1 - CONFIDENCE

    rows = 2
    while not resolves(rows):
        if rows > limit:
            return None
        rows *= 2
    low = rows // 2
    while rows - low > max(1, low // 100):  # to 1 %
        mid = (low + rows) // 2
        low, rows = (low, mid) if resolves(mid) else (mid, rows)
    return rows


def _over_inputs(bound: float, point: float, widen: float) -> float:
    """The far end `bound` of the interval of a drop measured as `point`, its half-width multiplied by `widen`: the
    factor sqrt((rows - 1) / (inputs - 1)) by which an interval over rows that repeat inputs is too narrow (exact
    where every input is fed as often, an approximation where copies are uneven). 600 rows of 200 inputs: 1.73."""
    if widen == 1.0 or not math.isfinite(point):
        return bound
    return point + (bound - point) * widen


def interval_problems(reference: SliceMetrics, own: SliceMetrics) -> list[str]:
    """Intervals a sweep cannot have written on one scope, FP32's (`reference`) against a variant's (`own`): every
    result records the intervals of the same metrics (same task, same rows), each holding its finite figure on
    MIN_ROWS rows or more; so do its drop intervals, recorded for the same catalogue metrics by both, the drop
    interval they make (_paired_drop_interval) holding the drop between the two figures. The rules read them: a
    variant's kl_mean interval removed, made NaN or a point away from its figure, or its mae drop interval moved below
    its drop or removed from its scope alone, turned a pass the rows did not resolve into a resolved one (exit 0)."""
    where = "overall" if own.name == "overall" else f"slice {own.name!r}"

    def figures(metric: str) -> list[str]:
        return [problem for who, scope in (("FP32", reference), ("the variant", own))
                for problem in _outside(f"{who}'s {metric}", scope.metrics.get(metric, math.nan), "its interval",
                                        scope.intervals[metric], scope.judged_count(metric))]  # fmt: skip

    def dropped(metric: str) -> list[str]:
        if metric not in METRICS:
            return [f"a drop interval of {metric!r}, no metric qbench knows"]
        values = reference.metrics.get(metric, math.nan), own.metrics.get(metric, math.nan)
        paired = _paired_drop_interval(metric, reference, own, finite=False) or (math.nan, math.nan)
        return _outside(f"the variant's drop of {metric}", drop(metric, *values), "the interval its drop intervals and "
                        "FP32's make,", paired, own.judged_count(metric), *values)  # fmt: skip

    problems = _recorded(reference.intervals, own.intervals, "an interval", figures)
    problems += _recorded(reference.drop_intervals, own.drop_intervals, "a drop interval", dropped)
    return [f"{where}: {problem}: written by another qbench, or edited" for problem in problems]


def _recorded(theirs: dict, ours: dict, kind: str, judge: Callable[[str], list[str]]) -> list[str]:
    """interval_problems of one kind of interval: FP32's (`theirs`) and the variant's (`ours`) record it for the same
    metrics, and `judge` names what is wrong with those both record."""
    problems = []
    for metric in sorted(set(theirs) | set(ours)):
        recorded = [who for who, intervals in (("FP32", theirs), ("the variant", ours)) if metric in intervals]
        if len(recorded) == 1:
            problems.append(f"only {recorded[0]}'s results record {kind} of {metric!r}")
        else:
            problems += judge(metric)
    return problems


def _outside(subject: str, value: float, what: str, interval: tuple[float, float], counted: int,
             *scale: float) -> list[str]:  # fmt: skip
    """[why] a finite `value` on MIN_ROWS rows or more lies outside `interval` (NaN bounds included), to a slack of
    1e-9 of the largest of 1, |value| and the finite `scale` figures; [] where it lies within or is not judged."""
    low, high = interval
    if not math.isfinite(value) or counted < MIN_ROWS:
        return []
    slack = 1e-9 * max([1.0, *(abs(figure) for figure in (*scale, value) if math.isfinite(figure))])
    if low - slack <= value <= high + slack:
        return []
    return [f"{subject} {value:.6g} lies outside {what} [{low:.6g}, {high:.6g}]"]


def _paired_drop_interval(metric: str, reference: SliceMetrics, own: SliceMetrics,
                         finite: bool = True) -> tuple[float, float] | None:  # fmt: skip
    """The 95 % interval of `own`'s drop from FP32's `reference` scope, from the drop intervals both record, each
    paired row by row with the outputs the sweep compares with (FP32 on its first backend): the variant's less FP32's
    own, bound against bound (FP32 there is that reference, its interval [0, 0]: the variant's; on another backend FP32
    differs from it by its rounding, and the difference of two intervals holds the difference of their drops where
    both hold theirs). None where either is not recorded, or (`finite`) a bound is NaN."""
    own_interval, ref_interval = own.drop_intervals.get(metric), reference.drop_intervals.get(metric)
    if own_interval is None or ref_interval is None:
        return None
    bounds = (own_interval[0] - ref_interval[1], own_interval[1] - ref_interval[0])
    return None if finite and not all(map(math.isfinite, bounds)) else bounds


def rows_alone(metric: str, tolerance: float, reference: SliceMetrics, own: SliceMetrics) -> bool:
    """Whether the rule asks `own`'s scope for rows alone (a count from the tolerance, or MIN_ROWS), not for a narrow
    interval of its drop: then every variant judged on the same rows is as unresolved there as `own`."""
    paired = _drop_bound(metric, reference, own) is not None and not METRICS[metric].share_of_rows
    paired |= _compensated_bound(metric, tolerance, reference, own) is not None
    paired |= bool(_changes_uncounted(metric, reference, own))
    return not paired or own.judged_count(metric) < MIN_ROWS


def _rows_at_this_spread(metric: str, tolerance: float, reference: SliceMetrics, own: SliceMetrics,
                         bound: float) -> str:
    """About how many rows would bring the far end of the drop's interval within `tolerance`, the drop and the
    rows' spread staying as measured (an interval's half-width shrinks as 1 / sqrt(rows)), as a phrase; '' when the
    drop itself is not within the tolerance (no number of rows then)."""
    point = drop(metric, reference.metrics.get(metric, math.nan), own.metrics.get(metric, math.nan))
    rows, margin = own.judged_count(metric), tolerance - point
    if not (math.isfinite(point) and margin > 0 and bound > point):
        return ""
    return f"; about {math.ceil(rows * ((bound - point) / margin) ** 2)} rows would resolve it at this spread"


def _compensated_bound(metric: str, tolerance: float, reference: SliceMetrics,
                       own: SliceMetrics) -> tuple[int, int, float] | None:  # fmt: skip
    """(units whose decision changed, the units counted, the far end of the drop's paired interval) for a share of
    rows scored against labels whose variant changed more decisions than its drop counts, and more than a
    `tolerance`'s worth of them;
    None where no change was offset by another or all of them together are within the tolerance (the rows rule
    covers it), or the companion figure is not recorded on the same units. Units grouped in rows (a token
    classification's tokens: `changed_together` recorded) are counted as such, and the interval is widened by how
    many changed units a changed one shares its row with: a row's tokens flip together."""
    info = METRICS[metric]
    companion = _companion(metric)
    agreement, together = own.metrics.get(companion, math.nan), own.changed_together.get(companion)
    units = own.judged_count(metric) if together is None else own.denominators.get(metric, own.size)
    if not companion or not math.isfinite(agreement) or own.judged_count(metric) < MIN_ROWS \
            or own.denominators.get(companion, own.size) != own.denominators.get(metric, own.size):  # fmt: skip
        return None
    point = drop(metric, reference.metrics.get(metric, math.nan), own.metrics.get(metric, math.nan))
    # FP32's own figure is below 1 where it gives NaN/inf: those rows are every result's misses, no changed decision
    answered = reference.metrics.get(companion, math.nan)
    changed = round(((answered if math.isfinite(answered) else 1.0) - agreement) * units)
    none_offset = changed <= abs(point) * units + 0.5  # the drop counts every change: none offset by another
    if not math.isfinite(point) or none_offset or changed <= tolerance / (info.high - info.low) * units:
        return None
    if together is not None and together > 1:  # over rows: each row's drop squared sums to at most together * changed
        spread = together * changed / units**2 * own.size / max(own.size - 1, 1)
    else:  # each unit's drop -1, 0 or 1; ddof 1, as the reported intervals
        spread = max(changed / units - point**2, 0.0) / (units - 1)
    return changed, units, point + NormalDist().inv_cdf(0.5 + CONFIDENCE / 2) * math.sqrt(spread)


def _companion(metric: str) -> str:
    """The figure of `metric`'s output counting its units whose decision is FP32's (the catalogue's `decisions`),
    '' where it has none."""
    head, separator, _ = metric.rpartition(OUTPUT_SEPARATOR)
    decisions = METRICS[metric].decisions
    return head + separator + decisions if decisions else ""


def _changes_uncounted(metric: str, reference: SliceMetrics, own: SliceMetrics) -> str:
    """Why `own`'s scope cannot say how many of `metric`'s units changed their decision, where `metric` has a
    companion counting them (_companion) that FP32's `reference` scope records, and a figure on MIN_ROWS units at
    least: the companion not recorded, not finite, or counted over other units. qbench records it beside every such
    metric, on the same units; without it a drop of 0 may rest on any number of offsetting changes, so no pass there
    is evidence. '' where it can (results recording the companion for no result are judged by the rows rule)."""
    companion = _companion(metric)
    if not companion or companion not in reference.metrics or own.judged_count(metric) < MIN_ROWS \
            or not math.isfinite(own.metrics.get(metric, math.nan)):  # fmt: skip
        return ""
    if not math.isfinite(own.metrics.get(companion, math.nan)):
        figure = own.metrics.get(companion)
        return f"its {companion} is {figure}" if companion in own.metrics else f"no {companion} recorded"
    units, counted = (own.denominators.get(name, own.size) for name in (metric, companion))
    if units != counted:
        return f"its {companion} is counted over {counted} units, its {metric} over {units}"
    together = own.changed_together.get(companion, math.nan if companion in reference.changed_together else 1.0)
    if not together >= 1:
        return f"how many changes of its {companion} share a row is {together} (1 or more expected)"
    return ""


def _drop_bound(metric: str, reference: SliceMetrics, own: SliceMetrics) -> float | None:
    """The far end of the drop's interval: the paired one the scopes record (_paired_drop_interval: an error in the
    data's units, R²), or, when FP32's figure is the same on every row (its interval a point: the metric compares each
    row with FP32's own output), the variant's interval; else None."""
    paired = _paired_drop_interval(metric, reference, own)
    if paired is not None:
        return paired[1]
    ref_interval, own_interval = reference.intervals.get(metric), own.intervals.get(metric)
    if ref_interval is None or own_interval is None or not all(map(math.isfinite, (*ref_interval, *own_interval))):
        return None
    if not math.isclose(*ref_interval, rel_tol=1e-9, abs_tol=1e-12):
        return None
    return max(drop(metric, ref_interval[0], value) for value in own_interval)
