"""Reading a PyTorch source's weights: a plain state_dict, loaded with `torch.load(weights_only=True)` (a file holding
pickled Python objects could run code: it is refused, never loaded), and fitted to the module strictly, with a hint
when the keys differ only by a wrapper's prefix; a module built on the meta device takes the file's tensors."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from qbench.errors import RecipeError
from qbench.recipe.spec import Recipe

if TYPE_CHECKING:  # pragma: no cover
    import torch


def load_weights(recipe: Recipe, module: torch.nn.Module, path: Path) -> None:
    """Load the state_dict at `path` into `module`, strictly; every problem is a RecipeError at model.weights."""
    _load_weights(recipe, module, _read_state_dict(recipe, path))


def refuse_meta_tensors(recipe: Recipe, module: torch.nn.Module, weights: Path | None) -> None:
    """Refuse a module whose tensors are still on the meta device (shapes without values, as a factory building
    under `torch.device("meta")` leaves them): forward() on it failed as a device mismatch blamed on
    model.example_inputs, and weights loaded into it were silently not copied."""
    named = (*module.named_parameters(), *module.named_buffers())
    meta = [name for name, tensor in named if tensor.is_meta]
    if not meta:
        return
    shown = ", ".join(meta[:3]) + (f" (and {len(meta) - 3} more)" if len(meta) > 3 else "")
    if weights is None:
        message = (f"{recipe.model.torch}() built the module on the meta device (shapes, no values): {shown}; "
                   "expected model.weights, a state_dict holding its tensors, or a factory that builds it on the CPU")
    else:
        message = (f"{shown} stay on the meta device (no values) after loading {weights}: the file does not hold "
                   "them (a non-persistent buffer is never saved); expected a factory that builds those on the CPU")
    raise RecipeError(recipe.source, "model.weights", message)


def _read_state_dict(recipe: Recipe, path: Path) -> Mapping[str, torch.Tensor]:
    """A plain state_dict from `path`; a file holding pickled Python objects is refused, not loaded."""
    import pickle

    import torch  # the module was built: torch is installed
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if not _holds_pickled_objects(exc):
            raise RecipeError(recipe.source, "model.weights",
                              f"cannot read {path}: {type(exc).__name__}: {exc}") from None
        raise RecipeError(
            recipe.source, "model.weights",
            f"{path} refused: it holds pickled Python objects, which could run code; "
            "save a plain state_dict with torch.save(model.state_dict(), path)",
        ) from None  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a file that is not a checkpoint
        raise RecipeError(recipe.source, "model.weights", f"cannot read {path}: {type(exc).__name__}: {exc}") from None
    if not isinstance(state, Mapping):
        message = f"expected a state_dict (name -> tensor), got {type(state).__name__}"
        raise RecipeError(recipe.source, "model.weights", message)
    odd = next(((name, value) for name, value in state.items() if not isinstance(value, torch.Tensor)), None)
    if odd is not None:
        message = (
            f"expected a state_dict (name -> tensor), but entry {odd[0]!r} holds {type(odd[1]).__name__}; "
            "if the state_dict sits inside a checkpoint, save that entry alone"
        )
        raise RecipeError(recipe.source, "model.weights", message)
    return state


def _holds_pickled_objects(exc: Exception) -> bool:
    """Whether torch's weights-only unpickler stopped at a Python object (a 'global') rather than at bytes it
    cannot parse. Unknown wording counts as pickled objects: the file is refused either way, never loaded."""
    _, marker, detail = str(exc).lower().partition("weightsunpickler error:")
    return not marker or "global" in detail


def _load_weights(recipe: Recipe, module: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load `state` strictly: exactly the keys torch's `load_state_dict(strict=True)` accepts, with the same shapes.

    torch's own verdict, not a comparison with `module.state_dict()`'s keys: modules fill in some keys an
    older state_dict lacks (BatchNorm's `num_batches_tracked`, added in torch 0.4.1, when the file records
    no version or an older one), and a stricter check would refuse checkpoints torch loads."""
    expected = set(module.state_dict())
    on_meta = any(tensor.is_meta for tensor in (*module.parameters(), *module.buffers()))
    try:  # a module built on the meta device holds no values to copy into: the file's tensors take their place
        result = module.load_state_dict(state, strict=False, assign=on_meta)  # the module is dropped on any error below
    except RuntimeError as exc:  # shape mismatches
        raise RecipeError(recipe.source, "model.weights", f"the state_dict does not fit the module: {exc}") from None
    missing, unexpected = sorted(result.missing_keys), sorted(result.unexpected_keys)
    if missing or unexpected:
        listed = {"missing": missing, "unexpected": unexpected}
        parts = "; ".join(f"{label} {_first_few(keys)}" for label, keys in listed.items() if keys)
        message = f"the state_dict does not match the module's keys: {parts}{_prefix_hint(expected, set(state))}"
        raise RecipeError(recipe.source, "model.weights", message)


_EXTRA_PREFIX = ("every key in the file starts with {0!r} (a wrapper's state_dict: DataParallel's 'module.', "
                 "torch.compile's '_orig_mod.'); save the wrapped "
                 "module's own state_dict, or strip {0!r} from the keys")
_MISSING_PREFIX = ("the file's keys lack the module's prefix {0!r}: it holds "
                   "that submodule's state_dict; save the whole module's")


def _prefix_hint(expected: set[str], given: set[str]) -> str:
    """Why the keys differ when they differ only by a prefix: the file's keys carry one (a wrapper's state_dict),
    or lack the module's (the state_dict of a part of it)."""
    for longer, shorter, cause in ((given, expected, _EXTRA_PREFIX), (expected, given, _MISSING_PREFIX)):
        first = min(longer, default="")
        for cut in (i + 1 for i, char in enumerate(first) if char == "."):
            prefix = first[:cut]
            if all(key.startswith(prefix) for key in longer) and {key[cut:] for key in longer} == shorter:
                return f" ({cause.format(prefix)})"
    return ""


def _first_few(keys: list[str], limit: int = 3) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return f"{shown} (and {len(keys) - limit} more)" if len(keys) > limit else shown
