"""Range analysis: why a slice breaks in a lower precision, and whether calibration saw it.

One extra FP32 pass over the evaluation rows: a temporary copy of the FP32 model
exposes every float tensor as a graph output, runs batched, and each batch is
reduced at once to per-slice figures (nothing but the running reductions is kept):

- the largest |value| of every tensor, per scope ("overall" and each slice), checked
  against FP16 / BF16 / FP8 E4M3 limits (FP8 relative to a variant's per-tensor scale
  when it has them);
- for every variant with calibrated activation ranges (`BuiltVariant.activation_ranges`),
  how many values of its quantized tensors fall outside them (the values it clips).

A slice with no calibration rows on which a variant clips is a calibration-coverage warning.

A tensor is attributed to rows through its leading dimension: when it equals the batch's
row count, row i of the tensor belongs to evaluation row i. The first batch has two rows,
so a tensor whose leading dimension is a constant 1 is not mistaken for one row (a model with
a fixed batch takes that batch only, so there every batch has that many rows). Other
tensors (a flattened batch x sequence, a shape-independent constant), and any tensor once
it fails the check, count in "overall" only and are listed as unattributed.

The nodes inside control-flow subgraphs (If branches, Loop and Scan bodies) are not analysed: ONNX Runtime returns only
main-graph tensors, and a body's own tensors cannot be made graph outputs. How many there are, per control-flow node,
is recorded (`subgraph_nodes`) so the report says what the analysis did not see.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx

from qbench.data.feeds import take_batch
from qbench.per_call import fed_per_call, session_per_call_inputs
from qbench.progress import track_rows
from qbench.results.ranges import ClipRecord, CoverageWarning, LimitCheck, RangeAnalysis, TensorPeak
from qbench.variants.float_support import tensor_types
from qbench.variants.fp8 import FP8_MAX
from qbench.variants.onnx_utils import (
    MEMORY_BUDGET_BYTES,
    all_nodes,
    load_model,
    rows_per_batch,
    save_model,
    subgraphs_of,
)

OVERALL = "overall"
GRAPH_INPUT = "<graph input>"
FP16_MAX = float(np.finfo(np.float16).max)  # 65504
BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)  # about 3.39e38
RAW_LIMITS = {"fp16": FP16_MAX, "bf16": BF16_MAX}
_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                          onnx.TensorProto.DOUBLE})  # fmt: skip


@dataclass(frozen=True)
class CalibratedVariant:
    """A built variant's name, precision and the activation ranges its quantizers clip at."""

    name: str
    precision: str
    ranges: Mapping[str, tuple[float, float]]


# -- pure reductions ----------------------------------------------------------------------------------


def row_abs_max(values: np.ndarray, rows: int) -> np.ndarray | None:
    """Largest |value| of each of the `rows` leading slices (NaN ignored); None if the leading dim is not `rows`."""
    if values.ndim == 0 or values.shape[0] != rows:
        return None
    flat = np.abs(values.reshape(rows, -1))
    if flat.shape[1] == 0:
        return np.zeros(rows)
    return np.fmax.reduce(flat, axis=1).astype(np.float64)


def row_out_of_range(values: np.ndarray, rows: int, low: float, high: float) -> np.ndarray | None:
    """How many values of each leading slice lie outside [low, high]; None if the leading dim is not `rows`."""
    if values.ndim == 0 or values.shape[0] != rows:
        return None
    flat = values.reshape(rows, -1)
    return np.count_nonzero((flat < low) | (flat > high), axis=1)


def scope_max(per_row: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Largest per-row value in each scope (masks: scopes x rows); 0 for a scope with no row here."""
    return np.fmax.reduce(np.where(masks, per_row[np.newaxis, :], 0.0), axis=1, initial=0.0)


def scope_sum(per_row: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Sum of per-row counts in each scope (masks: scopes x rows)."""
    return masks.astype(np.int64) @ per_row.astype(np.int64)


def over_limit(abs_max: Mapping[str, float], limits: Mapping[str, float], nodes: Mapping[str, str],
               handled: Mapping[str, str] | None = None) -> tuple[TensorPeak, ...]:  # fmt: skip
    """Tensors whose abs max exceeds their limit (inf counts, NaN does not), the largest ratio first; `handled`:
    tensor -> how the variants of that format avoid its overflow (fp16_handled)."""
    handled = handled or {}
    peaks = [TensorPeak(t, nodes.get(t, t), abs_max[t], limit, handled.get(t)) for t, limit in limits.items()
             if t in abs_max and abs_max[t] > limit]  # fmt: skip
    return tuple(sorted(peaks, key=lambda p: (-p.abs_max / p.limit, p.tensor)))


def clip_record(variant: str, scope: str, clipped: Mapping[str, int], values: Mapping[str, int],
                nodes: Mapping[str, str]) -> ClipRecord:  # fmt: skip
    """Totals over the variant's tensors, and the tensor with the largest clipped share (ties: more values clipped)."""
    total_clipped, total = sum(clipped.values()), sum(values[t] for t in clipped)
    shares = {t: clipped[t] / values[t] for t in clipped if values[t] and clipped[t]}
    worst = min(shares, key=lambda t: (-shares[t], -clipped[t], t), default=None)
    return ClipRecord(
        variant=variant, scope=scope, clipped=int(total_clipped), values=int(total),
        share=total_clipped / total if total else 0.0,
        worst_tensor=worst, worst_node=nodes.get(worst, worst) if worst else None,
        worst_share=shares[worst] if worst else 0.0,
    )  # fmt: skip


def coverage_warnings(clipping: Sequence[ClipRecord],
                      calibration_counts: Mapping[str, int]) -> tuple[CoverageWarning, ...]:
    """One warning per slice with 0 calibration rows (per the recorded counts) and variant that clips on it."""
    warnings = []
    for record in clipping:
        if record.scope == OVERALL or calibration_counts.get(record.scope, 1) != 0 or record.clipped == 0:
            continue
        message = (
            f"slice {record.scope!r} has no calibration rows and {record.variant} clips {record.share * 100:.3g}% "
            f"of its quantized activations; worst node {record.worst_node!r} (tensor {record.worst_tensor!r}, "
            f"{record.worst_share * 100:.3g}% clipped)"
        )
        warnings.append(CoverageWarning(record.scope, record.variant, record.share, str(record.worst_node),
                                        str(record.worst_tensor), message))  # fmt: skip
    return tuple(warnings)


def fp16_handled(variants: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, str]:
    """Tensor -> how every FP16 variant (name, params) avoids its overflow, from the `fp16_range` its builder
    recorded: kept in FP32 with its producer and readers, or left to FP16 because clamping or overflowing it changed
    no output on the calibration sample. A tensor some FP16 variant leaves to overflow unchecked is not there (nor
    is any tensor when a variant has no such record: an older build)."""
    records = [(name, params.get("fp16_range")) for name, params in variants]
    if not records or any(not isinstance(record, Mapping) for _, record in records):
        return {}
    found: dict[str, list[str]] = {}
    for name, record in records:
        for tensor in record.get("tensors", {}):
            found.setdefault(tensor, []).append(f"{name} keeps it in FP32")
        for tensor in record.get("harmless", {}):
            found.setdefault(tensor, []).append(f"{name} clamps or overflows it harmlessly")
    return {tensor: "; ".join(how) for tensor, how in found.items() if len(how) == len(records)}


def bf16_saturated(variants: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, float]:
    """Constant -> its largest magnitude, for the constants beyond BF16's range that every BF16 variant (name, params)
    saturates to BF16's largest finite value (`saturated_constants` in its params); empty without BF16 variants, or
    when one has no such record (an older build)."""
    records = [params.get("saturated_constants") for _, params in variants]
    if not records or any(not isinstance(record, Mapping) for record in records):
        return {}
    common = set(records[0]).intersection(*records[1:])
    return {name: float(records[0][name]) for name in sorted(common)}


@dataclass(frozen=True)
class Bf16Saturation:
    """What the sweep's BF16 variants saturate, and the graph's nodes (inputs, outputs) in order, to follow it."""

    saturated: Mapping[str, float]  # bf16_saturated
    steps: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]

    def handled(self, peaks: Mapping[str, float]) -> dict[str, str]:
        """Tensor -> how the BF16 variants avoid its overflow, for the tensors over BF16's limit (by `peaks`, a
        scope's abs max) computed from a saturated constant (a mask filled from float32's minimum, the scores it is
        added to) by no more than the constant's own magnitude: in BF16 they hold the saturated, finite value, not
        inf. A tensor that also takes another input over the limit, or grows past the constant, got there by
        arithmetic, which overflows in BF16 as well: it is not marked."""
        reached: dict[str, tuple[str, float]] = {name: (name, bound) for name, bound in self.saturated.items()}
        for inputs, outputs in self.steps:
            sources = [reached[name] for name in inputs if name in reached]
            if sources and not any(name not in reached and peaks.get(name, 0.0) > BF16_MAX for name in inputs):
                reached.update(dict.fromkeys(outputs, max(sources, key=lambda source: source[1])))
        return {tensor: f"BF16 variant(s) saturate the constant `{constant}` it is computed from"
                for tensor, (constant, bound) in reached.items()
                if tensor not in self.saturated and BF16_MAX < peaks.get(tensor, 0.0) <= bound}  # fmt: skip


def bf16_saturation(model: onnx.ModelProto, saturated: Mapping[str, float]) -> Bf16Saturation | None:
    """The saturation to follow through `model` (its main graph), None when nothing is saturated."""
    if not saturated:
        return None
    steps = tuple((tuple(node.input), tuple(node.output)) for node in model.graph.node)
    return Bf16Saturation(dict(saturated), steps)


def limit_checks(abs_max: Mapping[str, Mapping[str, float]], nodes: Mapping[str, str],
                 variants: Sequence[CalibratedVariant], handled: Mapping[str, str] | None = None,
                 bf16: Bf16Saturation | None = None) -> tuple[LimitCheck, ...]:  # fmt: skip
    """FP16 and BF16 against their raw limits; FP8 E4M3 per FP8 variant with scales (448 x scale = its range's
    bound), or against the raw 448 when no FP8 variant has per-tensor scales. `handled` (fp16_handled) marks the
    tensors over FP16's limit that the sweep's FP16 variants keep in FP32 or found harmless; `bf16` those over BF16's
    limit that hold a constant the BF16 variants saturate."""

    def marked(fmt: str, peaks: Mapping[str, float]) -> Mapping[str, str] | None:
        if fmt == "fp16":
            return handled
        return bf16.handled(peaks) if fmt == "bf16" and bf16 is not None else None

    tensors = list(nodes)
    plans: list[tuple[str, float, str | None, dict[str, float]]] = [
        (fmt, limit, None, dict.fromkeys(tensors, limit)) for fmt, limit in RAW_LIMITS.items()
    ]
    scaled = [v for v in variants if v.precision == "fp8" and v.ranges]
    plans += [("fp8_e4m3", FP8_MAX, v.name, {t: max(-low, high) for t, (low, high) in v.ranges.items()})
              for v in scaled]
    if not scaled:
        plans.append(("fp8_e4m3", FP8_MAX, None, dict.fromkeys(tensors, FP8_MAX)))
    return tuple(
        LimitCheck(fmt, limit, scaled_by, {scope: over_limit(peaks, limits, nodes, marked(fmt, peaks))
                                            for scope, peaks in abs_max.items()})  # fmt: skip
        for fmt, limit, scaled_by, limits in plans
    )


# -- the pass -----------------------------------------------------------------------------------------


def expose_float_tensors(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy of `model` whose float node outputs are all graph outputs, and tensor -> producing node.

    The tensors are the model's float inputs, then float node outputs in graph order. Types come from ONNX shape
    inference completed by the operator schemas ONNX Runtime registers (float_support.tensor_types): ONNX knows no
    com.microsoft schema, so in a graph ONNX Runtime's transformer optimizer fused (Attention, SkipLayerNormalization)
    ONNX's inference alone types nothing downstream of the first fused node, and the analysis saw 4 of a BERT's 31
    float tensors, none a quantized MatMul reads. Tensors whose type stays unknown, and outputs of Constant nodes
    (weights, not activations), are left out.
    """
    graph = model.graph
    types = tensor_types(model)
    weights = {t.name for t in graph.initializer}
    nodes = {i.name: GRAPH_INPUT for i in graph.input if i.name not in weights and types.get(i.name) in _FLOAT_TYPES}
    for index, node in enumerate(graph.node):
        if node.op_type != "Constant":
            nodes.update({out: node.name or f"{node.op_type}_{index}" for out in node.output
                          if out and types.get(out) in _FLOAT_TYPES and out not in nodes})  # fmt: skip
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {o.name for o in exposed.graph.output} | {i.name for i in exposed.graph.input}
    exposed.graph.output.extend(onnx.helper.make_tensor_value_info(name, types[name], None)
                                for name in nodes if name not in present)  # fmt: skip
    return exposed, nodes


class _Accumulator:
    """Running per-scope reductions over batches: abs max per tensor, and clipped / total values per variant."""

    def __init__(self, scopes: list[str], tensors: list[str], variants: Sequence[CalibratedVariant]) -> None:
        self.scopes, self.tensors, self.variants = scopes, tensors, variants
        self.abs_max = np.zeros((len(scopes), len(tensors)))
        self.values = np.zeros((len(scopes), len(tensors)), dtype=np.int64)
        self.clipped = {v.name: np.zeros((len(scopes), len(tensors)), dtype=np.int64) for v in variants}
        self.unattributed: set[str] = set()

    def add(self, outputs: Sequence[np.ndarray], masks: np.ndarray) -> None:
        """Fold one batch in; `masks` is scopes x rows, its first scope being all rows."""
        rows = masks.shape[1]
        for index, (name, values) in enumerate(zip(self.tensors, outputs, strict=True)):
            per_row = None if name in self.unattributed else row_abs_max(values, rows)
            scopes = masks
            if per_row is None:  # not row-aligned (once is enough): "overall" only, as if it were one row
                self.unattributed.add(name)
                values = values.reshape(1, -1)
                per_row, scopes = row_abs_max(values, 1), np.zeros((len(self.scopes), 1), dtype=bool)
                scopes[0] = True
            self.abs_max[:, index] = np.fmax(self.abs_max[:, index], scope_max(per_row, scopes))
            size = int(np.prod(values.shape[1:]))
            self.values[:, index] += scopes.sum(axis=1) * size
            for variant in self.variants:
                if name in variant.ranges:
                    low, high = variant.ranges[name]
                    counts = row_out_of_range(values, scopes.shape[1], low, high)
                    self.clipped[variant.name][:, index] += scope_sum(counts, scopes)

    def finish(self, nodes: Mapping[str, str]) -> tuple[dict[str, dict[str, float]], tuple[ClipRecord, ...]]:
        abs_max = {s: dict(zip(self.tensors, self.abs_max[i].tolist(), strict=True)) for i, s in enumerate(self.scopes)}
        records = []
        for variant in self.variants:
            covered = [i for i, t in enumerate(self.tensors) if t in variant.ranges]
            for s, scope in enumerate(self.scopes):
                clipped = {self.tensors[i]: int(self.clipped[variant.name][s, i]) for i in covered}
                values = {self.tensors[i]: int(self.values[s, i]) for i in covered}
                records.append(clip_record(variant.name, scope, clipped, values, nodes))
        return abs_max, tuple(records)


def analyse_ranges(
    model_path: Path,
    feeds: Mapping[str, np.ndarray],
    slices: Mapping[str, np.ndarray],
    *,
    batch_size: int,
    variants: Sequence[CalibratedVariant] = (),
    calibration_counts: Mapping[str, int] | None = None,
    threads: int | None = None,
    workdir: Path | None = None,
    memory_budget: int = MEMORY_BUDGET_BYTES,
    whole: bool = False,
    fp16_handled: Mapping[str, str] | None = None,
    bf16_saturated: Mapping[str, float] | None = None,
) -> RangeAnalysis | None:
    """Run the FP32 model once over `feeds` with every float tensor exposed; reduce per slice as it goes.

    slices: slice name -> boolean mask over the rows of `feeds`. calibration_counts: calibration
    rows per slice (empty when unknown, e.g. a separate calibration file): slices counted 0 on
    which a variant clips become coverage warnings. Batches hold at most `batch_size` rows, fewer
    when one batch's exposed tensors would take more than `memory_budget` bytes; with `whole` (a model
    with a fixed batch) exactly `batch_size`, the last one filled with repeats of its rows that count nowhere.
    None when no node makes a float tensor of known type (e.g. a tree ensemble feeding a ZipMap): nothing to analyse.
    fp16_handled: tensor -> how the sweep's FP16 variants avoid its overflow (`fp16_handled`); such a tensor over
    65504 is reported as handled, not as an FP16 overflow. bf16_saturated: the constants the sweep's BF16 variants
    saturate (`bf16_saturated`); what is computed from them within their magnitude is reported as handled for BF16.
    """
    import onnxruntime as ort

    started = time.perf_counter()
    model = load_model(model_path)
    bf16 = bf16_saturation(model, bf16_saturated or {})
    inside = {node.name or f"{node.op_type}_{index}": sum(1 for body in subgraphs_of(node) for _ in all_nodes(body))
              for index, node in enumerate(model.graph.node) if subgraphs_of(node)}  # fmt: skip
    exposed, nodes = expose_float_tensors(model)
    del model
    tensors = list(nodes)
    fetched = [t for t in tensors if nodes[t] != GRAPH_INPUT]
    if not fetched:
        return None
    scopes = [OVERALL, *slices]
    accumulator = _Accumulator(scopes, tensors, variants)
    rows = len(next(iter(feeds.values())))
    all_masks = np.stack([np.ones(rows, dtype=bool), *(np.asarray(m, dtype=bool) for m in slices.values())])
    with tempfile.TemporaryDirectory(prefix="qbench-ranges-", dir=workdir) as tmp:
        path = save_model(exposed, Path(tmp) / "exposed.onnx")
        del exposed
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        if threads is not None:
            options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        per_call = session_per_call_inputs(session)
        # two rows first: tells row-aligned tensors from others, and how many bytes a row's tensors take
        start, size = 0, batch_size if whole else min(2, batch_size)
        with track_rows(rows, "range analysis (FP32)") as advance:
            while start < rows:
                batch = {name: array[start : start + size] for name, array in feeds.items()}
                count = len(next(iter(batch.values())))
                masks = all_masks[:, start : start + count]
                if whole and count < size:  # filled with repeats of its rows, which count in no scope
                    batch, masks = take_batch(batch, size), np.pad(masks, ((0, 0), (0, size - count)))
                outputs = dict(zip(fetched, session.run(fetched, dict(fed_per_call(batch, per_call))), strict=True))
                accumulator.add([outputs[t] if t in outputs else batch[t] for t in tensors], masks)
                if start == 0 and not whole:
                    size = rows_per_batch(sum(a.nbytes for a in outputs.values()) // count, batch_size, memory_budget)
                start += count
                advance(count)
        del session
    abs_max, clipping = accumulator.finish(nodes)
    return RangeAnalysis(
        rows=rows,
        seconds=time.perf_counter() - started,
        nodes=nodes,
        abs_max=abs_max,
        limits=limit_checks(abs_max, nodes, variants, fp16_handled, bf16),
        clipping=clipping,
        warnings=coverage_warnings(clipping, calibration_counts or {}),
        unattributed=tuple(t for t in tensors if t in accumulator.unattributed),
        subgraph_nodes={name: count for name, count in inside.items() if count},
    )
