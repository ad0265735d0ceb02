"""A stand-in for a recipe's PyTorch source in tests of the torch forms (qbench.variants.torch_forms)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from torch import nn


@dataclass
class ModuleSource:
    """What the torch forms need of qbench.sources.torch_model.TorchModel: a fresh copy of `template` per build()."""

    template: nn.Module

    def build(self) -> nn.Module:
        return copy.deepcopy(self.template)
