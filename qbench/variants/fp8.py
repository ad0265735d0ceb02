"""FP8 E4M3 variants as standard ONNX Q/DQ, with qbench's calibration.

ORT's own FP8 path (`quantize_static` with QFLOAT8E4M3FN) accepts only the
Distribution calibrator, whose std-based scales clip ReLU tails and lost more
than 50 points of accuracy in our trial (pitfall 6). qbench instead computes
minmax / entropy / percentile ranges (`calibrate.py`) and writes plain
QuantizeLinear/DequantizeLinear pairs with float8e4m3fn zero points:

- activations feeding the quantized op types: scale = amax / 448 (E4M3's largest
  finite value), Q -> DQ inserted before the consumers;
- their weights: stored as FLOAT8E4M3FN initializers + DequantizeLinear, per
  tensor or per output channel; biases stay float; excluded nodes are untouched.

A MatMul/Gemm whose two inputs are computed (attention's Q x K^T and probabilities x V) gets E4M3 on both
sides, as an FP8 attention kernel reads them; an FP8 recipe for Linear layers only keeps them in 16/32-bit, so the
params name them (`quantized_attention_matmuls`) and a note says how to keep them float.

Overflow is E4M3FN's saturating conversion (`saturate=1`, written explicitly):
a value beyond 448 x scale, or +-inf, becomes +-448 x scale, as FP8 hardware and
TensorRT convert with saturation; E4M3FN has no inf, and NaN stays NaN.

The graph is opset 21 and its Q/DQ nodes carry no zero point (QuantizeLinear's
`output_dtype` names the type): with a float8 zero point, ONNX Runtime's default
optimisation level removes a Relu that feeds a QuantizeLinear as if the
quantized type were unsigned (one CNN: 0.68 -> 0.23 accuracy), so a user loading
the file with default session options would not get what qbench measured.
Without the zero point that rewrite does not apply, and the saved model gives the
measured outputs at every optimisation level. ORT CPU has no FP8 kernels: the
model is an emulation (its figures are flagged so, qbench.validate.fidelity).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime.quantization.calibrate import TensorsData, save_tensors_data

from qbench.recipe.spec import VariantSpec
from qbench.techniques.fp8 import OP_TYPES as DEFAULT_OP_TYPES
from qbench.techniques.fp8 import Fp8
from qbench.variants.base import BuildContext, BuiltVariant, technique_of
from qbench.variants.calibrate import (
    FEEDING,
    CalibrationSettings,
    calibration_rows,
    clipping_ranges,
    compute_ranges_with,
    preprocess_model,
    require_calibration,
    tensor_amax,
)
from qbench.variants.constant_inputs import fold_constant_inputs
from qbench.variants.float_rules import default_notes, float_rules, kept_float_nodes, restore_float_inputs
from qbench.variants.node_names import resolve_node_names
from qbench.variants.onnx_utils import (
    Stopwatch,
    build_step,
    check_model_against,
    default_opset,
    drop_unused_initializers,
    load_model,
    output_path,
    quantized_op_counts,
    quantized_tensors,
    save_model,
    scratch_dir,
    unchanged_variant,
)
from qbench.variants.opset_upgrade import ensure_opset
from qbench.variants.quant_scope import nothing_quantized_note, subgraph_read_kept_float
from qbench.variants.quantizable import nested_nodes_note, nothing_to_quantize, quantizable_nodes, unquantizable_nodes
from qbench.variants.reference import load_reference

FP8_MAX = 448.0  # largest finite float8e4m3fn value
FP8_OPSET = 21  # QuantizeLinear's output_dtype (19 took float8, but only through a zero point; see above)
# Inputs quantized per op type: the data input and the weight; biases (Conv 2, Gemm C) stay float.
_QUANTIZED_INPUTS = {"Conv": (0, 1), "ConvTranspose": (0, 1), "Gemm": (0, 1), "MatMul": (0, 1)}
NOTE = (
    "FP8 E4M3 emulated with Q/DQ: the quantized layers read E4M3 inputs and weights (round to nearest even, saturating "
    "at 448 x scale) and multiply them in float32; all else stays "
    "float32. Accuracy is the graph's, CPU latency is not FP8's"
)


@dataclass
class Fp8Insertion:
    """What `insert_fp8_qdq` changed."""

    activations: int = 0
    weights: int = 0
    skipped: list[str] = field(default_factory=list)  # tensors left float: no usable range
    folded: list[str] = field(default_factory=list)  # inputs computed from constants, quantized as weights


def build_fp8(spec: VariantSpec, ctx: BuildContext) -> BuiltVariant:
    """Build an FP8 E4M3 Q/DQ simulation of the reference model."""
    clock = Stopwatch()
    config = technique_of(spec, Fp8)
    require_calibration(spec.name, ctx.calibration)
    op_types = _op_types(config)
    settings = CalibrationSettings.of(config.calibration, False, op_types)
    target = output_path(spec.name, ctx)
    cache = target.with_name(f"{spec.name}.calibration.json")
    reference = ctx.reference_path.resolve()
    with build_step(spec.name, "loading the FP32 model"):
        model = load_reference(reference)
    exclude_nodes = resolve_node_names(model, config.exclude_nodes, spec.name)
    rules, default = float_rules(config, static=True)
    kept_float = kept_float_nodes(model, rules, default=default)
    excluded = {*exclude_nodes, *kept_float.names}
    if not quantizable_nodes(model, op_types, excluded):
        params = {"calibrator": settings.method, "op_types": list(op_types), "quantized_nodes": 0,
                  "quantized_op_types": {}}  # fmt: skip
        params.update(kept_float.params())
        return unchanged_variant(spec.name, "fp8", ctx, nothing_to_quantize(op_types, model), params, clock.seconds())
    with scratch_dir("qbench-fp8-") as tmp:
        original_opset = default_opset(model)
        with build_step(spec.name, f"upgrading opset {original_opset} to {FP8_OPSET}"):
            model = ensure_opset(model, FP8_OPSET)
        with build_step(spec.name, "pre-processing"):
            prepared, preprocess = preprocess_model(model, tmp, FP8_OPSET)
        with build_step(spec.name, f"{settings.method} calibration"):
            calibrated = compute_ranges_with(settings, prepared, ctx.calibration, tmp)
            ranges = calibrated.ranges
            save_tensors_data(ranges, cache)
        with build_step(spec.name, "inserting FP8 Q/DQ"):
            model = load_model(prepared)
            never = {*excluded, *unquantizable_nodes(model)}
            read_kept_float, read_by_subgraphs = subgraph_read_kept_float(model, op_types)
            inserted = insert_fp8_qdq(model, ranges, op_types, never, per_channel=config.per_channel)
            restore_float_inputs(model, sorted(excluded))  # left-out nodes read float, even where a tensor is quantized
            check_model_against(model, reference)
            save_model(model, target)
    counts = quantized_op_counts(model, op_types)
    params: dict[str, Any] = {
        **settings.params(),
        "format": "QDQ float8e4m3fn (standard ONNX QuantizeLinear/DequantizeLinear)",
        "scale_rule": f"amax / {FP8_MAX:g}",
        "overflow": f"saturate to +-{FP8_MAX:g} x scale (E4M3FN has no inf)",
        "per_channel": config.per_channel,
        "op_types": list(op_types),
        "exclude_nodes": list(config.exclude_nodes),
        **kept_float.params(),
        "opset_original": original_opset,
        "opset": default_opset(model),
        "preprocess": preprocess,
        "calibration_batches": len(ctx.calibration),
        "calibration_rows": calibration_rows(ctx.calibration),
        "calibration_feeding": FEEDING,
        "calibrated_tensors": len(ranges.keys()),
        "uncalibrated_tensors": calibrated.skipped,
        "calibration_cache": cache.name,
        "quantized_nodes": sum(counts.values()),
        "quantized_op_types": counts,
        "quantized_activations": inserted.activations,
        "quantized_weights": inserted.weights,
        "unquantized_inputs": inserted.skipped,
        "folded_weights": inserted.folded,
        "subgraph_read_kept_float": read_kept_float,
        "quantized_attention_matmuls": e4m3_operand_matmuls(model),
    }
    return BuiltVariant(
        name=spec.name,
        precision="fp8",
        onnx_path=target,
        params=params,
        build_seconds=clock.seconds(),
        notes=tuple(_notes(inserted, counts, params) + default_notes(params) + calibrated.notes() + read_by_subgraphs
                    + nested_nodes_note(model, op_types)),
        activation_ranges=clipping_ranges(ranges, quantized_tensors(model), symmetric=True),  # scale = amax / 448
    )


def _op_types(config: Fp8) -> tuple[str, ...]:
    """The op types to quantize: the recipe's (checked against DEFAULT_OP_TYPES when it was read), else those."""
    return tuple(config.op_types) if config.op_types else DEFAULT_OP_TYPES


def _notes(inserted: Fp8Insertion, counts: dict[str, int], params: dict[str, Any]) -> list[str]:
    notes = [NOTE]
    if inserted.skipped:
        skipped = ", ".join(inserted.skipped[:5])
        notes.append(f"{len(inserted.skipped)} input(s) left in FP32 for lack of a usable range: {skipped}")
    if not counts:
        notes.append(nothing_quantized_note(params))
    attention = params["quantized_attention_matmuls"]
    if attention:
        notes.append(
            f"{len(attention)} MatMul/Gemm with two computed inputs (attention's Q x K^T and probabilities x V) read "
            "E4M3 on both sides, as an FP8 attention kernel would; FP8 recipes that quantize Linear layers only "
            "(qbench's torch form: torchao float8 on nn.Linear) keep them in 16/32-bit: keep_float: [masks, "
            "attention_matmuls] builds that"
        )
    return notes


def e4m3_operand_matmuls(model: onnx.ModelProto) -> list[str]:
    """Names of the MatMul/Gemm nodes whose two operands are both quantized activations (Q -> DQ, no weight): the
    attention products a hardware FP8 Linear recipe leaves in higher precision."""
    producer = {output: node for node in model.graph.node for output in node.output}

    def quantized_activation(name: str) -> bool:
        dq = producer.get(name)
        if dq is None or dq.op_type != "DequantizeLinear":
            return False
        return getattr(producer.get(dq.input[0]), "op_type", "") == "QuantizeLinear"

    return [
        node.name for node in model.graph.node
        if node.op_type in ("MatMul", "Gemm") and len(node.input) >= 2
        and all(map(quantized_activation, node.input[:2]))
    ]  # fmt: skip


# -- graph rewrite ----------------------------------------------------------------------------------


def fp8_weight(weight: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(float8e4m3fn values, float32 scales) with scale = amax / 448, per tensor or per slice along `axis`."""
    if not np.all(np.isfinite(weight)):
        raise ValueError("a weight holds NaN or infinity")
    reduce_axes = None if axis is None else tuple(i for i in range(weight.ndim) if i != axis)
    amax = np.abs(weight).max(axis=reduce_axes)
    # A slice whose scale would not be a normal float32 (all zeros, or values below 448 x 1.2e-38) gets scale 1,
    # where its values round to 0: a scale of 0 would make 0 / 0 = NaN of its zeros and every output NaN.
    amax = np.where(usable_scale(amax / FP8_MAX), amax, FP8_MAX)
    scale = (amax / FP8_MAX).astype(np.float32)
    broadcast = scale if axis is None else scale.reshape([-1 if i == axis else 1 for i in range(weight.ndim)])
    values = np.clip(weight / broadcast, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    return values, scale


def usable_scale(scale: np.ndarray | float) -> np.ndarray:
    """Whether a scale (per element) is a normal float32, the scales Q/DQ can divide by without 0 or inf."""
    return np.asarray(scale, dtype=np.float32) >= np.finfo(np.float32).tiny


def _weight_axis(node: onnx.NodeProto, input_index: int, rank: int) -> int | None:
    """The output-channel axis of a weight input, or None where only a per-tensor scale fits."""
    if input_index != 1:
        return None
    if node.op_type == "Conv":
        return 0  # [M, C/group, k...]
    if node.op_type == "ConvTranspose":
        return 1  # [C, M/group, k...]
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    if node.op_type == "MatMul" and rank >= 2:
        return rank - 1  # [..., K, N]
    return None


class _Rewriter:
    """Collects the Q/DQ nodes and initializers for one graph; one DQ per tensor, shared by its consumers.

    A weight shared by several nodes takes its per-channel axis from the first one.
    """

    def __init__(self, graph: onnx.GraphProto, ranges: TensorsData, per_channel: bool) -> None:
        self.ranges = ranges
        self.per_channel = per_channel
        self.initializers = {t.name: t for t in graph.initializer}
        self.dequantized: dict[str, str] = {}  # float tensor -> its DequantizeLinear output
        self.new_initializers: list[onnx.TensorProto] = []
        self.result = Fp8Insertion()

    def _constant(self, name: str, value: np.ndarray) -> str:
        self.new_initializers.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, node: onnx.NodeProto, index: int) -> Iterator[onnx.NodeProto]:
        """Yield the DequantizeLinear for a float weight input and point the node at its output."""
        name = node.input[index]
        if name not in self.dequantized:
            array = numpy_helper.to_array(self.initializers[name])
            axis = _weight_axis(node, index, array.ndim) if self.per_channel else None
            values, scale = fp8_weight(array, axis)
            inputs = [self._constant(f"{name}_fp8", values), self._constant(f"{name}_fp8_scale", scale)]
            extra = {} if axis is None else {"axis": axis}
            self.dequantized[name] = f"{name}_fp8_dequantized"
            self.result.weights += 1
            yield helper.make_node("DequantizeLinear", inputs, [self.dequantized[name]], name=f"{name}_fp8_dq", **extra)
        node.input[index] = self.dequantized[name]

    def activation(self, node: onnx.NodeProto, index: int) -> Iterator[onnx.NodeProto]:
        """Yield Q -> DQ for an activation input with a usable range and point the node at the DQ output."""
        name = node.input[index]
        if name not in self.dequantized:
            amax = tensor_amax(self.ranges, name)
            if amax is None or not usable_scale(amax / FP8_MAX):
                if name not in self.result.skipped:
                    self.result.skipped.append(name)
                return
            scale = self._constant(f"{name}_fp8_scale", np.array(amax / FP8_MAX, dtype=np.float32))
            quantized, dequantized = f"{name}_fp8", f"{name}_fp8_dequantized"
            self.dequantized[name] = dequantized
            self.result.activations += 1
            yield helper.make_node("QuantizeLinear", [name, scale], [quantized], name=f"{name}_fp8_q",
                                   output_dtype=onnx.TensorProto.FLOAT8E4M3FN, saturate=1)  # fmt: skip
            yield helper.make_node("DequantizeLinear", [quantized, scale], [dequantized], name=f"{name}_fp8_dq")
        node.input[index] = self.dequantized[name]

    def inputs(self, node: onnx.NodeProto) -> Iterator[onnx.NodeProto]:
        for index in _QUANTIZED_INPUTS[node.op_type]:
            if index >= len(node.input) or not node.input[index]:
                continue
            initializer = self.initializers.get(node.input[index])
            if initializer is None:
                yield from self.activation(node, index)
            elif initializer.data_type == onnx.TensorProto.FLOAT:
                yield from self.weight(node, index)


def insert_fp8_qdq(
    model: onnx.ModelProto,
    ranges: TensorsData,
    op_types: tuple[str, ...],
    exclude: set[str],
    *,
    per_channel: bool,
) -> Fp8Insertion:
    """Rewrite `model` in place: FP8 Q/DQ on the inputs of `op_types` nodes not in `exclude`.

    Q/DQ nodes go right before their first consumer, which keeps the node list
    topologically sorted. Float weights that no node reads any more are dropped. An input computed from constants
    only (a Transposed or Constant weight) is folded into a weight first (constant_inputs).
    """
    graph = model.graph

    def chosen(node: onnx.NodeProto) -> bool:
        return node.op_type in op_types and node.domain in ("", "ai.onnx") and node.name not in exclude

    reads = [(node, index) for node in graph.node if chosen(node) for index in _QUANTIZED_INPUTS[node.op_type]]
    folded = fold_constant_inputs(model, reads)
    rewriter = _Rewriter(graph, ranges, per_channel)
    rewriter.result.folded = folded
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if chosen(node):
            nodes.extend(rewriter.inputs(node))
        nodes.append(node)
    graph.ClearField("node")
    graph.node.extend(nodes)
    graph.initializer.extend(rewriter.new_initializers)
    drop_unused_initializers(graph)
    return rewriter.result
