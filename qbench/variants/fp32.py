"""The FP32 reference: the recipe's model itself, not a copy."""

from __future__ import annotations

from qbench.errors import QbenchError
from qbench.recipe import VariantSpec
from qbench.variants.base import BuildContext, BuiltVariant


def build_fp32(spec: VariantSpec, ctx: BuildContext) -> BuiltVariant:
    """Point at the reference model; every other variant is measured against this one."""
    reference = ctx.reference_path.resolve()
    if not reference.is_file():
        raise QbenchError(f"variant {spec.name!r}: the FP32 model {reference} does not exist")
    return BuiltVariant(
        name=spec.name,
        precision="fp32",
        onnx_path=reference,
        params={"source": "the recipe's model, unchanged"},
        borrowed=True,
    )
