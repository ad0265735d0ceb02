"""How `qbench explain` ranks groups of quantized nodes by what keeping them float recovers (or what quantizing them
alone costs), and by the noise they add: the scores, the groups and their order. `qbench.explain` measures the
candidates and writes the report; `qbench.fallback` ranks with the same functions to choose which nodes to keep in
FP32, on calibration rows.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from qbench.explain.graph import QdqBypass, QuantizedNode, Rebuild
from qbench.explain.output import OutputEffects, merged_order
from qbench.gate.tolerance import Tolerances
from qbench.progress import track
from qbench.recipe.spec import GateSpec
from qbench.report.grid import percent
from qbench.results.schema import AccuracyResult
from qbench.variants import BuiltVariant
from qbench.variants.onnx_utils import discard_built


@dataclass(frozen=True)
class Score:
    """How far a candidate is from FP32 (higher = worse): the gate metric's drop overall and per judged
    slice, and the output noise-to-signal ratio (continuous: breaks ties between equal drops)."""

    overall: float
    slices: dict[str, float]
    nsr: float

    def breach(self, tolerances: Tolerances | None) -> float:
        """How far past the gate's tolerances the drops are, summed over overall and the judged slices (0 within
        them all; NaN without a gate, or with a drop that is not a number)."""
        if tolerances is None:
            return math.nan
        checks = [(self.overall, tolerances.max_drop), *((d, tolerances.on_slice(n)) for n, d in self.slices.items())]
        return float(sum(max(drop - tolerance, 0.0) for drop, tolerance in checks))


@dataclass(frozen=True)
class NodeCost:
    group: str
    nodes: tuple[str, ...]
    op_types: tuple[str, ...]
    overall: float  # gate-metric drop attributed to the group, overall (NaN for sqnr)
    worst_slice: float  # the same on the variant's worst slice (NaN without slices)
    share: float  # of the variant's whole drop (sqnr: of all the noise the nodes add)
    nsr: float  # the candidate's output noise-to-signal ratio (sqnr: the noise the group adds)
    breach: float = math.nan  # the gate breach (Score.breach) recovered by the group (one_at_a_time: caused alone)


Scorer = Callable[[BuiltVariant], Score]


def group_key(node: QuantizedNode, group_by: str) -> str:
    """node: its name; op_type; layer: its path (`QuantizedNode.path`: the name, or the module the exporter recorded)
    up to its first number (`/encoder/layer.3`, `m.layers.3`), a path without one its scope (`attention/q` ->
    `attention`; an inlined local function's node is named after its call site, `qbench.onnx_read`); pattern: the
    path with every number as # (the same role in every layer)."""
    if group_by == "op_type":
        return node.op_type
    if group_by == "layer":
        match = re.match(r"^(.*?\d+)", node.path)
        return match.group(1) if match else node.path.rsplit("/", 1)[0] or node.path
    return re.sub(r"\d+", "#", node.path) if group_by == "pattern" else node.name


def group_nodes(nodes: Sequence[QuantizedNode], group_by: str) -> dict[str, list[QuantizedNode]]:
    groups: dict[str, list[QuantizedNode]] = {}
    for node in nodes:
        groups.setdefault(group_key(node, group_by), []).append(node)
    return groups


def rank_groups(
    keeper: QdqBypass | Rebuild, groups: Mapping[str, Sequence[QuantizedNode]], score: Scorer, baseline: Score,
    method: str, tolerances: Tolerances | None = None,
) -> list[NodeCost]:  # fmt: skip
    """The measured cost of each group (leave_one_out or one_at_a_time), costliest first: by the gate breach it
    recovers (or causes alone) when a gate is given, then by the overall drop."""
    everything = {n.name for members in groups.values() for n in members}
    worst = max(baseline.slices, key=lambda s: baseline.slices[s], default=None)
    costs = []
    for index, (group, members) in enumerate(track(list(groups.items()), f"explain ({method})", total=len(groups))):
        names = {n.name for n in members}
        candidate = keeper.keep_float(names if method == "leave_one_out" else everything - names, f"candidate-{index}")
        try:
            measured = score(candidate)
        finally:
            discard_built(candidate, keeper.workdir)  # never the user's model (a rebuild keeping every node float)
        if method == "leave_one_out":
            overall = baseline.overall - measured.overall
            on_worst = baseline.slices[worst] - measured.slices.get(worst, math.nan) if worst else math.nan
            breach = baseline.breach(tolerances) - measured.breach(tolerances)
        else:
            overall, on_worst = measured.overall, measured.slices.get(worst, math.nan) if worst else math.nan
            breach = measured.breach(tolerances)
        share = overall / baseline.overall if baseline.overall > 0 else math.nan
        op_types = tuple(sorted({n.op_type for n in members}))
        costs.append(NodeCost(group, tuple(sorted(names)), op_types, overall, on_worst, share, measured.nsr, breach))
    return sort_costs(costs, method)


def rank_by_sqnr(groups: Mapping[str, Sequence[QuantizedNode]], noise: Mapping[str, float]) -> list[NodeCost]:
    """Groups by the noise their nodes add (see `sqnr_costs`), noisiest first; a group none of whose nodes has a
    measurable noise (an ArgMax writes class ids) is NaN, ranked last, not a noiseless 0."""
    measured = {g: [noise[n.name] for n in members if math.isfinite(noise[n.name])] for g, members in groups.items()}
    added = {g: float(sum(values)) if values else math.nan for g, values in measured.items()}
    total = sum(v for v in added.values() if math.isfinite(v))
    costs = [
        NodeCost(g, tuple(sorted(n.name for n in members)), tuple(sorted({n.op_type for n in members})),
                 math.nan, math.nan, added[g] / total if total > 0 else math.nan, added[g])
        for g, members in groups.items()
    ]  # fmt: skip
    return sort_costs(costs, "sqnr")


def rank_by_output(by_noise: Sequence[NodeCost], effects: OutputEffects) -> list[NodeCost]:
    """`rank_by_sqnr`'s groups in `merged_order`: a group measured at the outputs with the output noise its quantization
    adds (nsr; share: of what the measured groups add), the others where and as per-layer SQNR ranked them."""
    measured = {g: v for g, v in effects.costs.items() if math.isfinite(v)}
    total = sum(v for v in measured.values() if v > 0)
    local = {c.group: c for c in by_noise}

    def cost(group: str) -> NodeCost:
        if group not in measured:
            return local[group]
        return dataclasses.replace(local[group], nsr=measured[group],
                                   share=measured[group] / total if total > 0 else math.nan)  # fmt: skip

    return [cost(g) for g in merged_order(list(local), measured)]


def sort_costs(costs: Sequence[NodeCost], method: str) -> list[NodeCost]:
    """Costliest first: by the gate breach (NaN: no gate, all alike), the overall drop, the worst slice's; ties broken
    by the candidate's distance from FP32 (nsr)."""

    def key(cost: NodeCost) -> tuple[float, ...]:
        tie = -cost.nsr if method == "leave_one_out" else cost.nsr  # leave-one-out: closest to FP32 first
        breach = cost.breach if math.isfinite(cost.breach) else 0.0  # no gate (sqnr, the fallback's noise) ranks alike
        return tuple(-v if math.isfinite(v) else math.inf for v in (breach, cost.overall, cost.worst_slice, tie))

    return sorted(costs, key=lambda c: (key(c), c.group))


def score_accuracy(accuracy: AccuracyResult, gate: GateSpec, nsr: float) -> Score:
    """The gate metric's drops; slices below the gate's min_slice_size are left out, as the gate does."""
    slices = {s.name: s.drops.get(gate.metric, math.nan) for s in accuracy.slices
              if s.judged_count(gate.metric) >= gate.min_slice_size}
    return Score(accuracy.overall.drops.get(gate.metric, math.nan), slices, nsr)


def explained_share(costs: Sequence[NodeCost], drop: float) -> float:
    """How much of the variant's `drop` the leave-one-out groups recover, summed (1: they add up to it); NaN
    without a drop to explain."""
    recovered = [c.overall for c in costs if math.isfinite(c.overall)]
    return sum(recovered) / drop if drop > 0 and math.isfinite(drop) and recovered else math.nan


def interaction_note(share: float, group_by: str) -> str:
    coarser = "|".join(g for g in ("layer", "pattern") if g != group_by)
    return (f"leave_one_out explains only {percent(share)} of the drop (the groups' recovered drops summed): groups "
            "that only matter together each recover little when kept float alone; try --method one_at_a_time"
            + (f" or --group {coarser}" if coarser else ""))  # fmt: skip
