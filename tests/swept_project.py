"""A user's Python project swept once for the gate tests: its folder importable while `qbench sweep` runs (installed,
or on PYTHONPATH, as users have it), its modules forgotten after so that the next project's import finds its own;
and the brief FP16 recipe those tests sweep."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Collection, Iterator
from pathlib import Path

import yaml

from qbench.cli.app import main


def fp16_recipe(name: str, model: dict, data: dict, *, gate_metric: str = "agreement", **sections: object) -> dict:
    """A recipe of `model` on `data` building FP16 alone, timed briefly on ONNX Runtime's CPU backend, gated on
    `gate_metric` (max_drop 0.05, a pass on too few rows noted), its runs under runs/; `sections` added as given."""
    return {"name": name, "model": model, "data": data, **sections,
            "variants": [{"name": "fp16", "precision": "fp16"}], "backends": ["onnxruntime-cpu"],
            "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 2},
            "gate": {"metric": gate_metric, "max_drop": 0.05, "unresolved": "note"}, "output_dir": "runs"}  # fmt: skip


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
