"""Where the FP32 reference comes from: an ONNX file, or a PyTorch module exported once (cached).

`resolve_model(recipe)` returns the reference ONNX path every variant starts from, and,
for a PyTorch source, the `TorchModel` that QAT, ModelOpt and the torch backends use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qbench.recipe import Recipe

if TYPE_CHECKING:  # pragma: no cover
    from qbench.sources.torch_model import TorchModel


@dataclass(frozen=True)
class ModelSource:
    onnx_path: Path
    torch: TorchModel | None = None


def resolve_model(recipe: Recipe) -> ModelSource:
    """The recipe's model as an ONNX file (exporting a PyTorch source, or reusing its cached export)."""
    if recipe.model_path is not None:
        return ModelSource(onnx_path=recipe.model_path)
    from qbench.sources.torch_model import export_reference, load_torch_model

    torch_model = load_torch_model(recipe)
    return ModelSource(onnx_path=export_reference(torch_model), torch=torch_model)
