"""The FP32 reference: the recipe's model itself, not a copy."""

from __future__ import annotations

from qbench.errors import QbenchError
from qbench.onnx_read import read_onnx
from qbench.preflight.precision import rounded_activations, stored_weights
from qbench.recipe.spec import VariantSpec
from qbench.variants.base import BuildContext, BuiltVariant
from qbench.variants.quantizable import reference_arithmetic


def build_fp32(spec: VariantSpec, ctx: BuildContext) -> BuiltVariant:
    """Point at the reference model; every other variant is measured against this one. A reference whose weights are
    stored in a 16-bit type (float16, bfloat16: quantized weights are refused), or that rounds activations to one
    between FP32 nodes, says so in its params and notes: it is the baseline every drop and
    speed-up is measured from, and it is not the float model. One computing in float64 says so in its params
    (`computes_in`, which the gate's note on a variant left as the reference reads) and notes."""
    reference = ctx.reference_path.resolve()
    if not reference.is_file():
        raise QbenchError(f"variant {spec.name!r}: the FP32 model {reference} does not exist")
    model = read_onnx(reference)
    # params.stored_weights is the reference's rounding as one note: weights stored in 16 bits, activations rounded so
    stored = "; it also ".join(filter(None, (stored_weights(model), rounded_activations(model)))) or None
    computes_in = reference_arithmetic(model)  # params.computes_in: a float64 graph is not computed in FP32
    return BuiltVariant(
        name=spec.name,
        precision="fp32",
        onnx_path=reference,
        params={"source": "the recipe's model, unchanged", **({"stored_weights": stored} if stored else {}),
                **({"computes_in": computes_in} if computes_in else {})},
        notes=tuple(note for note in (f"the FP32 reference {stored}" if stored else None,
                                      f"the FP32 reference computes in {computes_in}" if computes_in else None)
                    if note),
        borrowed=True,
    )
