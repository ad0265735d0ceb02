"""`import qbench` (and the recipe/gate path the CLI takes first) must not load heavy SDKs."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "onnxruntime", "mlflow", "modelopt", "tensorrt")


def imported_after(statement: str) -> list[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    output = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return [m for m in json.loads(output) if m.split(".")[0] in HEAVY]


def test_import_qbench_loads_no_heavy_sdk():
    assert imported_after("import qbench") == []


def test_recipe_gate_and_registries_load_no_heavy_sdk():
    statement = "import qbench.recipe, qbench.gate, qbench.cli, qbench.variants, qbench.backends, qbench.results"
    assert imported_after(statement) == []
