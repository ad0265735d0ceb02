"""What part of FP32's behaviour a variant kept, component by component: pure functions behind the gate's `*_kept`
checks (qbench.gate.outputs).

A partly broken variant keeps its outputs' spread (output_spread) and most of its rows: one class's logit collapsed,
outputs clamped at the calibration sample's maximum, a few embedding dimensions stuck at a constant. Its overall and
per-slice figures move less than a tolerance, yet it lost something FP32 does on every row of a kind. Each rule
below finds, on one scope's rows, the component (a class, a target's tail, a dimension) whose share kept is lowest
among those FP32's own outputs give enough to judge, as a Kept record: FP32's figure and the variant's. The gate
breaches a share under KEPT (decisions_kept: one unlikely by chance, `lost`).

- decisions_kept (classification, multilabel): of the rows FP32 decides a class on (a label on, or off), the share
  the variant decides it on too; judged where FP32 decides it on MIN_ROWS rows at least. A class kept under KEPT is
  lost only where so many losses are unlikely by chance (`lost`, CHANCE): with a thousand classes of 5 to 15 rows,
  an honest INT8 variant changing 6 % of its answers loses 3 of some class's 5 rows by luck alone (many comparisons,
  each a binomial draw), while a collapsed class loses its rows at many times the variant's rate on the classes it
  keeps (a multilabel label's on decisions against the on decisions of the labels it keeps, off against off: positives
  near the cut change far more often than the many off decisions).
- token_decisions_kept (token classification): decisions_kept over the scope's scored tokens (those the task's
  metrics score: labelled other than IGNORE_LABEL, or every token without labels), a row the unit: of the rows FP32
  decides a class on some scored token of, those the variant decides it on half of them at least; judged where
  FP32 decides a class in MIN_ROWS rows at least (the tokens of one row share its context and flip together: a
  language model's repeated pattern puts 7 of a class's 9 tokens in one row, and one long row may hold most of a
  class's tokens).
- tail_kept (regression): of how far FP32's most extreme rows (its TAIL share at each end of each target) reach past
  the band of as many rows before them, the share the variant's outputs on those rows reach past its outputs on that
  band; judged where FP32's reach is at least MIN_REACH of the target's spread (outputs that plateau at the end have no
  tail) over MIN_ROWS rows at least. Band against band, both on each side's own outputs: an offset every output of
  an honest variant shares (INT8's rounding moves a regressor's outputs by a few percent of their spread) cancels,
  while a clamp at the calibration sample's range flattens the tail against its band.
- fit_kept (regression): of how much better than its mean FP32 predicts each target (its skill: 1 - its MAE / the
  target's mean absolute deviation, against the labels, or FP32's own outputs without labels), the share the variant
  keeps; judged for targets FP32's skill reaches MIN_SKILL on, over MIN_ROWS rows at least. The gate metric pools
  every value of every target (mae, rmse), so the largest-scale target decides it: a target of spread 0.018 beside
  one of 216 whose MAE grew twelvefold moved a pooled MAE by 0.1 %, under a 1 % tolerance.
- spread_kept (embedding): of how much a dimension varies across the rows for FP32, the share it varies for the
  variant; judged for dimensions varying at least MIN_REACH of the output's mean per dimension.
- rows_kept (embedding): of how far FP32's cosine with itself (1) rises above the cosine its rows share (shared_cosine,
  over every evaluation row), the share the variant's cosine with FP32 keeps on its worst row. A mean cosine hides a
  few rows (a row flipped, rows merged onto one point) where every vector shares a dominant direction: a ruined
  row's cosine stays high because the part of it that tells rows apart is small. An embedding scope records the
  lower of its two rules' shares.

No rule for task 'span': its decoder answers on every row with a context token, so no answer is lost outright, and
a rule on where answers lie (a part of the context) flagged honest INT8 builds whose starts moved by one token across
a part's border. None for 'structured' (nor a recipe's own metrics): qbench reads no decision from an arbitrary tensor
per row (a mask, boxes, a sequence); the user's metric is the verdict there.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from qbench.gate.binomial import binomial_tail
from qbench.gate.resolution import CONFIDENCE, rows_to_resolve
from qbench.results.schema import Kept
from qbench.validate.metrics import INVALID_CLASS, row_blocks

KEPT = 0.5
"""A component a variant keeps under half of (half of FP32's decisions of a class, half the reach of its extreme rows,
half a dimension's variation) is lost: rounding moves a few rows of a class, a few percent of a tail's reach or
of a dimension's spread (see the tests' honest INT8/FP16 builds), never half."""

MIN_ROWS = rows_to_resolve(1 - KEPT)
"""The gate's resolution rule for the check's own threshold: a variant losing a share 1 - KEPT of a component's rows
keeps all of MIN_ROWS (5) with probability under 5 %; fewer rows say nothing either way."""

CHANCE = 1 - CONFIDENCE
"""decisions_kept: a class the variant keeps under KEPT of is lost where losing as many of its rows, at the variant's
change rate on the decisions of the classes it keeps, has probability under CHANCE (5 %) once corrected for the number
of classes judged (Bonferroni: the probability that any of them loses as many by chance). Holm's correction gives
the same verdict: the gate asks whether any class is lost, and Holm's first step is Bonferroni's test of the least
likely."""

TAIL = 0.05  # the share of rows at each end of a regression target whose reach tail_kept compares
MIN_SKILL = 0.5  # fit_kept: a target FP32 predicts with less skill is not judged (an honest variant's few percent
# of MAE would be a large share of a small skill)
MIN_REACH = 0.05  # a tail's reach, or a dimension's spread, under this share of the target's (the mean) is not judged


KEPT_RULES = {
    "decisions_kept": "FP32 decides it on {reference:g} rows, the variant on {own:g} of them",
    "token_decisions_kept": "FP32 decides it in {reference:g} rows, the variant in {own:g} of them (on half of "
                            "their tokens FP32 decides it on at least)",
    "tail_kept": "FP32's extreme rows reach {reference:.4g} past the rows before them, the variant's {own:.4g}",
    "fit_kept": "FP32 predicts it {reference:.4g} better than its mean (1 - MAE / mean absolute deviation), the "
                "variant {own:.4g}",
    "spread_kept": "it varies across the rows by {reference:.4g} for FP32, by {own:.4g} for the variant",
    "rows_kept": "of the {reference:.4g} between the cosine FP32's rows share and 1, its cosine with FP32's vector "
                 "keeps {own:.4g}",
}
"""Each rule the gate judges, and how its report line states the two figures of a record."""

BY_CHANCE = "by chance at its change rate on the classes it keeps ({elsewhere:.2%}): probability {chance:.2g}"
"""How a report line states a record's chance (decisions_kept's, for a class kept under KEPT)."""


def chance_text(kept: Kept) -> str:
    """BY_CHANCE for `kept`, '' where it records no chance."""
    if kept.chance is None or kept.elsewhere is None:
        return ""
    return BY_CHANCE.format(elsewhere=kept.elsewhere, chance=kept.chance)


def decisions_kept(predicted: np.ndarray, reference: np.ndarray, rows: np.ndarray | None = None) -> Kept | None:
    """The class (1-D: one class id per row) or label value (2-D: one 0/1 decision per label) FP32 decides on at
    least MIN_ROWS rows that the variant lost (`lost`: kept under KEPT, and unlikely by chance) least likely by
    chance; without one, the class whose rows the variant decides the same on the smallest share. None where FP32
    decides none on that many. A row the variant has no decision for (NaN/inf: INVALID_CLASS) keeps nothing. `rows`
    (1-D only): the row each decision belongs to where several share one (a row's tokens): a row is then the unit,
    of a class counted as kept where the variant decides the class on KEPT of that row's decisions of it at least
    (its decisions flip together, so a class is judged on MIN_ROWS rows, its chance counts rows)."""
    predicted, reference = np.asarray(predicted), np.asarray(reference)
    if reference.ndim == 1:
        columns = [(predicted, reference, "class {}")]
    else:
        columns = [(predicted[:, j], reference[:, j], f"label {j} {{}}") for j in range(reference.shape[1])]
    judged: list[tuple[Kept, object]] = []  # each judged class's record, and its kind (a label's value; one kind 1-D)
    # changes and decisions over every class FP32 decides (judged or not) the variant keeps KEPT of, by kind
    pools: dict[object, tuple[int, int]] = {}
    for own, ref, name in columns:
        for value in np.unique(ref).tolist():
            if value == INVALID_CLASS:  # FP32 gives NaN/inf there: nothing decided
                continue
            count, same, decided, hits = _units_kept(own, ref, value, rows)
            kind = value if reference.ndim > 1 else None
            if same >= KEPT * count:  # the rate counts decisions (a row's tokens each), as the task's rates do
                changes, decisions = pools.get(kind, (0, 0))
                pools[kind] = (changes + decided - hits, decisions + decided)
            if count < MIN_ROWS:
                continue
            label = ("on" if value == 1 else "off" if value == 0 else value) if reference.ndim > 1 else value
            judged.append((Kept("decisions_kept", name.format(label), float(count), float(same)), kind))
    if not judged:
        return None
    every = tuple(map(sum, zip(*pools.values()))) or (0, 0)
    rates = {kind: changes / decisions for kind, (changes, decisions) in {None: every, **pools}.items() if decisions}
    # a label's "on" decisions change at their own rate (positives near the cut), its "off" ones at another: each
    # kind is compared with its own; one the variant keeps none of with every kind's (None: no class kept at all)
    records = [_with_chance(kept, rates.get(kind, rates.get(None)), len(judged)) for kept, kind in judged]
    return min(records, key=lambda k: (0, k.chance or 0.0, k.share) if lost(k) else (1, 0.0, k.share))


def _units_kept(own: np.ndarray, ref: np.ndarray, value: object, rows: np.ndarray | None) -> tuple[int, int, int, int]:
    """(units FP32 decides `value` on, those the variant keeps it on, and the same two counts of decisions): each
    decision a unit, or with `rows` each row (kept where the variant decides `value` on KEPT of that row's decisions
    FP32 decides it on at least). A share of a class's decisions would let one long row outweigh the rest: losing a
    class on 1 row of 5 that holds most of its tokens breached, losing it on the other 4 passed."""
    at = ref == value
    hits = own[at] == value
    decisions = int(np.count_nonzero(at)), int(np.count_nonzero(hits))
    if rows is None:
        return *decisions, *decisions
    groups, index = np.unique(rows[at], return_inverse=True)
    held, decided = np.bincount(index, weights=hits), np.bincount(index)
    return int(groups.size), int(np.count_nonzero(held >= KEPT * decided)), *decisions


def _with_chance(kept: Kept, rate: float | None, judged: int) -> Kept:
    """`kept` with its chance where it is kept under KEPT: the probability, Bonferroni-corrected over `judged`
    classes, that its units changing at `rate` lose as many as it lost (binomial_tail)."""
    if kept.share >= KEPT or rate is None:
        return kept
    draws = int(kept.reference)
    chance = judged * binomial_tail(draws - int(kept.own), draws, rate)
    return dataclasses.replace(kept, chance=min(1.0, chance), elsewhere=rate)


def lost(kept: Kept) -> bool:
    """Whether the gate counts `kept` lost: kept under KEPT of (a NaN share keeps nothing), unless its record says so
    many losses are likely by chance (chance, decisions_kept's records) at CHANCE or above. A record without a
    chance (another rule's; a results file from before qbench recorded one) is judged on its share alone."""
    return not kept.share >= KEPT and not (kept.chance is not None and kept.chance >= CHANCE)


def across(kept: Kept, scopes: int) -> Kept:
    """`kept` with its chance (a record's over the classes of its scope) corrected over the `scopes` the gate judges
    (the overall rows and each slice: Bonferroni again, as a class lost by chance on any of them would breach): with
    10 slices of 200 classes of 50 rows, a variant changing 6 % of its answers at random breached on some slice's
    class 17 % of the time (2 % corrected), never on the overall rows alone."""
    if kept.chance is None or scopes <= 1:
        return kept
    return dataclasses.replace(kept, chance=min(1.0, kept.chance * scopes))


def token_decisions_kept(predicted: np.ndarray, reference: np.ndarray, rows: np.ndarray) -> Kept | None:
    """decisions_kept over tokens, a row the unit: `predicted` and `reference` hold one class id per scored token of
    the scope (1-D), `rows` the row of each; a class is judged where FP32 decides it in MIN_ROWS rows at least (the
    resolution rule's draws are independent; a row's tokens, read in one context, are not)."""
    found = decisions_kept(np.ravel(predicted), np.ravel(reference), np.ravel(rows))
    return None if found is None else dataclasses.replace(found, rule="token_decisions_kept")


def tail_kept(outputs: np.ndarray, reference: np.ndarray) -> Kept | None:
    """The end of a target (column) whose extreme rows' reach the variant keeps least of: FP32's TAIL share of rows
    with the highest (lowest) values on the rows both give finite outputs, their reach the mean distance of their
    outputs past the mean of the band of as many rows next to them, for FP32 and for the variant each on its own
    outputs; None where no end has MIN_ROWS such rows reaching MIN_REACH of the target's spread."""
    outputs, reference = _columns(outputs), _columns(reference)
    worst: Kept | None = None
    for j in range(reference.shape[1]):
        finite = np.isfinite(reference[:, j]) & np.isfinite(outputs[:, j])
        ref, own = reference[finite, j], outputs[finite, j]
        count = int(math.floor(ref.size * TAIL))
        if count < MIN_ROWS or ref.size < 2 * count:
            continue
        order = np.argsort(ref, kind="stable")
        spread = float(np.std(ref))
        for end, rows, band, sign in (("top", order[-count:], order[-2 * count:-count], 1.0),
                                      ("bottom", order[:count], order[count:2 * count], -1.0)):  # fmt: skip
            reach = sign * float(np.mean(ref[rows]) - np.mean(ref[band]))
            if not reach >= MIN_REACH * spread or reach <= 0:
                continue
            kept = Kept("tail_kept", f"column {j} {end}", reach, sign * float(np.mean(own[rows]) - np.mean(own[band])))
            worst = kept if worst is None or kept.share < worst.share else worst
    return worst


def fit_kept(outputs: np.ndarray, reference: np.ndarray, target: np.ndarray) -> Kept | None:
    """The target (column) whose skill (1 - MAE / the target's mean absolute deviation from its mean, on the rows
    FP32, the variant and the target are all finite on) the variant keeps least of, among those FP32's skill reaches
    MIN_SKILL on over MIN_ROWS rows at least; None where none does."""
    outputs, reference, target = _columns(outputs), _columns(reference), _columns(target)
    worst: Kept | None = None
    for j in range(reference.shape[1]):
        finite = np.isfinite(reference[:, j]) & np.isfinite(outputs[:, j]) & np.isfinite(target[:, j])
        if np.count_nonzero(finite) < MIN_ROWS:
            continue
        wanted = target[finite, j]
        deviation = float(np.mean(np.abs(wanted - np.mean(wanted))))
        if not deviation > 0:
            continue
        skill = 1.0 - float(np.mean(np.abs(reference[finite, j] - wanted))) / deviation
        if not skill >= MIN_SKILL:
            continue
        own = 1.0 - float(np.mean(np.abs(outputs[finite, j] - wanted))) / deviation
        kept = Kept("fit_kept", f"column {j}", skill, own)
        worst = kept if worst is None or kept.share < worst.share else worst
    return worst


def spread_kept(outputs: np.ndarray, reference: np.ndarray) -> Kept | None:
    """The dimension (column) whose variation across the rows both give finite outputs on the variant keeps least of,
    among those FP32 varies by at least MIN_REACH of its mean per dimension (root mean square of their standard
    deviations); None under MIN_ROWS rows or where FP32 varies on no dimension."""
    outputs, reference = _columns(outputs), _columns(reference)
    finite = np.isfinite(reference).all(axis=1) & np.isfinite(outputs).all(axis=1)
    if np.count_nonzero(finite) < MIN_ROWS:
        return None
    ref, own = np.std(reference[finite], axis=0), np.std(outputs[finite], axis=0)
    typical = float(np.sqrt(np.mean(ref**2)))
    judged = np.flatnonzero((ref >= MIN_REACH * typical) & (ref > 0))
    if judged.size == 0:
        return None
    j = int(judged[np.argmin(own[judged] / ref[judged])])
    return Kept("spread_kept", f"dimension {j}", float(ref[j]), float(own[j]))


RECORDED_TOGETHER = (frozenset({"spread_kept", "rows_kept"}), frozenset({"tail_kept", "fit_kept"}))
"""Rules one task judges on the same output, of which a scope records the one kept least of: FP32's record (every
component kept whole) may name one and a variant's the other."""


def comparable(reference_rule: str, own_rule: str) -> bool:
    """Whether a variant's record of `own_rule` answers FP32's of `reference_rule` (the same rule, or one recorded
    together with it)."""
    return reference_rule == own_rule or any({reference_rule, own_rule} <= rules for rules in RECORDED_TOGETHER)


def shared_cosine(reference: np.ndarray) -> float:
    """The cosine FP32's rows share: the mean cosine over every pair of its rows (each with itself too), |mean unit
    vector|^2, over the rows with a direction (finite, not all 0); near 0 for directions spread evenly, near 1 where
    every row shares one dominant direction. NaN without such a row. Summed a block of rows at a time."""
    total, count = None, 0
    for block in row_blocks(reference.shape[0], int(np.prod(reference.shape[1:], dtype=np.int64))):
        rows = _columns(reference[block])
        norms = np.linalg.norm(rows, axis=1)
        directed = np.isfinite(rows).all(axis=1) & (norms > 0)
        units = np.sum(rows[directed] / norms[directed, None], axis=0)
        total, count = units if total is None else total + units, count + int(np.count_nonzero(directed))
    if count == 0 or total is None:
        return math.nan
    return float(np.sum((total / count) ** 2))


def rows_kept(cosine: np.ndarray, shared: float, rows: np.ndarray) -> Kept | None:
    """The row (`rows`: each cosine's evaluation row) whose cosine with FP32's vector rises least above `shared`
    (shared_cosine, what any two FP32 rows share), against the room 1 - shared above it: its cosine rescaled so that
    FP32's own vector is 1 and a typical other row 0 (kept down to 0: a flipped row keeps nothing, as a merged one).
    Under half kept, the row's vector lies farther from FP32's than FP32's rows lie from their mean direction. A NaN
    cosine (FP32 gives no direction there) is not judged; None under MIN_ROWS judged rows, or where FP32's rows share
    one direction (nothing tells them apart: output_spread's case)."""
    judged = np.isfinite(cosine)
    if np.count_nonzero(judged) < MIN_ROWS or not shared < 1:
        return None
    worst = int(np.flatnonzero(judged)[np.argmin(cosine[judged])])
    return Kept("rows_kept", f"row {int(rows[worst])}", 1.0 - shared, max(0.0, float(cosine[worst]) - shared))


def _columns(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    return values.reshape(values.shape[0], int(np.prod(values.shape[1:], dtype=np.int64)))  # a scope of 0 rows too
