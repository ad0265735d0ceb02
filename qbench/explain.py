"""Which quantized nodes cost the accuracy? Per-node (or per-group) sensitivity of an INT8 variant, measured.

    outcome = run_explain(recipe, "int8-minmax", method="leave_one_out")   # `qbench explain`

The variant is built once; each candidate keeps some nodes in float and runs on the
recipe's evaluation rows against FP32, scored with the gate metric overall and per slice:

- leave_one_out: all quantized but one group; cost = the drop recovered when that group stays float.
- one_at_a_time: only that group quantized; cost = the drop it causes alone.
- sqnr: one pass, no candidates; cost = the noise a node adds (noise-to-signal ratio of its
  output vs FP32 minus that of its inputs), from intermediate tensors of both models.

A candidate of a static (QDQ) variant is the built graph with the Q/DQ on the group's inputs
bypassed: the same calibration ranges, no rebuild (ORT's quantizer folds a Relu/Clip into the
preceding Q; a bypass restores it). A dynamic variant is rebuilt with `exclude_nodes`.
`qbench.fallback` reuses the ranking to choose which nodes to keep in FP32.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import tempfile
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper
from rich.console import Console
from rich.table import Table

from qbench.backends import Backend, get_backend
from qbench.backends.base import RunOptions
from qbench.console import print_wide
from qbench.data import iter_batches
from qbench.errors import QbenchError, expected_one_of
from qbench.preflight import Prepared, prepare
from qbench.progress import track
from qbench.recipe import GateSpec, Recipe, VariantSpec
from qbench.results import AccuracyResult
from qbench.validate.measure import measure
from qbench.variants import BuildContext, BuiltVariant, build_variant
from qbench.variants.onnx_utils import load_model, save_model

logger = logging.getLogger(__name__)

METHODS = ("leave_one_out", "one_at_a_time", "sqnr")
GROUPINGS = ("node", "op_type", "layer", "pattern")
SQNR_BATCH_ROWS = 4  # the intermediate tensors of every quantized node are held for this many rows at a time
Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class Score:
    """How far a candidate is from FP32 (higher = worse): the gate metric's drop overall and per judged
    slice, and the output noise-to-signal ratio (continuous: breaks ties between equal drops)."""

    overall: float
    slices: dict[str, float]
    nsr: float


@dataclass(frozen=True)
class NodeCost:
    group: str
    nodes: tuple[str, ...]
    op_types: tuple[str, ...]
    overall: float  # gate-metric drop attributed to the group, overall (NaN for sqnr)
    worst_slice: float  # the same on the variant's worst slice (NaN without slices)
    share: float  # of the variant's whole drop (sqnr: of all the noise the nodes add)
    nsr: float  # the candidate's output noise-to-signal ratio (sqnr: the noise the group adds)


@dataclass(frozen=True)
class ExplainResult:
    recipe: str
    variant: str
    calibrator: str
    method: str
    group_by: str
    metric: str
    backend: str
    rows: int
    drop: float  # the whole variant's gate-metric drop, overall
    worst_slice: str | None
    worst_slice_drop: float
    quantized_nodes: int
    costs: tuple[NodeCost, ...]  # costliest first
    notes: tuple[str, ...] = ()
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return _json_ready(dataclasses.asdict(self))


@dataclass(frozen=True)
class ExplainOutcome:
    result: ExplainResult
    directory: Path
    mlflow_run_id: str | None


@dataclass(frozen=True)
class QuantizedNode:
    name: str
    op_type: str


Scorer = Callable[[BuiltVariant], Score]


# -- quantized nodes, and candidates that keep some of them float -----------------------------------------


def quantized_nodes(reference: onnx.ModelProto, built: BuiltVariant) -> list[QuantizedNode]:
    """Nodes of the variant's op types computing on quantized data: fed by a DequantizeLinear (static QDQ),
    or replaced by integer kernels (dynamic: their name is gone from the quantized graph)."""
    quantized = load_model(built.onnx_path)
    dynamic = built.params.get("calibrator") == "dynamic"
    dequantized = {o for n in quantized.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    present = {n.name: n for n in quantized.graph.node}

    def quantized_here(name: str) -> bool:
        own = present.get(name)
        return dynamic if own is None else any(i in dequantized for i in own.input)

    op_types = set(built.params.get("op_types", ()))
    if built.params.get("gemms_as_matmul"):
        op_types.add("Gemm")  # dynamic INT8 quantized them as MatMul, under their own names
    return [QuantizedNode(n.name, n.op_type) for n in reference.graph.node
            if n.op_type in op_types and n.name and quantized_here(n.name)]  # fmt: skip


class QdqBypass:
    """Candidates of a static QDQ variant: the built graph with the named nodes' input Q/DQ bypassed."""

    def __init__(self, built: BuiltVariant, reference: onnx.ModelProto, workdir: Path) -> None:
        self._built, self._reference, self._workdir = built, reference, workdir
        self._quantized = load_model(built.onnx_path)

    def keep_float(self, names: Collection[str], label: str) -> BuiltVariant:
        path = save_model(bypass_qdq(self._quantized, self._reference, names), self._workdir / f"{label}.onnx")
        return dataclasses.replace(self._built, name=label, onnx_path=path)


class Rebuild:
    """Candidates of a variant with no Q/DQ to bypass (dynamic INT8): rebuilt with `exclude_nodes`."""

    def __init__(self, spec: VariantSpec, ctx: BuildContext) -> None:
        self._spec, self._ctx = spec, ctx

    def keep_float(self, names: Collection[str], label: str) -> BuiltVariant:
        excluded = list(dict.fromkeys([*self._spec.exclude_nodes, *sorted(names)]))
        return build_variant(self._spec.model_copy(update={"name": label, "exclude_nodes": excluded}), self._ctx)


def float_keeper(spec: VariantSpec, ctx: BuildContext, built: BuiltVariant) -> QdqBypass | Rebuild:
    """How candidates of `built` are made (into ctx.workdir): Q/DQ bypass if static, rebuild if dynamic."""
    if built.params.get("calibrator") == "dynamic":
        return Rebuild(spec, ctx)
    return QdqBypass(built, load_model(ctx.reference_path), ctx.workdir)


def bypass_qdq(quantized: onnx.ModelProto, reference: onnx.ModelProto, names: Collection[str]) -> onnx.ModelProto:
    """A copy of `quantized` whose nodes in `names` read float inputs: activations from before their
    QuantizeLinear (re-applying a Relu/Clip the quantizer folded into it), weights from `reference`."""
    model = onnx.ModelProto()
    model.CopyFrom(quantized)
    producers = {o: n for n in model.graph.node for o in n.output}
    originals = {n.name: n for n in reference.graph.node}
    reference_producers = {o: n for n in reference.graph.node for o in n.output}
    weights = {t.name: t for t in reference.graph.initializer}
    nodes: list[onnx.NodeProto] = []
    restored: dict[str, str] = {}
    for node in model.graph.node:
        for index, name in enumerate(node.input if node.name in names else ()):
            dequantized, source = _dequantized_from(name, producers)
            if source is not None:  # an activation: read it before its QuantizeLinear
                folded, here = reference_producers.get(source), producers.get(source)
                if folded is not None and here is not None and folded.name != here.name and folded.op_type in ("Relu", "Clip"):
                    if source not in restored:
                        restored[source] = _restore_activation(model, folded, source, weights, nodes)
                    source = restored[source]
                node.input[index] = source
            elif dequantized and node.name in originals:  # a weight: the reference's float initializer
                weight = originals[node.name].input[index] if index < len(originals[node.name].input) else ""
                if weight in weights:
                    node.input[index] = _add_initializer(model, weights[weight])
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    _prune(model.graph)
    return model


def _dequantized_from(tensor: str, producers: Mapping[str, onnx.NodeProto]) -> tuple[bool, str | None]:
    """Whether `tensor` comes out of a DequantizeLinear, and the float tensor its QuantizeLinear
    quantized (None for a quantized initializer, i.e. a weight or bias)."""
    dq = producers.get(tensor)
    if dq is None or dq.op_type != "DequantizeLinear":
        return False, None
    q = producers.get(dq.input[0])
    return True, q.input[0] if q is not None and q.op_type == "QuantizeLinear" else None


def _restore_activation(
    model: onnx.ModelProto, original: onnx.NodeProto, tensor: str, weights: Mapping[str, onnx.TensorProto],
    nodes: list[onnx.NodeProto],
) -> str:  # fmt: skip
    """Append (after `tensor`'s producer, already in `nodes`) a copy of `original` reading `tensor`."""
    extra = [_add_initializer(model, weights[i]) if i in weights else i for i in original.input[1:]]
    node = helper.make_node(original.op_type, [tensor, *extra], [f"{tensor}/float"], name=f"{original.name}/float")
    node.attribute.extend(original.attribute)
    nodes.append(node)
    return node.output[0]


def _add_initializer(model: onnx.ModelProto, tensor: onnx.TensorProto) -> str:
    """A copy of a reference weight under a name of its own ("<name>/float"); returns that name."""
    name = f"{tensor.name}/float"
    if not any(t.name == name for t in model.graph.initializer):
        copy = model.graph.initializer.add()
        copy.CopyFrom(tensor)
        copy.name = name
    return name


def _prune(graph: onnx.GraphProto) -> None:
    """Drop nodes whose outputs nobody reads (the bypassed Q/DQ), then initializers nobody reads."""
    outputs = {o.name for o in graph.output}
    while dead := [n for n in graph.node if not set(n.output) & ({i for m in graph.node for i in m.input} | outputs)]:
        for node in dead:
            graph.node.remove(node)
    read = {i for n in graph.node for i in n.input} | outputs
    for tensor in [t for t in graph.initializer if t.name not in read]:
        graph.initializer.remove(tensor)


# -- SQNR: the noise each node adds ------------------------------------------------------------------------


def _tensor_pairs(name: str, reference: onnx.ModelProto, quantized: onnx.ModelProto) -> list[tuple[str, str]]:
    """(quantized-graph tensor, reference tensor) for a node's activation inputs, its output last.

    A static node's tensors are read where its consumers read them (after the Q/DQ); a dynamic
    node's integer kernels read and write the original tensor names."""
    own = next((n for n in quantized.graph.node if n.name == name), None)
    if own is None:
        original = next(n for n in reference.graph.node if n.name == name)
        weights = {t.name for t in reference.graph.initializer}
        return [(i, i) for i in original.input if i and i not in weights] + [(original.output[0],) * 2]
    producers = {o: n for n in quantized.graph.node for o in n.output}
    readers = {i: n for n in quantized.graph.node for i in n.input if n.op_type in ("QuantizeLinear", "DequantizeLinear")}
    sources = {tensor: _dequantized_from(tensor, producers)[1] for tensor in own.input}
    pairs = [(tensor, source) for tensor, source in sources.items() if source is not None]
    out = own.output[0]
    q = readers.get(out)
    dq = readers.get(q.output[0]) if q is not None else None
    if dq is None:
        return pairs + [(out, out)]
    known = {o for n in reference.graph.node for o in n.output}
    return pairs + [(dq.output[0], out if out in known else dq.output[0])]


def sqnr_costs(
    reference_path: Path, built: BuiltVariant, nodes: Sequence[QuantizedNode], batches: Iterable[Feeds],
    backend: Backend, options: RunOptions, workdir: Path,
) -> dict[str, float]:  # fmt: skip
    """Node name -> the noise it adds: the noise-to-signal ratio (vs FP32) of its output, as its consumers
    read it, minus the largest of its activation inputs', over `batches` (NaN when not measurable).

    Both models run side by side a few rows at a time; only running sums are kept."""
    reference, quantized = load_model(reference_path), load_model(built.onnx_path)
    pairs = {n.name: _tensor_pairs(n.name, reference, quantized) for n in nodes}
    q_known, r_known = _tensor_names(quantized), _tensor_names(reference)
    wanted = sorted({p for tensors in pairs.values() for p in tensors if p[0] in q_known and p[1] in r_known})
    signal, noise = dict.fromkeys(wanted, 0.0), dict.fromkeys(wanted, 0.0)
    run_reference = _Exposed(backend, options, built, reference, [r for _, r in wanted], workdir / "sqnr-fp32.onnx")
    try:
        run_quantized = _Exposed(backend, options, built, quantized, [q for q, _ in wanted], workdir / "sqnr-int8.onnx")
        try:
            for batch in (rows for b in batches for rows in iter_batches(b, SQNR_BATCH_ROWS)):
                r_values, q_values = run_reference(batch), run_quantized(batch)
                for q, r in wanted:
                    values = r_values[r].astype(np.float64)
                    signal[(q, r)] += float(np.sum(values * values))
                    noise[(q, r)] += float(np.sum((q_values[q] - values) ** 2))
        finally:
            run_quantized.close()
    finally:
        run_reference.close()
    nsr = {p: noise[p] / signal[p] if signal[p] > 0 else math.nan for p in wanted}
    costs = {}
    for name, tensors in pairs.items():
        out = nsr.get(tensors[-1], math.nan)
        before = max((nsr[p] for p in tensors[:-1] if math.isfinite(nsr.get(p, math.nan))), default=0.0)
        costs[name] = max(out - before, 0.0) if math.isfinite(out) else math.nan
    return costs


def _tensor_names(model: onnx.ModelProto) -> set[str]:
    return {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}


class _Exposed:
    """A runner of `model` with `names` added as outputs; calling it returns those tensors (and the feeds)."""

    def __init__(self, backend: Backend, options: RunOptions, built: BuiltVariant, model: onnx.ModelProto,
                 names: Sequence[str], path: Path) -> None:  # fmt: skip
        exposed = onnx.ModelProto()
        exposed.CopyFrom(model)
        have = {o.name for o in exposed.graph.output} | {i.name for i in exposed.graph.input}
        added = [n for n in dict.fromkeys(names) if n not in have]
        exposed.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in added)
        self._order = [o.name for o in exposed.graph.output]
        self._path = save_model(exposed, path)
        self._runner = backend.load(dataclasses.replace(built, onnx_path=path), options)

    def __call__(self, feeds: Feeds) -> dict[str, np.ndarray]:
        return dict(feeds) | dict(zip(self._order, self._runner.run(feeds)))

    def close(self) -> None:
        self._runner.close()
        self._path.unlink(missing_ok=True)


# -- ranking -----------------------------------------------------------------------------------------------


def group_key(node: QuantizedNode, group_by: str) -> str:
    """node: its name; op_type; layer: the name up to its first number (`/encoder/layer.3`);
    pattern: the name with every number as # (the same role in every layer)."""
    if group_by == "op_type":
        return node.op_type
    if group_by == "layer":
        match = re.match(r"^(.*?\d+)", node.name)
        return match.group(1) if match else node.name
    return re.sub(r"\d+", "#", node.name) if group_by == "pattern" else node.name


def group_nodes(nodes: Sequence[QuantizedNode], group_by: str) -> dict[str, list[QuantizedNode]]:
    groups: dict[str, list[QuantizedNode]] = {}
    for node in nodes:
        groups.setdefault(group_key(node, group_by), []).append(node)
    return groups


def rank_groups(
    keeper: QdqBypass | Rebuild, groups: Mapping[str, Sequence[QuantizedNode]], score: Scorer, baseline: Score,
    method: str,
) -> list[NodeCost]:  # fmt: skip
    """The measured cost of each group (leave_one_out or one_at_a_time), costliest first."""
    everything = {n.name for members in groups.values() for n in members}
    worst = max(baseline.slices, key=lambda s: baseline.slices[s], default=None)
    costs = []
    for index, (group, members) in enumerate(track(list(groups.items()), f"explain ({method})", total=len(groups))):
        names = {n.name for n in members}
        candidate = keeper.keep_float(names if method == "leave_one_out" else everything - names, f"candidate-{index}")
        try:
            measured = score(candidate)
        finally:
            candidate.onnx_path.unlink(missing_ok=True)
        if method == "leave_one_out":
            overall = baseline.overall - measured.overall
            on_worst = baseline.slices[worst] - measured.slices.get(worst, math.nan) if worst else math.nan
        else:
            overall, on_worst = measured.overall, measured.slices.get(worst, math.nan) if worst else math.nan
        share = overall / baseline.overall if baseline.overall > 0 else math.nan
        op_types = tuple(sorted({n.op_type for n in members}))
        costs.append(NodeCost(group, tuple(sorted(names)), op_types, overall, on_worst, share, measured.nsr))
    return sort_costs(costs, method)


def rank_by_sqnr(groups: Mapping[str, Sequence[QuantizedNode]], noise: Mapping[str, float]) -> list[NodeCost]:
    """Groups by the noise their nodes add (see `sqnr_costs`), noisiest first."""
    added = {g: float(np.nansum([noise[n.name] for n in members])) for g, members in groups.items()}
    total = sum(added.values())
    costs = [
        NodeCost(g, tuple(sorted(n.name for n in members)), tuple(sorted({n.op_type for n in members})),
                 math.nan, math.nan, added[g] / total if total > 0 else math.nan, added[g])
        for g, members in groups.items()
    ]  # fmt: skip
    return sort_costs(costs, "sqnr")


def sort_costs(costs: Sequence[NodeCost], method: str) -> list[NodeCost]:
    """Costliest first; ties broken by the candidate's distance from FP32 (nsr)."""

    def key(cost: NodeCost) -> tuple[float, ...]:
        tie = -cost.nsr if method == "leave_one_out" else cost.nsr  # leave-one-out: closest to FP32 first
        return tuple(-v if math.isfinite(v) else math.inf for v in (cost.overall, cost.worst_slice, tie))

    return sorted(costs, key=lambda c: (key(c), c.group))


def score_accuracy(accuracy: AccuracyResult, gate: GateSpec, nsr: float) -> Score:
    """The gate metric's drops; slices below the gate's min_slice_size are left out, as the gate does."""
    slices = {s.name: s.drops.get(gate.metric, math.nan) for s in accuracy.slices if s.size >= gate.min_slice_size}
    return Score(accuracy.overall.drops.get(gate.metric, math.nan), slices, nsr)


def _json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


# -- the explain run ---------------------------------------------------------------------------------------


class _Evaluator:
    """Runs variants on the recipe's evaluation rows and scores them against FP32 with the gate metric."""

    def __init__(self, prepared: Prepared, backend: Backend) -> None:
        self.prepared, self.backend = prepared, backend
        self.reference = measure(backend, BuiltVariant("fp32", "fp32", prepared.source.onnx_path), prepared).reference
        if self.reference is None:
            raise QbenchError("explain: the FP32 model could not be run on the evaluation rows")

    def score(self, built: BuiltVariant) -> Score:
        measured = measure(self.backend, built, self.prepared, reference=self.reference, quiet=True)
        if measured.result.accuracy is None:
            raise QbenchError(f"explain: {built.name} could not be measured: {measured.result.error}")
        return score_accuracy(measured.result.accuracy, self.prepared.recipe.gate, measured.nsr)


def explain_variant(
    recipe: Recipe, variant_name: str, *, method: str = "leave_one_out", group_by: str = "node",
    max_nodes: int | None = None, workdir: Path | None = None,
) -> ExplainResult:  # fmt: skip
    """Rank the quantized nodes (or groups) of an ONNX Runtime INT8 variant by what they cost the gate metric.

    Evaluates on the recipe's evaluation rows (data.evaluation.limit applies) on its first ONNX Runtime
    backend. max_nodes: measure only this many groups, the noisiest by SQNR. The built variant is kept
    under `workdir` (a temporary folder when None).
    """
    started = time.perf_counter()
    for value, allowed, what in ((method, METHODS, "method"), (group_by, GROUPINGS, "group")):
        if value not in allowed:
            raise QbenchError(f"explain: {what} {expected_one_of(value, allowed)}")
    if max_nodes is not None and max_nodes <= 0:
        raise QbenchError(f"explain: max_nodes must be positive, got {max_nodes}")
    spec, notes = _explained_spec(recipe, variant_name)
    prepared = prepare(recipe)
    backend_name = next((b for b in recipe.backends if b.startswith("onnxruntime-")), "onnxruntime-cpu")
    backend, options = get_backend(backend_name), RunOptions(threads=recipe.latency.threads)
    with tempfile.TemporaryDirectory(prefix="qbench-explain-") as tmp:
        ctx = BuildContext(prepared.source.onnx_path, (workdir or Path(tmp)) / "models", prepared.calibration_batches)
        logger.info("%s: building, then measuring each candidate (%s, by %s)", spec.name, method, group_by)
        built = build_variant(spec, ctx)
        evaluator = _Evaluator(prepared, backend)
        baseline = evaluator.score(built)
        nodes = quantized_nodes(load_model(ctx.reference_path), built)
        if not nodes:
            raise QbenchError(f"explain: variant {spec.name!r} has no quantized node to rank")
        groups = group_nodes(nodes, group_by)
        scratch = dataclasses.replace(ctx, workdir=Path(tmp) / "candidates")
        scratch.workdir.mkdir(parents=True)
        capped = max_nodes is not None and len(groups) > max_nodes
        if method == "sqnr" or capped:
            evaluation = list(iter_batches(prepared.evaluation_feeds, recipe.data.evaluation.batch_size))
            noise = sqnr_costs(ctx.reference_path, built, nodes, evaluation, backend, options, scratch.workdir)
            by_noise = rank_by_sqnr(groups, noise)
        if method == "sqnr":
            costs = by_noise
            notes.append("SQNR read from intermediate tensors; exposing them can keep ORT from fusing Q/DQ")
        else:
            if capped:
                notes.append(f"measured the {max_nodes} noisiest of {len(groups)} groups (by SQNR)")
                groups = {c.group: groups[c.group] for c in by_noise[:max_nodes]}
            costs = rank_groups(float_keeper(spec, scratch, built), groups, evaluator.score, baseline, method)
    worst = max(baseline.slices, key=lambda s: baseline.slices[s], default=None)
    return ExplainResult(
        recipe=recipe.name, variant=spec.name, calibrator=str(built.params.get("calibrator")), method=method,
        group_by=group_by, metric=recipe.gate.metric, backend=backend_name, rows=len(prepared.evaluation_rows),
        drop=baseline.overall, worst_slice=worst, worst_slice_drop=baseline.slices[worst] if worst else math.nan,
        quantized_nodes=len(nodes), costs=tuple(costs), notes=tuple(notes), seconds=time.perf_counter() - started,
    )  # fmt: skip


def _explained_spec(recipe: Recipe, name: str) -> tuple[VariantSpec, list[str]]:
    """The recipe's variant as explain builds it: no search, and minmax for `calibrator: auto`."""
    spec = next((v for v in recipe.variants if v.name == name), None)
    if spec is None:
        raise QbenchError(f"explain: variant {expected_one_of(name, [v.name for v in recipe.variants])}")
    if spec.precision != "int8" or spec.qat is not None or spec.quantizer == "modelopt":
        raise QbenchError(f"explain: {name!r} is not an ONNX Runtime INT8 variant (explain ranks the nodes INT8 quantizes)")
    notes = ["calibrator auto: explained with minmax"] if spec.calibrator == "auto" else []
    if spec.fallback is not None:
        notes.append("fallback ignored: explaining the variant before any node is kept in FP32")
    calibrator = "minmax" if spec.calibrator == "auto" else spec.calibrator
    return spec.model_copy(update={"calibrator": calibrator, "fallback": None}), notes


def explain_table(result: ExplainResult, top: int) -> Table:
    """Rank, group, op types, then the cost overall and on the variant's worst slice (sqnr: the added noise)."""
    what = {"leave_one_out": "recovered", "one_at_a_time": "drop", "sqnr": "added noise"}[result.method]
    on_worst = f" and {_fmt(result.worst_slice_drop)} on {result.worst_slice}" if result.worst_slice else ""
    table = Table(title=f"{result.variant}: {result.method} by {result.group_by}, {result.metric} "
                        f"(the variant drops {_fmt(result.drop)} overall{on_worst})", title_justify="left")  # fmt: skip
    shown_worst = result.method != "sqnr" and result.worst_slice is not None
    columns = ["rank", result.group_by, "op type", f"{what} overall" if result.method != "sqnr" else what]
    columns += [f"{what} on {result.worst_slice}"] if shown_worst else []
    for column in [*columns, "share"]:
        table.add_column(column, justify="left" if column in (result.group_by, "op type") else "right")
    for rank, cost in enumerate(result.costs[:top], 1):
        values = [f"{cost.nsr:.2e}"] if result.method == "sqnr" else [_fmt(cost.overall)]
        values += [_fmt(cost.worst_slice)] if shown_worst else []
        share = f"{cost.share:.0%}" if math.isfinite(cost.share) else "—"
        table.add_row(str(rank), cost.group, ",".join(cost.op_types), *values, share)
    return table


def _fmt(value: float) -> str:
    return f"{value:+.4f}" if math.isfinite(value) else "—"


def plot_costs(result: ExplainResult, path: Path, top: int) -> Path:
    """Horizontal bars, costliest on top: the metric overall and on the worst slice (sqnr: added noise)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = list(result.costs[:top])[::-1]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.35 * len(shown)))
    positions = np.arange(len(shown))
    if result.method == "sqnr":
        ax.barh(positions, [c.nsr for c in shown], color="tab:purple")
        ax.set_xlabel("noise-to-signal ratio the node adds")
    else:
        ax.barh(positions + 0.2, [c.overall for c in shown], height=0.4, label="overall")
        if result.worst_slice is not None:
            ax.barh(positions - 0.2, [c.worst_slice for c in shown], height=0.4, label=f"slice {result.worst_slice}")
        ax.set_xlabel(f"{result.metric} {'recovered when kept float' if result.method == 'leave_one_out' else 'drop'}")
        ax.legend(loc="lower right")
    ax.set_yticks(positions, [c.group[-60:] for c in shown], fontsize=8)
    ax.set_title(f"{result.recipe} / {result.variant}: {result.method}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_explain(
    recipe: Recipe, variant_name: str, *, method: str = "leave_one_out", group_by: str = "node",
    max_nodes: int | None = None, top: int = 20, track: bool = True,
) -> ExplainOutcome:  # fmt: skip
    """`qbench explain`: rank, then write explain.json / explain.png / table.txt under
    <output_dir>/<name>/explain-<variant>-<timestamp>/, and log them to MLflow as run `explain <variant>`."""
    if track:
        from qbench.track import check_reachable, resolve_tracking_uri

        check_reachable(resolve_tracking_uri(recipe))
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    directory = recipe.output_path / recipe.name / f"explain-{variant_name}-{stamp}"
    result = explain_variant(recipe, variant_name, method=method, group_by=group_by, max_nodes=max_nodes, workdir=directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "explain.json").write_text(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    plot_costs(result, directory / "explain.png", top)
    with (directory / "table.txt").open("w") as file:
        print_wide(explain_table(result, top), Console(file=file, width=200))
    run_id = None
    if track:
        from qbench.track import log_run

        params = {"variant": result.variant, "method": method, "group_by": group_by, "metric": result.metric,
                  "calibrator": result.calibrator, "backend": result.backend, "rows": result.rows}  # fmt: skip
        metrics = {"drop": result.drop, "worst_slice_drop": result.worst_slice_drop, "seconds": result.seconds}
        artifacts = [directory / name for name in ("explain.json", "explain.png", "table.txt")]
        run_id = log_run(recipe, f"explain {result.variant}", params=params, metrics=metrics, artifacts=artifacts)
    return ExplainOutcome(result, directory, run_id)
