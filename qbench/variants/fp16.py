"""Half-precision variants: FP16 (real) and BF16 (simulated on CPU).

FP16 uses `onnxruntime.transformers.float16` with FP32 inputs/outputs; in our
trials onnxconverter-common's converter produced a MiniLM graph ORT could not
load, ORT's did not.

BF16: ORT's CPU provider has no bfloat16 kernels for MatMul, Add, Relu... (a
real BF16 graph fails with NOT_IMPLEMENTED), but it does cast float <-> bfloat16.
So the BF16 variant is an FP32 graph that carries BF16 precision: weights are
rounded to bfloat16, and every float tensor a node produces (and every float
graph input) goes through Cast(to=BFLOAT16) -> Cast(to=FLOAT). Arithmetic inside
an op stays FP32, as on hardware that accumulates BF16 products in FP32.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

from qbench.recipe import VariantSpec
from qbench.variants.base import BuildContext, BuiltVariant
from qbench.variants.onnx_utils import Stopwatch, build_step, ensure_opset, load_model, output_path, save_model

FP16_MIN_POSITIVE = 5.96e-08  # smallest positive (subnormal) float16; the converter's default
FP16_MAX_FINITE = 65504.0
BF16_CAST_OPSET = 13  # first opset whose Cast accepts bfloat16
BF16_NOTE = "BF16 simulated on CPU: accuracy is representative, latency is not"


def build_fp16(spec: VariantSpec, ctx: BuildContext) -> BuiltVariant:
    """FP16 weights and compute, FP32 inputs and outputs."""
    clock = Stopwatch()
    target = output_path(spec.name, ctx)
    with build_step(spec.name, "loading the FP32 model"):
        model = load_model(ctx.reference_path.resolve())
    clamped = _values_outside_fp16(model)
    blocked = sorted({node.op_type for node in model.graph.node} & set(DEFAULT_OP_BLOCK_LIST))
    with build_step(spec.name, "FP16 conversion"):
        converted = convert_float_to_float16(
            model, min_positive_val=FP16_MIN_POSITIVE, max_finite_val=FP16_MAX_FINITE, keep_io_types=True
        )
        save_model(converted, target)
    notes = []
    if clamped:
        notes.append(f"{clamped} weight value(s) outside FP16's range were clamped to it")
    if blocked:
        notes.append(f"kept in FP32 by the converter: {', '.join(blocked)}")
    return BuiltVariant(
        name=spec.name,
        precision="fp16",
        onnx_path=target,
        params={
            "converter": "onnxruntime.transformers.float16",
            "keep_io_types": True,
            "min_positive_val": FP16_MIN_POSITIVE,
            "max_finite_val": FP16_MAX_FINITE,
            "blocked_op_types": blocked,
            "weights_clamped": clamped,
        },
        build_seconds=clock.seconds(),
        notes=tuple(notes),
    )


def _values_outside_fp16(model: onnx.ModelProto) -> int:
    """Float weight values the converter clamps: beyond FP16's largest finite value or below its smallest positive."""
    count = 0
    for tensor in model.graph.initializer:
        if tensor.data_type == TensorProto.FLOAT:
            magnitude = np.abs(numpy_helper.to_array(tensor))
            too_small = (magnitude > 0) & (magnitude < FP16_MIN_POSITIVE)
            count += int(np.count_nonzero((magnitude > FP16_MAX_FINITE) | too_small))
    return count


def build_bf16(spec: VariantSpec, ctx: BuildContext) -> BuiltVariant:
    """A BF16 simulation: FP32 graph with weights and activations rounded to bfloat16 (see module docstring)."""
    clock = Stopwatch()
    target = output_path(spec.name, ctx)
    with build_step(spec.name, "loading the FP32 model"):
        model = load_model(ctx.reference_path.resolve())
    with build_step(spec.name, "BF16 simulation"):
        model = ensure_opset(model, BF16_CAST_OPSET)
        rounded = simulate_bf16(model)
        onnx.checker.check_model(model)
        save_model(model, target)
    return BuiltVariant(
        name=spec.name,
        precision="bf16",
        onnx_path=target,
        params={
            "method": "simulated: FP32 graph, bfloat16-rounded weights, float activations cast to BFLOAT16 and back",
            "rounding": "round to nearest even",
            "rounded_weights": rounded.weights,
            "rounded_activations": rounded.activations,
        },
        build_seconds=clock.seconds(),
        session_hints={"simulated": True},
        notes=(BF16_NOTE,),
    )


@dataclass(frozen=True)
class Bf16Rounding:
    """How many tensors `simulate_bf16` rounded."""

    weights: int
    activations: int


def round_to_bf16(values: np.ndarray) -> np.ndarray:
    """Float32 values rounded (to nearest even) to the nearest bfloat16, kept as float32."""
    return values.astype(ml_dtypes.bfloat16).astype(np.float32)


def _float_tensor_names(model: onnx.ModelProto) -> set[str]:
    """Tensors that shape inference (or the model) types as FLOAT; tensors of unknown type are left alone."""
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    infos = [*graph.value_info, *graph.input, *graph.output]
    return {info.name for info in infos if info.type.tensor_type.elem_type == TensorProto.FLOAT}


def _bf16_round_trip(source: str, target: str) -> list[onnx.NodeProto]:
    """Cast `source` to bfloat16 and back into `target`."""
    narrowed = f"{target}_bf16"
    return [
        helper.make_node("Cast", [source], [narrowed], to=TensorProto.BFLOAT16, name=f"{target}_to_bf16"),
        helper.make_node("Cast", [narrowed], [target], to=TensorProto.FLOAT, name=f"{target}_from_bf16"),
    ]


def simulate_bf16(model: onnx.ModelProto) -> Bf16Rounding:
    """Rewrite `model` in place so its weights and float activations carry bfloat16 precision.

    A node's float output `t` is renamed `t_fp32` and the round trip writes `t`, so
    consumers and graph outputs keep their names; float graph inputs get a rounded
    copy that their consumers read instead.
    """
    graph = model.graph
    floats = _float_tensor_names(model)
    weights = 0
    for tensor in graph.initializer:
        if tensor.data_type == TensorProto.FLOAT:
            tensor.CopyFrom(numpy_helper.from_array(round_to_bf16(numpy_helper.to_array(tensor)), tensor.name))
            weights += 1
    initializer_names = {t.name for t in graph.initializer}
    rounded_inputs = {
        i.name: f"{i.name}_rounded" for i in graph.input if i.name in floats and i.name not in initializer_names
    }
    nodes = [cast for name, rounded in rounded_inputs.items() for cast in _bf16_round_trip(name, rounded)]
    activations = len(rounded_inputs)
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in rounded_inputs:
                node.input[index] = rounded_inputs[name]
        casts = []
        for index, name in enumerate(node.output):
            if name in floats:
                node.output[index] = f"{name}_fp32"
                casts.extend(_bf16_round_trip(node.output[index], name))
                activations += 1
        nodes.append(node)
        nodes.extend(casts)
    graph.ClearField("node")
    graph.node.extend(nodes)
    return Bf16Rounding(weights=weights, activations=activations)
