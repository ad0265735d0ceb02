"""Model inputs a column cannot feed, as `qbench validate` meets them: a scalar (rank-0) input or a fixed-length vector
beside a dynamic batch, one value per call, an input with a default (an initializer of the same name), which qbench
holds constant, and an input that is no tensor (a map); each is one line naming the input and what to do, and the
default route passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.cli.app import main

RNG = np.random.default_rng(0)
ROWS = 60


def _temperature_model(
    path: Path, default: float | None, t_shape: tuple[int, ...] = (), batch: str | int = "batch"
) -> None:
    """probs = Softmax((x @ W) / t), t an input of `t_shape`: a scalar [] (a temperature), or [3] (a per-class
    divisor); with `default`, t has an initializer of that value. `batch` is x's and probs' axis 0."""
    initializers = [numpy_helper.from_array(RNG.normal(size=(4, 3)).astype(np.float32), "w")]
    if default is not None:
        initializers.append(numpy_helper.from_array(np.full(t_shape, default, np.float32), "t"))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Div", ["h", "t"], ["z"]),
         helper.make_node("Softmax", ["z"], ["probs"], axis=-1)], "temperature",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4]),
         helper.make_tensor_value_info("t", TensorProto.FLOAT, t_shape)],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 3])], initializers)  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def _validate(
    tmp_path: Path, inputs: dict[str, str], capsys: pytest.CaptureFixture[str], t_cells: tuple[int, ...] = ()
) -> tuple[int, list[str]]:
    """`qbench validate`'s exit code and error lines, the column t holding a cell of shape `t_cells` per row."""
    np.savez(tmp_path / "rows.npz", x=RNG.normal(size=(ROWS, 4)).astype(np.float32),
             t=np.full((ROWS, *t_cells), 2.0, np.float32), label=RNG.integers(0, 3, size=ROWS))  # fmt: skip
    recipe = {"name": "temperature", "model": {"path": "model.onnx"},
              "data": {"path": "rows.npz", "inputs": inputs, "label": "label", "calibration": {"samples": 16}},
              "variants": [{"name": "fp16", "precision": "fp16"}]}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    code = main(["validate", str(tmp_path / "recipe.yaml"), "--no-track"])
    return code, [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def test_a_scalar_input_fed_from_a_column_is_refused_as_a_scalar_not_as_a_fixed_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was fed one value per row, ran one row and failed at a batch of 64 as 'its graph fixes a batch of 1'."""
    _temperature_model(tmp_path / "model.onnx", default=None)
    code, errors = _validate(tmp_path, {"x": "x", "t": "t"}, capsys)
    assert code == 2
    assert errors == [f"error: {tmp_path / 'recipe.yaml'}: data.inputs.t: model input 't' is a scalar (shape []): one "
                      "value per call, where qbench feeds a column one value per row along axis 0; expected an input "
                      "with a row axis, or give 't' a default in the graph (an initializer named 't' at the value to "
                      "judge: qbench then feeds it never and holds it constant in every variant; "
                      "docs/recipe-reference.md: Graphs as tools write them)"]  # fmt: skip


def test_an_input_with_a_default_fed_from_a_column_is_refused_naming_the_default_and_left_out_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """'t' is a graph input with an initializer: the error said it was no input of the model."""
    _temperature_model(tmp_path / "model.onnx", default=2.0)
    code, errors = _validate(tmp_path, {"x": "x", "t": "t"}, capsys)
    assert code == 2
    assert errors == [f"error: {tmp_path / 'recipe.yaml'}: data.inputs.t: model input 't' has a default (an "
                      "initializer of the same name, as older exporters write), which qbench holds constant in every "
                      "variant and never feeds; expected it left out of data.inputs, or the model saved without that "
                      "initializer to feed it per row"]  # fmt: skip
    assert _validate(tmp_path, {"x": "x"}, capsys) == (0, [])


@pytest.mark.parametrize("t_cells", [(3,), ()])
def test_a_fixed_length_vector_input_beside_a_dynamic_batch_is_refused_as_one_per_call_and_its_default_route_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], t_cells: tuple[int, ...]
) -> None:
    """t [3] beside x ['batch', 4] is one vector per call: a column of 3 values a row was refused as 'expects shape
    (batch)', and one of a value a row (that advice followed) failed the dry run's single row, 'Got: 1 Expected: 3'."""
    _temperature_model(tmp_path / "model.onnx", default=None, t_shape=(3,))
    code, errors = _validate(tmp_path, {"x": "x", "t": "t"}, capsys, t_cells)
    assert code == 2
    assert errors == [f"error: {tmp_path / 'recipe.yaml'}: data.inputs.t: model input 't' [3] has no row axis: every "
                      "axis is fixed while x ['batch', 4] leaves axis 0 dynamic for the rows, so it is one tensor per "
                      "call, shared by the batch, where qbench feeds a column one value per row along axis 0; "
                      "expected an input with a row axis, or give 't' a default in the graph (an initializer named "
                      "'t' at the value to judge: qbench then feeds it never and holds it constant in every variant; "
                      "docs/recipe-reference.md: Graphs as tools write them)"]  # fmt: skip
    _temperature_model(tmp_path / "model.onnx", default=2.0, t_shape=(3,))
    assert _validate(tmp_path, {"x": "x"}, capsys) == (0, [])


def test_a_rank_1_input_beside_a_fixed_batch_is_fed_one_value_per_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """x [3, 4] fixes a batch of 3: t [3] is then a batch of scalars, one a row, as the batch-size fields follow."""
    _temperature_model(tmp_path / "model.onnx", default=None, t_shape=(3,), batch=3)
    assert _validate(tmp_path, {"x": "x", "t": "t"}, capsys) == (0, [])


def test_a_map_input_is_refused_as_no_tensor_before_the_model_is_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """scikit-learn's DictVectorizer, converted, takes a map(string, float): fed a column as a tensor, ONNX Runtime
    refused every batch, reported as a reference that does not run on onnxruntime-cpu ('expected to be of type')."""
    map_type = helper.make_map_type_proto(TensorProto.STRING, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    graph = helper.make_graph(
        [helper.make_node("DictVectorizer", ["t"], ["v"], domain="ai.onnx.ml", string_vocabulary=["a", "b", "c"]),
         helper.make_node("Add", ["x", "v"], ["h"]), helper.make_node("Softmax", ["h"], ["probs"], axis=-1)],
        "vectorised", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
                       helper.make_value_info("t", map_type)],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 3])])  # fmt: skip
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17),
                                                                  helper.make_opsetid("ai.onnx.ml", 3)])  # fmt: skip
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp_path / "model.onnx"))
    code, errors = _validate(tmp_path, {"x": "x", "t": "t"}, capsys, (3,))
    assert code == 2
    assert errors == [f"error: {tmp_path / 'recipe.yaml'}: data.inputs.t: model input 't' takes a "
                      "map(string,tensor(float32)), not a tensor, where qbench feeds a column as a tensor, one value "
                      "per row along axis 0; expected a model whose inputs are tensors (convert or export it from the "
                      "step that turns each row's values into a "
                      "tensor on, fed from list or number columns)"]  # fmt: skip
