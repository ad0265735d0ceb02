"""Struct columns (a JSON line's nested objects, Spark's structs): each field is a column of its own, `meta.region`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from qbench.data.load import load_table
from qbench.errors import RecipeError
from qbench.recipe.spec import load_recipe

RECIPE = Path("recipe.yaml")
LINES = [
    {"id": 1, "features": {"a": 0.5, "b": 1.0}, "meta": {"region": "eu", "site": {"code": "007"}}},
    {"id": 2, "features": {"a": 1.5}, "meta": {"region": "us", "site": {"code": "12"}}},
    {"id": 3, "features": {"a": 2.5, "b": None}, "meta": {"region": "eu", "site": None}},
]


def _jsonl(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_json_lines_nested_objects_give_a_column_per_field(tmp_path: Path) -> None:
    table = load_table(_jsonl(tmp_path / "rows.jsonl", LINES), recipe_file=RECIPE)
    assert table["features.a"].tolist() == [0.5, 1.5, 2.5]
    # a field missing from a line, or null there, is missing
    assert table["features.b"].iloc[0] == 1.0 and np.isnan(table["features.b"].iloc[1:]).all()
    assert table["meta.region"].tolist() == ["eu", "us", "eu"]
    codes = table["meta.site.code"]  # nested deeper, the text as written; missing where the struct is null
    assert codes.iloc[:2].tolist() == ["007", "12"] and pd.isna(codes.iloc[2])
    assert table["id"].tolist() == [1, 2, 3]


def test_parquet_struct_fields_are_columns(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = pa.array([{"site": "eu", "batch": 1}, {"site": "us", "batch": 2}])
    pq.write_table(pa.table({"x": [0.5, 1.5], "meta": meta}), tmp_path / "rows.parquet")
    table = load_table(tmp_path / "rows.parquet", recipe_file=RECIPE)
    assert table["meta.site"].tolist() == ["eu", "us"] and table["meta.batch"].tolist() == [1, 2]


def test_a_field_named_as_an_existing_column_is_refused(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "rows.jsonl", [{"meta": {"region": "eu"}, "meta.region": "us"}])
    with pytest.raises(RecipeError) as info:
        load_table(path, recipe_file=RECIPE)
    assert str(info.value) == (
        "recipe.yaml: data.path: cannot read rows.jsonl: column 'meta' holds structs whose field 'region' is also a "
        "column named 'meta.region'; expected one column of each name"
    )


def test_a_sweep_feeds_and_slices_by_nested_fields(tmp_path: Path) -> None:
    """`{"features": {...}, "meta": {"region": ...}}` lines: inputs from `features.*`, slices by `meta.region`, a
    row without one of the features left out under `nonfinite_inputs: drop` and counted."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.array([[1, -1], [-1, 1]], dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Concat", ["a", "b"], ["h"], axis=1), helper.make_node("MatMul", ["h", "w"], ["logits"])],
        "lin", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 1]) for n in ("a", "b")],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 2])], [weights],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(tmp_path / "m.onnx"))  # fmt: skip
    lines = [{"features": {"a": float(i % 2), "b": float(1 - i % 2)}, "meta": {"region": ["eu", "us"][i % 3 == 0]},
              "y": 1 - i % 2} for i in range(12)]  # fmt: skip
    del lines[4]["features"]["b"]
    _jsonl(tmp_path / "rows.jsonl", lines)
    recipe = {
        "name": "nested", "model": {"path": "m.onnx"},
        "data": {"path": "rows.jsonl", "inputs": {"features.a": "a", "features.b": "b"}, "label": "y",
                 "nonfinite_inputs": "drop", "slices": [{"by": "meta.region"}]},
        "variants": [{"name": "fp16", "precision": "fp16"}], "output_dir": "reports",
    }  # fmt: skip
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    from qbench.preflight.prepare import prepare

    prepared = prepare(load_recipe(tmp_path / "r.yaml"), track=False, destinations=False)
    assert prepared.evaluation_rows.tolist() == [0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11]
    assert prepared.evaluation_feeds["a"].ravel().tolist() == [float(i % 2) for i in range(12) if i != 4]
    assert {name: int(mask.sum()) for name, mask in prepared.slices.items()} == {
        "meta.region=eu": 7, "meta.region=us": 4}
