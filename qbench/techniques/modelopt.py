"""NVIDIA ModelOpt as the quantizer (`quantizer: modelopt`): INT8 / FP8 from the recipe's PyTorch model,
INT8 SmoothQuant with a `smoothquant:` block."""

from __future__ import annotations

from typing import ClassVar

from pydantic import model_validator

from qbench.techniques.base import TechniqueConfig
from qbench.techniques.calibrators import CALIBRATORS, Calibration
from qbench.techniques.options import ExcludeNodes, SmoothQuantSpec

# recipe options ModelOpt has no counterpart for: rejected rather than silently ignored
_UNSUPPORTED = {
    "reduce_range": "ModelOpt quantizes weights to the full 8 bits",
    "activation_type": "ModelOpt's activations are signed int8",
    "weight_type": "ModelOpt's weights are signed int8",
    "symmetric_activations": "ModelOpt's quantization is always symmetric",
    "op_types": "ModelOpt picks the layers by module type; keep layers in floating point with exclude_nodes",
    "num_quantized_bins": "ModelOpt's entropy calibrator always targets 128 bins for int8",
    "keep_float": "ModelOpt picks the layers by module type; keep layers in floating point with exclude_nodes",
}


class Modelopt(TechniqueConfig):
    precisions: ClassVar[tuple[str, ...]] = ("int8", "fp8")
    label: ClassVar[str] = "quantizer modelopt"
    build_packages: ClassVar[tuple[str, ...]] = ("nvidia-modelopt", "torch", "ml_dtypes")
    selectors: ClassVar[frozenset[str]] = frozenset({"quantizer"})
    precision: str  # int8 | fp8: ModelOpt's preset
    calibration: Calibration
    per_channel: bool | None = None  # None: the preset's choice
    exclude_nodes: ExcludeNodes = []
    smoothquant: SmoothQuantSpec | None = None  # INT8_SMOOTHQUANT_CFG with this alpha

    @classmethod
    def foreign_option(cls, option: str, precision: str) -> str:
        reason = f" ({_UNSUPPORTED[option]})" if option in _UNSUPPORTED else ""
        return f"{option}: does not apply to quantizer modelopt{reason}"

    @model_validator(mode="after")
    def _checks(self) -> Modelopt:
        calibrator = self.calibration.calibrator
        if self.calibration.method.modelopt is None:
            usable = ", ".join(name for name in CALIBRATORS if CALIBRATORS.get(name).modelopt)
            raise ValueError(f"calibrator: quantizer modelopt supports {usable}, not {calibrator!r}")
        if "num_quantized_bins" in self.calibration.model_fields_set:
            raise ValueError(self.foreign_option("num_quantized_bins", self.precision))
        if self.precision == "fp8" and calibrator == "entropy":
            raise ValueError(
                "calibrator: ModelOpt's entropy calibrator works on integer formats only; "
                "for fp8 it supports minmax (max) and percentile (histogram)"
            )
        if self.precision == "fp8" and self.per_channel:
            raise ValueError("per_channel: ModelOpt exports FP8 to ONNX with per-tensor scales only")
        if self.smoothquant is not None:
            if self.precision != "int8" or calibrator != "minmax":
                raise ValueError("smoothquant: ModelOpt's SmoothQuant applies to int8 with calibrator minmax")
            if self.smoothquant.alpha == "auto":
                raise ValueError("smoothquant.alpha: ModelOpt's SmoothQuant takes one alpha from 0 to 1, not 'auto'")
            others = sorted(self.smoothquant.model_fields_set - {"alpha"})
            if others:
                raise ValueError(f"smoothquant.{others[0]}: does not apply to quantizer modelopt (it takes alpha only)")
        return self
