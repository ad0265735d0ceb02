"""FP8 E4M3 with ONNX Runtime: Q/DQ with calibrated ranges (a simulation on CPU)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import model_validator

from qbench.techniques.base import TechniqueConfig
from qbench.techniques.calibrators import Calibration
from qbench.techniques.options import ExcludeNodes, KeepFloat, OpTypes, PerChannel


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
        return self
