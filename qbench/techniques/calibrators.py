"""Calibrators: one object per calibrator, serving every quantizer that calibrates.

A `Calibrator` says which precisions it calibrates, which recipe options it takes and
what it is called by each quantizer: ONNX Runtime's `CalibrationMethod`, ModelOpt's
calibration (max, or its histogram method) and the torchao observer that QAT starts
from. `dynamic` computes no ranges (activations are quantized at run time) and `auto`
tries the static calibrators (qbench.fallback). Adding a calibrator: one object, one
`CALIBRATORS.register` line.

`Calibration` is a technique's calibrator with its options resolved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, field_validator

from qbench.errors import expected_one_of
from qbench.registry import Registry
from qbench.techniques.options import StrictConfig

DEFAULT_PERCENTILE = 99.999
DEFAULT_NUM_BINS = 2048
DEFAULT_NUM_QUANTIZED_BINS = 128


@dataclass(frozen=True)
class Calibrator:
    """One calibrator, as each quantizer knows it (None: that quantizer cannot use it)."""

    name: str
    precisions: tuple[str, ...]
    options: tuple[str, ...] = ()  # recipe options it takes: percentile, num_bins, num_quantized_bins
    onnxruntime: str | None = None  # onnxruntime.quantization.CalibrationMethod member
    modelopt: str | None = None  # "max", or ModelOpt's histogram method
    torchao_observer: str | None = None  # torch.ao observer class that QAT starts from

    @property
    def computes_ranges(self) -> bool:
        return self.onnxruntime is not None


CALIBRATORS: Registry[Calibrator] = Registry("calibrator")
CALIBRATORS.register("minmax", Calibrator("minmax", ("int8", "fp8"), (), "MinMax", "max", "MinMaxObserver"))
CALIBRATORS.register("entropy", Calibrator(
    "entropy", ("int8", "fp8"), ("num_bins", "num_quantized_bins"), "Entropy", "entropy",
    "HistogramObserver"))  # fmt: skip
CALIBRATORS.register("percentile", Calibrator(
    "percentile", ("int8", "fp8"), ("percentile", "num_bins"), "Percentile", "percentile",
    "HistogramObserver"))  # fmt: skip
CALIBRATORS.register("dynamic", Calibrator("dynamic", ("int8",)))  # activations quantized per batch at run time
CALIBRATORS.register("auto", Calibrator("auto", ("int8",)))  # the static calibrators tried, best kept (qbench.fallback)

CALIBRATOR_OPTIONS = ("percentile", "num_bins", "num_quantized_bins")
AUTO_CALIBRATORS = ("minmax", "entropy", "percentile", "dynamic")  # what `calibrator: auto` tries, in this order


def calibrator_names(precision: str) -> list[str]:
    """The calibrators that can calibrate `precision`."""
    return sorted(name for name in CALIBRATORS if precision in CALIBRATORS.get(name).precisions)


def calibrators_taking(option: str) -> list[str]:
    return [name for name in CALIBRATORS if option in CALIBRATORS.get(name).options]


class Calibration(StrictConfig):
    """A calibrator and its parameters, defaults resolved."""

    calibrator: str
    percentile: float = Field(DEFAULT_PERCENTILE, gt=0, le=100, description="percentile calibrator; default 99.999")
    num_bins: int = Field(DEFAULT_NUM_BINS, gt=0, description="histogram bins (entropy, percentile); default 2048")
    num_quantized_bins: int = Field(DEFAULT_NUM_QUANTIZED_BINS, gt=0, description="entropy target bins; default 128")

    @field_validator("calibrator")
    @classmethod
    def _registered(cls, value: str) -> str:
        if value not in CALIBRATORS:
            raise ValueError(expected_one_of(value, CALIBRATORS.names()))
        return value

    @property
    def method(self) -> Calibrator:
        return CALIBRATORS.get(self.calibrator)

    @property
    def static(self) -> bool:
        """Ranges fixed at build time (not `dynamic`)."""
        return self.calibrator != "dynamic"

    def params(self) -> dict[str, Any]:
        """The parameters this calibrator actually uses, for results and MLflow."""
        params: dict[str, Any] = {"calibrator": self.calibrator}
        params.update({option: getattr(self, option) for option in self.method.options})
        return params
