"""What a variant kept of one component of FP32's behaviour, as results.json records it (qbench.validate.kept computes
it, the gate's *_kept checks judge it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from qbench.results.fields import known_fields


@dataclass(frozen=True)
class Kept:
    """What a variant kept of one component of FP32's behaviour (qbench.validate.kept)."""

    rule: str  # a rule of qbench.validate.kept.KEPT_RULES: "decisions_kept", "tail_kept"...
    component: str  # "class 3", "label 2 on", "column 0 top", "dimension 7"
    reference: float  # FP32's figure: rows it decides the class on, its tail's reach, the dimension's spread
    own: float  # the variant's
    # decisions_kept, for a class kept under KEPT: how likely losing so many of its rows is by chance at the variant's
    # change rate on the classes it keeps (`elsewhere`), Bonferroni-corrected over the classes judged; None: judged on
    # the share alone (another rule, or results from before qbench recorded it)
    chance: float | None = None
    elsewhere: float | None = None

    @property
    def share(self) -> float:
        """own / reference; NaN where FP32's figure is none to share (0, NaN: results edited), which keeps nothing."""
        return self.own / self.reference if self.reference > 0 else math.nan


def kept_from_dict(raw: dict[str, Any], where: str) -> Kept:
    """A Kept record read from results.json (`where`: its path there, for the error naming a field)."""
    raw = known_fields(raw, Kept, where)
    optional = {name: None if raw.get(name) is None else float(raw[name]) for name in ("chance", "elsewhere")}
    return Kept(rule=raw["rule"], component=raw["component"], reference=_figure(raw["reference"]),
                own=_figure(raw["own"]), **optional)


def _figure(value: float | None) -> float:
    return math.nan if value is None else float(value)
