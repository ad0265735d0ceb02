"""Finding and importing code a recipe names ('package.module:function'): a torch factory, a custom metric.

Trust model: such code is what the user chose to run, imported like any Python import with the
recipe's folder first on `sys.path`. Finding its source file (for digests) imports nothing.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path


def module_source(module_name: str, search_dir: Path) -> Path | None:
    """The file `import module_name` would load, looking in `search_dir` first; parents are not imported."""
    top, *rest = module_name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(top, [str(search_dir)])
    if spec is None:
        with first_on_sys_path(search_dir), contextlib.suppress(ValueError):  # ValueError: no __spec__
            spec = importlib.util.find_spec(top)  # installed, editable installs, already imported
    for depth in range(1, len(rest) + 1):
        if spec is None or spec.submodule_search_locations is None:
            return None
        name = ".".join([top, *rest[:depth]])
        spec = importlib.machinery.PathFinder.find_spec(name, list(spec.submodule_search_locations))
    if spec is None or not spec.has_location or spec.origin is None:
        return None
    return Path(spec.origin).resolve()


def not_found(module_name: str, search_dir: Path) -> str:
    return f"cannot find module {module_name!r} (with a source file) in {search_dir} or on sys.path"


@contextlib.contextmanager
def first_on_sys_path(folder: Path) -> Iterator[None]:
    entry = str(folder)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        sys.path.remove(entry)
