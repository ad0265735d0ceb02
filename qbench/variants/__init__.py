"""Building variants: each variant is built by its technique's registered handler (`qbench.techniques`).

`EMULATIONS` maps a precision to the emulation scored on backends that cannot compute it.
Entries are "module:attr" targets, so importing this package imports no runtime.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from qbench.registry import Registry
from qbench.techniques import TECHNIQUES, calibrator_names
from qbench.variants.base import ONNX, BuildContext, BuiltVariant, VariantBuilder

if TYPE_CHECKING:  # pragma: no cover
    from qbench.recipe.spec import VariantSpec
    from qbench.variants.emulate import Emulation

# precision -> the emulation scored on backends that cannot compute it (qbench.validate.fidelity)
EMULATIONS: Registry[Callable[[BuiltVariant], Emulation]] = Registry("emulation")
EMULATIONS.register("fp16", "qbench.variants.emulate:float16_emulation")
EMULATIONS.register("fp8", "qbench.variants.emulate:qdq_emulation")


def builder_for(spec: VariantSpec) -> VariantBuilder:
    """The handler of the variant's technique."""
    return TECHNIQUES.get(spec.technique_name).builder()


def build_variant(spec: VariantSpec, ctx: BuildContext) -> BuiltVariant:
    """Build the variant described by `spec` (a recipe VariantSpec) into ctx.workdir.

    Builders build from the reference's normal form (qbench.variants.reference); the saved model is settled here
    (outputs the normal form set aside come back, fed inputs in the reference's order, nodes sorted) and takes the
    reference's fed inputs; initializers the reference lists as inputs are constants in it (params and notes say so). A
    variant that needs non-default session options gets them declared in its saved model
    (onnx_utils.declare_session_options); the recipe's own model is never rewritten. A saved model the onnx checker
    refuses fails the build (a QbenchError): no invalid model is built. An INT8 build's params count what ONNX Runtime
    runs as integer kernels in the saved model, whichever technique built it (qbench.variants.integer_kernels): a graph
    that only rounds data is the FP32 model for the gate and the search; and what its quantized layers hold as stored,
    which a quantizer's rule for an op type may make differ from the recipe's options (qbench.variants.quantized_facts).
    What this settling adds to the params and notes describes the saved graph, not a torch module a builder (QAT,
    ModelOpt) supplied beside it (BuiltVariant.as_run_in).
    """
    built = builder_for(spec)(spec, ctx)
    return built.of_form(ONNX, _settled(built, ctx), since=built)


def _settled(built: BuiltVariant, ctx: BuildContext) -> BuiltVariant:
    """`built` with its saved model settled and checked, and what the settled graph shows in its params and notes."""
    if built.onnx_path.resolve() != ctx.reference_path.resolve():
        from qbench.variants.onnx_utils import declare_session_options
        from qbench.variants.reference import check_built_model, constant_inputs, settle_built_model

        settled = settle_built_model(built.onnx_path, ctx.reference_path)  # session options touch metadata only
        if built.session_hints:
            declare_session_options(built.onnx_path, built.session_hints)
        check_built_model(built, ctx.reference_path)
        if built.precision in ("int8", "fp8"):
            from qbench.variants.integer_kernels import with_float_weighted, with_integer_kernels
            from qbench.variants.quantized_facts import with_quantized_facts

            if built.precision == "int8":
                built = with_integer_kernels(built, settled)
            built = with_float_weighted(with_quantized_facts(built, settled), settled)
        constant = constant_inputs(ctx.reference_path)
        if constant:
            built = dataclasses.replace(built, params={**built.params, "constant_inputs": list(constant)}, notes=(
                *built.notes, f"the FP32 model lists {len(constant)} initializer(s) as graph inputs "
                              f"({', '.join(constant[:5])}"
                f"{', ...' if len(constant) > 5 else ''}): this variant holds them as constants at their FP32 values, "
                "converted as its precision converts weights, so a caller cannot override them"))  # fmt: skip
    return built


__all__ = ["EMULATIONS", "TECHNIQUES", "BuildContext", "BuiltVariant", "VariantBuilder", "build_variant",
           "builder_for", "calibrator_names"]  # fmt: skip
