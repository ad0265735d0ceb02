"""The FP32 reference must load on every backend the recipe names, checked before anything is built.

A model the runtime cannot load (an IR version or operator set newer than it knows, an operator of a domain no
provider implements) would otherwise fail every variant built from it, one long error per variant. A backend that
can check a model file cheaply declares `check_loads(path)` (qbench.backends.onnxruntime); one that runs a torch
module, or whose loading is a build of its own, does not, and reports at its first load as before."""

from __future__ import annotations

from pathlib import Path

from qbench.backends import get_backend
from qbench.errors import QbenchError, RecipeError
from qbench.recipe import Recipe


def check_reference_loads(recipe: Recipe, path: Path, field: str) -> None:
    """RecipeError at `field` (model.path / model.torch) naming the backend, the runtime's reason, the model's own
    version stamps and what the runtime implements, for the first backend that cannot load the model at `path`."""
    for index, name in enumerate(recipe.backends):
        backend = get_backend(name)
        check = getattr(backend, "check_loads", None)
        if check is None:
            continue
        try:
            check(path)
        except QbenchError as exc:
            where = f"{name} (backends[{index}])" if len(recipe.backends) > 1 else name
            raise RecipeError(recipe.source, field, f"{path}: the FP32 reference does not load on {where}: {exc}; "
                              f"{_stamps(path, backend)}") from None  # fmt: skip


def _stamps(path: Path, backend: object) -> str:
    """What the model asks for (IR version, operator sets) against what the backend's runtime implements, and the
    fix; just the fix where the file cannot be parsed."""
    import onnx

    fix = ("expected a model this runtime loads: export it at an IR version and opsets it supports, with operators "
           "it implements (or register the custom operators' library), or install a runtime that supports it")  # fmt: skip
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - the runtime's own reason already says what is wrong with the file
        return fix
    opsets = {entry.domain or "ai.onnx": entry.version for entry in model.opset_import}
    asked = ", ".join(f"{domain} {version}" for domain, version in opsets.items())
    implemented = getattr(backend, "implemented_opsets", lambda: {})()
    known = ", ".join(f"{domain} up to {implemented[domain]}" if domain in implemented else f"{domain} not at all"
                      for domain in {"ai.onnx": 0, **opsets})  # fmt: skip
    runtime = f"; the runtime implements opsets {known}" if implemented else ""
    return f"the model is IR version {model.ir_version} with opsets {asked}{runtime}; {fix}"
