"""What a technique is: a typed config (its options and their checks) and one handler that builds it.

A `TechniqueConfig` subclass declares its options as pydantic fields, named as the recipe's
flat variant fields that feed them (`per_channel`, `exclude_nodes`, a `smoothquant:` block...;
the calibrator fields become one `calibration`), the precisions it builds, and how errors name
its variants. Its cross-field checks are its own validators; an option it does not declare is
rejected when a recipe sets it. The handler is a ``"module:function"`` target
(`VariantBuilder`), imported only when a variant of that technique is built.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from qbench.techniques.options import StrictConfig

# Distributions whose code computes every build: ONNX, ONNX Runtime (its quantizer, its optimizer, the sessions that
# calibrate and check ranges; `onnxruntime-gpu` installs the same module) and numpy. A build's content key holds
# their versions (qbench.execute.plan.build_facts), with those of its technique's `build_packages`.
BUILD_PACKAGES = ("onnx", "onnxruntime", "onnxruntime-gpu", "numpy")

if TYPE_CHECKING:  # pragma: no cover
    from qbench.variants.base import VariantBuilder


class TechniqueConfig(StrictConfig):
    """A technique's options. Subclasses set `precisions` and `label` and declare their fields."""

    precisions: ClassVar[tuple[str, ...]]
    label: ClassVar[str]  # how an error names this kind of variant: "dynamic int8", "QAT", ...
    # selector fields this technique accepts without taking them as options (e.g. quantizer: onnxruntime)
    selectors: ClassVar[frozenset[str]] = frozenset()
    # distributions beyond BUILD_PACKAGES whose code its handler builds with (their versions are in the build's key)
    build_packages: ClassVar[tuple[str, ...]] = ()

    def machine_facts(self) -> dict[str, str]:
        """The facts of this machine its build reads, part of the build's content key: a build made on another kind
        of machine is never handed to this one. A technique with a `reduce_range` option reads whether this is an
        x86 CPU without VNNI: `auto` then chooses 7-bit weights, and an INT8 build notes int8 weights there."""
        if "reduce_range" not in type(self).model_fields:
            return {}
        from qbench.environment import needs_reduce_range

        return {"x86_without_vnni": str(needs_reduce_range())}

    @classmethod
    def foreign_option(cls, option: str, precision: str) -> str:
        """The error for a recipe option this technique does not take ('field: message')."""
        return f"{option}: does not apply to {cls.label} variants"


@dataclass(frozen=True)
class Technique:
    """A registry entry: the config class and its handler (a lazy ``"module:function"`` target, or the function)."""

    config: type[TechniqueConfig]
    handler: str | VariantBuilder

    def builder(self) -> VariantBuilder:
        if not isinstance(self.handler, str):
            return self.handler
        module, _, attr = self.handler.partition(":")
        return getattr(importlib.import_module(module), attr)
