"""The search's candidates: technique families and their options, each built through the recipe's variant handlers.

    ort-dynamic          ONNX Runtime dynamic INT8, per-channel weights
    smoothquant-dynamic  SmoothQuant, then INT8 Linear inputs (scales per batch) and weights, one per alpha
    smoothquant-static   the same with calibrated (static) activation scales
    ort-static           ONNX Runtime static Q/DQ (minmax), per-channel weights, compute ops only
                         (Conv, MatMul, Gemm)

`ort-static` candidates, like every static INT8 variant, keep attention-mask arithmetic float (the `masks`
rule, qbench.variants.float_rules.DEFAULT_RULES): no candidate rounds real attention scores on a mask fill's range.

Families without activation calibration come first (cheapest to build). Each base candidate has a
reduce_range twin (7-bit weights: on CPUs without VNNI it avoids u8s8 saturation but costs a bit of
accuracy); it runs the same kernels, so it is only tried when its base did not pass, and its screen takes the
base's speed-up where its graph shows those kernels (qbench.search.run). A keep-float
candidate is any of these with nodes named by the sensitivity ranking left in floating point
(`exclude_nodes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from qbench.recipe.search import SearchSpec
from qbench.recipe.spec import SmoothQuantSpec, VariantSpec

STATIC_OP_TYPES = ("Conv", "MatMul", "Gemm")  # where INT8 kernels save time; the rest stays float


@dataclass(frozen=True)
class Candidate:
    technique: str
    options: dict[str, Any] = field(default_factory=dict)
    keep_float: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """A short name: technique and its options, then how many nodes stay float."""
        parts = [self.technique]
        if "alpha" in self.options:
            parts.append(f"a={self.options['alpha']}")
        if self.options.get("reduce_range"):
            parts.append("rr")
        label = " ".join(parts)
        return f"{label} +{len(self.keep_float)} float" if self.keep_float else label

    def keeping(self, nodes: Sequence[str]) -> Candidate:
        return Candidate(self.technique, self.options, tuple(nodes))

    def reduced_range(self) -> Candidate:
        """The same candidate with 7-bit weights (same kernels, so the same speed)."""
        return Candidate(self.technique, {**self.options, "reduce_range": True}, self.keep_float)

    def spec(self, name: str) -> VariantSpec:
        """The variant spec that builds this candidate (through qbench.variants.build_variant)."""
        common: dict[str, Any] = {"name": name, "precision": "int8", "exclude_nodes": list(self.keep_float),
                                  "reduce_range": bool(self.options.get("reduce_range", False))}  # fmt: skip
        if self.technique == "ort-dynamic":
            return VariantSpec(**common, calibrator="dynamic", per_channel=True)
        if self.technique == "ort-static":
            return VariantSpec(**common, calibrator="minmax", per_channel=True, op_types=list(STATIC_OP_TYPES))
        calibrator = "dynamic" if self.technique == "smoothquant-dynamic" else "minmax"
        return VariantSpec(**common, calibrator=calibrator, smoothquant=SmoothQuantSpec(alpha=self.options["alpha"]))


def catalogue(spec: SearchSpec) -> list[Candidate]:
    """Every base candidate of the recipe's search (full 8-bit weights), in the order they are tried."""
    found: list[Candidate] = []
    for technique in spec.families:
        if technique.startswith("ort-"):
            found.append(Candidate(technique, {"reduce_range": False}))
        else:
            found += [Candidate(technique, {"alpha": alpha, "reduce_range": False}) for alpha in spec.alphas]
    return found
