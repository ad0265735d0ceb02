"""FP8 E4M3 with ONNX Runtime: Q/DQ with calibrated ranges (a simulation on CPU)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import model_validator

from qbench.techniques.base import TechniqueConfig
from qbench.techniques.calibrators import Calibration
from qbench.techniques.options import ExcludeNodes, KeepFloat, OpTypes, PerChannel

# What the FP8 builder puts Q/DQ in front of: the standard contractions. A com.microsoft Attention of an
# optimize_model BERT (or any other op named here) is refused with the recipe, not once the sweep has started.
OP_TYPES = ("Conv", "ConvTranspose", "Gemm", "MatMul")


class Fp8(TechniqueConfig):
    precisions: ClassVar[tuple[str, ...]] = ("fp8",)
    label: ClassVar[str] = "fp8"
    build_packages: ClassVar[tuple[str, ...]] = ("ml_dtypes",)  # the E4M3 grid
    selectors: ClassVar[frozenset[str]] = frozenset({"quantizer"})
    calibration: Calibration
    per_channel: PerChannel = False
    op_types: OpTypes | None = None
    exclude_nodes: ExcludeNodes = []
    keep_float: KeepFloat = []

    @model_validator(mode="after")
    def _static(self) -> Fp8:
        if not self.calibration.method.computes_ranges:
            raise ValueError(f"calibrator: fp8 needs calibrated ranges, not {self.calibration.calibrator!r}")
        unsupported = sorted(set(self.op_types or ()) - set(OP_TYPES))
        if unsupported:
            raise ValueError(f"op_types: fp8 cannot quantize {', '.join(unsupported)}; "
                             f"expected some of {', '.join(OP_TYPES)}")
        return self
