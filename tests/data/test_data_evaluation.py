"""The recipe's data table as the sweep (qbench.preflight.prepare.prepare) and the gate (evaluation_from_data) both
read it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from qbench.recipe.spec import load_recipe

CODES = {"007": 3.0, "7": -3.0, "NA": 1.0}  # a zip code, the number it reads as, and Namibia's country code


def _code_project(root: Path, codes: list[str]) -> Path:
    """A model whose string input `code` (N, 1) picks a score through a LabelEncoder, beside a float input; a CSV
    table whose `code` cells are digits, and a recipe feeding it."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("LabelEncoder", ["code"], ["score"], domain="ai.onnx.ml", keys_strings=list(CODES),
                         values_floats=list(CODES.values()), default_float=0.0),
        helper.make_node("Concat", ["score", "x"], ["h"], axis=1),
        helper.make_node("MatMul", ["h", "w"], ["logits"]),
    ]  # fmt: skip
    weights = numpy_helper.from_array(np.array([[1, -1], [0.5, 0.2]], dtype=np.float32), "w")
    graph = helper.make_graph(
        nodes, "codes",
        [helper.make_tensor_value_info("code", TensorProto.STRING, ["n", 1]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 2])], [weights],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), str(root / "codes.onnx"))
    lines = ["code,x,y"] + [f"{code},{0.1 * i:.1f},{int(CODES[code] < 0)}" for i, code in enumerate(codes)]
    (root / "rows.csv").write_text("\n".join(lines) + "\n")
    recipe = {
        "name": "codes", "model": {"path": "codes.onnx"},
        "data": {"path": "rows.csv", "inputs": {"code": "code", "x": "x"}, "label": "y"},
        "variants": [{"name": "fp16", "precision": "fp16"}], "output_dir": "reports",
    }  # fmt: skip
    (root / "r.yaml").write_text(yaml.safe_dump(recipe))
    return root / "r.yaml"


def test_a_csv_column_feeding_a_string_input_keeps_its_text(tmp_path: Path) -> None:
    from qbench.preflight.prepare import prepare

    codes = ["007", "7", "007", "NA", "7", "007", "NA", "7"]
    prepared = prepare(load_recipe(_code_project(tmp_path, codes)), track=False, destinations=False)
    # read as numbers, "007" and "7" were both 7 (refused as no text) and "NA" a NaN
    assert prepared.evaluation_feeds["code"].ravel().tolist() == codes
    assert prepared.labels.tolist() == [int(CODES[code] < 0) for code in codes]


def test_the_gate_reads_a_string_input_column_as_the_sweep_does(tmp_path: Path) -> None:
    from qbench.gate.checks import evaluation_from_data

    codes = ["007", "NA", "7", "NA"]
    evaluated = evaluation_from_data(load_recipe(_code_project(tmp_path, codes)))
    # read as numbers, the "NA" codes were NaN inputs: a NaN/inf error, or rows left out the sweep evaluated
    assert evaluated.rows.tolist() == [0, 1, 2, 3] and evaluated.dropped == {}


def test_the_gate_re_derives_the_slices_when_the_model_is_no_longer_readable(tmp_path: Path) -> None:
    """Only with --no-staleness-check can the model differ from the sweep's: unreadable, its input types are unknown
    and the table is read as without them, rather than the gate failing on the model's bytes."""
    from qbench.gate.checks import evaluation_from_data

    recipe = _code_project(tmp_path, ["007", "7", "007"])
    (tmp_path / "codes.onnx").write_bytes(b"\x08\x07 not a model")
    assert evaluation_from_data(load_recipe(recipe)).rows.tolist() == [0, 1, 2]


def _sorted_project(root: Path, limit: int) -> Path:
    """A linear 2-class model on `x` (N, 2) and a Parquet table ordered by its label (12 rows of class 0, then 8 of
    class 1), its `region` column ordered too; a recipe evaluating the first `limit` rows."""
    onnx = pytest.importorskip("onnx")
    pd = pytest.importorskip("pandas")
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.array([[1, -1], [-1, 1]], dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"])], "lin",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 2])], [weights],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(root / "m.onnx"))
    labels = [0] * 12 + [1] * 8
    cells = [[1.0, 0.0] if y == 0 else [0.0, 1.0] for y in labels]
    regions = ["eu"] * 6 + ["us"] * 14
    pd.DataFrame({"x": cells, "y": labels, "region": regions}).to_parquet(root / "rows.parquet")
    recipe = {
        "name": "sorted", "model": {"path": "m.onnx"},
        "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "y", "evaluation": {"limit": limit},
                 "slices": [{"by": "region"}]},
        "variants": [{"name": "fp16", "precision": "fp16"}], "output_dir": "reports",
    }  # fmt: skip
    (root / "r.yaml").write_text(yaml.safe_dump(recipe))
    return root / "r.yaml"


def test_a_limit_that_leaves_out_a_class_or_a_slice_value_says_so(tmp_path: Path, caplog) -> None:
    """The limit keeps the first rows in file order: on a table ordered by label it judged class 0 alone (and the
    slice us, whose 6 rows kept are all class 0), and nothing said that 8 rows of class 1 were never scored."""
    from qbench.preflight.prepare import prepare

    with caplog.at_level("WARNING", logger="qbench"):
        prepared = prepare(load_recipe(_sorted_project(tmp_path, limit=5)), track=False, destinations=False)
    assert prepared.labels.tolist() == [0] * 5
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data.evaluation.limit")]
    assert warnings[0] == ("data.evaluation.limit: 5 of the 20 evaluation rows of rows.parquet are evaluated, the "
                           "first in file order; 15 past the limit are not")  # fmt: skip
    assert warnings[1].startswith("data.evaluation.limit: the 5 rows kept hold no row of label 'y' = 1 (8 rows), ")
    assert warnings[2].startswith("data.evaluation.limit: the 5 rows kept hold no row of slice column 'region' = "
                                  "us (14 rows), ")  # fmt: skip
    assert len(warnings) == 3


def test_a_limit_that_keeps_every_class_and_slice_value_names_the_rows_alone(tmp_path: Path) -> None:
    from qbench.data import evaluation_rows, limit_notes, load_data_table

    recipe = load_recipe(_sorted_project(tmp_path, limit=19))
    table = load_data_table(recipe.data_path, recipe.data, label_names=True, recipe_file=recipe.source)
    rows = evaluation_rows(table, recipe.data, recipe_file=recipe.source, calibrated=False)
    assert limit_notes(table, rows, recipe.data, label_classes=True) == [
        "data.evaluation.limit: 19 of the 20 evaluation rows of rows.parquet are evaluated, the first in file order; "
        "1 past the limit are not"
    ]
    unlimited = recipe.data.model_copy(update={"evaluation": recipe.data.evaluation.model_copy(update={"limit": None})})
    assert limit_notes(table, evaluation_rows(table, unlimited, recipe_file=recipe.source, calibrated=False), unlimited,
                       label_classes=True) == []  # fmt: skip


def test_rows_differing_only_in_a_column_no_output_reads_are_one_input_to_the_sweep_and_the_gate(
    tmp_path: Path,
) -> None:
    """A pipeline export keeping an id column it drops as an input (`row_id`, read by no node): 12 rows of 4 feature
    rows, each with its own id, are 4 inputs (they counted as 12 evidence, so a pass resolved on 3 times the inputs
    it saw). The gate re-derives the same count from the data and the model."""
    pytest.importorskip("onnx")
    import pandas as pd
    from onnx import TensorProto, helper, numpy_helper, save

    from qbench.gate.checks import evaluation_from_data
    from qbench.preflight.prepare import prepare

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"])], "ids",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2]),
         helper.make_tensor_value_info("row_id", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 2])],
        [numpy_helper.from_array(np.array([[1, -1], [0.5, 0.2]], dtype=np.float32), "w")],
    )  # fmt: skip
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(tmp_path / "m.onnx"))
    features = np.random.default_rng(0).normal(size=(4, 2)).astype(np.float32)
    pd.DataFrame({"x": list(np.tile(features, (3, 1))), "id": np.arange(12), "y": [0, 1] * 6}).to_parquet(
        tmp_path / "rows.parquet")
    recipe = {"name": "ids", "model": {"path": "m.onnx"}, "output_dir": "reports",
              "data": {"path": "rows.parquet", "inputs": {"x": "x", "id": "row_id"}, "label": "y"},
              "variants": [{"name": "fp16", "precision": "fp16"}]}  # fmt: skip
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    prepared = prepare(load_recipe(tmp_path / "r.yaml"), track=False, destinations=False)
    assert prepared.distinct_inputs == {"overall": 4}
    assert evaluation_from_data(load_recipe(tmp_path / "r.yaml")).distinct_inputs == {"overall": 4}
