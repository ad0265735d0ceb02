"""INT8 on the inputs and weights of Linears only (float outputs), optionally after SmoothQuant.

Linears are chosen by rule on the ONNX graph (a MatMul/Gemm with a constant 2-D weight), so
these serve every model, not only PyTorch sources. Calibrator `minmax` quantizes the inputs
with static per-tensor scales, `dynamic` per batch at run time.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import model_validator

from qbench.errors import expected_one_of
from qbench.techniques.base import TechniqueConfig
from qbench.techniques.calibrators import Calibration
from qbench.techniques.options import (
    ActivationType,
    ExcludeNodes,
    KeepFloat,
    PerChannel,
    ReduceRange,
    SmoothQuantSpec,
    WeightType,
)

LINEAR_CALIBRATORS = ("minmax", "dynamic")
_STATIC_ONLY = ("activation_type", "symmetric_activations")


class LinearInt8(TechniqueConfig):
    """INT8 Linear inputs and weights; every output and every other op stays float."""

    precisions: ClassVar[tuple[str, ...]] = ("int8",)
    label: ClassVar[str] = "linear"
    selectors: ClassVar[frozenset[str]] = frozenset({"quantizer"})
    calibration: Calibration
    per_channel: PerChannel = True  # per-channel weights by default: the weights carry the outliers
    reduce_range: ReduceRange = "auto"
    activation_type: ActivationType = "uint8"
    weight_type: WeightType = "int8"
    symmetric_activations: bool = False
    exclude_nodes: ExcludeNodes = []
    keep_float: KeepFloat = []

    @property
    def dynamic(self) -> bool:
        return self.calibration.calibrator == "dynamic"

    @model_validator(mode="after")
    def _checks(self) -> LinearInt8:
        if self.calibration.calibrator not in LINEAR_CALIBRATORS:
            raise ValueError(
                f"calibrator: {expected_one_of(self.calibration.calibrator, LINEAR_CALIBRATORS)} "
                f"with {self.label.lower()}"
            )
        if self.weight_type != "int8":
            raise ValueError(f"weight_type: {self.label.lower()} quantizes weights to int8 only")
        if self.dynamic:
            given = [option for option in _STATIC_ONLY if option in self.model_fields_set]
            if given:
                raise ValueError(f"{given[0]}: does not apply to dynamic int8 variants")
        return self


class SmoothQuant(LinearInt8):
    """SmoothQuant on the ONNX graph, then `LinearInt8`."""

    label: ClassVar[str] = "SmoothQuant"
    smoothquant: SmoothQuantSpec
