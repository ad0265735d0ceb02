"""Quantization-aware training (torchao PT2E) from the recipe's PyTorch model."""

from __future__ import annotations

from typing import ClassVar

from pydantic import model_validator

from qbench.techniques.base import TechniqueConfig
from qbench.techniques.calibrators import CALIBRATORS, Calibration
from qbench.techniques.options import ActivationType, PerChannel, QatSpec, ReduceRange, WeightType


class Qat(TechniqueConfig):
    """Fake-quantized fine-tuning; the calibrator's torchao observer sets the starting activation ranges."""

    precisions: ClassVar[tuple[str, ...]] = ("int8",)
    label: ClassVar[str] = "QAT"
    build_packages: ClassVar[tuple[str, ...]] = ("torch", "torchao")  # the training, PT2E and its export
    calibration: Calibration
    per_channel: PerChannel = False
    reduce_range: ReduceRange = "auto"
    activation_type: ActivationType = "uint8"
    weight_type: WeightType = "int8"
    symmetric_activations: bool = False
    qat: QatSpec

    @model_validator(mode="after")
    def _checks(self) -> Qat:
        if self.calibration.method.torchao_observer is None:
            usable = [name for name in CALIBRATORS if CALIBRATORS.get(name).torchao_observer]
            raise ValueError(
                f"calibrator: QAT starts from one calibration: choose {', '.join(usable[:-1])} or {usable[-1]}"
            )
        if self.weight_type != "int8":
            raise ValueError("weight_type: QAT builds int8 symmetric weights")
        return self
