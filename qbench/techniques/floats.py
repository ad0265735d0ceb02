"""Float precisions: the FP32 reference and the FP16 / BF16 casts. They take no quantization option."""

from __future__ import annotations

from typing import ClassVar

from qbench.techniques.base import TechniqueConfig


class FloatCast(TechniqueConfig):
    """FP32 (the reference), FP16 (a cast, FP32 kept where values overflow) or BF16 (simulated by rounding)."""

    precisions: ClassVar[tuple[str, ...]] = ("fp32", "fp16", "bf16")
    label: ClassVar[str] = "float"
    build_packages: ClassVar[tuple[str, ...]] = ("ml_dtypes",)  # BF16 rounding, FP16 range checks

    @classmethod
    def foreign_option(cls, option: str, precision: str) -> str:
        return f"{option}: applies only to int8/fp8 variants, not {precision}"
