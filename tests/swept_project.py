"""A user's Python project swept once for the gate tests: its folder importable while `qbench sweep` runs (installed,
or on PYTHONPATH, as users have it), its modules forgotten after so that the next project's import finds its own."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Collection, Iterator
from pathlib import Path

import yaml

from qbench.cli.app import main


@contextlib.contextmanager
def swept_project(root: Path, recipe: dict, packages: Collection[str]) -> Iterator[Path]:
    """`recipe` written to root/recipe.yaml and swept once (no tracking) with `root` importable; the recipe file.
    `root` leaves sys.path once the sweep is done (a gate judges the project as it finds it); `packages`, the
    top-level names of the project's modules, leave sys.modules when the caller is done."""
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    sys.path.insert(0, str(root))
    try:
        try:
            assert main(["sweep", str(path), "--no-track"]) == 0
        finally:
            sys.path.remove(str(root))
        yield path
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] in packages]:
            del sys.modules[name]
