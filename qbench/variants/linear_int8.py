"""The `linear` and `smoothquant` techniques: INT8 on the inputs and weights of Linears only, float outputs.

`linear`: each Linear input gets a per-tensor range from one ORT pass over the calibration
batches (static) or is quantized per batch at run time (dynamic); `smoothquant` smooths the
graph first (`smoothquant.smooth_model`), which also yields the ranges after smoothing. Both
then rewrite the Linears with `linear_qdq.quantize_linears`. Linears are chosen by rule
(`linear_graph`) after weights computed from constants are folded into initializers
(`constant_inputs`); attention MatMuls, Softmax and masks are never Linears, and `keep_float`
rules and `exclude_nodes` keep more nodes float. A MatMul/Gemm left float with an operand that is no
activation (a 3-D or left-hand weight, a Gemm with transA) is named in a note.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from qbench.recipe.spec import VariantSpec
from qbench.techniques.linear import LinearInt8, SmoothQuant
from qbench.variants.base import BuildContext, BuiltVariant, Feeds, technique_of
from qbench.variants.calibrate import calibration_rows, require_calibration
from qbench.variants.constant_inputs import fold_constant_inputs
from qbench.variants.float_rules import kept_float_nodes
from qbench.variants.int8 import resolve_reduce_range
from qbench.variants.linear_graph import GraphView, Linear
from qbench.variants.linear_qdq import LinearQuantSettings, quantize_linears
from qbench.variants.node_names import resolve_node_names
from qbench.variants.nonfinite_scan import kept_float_note, nodes_reading_nonfinite
from qbench.variants.onnx_utils import Stopwatch, build_step, output_path, save_model, scratch_dir
from qbench.variants.opset_upgrade import ensure_opset
from qbench.variants.qdq_opset import qdq_runnable
from qbench.variants.quantizable import nested_nodes_note
from qbench.variants.reference import load_reference
from qbench.variants.smoothquant import FOLD_PRODUCERS, SmoothQuantSettings, collect_channel_ranges, smooth_model
from qbench.variants.unfused_activations import keep_integer_kernels

_NO_LINEAR = "no Linear (MatMul/Gemm with a constant weight) found"

LINEAR_OP_TYPES = ("MatMul", "Gemm")  # the Linears these builds quantize


def smoothquant_int8(
    model: onnx.ModelProto, batches: Sequence[Feeds], settings: SmoothQuantSettings, tmp: Path
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Smooth and quantize `model` in place; returns it and the parameters that describe what was done."""
    smoothed = smooth_model(model, batches, settings, tmp)
    view = GraphView(smoothed.model)
    linears = view.linears(settings.exclude_nodes)
    done = _quantize(view, linears, smoothed.input_ranges, settings.quantization, settings.exclude_nodes)
    return view.commit(), {**smoothed.report.params(), **done}


def linear_int8(
    model: onnx.ModelProto,
    batches: Sequence[Feeds],
    quantization: LinearQuantSettings,
    exclude_nodes: Sequence[str],
    tmp: Path,
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Quantize the Linears of `model` (in place) without smoothing; returns it and what was done."""
    view = GraphView(model)
    linears = view.linears(exclude_nodes)
    ranges: dict[str, tuple[float, float]] = {}
    if quantization.activations == "static" and linears:
        inputs = list(dict.fromkeys(linear.node.input[0] for linear in linears))
        channels = collect_channel_ranges(model, inputs, batches, tmp)
        ranges = {name: (float(channel.low.min()), float(channel.high.max())) for name, channel in channels.items()}
    done = _quantize(view, linears, ranges, quantization, exclude_nodes)
    return view.commit(), done


def _quantize(
    view: GraphView,
    linears: list[Linear],
    ranges: Mapping[str, tuple[float, float]],
    quantization: LinearQuantSettings,
    exclude_nodes: Sequence[str],
) -> dict[str, Any]:
    # MatMuls whose weight is an activation (attention) stay float by rule; those whose weight is not are named
    unchosen = [node for node in view.nodes if node.op_type in LINEAR_OP_TYPES and len(node.input) > 1
                and not view.is_linear(node) and not (node.name and node.name in exclude_nodes)]  # fmt: skip
    constant_weight = [node.name or node.output[0] for node in unchosen
                       if not all(view.from_graph_inputs(name) for name in node.input[:2])]  # fmt: skip
    quantized_inputs = quantize_linears(view, linears, ranges, quantization)
    return {"quantized_linears": len(linears), "quantized_inputs": quantized_inputs,
            "float_matmuls": len(unchosen) - len(constant_weight), "float_constant_weight_matmuls": constant_weight}


def build_linear_int8(spec: VariantSpec, ctx: BuildContext) -> BuiltVariant:
    """The recipe's `linear` or `smoothquant` INT8 variant."""
    clock = Stopwatch()
    config = technique_of(spec, LinearInt8)
    calibrated = isinstance(config, SmoothQuant) or not config.dynamic  # smoothing always calibrates
    if calibrated:
        require_calibration(spec.name, ctx.calibration)
    reduce_range, reduce_range_source = resolve_reduce_range(config.reduce_range)
    quantization = LinearQuantSettings(
        activations="dynamic" if config.dynamic else "static",
        activation_type=config.activation_type,
        symmetric_activations=config.symmetric_activations,
        per_channel=config.per_channel,
        reduce_range=reduce_range,
    )
    target = output_path(spec.name, ctx)
    params: dict[str, Any] = {"technique": spec.technique_name}
    with scratch_dir("qbench-linear-int8-") as tmp:
        with build_step(spec.name, "loading the FP32 model"):
            model = ensure_opset(load_reference(ctx.reference_path.resolve()), 13)
        if not config.dynamic:  # a dynamic build writes DynamicQuantizeLinear and MatMulInteger, no Q/DQ
            model, stamped = qdq_runnable(model, 13)
            if stamped:
                params["opset_stamped"] = stamped.removesuffix("; ")
        exclude_nodes = resolve_node_names(model, config.exclude_nodes, spec.name)
        with build_step(spec.name, "folding weights computed from constants"):
            reads = [(node, index) for node in model.graph.node if node.op_type in LINEAR_OP_TYPES for index in (1, 2)]
            if isinstance(config, SmoothQuant):  # a norm scale the TorchScript exporter reads through an Identity
                # (it shares equal initializers: a fresh LayerNorm's ones and zeros) is one smoothing can fold into
                reads += [(node, index) for node in model.graph.node if node.op_type in FOLD_PRODUCERS
                          for index in range(len(node.input))]  # fmt: skip
            params["folded_weights"] = fold_constant_inputs(model, reads)
        kept_float = kept_float_nodes(model, config.keep_float)
        exclude = (*exclude_nodes, *kept_float.names)
        with build_step(spec.name, "looking for NaN/inf on the calibration rows"):
            linears = [linear.node.name for linear in GraphView(model).linears(exclude)]
            reading = nodes_reading_nonfinite(model, linears, ctx.calibration, tmp)
        exclude += tuple(reading)  # quantizing (or smoothing by) a NaN would turn it into a number
        if reading:
            params["nonfinite_inputs_kept_fp32"] = reading
        if isinstance(config, SmoothQuant):
            options = config.smoothquant
            settings = SmoothQuantSettings(
                options.alpha, options.unfoldable, quantization, exclude, options.fold, tuple(options.alphas)
            )
            params.update(alpha=options.alpha, unfoldable=options.unfoldable, fold=options.fold)
            if options.alpha == "auto":
                params["alphas"] = list(options.alphas)
            with build_step(spec.name, "SmoothQuant calibration, smoothing and quantization"):
                model, done = smoothquant_int8(model, ctx.calibration, settings, tmp)
        else:
            with build_step(spec.name, f"{quantization.activations} INT8 on the Linears"):
                model, done = linear_int8(model, ctx.calibration, quantization, exclude, tmp)
        unfused = 0 if config.dynamic else keep_integer_kernels(model)  # a dynamic build writes no Q/DQ
        if unfused:
            done["activations_unfused"] = unfused
        with build_step(spec.name, "saving the quantized model"):
            save_model(model, target)
    params.update({
        "activations": quantization.activations,
        "activation_type": quantization.activation_type if quantization.activations == "static" else "uint8",
        "symmetric_activations": quantization.symmetric_activations,
        "per_channel": config.per_channel,
        "weight_type": "int8",
        "reduce_range": reduce_range,
        "reduce_range_source": reduce_range_source,
        "exclude_nodes": list(config.exclude_nodes),
        "op_types": list(LINEAR_OP_TYPES),  # what it quantizes: explain and the search rank these nodes
        "weights_rewritten": isinstance(config, SmoothQuant),  # smoothing scaled them: FP32's are not their source
        **kept_float.params(),
        "calibration_batches": len(ctx.calibration) if calibrated else 0,
        "calibration_rows": calibration_rows(ctx.calibration) if calibrated else 0,
        **done,
    })  # fmt: skip
    notes = (*(() if done["quantized_linears"] else (_NO_LINEAR,)), *_constant_weight_note(done),
             *nested_nodes_note(model, LINEAR_OP_TYPES), *([kept_float_note(reading)] if reading else []))  # fmt: skip
    return BuiltVariant(name=spec.name, precision="int8", onnx_path=target, params=params,
                        build_seconds=clock.seconds(), notes=notes)  # fmt: skip


def _constant_weight_note(done: Mapping[str, Any]) -> tuple[str, ...]:
    """The MatMul/Gemm nodes left float although their weight is no activation, named (a form no Linear has)."""
    names = done["float_constant_weight_matmuls"]
    if not names:
        return ()
    listed = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (f"{len(names)} MatMul/Gemm left in float though their weight is no activation (not a 2-D float32 weight "
            f"read as x·W: a float64, 3-D or left-hand weight, a Gemm with transA or a computed bias): {listed}",)
