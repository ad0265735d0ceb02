"""Calibration sampling: reproducible draws, stratified proportions, and the row-id record."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qbench.data.sampling import allocate_proportionally, draw_calibration_sample, per_slice_counts, row_ids_sha256
from qbench.errors import RecipeError
from qbench.recipe.data import CalibrationSpec

RECIPE = Path("recipe.yaml")


def _table(groups: dict[str, int]) -> pd.DataFrame:
    """Rows of each group interleaved, so that strata are not contiguous blocks."""
    values = [name for name, count in groups.items() for _ in range(count)]
    order = np.random.default_rng(123).permutation(len(values))
    return pd.DataFrame({"noise": np.array(values)[order], "row": np.arange(len(values))})


def test_plain_draw_is_a_sorted_subset_without_repeats() -> None:
    table = _table({"clean": 200})
    candidates = np.arange(0, 200, 2)
    drawn = draw_calibration_sample(table, candidates, CalibrationSpec(samples=30), recipe_file=RECIPE)
    assert len(drawn) == 30 and len(set(drawn.tolist())) == 30
    assert set(drawn.tolist()) <= set(candidates.tolist())
    assert drawn.tolist() == sorted(drawn.tolist())


def test_same_seed_same_rows_other_seed_other_rows() -> None:
    table = _table({"clean": 500})
    candidates = np.arange(500)
    first = draw_calibration_sample(table, candidates, CalibrationSpec(samples=40, seed=7), recipe_file=RECIPE)
    shuffled = np.random.default_rng(0).permutation(candidates)
    again = draw_calibration_sample(table, shuffled, CalibrationSpec(samples=40, seed=7), recipe_file=RECIPE)
    other = draw_calibration_sample(table, candidates, CalibrationSpec(samples=40, seed=8), recipe_file=RECIPE)
    assert first.tolist() == again.tolist()
    assert first.tolist() != other.tolist()


def test_fewer_candidates_than_samples_takes_them_all() -> None:
    table = _table({"clean": 10})
    drawn = draw_calibration_sample(table, np.array([7, 3, 5]), CalibrationSpec(samples=256), recipe_file=RECIPE)
    assert drawn.tolist() == [3, 5, 7]


def test_stratified_sample_follows_the_candidates_proportions() -> None:
    table = _table({"clean": 60, "noisy": 30, "faint": 10})
    spec = CalibrationSpec(samples=20, stratify_by="noise")
    drawn = draw_calibration_sample(table, np.arange(100), spec, recipe_file=RECIPE)
    counts = table["noise"].iloc[drawn].value_counts().to_dict()
    assert counts == {"clean": 12, "noisy": 6, "faint": 2}


def test_stratified_proportions_are_of_the_candidates_not_the_table() -> None:
    table = _table({"clean": 60, "noisy": 30, "faint": 10})
    candidates = np.flatnonzero(table["noise"].ne("clean").to_numpy())
    spec = CalibrationSpec(samples=8, stratify_by="noise", seed=3)
    drawn = draw_calibration_sample(table, candidates, spec, recipe_file=RECIPE)
    assert table["noise"].iloc[drawn].value_counts().to_dict() == {"noisy": 6, "faint": 2}


def test_a_rare_stratum_still_gets_a_row() -> None:
    table = _table({"clean": 97, "noisy": 2, "faint": 1})
    spec = CalibrationSpec(samples=10, stratify_by="noise")
    drawn = draw_calibration_sample(table, np.arange(100), spec, recipe_file=RECIPE)
    assert table["noise"].iloc[drawn].value_counts().to_dict() == {"clean": 8, "noisy": 1, "faint": 1}


def test_allocation_sums_to_total_and_never_exceeds_a_group() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        counts = rng.integers(1, 40, size=rng.integers(1, 8))
        total = int(rng.integers(1, counts.sum()))
        quotas = allocate_proportionally(counts, total)
        assert quotas.sum() == total
        assert np.all(quotas <= counts) and np.all(quotas >= 0)
        if total >= len(counts):
            assert np.all(quotas >= 1)


def test_unknown_stratify_column() -> None:
    spec = CalibrationSpec(samples=5, stratify_by="nosie")
    with pytest.raises(RecipeError) as info:
        draw_calibration_sample(_table({"clean": 10}), np.arange(10), spec, recipe_file=RECIPE)
    assert str(info.value) == (
        "recipe.yaml: data.calibration.stratify_by: got 'nosie', expected one of noise, row (did you mean 'noise'?)"
    )


def test_row_ids_hash_ignores_order_and_tells_samples_apart() -> None:
    positions = np.array([5, 1, 9], dtype=np.int32)
    expected = hashlib.sha256(b"".join(int(p).to_bytes(8, "little", signed=True) for p in (1, 5, 9))).hexdigest()
    assert row_ids_sha256(positions) == expected
    assert row_ids_sha256(np.array([9, 5, 1])) == expected
    assert row_ids_sha256(np.array([1, 5, 10])) != expected


def test_per_slice_counts() -> None:
    masks = {"a": np.array([True, True, False, False]), "b": np.array([False, True, True, True])}
    assert per_slice_counts(np.array([1, 3]), masks) == {"a": 1, "b": 2}


def test_a_calibration_sample_thinner_than_asked_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    """A calibration split of 5 rows under `samples: 256`, and one row exported 40 times, were calibrated on without a
    word: results' calibration.size said 5 or 40, and nothing said the 40 rows were one. Only the sweep's own
    derivation warns (`warn`), once; a sample as large as asked, of distinct rows, says nothing."""
    import logging

    from qbench.data.evaluation import calibration_sample
    from qbench.recipe.data import DataSpec

    rng = np.random.default_rng(0)
    repeated = np.repeat(rng.normal(size=(1, 4)).astype(np.float32), 40, axis=0)
    table = pd.DataFrame({"x": list(np.concatenate([repeated, rng.normal(size=(5, 4)).astype(np.float32)])),
                          "split": ["copy"] * 40 + ["few"] * 5})  # fmt: skip

    def warnings_for(split: str, samples: int, warn: bool = True) -> list[str]:
        caplog.clear()
        data = DataSpec(path=Path("d.parquet"), inputs={"x": "x"},
                        calibration={"filter": {"split": split}, "samples": samples})  # fmt: skip
        with caplog.at_level(logging.WARNING):
            rows, _, _ = calibration_sample(table, data, {}, recipe_file=RECIPE, warn=warn)
        return [r.getMessage() for r in caplog.records]

    assert warnings_for("few", 256) == ["data.calibration.samples: 256 rows asked, but data.calibration.filter holds "
                                        "only 5 calibration rows: variants are calibrated on those"]  # fmt: skip
    assert warnings_for("copy", 40) == ["data.calibration: the 40 calibration rows drawn hold 1 distinct input (the "
                                        "others repeat them): the calibrated ranges are those of 1 row"]  # fmt: skip
    assert warnings_for("few", 5) == [] and warnings_for("copy", 256, warn=False) == []


def _queries(count: int, size: int) -> pd.DataFrame:
    """`count` queries of `size` documents each, rows of the queries interleaved."""
    order = np.random.default_rng(5).permutation(count * size)
    return pd.DataFrame({"qid": np.repeat(np.arange(count), size)[order], "noise": np.where(order % 2, "a", "b")})


def test_group_by_draws_whole_groups_reproducibly() -> None:
    """A metric over groups (NDCG per query) reads part of a query as a whole one: a row-by-row draw of 256 rows from
    60 queries of 10 leaves each about 4 documents; with group_by every query is drawn whole or not at all."""
    table = _queries(60, 10)
    for stratify in (None, "noise"):  # a group counts in its first row's stratum: still whole
        spec = CalibrationSpec(samples=256, seed=1, group_by="qid", stratify_by=stratify)
        rows = draw_calibration_sample(table, np.arange(600), spec, recipe_file=RECIPE)
        counts = table.qid.iloc[rows].value_counts()
        assert (counts == 10).all() and 200 <= len(rows) <= 256
        assert np.array_equal(rows, draw_calibration_sample(table, np.arange(600), spec, recipe_file=RECIPE))
    plain = draw_calibration_sample(table, np.arange(600), CalibrationSpec(samples=256, seed=1), recipe_file=RECIPE)
    assert (table.qid.iloc[plain].value_counts() < 10).any()  # without it, queries are split


def test_unknown_group_by_column() -> None:
    spec = CalibrationSpec(samples=5, group_by="quid")
    with pytest.raises(RecipeError) as info:
        draw_calibration_sample(_queries(3, 4), np.arange(12), spec, recipe_file=RECIPE)
    assert str(info.value) == (
        "recipe.yaml: data.calibration.group_by: got 'quid', expected one of noise, qid (did you mean 'qid'?)"
    )


def test_group_by_rows_missing_their_group_are_groups_of_one() -> None:
    """10 queries of 10 rows and 100 rows with no query id: read as one group, those 100 rows were drawn whole for
    samples: 20 (seed 5 drew 100 rows, every one without an id). Each is now a group of its own: no draw exceeds the
    20 rows asked, and the queries still come whole."""
    qid = np.concatenate([np.repeat(np.arange(10.0), 10), np.full(100, np.nan)])
    table = pd.DataFrame({"qid": qid})
    for seed in range(10):
        spec = CalibrationSpec(samples=20, seed=seed, group_by="qid")
        rows = draw_calibration_sample(table, np.arange(200), spec, recipe_file=RECIPE)
        assert len(rows) == 20
        assert (table.qid.iloc[rows].value_counts() == 10).all()  # value_counts leaves the missing ids out


def test_group_by_skips_a_group_larger_than_the_draw_where_smaller_ones_fit() -> None:
    """One query of 100 rows beside 20 of 5, samples: 20: the big query was taken whenever the seeded order put it
    first (seeds 4 and 29 of 0-29 drew 100 rows). It overfills the draw as any group would, and is skipped: every
    seed draws 4 whole queries of 5."""
    table = pd.DataFrame({"qid": np.concatenate([np.zeros(100), np.repeat(np.arange(1, 21), 5)])})
    for seed in range(30):
        spec = CalibrationSpec(samples=20, seed=seed, group_by="qid")
        rows = draw_calibration_sample(table, np.arange(200), spec, recipe_file=RECIPE)
        assert len(rows) == 20 and (table.qid.iloc[rows].value_counts() == 5).all()
    only_big = pd.DataFrame({"qid": np.repeat([0, 1], [100, 60])})  # no query fits 20 rows: one whole, seeded
    spec = CalibrationSpec(samples=20, seed=0, group_by="qid")
    rows = draw_calibration_sample(only_big, np.arange(160), spec, recipe_file=RECIPE)
    assert len(rows) in (100, 60) and only_big.qid.iloc[rows].nunique() == 1
