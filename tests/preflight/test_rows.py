"""Each data row's outputs must follow that row: a model whose batch is not axis 0 (a sequence-first export) is
refused before anything is scored; models whose rows are independent (padding masks, fixed batches) pass."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.cli.app import main
from qbench.errors import RecipeError
from qbench.modelinfo.signature import read_model_info
from qbench.preflight.rows import check_row_independence
from qbench.recipe.spec import load_recipe

STEPS, FEATURES, CLASSES = 4, 3, 2
RNG = np.random.default_rng(0)
WEIGHT = numpy_helper.from_array(RNG.normal(size=(FEATURES, CLASSES)).astype(np.float32), "w")


def _save(path: Path, nodes: list, inputs: list, outputs: list, initializers: list | None = None) -> Path:
    graph = helper.make_graph(nodes, "m", inputs, outputs, initializers or [WEIGHT])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def _sequence_first(path: Path, steps: int | str = STEPS) -> Path:
    """x [seq, batch, feat] -> y [batch, classes]: the mean over the sequence axis, then a linear head."""
    return _save(path, [helper.make_node("ReduceMean", ["x", "axes"], ["pooled"], keepdims=0),
                        helper.make_node("MatMul", ["pooled", "w"], ["y"])],  # fmt: skip
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, "batch", FEATURES])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", CLASSES])],
                 [WEIGHT, numpy_helper.from_array(np.array([0], np.int64), "axes")])  # fmt: skip


def _batch_centred(path: Path) -> Path:
    """y = x - mean(x over the batch) @ w: reordering rows reorders outputs, but fewer rows change them."""
    return _save(path, [helper.make_node("ReduceMean", ["x", "axes"], ["mean"], keepdims=1),
                        helper.make_node("Sub", ["x", "mean"], ["centred"]),
                        helper.make_node("MatMul", ["centred", "w"], ["y"])],  # fmt: skip
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", CLASSES])],
                 [WEIGHT, numpy_helper.from_array(np.array([0], np.int64), "axes")])  # fmt: skip


def _masked_mean(path: Path) -> Path:
    """x [batch, tokens, feat], mask [batch, tokens] -> the mean of each row's unmasked tokens @ w."""
    nodes = [
        helper.make_node("Unsqueeze", ["mask", "last"], ["mask3"]),
        helper.make_node("Mul", ["x", "mask3"], ["kept"]),
        helper.make_node("ReduceSum", ["kept", "tokens"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["mask", "tokens"], ["count"], keepdims=1),
        helper.make_node("Div", ["total", "count"], ["pooled"]),
        helper.make_node("MatMul", ["pooled", "w"], ["y"]),
    ]
    axes = [numpy_helper.from_array(np.array([2], np.int64), "last"),
            numpy_helper.from_array(np.array([1], np.int64), "tokens")]  # fmt: skip
    return _save(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", FEATURES]),
                               helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "tokens"])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", CLASSES])],
                 [WEIGHT, *axes])  # fmt: skip


def _linear(path: Path, batch: int | str) -> Path:
    return _save(path, [helper.make_node("MatMul", ["x", "w"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, FEATURES])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, CLASSES])])  # fmt: skip


def _check(tmp_path: Path, model: Path, feeds: dict[str, np.ndarray], batch: int | None = None) -> None:
    recipe_path = tmp_path / "recipe.yaml"
    (tmp_path / "rows.parquet").write_bytes(b"")
    recipe_path.write_text(yaml.safe_dump({"name": "rows", "model": {"path": model.name}, "variants": [
        {"name": "fp16", "precision": "fp16"}], "data": {"path": "rows.parquet", "inputs": {"x": "x"}}}))  # fmt: skip
    check_row_independence(load_recipe(recipe_path), model, read_model_info(model), feeds, {"y": 0}, batch)


def test_a_sequence_first_model_read_as_a_fixed_batch_is_refused_naming_the_batch_axis(tmp_path: Path) -> None:
    model = _sequence_first(tmp_path / "m.onnx")
    feeds = {"x": RNG.normal(size=(STEPS, STEPS, FEATURES)).astype(np.float32)}  # rows on axis 0, as qbench feeds
    with pytest.raises(RecipeError) as caught:
        _check(tmp_path, model, feeds, batch=STEPS)
    message = str(caught.value)
    assert "\n" not in message
    assert "model.path: model input x [4, 'batch', 3] (axis 0 taken as a fixed batch of 4): row " in message
    assert "when the same 4 rows were fed in another order; expected each row's outputs to depend on that row only: " \
           "qbench feeds data rows along axis 0 of every input, so export the model batch-first" in message
    assert message.endswith("; axis 1 ('batch') of 'x' is dynamic and looks like the batch")


def test_a_sequence_first_model_with_both_axes_dynamic_is_refused(tmp_path: Path) -> None:
    """x [seq, batch, feat] -> y [seq, batch, classes], each step's output from the steps before it (as an RNN's):
    fed rows on axis 0, every output row has a row count, but not its own row's outputs."""
    model = _save(tmp_path / "m.onnx", [helper.make_node("CumSum", ["x", "axis"], ["running"]),
                                        helper.make_node("MatMul", ["running", "w"], ["y"])],  # fmt: skip
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", FEATURES])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", "batch", CLASSES])],
                  [WEIGHT, numpy_helper.from_array(np.array(0, np.int64), "axis")])  # fmt: skip
    feeds = {"x": RNG.normal(size=(8, 1, FEATURES)).astype(np.float32)}
    with pytest.raises(RecipeError, match=r"model input x \['seq', 'batch', 3\]: .* axis 1 \('batch'\) of 'x' is "
                                          r"dynamic and looks like the batch$"):  # fmt: skip
        _check(tmp_path, model, feeds)


def test_outputs_that_depend_on_how_many_rows_are_fed_are_refused(tmp_path: Path) -> None:
    """Centring over the batch follows a reordering; only running fewer rows shows the outputs are not per row."""
    feeds = {"x": RNG.normal(size=(20, FEATURES)).astype(np.float32)}
    with pytest.raises(RecipeError, match=r"model input x \['batch', 3\]: row \d's output 'y' changed by .* when each "
                                          r"of the same 8 rows was fed alone; expected each row"):  # fmt: skip
        _check(tmp_path, _batch_centred(tmp_path / "m.onnx"), feeds)


def test_a_model_exported_in_training_mode_is_refused_as_random_not_as_batch_first(tmp_path: Path) -> None:
    """A Dropout left in training mode (torch.onnx.export(..., training=TrainingMode.TRAINING)) gives other outputs
    each run: the error names the node and the export to make, not the batch axis."""
    model = _save(tmp_path / "m.onnx", [helper.make_node("Dropout", ["x", "ratio", "training"], ["dropped"]),
                                        helper.make_node("MatMul", ["dropped", "w"], ["y"])],  # fmt: skip
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", CLASSES])],
                  [WEIGHT, numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
                   numpy_helper.from_array(np.array(True), "training")])  # fmt: skip
    feeds = {"x": RNG.normal(size=(8, FEATURES)).astype(np.float32) + 3.0}
    with pytest.raises(RecipeError) as caught:
        _check(tmp_path, model, feeds)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'recipe.yaml'}: model.path: model input x ['batch', 3]: output 'y' is "
                              "computed through nodes that draw "
                              "random numbers on every run: Dropout, so ")  # fmt: skip
    assert message.endswith("expected a deterministic model: export it in inference mode (PyTorch: model.eval(), and "
                            "torch.onnx.export's training=TrainingMode.EVAL), where Dropout passes its input through")
    _check(tmp_path, _linear(tmp_path / "plain.onnx", "batch"), feeds)  # a deterministic graph passes


def test_a_batch_norm_exported_in_training_mode_is_named_when_rows_depend_on_the_batch(tmp_path: Path) -> None:
    """BatchNormalization with training_mode=1 normalises with the batch's own statistics: the same every run (so
    not random), but a row's outputs change with the rows beside it; the error names the node and the fix."""
    stats = [numpy_helper.from_array(np.full(FEATURES, value, np.float32), name)
             for name, value in (("scale", 1.0), ("bias", 0.0), ("mean", 0.0), ("var", 1.0))]  # fmt: skip
    model = _save(tmp_path / "m.onnx", [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                                                         ["normed", "batch_mean", "batch_var"], training_mode=1),
                                        helper.make_node("MatMul", ["normed", "w"], ["y"])],  # fmt: skip
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", CLASSES])], [WEIGHT, *stats])
    with pytest.raises(RecipeError) as caught:
        _check(tmp_path, model, {"x": RNG.normal(size=(8, FEATURES)).astype(np.float32)})
    assert str(caught.value).endswith(
        "; its 1 BatchNormalization node(s) normalise with each batch's own statistics (training_mode=1): export it "
        "in inference mode (PyTorch: model.eval(), and torch.onnx.export's training=TrainingMode.EVAL), where they "
        "use the running statistics"
    )


def _branch_on_batch_sum(path: Path, batch: int | str) -> Path:
    """y = x @ w if sum(x over the whole batch) > 0 else x @ -w: an `If` on a tensor, as a scripted forward() with
    `if x.sum() > 0:` exports; each branch is a MatMul inside a subgraph."""
    branches = {
        name: helper.make_graph([helper.make_node("MatMul", ["x", weight], [f"y_{name}"])], name, [],
                                [helper.make_tensor_value_info(f"y_{name}", TensorProto.FLOAT, [batch, CLASSES])])
        for name, weight in (("then", "w"), ("else", "minus_w"))
    }  # fmt: skip
    minus_w = numpy_helper.from_array(-numpy_helper.to_array(WEIGHT), "minus_w")
    return _save(path, [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
                        helper.make_node("Greater", ["total", "zero"], ["positive"]),
                        helper.make_node("If", ["positive"], ["y"], then_branch=branches["then"],
                                         else_branch=branches["else"])],  # fmt: skip
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, FEATURES])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, CLASSES])],
                 [WEIGHT, minus_w, numpy_helper.from_array(np.array(0, np.float32), "zero")])  # fmt: skip


@pytest.mark.parametrize("batch", [None, 8])
def test_a_branch_on_a_sum_over_the_batch_is_refused_when_one_row_takes_the_other_branch(
    tmp_path: Path, batch: int | None
) -> None:
    """Rows 1..7 sum positive, row 0 negative: the 8 rows, reordered or any 4 of rows 1..7 take the same branch,
    only row 0 on its own (or copies of it) takes the other. Such a model was accepted, and then every figure was
    computed in batches of 64 whose branch is not what a served row gets (0.58 accuracy where rows alone gave 0.97)."""
    rows = np.abs(RNG.normal(size=(8, FEATURES))).astype(np.float32) + 0.1
    rows[0] *= -1
    model = _branch_on_batch_sum(tmp_path / "m.onnx", "batch" if batch is None else batch)
    how = "fed alone" if batch is None else "fed as a batch of copies of itself"
    with pytest.raises(RecipeError, match=rf"row 0's output 'y' changed by .* when each of the .* rows was {how}; "):
        _check(tmp_path, model, {"x": rows}, batch=batch)


def test_rows_independent_with_padding_masks_or_a_fixed_batch_pass(tmp_path: Path) -> None:
    lengths = RNG.integers(1, 7, size=12)
    mask = (np.arange(6)[None, :] < lengths[:, None]).astype(np.float32)
    _check(tmp_path, _masked_mean(tmp_path / "masked.onnx"),
           {"x": RNG.normal(size=(12, 6, FEATURES)).astype(np.float32), "mask": mask})  # fmt: skip
    rows = RNG.normal(size=(3, FEATURES)).astype(np.float32)  # fewer rows than the batch: repeated to fill it
    _check(tmp_path, _linear(tmp_path / "fixed.onnx", 8), {"x": rows}, batch=8)
    _check(tmp_path, _linear(tmp_path / "dynamic.onnx", "batch"), {"x": rows})


def test_validate_refuses_a_sequence_first_model_in_one_line(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    _sequence_first(tmp_path / "model.onnx")
    sequences = RNG.normal(size=(40, STEPS * FEATURES)).astype(np.float32)
    pd.DataFrame({"x": list(sequences)}).to_parquet(tmp_path / "rows.parquet")
    recipe = {"name": "seq-first", "task": "embedding", "model": {"path": "model.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "calibration": {"samples": 16}},
              "variants": [{"name": "fp16", "precision": "fp16"}], "gate": {"metric": "cosine"}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["validate", str(tmp_path / "recipe.yaml")]) == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: {tmp_path / 'recipe.yaml'}: model.path: model input x [4, 'batch', 3] (axis 0 "
                           "taken as a fixed batch of 4): row ")  # fmt: skip
    assert line.endswith("axis 1 ('batch') of 'x' is dynamic and looks like the batch")


def test_validate_refuses_an_output_with_the_batch_on_axis_1_even_where_batches_are_square(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """y [classes, batch]: evaluated in batches of `classes` rows each batch's output is square, and was read
    transposed (scores per class taken as rows); the check's 8 rows give 2 output rows and say so. (Declared
    [classes, 'batch'], the graph says so itself: the output is refused when it is chosen, before anything runs.)"""
    def save(batch: str | None) -> None:
        _save(tmp_path / "model.onnx", [helper.make_node("MatMul", ["x", "w"], ["scores"]),
                                        helper.make_node("Transpose", ["scores"], ["y"], perm=[1, 0])],
              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [CLASSES, batch])])  # fmt: skip

    save(None)
    rows = RNG.normal(size=(40, FEATURES)).astype(np.float32)
    pd.DataFrame({"x": list(rows), "label": RNG.integers(0, CLASSES, size=40)}).to_parquet(tmp_path / "rows.parquet")
    recipe = {"name": "classes-first", "model": {"path": "model.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "label", "calibration": {"samples": 16},
                       "evaluation": {"batch_size": CLASSES}},
              "variants": [{"name": "fp16", "precision": "fp16"}]}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["validate", str(tmp_path / "recipe.yaml")]) == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert line == (f"error: {tmp_path / 'recipe.yaml'}: model.path: model input x ['batch', 3]: output 'y' had shape "
                    "[2, 8] for 8 rows fed; expected 8 on its axis 0, "
                    "one output row per input row: qbench reads axis 0 of every output as the batch, so make the model "
                    "return it batch-first; axis 1 of 'y' has 8 entries, as many as the rows fed")  # fmt: skip
    save("batch")
    assert main(["validate", str(tmp_path / "recipe.yaml")]) == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: {tmp_path / 'recipe.yaml'}: model.output: no output task 'classification' can "
                           "evaluate: output 'y' of shape [2, 'batch'] gives its rows on axis 1 ('batch', axis 0 of "
                           "input 'x'), not on axis 0")  # fmt: skip


def test_an_output_that_runs_as_a_scalar_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    """No shape stated in the graph, a scalar when run (a batch mean): once failed only at the first measurement."""
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["scores"]),
                               helper.make_node("ReduceMean", ["scores"], ["y"], keepdims=0)], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [WEIGHT])  # fmt: skip
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), model)
    with pytest.raises(RecipeError, match=r"model.path: model input x \['batch', 3\]: output 'y' had shape \[\] for 8 "
                                          r"rows fed; expected 8 on its axis 0"):  # fmt: skip
        _check(tmp_path, model, {"x": RNG.normal(size=(12, FEATURES)).astype(np.float32)})


@pytest.mark.parametrize("keep", [0, 1])
def test_a_batch_statistic_is_refused_as_one_value_per_call_not_as_sequence_first(tmp_path: Path, keep: int) -> None:
    """A batch's mean score, shape [] or [1] when run, declared under a symbol of its own ('stat'): the error advised
    'make the model return it batch-first', which says nothing of a value the whole batch gives."""
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["scores"]),
                               helper.make_node("ReduceMax", ["scores"], ["best"], axes=[1], keepdims=0),
                               helper.make_node("ReduceMean", ["best"], ["y"], axes=[0], keepdims=keep)], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["stat"] if keep else None)],
                              [WEIGHT])  # fmt: skip
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), model)
    with pytest.raises(RecipeError) as caught:
        _check(tmp_path, model, {"x": RNG.normal(size=(12, FEATURES)).astype(np.float32)})
    message = str(caught.value)
    assert f"output 'y' had shape {[1] if keep else []} for 8 rows fed; expected 8 on its axis 0" in message
    assert "a value per call whatever the rows (a statistic of the whole batch" in message
    assert "batch-first" not in message


def _similarity(path: Path, batch: int | str, other: int | str) -> Path:
    """x [batch, feat] -> y = (x @ w) @ (x @ w)^T [batch, other]: every row scored against every row of its batch, as a
    dual encoder's logits are (CLIP's image-text similarity matrix)."""
    return _save(path, [helper.make_node("MatMul", ["x", "w"], ["e"]), helper.make_node("Transpose", ["e"], ["et"]),
                        helper.make_node("MatMul", ["e", "et"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, FEATURES])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, other])])  # fmt: skip


@pytest.mark.parametrize(("batch", "other"), [(8, 8), ("batch", "others")])
def test_a_batch_by_batch_output_is_refused_as_pairing_rows_not_as_sequence_first(
    tmp_path: Path, batch: int | str, other: int | str
) -> None:
    """A [batch, batch] similarity matrix follows a reordering on both axes: the error says so and what to evaluate
    instead; it said 'export the model batch-first', which the model already is."""
    feeds = {"x": RNG.normal(size=(8, FEATURES)).astype(np.float32)}
    with pytest.raises(RecipeError) as caught:
        _check(tmp_path, _similarity(tmp_path / "m.onnx", batch, other), feeds, batch=batch if batch == 8 else None)
    message = str(caught.value)
    assert "when the same 8 rows were fed in another order, and came back as those rows' outputs reordered on its " \
           "axis 1 too: its values pair each row with every row of the batch" in message
    assert "batch-first" not in message


def test_validate_refuses_an_output_whose_later_axis_is_the_batch_symbol_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """['batch', 'batch'] in the graph: refused when the output is chosen, in one line naming it, before anything
    runs."""
    _similarity(tmp_path / "model.onnx", "batch", "batch")
    rows = RNG.normal(size=(40, FEATURES)).astype(np.float32)
    pd.DataFrame({"x": list(rows)}).to_parquet(tmp_path / "rows.parquet")
    recipe = {"name": "pairs", "task": "embedding", "model": {"path": "model.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "calibration": {"samples": 16}},
              "variants": [{"name": "fp16", "precision": "fp16"}]}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["validate", str(tmp_path / "recipe.yaml"), "--no-track"]) == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: {tmp_path / 'recipe.yaml'}: model.output: no output task 'embedding' can "
                           "evaluate: output 'y' of shape ['batch', 'batch'] has the rows on axis 1 too ('batch'): its "
                           "values pair each row with every row of the batch")  # fmt: skip


@pytest.mark.parametrize("class_ids", [False, True])
def test_a_time_major_output_as_long_as_the_rows_checked_is_refused_naming_its_rows_axis(
    tmp_path: Path, class_ids: bool
) -> None:
    """A batch-first input x [batch, 8, feat] transposed in the graph to a time-major output [8, batch, classes] (an
    RNN's per-step outputs): fed the check's 8 rows, axis 0 holds 8 entries too, so only the reordering shows it, on
    axis 1 alone. The error blamed the inputs ('export the model batch-first, or transpose the inputs'), which are
    batch-first; it now names the output's rows axis, its scores or their class ids alike."""
    steps = 8
    head = [helper.make_node("ArgMax", ["scores"], ["y"], axis=2, keepdims=0)] if class_ids else []
    model = _save(tmp_path / "m.onnx", [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
                                        helper.make_node("MatMul", ["xt", "w"], ["y" if not class_ids else "scores"]),
                                        *head],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", steps, FEATURES])],
                  [helper.make_tensor_value_info("y", TensorProto.INT64 if class_ids else TensorProto.FLOAT,
                                                 [steps, None] if class_ids else [steps, None, CLASSES])])  # fmt: skip
    feeds = {"x": RNG.normal(size=(8, steps, FEATURES)).astype(np.float32)}
    with pytest.raises(RecipeError) as caught:
        _check(tmp_path, model, feeds)
    message = str(caught.value)
    assert "when the same 8 rows were fed in another order, and came back as those rows' outputs reordered on its " \
           "axis 1 alone: 'y' gives its rows on axis 1, its axis 0 (of 8, as many as the rows fed) another dimension" \
           in message  # fmt: skip
    assert "make the model return it batch-first (a Transpose moving axis 1 first)" in message
    assert "transpose the inputs" not in message


def test_an_output_squeezed_of_every_unit_axis_is_refused_for_dropping_its_batch_axis_at_one_row(tmp_path: Path) -> None:
    """y = Squeeze(x @ w) with no axes (PyTorch's `.squeeze()`): [8, 2] for 8 rows, [2] for one row fed alone, so a
    last batch or a served request of one row gives no row. It was refused as a value computed over the batch ('let
    no value be computed over the batch (a batch's sum choosing an If branch ...)'), which it is not; the error now
    names the dropped batch axis, the Squeeze without axes, and the fix."""
    model = _save(tmp_path / "m.onnx", [helper.make_node("MatMul", ["x", "w"], ["scores"]),
                                        helper.make_node("Squeeze", ["scores"], ["y"], name="squeeze_all")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["squeezed", CLASSES])])  # fmt: skip
    with pytest.raises(RecipeError) as caught:
        _check(tmp_path, model, {"x": RNG.normal(size=(8, FEATURES)).astype(np.float32)})
    message = str(caught.value)
    assert f"output 'y' had shape [{CLASSES}] where those rows' outputs have shape [1, {CLASSES}] when each of the same " \
           "8 rows was fed alone: output 'y' drops its batch axis for a batch of one row (its graph holds 1 Squeeze " \
           "node(s) given no axes ('squeeze_all')" in message  # fmt: skip
    assert message.endswith("squeeze named axes (PyTorch: .squeeze(-1), not .squeeze())")
    assert "computed over the batch" not in message
