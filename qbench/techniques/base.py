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

if TYPE_CHECKING:  # pragma: no cover
    from qbench.variants.base import VariantBuilder


class TechniqueConfig(StrictConfig):
    """A technique's options. Subclasses set `precisions` and `label` and declare their fields."""

    precisions: ClassVar[tuple[str, ...]]
    label: ClassVar[str]  # how an error names this kind of variant: "dynamic int8", "QAT", ...
    # selector fields this technique accepts without taking them as options (e.g. quantizer: onnxruntime)
    selectors: ClassVar[frozenset[str]] = frozenset()

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
