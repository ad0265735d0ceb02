"""Preflight end to end: recipe paths resolve against the recipe's folder from any working directory, and
`data.nonfinite_inputs: drop` leaves NaN/inf rows out and records the count in results.json, report.md and MLflow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from qbench.cli.app import main
from qbench.gate.run import latest_results
from qbench.recipe.spec import load_recipe
from qbench.results.schema import read_results

pytest.importorskip("torch")
pytest.importorskip("sklearn")
from user_model import make_user_project

EVAL_NAN_ROWS = (0, 7)  # positions among the test rows
CALIB_NAN_ROWS = (3,)  # positions among the calibration rows


def _poison(table: pd.DataFrame, subset: str, positions: tuple[int, ...], value: float) -> None:
    cells = [np.array(cell, dtype=np.float32) for cell in table["x"]]
    for row in table.index[table["subset"] == subset][list(positions)]:
        cells[row][0] = value
    table["x"] = cells


@pytest.fixture
def relative_project(tmp_path: Path) -> Path:
    """The user project with relative output_dir and sqlite store, NaN in two test rows and inf in one calib row."""
    recipe_path = make_user_project(tmp_path / "project")
    table = pd.read_parquet(tmp_path / "project" / "data" / "patients.parquet")
    _poison(table, "test", EVAL_NAN_ROWS, np.nan)
    _poison(table, "calib", CALIB_NAN_ROWS, np.inf)
    table.to_parquet(tmp_path / "project" / "data" / "patients.parquet", index=False)
    recipe = yaml.safe_load(recipe_path.read_text())
    recipe["variants"] = [{"name": "int8-minmax", "precision": "int8", "calibrator": "minmax"}]
    recipe["latency"] = {"batch_sizes": [1, 8], "warmup": 1, "iterations": 3, "stability": None}
    recipe["tracking"] = {"uri": "sqlite:///store/mlflow.db", "experiment": "relative"}
    recipe["output_dir"] = "reports"
    (tmp_path / "project" / "store").mkdir()
    recipe_path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return recipe_path


@pytest.mark.slow
def test_paths_resolve_against_the_recipe_and_nonfinite_rows_are_dropped(
    relative_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    project = relative_project.parent
    elsewhere, ci_job = tmp_path / "elsewhere", tmp_path / "ci"
    elsewhere.mkdir(), ci_job.mkdir()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    monkeypatch.chdir(elsewhere)
    assert main(["validate", str(relative_project)]) == 2  # NaN inputs are an error by default
    assert "data.inputs.x" in " ".join(capsys.readouterr().err.split())
    recipe = yaml.safe_load(relative_project.read_text())
    recipe["data"]["nonfinite_inputs"] = "drop"
    relative_project.write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert main(["sweep", str(relative_project)]) == 0
    assert not any(elsewhere.iterdir())  # nothing written to the working directory

    results_path = latest_results(load_recipe(relative_project))
    assert results_path.parent.parent == project / "reports" / "tumour-mlp"
    results = read_results(results_path)
    assert results.dropped_nonfinite == {"evaluation": {"x": 2}, "calibration": {"x": 1}}
    assert results.evaluation_rows == 229 - 2
    assert all(v.accuracy.rows == 227 for v in results.variants)
    report = (results_path.parent / "report.md").read_text()
    assert "**Evaluation rows dropped for NaN/inf inputs:** x 2" in report

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{(project / 'store' / 'mlflow.db').as_posix()}")
    experiment = client.get_experiment_by_name("relative")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.mlflow.parentRunId IS NULL")
    assert parent.data.metrics["dropped_nonfinite/evaluation/x"] == 2.0
    assert parent.data.metrics["dropped_nonfinite/calibration/x"] == 1.0

    monkeypatch.chdir(ci_job)
    capsys.readouterr()
    assert main(["gate", str(relative_project)]) == 0
    assert results.created_at in capsys.readouterr().out


def test_a_model_whose_external_data_file_is_gone_is_a_recipe_error(tmp_path: Path):
    from test_provenance import write_model_with_external_data

    from qbench.errors import RecipeError
    from qbench.preflight.prepare import prepare

    write_model_with_external_data(tmp_path)
    (tmp_path / "weights.bin").unlink()
    (tmp_path / "data.csv").write_text("a\n1\n")
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"name": "x", "model": {"path": "model.onnx"},
                                                     "data": {"path": "data.csv", "inputs": {"a": "x"}},
                                                     "variants": [{"name": "h", "precision": "fp16"}]}))  # fmt: skip
    with pytest.raises(RecipeError, match=r"r\.yaml: model\.path: .*keeps its weights in 'weights\.bin', not found"):
        prepare(load_recipe(tmp_path / "r.yaml"), track=False)


def test_string_labels_of_a_string_class_zipmap_are_read_as_its_columns(tmp_path: Path):
    """A scikit-learn style classifier with string classes: labels written as class names are accepted."""
    import onnx
    from onnx import TensorProto, helper

    from qbench.errors import RecipeError
    from qbench.preflight.prepare import prepare

    map_type = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.STRING, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    )
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=1),
             helper.make_node("ZipMap", ["p"], ["probs"], domain="ai.onnx.ml", classlabels_strings=["yes", "no"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
                              [helper.make_value_info("probs", map_type)])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), str(tmp_path / "m.onnx"))
    (tmp_path / "d.csv").write_text('x,y\n"[1, 0]",yes\n"[0, 1]",no\n"[2, 1]",no\n')
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"name": "x", "model": {"path": "m.onnx"},
                                                     "data": {"path": "d.csv", "inputs": {"x": "x"}, "label": "y"},
                                                     "variants": [{"name": "h", "precision": "fp16"}]}))  # fmt: skip
    prepared = prepare(load_recipe(tmp_path / "r.yaml"), track=False)
    assert prepared.labels.tolist() == [1, 0, 0]  # sorted classes: no = column 0, yes = column 1
    # the map names its own classes: data.classes (which could order them otherwise) is refused with it
    body = yaml.safe_load((tmp_path / "r.yaml").read_text())
    body["data"]["classes"] = ["yes", "no"]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(body))
    with pytest.raises(RecipeError, match=r"data\.classes: output 'probs' names its own classes \(a map\)"):
        prepare(load_recipe(tmp_path / "r.yaml"), track=False)
    body["data"]["classes"] = ["yes", "yes"]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(body))
    with pytest.raises(RecipeError, match=r"data\.classes: expected the distinct class names"):
        load_recipe(tmp_path / "r.yaml")


@pytest.mark.parametrize(
    ("model", "metric", "error"),
    [
        ({"output": "cls"}, "kl_mean", r"gate\.metric: 'kl_mean' is not computed for output 'cls': it holds class ids"),
        ({"outputs": ["probs", "cls"]}, "cls/kl_mean", r"'cls/kl_mean' is not computed for output 'cls'"),
        ({"outputs": ["probs", "cls"]}, "probs/kl_mean", None),
    ],
)
def test_a_gate_metric_the_evaluated_output_cannot_give_fails_before_the_sweep(tmp_path: Path, model, metric, error):
    import onnx
    from onnx import TensorProto, helper

    from qbench.errors import RecipeError
    from qbench.preflight.prepare import prepare

    nodes = [helper.make_node("Softmax", ["x"], ["probs"], axis=1),
             helper.make_node("ArgMax", ["x"], ["cls"], axis=1, keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["n", 2]),
                               helper.make_tensor_value_info("cls", TensorProto.INT64, ["n"])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(tmp_path / "m.onnx"))  # fmt: skip
    (tmp_path / "d.csv").write_text('x,y\n"[1, 0]",0\n"[0, 1]",1\n')
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"name": "x", "model": {"path": "m.onnx", **model},
                                                     "data": {"path": "d.csv", "inputs": {"x": "x"}, "label": "y"},
                                                     "variants": [{"name": "h", "precision": "fp16"}],
                                                     "gate": {"metric": metric}}))  # fmt: skip
    if error is None:
        assert len(prepare(load_recipe(tmp_path / "r.yaml"), track=False).outputs) == 2
    else:
        with pytest.raises(RecipeError, match=error):
            prepare(load_recipe(tmp_path / "r.yaml"), track=False)


def _symbolic_width_project(tmp_path: Path, task: str, metric: str, labels: list) -> Path:
    """x [n, 4] -> MatMul by a 4 x 3 weight, output [n, 'classes']: the graph does not size the classes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["scores"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", "classes"])],
                              [weight])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(tmp_path / "m.onnx"))  # fmt: skip
    features = np.random.default_rng(1).normal(size=(len(labels), 4)).astype(np.float32)
    pd.DataFrame({"x": list(features), "y": labels}).to_parquet(tmp_path / "d.parquet")
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({
        "name": "symbolic", "task": task, "model": {"path": "m.onnx"}, "output_dir": str(tmp_path / "reports"),
        "data": {"path": "d.parquet", "inputs": {"x": "x"}, "label": "y", "calibration": {"samples": 16}},
        "variants": [{"name": "h", "precision": "fp16"}], "gate": {"metric": metric},
        "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 3}}))  # fmt: skip
    return tmp_path / "r.yaml"


def test_labels_beyond_a_symbolic_class_dimension_are_refused_as_with_a_static_one(tmp_path: Path, capsys):
    """With an output of shape [n, 'classes'], label 3 of 3 classes passed `qbench validate`, and the sweep failed once
    FP32 was scored ('labels go up to class 3 but the output has 3 classes': no column, no row). The width FP32's
    outputs show now checks every evaluation label, with the error a static width gives, in validate and sweep."""
    labels = [row % 3 for row in range(60)]
    labels[50] = 3
    recipe = _symbolic_width_project(tmp_path, "classification", "accuracy", labels)
    error = "data.label: column 'y': 1 row, e.g. row 50: 3 hold class ids outside 0..2 (output 'scores' has 3 classes)"
    assert main(["validate", str(recipe)]) == 2
    assert error in capsys.readouterr().err
    assert main(["sweep", str(recipe), "--no-track"]) == 2
    assert error in capsys.readouterr().err


def test_multilabel_rows_wider_or_narrower_than_a_symbolic_output_are_refused(tmp_path: Path, capsys):
    recipe = _symbolic_width_project(tmp_path, "multilabel", "micro_f1", [[0, 1]] * 40)
    assert main(["validate", str(recipe)]) == 2
    assert "data.label: column 'y': rows have 2 labels but output 'scores' scores 3" in capsys.readouterr().err


def test_a_head_of_another_task_beside_the_evaluated_ones_says_how_to_judge_it(tmp_path: Path, capsys):
    """A model with class logits [n, 3] and a regression head [n] (one score column: read as two classes): with
    model.outputs naming both, the class labels 0..2 do not fit 'score'. The error said only that 'score' has 2
    classes; it now also says that every listed output is judged as the recipe's task against data.label, and how a
    head of another task is judged (a recipe of its own, or task: structured with metrics over several outputs)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "v")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("MatMul", ["x", "v"], ["score"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 3]),
                               helper.make_tensor_value_info("score", TensorProto.FLOAT, ["n"])], weights)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(tmp_path / "m.onnx"))
    features = rng.normal(size=(30, 4)).astype(np.float32)
    pd.DataFrame({"x": list(features), "y": [row % 3 for row in range(30)]}).to_parquet(tmp_path / "d.parquet")
    body = {"name": "heads", "model": {"path": "m.onnx", "outputs": ["logits", "score"]},
            "data": {"path": "d.parquet", "inputs": {"x": "x"}, "label": "y"},
            "variants": [{"name": "h", "precision": "fp16"}], "gate": {"metric": "logits/accuracy"}}  # fmt: skip
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(body))
    assert main(["validate", str(tmp_path / "r.yaml")]) == 2
    err = capsys.readouterr().err
    assert ("data.label: column 'y': 10 rows, e.g. row 2: 2 hold class ids outside 0..1 (output 'score' has 2 "
            "classes)") in err
    assert ("every output in model.outputs is judged as task 'classification' against data.label: for an output of "
            "another task, evaluate it in a recipe of its own (model.output: score, with its own task and data.label), "
            "or use task: structured with your own metrics: over several outputs") in err  # fmt: skip
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    # evaluated alone, the logits take these labels: the hint is about the listed outputs, not the labels
    body["model"] = {"path": "m.onnx", "output": "logits"}
    body["gate"] = {"metric": "accuracy"}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(body))
    assert main(["validate", str(tmp_path / "r.yaml")]) == 0
