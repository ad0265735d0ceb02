"""Precision transforms: one module per technique, registered by precision name.

`PRECISIONS` maps a precision (fp32, fp16, bf16, int8, fp8) to a builder;
`CALIBRATORS` maps a calibrator name to the precisions it serves. Both hold
"module:attr" targets, so importing this package imports no runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from qbench.registry import Registry
from qbench.variants.base import BuildContext, BuiltVariant, VariantBuilder

if TYPE_CHECKING:  # pragma: no cover
    from qbench.variants.emulate import Emulation

PRECISIONS: Registry[VariantBuilder] = Registry("precision")
PRECISIONS.register("fp32", "qbench.variants.fp32:build_fp32")
PRECISIONS.register("fp16", "qbench.variants.fp16:build_fp16")
PRECISIONS.register("bf16", "qbench.variants.fp16:build_bf16")
PRECISIONS.register("int8", "qbench.variants.int8:build_int8")
PRECISIONS.register("fp8", "qbench.variants.fp8:build_fp8")

# precision -> the emulation scored on backends that cannot compute it (qbench.validate.fidelity)
EMULATIONS: Registry[Callable[[BuiltVariant], Emulation]] = Registry("emulation")
EMULATIONS.register("fp16", "qbench.variants.emulate:float16_emulation")
EMULATIONS.register("fp8", "qbench.variants.emulate:qdq_emulation")

# calibrator name -> the precisions it can calibrate
CALIBRATORS: dict[str, tuple[str, ...]] = {
    "auto": ("int8",),  # try the static calibrators, keep the best by the gate metric (qbench.fallback)
    "minmax": ("int8", "fp8"),
    "entropy": ("int8", "fp8"),
    "percentile": ("int8", "fp8"),
    "dynamic": ("int8",),
}


def calibrator_names(precision: str) -> list[str]:
    return sorted(name for name, precisions in CALIBRATORS.items() if precision in precisions)


# techniques that override the precision's default builder
TECHNIQUES: Registry[VariantBuilder] = Registry("technique")
TECHNIQUES.register("qat", "qbench.variants.qat:build_qat")
TECHNIQUES.register("modelopt", "qbench.variants.modelopt_quant:build_modelopt")
TECHNIQUES.register("smoothquant", "qbench.variants.smoothquant:build_smoothquant")


def builder_for(spec) -> VariantBuilder:  # noqa: ANN001 (VariantSpec; avoids import cycle)
    """QAT, ModelOpt and SmoothQuant variants have their own builders; everything else is built by precision."""
    if spec.qat is not None:
        return TECHNIQUES.get("qat")
    if spec.smoothquant is not None:
        return TECHNIQUES.get("smoothquant")
    if spec.quantizer == "modelopt":
        return TECHNIQUES.get("modelopt")
    return PRECISIONS.get(spec.precision)


def build_variant(spec, ctx: BuildContext) -> BuiltVariant:  # noqa: ANN001
    """Build the variant described by `spec` (a recipe VariantSpec) into ctx.workdir.

    A variant that needs non-default session options gets them declared in its saved model
    (onnx_utils.declare_session_options); the recipe's own model is never rewritten.
    """
    built = builder_for(spec)(spec, ctx)
    if built.session_hints and built.onnx_path.resolve() != ctx.reference_path.resolve():
        from qbench.variants.onnx_utils import declare_session_options

        declare_session_options(built.onnx_path, built.session_hints)
    return built


__all__ = ["PRECISIONS", "EMULATIONS", "TECHNIQUES", "CALIBRATORS", "builder_for", "BuildContext", "BuiltVariant", "VariantBuilder", "build_variant", "calibrator_names"]
