"""Labels read from the table (qbench.data.labels): one label column, or for task multilabel one 0/1 column per
label, as multilabel tables usually come (toxic, obscene, insult, threat). The wide form must give what the
list-column form of the same data gives, figure for figure, through a whole sweep."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.cli.app import main
from qbench.data.labels import label_cells
from qbench.errors import RecipeError
from qbench.gate.run import latest_results
from qbench.recipe.data import DataSpec
from qbench.recipe.spec import load_recipe
from qbench.results.schema import read_results

RECIPE = Path("recipe.yaml")
NAMES = ["toxic", "obscene", "insult", "threat"]


def _spec(label: str | list[str]) -> DataSpec:
    return DataSpec(path=Path("d.parquet"), inputs={"x": "x"}, label=label)


def _cells(table: pd.DataFrame, label: str | list[str], rows: list[int] | None = None) -> list:
    positions = np.arange(len(table)) if rows is None else np.array(rows)
    return label_cells(table, _spec(label), positions, recipe_file=RECIPE)


def test_label_columns_of_every_zero_one_kind_read_as_the_list_a_list_column_holds() -> None:
    table = pd.DataFrame({
        "flag": [True, False, True],                     # a boolean column
        "count": [0, 1, 1],                              # integers
        "share": [1.0, 0.0, 0.0],                        # floats
        "text": ["true", "False", " 1"],                 # a CSV column kept as text (a slice or stratify_by column)
        "nullable": pd.array([False, True, False], dtype="boolean"),
        "lists": [[1, 0, 1, 1, 0], [0, 1, 0, 0, 1], [1, 1, 0, 1, 0]],
    })  # fmt: skip
    wide = _cells(table, ["flag", "count", "share", "text", "nullable"])
    assert wide == [[1, 0, 1, 1, 0], [0, 1, 0, 0, 1], [1, 1, 0, 1, 0]] == _cells(table, "lists")
    assert _cells(table, ["count", "flag"], rows=[2, 0]) == [[1, 1], [0, 1]]  # the recipe's order, the rows asked
    assert _cells(table, "count", rows=[1]) == [1]  # one column: its cells as they are
    assert label_cells(table, DataSpec(path=Path("d"), inputs={"x": "x"}), np.arange(3), recipe_file=RECIPE) is None


@pytest.mark.parametrize(
    ("column", "cells", "expected"),
    [
        ("b", [0, 2, 1], "recipe.yaml: data.label[1]: column 'b' is not 0/1 in 1 row, e.g. row 1 (2) of the table; "
                         "expected 0/1 or true/false in every row (one column per label)"),
        ("b", ["yes", "no", "no"], "recipe.yaml: data.label[1]: column 'b' is not 0/1 in 3 rows, e.g. row 0 ('yes')"),
        ("b", [0.0, np.nan, 1.0], "recipe.yaml: data.label[1]: column 'b' has no value in 1 row, e.g. row 1 of the "
                                  "table; expected 0/1 or true/false in every row"),
        ("b", pd.array([True, None, False], dtype="boolean"),
         "data.label[1]: column 'b' has no value in 1 row, e.g. row 1"),
        ("b", ["1", "", "0"], "data.label[1]: column 'b' is not 0/1 in 1 row, e.g. row 1 ('')"),
    ],
)  # fmt: skip
def test_a_cell_that_is_not_zero_or_one_names_the_column_and_the_row(column, cells, expected) -> None:
    table = pd.DataFrame({"a": [1, 0, 1], column: cells})
    with pytest.raises(RecipeError) as caught:
        _cells(table, ["a", column])
    assert expected in str(caught.value)


def test_a_missing_label_column_is_named_with_the_close_one() -> None:
    table = pd.DataFrame({"toxic": [1], "insult": [0]})
    with pytest.raises(RecipeError, match=r"data.label\[1\]: got 'insutl', expected one of insult, toxic \(did you "
                                          r"mean 'insult'\?\)"):  # fmt: skip
        _cells(table, ["toxic", "insutl"])
    with pytest.raises(RecipeError, match=r"data.label: got 'y', expected one of insult, toxic"):
        _cells(table, "y")


def _project(root: Path) -> None:
    """A 4-label MatMul + Sigmoid model and 240 rows (120 calibration, 120 evaluation) with the labels as a list
    column and as four wide columns (booleans and integers), and a region column."""
    rng = np.random.default_rng(3)
    weight = rng.normal(size=(6, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("Sigmoid", ["z"], ["p"])], "ml",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["n", 4])], [numpy_helper.from_array(weight, "w")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), root / "m.onnx")
    x = rng.normal(size=(240, 6)).astype(np.float32)
    noisy = 1 / (1 + np.exp(-(x @ weight))) + rng.normal(scale=0.3, size=(240, 4))
    labels = (noisy > 0.5).astype(np.int64)
    table = pd.DataFrame({"x": list(x), "labels": list(labels), "region": rng.choice(["eu", "us"], size=240),
                          "split": ["calib"] * 120 + ["eval"] * 120})  # fmt: skip
    for index, name in enumerate(NAMES):
        table[name] = labels[:, index].astype(bool) if index % 2 == 0 else labels[:, index]
    table.to_parquet(root / "d.parquet")
    csv = table.drop(columns=["labels"])
    csv["x"] = [str(row.tolist()) for row in x]
    csv.to_csv(root / "d.csv", index=False)  # booleans written True/False; toxic is read as text (a slice column)


def _sweep(root: Path, name: str, data: str, label: str | list[str]) -> dict:
    recipe = {
        "name": name, "task": "multilabel", "model": {"path": "m.onnx"}, "output_dir": "reports",
        "data": {"path": data, "inputs": {"x": "x"}, "label": label,
                 "calibration": {"filter": {"split": "calib"}, "samples": 64},
                 "evaluation": {"filter": {"split": "eval"}}, "slices": [{"by": "region"}, {"by": "toxic"}]},
        "variants": [{"name": "fp16", "precision": "fp16"},
                     {"name": "int8", "precision": "int8", "calibrator": "minmax"}],
        "latency": {"batch_sizes": [8], "warmup": 1, "iterations": 3, "stability": None},
        "analysis": {"ranges": False},
        "gate": {"metric": "micro_f1", "max_drop": 0.5, "max_slice_drop": 0.5},
    }  # fmt: skip
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert main(["sweep", str(path), "--gate", "--no-track"]) == 0
    results = read_results(latest_results(load_recipe(path)))
    return {(v.variant, scope.name): (scope.size, scope.metrics["micro_f1"], scope.metrics["macro_f1"])
            for v in results.variants for scope in (v.accuracy.overall, *v.accuracy.slices)}  # fmt: skip


@pytest.mark.slow
def test_wide_label_columns_sweep_to_the_figures_of_the_list_column(tmp_path: Path, capsys) -> None:
    """fp16 and int8 swept with the labels as four columns (Parquet, and CSV with a slice by a label column read as
    text) give every scope's micro/macro F1 exactly as the list column does; the list-column figures are checked
    against F1 computed here from the variants' decisions."""
    _project(tmp_path)
    listed = _sweep(tmp_path, "listed", "d.parquet", "labels")
    assert _sweep(tmp_path, "wide", "d.parquet", NAMES) == listed
    assert _sweep(tmp_path, "wide-csv", "d.csv", NAMES) == listed
    assert {scope for _, scope in listed} == {"overall", "region=eu", "region=us", "toxic=False", "toxic=True"}
    table = pd.read_parquet(tmp_path / "d.parquet")
    evaluated = table[table["split"] == "eval"]
    truth = np.stack(evaluated["labels"].to_numpy())
    inputs = np.stack(evaluated["x"].to_numpy()).astype(np.float32)
    import onnxruntime as ort

    results = read_results(latest_results(load_recipe(tmp_path / "listed.yaml")))
    for v in results.variants:
        session = ort.InferenceSession(str(v.evaluated_model_path or v.model_path), providers=["CPUExecutionProvider"])
        decided = session.run(None, {"x": inputs})[0] > 0.5
        on_toxic = evaluated["toxic"].to_numpy()
        size, micro, _ = listed[(v.variant, "toxic=True")]
        hits, guesses = (decided & (truth == 1))[on_toxic].sum(), decided[on_toxic].sum()
        assert size == on_toxic.sum() and micro == pytest.approx(2 * hits / (guesses + truth[on_toxic].sum()))


def test_label_columns_not_matching_the_output_width_are_one_line(tmp_path: Path, capsys) -> None:
    _project(tmp_path)
    body = {"name": "narrow", "task": "multilabel", "model": {"path": "m.onnx"}, "output_dir": "reports",
            "data": {"path": "d.parquet", "inputs": {"x": "x"}, "label": NAMES[:3]},
            "variants": [{"name": "fp16", "precision": "fp16"}], "gate": {"metric": "micro_f1"}}  # fmt: skip
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(body))
    assert main(["validate", str(tmp_path / "r.yaml")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "data.label: columns toxic, obscene, insult: rows have 3 labels but output 'p' scores 4; expected one " \
           "label per output column" in err


def test_null_labels_are_refused_with_the_filter_that_judges_only_the_labelled_rows(tmp_path: Path) -> None:
    """A warehouse's nullable Int64 label holding nulls is refused, never read as class 0; the line said only that
    rows "have no label", so the one recipe change that judges the labelled rows had to be found elsewhere."""
    from qbench.preflight.prepare import prepare

    weight = numpy_helper.from_array(np.eye(4, 2, dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])], [weight])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(tmp_path / "m.onnx"))  # fmt: skip
    x = np.random.default_rng(0).normal(size=(12, 4)).astype(np.float32)
    labels = pd.array([0, 1, None, 1, 0, None, 1, 0, 1, 0, 1, 0], dtype="Int64")
    pd.DataFrame({"x": list(x), "class id": labels}).to_parquet(tmp_path / "rows.parquet")
    data = {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "class id"}
    recipe = {"name": "nulls", "task": "classification", "model": {"path": "m.onnx"}, "data": data,
              "variants": [{"name": "fp16", "precision": "fp16"}]}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(RecipeError) as info:
        prepare(load_recipe(tmp_path / "recipe.yaml"), track=False, destinations=False, backends=False)
    assert str(info.value).endswith("2 rows, e.g. row 2: <NA> have no label; expected integer class ids; to judge only "
                                    "the labelled rows, add {class id: {ne: null}} to data.evaluation.filter (2 "
                                    "evaluation rows of rows.parquet have no label)")  # fmt: skip
    data["evaluation"] = {"filter": {"class id": {"ne": None}}}  # the hint as written
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    prepared = prepare(load_recipe(tmp_path / "recipe.yaml"), track=False, destinations=False, backends=False)
    assert prepared.evaluation_rows.tolist() == [0, 1, 3, 4, 6, 7, 8, 9, 10, 11]
    assert prepared.labels.tolist() == [0, 1, 1, 0, 1, 0, 1, 0, 1, 0]
