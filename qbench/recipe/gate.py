"""The recipe's `gate:` section: which metrics are gated, their tolerances, and which variants the gate judges.

`gate.metric` with `max_drop` / `max_slice_drop` / `tolerance` gates one metric. `gate.metrics` gates several (a
model with class logits and a regression head), each entry a metric with its own tolerances: every one is judged
overall and on every slice by the same rules, and a variant passes only when it passes on all of them. The first
entry is `gate.metric` (what the frontier, the report's figures and the search's logs show), so every reader of the
one metric keeps working; `per_metric` gives one single-metric spec per gated metric.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Literal

from pydantic import Field, model_validator

from qbench.techniques.options import StrictConfig as _Strict

TOLERANCE_FIELDS = ("max_drop", "max_slice_drop", "tolerance")
_DEFAULTS: dict[str, Any] = {"max_drop": None, "max_slice_drop": None, "tolerance": "auto"}


def first_gated_metric(data: Any) -> Any:
    """The raw gate mapping with gate.metric and its tolerances taken from the first entry of `metrics` (an entry
    may be a metric's name alone: its tolerances the defaults). Stated beside `metrics` they must say the same (a
    recipe's resolved form carries both): otherwise one line says to state them in each entry."""
    if not isinstance(data, dict) or data.get("metrics") is None:
        return data
    entries = data["metrics"]
    if not isinstance(entries, list) or not entries:
        raise ValueError("metrics: expected a non-empty list of gated metrics, each a name or "
                         "{metric, max_drop, max_slice_drop, tolerance}")  # fmt: skip
    entries = [{"metric": e} if isinstance(e, str) else e for e in entries]
    first = entries[0]
    if not isinstance(first, dict):
        return {**data, "metrics": entries}  # the field's own validation names what is wrong
    for key in ("metric", *TOLERANCE_FIELDS):
        if key in data and data[key] != first.get(key, _DEFAULTS.get(key)):
            raise ValueError(f"{key}: stated beside gate.metrics, and not as its first entry states it; expected "
                             f"each gated metric's {key} in its entry of gate.metrics")  # fmt: skip
    own = {key: first[key] for key in ("metric", *TOLERANCE_FIELDS) if key in first}
    return {**data, **own, "metrics": entries}


class GatedMetric(_Strict):
    """One gated metric and its tolerances (None: the default, as for gate.metric: qbench.gate.tolerance)."""

    metric: str = Field(description="a metric the results carry, whose drop vs FP32 is gated")
    max_drop: float | None = Field(None, ge=0, allow_inf_nan=False, description="largest allowed drop vs FP32, overall")
    max_slice_drop: float | None = Field(None, ge=0, allow_inf_nan=False,
                                         description="largest allowed drop vs FP32, on every slice")
    tolerance: Literal["auto", "absolute", "relative"] = Field(
        "auto", description="absolute: drops in the metric's units; relative: shares of FP32's overall figure; "
                            "auto: stated drops absolute, defaults relative for a metric in the data's units")


class GateSpec(GatedMetric):
    """gate.metric and its tolerances (GatedMetric's fields; None: the default, 0.01 overall and 0.02 per slice,
    absolute for a rate, a share of FP32's figure for a metric in the data's units: qbench.gate.tolerance, which every
    reader of these goes through), or several gated metrics, and which variants the gate judges."""

    metric: str = Field("accuracy", description="metric whose drop vs FP32 is gated (the first of gate.metrics)")
    metrics: list[GatedMetric] | None = Field(
        None, description="several gated metrics, each with its own tolerances (instead of gate.metric and its "
                          "tolerances): a variant passes only when it passes on every one")
    applies_to: list[str] = Field(["*"], description="globs over variant names")
    min_slice_size: int = Field(1, ge=1, description="slices with fewer rows are reported but not judged")
    unresolved: Literal["fail", "note"] = Field(
        "fail", description="a pass on too few rows to resolve the tolerance, or beside a slice no gated metric can "
                            "judge (qbench.gate.resolution): fail: cannot be judged (exit 2); note: a pass with "
                            "a note")

    _first = model_validator(mode="before")(first_gated_metric)

    @model_validator(mode="after")
    def _distinct(self) -> GateSpec:
        names = self.gated_metrics
        twice = next((name for name in names if names.count(name) > 1), None)
        if twice is not None:
            raise ValueError(f"metrics: {twice!r} is gated twice; expected each metric once, with its tolerances")
        return self

    def applies(self, variant_name: str) -> bool:
        return any(fnmatch.fnmatchcase(variant_name, pattern) for pattern in self.applies_to)

    @property
    def gated_metrics(self) -> tuple[str, ...]:
        """Every metric the gate judges, gate.metric first."""
        return tuple(m.metric for m in self.metrics) if self.metrics else (self.metric,)

    def per_metric(self) -> list[GateSpec]:
        """One single-metric spec per gated metric (gate.metric's first), each with that metric's tolerances and the
        gate's other settings: what judging, tolerances and notes are done with."""
        if not self.metrics:
            return [self]
        return [self.model_copy(update={**entry.model_dump(), "metrics": None}) for entry in self.metrics]
