"""A PyTorch vision module fed uint8 pixels [B, H, W, 3] that normalises them itself (Cast, Sub, Div in the graph)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from qbench.recipe.spec import load_recipe  # noqa: E402
from qbench.sources.torch_export import export_reference  # noqa: E402
from qbench.sources.torch_model import load_torch_model  # noqa: E402

MODELS_SOURCE = '''
import torch
from torch import nn


class Normalising(nn.Module):
    """uint8 NHWC pixels in, the ImageNet normalisation inside forward(), class logits out."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 3)
        self.register_buffer("mean", torch.tensor([123.7, 116.3, 103.5]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([58.4, 57.1, 57.4]).view(1, 3, 1, 1))

    def forward(self, img):
        x = (img.permute(0, 3, 1, 2).float() - self.mean) / self.std
        return self.head(torch.relu(self.conv(x)).mean((2, 3)))
'''


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    yield
    for name in [m for m in sys.modules if m == "u8pkg" or m.startswith("u8pkg.")]:
        del sys.modules[name]


def _recipe(root: Path) -> Path:
    (root / "u8pkg").mkdir()
    (root / "u8pkg" / "__init__.py").write_text("")
    (root / "u8pkg" / "models.py").write_text(MODELS_SOURCE)
    pixels = np.random.default_rng(0).integers(0, 256, size=(40, 6, 6, 3), dtype=np.uint8)
    np.savez(root / "rows.npz", img=pixels, label=np.arange(40) % 3, split=np.array(["calib", "eval"] * 20))
    recipe = {
        "name": "uint8-torch", "task": "classification",
        "model": {"torch": "u8pkg.models:Normalising", "example_inputs": {"img": [1, 6, 6, 3]},
                  "input_dtypes": {"img": "uint8"}},
        "data": {"path": "rows.npz", "inputs": {"img": "img"}, "label": "label",
                 "calibration": {"filter": {"split": "calib"}}, "evaluation": {"filter": {"split": "eval"}}},
        "variants": [{"name": "fp16", "precision": "fp16"}], "backends": ["onnxruntime-cpu"],
    }  # fmt: skip
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def test_a_uint8_image_input_is_exported_as_uint8_and_computes_what_forward_does(tmp_path: Path) -> None:
    """`input_dtypes: {img: uint8}` was refused (`got 'uint8', expected one of bfloat16, bool, float16, float32, int32,
    int64`), so a module taking the pixels a camera gives could not be given as a factory."""
    model = load_torch_model(load_recipe(_recipe(tmp_path)))
    (example,) = model.example_inputs(batch=2)
    assert example.dtype == torch.uint8 and example.shape == (2, 6, 6, 3)
    assert int(example.min()) < 64 and int(example.max()) > 192  # pixels across the range, not an all-black image
    session = ort.InferenceSession(str(export_reference(model)), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type) for i in session.get_inputs()] == [("img", "tensor(uint8)")]
    pixels = np.random.default_rng(1).integers(0, 256, size=(5, 6, 6, 3), dtype=np.uint8)
    (logits,) = session.run(None, {"img": pixels})
    with torch.no_grad():
        expected = model.build()(torch.from_numpy(pixels)).numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=1e-5)
