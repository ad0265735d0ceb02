"""The dry run (`qbench validate`, the start of every sweep) refuses in one line a classifier whose FP32 logits are
-inf at the same positions on every row, every class masked: every row would be FP32's failure (no class left to
decide among), so the sweep built every variant and then judged none (exit 2, one UNUSABLE line per variant and
scope). A finite fill (float32's minimum), a mask of some rows and a mask leaving some classes on every row (classes
ruled out, scored over those left) are not refused."""

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

ROWS, FEATURES, CLASSES = 40, 6, 4


def _masked_classifier(tmp_path: Path, fill: float, *, per_row: bool = False, classes: tuple[int, ...] = (3,)) -> Path:
    """x [batch, 6] -> logits [batch, 4] = x @ w, `classes` replaced by `fill` (on every row, or where x[:, 0] > 0)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["scores"])]
    if per_row:
        nodes += [helper.make_node("Slice", ["x", "zero", "one", "one"], ["first"]),
                  helper.make_node("Greater", ["first", "zero_f"], ["positive"]),
                  helper.make_node("And", ["positive", "column"], ["mask"])]  # fmt: skip
    nodes.append(helper.make_node("Where", ["mask" if per_row else "column", "fill", "scores"], ["logits"]))
    initializers = [numpy_helper.from_array(rng.normal(size=(FEATURES, CLASSES)).astype(np.float32), "w"),
                    numpy_helper.from_array(np.isin(np.arange(CLASSES), classes), "column"),
                    numpy_helper.from_array(np.array(fill, dtype=np.float32), "fill"),
                    numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
                    numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
                    numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero_f")]  # fmt: skip
    graph = helper.make_graph(nodes, "masked",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
                              initializer=initializers)  # fmt: skip
    path = tmp_path / "masked.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _prepared(tmp_path: Path, model: Path):
    rng = np.random.default_rng(1)
    table = pd.DataFrame({"x": list(rng.normal(size=(ROWS, FEATURES)).astype(np.float32)),
                          "label": rng.integers(0, 3, size=ROWS), "split": ["eval"] * ROWS})  # fmt: skip
    table.to_parquet(tmp_path / "rows.parquet")
    recipe = {"name": "masked", "task": "classification", "model": {"path": str(model)},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "label", "evaluation": {"batch_size": 8}},
              "variants": [{"name": "fp16", "precision": "fp16"}], "backends": ["onnxruntime-cpu"],
              "latency": {"batch_sizes": [1, 8]}, "output_dir": "reports", "analysis": {"ranges": False}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return prepare(load_recipe(tmp_path / "recipe.yaml"))


def test_every_class_masked_with_minus_inf_on_every_row_stops_the_dry_run_in_one_line(tmp_path):
    prepared = _prepared(tmp_path, _masked_classifier(tmp_path, -np.inf, classes=(0, 1, 2, 3)))
    with pytest.raises(RecipeError) as caught:
        dry_run(prepared, get_backend("onnxruntime-cpu"))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'recipe.yaml'}: model.path: output 'logits' of the FP32 model is -inf at "
                              "the same 4 of its 4 values per row (flat "
                              "positions 0, 1, 2, 3) on every evaluation row")  # fmt: skip
    assert "expected finite outputs: fill the mask with a finite value (float32's minimum, -3.4e38)" in message
    assert "\n" not in message


def test_a_finite_fill_and_a_mask_of_some_rows_pass_the_dry_run(tmp_path):
    finite = tmp_path / "finite"
    finite.mkdir()
    dry_run(_prepared(finite, _masked_classifier(finite, float(np.finfo(np.float32).min))),
            get_backend("onnxruntime-cpu"))  # fmt: skip
    some = tmp_path / "some"
    some.mkdir()
    # -inf only on rows whose first feature is positive: those rows are FP32's failures, the others are judged
    dry_run(_prepared(some, _masked_classifier(some, -np.inf, per_row=True)), get_backend("onnxruntime-cpu"))


def test_a_class_masked_on_every_row_the_dry_run_scores_is_a_class_ruled_out_not_refused(tmp_path):
    """Class 3 is -inf on every row the dry run scores: classification reads it as a class ruled out there, as it
    reads a mask a row's category sets (tests/validate/test_masked_log_probabilities.py), so no row fails and the dry
    run passes. It was refused as 'a mask no row's input moves', which the dry run's 8 rows cannot tell: a mask set
    per row by a category was refused where the first evaluation rows shared one."""
    dry_run(_prepared(tmp_path, _masked_classifier(tmp_path, -np.inf)), get_backend("onnxruntime-cpu"))
