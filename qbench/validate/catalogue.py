"""The metric catalogue: every metric's name, direction and range, the custom metrics in force, and drops.

Tasks register their metrics here when `qbench.tasks` is imported; a recipe's own metrics are added when it is
loaded, and scoped to the sweep or results that use them (`custom_metrics`).
"""

from __future__ import annotations

import contextlib
import importlib
import math
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from qbench.errors import QbenchError


@dataclass(frozen=True)
class MetricInfo:
    """A metric's name and direction, and what any value of it must satisfy (the gate refuses results that do not:
    a share of rows of 1.5, or 0.987654321 of a 37-row slice, was not computed by qbench)."""

    name: str
    higher_is_better: bool
    description: str
    custom: bool = False  # a recipe's own metric (its description is the function it calls)
    low: float = -math.inf
    high: float = math.inf
    share_of_rows: bool = False  # k / rows of its scope for a whole number k
    # a row FP32 gives NaN/inf on counts in it (a miss), so it stays defined on a scope holding such rows, where
    # cosine, kl_mean or an error is NaN: what the gate suggests gating on there
    counts_nonfinite_rows: bool = False
    # in the label's or output's units (an MAE, an output's largest error): an absolute default tolerance means
    # nothing there, so the gate's defaults are shares of FP32's figure (qbench.gate.tolerance)
    data_units: bool = False
    # a share of rows scored against labels: the metric of the same output and units that counts the units whose
    # decision is FP32's. A change right -> wrong can offset one wrong -> right, so a drop of 0 may hide many
    # changes; the gate bounds the drop's noise by how many units changed (qbench.gate.resolution)
    decisions: str = ""
    # the mean over its scope's rows (or its `denominators` units) of a figure each has within [low, high] whatever
    # the other rows hold (rows FP32 gives NaN/inf left out, unless `counts_nonfinite_rows`): some of a scope's rows
    # then bound its figure on all of them (qbench.search.certain). Not a share judged against the rows' own spread
    # (regression's agreement) or their neighbours (nn_agreement): a row's figure there moves with the others
    row_mean: bool = False


def share_of_rows(name: str, higher_is_better: bool, description: str, decisions: str = "", *,
                  row_mean: bool = False) -> MetricInfo:  # fmt: skip
    """A metric that counts rows of its scope: in [0, 1], a whole number of rows (FP32's NaN/inf ones among them);
    `decisions` names its companion counting agreement with FP32 where it is scored against labels; `row_mean`: each
    row's count depends on that row alone (MetricInfo.row_mean)."""
    return MetricInfo(name, higher_is_better, description, low=0.0, high=1.0, share_of_rows=True,
                      counts_nonfinite_rows=True, decisions=decisions, row_mean=row_mean)


MAX_ABS_ERROR = MetricInfo("max_abs_error", False, "largest absolute difference from the FP32 output", low=0.0,
                           data_units=True)  # fmt: skip
"""Every built-in task's figure of how far a variant's outputs move from FP32's at most, in the data's units."""


def impossible_value(info: MetricInfo, value: float, count: int, unit: str = "rows") -> str | None:
    """Why `value` cannot be `info`'s on a scope of `count` rows (or of `count` other units its rate is a share of,
    such as scored tokens), or None (NaN/inf are judged elsewhere)."""
    if not math.isfinite(value):
        return None
    if not info.low - 1e-9 <= value <= info.high + 1e-9:
        return f"outside its range {info.low:g}..{info.high:g}"
    if info.share_of_rows and count > 0 and abs(value * count - round(value * count)) > 1e-6:
        return f"not a whole number of the scope's {count} {unit} ({value * count:.4f})"
    return None


OUTPUT_SEPARATOR = "/"
"""Metric names are prefixed with their output ('probabilities/accuracy') when several outputs are evaluated."""
# FP32's param: outputs it puts in one class on every row (accuracy.one_class_readings)
ONE_CLASS_OUTPUTS = "one_class_outputs"
UNCOMPARED_OUTPUTS = "outputs_not_compared"  # FP32's param: model outputs no figure reads (selection.outputs_left_out)
# FP32's param: output -> the cosine its vectors share across the evaluation rows (kept.shared_cosine), for a task
# scoring cosines (accuracy.shared_cosines)
SHARED_COSINES = "shared_cosines"
DECISION_METRICS = ("accuracy", "agreement", "flip_rate")  # the classification figures such a reading leaves blind


class MetricCatalogue(Mapping[str, MetricInfo]):
    """Every metric qbench can report, by name, with its direction.

    The tasks' own metrics are loaded from the task registry on first use (`loader`, a module
    that registers them when imported, so this low-level module imports no task); a recipe's
    custom metrics are added when the recipe is loaded. A name 'output/metric' resolves to
    `metric`'s entry.
    """

    def __init__(self, loader: str) -> None:
        self._loader = loader
        self._loaded = False
        self._entries: dict[str, MetricInfo] = {}

    def add(self, info: MetricInfo, *, replace: bool = False) -> None:
        """Register `info`; the same name with another direction or range is an error unless `replace`."""
        existing = self._entries.get(info.name)
        if existing is not None and not replace and _definition(existing) != _definition(info):
            raise QbenchError(f"metric {info.name!r} is already registered with another direction or range")
        if existing is None or replace:
            self._entries[info.name] = info

    def _load(self) -> dict[str, MetricInfo]:
        if not self._loaded:
            self._loaded = True
            importlib.import_module(self._loader)
        return self._entries

    def __getitem__(self, name: str) -> MetricInfo:
        base = name.rpartition(OUTPUT_SEPARATOR)[2]
        for entries in (_SCOPED_CUSTOM.get(), self._load()):
            if name in entries:
                return entries[name]
            if base in entries:
                return entries[base]
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self[name]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._load()))

    def __len__(self) -> int:
        return len(self._load())


def _definition(info: MetricInfo) -> tuple[bool, float, float, bool, bool, bool]:
    return info.higher_is_better, info.low, info.high, info.share_of_rows, info.data_units, info.row_mean


METRICS = MetricCatalogue("qbench.tasks")

# The custom metrics of the recipe being swept or the results being judged. Loading a recipe also registers its
# custom metrics in METRICS (last loaded wins), so two recipes with a metric of one name and opposite directions
# in one process (a notebook) would judge each other's drops backwards: what runs a recipe or judges results
# puts their own directions in front for that while (`custom_metrics`).
_SCOPED_CUSTOM: ContextVar[Mapping[str, MetricInfo]] = ContextVar("qbench_custom_metrics", default={})


@contextlib.contextmanager
def custom_metrics(infos: Iterable[MetricInfo]) -> Iterator[None]:
    """Within the block, these metrics' directions are the ones drops, the gate and the frontier use."""
    token = _SCOPED_CUSTOM.set({**_SCOPED_CUSTOM.get(), **{info.name: info for info in infos}})
    try:
        yield
    finally:
        _SCOPED_CUSTOM.reset(token)


def recorded_custom_metrics(resolved_recipe: Mapping[str, Any]) -> list[MetricInfo]:
    """The custom metrics a recipe (as results record it: `recipe.resolved`) declares; malformed entries are
    skipped (the gate's checks of the recorded recipe say what is wrong with them)."""
    entries = resolved_recipe.get("metrics") if isinstance(resolved_recipe, Mapping) else None
    return [
        MetricInfo(entry["name"], entry["higher_is_better"], str(entry.get("function", "")), custom=True,
                   data_units=entry.get("data_units") is True)
        for entry in (entries if isinstance(entries, list) else [])
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str)
        and isinstance(entry.get("higher_is_better"), bool)
    ]  # fmt: skip


def drop(metric: str, reference: float, value: float) -> float:
    """How much worse `value` is than `reference` (positive = worse), whatever the metric's direction."""
    if metric not in METRICS:
        raise QbenchError(f"unknown metric {metric!r}: its direction (higher or lower is better) is not known")
    if METRICS[metric].higher_is_better:
        return reference - value
    return value - reference


ROUNDING = 1e-12
"""Relative slack of `within`: far below any difference a metric can mean, far above float64's rounding (2.2e-16)."""


def within(excess_over: float, limit: float, *figures: float) -> bool:
    """Whether `excess_over` (a drop, a latency) is at most `limit`, a figure equal to its limit up to float rounding
    included: the tolerance is the largest allowed drop. The slack scales with the figures the value was computed
    from (its limit included): a drop of 0.1 between MAEs of 100000.0 and 100000.1 is 0.10000000000582077 in
    float64, 5.8e-12 over, which an absolute slack of 1e-12 would call a breach. It has no floor: rounding is relative
    at every scale, so figures of 1e-13 (an MAE on targets in farads) get a slack of 1e-25, where a floor of 1.0 let
    a variant whose MAE doubled from 1e-13 pass a tolerance of 1e-15."""
    scale = max([abs(limit), *(abs(f) for f in figures if math.isfinite(f))])
    return excess_over <= limit + ROUNDING * scale

