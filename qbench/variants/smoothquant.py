"""SmoothQuant on ONNX graphs (the INT8 quantization of the Linears after it is in `linear_int8`).

Transformer activations have a few outlier channels that ruin a per-tensor INT8
scale. SmoothQuant (Xiao et al., 2022) divides activation channel j by
s_j = max|X_j|^alpha / max|W_j|^(1-alpha) and multiplies weight row j by s_j:
the product is unchanged, the activation becomes easy to quantize per tensor and
the weight absorbs the outlier (per-channel weight scales handle it).

On the graph: the Linears (MatMul/Gemm with a constant weight, see
`linear_graph`) are grouped by the tensor they read; Q/K/V share one vector (the
max over their weights). The division by s is FOLDED into the tensor's producer
when every reader of the tensor is in the group and the producer is a
LayerNorm-like op (scale and bias), a Mul by a per-channel constant, an Add of one
whose other input folds (a scalar is never widened: `_per_channel_on_last_axis`), or a Linear (its weight's output
columns and bias), also through a Relu or a Reshape/Flatten that keeps the last axis (GPT-2's Conv1D), or, for an
attention context, into V's producer through the head merge, attention MatMul and head split (`attention_heads`, where
the graph proves each channel stays itself); Shape/Size readers of a tensor do not block a fold;
otherwise one Mul by 1/s is inserted before the group (or, with
`unfoldable: skip`, the group is left unsmoothed; with `fold: false` a Mul is always inserted). Per-channel activation
ranges come from one ORT pass over the calibration batches; the per-tensor ranges after
smoothing follow from them exactly (range_j / s_j), so no second pass is needed.
`alpha: "auto"` chooses alpha per group from the same pass (see `_best_alpha`).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import onnxruntime as ort

from qbench.per_call import fed_per_call, session_per_call_inputs
from qbench.techniques.options import AUTO_ALPHAS
from qbench.variants.attention_heads import head_merge_source
from qbench.variants.base import Feeds
from qbench.variants.linear_graph import GraphView, Linear, float_tensor, node_attribute
from qbench.variants.linear_qdq import (
    LinearQuantSettings,
    fake_quantize_activation,
    fake_quantize_weight,
)
from qbench.variants.onnx_utils import save_model
from qbench.variants.pass_memo import PassMemo, batches_digest, model_digest

# LayerNorm-like ops, output 0 = normalized * scale (+ bias) over the last axis: op -> (scale input, bias input)
_NORMS: dict[str, tuple[int, int | None]] = {
    "LayerNormalization": (1, 2),
    "RMSNormalization": (1, None),
    "SimplifiedLayerNormalization": (1, None),
    "SkipLayerNormalization": (2, 3),
    "SkipSimplifiedLayerNormalization": (2, None),
}
# the producers a smoothing can fold into through their constant inputs (a Linear's weight and bias are folded anyway)
FOLD_PRODUCERS = (*_NORMS, "Mul", "Add")
logger = logging.getLogger(__name__)
_SCALE_LIMITS = (1e-5, 1e5)  # keeps s finite and nonzero for dead or extreme channels


# the build params `SmoothingReport.params` writes (what the INT8 search records for each SmoothQuant candidate)
REPORT_KEYS = ("smoothed_groups", "folded_into", "inserted_muls", "unsmoothed_groups", "alphas_chosen")
AUTO_SAMPLE_ROWS = 512  # calibration rows `alpha: "auto"` judges its candidates on


@dataclass(frozen=True)
class SmoothQuantSettings:
    """alpha: a number in [0, 1] for every group, or "auto": per group, the alpha of `alphas` (or no
    smoothing) whose INT8 Linear outputs are closest to FP32 on sampled calibration rows.
    fold: divide by s in the producer where the graph allows (False: always insert a Mul)."""

    alpha: float | Literal["auto"] = 0.5
    unfoldable: Literal["mul", "skip"] = "mul"
    quantization: LinearQuantSettings = LinearQuantSettings()
    exclude_nodes: tuple[str, ...] = ()
    fold: bool = True
    alphas: tuple[float, ...] = AUTO_ALPHAS


@dataclass
class ChannelRange:
    """Per-channel (last axis) min and max of one tensor over the calibration batches."""

    low: np.ndarray
    high: np.ndarray
    # for choosing alpha without seeing the rows it is judged on: ranges of the fit rows, and rows sampled from
    # the rows held back (flattened over all but the last axis); see `held_back`
    fit_low: np.ndarray
    fit_high: np.ndarray
    sample: np.ndarray
    judged_on_fit: bool = False  # no row could be held back (one calibration row): alpha is judged on the fit rows

    @classmethod
    def empty(cls, width: int) -> ChannelRange:
        low, high = np.full(width, np.inf, np.float32), np.full(width, -np.inf, np.float32)
        return cls(low, high, low.copy(), high.copy(), np.empty((0, width), np.float32))

    def update(self, values: np.ndarray, sample_rows: int, held_back: bool | None = None) -> None:
        """Add one batch. With `sample_rows`, `held_back` says whether the whole batch is held back from the fit
        (True) or fitted on (False); None (the only batch) splits its rows in half, or, with one row, fits and judges
        on that row."""
        flat = values.reshape(-1, values.shape[-1])
        self.low = np.minimum(self.low, flat.min(axis=0))
        self.high = np.maximum(self.high, flat.max(axis=0))
        if not sample_rows:
            return
        if held_back is None:
            self.judged_on_fit |= len(flat) < 2
            fit, judged = (flat[: len(flat) // 2], flat[len(flat) // 2 :]) if len(flat) > 1 else (flat, flat)
        else:
            fit, judged = (flat[:0], flat) if held_back else (flat, flat[:0])
        if len(fit):
            self.fit_low = np.minimum(self.fit_low, fit.min(axis=0))
            self.fit_high = np.maximum(self.fit_high, fit.max(axis=0))
        if len(judged):
            picked = np.linspace(0, len(judged) - 1, num=min(sample_rows, len(judged))).astype(int)
            self.sample = np.concatenate([self.sample, judged[picked]])

    @property
    def absmax(self) -> np.ndarray:
        return np.maximum(np.abs(self.low), np.abs(self.high))


@dataclass
class SmoothingReport:
    """What smoothing did: groups smoothed, folded into which producer op types, Muls inserted, groups skipped."""

    groups: int = 0
    folded_into: Counter[str] = field(default_factory=Counter)
    inserted_muls: int = 0
    skipped_groups: int = 0
    alphas: Counter[str] = field(default_factory=Counter)  # alpha chosen -> groups ("none": left unsmoothed)
    judged_on_fit: int = 0  # groups whose alpha was judged on the rows it was fitted on (one calibration row)

    def params(self) -> dict[str, Any]:
        judged = {"alpha_judged_on_fit_rows": self.judged_on_fit} if self.judged_on_fit else {}
        return {"smoothed_groups": self.groups, "folded_into": dict(sorted(self.folded_into.items())),
                "inserted_muls": self.inserted_muls, "unsmoothed_groups": self.skipped_groups,
                "alphas_chosen": dict(sorted(self.alphas.items())), **judged}  # fmt: skip


def smoothing_scales(activation_absmax: np.ndarray, weight_absmax: np.ndarray, alpha: float) -> np.ndarray:
    """s_j = max|X_j|^alpha / max|W_j|^(1-alpha), 1 where a channel is all zero, clamped to finite nonzero values."""
    act = np.asarray(activation_absmax, dtype=np.float64)
    weight = np.asarray(weight_absmax, dtype=np.float64)
    live = (act > 0) & (weight > 0)
    scales = np.ones_like(act)
    scales[live] = act[live] ** alpha / weight[live] ** (1.0 - alpha)
    return np.clip(scales, *_SCALE_LIMITS)


def held_back(batch: int, batches: int) -> bool | None:
    """Whether calibration batch `batch` of `batches` is held back from the range fit `alpha: auto` judges on: every
    other batch, whole, so that batches of one row (a model exported with a fixed batch of 1) hold rows back too;
    None when there is only one batch (its rows are split instead)."""
    return None if batches < 2 else batch % 2 == 1


CHANNEL_RANGES = PassMemo()  # SmoothQuant dynamic and static builds of one model collect the same ranges


def collect_channel_ranges(
    model: onnx.ModelProto, tensors: Sequence[str], batches: Sequence[Feeds], tmp: Path, sample_rows: int = 0
) -> dict[str, ChannelRange]:
    """Per-channel ranges of `tensors`: one ORT session with those tensors exposed as outputs, fed batch by batch.

    Graph inputs among `tensors` are read from the feeds themselves. With `sample_rows`, each range also
    keeps about that many rows, spread evenly over the batches held back (`held_back`), and the range of
    the others. Remembered for the same graph, tensors, batches and `sample_rows` (qbench.variants.pass_memo).
    """
    key = ("channel ranges", model_digest(model), tuple(tensors), batches_digest(batches), sample_rows)
    return CHANNEL_RANGES.get(key, lambda: _collect_channel_ranges(model, tensors, batches, tmp, sample_rows))


def _collect_channel_ranges(
    model: onnx.ModelProto, tensors: Sequence[str], batches: Sequence[Feeds], tmp: Path, sample_rows: int
) -> dict[str, ChannelRange]:
    judged_batches = sum(held_back(i, len(batches)) is not False for i in range(len(batches)))
    per_batch = -(-sample_rows // max(judged_batches, 1))
    graph_inputs = {value.name for value in model.graph.input}
    computed = [name for name in tensors if name not in graph_inputs]
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {value.name for value in exposed.graph.output}
    exposed.graph.output.extend(float_tensor(name) for name in computed if name not in present)
    path = save_model(exposed, tmp / "smoothquant-calibration.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    per_call = session_per_call_inputs(session)
    ranges: dict[str, ChannelRange] = {}
    for index, batch in enumerate(batches):
        found = dict(zip(computed, session.run(computed, dict(fed_per_call(batch, per_call))) if computed else []))
        for name in tensors:
            values = np.asarray(found[name] if name in found else batch[name], dtype=np.float32)
            if name not in ranges:
                ranges[name] = ChannelRange.empty(values.shape[-1])
            ranges[name].update(values, per_batch, held_back(index, len(batches)))
    return ranges


def smooth(
    view: GraphView, groups: dict[str, list[Linear]], ranges: dict[str, ChannelRange], settings: SmoothQuantSettings
) -> tuple[dict[str, tuple[float, float]], SmoothingReport]:
    """Smooth every group in place; returns each Linear input's per-tensor range after smoothing, and a report."""
    report = SmoothingReport()
    tensor_ranges: dict[str, tuple[float, float]] = {}
    # every fold is planned on the graph as loaded, before any edit: an inserted Mul's output has no producer in
    # the model until commit, and the shape inference a plan may ask for (attention_heads) reads the model
    plans = {tensor: _group_plan(view, tensor, group, settings.fold) for tensor, group in groups.items()}
    for tensor, group in groups.items():
        channel = ranges[tensor]
        weights = [_oriented_weight(view, linear) for linear in group]
        weight_absmax = np.max([np.abs(weight).max(axis=1) for weight in weights], axis=0)
        alpha = settings.alpha if settings.alpha != "auto" else _best_alpha(channel, weights, weight_absmax, settings)
        report.judged_on_fit += settings.alpha == "auto" and channel.judged_on_fit
        report.alphas["none" if alpha is None else f"{alpha:g}"] += 1
        scales = smoothing_scales(channel.absmax, weight_absmax, alpha) if alpha is not None else None
        plan = plans[tensor]
        if scales is None or (plan is None and settings.fold and settings.unfoldable == "skip"):
            report.skipped_groups += 1
            tensor_ranges[tensor] = (float(channel.low.min()), float(channel.high.max()))
            continue
        for linear in group:
            name = view.own_constant(linear.index, 1)
            shape = [-1, 1] if linear.weight_input_axis == 0 else [1, -1]
            view.set_constant(name, (view.constants[name] * scales.reshape(shape)).astype(np.float32))
        inverse = 1.0 / scales
        if plan is not None:
            for step, index in plan:
                _fold_step(view, step, index, inverse)
            report.folded_into[view.nodes[plan[-1][1]].op_type] += 1
            smoothed = tensor
        else:
            smoothed = _insert_mul(view, tensor, group, inverse)
            report.inserted_muls += 1
        report.groups += 1
        tensor_ranges[smoothed] = (float((channel.low * inverse).min()), float((channel.high * inverse).max()))
    return tensor_ranges, report


def _oriented_weight(view: GraphView, linear: Linear) -> np.ndarray:
    """The Linear's weight as (input channels, output channels)."""
    weight = view.constants[linear.node.input[1]]
    return weight if linear.weight_input_axis == 0 else weight.T


def _best_alpha(
    channel: ChannelRange, weights: list[np.ndarray], weight_absmax: np.ndarray, settings: SmoothQuantSettings
) -> float | None:
    """The alpha of `settings.alphas`, or None for no smoothing, whose INT8 outputs of the group are closest to FP32.

    Judged by the summed squared error on sampled rows that the activation range was NOT fitted on:
    a high alpha flattens every channel to the edge of its calibrated range, so rows beyond it clip,
    which rows of the fit itself would never show."""
    quantization = settings.quantization
    expected = [channel.sample @ weight for weight in weights]

    def error(scales: np.ndarray) -> float:
        low, high = float((channel.fit_low / scales).min()), float((channel.fit_high / scales).max())
        inputs = fake_quantize_activation(channel.sample / scales, low, high, quantization)
        total = 0.0
        for weight, reference in zip(weights, expected):
            dequantized = fake_quantize_weight(weight * scales[:, None], quantization)
            total += float(np.sum((inputs @ dequantized - reference) ** 2))
        return total

    candidates: dict[float | None, float] = {None: error(np.ones_like(weight_absmax, dtype=np.float64))}
    for alpha in settings.alphas:
        candidates[alpha] = error(smoothing_scales(channel.absmax, weight_absmax, alpha))
    return min(candidates, key=lambda alpha: candidates[alpha])


def _group_plan(view: GraphView, tensor: str, group: list[Linear], fold: bool) -> list[tuple[str, int]] | None:
    """The fold plan of one group's input (`_fold_plan`), or None when it must not fold: `fold` off, or the tensor
    read by more than the group's Linears (Shape/Size aside)."""
    if not fold or not view.read_only_by(tensor, [linear.index for linear in group], shape_readers=True):
        return None
    return _fold_plan(view, tensor, _oriented_weight(view, group[0]).shape[0])


def _fold_plan(view: GraphView, tensor: str, width: int) -> list[tuple[str, int]] | None:
    """The producer edits that divide `tensor` by s along its last axis, or None when the graph does not allow it.

    Each step is (kind, node index); intermediate tensors must have a single reader.
    """
    index = view.producer.get(tensor)
    if index is None:
        return None
    node = view.nodes[index]
    if node.op_type in _NORMS and node.output[0] == tensor:
        scale_at, bias_at = _NORMS[node.op_type]
        constants = [i for i in (scale_at, bias_at) if i is not None and i < len(node.input) and node.input[i]]
        per_channel = all(_per_channel(view, node.input[i], width) for i in constants)
        if node_attribute(node, "axis", -1) != -1 or not per_channel:
            return None
        return [("norm", index)]
    if node.op_type in ("Mul", "Add") and len(node.input) == 2:
        constant = [i for i, name in enumerate(node.input) if view.is_constant(name)]
        if len(constant) != 1 or not _per_channel_on_last_axis(view.constants[node.input[constant[0]]], width):
            return None
        if node.op_type == "Mul":  # e.g. a decomposed RMSNorm's weight; nothing folds THROUGH a Mul (GELU's last
            return [("mul", index)]  # step is one: GELU is not linear in its input)
        other = node.input[1 - constant[0]]
        inner = _fold_plan(view, other, width) if view.read_only_by(other, [index], shape_readers=True) else None
        return None if inner is None else [("add", index), *inner]
    if node.op_type == "Relu" or _keeps_last_axis(view, node, width):  # relu(x) / s == relu(x / s) for s > 0
        alone = view.read_only_by(node.input[0], [index], shape_readers=True)
        inner = _fold_plan(view, node.input[0], width) if alone else None
        return None if inner is None else [("pass", index), *inner]
    if view.is_linear(node):
        linear = Linear(index, node)
        if view.constants[node.input[1]].shape[linear.weight_output_axis] != width:
            return None
        if len(node.input) > 2 and node.input[2] and not _broadcasts_on_last_axis(view.constants[node.input[2]], width):
            return None
        return [("linear", index)]
    # an attention context (an attention-output projection's input) is linear in V's channels: fold into V's producer
    merged = head_merge_source(view, tensor, width) if node.op_type == "Reshape" else None
    inner = _fold_plan(view, merged[1], width) if merged is not None else None
    return None if merged is None or inner is None else [*(("pass", passed) for passed in merged[0]), *inner]


def _keeps_last_axis(view: GraphView, node: onnx.NodeProto, width: int) -> bool:
    """A Reshape/Flatten whose input's and output's last axes both hold `width` channels (GPT-2's Conv1D,
    `x.view(-1, x.size(-1))` before its Gemm): in row-major order channel j stays channel j, so dividing its input's
    last axis by s divides its output's. The input's width comes from shape inference; the output's from it too, or
    from the Linears reading it (their weight has `width` input rows)."""
    if node.op_type not in ("Reshape", "Flatten") or view.last_dim(node.input[0]) != width:
        return False
    readers = view.consumers.get(node.output[0], [])
    linears = bool(readers) and all(view.is_linear(view.nodes[i]) for i in readers)
    return view.last_dim(node.output[0]) == width or linears


def _fold_step(view: GraphView, step: str, index: int, inverse: np.ndarray) -> None:
    node = view.nodes[index]
    if step == "pass":
        return
    if step == "norm":
        scale_at, bias_at = _NORMS[node.op_type]
        positions = [i for i in (scale_at, bias_at) if i is not None and i < len(node.input) and node.input[i]]
    elif step == "linear":
        positions = [2] if len(node.input) > 2 and node.input[2] else []
        weight = view.own_constant(index, 1)
        shape = [1, -1] if Linear(index, node).weight_output_axis == 1 else [-1, 1]
        view.set_constant(weight, (view.constants[weight] * inverse.reshape(shape)).astype(np.float32))
    else:  # "mul" / "add": the constant operand
        positions = [i for i, name in enumerate(node.input) if view.is_constant(name)]
    for position in positions:
        name = view.own_constant(index, position)
        view.set_constant(name, _scaled_on_last_axis(view.constants[name], inverse))


def _insert_mul(view: GraphView, tensor: str, group: list[Linear], inverse: np.ndarray) -> str:
    """Insert `tensor * (1/s)` before the group's first Linear and point the group at it; returns the new tensor."""
    factor = view.add_constant(f"{tensor}_smoothing", inverse.astype(np.float32))
    smoothed = view.fresh_name(f"{tensor}_smoothed")
    mul = onnx.helper.make_node("Mul", [tensor, factor], [smoothed], name=view.fresh_name(f"{tensor}_SmoothQuant"))
    view.insert_before(min(linear.index for linear in group), [mul])
    for linear in group:
        linear.node.input[0] = smoothed
    return smoothed


def _per_channel(view: GraphView, name: str, width: int) -> bool:
    return view.is_constant(name) and view.constants[name].shape == (width,)


def _per_channel_on_last_axis(value: np.ndarray, width: int) -> bool:
    """A Mul's or Add's constant holding one value per channel on its last axis already: a fold may change it.

    A scalar (or a last axis of 1) is left as it is: the fold would widen it into a vector, and ONNX Runtime's
    fusions match the scalar forms, a decomposed GELU's `* 0.5` among them (Gelu, BiasGelu). Folded into that Mul,
    every GELU of MiniLM's SmoothQuant builds ran as 5 unfused ops on (batch, seq, 1536) tensors: a batch of 16 took
    about 5 % more CPU time (static 271 ms against 257, dynamic 277 against 253, one thread) than with a Mul inserted
    before the Linear instead."""
    return value.ndim > 0 and value.shape[-1] == width


def _broadcasts_on_last_axis(value: np.ndarray, width: int) -> bool:
    """A constant whose last axis is 1 or `width` (a scalar counts): scaling its last axis scales the result's."""
    return value.ndim == 0 or value.shape[-1] in (1, width)


def _scaled_on_last_axis(value: np.ndarray, inverse: np.ndarray) -> np.ndarray:
    shape = value.shape if value.ndim else (1,)
    expanded = np.broadcast_to(value.reshape(shape), (*shape[:-1], inverse.size))
    return (expanded * inverse).astype(value.dtype)


@dataclass(frozen=True)
class SmoothedModel:
    """The smoothed FP32 model (equivalent to the input), each Linear input's range after smoothing, and a report."""

    model: onnx.ModelProto
    input_ranges: dict[str, tuple[float, float]]
    report: SmoothingReport


def smooth_model(
    model: onnx.ModelProto, batches: Sequence[Feeds], settings: SmoothQuantSettings, tmp: Path
) -> SmoothedModel:
    """Calibrate the Linear inputs of `model` on `batches` and smooth them (the model is edited in place)."""
    view = GraphView(model)
    groups: dict[str, list[Linear]] = defaultdict(list)
    for linear in view.linears(settings.exclude_nodes):
        groups[linear.node.input[0]].append(linear)
    sample_rows = AUTO_SAMPLE_ROWS if settings.alpha == "auto" else 0
    ranges = collect_channel_ranges(model, list(groups), batches, tmp, sample_rows)
    input_ranges, report = smooth(view, dict(groups), ranges, settings)
    if report.judged_on_fit:
        logger.warning("SmoothQuant alpha auto: calibration has one row, so none could be held back: alpha is judged "
                       "on the row its range was fitted on (clipping beyond "
                       "that range goes unseen); calibrate on more rows")
    return SmoothedModel(view.commit(), input_ranges, report)
