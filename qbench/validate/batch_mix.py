"""A variant whose rows' outputs depend on the rows batched beside them is judged also as it serves.

A per-batch statistic (dynamic INT8's DynamicQuantizeLinear takes each batch's own range, a SmoothQuant or `linear`
dynamic candidate alike, a BatchNormalization exported in training mode) makes each row's output follow its whole
batch. The evaluation runs rows in `data.evaluation.batch_size` batches in the data's row order, which may hold one
slice per batch (a file sorted by slice), while the variant serves at the recipe's batch sizes, one row alone or
batches of mixed rows: a slice with 100x larger activations then coarsens every other row's quantization.

Whether a variant's rows depend on their batch is measured, whatever built it (`batch_dependence`): the loudest
evaluation rows and rows drawn with a fixed seed from the rest (`detection_rows`) are run as one batch and each alone,
and must agree within the tolerance of the FP32 row-independence check (qbench.preflight.rows). Such a variant is run
again on every row at each batch size it serves (`served_arrangements`: `latency.batch_sizes`), its
rows in a seeded mix, and each scope (overall, each slice) is judged at its worst arrangement (`worst_scopes`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from qbench.preflight.rows import rows_moved
from qbench.recipe.spec import Recipe
from qbench.results.schema import AccuracyResult, SliceMetrics
from qbench.verdicts import Agreement

Feeds = dict[str, np.ndarray]
DETECT_ROWS = 16  # rows run together and alone to see whether outputs follow the batch
SEED = 0  # the draw of those rows and of each mixed arrangement's order


@dataclass(frozen=True)
class Arrangement:
    """How rows were batched: `batch_size` rows a batch, in the evaluation rows' order or a seeded mix."""

    batch_size: int
    mixed: bool

    def describe(self) -> str:
        if self.batch_size == 1:
            return "each row alone"
        order = f"rows in a seeded mix (seed {SEED})" if self.mixed else "in the evaluation rows' order"
        return f"batches of {self.batch_size}, {order}"

    def order(self, count: int) -> np.ndarray:
        """The order rows are fed in (row indices)."""
        return np.random.default_rng(SEED).permutation(count) if self.mixed else np.arange(count)


def served_arrangements(recipe: Recipe) -> list[Arrangement]:
    """The arrangements a batch-dependent variant is judged in beyond the evaluation's: a seeded mix at each batch
    size it is timed and served at (`latency.batch_sizes`; an SLO's batcher forms batches up to one of them),
    smallest first."""
    return [Arrangement(size, mixed=True) for size in sorted(set(recipe.latency.batch_sizes))]


def batch_dependence(run: Callable[[Feeds, int], Feeds], feeds: Mapping[str, np.ndarray], largest: int) -> str | None:
    """What shows that the rows' outputs of `run(feeds, batch_size)` depend on their batch, or None: up to
    DETECT_ROWS rows (and `largest`: a batch size the runner was prepared for) of `feeds` (detection_rows) run
    as one batch, then each alone; a float output must agree within the FP32 row-independence check's tolerance, taken
    of each row's own magnitude (a loud row's batch scale moves a quiet row by far more than the quiet row's share of
    the loud row's magnitude), any other exactly."""
    count = len(next(iter(feeds.values())))
    size = min(DETECT_ROWS, largest, count)
    if size < 2:
        return None
    picks = detection_rows(feeds, size)
    rows = {name: np.asarray(values)[picks] for name, values in feeds.items()}
    together, alone = run(rows, len(picks)), run(rows, 1)
    for name, values in together.items():
        seen = rows_moved(name, values, alone.get(name), np.arange(len(picks)), Agreement(), numbers=picks,
                          per_row=True)  # fmt: skip
        if seen is not None:
            return (f"evaluation {seen} when fed alone instead of in a batch of {len(picks)} rows: the loudest and "
                    "a seeded draw of the rest")
    return None


def detection_rows(feeds: Mapping[str, np.ndarray], size: int) -> np.ndarray:
    """`size` row indices, sorted: the rows whose float inputs reach the largest magnitudes (half of them) and a
    seeded draw from the rest. A per-batch statistic shows where a loud row shares a batch with quiet ones; a draw
    alone misses a rare loud slice (2 % of the rows: 16 random rows hold none in 7 draws of 10), the very rows that
    coarsen a served batch. Without float inputs (token ids), the draw alone."""
    count = len(next(iter(feeds.values())))
    loudness = np.zeros(count)
    for values in feeds.values():
        array = np.asarray(values)
        if array.dtype.kind == "f" and array.size:
            magnitudes = np.abs(array.reshape(count, -1).astype(np.float64))
            loudness = np.maximum(loudness, np.where(np.isfinite(magnitudes), magnitudes, 0.0).max(axis=1))
    loud = np.argsort(-loudness, kind="stable")[: size // 2] if loudness.any() else np.zeros(0, dtype=np.int64)
    rest = np.setdiff1d(np.arange(count), loud)
    drawn = np.random.default_rng(SEED).choice(rest, size - len(loud), replace=False)
    return np.sort(np.concatenate([loud, drawn]).astype(np.int64))


def run_arrangements(run: Callable[[Feeds, int], Feeds], feeds: Mapping[str, np.ndarray],
                     arrangements: list[Arrangement]) -> dict[Arrangement, Feeds]:  # fmt: skip
    """Each arrangement's outputs of `run(feeds, batch_size)`, fed in its order and given back in the rows' own."""
    count = len(next(iter(feeds.values())))
    ran = {}
    for arrangement in arrangements:
        order = arrangement.order(count)
        got = run({name: np.asarray(values)[order] for name, values in feeds.items()}, arrangement.batch_size)
        back = np.argsort(order)
        ran[arrangement] = {name: values[back] for name, values in got.items()}
    return ran


def worst_scopes(
    judged: Mapping[Arrangement, AccuracyResult], metrics: Sequence[str], reference: AccuracyResult | None = None
) -> tuple[AccuracyResult, dict[str, Arrangement]]:
    """One AccuracyResult holding, for each scope (overall, each slice), its figures from the arrangement where it is
    worst (`_severity`: NaN/inf outputs FP32 does not give first, a breach whatever the drop; then the drop of the
    gated `metrics`, NaN first: it cannot pass; ties keep the earlier arrangement), and the arrangement each scope's
    figures come from. Several gated metrics (gate.metrics) are weighed by their drops as shares of FP32's figure on
    that scope (`reference`), so an arrangement that breaks only the second metric is not passed over for one where
    the first drops a little more. Every arrangement's results hold the same scopes (the same rows); the result's
    NaN/inf row count is its overall's, as a result of one arrangement's."""
    arrangements = list(judged)
    first = judged[arrangements[0]]

    def pick(scope: Callable[[AccuracyResult], SliceMetrics | None]) -> tuple[SliceMetrics, Arrangement]:
        best, where = scope(first) or first.overall, arrangements[0]  # the first holds every scope
        fp32 = scope(reference) if reference is not None else None
        for arrangement in arrangements[1:]:
            figures = scope(judged[arrangement])
            if figures is not None and _severity(figures, metrics, fp32) > _severity(best, metrics, fp32):
                best, where = figures, arrangement
        return best, where

    overall, where = pick(lambda result: result.overall)
    chosen = {overall.name: where}
    slices = []
    for name in (s.name for s in first.slices):
        figures, where = pick(lambda result, name=name: result.slice(name))
        chosen[name] = where
        slices.append(figures)
    return replace(first, overall=overall, slices=tuple(slices), nonfinite_outputs=overall.nonfinite_outputs), chosen


def judged_note(why: str, judged: Mapping[Arrangement, AccuracyResult], chosen: Mapping[str, Arrangement],
                metric: str) -> str:  # fmt: skip
    """The result's note: why the rows depend on their batch, each arrangement's overall `metric`, and where each
    scope was judged."""
    figures = "; ".join(f"{a.describe()}: {metric} {_figure(r.overall, metric)} overall" for a, r in judged.items())
    worst = ", ".join(f"{scope} at {a.describe()}" for scope, a in chosen.items())
    return (f"rows depend on their batch ({why}): accuracy judged in {len(judged)} batch arrangements, each scope at "
            f"its worst ({figures}); judged: {worst}")


def _severity(scope: SliceMetrics, metrics: Sequence[str], fp32: SliceMetrics | None) -> tuple[int, float]:
    """How bad a scope's figures are, for ordering: its rows of NaN/inf outputs where FP32's are finite (the gate's
    breach whatever a metric says), then the largest drop of `metrics` (NaN: larger than any, it cannot pass; none:
    smaller than any), each a share of FP32's figure on the scope (`fp32`) where several are weighed together."""
    worst = -math.inf
    for metric in metrics:
        drop = scope.drops.get(metric, -math.inf)
        if math.isnan(drop):
            return scope.new_nonfinite_outputs, math.inf
        figure = abs(fp32.metrics.get(metric, math.nan)) if fp32 is not None and len(metrics) > 1 else math.nan
        worst = max(worst, drop / figure if math.isfinite(figure) and figure > 0 else drop)
    return scope.new_nonfinite_outputs, worst


def _figure(scope: SliceMetrics, metric: str) -> str:
    value = scope.metrics.get(metric, math.nan)
    drop = scope.drops.get(metric, math.nan)
    return f"{value:.4f} (drop {drop:+.4f})"
