"""qbench.validate.kept: the component of FP32's behaviour a variant kept least of, against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from qbench.results.schema import Kept
from qbench.validate.kept import (
    CHANCE,
    KEPT,
    MIN_ROWS,
    across,
    comparable,
    decisions_kept,
    lost,
    rows_kept,
    shared_cosine,
    spread_kept,
    tail_kept,
    token_decisions_kept,
)
from qbench.validate.metrics import INVALID_CLASS


def test_the_resolution_rule_asks_five_rows_of_a_component_to_judge_losing_half_of_it():
    assert (KEPT, MIN_ROWS) == (0.5, 5)  # 0.5 ** 5 = 3.1 % <= 5 % < 0.5 ** 4 = 6.3 %


def test_decisions_kept_names_the_class_whose_fp32_rows_the_variant_decides_least():
    # FP32: class 0 on 10 rows, class 1 on 6, class 2 on 4 (too few to judge); the variant keeps 9 of 10, 3 of 6
    reference = np.array([0] * 10 + [1] * 6 + [2] * 4)
    predicted = np.array([0] * 9 + [1] + [1, 1, 1, 0, 0, INVALID_CLASS] + [0] * 4)
    assert decisions_kept(predicted, reference) == Kept("decisions_kept", "class 1", 6.0, 3.0)


def test_decisions_kept_judges_each_label_on_and_off_and_nothing_fp32_decides_on_too_few_rows():
    reference = np.zeros((12, 2), dtype=np.int64)
    reference[:5, 0] = 1  # label 0 on 5 rows, off on 7; label 1 never on (off on 12)
    predicted = reference.copy()
    predicted[:, 0] = 0  # label 0 never switched on
    # the variant changes none of the decisions of the labels it keeps: losing any by chance has probability 0
    assert decisions_kept(predicted, reference) == Kept("decisions_kept", "label 0 on", 5.0, 0.0, chance=0.0,
                                                        elsewhere=0.0)  # fmt: skip
    assert decisions_kept(np.array([1, 1, 1, 1]), np.array([0, 0, 0, 0])) is None  # 4 rows < MIN_ROWS


def test_a_labels_on_decisions_are_compared_with_the_on_decisions_of_the_labels_kept():
    """Multilabel, 100 rows: label 0 on in 5 rows, labels 1-3 on in 20 each; the variant switches off 3 of label 0's
    5 and 4 of each other label's 20 (20 % of the positives), and no "off" decision. Pooled with the 335 "off"
    decisions the rate was 12 / 395 = 3.0 %: 8 classes x P(X >= 3 | 5, 0.0304) = 0.0021, a breach for a label losing
    its positives as often as every label does. Against the "on" decisions' 20 %: 8 x P(X >= 3 | 5, 0.2) =
    8 x 0.05792 = 0.463, by chance; losing all 5 is 8 x 0.2^5 = 0.00256, still lost."""
    reference = np.zeros((100, 4), dtype=np.int64)
    reference[:5, 0] = 1
    for j in (1, 2, 3):
        reference[20 * j : 20 * j + 20, j] = 1
    predicted = reference.copy()
    predicted[:3, 0] = 0
    for j in (1, 2, 3):
        predicted[20 * j : 20 * j + 4, j] = 0
    kept = decisions_kept(predicted, reference)
    assert (kept.component, kept.reference, kept.own, kept.elsewhere) == ("label 0 on", 5.0, 2.0, pytest.approx(0.2))
    assert kept.chance == pytest.approx(8 * 0.05792) and not lost(kept)
    predicted[:5, 0] = 0
    kept = decisions_kept(predicted, reference)
    assert (kept.component, kept.own, kept.chance) == ("label 0 on", 0.0, pytest.approx(8 * 0.2**5)) and lost(kept)


def _many_classes(lost_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(predicted, reference): FP32 decides each of 100 classes on 5 rows; the variant changes one row of each of
    classes 1..27 (27 of the 495 rows of the classes it keeps: 5.45 %) and `lost_rows` of class 0's 5."""
    reference = np.repeat(np.arange(100), 5)
    predicted = reference.copy()
    predicted[5 * np.arange(1, 28)] += 1
    predicted[:lost_rows] = 99
    return predicted, reference


def test_a_class_losing_three_of_five_rows_among_a_hundred_is_no_loss_at_the_variant_s_own_change_rate():
    # an honest variant changing 5.45 % of its answers loses 3 of some class's 5 rows by chance: per class
    # 10 p^3 (1 - p)^2 + 5 p^4 (1 - p) + p^5 = 0.001493, over 100 classes judged 0.149 (before: a breach at 40 % kept)
    kept = decisions_kept(*_many_classes(3))
    assert (kept.component, kept.reference, kept.own, kept.elsewhere) == ("class 0", 5.0, 2.0, pytest.approx(27 / 495))
    assert kept.share < KEPT and kept.chance == pytest.approx(0.1493, abs=1e-4) and not lost(kept)


def test_a_class_losing_all_five_rows_among_a_hundred_is_lost():
    kept = decisions_kept(*_many_classes(5))  # 100 * (27 / 495)^5 = 4.8e-5
    assert (kept.component, kept.own, kept.chance) == ("class 0", 0.0, pytest.approx(100 * (27 / 495) ** 5))
    assert kept.chance < CHANCE and lost(kept)


def test_the_record_names_the_class_lost_beyond_chance_before_one_kept_less_by_chance():
    # class 0 keeps 2 of 5 (40 %: likely by chance, as above); class 1 keeps 9 of 20 (45 %) at the same change rate
    # elsewhere: 11 of 20 lost is far beyond it. The record names class 1, though class 0 kept the smaller share.
    predicted, reference = _many_classes(3)
    reference, predicted = np.r_[reference, [100] * 20], np.r_[predicted, [100] * 9 + [0] * 11]
    kept = decisions_kept(predicted, reference)
    assert (kept.component, kept.reference, kept.own) == ("class 100", 20.0, 9.0) and lost(kept)


def test_a_record_without_a_chance_is_judged_on_its_share_alone():
    assert lost(Kept("decisions_kept", "class 0", 5.0, 2.0))  # results written before qbench recorded a chance
    assert lost(Kept("decisions_kept", "class 0", 5.0, 2.0, chance=float("nan"), elsewhere=0.05))  # fail closed
    assert not lost(Kept("decisions_kept", "class 0", 5.0, 2.0, chance=CHANCE, elsewhere=0.05))
    assert lost(Kept("decisions_kept", "class 0", 5.0, 2.0, chance=0.049, elsewhere=0.05))
    assert not lost(Kept("decisions_kept", "class 0", 5.0, 3.0))


def test_a_class_of_tokens_counts_its_rows_as_its_draws():
    # class 3: 10 tokens in 5 rows (2 a row), 6 of them lost (3 rows' pairs); class 0: 40 tokens of 20 rows, 4 changed
    # (10 %). As 10 tokens: P(X >= 6 | 10, 0.1) = 1.5e-4; as 5 rows of which 3 lost: P(X >= 3 | 5, 0.1) = 0.00856
    reference = np.r_[[3] * 10, [0] * 40]
    rows = np.r_[np.repeat(np.arange(5), 2), np.repeat(np.arange(5, 25), 2)]
    predicted = reference.copy()
    predicted[:6] = 1
    predicted[10:14] = 1
    kept = token_decisions_kept(predicted, reference, rows)
    assert (kept.component, kept.reference, kept.own, kept.elsewhere) == ("class 3", 5.0, 2.0, pytest.approx(0.1))
    assert kept.chance == pytest.approx(2 * 0.00856)  # 2 classes judged


def test_a_token_class_is_kept_row_by_row_so_one_long_row_cannot_outweigh_the_rest():
    """Class 1 in 5 rows: row 20 holds 20 of its 24 tokens, rows 21-24 one each; class 0: 5 tokens in each of rows
    0-19, one token changed in rows 0-4 (5 of 100). On a share of tokens, losing the class on row 20 alone (4 of 5
    rows kept) breached (4 of 24 tokens kept, counted as 5 rows lost: chance 2 x 0.05^5 = 6.3e-7), while losing it on
    rows 21-24 (1 of 5 rows kept) passed (20 of 24 tokens kept): the variant that lost more rows fared better. A row is
    the unit: the first keeps 4 of 5 rows; the second keeps 1, and losing 4 of 5 rows at the 5 % its other class
    changes is 2 x (5 x 0.05^4 x 0.95 + 0.05^5) = 6.0e-5 (2 classes judged)."""
    reference = np.r_[[0] * 100, [1] * 20, [1] * 4]
    rows = np.r_[np.repeat(np.arange(20), 5), [20] * 20, np.arange(21, 25)]
    noisy = reference.copy()
    noisy[[0, 5, 10, 15, 20]] = 2  # one token of class 0 changed in each of rows 0-4
    long_row, short_rows = noisy.copy(), noisy.copy()
    long_row[rows == 20] = 0
    short_rows[rows >= 21] = 0
    kept = token_decisions_kept(long_row, reference, rows)
    assert kept == Kept("token_decisions_kept", "class 1", 5.0, 4.0) and not lost(kept)
    kept = token_decisions_kept(short_rows, reference, rows)
    assert (kept.component, kept.reference, kept.own, kept.elsewhere) == ("class 1", 5.0, 1.0, 0.05)
    assert kept.chance == pytest.approx(2 * (5 * 0.05**4 * 0.95 + 0.05**5)) and lost(kept)


def test_token_decisions_kept_counts_rows_and_names_its_own_rule():
    # 12 scored tokens of 6 rows (2 each): FP32 decides class 3 on 5 of them (rows 0, 1, 2, 3, 4), the variant on 2;
    # class 0 on 7, all kept
    reference = np.array([3, 0, 3, 0, 3, 0, 3, 0, 3, 0, 0, 0])
    predicted = np.array([3, 0, 0, 0, 3, 0, 1, 0, 0, 0, 0, 0])
    rows = np.repeat(np.arange(6), 2)
    assert token_decisions_kept(predicted, reference, rows) == Kept("token_decisions_kept", "class 3", 5.0, 2.0,
                                                                    chance=0.0, elsewhere=0.0)  # fmt: skip
    assert token_decisions_kept(reference[:9], reference[:9], rows[:9]) == Kept("token_decisions_kept", "class 3", 5.0,
                                                                                5.0)  # fmt: skip
    assert token_decisions_kept(reference[:8], reference[:8], rows[:8]) is None  # 4 tokens of each: too few to judge


def test_token_decisions_kept_judges_a_class_on_tokens_of_five_rows_at_least():
    # a language model's repeated pattern: FP32 decides class 7 on 9 tokens, 7 of them in row 2 (3 rows in all), and
    # the variant on 3 of them. Those tokens share one context and flip together: 3 rows cannot show half of the class
    # lost (it was judged on its 9 tokens, 33 % kept: a breach). Class 0's 6 tokens lie in 6 rows: judged.
    reference = np.array([7, 0, 7, 7, 7, 7, 7, 7, 7, 0, 7, 0, 0, 0, 0])
    rows = np.array([0, 0, 1, 2, 2, 2, 2, 2, 2, 3, 2, 4, 5, 6, 7])
    predicted = np.array([7, 0, 1, 7, 7, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0])
    assert token_decisions_kept(predicted, reference, rows) == Kept("token_decisions_kept", "class 0", 6.0, 6.0)
    assert decisions_kept(predicted, reference) == Kept("decisions_kept", "class 7", 9.0, 3.0, chance=0.0,
                                                        elsewhere=0.0)  # the rows unknown  # fmt: skip


def test_tail_kept_compares_the_reach_of_the_extreme_rows_past_the_rows_before_them():
    reference = np.arange(100.0)  # top rows 95..99 (mean 97) reach 5 past rows 90..94 (mean 92); bottom alike
    clamped = np.minimum(reference, 93.5)  # top rows all 93.5; rows 90..94 become 90, 91, 92, 93, 93.5: mean 91.9
    assert tail_kept(clamped, reference) == Kept("tail_kept", "column 0 top", 5.0, pytest.approx(1.6))
    assert tail_kept(clamped, reference).share < KEPT
    # an offset every output shares, or a scale, is no lost tail: each side's reach is taken on its own outputs
    assert tail_kept(reference + 7.0, reference).share == pytest.approx(1.0)
    assert tail_kept(reference * 0.9, reference).share == pytest.approx(0.9)


def test_tail_kept_skips_an_end_that_plateaus_and_a_scope_with_too_few_tail_rows():
    plateau = np.r_[np.zeros(50), np.arange(50.0)]  # bottom 5 rows all 0, the next one 0 too: no reach
    judged = tail_kept(plateau, plateau)
    assert judged is not None and judged.component == "column 0 top"
    assert tail_kept(np.arange(99.0), np.arange(99.0)) is None  # floor(99 * 0.05) = 4 rows < MIN_ROWS


def test_spread_kept_names_the_dimension_that_stopped_varying_and_ignores_a_negligible_one():
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(200, 4)) * [1.0, 2.0, 1.0, 0.001]
    outputs = reference.copy()
    outputs[:, 3] = 0.0  # a dimension FP32 varies by 0.001 of the others: not judged
    outputs[:, 2] *= 0.25
    found = spread_kept(outputs, reference)
    assert (found.rule, found.component) == ("spread_kept", "dimension 2")
    assert found.share == pytest.approx(0.25)
    assert found.reference == pytest.approx(np.std(reference[:, 2]))


def test_a_scope_without_rows_has_nothing_to_judge():
    """A slice no row of a subset falls in (the sweep's dry run scores 8 rows; the search screens a few): each rule
    gives no record, where reshaping (0, 384) outputs to columns raised."""
    empty = np.zeros((0, 384), dtype=np.float32)
    assert spread_kept(empty, empty) is None and tail_kept(empty, empty) is None
    assert decisions_kept(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)) is None


def test_shared_cosine_is_the_mean_cosine_over_every_pair_of_rows():
    # unit rows (1, 0), (0, 1), and (3, 4) -> (0.6, 0.8); a zero row and a NaN row have no direction
    reference = np.array([[2.0, 0.0], [0.0, 5.0], [3.0, 4.0], [0.0, 0.0], [np.nan, 1.0]])
    # mean unit vector (1.6, 1.8) / 3, |.|^2 = (2.56 + 3.24) / 9; the 9 pairs' cosines: 1+0+0.6, 0+1+0.8, 0.6+0.8+1
    assert shared_cosine(reference) == pytest.approx(5.8 / 9)
    assert shared_cosine(np.zeros((3, 2))) != shared_cosine(np.zeros((3, 2)))  # NaN: no row with a direction


def test_rows_kept_names_the_row_whose_cosine_rises_least_above_what_fp32_s_rows_share():
    cosine = np.array([1.0, 0.99, 0.95, np.nan, 0.999, 0.998])
    rows = np.array([10, 11, 12, 13, 14, 15])
    # shared 0.9: room 0.1 above it; row 12 keeps 0.95 - 0.9 = 0.05 of it, half; the NaN row (no direction) is skipped
    assert rows_kept(cosine, 0.9, rows) == Kept("rows_kept", "row 12", pytest.approx(0.1), pytest.approx(0.05))
    flipped = cosine.copy()
    flipped[1] = -1.0  # a flipped row keeps nothing, not less than nothing
    assert rows_kept(flipped, 0.9, rows) == Kept("rows_kept", "row 11", pytest.approx(0.1), 0.0)
    assert rows_kept(cosine[:4], 0.9, rows[:4]) is None  # 3 judged rows < MIN_ROWS
    assert rows_kept(cosine, 1.0, rows) is None  # every FP32 row one direction: nothing tells them apart


def test_a_variant_may_record_the_other_rule_of_fp32_s_slot():
    assert comparable("spread_kept", "rows_kept") and comparable("rows_kept", "spread_kept")
    assert comparable("tail_kept", "tail_kept") and not comparable("decisions_kept", "rows_kept")


def test_across_corrects_a_records_chance_over_the_scopes_the_gate_judges():
    record = Kept("decisions_kept", "class 10", 5.0, 1.0, chance=0.014, elsewhere=0.0848)
    assert lost(record) and across(record, 11).chance == pytest.approx(0.154) and not lost(across(record, 11))
    assert across(record, 1) == record and across(record, 100).chance == 1.0
    assert across(Kept("tail_kept", "column 0 top", 5.0, 1.0), 11) == Kept("tail_kept", "column 0 top", 5.0, 1.0)
