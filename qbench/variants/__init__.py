"""Building variants: each variant is built by its technique's registered handler (`qbench.techniques`).

`EMULATIONS` maps a precision to the emulation scored on backends that cannot compute it.
Entries are "module:attr" targets, so importing this package imports no runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from qbench.registry import Registry
from qbench.techniques import TECHNIQUES, calibrator_names
from qbench.variants.base import BuildContext, BuiltVariant, VariantBuilder

if TYPE_CHECKING:  # pragma: no cover
    from qbench.recipe import VariantSpec
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
    (outputs the normal form set aside come back, nodes sorted). A variant that needs non-default session options
    gets them declared in its saved model (onnx_utils.declare_session_options); the recipe's own model is never
    rewritten. A saved model the onnx checker refuses fails the build (a QbenchError): no invalid model is built.
    """
    built = builder_for(spec)(spec, ctx)
    if built.onnx_path.resolve() != ctx.reference_path.resolve():
        from qbench.variants.onnx_utils import declare_session_options
        from qbench.variants.reference import check_built_model, settle_built_model

        settle_built_model(built.onnx_path, ctx.reference_path)
        if built.session_hints:
            declare_session_options(built.onnx_path, built.session_hints)
        check_built_model(built)
    return built


__all__ = ["EMULATIONS", "TECHNIQUES", "BuildContext", "BuiltVariant", "VariantBuilder", "build_variant", "builder_for", "calibrator_names"]
