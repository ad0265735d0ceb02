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

    A variant that needs non-default session options gets them declared in its saved model
    (onnx_utils.declare_session_options); the recipe's own model is never rewritten.
    """
    built = builder_for(spec)(spec, ctx)
    if built.session_hints and built.onnx_path.resolve() != ctx.reference_path.resolve():
        from qbench.variants.onnx_utils import declare_session_options

        declare_session_options(built.onnx_path, built.session_hints)
    return built


__all__ = ["EMULATIONS", "TECHNIQUES", "BuildContext", "BuiltVariant", "VariantBuilder", "build_variant", "builder_for", "calibrator_names"]
