"""Row-wise metrics computed block by block of rows: the same figures to the bit as one whole-array pass, with
temporaries bounded by metrics.ROW_BLOCK_ELEMENTS rather than by the row count."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from qbench.validate import metrics


def _scores(rows: int, classes: int, seed: int, *, probabilities: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """FP32-like scores and a perturbed copy (float32), with NaN/inf rows on both sides and a tie."""
    rng = np.random.default_rng(seed)
    reference = rng.normal(scale=3.0, size=(rows, classes)).astype(np.float32)
    if probabilities:
        reference = metrics.softmax(reference, axis=1).astype(np.float32)
    variant = (reference * (1 + rng.normal(scale=0.05, size=reference.shape))).astype(np.float32)
    reference[3, 1], variant[5, 0], variant[7, 2] = np.nan, np.inf, np.nan
    variant[9, :2] = variant[9].max()  # a tie: the first of them is the class
    return reference, variant


def _figures(reference: np.ndarray, variant: np.ndarray) -> dict[str, object]:
    return {
        "top1": metrics.top1(variant),
        "kl": metrics.kl_rows(reference, variant),
        "nonfinite": metrics.nonfinite_rows(variant),
        "max_abs_error": metrics.max_abs_error(reference[:3], variant[:3]),
        "max_abs_error_nan": metrics.max_abs_error(reference, variant),
        "probabilities": metrics.looks_like_probabilities(reference),
    }


@pytest.mark.parametrize("probabilities", [False, True])
def test_blocks_of_rows_give_the_whole_array_figures_to_the_bit(monkeypatch, probabilities) -> None:
    reference, variant = _scores(40, 7, seed=1, probabilities=probabilities)
    whole = _figures(reference, variant)  # 280 values: one block, the whole-array arithmetic
    blocks: list[int] = []
    row_blocks = metrics.row_blocks
    monkeypatch.setattr(metrics, "ROW_BLOCK_ELEMENTS", 20)  # 2 rows of 7 classes a block
    monkeypatch.setattr(metrics, "row_blocks", lambda *a: blocks.append(len(row_blocks(*a))) or row_blocks(*a))
    blocked = _figures(reference, variant)
    assert max(blocks) == 20  # the blocking was exercised
    assert whole["probabilities"] is blocked["probabilities"] is probabilities
    for name in ("top1", "kl", "nonfinite"):
        np.testing.assert_array_equal(blocked[name], whole[name], strict=True)
    assert blocked["max_abs_error"] == whole["max_abs_error"] > 0
    assert np.isnan(whole["max_abs_error_nan"]) and np.isnan(blocked["max_abs_error_nan"])


def test_rows_of_every_block_count_towards_one_reading(monkeypatch) -> None:
    # one row per block: the reading is the share of distributions over all blocks, as read whole
    reference = np.full((6, 4), 0.25)
    reference[-2:] = [2.0, -1.0, 0.5, 0.5]
    monkeypatch.setattr(metrics, "ROW_BLOCK_ELEMENTS", 4)
    assert metrics.distribution_rows(reference) == metrics.DistributionRows(4, 6, 1e-3)
    assert metrics.looks_like_probabilities(reference) is True
    assert metrics.looks_like_probabilities(reference[2:]) is False  # 2 distributions of 4: no majority


def test_kl_and_top1_memory_is_bounded_by_the_block_not_the_rows(monkeypatch) -> None:
    reference, variant = _scores(4000, 500, seed=2)  # 8 MB each as float32, 16 MB widened to float64
    monkeypatch.setattr(metrics, "ROW_BLOCK_ELEMENTS", 50_000)
    tracemalloc.start()
    try:
        metrics.kl_rows(reference, variant)
        metrics.top1(variant)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8_000_000  # less than one float32 copy of an output: nothing is widened whole
