"""ONNX Runtime's quantizer: static INT8 (QDQ with calibrated ranges) and dynamic INT8 (IntegerOps)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from qbench.techniques.base import TechniqueConfig
from qbench.techniques.calibrators import Calibration
from qbench.techniques.options import (
    ActivationType,
    ExcludeNodes,
    FallbackSpec,
    KeepFloat,
    OpTypes,
    PerChannel,
    ReduceRange,
    WeightType,
)


class OrtInt8(TechniqueConfig):
    """What static and dynamic INT8 share."""

    precisions: ClassVar[tuple[str, ...]] = ("int8",)
    calibration: Calibration
    per_channel: PerChannel = False
    reduce_range: ReduceRange = "auto"
    weight_type: WeightType = "int8"
    op_types: OpTypes | None = None
    exclude_nodes: ExcludeNodes = []
    keep_float: KeepFloat = []
    fallback: FallbackSpec | None = Field(
        None, description="keep the costliest nodes in floating point until the gate holds"
    )


class OrtStatic(OrtInt8):
    """Static INT8 QDQ: activation ranges from calibration (minmax / entropy / percentile, or auto: the best of
    them)."""

    label: ClassVar[str] = "int8"
    selectors: ClassVar[frozenset[str]] = frozenset({"quantizer"})
    activation_type: ActivationType = "uint8"
    symmetric_activations: bool = False

    @model_validator(mode="after")
    def _static(self) -> OrtStatic:
        if not self.calibration.method.computes_ranges and self.calibration.calibrator != "auto":
            raise ValueError(f"calibrator: {self.calibration.calibrator!r} is not a static calibrator")
        if self.activation_type == "int8" and self.weight_type == "uint8":  # ORT's static quantizer refuses S8U8
            raise ValueError("weight_type: uint8 weights with int8 activations are not a format ONNX Runtime "
                             "quantizes; expected weight_type: int8, or activation_type: uint8")  # fmt: skip
        return self


class OrtDynamic(OrtInt8):
    """Dynamic INT8: weights quantized at build time, activations per batch at run time."""

    label: ClassVar[str] = "dynamic int8"

    @model_validator(mode="after")
    def _dynamic(self) -> OrtDynamic:
        if self.calibration.calibrator != "dynamic":
            raise ValueError(
                f"calibrator: dynamic int8 takes calibrator 'dynamic', not {self.calibration.calibrator!r}"
            )
        return self
