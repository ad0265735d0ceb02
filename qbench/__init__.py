"""qbench: which precision variant of a model can you ship?

The library API (what the CLI calls) is importable without loading torch,
onnxruntime or mlflow; those are imported by the modules that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["__version__", "load_recipe", "run_sweep", "run_gate", "QbenchError"]

if TYPE_CHECKING:  # pragma: no cover
    from qbench.errors import QbenchError
    from qbench.gate.run import run_gate
    from qbench.recipe.spec import load_recipe
    from qbench.sweep.runner import run_sweep

_LAZY = {
    "load_recipe": "qbench.recipe.spec",
    "run_sweep": "qbench.sweep.runner",
    "run_gate": "qbench.gate.run",
    "QbenchError": "qbench.errors",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'qbench' has no attribute {name!r}")
