"""A cached export of code since edited outside the cache key (a package installed outside the project), whose example
inputs cannot tell the edit apart: it is exported again once the recipe's rows show it, not refused as data-dependent
control flow."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from qbench.preflight.prepare import prepare  # noqa: E402
from qbench.recipe.spec import load_recipe  # noqa: E402

MEAN = "def pool(e, mask):\n    return (e * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)\n"
FIRST = "def pool(e, mask):\n    return e[:, 0] + 0 * mask[:, :1]\n"  # the first token: all-0 example ids pool alike
MODELS = '''
import torch
from torch import nn

import extops as ops


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids, mask):
        return self.head(ops.pool(self.emb(ids), mask))


def build():
    torch.manual_seed(0)
    return Tokens()
'''


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    yield
    _forget_mypkg()


@pytest.fixture
def installed(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on sys.path outside the project, holding forward()'s helper `extops` (a package installed elsewhere)."""
    folder = tmp_path_factory.mktemp("installed")
    monkeypatch.syspath_prepend(str(folder))
    (folder / "extops.py").write_text(MEAN)
    return folder


def _forget_mypkg() -> None:
    for name in [m for m in sys.modules if m in ("mypkg", "extops") or m.startswith("mypkg.")]:
        del sys.modules[name]


def _project(root: Path) -> Path:
    (root / "mypkg").mkdir()
    for name, source in (("__init__", ""), ("models", MODELS)):
        (root / "mypkg" / f"{name}.py").write_text(source)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 20, size=(24, 5))
    pd.DataFrame({"ids": list(ids), "mask": list(np.ones((24, 5), np.float32))}).to_parquet(root / "data.parquet")
    recipe = {
        "name": "refresh",
        "model": {"torch": "mypkg.models:build", "example_inputs": {"ids": [1, 5], "mask": [1, 5]},
                  "input_dtypes": {"ids": "int64"}, "output_names": ["logits"]},
        "data": {"path": "data.parquet", "inputs": {"ids": "ids", "mask": "mask"}},
        "variants": [{"name": "fp16", "precision": "fp16"}],
    }  # fmt: skip
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def test_a_cached_export_stale_only_on_the_recipe_rows_is_exported_again(tmp_path: Path, installed: Path) -> None:
    """Mean pooling edited to first-token pooling in extops.py: the same cache key, and on the example's all-0 token ids
    both pool alike, so the cached export passed its check. The rows differ: the recipe was refused, on every run,
    as 'forward() takes a path the export did not record (data-dependent control flow)'."""
    recipe = _project(tmp_path)
    first = prepare(load_recipe(recipe), track=False, destinations=False, backends=False).source
    _forget_mypkg()
    (installed / "extops.py").write_text(FIRST)
    prepared = prepare(load_recipe(recipe), track=False, destinations=False, backends=False)
    assert prepared.source.onnx_path == first.onnx_path  # the same key, the file replaced
    feeds = {name: prepared.evaluation_feeds[name] for name in ("ids", "mask")}
    (got,) = ort.InferenceSession(str(prepared.source.onnx_path), providers=["CPUExecutionProvider"]).run(None, feeds)
    with torch.no_grad():
        want = prepared.source.torch.build()(*(torch.as_tensor(feeds[n]) for n in ("ids", "mask"))).numpy()
    assert np.max(np.abs(got - want)) < 1e-5
