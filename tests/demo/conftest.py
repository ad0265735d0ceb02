"""The digits demo project, trained and written once per test session (about 8 s on 2 cores)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# tests/ holds fixture builders shared across folders (user_model.py); there are no
# __init__.py files, so pytest only puts this folder on sys.path by itself.
TESTS_DIR = Path(__file__).resolve().parents[1]
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))


@pytest.fixture(scope="session")
def digits_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with models/digits.onnx, data/digits.parquet and recipes/digits.yaml (the repository's recipe)."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    from qbench.demo.digits import RECIPE_FILE, make_digits_demo

    root = tmp_path_factory.mktemp("digits_project")
    paths = make_digits_demo(root, seed=0)
    if paths.get("recipe") != root / RECIPE_FILE:
        pytest.fail(f"make_digits_demo did not copy {RECIPE_FILE} into {root}: {paths}")
    return root
