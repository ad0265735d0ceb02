"""Nearest-neighbour agreement of embeddings: does a variant keep each row's nearest rows FP32's?

O(rows² x features) by definition (every row is compared with every row), so its cost is bounded where it can be:
the similarities are computed a block of rows at a time, each block at most SIMILARITY_BLOCK_ELEMENTS similarities
(a fixed amount of memory at any row count, where a fixed 512 rows a block grew with the rows: 512 x a million
float64 similarities is 4 GB, a few of them at once); FP32 compared with itself computes them once. Time still
grows with rows²: "What qbench itself costs" in docs/internals.md gives figures. Past a bound, `query_sample` picks
the rows whose neighbours are searched (each still among all rows), so time grows with queries x rows: linear in the
rows.
"""

from __future__ import annotations

import math

import numpy as np

from qbench.errors import QbenchError
from qbench.validate.metrics import _mean, row_blocks

NEIGHBOUR_TIE = 1e-6
"""Cosine similarities within this of a row's highest are ties: its nearest neighbours form a set. Cosine lies in
[-1, 1] whatever the vectors' scale; a float32 embedding resolves about 1e-7 of it (the same input in another batch
position can move by that much), a matrix product's rounding about 1e-16, while rows meant to differ do so by far more.
So copies of a row (the same query twice) and rows equal up to rounding are tied, never ranked by noise."""

SIMILARITY_BLOCK_ELEMENTS = 1 << 24
"""Similarities (block rows x all rows) computed at once: 128 MB of float64, a few such arrays live per block."""


def _unit_rows(embeddings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row scaled to length 1 (a zero row, and a row holding NaN/inf, as zeros), and which rows are finite.
    Scaled in place in one float64 copy: one rows x features array at a time, not three."""
    unit = np.array(embeddings, dtype=np.float64)
    unit = unit.reshape(unit.shape[0], -1) if unit.ndim > 1 else unit.reshape(-1, 1)
    finite = np.isfinite(unit).all(axis=1)
    unit[~finite] = 0.0
    norms = np.linalg.norm(unit, axis=1)
    np.divide(unit, norms[:, None], out=unit, where=norms[:, None] > 0)
    return unit, finite


def _similarities(unit: np.ndarray, finite: np.ndarray, rows: slice | np.ndarray) -> np.ndarray:
    """Cosine similarity of `rows` (a slice or row numbers) with every row; -inf with themselves and with rows
    holding NaN/inf."""
    similarity = unit[rows] @ unit.T
    if not finite.all():
        similarity[:, ~finite] = -np.inf
    similarity[np.arange(similarity.shape[0]), np.arange(unit.shape[0])[rows]] = -np.inf
    return similarity


def query_sample(strata: np.ndarray, bound: int, seed: int = 0) -> np.ndarray | None:
    """Sorted row numbers of at most `bound` query rows drawn from `strata` (each row's stratum id), or None when
    every row fits (all rows are queried). Every row has the same chance, bound / rows, so a share over the sampled
    rows estimates the share over all rows without bias; each stratum keeps its share of the sample (the floor or
    the ceiling of it): the rows are ordered stratum by stratum, shuffled within each (seeded), and every
    (rows / bound)-th is taken from a seeded random start (systematic sampling)."""
    count = strata.shape[0]
    if count <= bound:
        return None
    rng = np.random.default_rng(seed)
    order = np.lexsort((rng.random(count), strata))
    picks = np.floor(rng.random() + np.arange(bound) * (count / bound)).astype(np.int64)
    return np.sort(order[np.minimum(picks, count - 1)])


def nearest_neighbour_matches(reference: np.ndarray, outputs: np.ndarray,
                              queries: np.ndarray | None = None) -> np.ndarray:
    """Per row: 1.0 if every row nearest to it under `outputs` is one of its nearest rows under `reference`, else 0.0.

    A row's nearest rows are the others whose cosine similarity with it is within NEIGHBOUR_TIE of the highest: tied
    rows (copies of a row, rows equal up to rounding) form a set, so no verdict hangs on which of them rounding puts
    first, and `reference` against itself is 1.0 on every row that has a neighbour. Where `outputs` ties a row that
    `reference` ranks lower with its nearest, the row does not match: a search could return either. A row holding
    NaN/inf is no one's neighbour and has none: it never matches (a miss for every result, the reference's own too),
    nor does a row with no finite other row. Fewer than two rows give NaN (no neighbours exist). Costs two
    rows x rows similarity products (one when `outputs` equals `reference`), computed in blocks of rows.
    `queries` (sorted row numbers, `query_sample`): only those rows are scored, each against every row (costs queries
    x rows); the others are NaN.
    """
    reference, outputs = np.asarray(reference), np.asarray(outputs)
    if reference.shape != outputs.shape:
        raise QbenchError(f"outputs have different shapes: {reference.shape} vs {outputs.shape}")
    if reference.ndim == 0:
        raise QbenchError(f"expected an array with a row axis, got a scalar ({reference!r})")
    count = reference.shape[0]
    if count < 2:
        return np.full(count, math.nan)
    (ref_unit, ref_finite), (out_unit, out_finite) = _unit_rows(reference), _unit_rows(outputs)
    same = np.array_equal(ref_unit, out_unit) and np.array_equal(ref_finite, out_finite)
    matches = np.zeros(count, dtype=np.float64)
    for block in row_blocks(count if queries is None else queries.size, count, SIMILARITY_BLOCK_ELEMENTS):
        rows = block if queries is None else queries[block]
        expected = _similarities(ref_unit, ref_finite, rows)
        found = expected if same else _similarities(out_unit, out_finite, rows)
        best_expected, best_found = expected.max(axis=1), found.max(axis=1)
        nearest_found = found >= (best_found - NEIGHBOUR_TIE)[:, None]
        # the lowest reference similarity among the outputs' nearest rows: within the tie of the reference's best?
        worst = np.where(nearest_found, expected, np.inf).min(axis=1)
        agree = (worst >= best_expected - NEIGHBOUR_TIE) & np.isfinite(best_expected) & np.isfinite(best_found)
        matches[rows] = agree
    matches[~(ref_finite & out_finite)] = 0.0
    if queries is not None:
        unscored = np.ones(count, dtype=bool)
        unscored[queries] = False
        matches[unscored] = math.nan
    return matches


def nearest_neighbour_agreement(reference: np.ndarray, outputs: np.ndarray) -> float:
    """Fraction of rows whose nearest neighbours (cosine, itself excluded, ties as a set) under `outputs` are
    nearest under `reference` too (`nearest_neighbour_matches`); NaN for fewer than two rows."""
    return _mean(nearest_neighbour_matches(reference, outputs))
