"""The range analysis of a sweep (results.json `ranges`), and its JSON form: one FP32 pass over the evaluation rows
recording every float tensor's largest magnitude per scope, the tensors over each float format's limit, and the
activations each calibrated variant clips.

    RangeAnalysis: rows, seconds, nodes {tensor: node}, abs_max {scope: {tensor: value}},
      limits [LimitCheck], clipping [ClipRecord], warnings [CoverageWarning], unattributed [tensor],
      subgraph_nodes {control-flow node: nodes its subgraphs hold, not analysed}
    LimitCheck: format, limit, scaled_by, over {scope: [TensorPeak]}
    TensorPeak: tensor, node, abs_max, limit, handled
    ClipRecord: variant, scope, clipped, values, share, worst_tensor, worst_node, worst_share
    CoverageWarning: slice, variant, clipped_share, worst_node, worst_tensor, message
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from qbench.results.fields import known_fields


@dataclass(frozen=True)
class TensorPeak:
    """A tensor whose largest magnitude on a slice is over a format's limit."""

    tensor: str
    node: str  # the node producing it ("<graph input>" for a model input)
    abs_max: float
    limit: float
    # how every FP16 variant of the sweep avoids the overflow (kept in FP32, or its clamp or overflow changed no output
    # on its calibration sample: fp16_range in its params), or every BF16 variant (computed from a constant it
    # saturates: saturated_constants); None: the variants of the format overflow there, or there are none
    handled: str | None = None


@dataclass(frozen=True)
class LimitCheck:
    """Tensors over one format's largest finite value, per scope (overall and each slice), worst first.

    scaled_by: the FP8 variant whose per-tensor scales set each tensor's limit (448 x scale); None for a raw limit.
    """

    format: str
    limit: float
    scaled_by: str | None
    over: dict[str, tuple[TensorPeak, ...]]


@dataclass(frozen=True)
class ClipRecord:
    """Activations of one variant's quantized tensors outside their calibrated range, on one scope."""

    variant: str
    scope: str
    clipped: int
    values: int
    share: float
    worst_tensor: str | None = None
    worst_node: str | None = None
    worst_share: float = 0.0


@dataclass(frozen=True)
class CoverageWarning:
    """A slice with no calibration rows on which a calibrated variant clips activations."""

    slice: str
    variant: str
    clipped_share: float
    worst_node: str
    worst_tensor: str
    message: str


@dataclass(frozen=True)
class RangeAnalysis:
    """One FP32 pass over the evaluation rows recording every float tensor's abs max per scope.

    abs_max: scope ("overall", then each slice) -> tensor -> largest |value|.
    unattributed: tensors whose leading dimension is not the batch; they count in "overall" only.
    subgraph_nodes: main-graph control-flow node (If, Loop, Scan) -> how many nodes its subgraphs hold at any depth.
    Their tensors are not analysed (a body's tensors cannot be graph outputs): an overflow there is not seen.
    """

    rows: int
    seconds: float
    nodes: dict[str, str]
    abs_max: dict[str, dict[str, float]]
    limits: tuple[LimitCheck, ...] = ()
    clipping: tuple[ClipRecord, ...] = ()
    warnings: tuple[CoverageWarning, ...] = ()
    unattributed: tuple[str, ...] = ()
    subgraph_nodes: dict[str, int] = field(default_factory=dict)


# -- JSON --------------------------------------------------------------------------------------


def figures(raw: dict[str, Any] | None, what: str = "metric") -> dict[str, float]:
    """Metric values (or other `what` figures) as qbench writes them: numbers, or null for NaN (a string or a boolean
    is no figure)."""
    for name, value in (raw or {}).items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise TypeError(f"{what} {name!r}: got {value!r}, expected a number or null")
    return {k: (math.nan if v is None else float(v)) for k, v in (raw or {}).items()}


def bounds(raw: dict[str, Any] | None) -> dict[str, tuple[float, float]]:
    """Intervals as qbench writes them, name -> [low, high] (known_fields checked their shape and types), null as
    NaN."""
    return {name: (math.nan if low is None else low, math.nan if high is None else high)
            for name, (low, high) in (raw or {}).items()}


def counts(raw: dict[str, Any] | None) -> dict[str, int]:
    """Counts as qbench writes them: whole numbers (1.5 tokens, or a string, is no count)."""
    for name, value in (raw or {}).items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"count of {name!r}: got {value!r}, expected a whole number")
    return dict(raw or {})


def _peak(raw: dict[str, Any], where: str) -> TensorPeak:
    """A non-finite abs max (an infinite activation) was written as null: it is over every limit."""
    raw = known_fields(raw, TensorPeak, where)
    abs_max = math.inf if raw["abs_max"] is None else float(raw["abs_max"])
    return TensorPeak(tensor=raw["tensor"], node=raw["node"], abs_max=abs_max, limit=float(raw["limit"]),
                      handled=raw.get("handled"))  # fmt: skip


def ranges_from_dict(raw: dict[str, Any] | None, where: str = "ranges") -> RangeAnalysis | None:
    if raw is None:
        return None
    raw = known_fields(raw, RangeAnalysis, where)
    limits = [known_fields(c, LimitCheck, f"{where}.limits[{i}]") for i, c in enumerate(raw.get("limits", []))]
    return RangeAnalysis(
        rows=int(raw["rows"]),
        seconds=float(raw["seconds"]),
        nodes=raw["nodes"],
        abs_max={scope: figures(tensors) for scope, tensors in raw["abs_max"].items()},
        limits=tuple(
            LimitCheck(format=c["format"], limit=c["limit"], scaled_by=c.get("scaled_by"),
                       over={scope: tuple(_peak(p, f"{where}.limits[{i}].over.{scope}") for p in peaks)
                             for scope, peaks in c["over"].items()})
            for i, c in enumerate(limits)
        ),  # fmt: skip
        clipping=tuple(ClipRecord(**known_fields(c, ClipRecord, f"{where}.clipping[{i}]"))
                       for i, c in enumerate(raw.get("clipping", []))),
        warnings=tuple(CoverageWarning(**known_fields(w, CoverageWarning, f"{where}.warnings[{i}]"))
                       for i, w in enumerate(raw.get("warnings", []))),
        unattributed=tuple(raw.get("unattributed", [])),
        subgraph_nodes=dict(raw.get("subgraph_nodes", {})),
    )
