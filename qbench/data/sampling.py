"""The calibration sample: which rows the quantizers see, drawn reproducibly and recorded by hash."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd

from qbench.data.filters import scalar_column
from qbench.recipe_data import CalibrationSpec

STRATIFY_FIELD = "data.calibration.stratify_by"


def draw_calibration_sample(
    df: pd.DataFrame, candidates: np.ndarray, spec: CalibrationSpec, *, recipe_file: Path
) -> np.ndarray:
    """`spec.samples` positions from `candidates` without replacement (all of them if fewer), sorted ascending.

    The generator is `np.random.default_rng(spec.seed)` and candidates are sorted
    first, so the same table, filter and seed always give the same rows. With
    `stratify_by`, each value of that column gets a share of the sample in
    proportion to its share of the candidates (missing values form a stratum).
    """
    candidates = np.sort(np.asarray(candidates, dtype=np.int64))
    strata = _strata(df, candidates, spec.stratify_by, recipe_file=recipe_file)
    if spec.samples >= len(candidates):
        return candidates
    rng = np.random.default_rng(spec.seed)
    quotas = allocate_proportionally(np.array([len(s) for s in strata]), spec.samples)
    drawn = [
        rng.choice(members, size=quota, replace=False) for members, quota in zip(strata, quotas, strict=True) if quota
    ]
    return np.sort(np.concatenate(drawn)).astype(np.int64)


def allocate_proportionally(counts: np.ndarray, total: int) -> np.ndarray:
    """Split `total` over groups of sizes `counts` by largest remainder (ties go to the earlier group).

    When `total` is at least the number of groups, every group gets at least
    one: a rare value still shows up in calibration. A group never gets more
    than it has, provided `total` is below `counts.sum()`.
    """
    counts = np.asarray(counts, dtype=np.int64)
    exact = total * counts / counts.sum()
    quotas = np.floor(exact).astype(np.int64)
    by_remainder = np.argsort(-(exact - quotas), kind="stable")
    quotas[by_remainder[: total - quotas.sum()]] += 1
    if total >= len(counts):
        for empty in np.flatnonzero(quotas == 0):
            quotas[np.argmax(quotas)] -= 1
            quotas[empty] = 1
    return quotas


def row_ids_sha256(positions: np.ndarray) -> str:
    """sha256 of the sorted row positions as little-endian int64: equal hashes mean the same calibration rows."""
    ordered = np.sort(np.asarray(positions, dtype=np.int64)).astype("<i8")
    return hashlib.sha256(ordered.tobytes()).hexdigest()


def per_slice_counts(positions: np.ndarray, masks: dict[str, np.ndarray]) -> dict[str, int]:
    """How many of `positions` fall in each slice."""
    return {name: int(np.count_nonzero(mask[positions])) for name, mask in masks.items()}


def _strata(df: pd.DataFrame, candidates: np.ndarray, column: str | None, *, recipe_file: Path) -> list[np.ndarray]:
    """Candidates grouped by the stratify column's value, groups in order of first appearance (one group without)."""
    if column is None:
        return [candidates]
    values = scalar_column(df, column, field=STRATIFY_FIELD, recipe_file=recipe_file).iloc[candidates]
    codes, _ = pd.factorize(values, use_na_sentinel=False)
    grouped = candidates[np.argsort(codes, kind="stable")]
    return np.split(grouped, np.cumsum(np.bincount(codes))[:-1])
