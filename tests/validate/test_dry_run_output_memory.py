"""The dry run (`qbench validate`, the start of every sweep) says in one line when the evaluated outputs cannot fit in
memory: a language model's logits are rows x tokens x vocabulary floats (400 rows x 64 x 4000: 391 MiB a set, and a
measurement holds FP32's and a variant's), which nothing estimated before the sweep ran out of memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.backends import get_backend
from qbench.errors import RecipeError
from qbench.preflight.prepare import prepare
from qbench.recipe.spec import load_recipe
from qbench.validate.dry_run import dry_run

ROWS, TOKENS, VOCABULARY = 40, 8, 500
PER_ROW = TOKENS * VOCABULARY * 4  # float32 logits: 16,000 bytes a row


def _tiny_lm(tmp_path: Path) -> Path:
    """input_ids [batch, 8] -> logits [batch, 8, 500]: an embedding (Gather) and a projection onto the vocabulary."""
    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "input_ids"], ["h"]), helper.make_node("MatMul", ["h", "w"], ["logits"])],
        "lm", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", TOKENS])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", TOKENS, VOCABULARY])],
        initializer=[numpy_helper.from_array(rng.normal(size=(VOCABULARY, 16)).astype(np.float32), "emb"),
                     numpy_helper.from_array(rng.normal(size=(16, VOCABULARY)).astype(np.float32), "w")],
    )  # fmt: skip
    path = tmp_path / "lm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _prepared(tmp_path: Path):
    rng = np.random.default_rng(4)
    ids = rng.integers(1, VOCABULARY, size=(ROWS, TOKENS))
    labels = np.concatenate([ids[:, 1:], np.full((ROWS, 1), -100)], axis=1)  # the next token; none after the last
    table = pd.DataFrame({"ids": list(ids), "next": list(labels), "split": ["eval"] * ROWS})
    table.to_parquet(tmp_path / "rows.parquet")
    recipe = {"name": "lm", "task": "classification", "model": {"path": str(_tiny_lm(tmp_path))},
              "data": {"path": "rows.parquet", "inputs": {"ids": "input_ids"}, "label": "next",
                       "evaluation": {"batch_size": 8}},
              "variants": [{"name": "fp16", "precision": "fp16"}], "backends": ["onnxruntime-cpu"],
              "latency": {"batch_sizes": [1, 8]}, "output_dir": "reports", "analysis": {"ranges": False}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return prepare(load_recipe(tmp_path / "recipe.yaml"))


def test_outputs_that_cannot_fit_in_memory_stop_the_dry_run_in_one_line(tmp_path, monkeypatch):
    prepared = _prepared(tmp_path)
    needed = 2 * PER_ROW * ROWS  # FP32's and a variant's logits of the 40 evaluation rows: 1,280,000 bytes
    monkeypatch.setattr("qbench.preflight.checks.available_memory", lambda: needed)
    dry_run(prepared, get_backend("onnxruntime-cpu"))
    monkeypatch.setattr("qbench.preflight.checks.available_memory", lambda: needed - 1)
    with pytest.raises(RecipeError) as caught:
        dry_run(prepared, get_backend("onnxruntime-cpu"))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'recipe.yaml'}: data.evaluation.limit: 40 evaluation rows need at least ")
    assert "(0.02 MiB per row: 'logits' [8, 500] float32; FP32's and a variant's are held at once)" in message
    assert "expected at most 39 rows (data.evaluation.limit)" in message and "\n" not in message
