"""Nearest-neighbour agreement (embeddings) against neighbour sets worked out by hand in the comments."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from qbench.errors import QbenchError
from qbench.validate import neighbours

NAN = float("nan")

# Two clusters in 2-D: rows 0/1 near the x axis, rows 2/3 near the y axis; no ties.
NN_REFERENCE = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
# Row 1 moves into the y cluster: cosines of [0.2, 0.8] with rows 0, 2, 3 are 0.243, 0.970, 0.991.
NN_VARIANT = np.array([[1.0, 0.0], [0.2, 0.8], [0.0, 1.0], [0.1, 0.9]])


def test_nearest_neighbour_agreement_counts_rows_whose_neighbour_moved() -> None:
    # reference: 0 <-> 1 and 2 <-> 3; variant: row 1's nearest is now row 3 (0.991), row 0 keeps row 1 (0.243 beats
    # 0.110 for row 3 and 0 for row 2): only row 1 changed neighbour, 3 of 4 rows agree
    assert neighbours.nearest_neighbour_matches(NN_REFERENCE, NN_VARIANT).tolist() == [1.0, 0.0, 1.0, 1.0]
    assert neighbours.nearest_neighbour_agreement(NN_REFERENCE, NN_VARIANT) == pytest.approx(0.75)


def test_nearest_neighbour_agreement_is_scale_invariant_and_perfect_on_itself() -> None:
    assert neighbours.nearest_neighbour_agreement(NN_REFERENCE, NN_REFERENCE * 3.0) == 1.0


def test_copies_of_a_row_are_all_its_nearest_neighbours_whichever_rounding_puts_first() -> None:
    """Row 3 ([0.8, 0.6]) has cosine 0.8 with rows 0 and 1, copies of [1, 0]: both are its nearest. The variant
    moves row 0 by 1e-9, so its rounding ranks row 1 first for row 3; that is still one of FP32's nearest. (Ties
    went to whichever row the arg-max met first: FP32's row 0 against the variant's row 1, a mismatch.)"""
    reference = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.8, 0.6]])
    variant = reference.copy()
    variant[0] = [1.0, -1e-9]  # cosine with row 3: 0.8 - 6e-10
    # row 0: {1} (cosine 1); row 1: {0}; row 2: {3} (0.6 beats 0 and 0); row 3: {0, 1} (0.8 each, 0.6 for row 2)
    assert neighbours.nearest_neighbour_matches(reference, variant).tolist() == [1.0, 1.0, 1.0, 1.0]


def test_a_variant_that_ties_a_farther_row_with_the_nearest_does_not_agree() -> None:
    """FP32 ranks row 1 (cosine 0.99 with row 0) above row 2 (0.9); the variant gives both 0.9, so a search for
    row 0 returns either. (The arg-max met row 1 first and counted it as agreeing.)"""
    reference = np.array([[1.0, 0.0, 0.0], [0.99, math.sqrt(1 - 0.99**2), 0.0], [0.9, 0.0, math.sqrt(0.19)]])
    variant = np.array([[1.0, 0.0, 0.0], [0.9, math.sqrt(0.19), 0.0], [0.9, 0.0, math.sqrt(0.19)]])
    # row 0: FP32 {1}, variant {1, 2}; row 1: cosines 0.99 / 0.891 (FP32), 0.9 / 0.81 (variant): {0} in both;
    # row 2: 0.9 / 0.891 (FP32), 0.9 / 0.81 (variant): {0} in both
    assert neighbours.nearest_neighbour_matches(reference, variant).tolist() == [0.0, 1.0, 1.0]


def _two_neighbours(first: float, second: float) -> np.ndarray:
    """Row 0 = [1, 0]; row 1 at cosine `first` with it, row 2 at cosine `second` (on the other side of the x axis)."""
    return np.array([[1.0, 0.0], [first, math.sqrt(1 - first**2)], [second, -math.sqrt(1 - second**2)]])


@pytest.mark.parametrize(("gap", "expected"), [(1e-8, 1.0), (1e-4, 0.0)])
def test_a_near_tie_within_the_tolerance_is_a_tie_and_a_real_gap_is_not(gap: float, expected: float) -> None:
    # FP32: row 1 at 0.8, row 2 at 0.8 - gap; the variant clearly prefers row 2 (0.75 over 0.7). A gap of 1e-8 is
    # under NEIGHBOUR_TIE (1e-6): rows 1 and 2 are both FP32's nearest, and row 2 agrees; 1e-4 ranks them, and it
    # does not
    assert neighbours.NEIGHBOUR_TIE == 1e-6
    matches = neighbours.nearest_neighbour_matches(_two_neighbours(0.8, 0.8 - gap), _two_neighbours(0.7, 0.75))
    assert matches[0] == expected


def test_fp32_rerun_with_rounding_noise_agrees_with_itself_on_every_row() -> None:
    """8 distinct rows, each 5 times (the same query repeated), every copy moved by float32 rounding as another
    batch position would: each row's nearest rows are its copies, tied, and a rerun agrees on all 40 (the arg-max
    picked among the copies by noise, a coin flip per row)."""
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(8, 16))[np.repeat(np.arange(8), 5)]

    def rerun() -> np.ndarray:
        return (rows * (1.0 + rng.normal(scale=2e-7, size=rows.shape))).astype(np.float32)

    assert neighbours.nearest_neighbour_agreement(rerun(), rerun()) == 1.0


def test_a_nonfinite_row_has_no_neighbour_and_is_nobody_s_neighbour() -> None:
    variant = NN_VARIANT.copy()
    variant[2] = [NAN, 1.0]
    # row 2: no neighbour; row 3 cannot pick row 2 any more and takes row 1 (0.991); row 1 keeps row 3:
    # against the reference ({1}, {0}, {3}, {2}) only row 0 agrees
    assert neighbours.nearest_neighbour_matches(NN_REFERENCE, variant).tolist() == [1.0, 0.0, 0.0, 0.0]
    # FP32's own NaN row is a miss against itself too; the others keep their neighbours ({1}, {0}, -, {1})
    assert neighbours.nearest_neighbour_matches(variant, variant).tolist() == [1.0, 1.0, 0.0, 1.0]


def test_nearest_neighbour_agreement_needs_two_rows_and_equal_shapes() -> None:
    assert math.isnan(neighbours.nearest_neighbour_agreement(np.zeros((0, 3)), np.zeros((0, 3))))
    assert math.isnan(neighbours.nearest_neighbour_agreement(np.ones((1, 3)), np.ones((1, 3))))
    with pytest.raises(QbenchError, match="different shapes"):
        neighbours.nearest_neighbour_agreement(np.ones((3, 2)), np.ones((3, 4)))


def _matches_by_sets(reference: np.ndarray, outputs: np.ndarray) -> list[float]:
    """The definition row by row: the outputs' nearest set (within the tie) inside the reference's."""

    def nearest(rows: np.ndarray, i: int) -> set[int]:
        unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        similarity = {j: float(unit[i] @ unit[j]) for j in range(len(rows)) if j != i}
        best = max(similarity.values())
        return {j for j, s in similarity.items() if s >= best - neighbours.NEIGHBOUR_TIE}

    return [float(nearest(outputs, i) <= nearest(reference, i)) for i in range(len(reference))]


def test_blocks_of_rows_give_the_definition_row_by_row(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(37, 4))[rng.integers(0, 12, size=37)]  # 12 distinct rows: copies tie
    outputs = reference + rng.normal(scale=0.3, size=reference.shape)
    expected = _matches_by_sets(reference, outputs)
    assert 0 < sum(expected) < len(expected)
    assert neighbours.nearest_neighbour_matches(reference, outputs).tolist() == expected
    blocks = []
    similarities = neighbours._similarities
    monkeypatch.setattr(neighbours, "_similarities", lambda *a: blocks.append(a[2]) or similarities(*a))
    monkeypatch.setattr(neighbours, "SIMILARITY_BLOCK_ELEMENTS", 5 * 37)  # 5 rows a block, against all 37
    assert neighbours.nearest_neighbour_matches(reference, outputs).tolist() == expected
    assert blocks[-1] == slice(35, 37) and len(blocks) == 2 * 8


def test_fp32_against_itself_computes_the_similarities_once(monkeypatch: pytest.MonkeyPatch) -> None:
    reference = np.random.default_rng(1).normal(size=(30, 3))
    reference[4] = reference[9]  # copies tie
    monkeypatch.setattr(neighbours, "SIMILARITY_BLOCK_ELEMENTS", 10 * 30)  # 3 blocks of 10 rows
    calls = []
    similarities = neighbours._similarities
    monkeypatch.setattr(neighbours, "_similarities", lambda *a: calls.append(a[2]) or similarities(*a))
    assert neighbours.nearest_neighbour_matches(reference, reference.copy()).tolist() == [1.0] * 30
    assert len(calls) == 3
    calls.clear()
    outputs = reference + 0.1
    assert neighbours.nearest_neighbour_matches(reference, outputs).tolist() == _matches_by_sets(reference, outputs)
    assert len(calls) == 6


def test_similarity_blocks_hold_a_bounded_number_of_values_whatever_the_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    reference = rng.normal(size=(3000, 8))
    outputs = reference + rng.normal(scale=0.01, size=reference.shape)
    monkeypatch.setattr(neighbours, "SIMILARITY_BLOCK_ELEMENTS", 150_000)  # 50 rows x 3,000: 1.2 MB of float64
    tracemalloc.start()
    try:
        neighbours.nearest_neighbour_matches(reference, outputs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8_000_000  # a fixed 512 rows a block held 512 x 3,000 x 8 bytes = 12 MB per similarity matrix
