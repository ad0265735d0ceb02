"""Fixtures of the backend tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from matmul_model import save_matmul_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """y = x @ WEIGHT, x: (batch, 3) float32 (a test module may define its own model_path, which it then uses)."""
    return save_matmul_model(tmp_path_factory.mktemp("model") / "matmul.onnx")
