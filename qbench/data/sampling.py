"""The calibration sample: which rows the quantizers see, drawn reproducibly and recorded by hash."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from qbench.data.filters import scalar_column
from qbench.data.leakage import row_digests
from qbench.recipe.data import CalibrationSpec, DataSpec

logger = logging.getLogger(__name__)

STRATIFY_FIELD = "data.calibration.stratify_by"
GROUP_FIELD = "data.calibration.group_by"


def draw_calibration_sample(
    df: pd.DataFrame, candidates: np.ndarray, spec: CalibrationSpec, *, recipe_file: Path
) -> np.ndarray:
    """`spec.samples` positions from `candidates` without replacement (all of them if fewer), sorted ascending.

    The generator is `np.random.default_rng(spec.seed)` and candidates are sorted
    first, so the same table, filter and seed always give the same rows. With
    `stratify_by`, each value of that column gets a share of the sample in
    proportion to its share of the candidates (missing values form a stratum).
    With `group_by`, rows are drawn as whole groups of that column's values (group_codes, draw_from_strata).
    """
    candidates = np.sort(np.asarray(candidates, dtype=np.int64))
    strata = _strata(df, candidates, spec.stratify_by, recipe_file=recipe_file)
    groups = group_codes(df, spec.group_by, recipe_file=recipe_file)
    if spec.samples >= len(candidates):
        return candidates
    return draw_from_strata(strata, spec.samples, np.random.default_rng(spec.seed), groups=groups)


def group_codes(df: pd.DataFrame, column: str | None, *, recipe_file: Path) -> np.ndarray | None:
    """Each table row's group (`data.calibration.group_by`: a query id, a series) as an integer code, a row whose
    value is missing a group of its own; None without one. A metric over groups of rows (NDCG per query) reads a part
    of a group as a whole one: a query with 4 of its 10 documents keeps its top 5 in order far more easily, so rows it
    is computed on are drawn whole groups at a time."""
    if column is None:
        return None
    values = scalar_column(df, column, field=GROUP_FIELD, recipe_file=recipe_file)
    codes = pd.factorize(values)[0].astype(np.int64)
    # a row with no group id is a group of its own: rows missing it are no one query, and as one group they could
    # fill a draw many times over (100 such rows drawn whole for samples: 20)
    missing = codes < 0
    codes[missing] = codes.max(initial=-1) + 1 + np.arange(int(missing.sum()))
    return codes


def warn_thin_sample(table: pd.DataFrame, pool: int, rows: np.ndarray, data: DataSpec) -> None:
    """Warn where the calibration sample represents fewer rows than `data.calibration.samples` asks: the pool it is
    drawn from (`pool` rows: data.calibration's filter or file) holds fewer, or the rows drawn repeat each other's
    inputs (one row exported 40 times: the ranges are those of one row, and the sample's size says otherwise)."""
    asked = data.calibration.samples
    where = ("data.calibration.path" if data.calibration.path is not None
             else "data.calibration.filter" if data.calibration.filter is not None else "data.path")  # fmt: skip
    if pool < asked:
        logger.warning("data.calibration.samples: %d rows asked, but %s holds only %d calibration row%s: variants are "
                       "calibrated on those", asked, where, pool, "" if pool == 1 else "s")  # fmt: skip
    if any(column not in table.columns for column in data.fed_columns):
        return  # building the feeds names the missing column
    distinct = len(np.unique(row_digests(table, rows, data.fed_columns)))
    if distinct < len(rows):
        logger.warning("data.calibration: the %d calibration rows drawn hold %d distinct input%s (the others repeat "
                       "them): the calibrated ranges are those of %d row%s", len(rows), distinct,
                       "" if distinct == 1 else "s", distinct, "" if distinct == 1 else "s")  # fmt: skip


def draw_from_strata(
    strata: list[np.ndarray], count: int, rng: np.random.Generator, *, groups: np.ndarray | None = None
) -> np.ndarray:  # fmt: skip
    """`count` positions drawn without replacement from the groups `strata`, each in proportion to its size
    (allocate_proportionally), sorted ascending; all of them when they hold no more than `count`. With `groups` (a
    code per table position: group_codes), every row of a group is drawn or none: each group counts in the stratum
    of its first row, and each stratum's quota is filled with whole groups in a seeded order, skipping any that
    would overfill it, so a stratum may get fewer rows than its quota (one whole group, more, where none fits)."""
    everything = np.concatenate(strata).astype(np.int64) if strata else np.zeros(0, dtype=np.int64)
    if count >= len(everything):
        return np.sort(everything)
    if groups is not None:
        strata = _whole_group_strata(strata, groups)
    quotas = allocate_proportionally(np.array([len(s) for s in strata]), count)
    draw = (lambda members, quota: rng.choice(members, size=quota, replace=False)) if groups is None else (
        lambda members, quota: _whole_groups(members, quota, groups, rng))  # fmt: skip
    drawn = [draw(members, quota) for members, quota in zip(strata, quotas, strict=True) if quota]
    return np.sort(np.concatenate(drawn)).astype(np.int64)


def _whole_group_strata(strata: list[np.ndarray], groups: np.ndarray) -> list[np.ndarray]:
    """`strata` regrouped so that each group's rows all lie in the stratum of its first row (the lowest position)."""
    everything = np.sort(np.concatenate(strata).astype(np.int64))
    stratum_of = np.empty(len(groups), dtype=np.int64)
    for index, members in enumerate(strata):
        stratum_of[members] = index
    codes = groups[everything]
    _, first = np.unique(codes, return_index=True)
    home = dict(zip(codes[first].tolist(), stratum_of[everything[first]].tolist(), strict=True))
    assigned = np.array([home[code] for code in codes.tolist()], dtype=np.int64)
    return [everything[assigned == index] for index in range(len(strata)) if np.any(assigned == index)]


def _whole_groups(members: np.ndarray, quota: int, groups: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Whole groups of `members` (by `groups`), in a seeded order, holding at most `quota` rows; the first group in
    that order where none fits (a quota smaller than every group). A group larger than the quota is skipped like any
    that would overfill it: taken first, one query of 100 rows filled a 20-row draw five times over."""
    codes = groups[members]
    distinct, sizes = np.unique(codes, return_counts=True)
    order = rng.permutation(len(distinct))
    taken, chosen = 0, []
    for index in order:
        if taken + sizes[index] <= quota:
            chosen.append(distinct[index])
            taken += int(sizes[index])
        if taken >= quota:
            break
    return members[np.isin(codes, chosen or [distinct[order[0]]])]


def slice_strata(positions: np.ndarray, masks: dict[str, np.ndarray]) -> list[np.ndarray]:
    """`positions` grouped by the slices they fall in (`masks` over the table): rows in the same set of slices form
    a group, so a draw from the groups keeps every slice's share (also with overlapping slices)."""
    positions = np.sort(np.asarray(positions, dtype=np.int64))
    if not masks or len(positions) == 0:
        return [positions] if len(positions) else []
    membership = np.stack([mask[positions] for mask in masks.values()], axis=1)
    _, codes = np.unique(membership, axis=0, return_inverse=True)
    codes = codes.reshape(-1)
    return [positions[codes == code] for code in range(codes.max() + 1)]


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
