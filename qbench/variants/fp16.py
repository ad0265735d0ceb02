"""Half-precision variants: FP16 (a real FP16 graph) and BF16 (an emulation, on every backend).

FP16 uses `onnxruntime.transformers.float16` with FP32 inputs/outputs; in our
trials onnxconverter-common's converter produced a MiniLM graph ORT could not
load, ORT's did not.

BF16: ORT's CPU provider has no bfloat16 kernels for MatMul, Add, Relu... (a
real BF16 graph fails with NOT_IMPLEMENTED), but it does cast float <-> bfloat16.
So the BF16 variant is an FP32 graph that carries BF16 precision: weights are
rounded to bfloat16, and every float tensor a node produces (and every float
graph input) goes through Cast(to=BFLOAT16) -> Cast(to=FLOAT) (emulate.py).
Arithmetic inside an op stays FP32, as on hardware that accumulates BF16 products
in FP32. Its accuracy is faithful to BF16 (range up to 3.39e38, then inf; 8 bits
of precision); its latency is that of the emulation, never a BF16 figure.

FP16 on a backend without FP16 kernels (ONNX Runtime's CPU provider) is evaluated
through `emulate.emulate_float16`, which restores FP16 overflow and underflow that
ORT's CPU provider would otherwise hide (qbench.validate.fidelity).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

from qbench.recipe import VariantSpec
from qbench.variants.base import BuildContext, BuiltVariant
from qbench.variants.emulate import round_float_tensors
from qbench.variants.onnx_utils import Stopwatch, build_step, ensure_opset, load_model, output_path, save_model

FP16_MIN_POSITIVE = 5.96e-08  # smallest positive (subnormal) float16; the converter's default
FP16_MAX_FINITE = 65504.0
BF16_CAST_OPSET = 13  # first opset whose Cast accepts bfloat16
BF16_NOTE = "BF16 emulated (FP32 graph rounding every tensor to bfloat16): accuracy is faithful, latency is not BF16's"


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
        weights = _round_weights_to_bf16(model)
        activations = round_float_tensors(model, TensorProto.BFLOAT16)
        onnx.checker.check_model(model)
        save_model(model, target)
    return BuiltVariant(
        name=spec.name,
        precision="bf16",
        onnx_path=target,
        params={
            "method": "simulated: FP32 graph, bfloat16-rounded weights, float activations cast to BFLOAT16 and back",
            "rounding": "round to nearest even",
            "rounded_weights": weights,
            "rounded_activations": activations,
        },
        build_seconds=clock.seconds(),
        simulation=True,
        notes=(BF16_NOTE,),
    )


def round_to_bf16(values: np.ndarray) -> np.ndarray:
    """Float32 values rounded (to nearest even) to the nearest bfloat16, kept as float32."""
    return values.astype(ml_dtypes.bfloat16).astype(np.float32)


def _round_weights_to_bf16(model: onnx.ModelProto) -> int:
    """Round every float initializer to bfloat16 (kept as float32) in place; returns how many."""
    weights = [t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT]
    for tensor in weights:
        tensor.CopyFrom(numpy_helper.from_array(round_to_bf16(numpy_helper.to_array(tensor)), tensor.name))
    return len(weights)
