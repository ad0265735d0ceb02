"""A reference that loads and runs one row but not the largest batch the sweep times (a shape written for batch 1,
as a dynamo export's RotaryEmbedding fails past batch 1): `qbench sweep` runs `qbench validate`'s dry run before any
variant is built, and stops in one line naming the batch and the runtime's reason, exit 2, nothing built or written.
Where it runs one row but not two (a Reshape to a constant [1, -1] behind an input declaring a dynamic batch, as older
zoo exports write), the line says which batch fields to set to 1: the recipe that follows it runs. Where it fails on a
single row too (an op the runtime refuses whatever the batch, as ONNX Runtime 1.32 refuses a dynamo export's opset-23
Attention whose mask broadcasts over the query axis), the line says no batch-size setting would help; where it fails on
a single row but runs a larger batch (a Reshape to a constant [4, -1] behind an input declaring a dynamic batch, as a
TorchScript export of `x.reshape(4, 16)` writes), the line names that batch and the export qbench runs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

import qbench.execute.jobs
from qbench.cli.app import main
from qbench.validate.dry_run import largest_batch

ROWS = 24


def batch_one_model() -> onnx.ModelProto:
    """x [batch, 4] -> Reshape to a constant [1, 4] -> MatMul -> logits [batch, 3]: runs a batch of 1 only."""
    weights = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 4], np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["logits"])]
    graph = helper.make_graph(nodes, "batch_one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
                              [weights, shape])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def batch_four_model(batch: str | int = "batch") -> onnx.ModelProto:
    """x [batch, 4] -> Reshape to a constant [4, 4] -> MatMul -> logits [batch, 3]: runs a batch of 4 only, though its
    input declares a dynamic batch (with `batch` 4, declared fixed)."""
    weights = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(np.array([4, 4], np.int64))),
             helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["logits"])]
    graph = helper.make_graph(nodes, "batch_four", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 3])],
                              [weights])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def no_batch_model() -> onnx.ModelProto:
    """x [batch, 4] -> Gather of columns 9-11 (constant indices past the 4 columns) -> logits [batch, 3]: valid to the
    checker and to shape inference, refused by the runtime at any batch, one row included."""
    index = numpy_helper.from_array(np.array([9, 10, 11], np.int64), "index")
    nodes = [helper.make_node("Gather", ["x", "index"], ["logits"], axis=1)]
    graph = helper.make_graph(nodes, "no_batch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
                              [index])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def project(root: Path, model: onnx.ModelProto | None = None) -> Path:
    """Evaluated one row at a time (which runs), timed at batch sizes 1 and 16 (16 does not)."""
    root.mkdir()
    onnx.save(model or batch_one_model(), str(root / "model.onnx"))
    rng = np.random.default_rng(1)
    pd.DataFrame({"x": list(rng.normal(size=(ROWS, 4)).astype(np.float32)),
                  "y": rng.integers(0, 3, ROWS)}).to_parquet(root / "rows.parquet")  # fmt: skip
    recipe = {
        "name": "batch-one", "task": "classification", "model": {"path": "model.onnx"},
        "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "y", "evaluation": {"batch_size": 1},
                 "calibration": {"samples": 8, "batch_size": 1, "overlap": "allow"}},
        "variants": [{"name": "fp16", "precision": "fp16"},
                     {"name": "int8", "precision": "int8", "calibrator": "minmax"}],
        "latency": {"batch_sizes": [1, 16], "warmup": 1, "iterations": 2, "stability": None},
        "gate": {"metric": "accuracy", "max_drop": 0.5}, "output_dir": "reports",
    }  # fmt: skip
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def test_the_model_runs_one_row_and_fails_at_sixteen(tmp_path):
    onnx.save(batch_one_model(), str(tmp_path / "model.onnx"))
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.ones((16, 4), np.float32)
    assert session.run(None, {"x": x[:1]})[0].shape == (1, 3)
    with pytest.raises(Exception, match="requested shape"):
        session.run(None, {"x": x})


@pytest.mark.parametrize("command", [["validate"], ["sweep", "--no-track"]], ids=["validate", "sweep"])
def test_a_reference_that_fails_at_the_largest_timed_batch_stops_before_any_build(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path / "p")
    builds: list[str] = []
    real = qbench.execute.jobs.build_variant
    monkeypatch.setattr(qbench.execute.jobs, "build_variant", lambda spec,
                        ctx: builds.append(spec.name) or real(spec, ctx))  # fmt: skip
    code = main([command[0], str(recipe), *command[1:]])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert len(lines) == 1, err
    assert (f"error: {recipe.parent / 'model.onnx'}: the FP32 reference does not run on onnxruntime-cpu: a batch of 16 "
            "rows failed: Fail: [ONNXRuntimeError]") in lines[0]  # fmt: skip
    assert "Input shape:{16,4}, requested shape:{1,4}" in lines[0]
    assert lines[0].endswith("(the check fed it one row, then 8 evaluation "
                             "rows repeated to one batch of 16, the largest "
                             "the sweep runs: latency.batch_sizes [1, 16]); "
                             "expected a model that runs every batch size the recipe asks for; it runs one row but not "
                             "two, so its graph fixes a batch of 1 its inputs do not declare (a Reshape to a constant "
                             "[1, -1]): set latency.batch_sizes: [1], data.evaluation.batch_size: 1 and "
                             "data.calibration.batch_size: 1, or export it with a dynamic batch")  # fmt: skip
    assert builds == []
    assert not (tmp_path / "p" / "reports").exists()  # no run folder: nothing was measured or written


def test_a_reference_that_fails_on_one_row_is_not_told_to_change_batch_sizes(tmp_path, monkeypatch, capfd):
    """The runtime refuses the graph at a single row: the line says so, and names no batch field to change (it said
    "expected a model that runs every batch size the recipe asks for", pointing at batch sizes that cannot help). The
    runtime's own log of the failing kernel does not precede it (it did three times: the row check's run and two of
    the dry run's)."""
    onnx.checker.check_model(no_batch_model(), full_check=True)
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path / "p", no_batch_model())
    capfd.readouterr()
    code = main(["validate", str(recipe)])
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert len(lines) == 1, err
    assert "E:onnxruntime" not in err and "ExecuteKernel" not in err, err
    assert "the FP32 reference does not run on onnxruntime-cpu: a batch of 1 row failed: " in lines[0]
    assert lines[0].endswith("latency.batch_sizes [1, 16]); expected a model "
                             "onnxruntime-cpu runs: it fails on a single row too, so no batch-size setting would help; "
                             "the runtime's reason names the node it stops at")  # fmt: skip
    assert "every batch size" not in lines[0] and "batch_size: 1" not in lines[0]


def prepared_like(batch_sizes: list[int], evaluation_batch: int, rows: int, fixed: int | None = None) -> Any:
    recipe = SimpleNamespace(latency=SimpleNamespace(batch_sizes=batch_sizes),
                             data=SimpleNamespace(evaluation=SimpleNamespace(batch_size=evaluation_batch)))  # fmt: skip
    return SimpleNamespace(recipe=recipe, batch=fixed, evaluation_rows=list(range(rows)))


@pytest.mark.parametrize(
    ("prepared", "expected"),
    [
        (prepared_like([1, 16], 1, 24), (16, "latency.batch_sizes [1, 16]")),
        (prepared_like([1, 16], 64, 40), (40, "data.evaluation.batch_size 64 over 40 rows")),  # every row at once
        (prepared_like([1, 16], 64, 500), (64, "data.evaluation.batch_size 64 over 500 rows")),
        (prepared_like([1, 32], 64, 500, fixed=8), (8, "the model's fixed batch of 8")),
    ],
)
def test_the_largest_batch_the_sweep_feeds_the_reference(prepared: Any, expected: tuple[int, str]):
    assert largest_batch(prepared) == expected


def test_the_recipe_the_hint_writes_runs(tmp_path, monkeypatch):
    """Every batch field at 1, as the line above says, the same model sweeps and its gate judges it (exit 0)."""
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path / "p")
    spec = yaml.safe_load(recipe.read_text())
    spec["latency"]["batch_sizes"] = [1]
    recipe.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 0


def test_a_reference_that_fails_on_one_row_but_runs_a_larger_batch_names_that_batch(tmp_path, monkeypatch, capsys):
    """The graph fixes a batch of 4 its input does not declare: a single row fails, and so does every batch the
    recipe could set (the dry run's first run is one row). The line said "it fails on a single row too, so no
    batch-size setting would help"; it now names the batch the graph runs and the export that qbench runs."""
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path / "p", batch_four_model())
    code = main(["validate", str(recipe)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert len(lines) == 1, err
    assert "a batch of 1 row failed: " in lines[0]
    assert lines[0].endswith("expected a model that runs every batch size the recipe asks for; it fails on a single "
                             "row but runs a batch of 4, so its graph fixes a batch of 4 its inputs do not declare (a "
                             "Reshape to a constant [4, ...]): export it "
                             "with a dynamic batch, or with its inputs' batch "
                             "dimension fixed to 4, which qbench runs as a fixed batch (docs/recipe-reference.md: A "
                             "model with a fixed batch)")  # fmt: skip
    assert "no batch-size setting would help" not in lines[0]


def test_the_export_that_hint_names_runs(tmp_path, monkeypatch):
    """The same graph with its input's batch declared fixed to 4, as the line above says: it sweeps at that batch (a
    last, shorter batch filled with repeats) and its gate judges it (exit 0)."""
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path / "p", batch_four_model(batch=4))
    spec = yaml.safe_load(recipe.read_text())
    spec["latency"].pop("batch_sizes")
    spec["data"]["evaluation"].pop("batch_size")
    spec["data"]["calibration"].pop("batch_size")
    recipe.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 0


def flag_model() -> onnx.ModelProto:
    """x [batch, 4] and a flag [1] choosing one of two MatMuls through an If, as an optimum merged decoder's
    `use_cache_branch` chooses its with-past or without-past graph: one value per call, so a batch of 2 rows fails."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), name) for name in ("w1", "w2")]
    out = helper.make_tensor_value_info

    def branch(weight: str) -> onnx.GraphProto:
        node = helper.make_node("MatMul", ["x", weight], [f"y_{weight}"])
        return helper.make_graph([node], weight, [], [out(f"y_{weight}", TensorProto.FLOAT, ["batch", 3])])

    node = helper.make_node("If", ["flag"], ["logits"], then_branch=branch("w1"), else_branch=branch("w2"))
    graph = helper.make_graph([node], "merged",
                              [out("x", TensorProto.FLOAT, ["batch", 4]), out("flag", TensorProto.BOOL, [1])],
                              [out("logits", TensorProto.FLOAT, ["batch", 3])], weights)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_flag_input_of_one_value_per_call_is_named_not_taken_for_a_hidden_reshape(tmp_path, monkeypatch, capsys):
    """A merged decoder's `use_cache_branch` [1] beside inputs with a dynamic batch, its column alternating, runs one
    row but not two: the line said "its graph fixes a batch of 1 its inputs do not declare (a Reshape to a constant
    [1, -1])", of a graph with no Reshape whose input declares that 1; it now names the input. The batch fields it says
    to set make the recipe run (a column of one value runs at any batch: tests/data/test_per_call.py)."""
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path / "p", flag_model())
    spec = yaml.safe_load(recipe.read_text())
    spec["data"]["inputs"]["flag"] = "flag"
    frame = pd.read_parquet(recipe.parent / "rows.parquet").assign(flag=np.arange(ROWS) % 2 == 0)
    frame.to_parquet(recipe.parent / "rows.parquet")
    recipe.write_text(yaml.safe_dump(spec, sort_keys=False))
    code = main(["validate", str(recipe)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].endswith("it runs one row but not two, so model input 'flag' [1] holds one value per call beside "
                             "inputs with a dynamic batch (a flag, as an "
                             "optimum merged decoder's use_cache_branch is), whose rows hold different values in its "
                             "column: set latency.batch_sizes: [1], data.evaluation.batch_size: 1 and "
                             "data.calibration.batch_size: 1, or export a model without it (optimum's unmerged "
                             "decoder_model.onnx and decoder_with_past_model.onnx)"), lines[0]  # fmt: skip
    assert "Reshape" not in lines[0]
    spec["latency"]["batch_sizes"] = [1]
    recipe.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 0
