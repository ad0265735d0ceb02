"""Calling a PyTorch source's factory (`model.torch: package.module:factory`) with the recipe's
`model.factory_arguments`: the module is imported like any Python code, with the recipe's folder first on sys.path,
and the arguments are checked against the factory's signature before it runs, so a constructor needing an argument
the recipe does not give is one line naming that field."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

from qbench.digests import file_sha256
from qbench.errors import RecipeError, did_you_mean
from qbench.recipe.spec import Recipe
from qbench.user_code import changed_after_import, edited_since_seen, first_on_sys_path

_FIELD = "model.factory_arguments"


def call_factory(recipe: Recipe, source: Path) -> Any:
    """What the recipe's factory returns when called with `model.factory_arguments` (keyword arguments)."""
    factory_name = recipe.model.torch or ""
    arguments = dict(recipe.model.factory_arguments)
    with first_on_sys_path(recipe.base_dir):
        factory = _import_factory(recipe, factory_name, source)
        _check_arguments(recipe, factory, arguments)
        try:
            return factory(**arguments)
        except Exception as exc:  # noqa: BLE001 - a failure in user code is reported, not a qbench bug
            message = f"calling {factory_name}({_shown(arguments)}) failed: {describe(exc)}"
            raise RecipeError(recipe.source, "model.torch", message) from exc


def _check_arguments(recipe: Recipe, factory: Any, arguments: dict[str, Any]) -> None:
    """Refuse arguments the factory cannot be called with: one it needs that is not given, or one it does not take."""
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):  # a built-in or C callable: its own error says what is wrong
        return
    named = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    name = recipe.model.torch
    for given in arguments:  # first: a misspelt argument also leaves the one it meant missing
        if given not in named and not any(p.kind is p.VAR_KEYWORD for p in parameters):
            takes = ", ".join(named) or "no arguments"
            message = f"{name}() takes no argument {given!r}{did_you_mean(given, named)}; it takes {takes}"
            raise RecipeError(recipe.source, f"{_FIELD}.{given}", message)
    needed = [p for p in parameters if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    for parameter in needed:
        if parameter.kind is parameter.POSITIONAL_ONLY:
            message = (f"{name}() needs its positional-only argument {parameter.name!r}, which the recipe cannot "
                       "pass by name; expected a factory taking keyword arguments")
            raise RecipeError(recipe.source, _FIELD, message)
        if parameter.name not in arguments:
            message = (f"{name}() needs argument {parameter.name!r}, which is not given; expected it in "
                       f"{_FIELD} (the factory's keyword arguments, e.g. {{{parameter.name}: ...}})")
            raise RecipeError(recipe.source, _FIELD, message)


def _shown(arguments: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in arguments.items())


def _import_factory(recipe: Recipe, factory_name: str, source: Path) -> Any:
    """Import the factory's module; refuse a module this process loaded from another file, or before an edit
    (the export and its cache key must come from the code on disk)."""
    module_name, _, attribute = factory_name.partition(":")
    importlib.invalidate_caches()  # the module may have been written a moment ago
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - a broken user module is a recipe problem
        raise RecipeError(recipe.source, "model.torch", f"importing {module_name!r} failed: {describe(exc)}") from exc
    loaded_from = Path(module.__file__).resolve() if getattr(module, "__file__", None) else None
    if loaded_from != source:
        message = f"{module_name!r} is already imported from {loaded_from}, not {source}; run qbench in a new process"
        raise RecipeError(recipe.source, "model.torch", message)
    sha = file_sha256(source)
    if edited_since_seen(module, sha):
        raise RecipeError(recipe.source, "model.torch", changed_after_import(source))
    factory = getattr(module, attribute, None)
    if factory is None:
        hint = did_you_mean(attribute, [name for name in dir(module) if not name.startswith("_")])
        raise RecipeError(recipe.source, "model.torch", f"module {module_name!r} has no attribute {attribute!r}{hint}")
    if not callable(factory):
        raise RecipeError(recipe.source, "model.torch", f"{factory_name} is {type(factory).__name__}, not a callable")
    return factory


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
