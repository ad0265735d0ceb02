"""Where the FP32 reference comes from: an ONNX file, or a PyTorch module exported once (cached).

`resolve_model(recipe)` returns the reference ONNX path every variant starts from, and,
for a PyTorch source, the `TorchModel` that QAT, ModelOpt and the torch backends use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qbench.errors import RecipeError
from qbench.recipe.spec import Recipe

if TYPE_CHECKING:  # pragma: no cover
    from qbench.execute.snapshot import Snapshot
    from qbench.sources.torch_model import TorchModel


@dataclass(frozen=True)
class ModelSource:
    onnx_path: Path
    torch: TorchModel | None = None


def resolve_model(recipe: Recipe, snapshot: Snapshot | None = None) -> ModelSource:
    """The recipe's model as an ONNX file (exporting a PyTorch source, or reusing its cached export).

    With a sweep's `snapshot`, the ONNX model and the PyTorch weights are its copies; the factory's module,
    imported from the user's file, must be the source whose digest the sweep recorded."""
    if recipe.model_path is not None:
        return ModelSource(onnx_path=snapshot.path("model", recipe.model_path) if snapshot else recipe.model_path)
    from qbench.sources.torch_export import ExportError, export_reference
    from qbench.sources.torch_model import load_torch_model

    weights = recipe.weights_path
    torch_model = load_torch_model(recipe,
                                   weights=snapshot.path("model.weights", weights) if snapshot and weights else weights)
    if snapshot is not None:
        snapshot.check_read("model.torch source", torch_model.factory_source_sha256)
    try:
        onnx_path = export_reference(torch_model)
    except ExportError as exc:  # the export is not the module: the field it names is what to change
        raise RecipeError(recipe.source, exc.field, str(exc)) from None
    return ModelSource(onnx_path=onnx_path, torch=torch_model)
