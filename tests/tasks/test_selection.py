"""Choosing the evaluated outputs: the recipe's names, checked, or the task's pick, or a refusal."""

from __future__ import annotations

import numpy as np
import pytest

from qbench.errors import QbenchError
from qbench.modelinfo.signature import ModelInfo, TensorMeta
from qbench.tasks import get_task
from qbench.tasks.selection import choose_outputs, outputs_left_out, outputs_not_compared

LABEL = TensorMeta("label", np.dtype("int64"), (None,))
ZIPMAP = TensorMeta("probs", np.dtype("float32"), (None, 3), "map", "seq(map(int64,tensor(float32)))", (0, 1, 2))
COPY = TensorMeta("ids_out", np.dtype("int64"), (None, 8), passthrough_of="input_ids")
EMBEDDING = TensorMeta("embedding", np.dtype("float32"), (None, 16))
HIDDEN = TensorMeta("hidden", np.dtype("float32"), (None, 8, 16))


def _model(*outputs: TensorMeta) -> ModelInfo:
    return ModelInfo(inputs={}, outputs={o.name: o for o in outputs}, opset=17)


def test_a_classifier_is_judged_on_its_scores_not_its_label_ids(caplog) -> None:
    caplog.set_level("INFO", logger="qbench.tasks.selection")
    [choice] = choose_outputs(get_task("classification"), _model(LABEL, ZIPMAP), None)
    assert (choice.name, choice.index) == ("probs", 1)
    assert "evaluating output probs (seq(map(int64,tensor(float32))))" in caplog.text
    [ids] = choose_outputs(get_task("classification"), _model(LABEL, COPY), None)
    assert ids.name == "label"  # the only readable output: class ids


def test_an_encoder_skips_its_input_copy() -> None:
    [choice] = choose_outputs(get_task("embedding"), _model(COPY, EMBEDDING), None)
    assert choice.name == "embedding"


def test_ambiguity_and_impossibility_are_refused_with_the_outputs_listed() -> None:
    with pytest.raises(QbenchError, match=r"several outputs .* \('embedding', 'hidden'\)"
                                          r".*embedding \(float32, \[None, 16\]\)"):  # fmt: skip
        choose_outputs(get_task("embedding"), _model(COPY, EMBEDDING, HIDDEN), None)
    with pytest.raises(QbenchError, match="no output task 'embedding' can evaluate: output 'label' holds int64 values"):
        choose_outputs(get_task("embedding"), _model(LABEL), None)
    with pytest.raises(QbenchError, match=r"got 'prob', expected one of label, probs \(did you mean 'probs'\?\)"):
        choose_outputs(get_task("classification"), _model(LABEL, ZIPMAP), ["prob"])


def test_several_named_outputs_keep_their_order_and_indices() -> None:
    choices = choose_outputs(get_task("classification"), _model(LABEL, ZIPMAP), ["probs", "label"])
    assert [(c.name, c.index) for c in choices] == [("probs", 1), ("label", 0)]


@pytest.mark.parametrize("task", ["classification", "embedding", "regression", "multilabel"])
def test_an_output_with_a_static_zero_beside_the_batch_is_never_a_candidate(task: str) -> None:
    empty = TensorMeta("empty", np.dtype("float32"), (None, 0))
    scores = TensorMeta("scores", np.dtype("float32"), (None, 5))
    [choice] = choose_outputs(get_task(task), _model(empty, scores), None)
    assert (choice.name, choice.index) == ("scores", 1)
    with pytest.raises(QbenchError, match=r"output 'empty' of shape \[None, 0\] holds no values"
                                          r".*outputs it can read: scores"):  # fmt: skip
        choose_outputs(get_task(task), _model(empty, scores), ["empty"])


@pytest.mark.parametrize("task", ["classification", "embedding", "regression", "multilabel"])
def test_a_declared_scalar_output_is_never_a_candidate(tmp_path, task: str) -> None:
    """A batch statistic exported beside the scores (shape []) gives no row per input row: it was tied with the
    scores, so a recipe naming no output was refused, and one naming it failed only once every variant was built."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from qbench.modelinfo.signature import read_model_info

    weight = numpy_helper.from_array(np.ones((3, 5), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["scores"]),
         helper.make_node("ReduceMean", ["scores"], ["total"], keepdims=0)],
        "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 5])], [weight])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "m.onnx")
    model = read_model_info(tmp_path / "m.onnx")
    [choice] = choose_outputs(get_task(task), model, None)
    assert (choice.name, choice.index) == ("scores", 1)
    with pytest.raises(QbenchError, match=r"^output 'total' is a scalar \(shape \[\]\): qbench reads one output row "
                                          r"per input row, along axis 0; outputs it can read: scores"):  # fmt: skip
        choose_outputs(get_task(task), model, ["total"])


@pytest.mark.parametrize("task", ["classification", "embedding", "regression", "multilabel"])
def test_an_output_of_a_fixed_length_per_call_beside_dynamic_rows_is_never_a_candidate(tmp_path, task: str) -> None:
    """A batch statistic kept as `[1]` (ReduceMean with keepdims over the batch's best scores) gives one value per
    call, whatever the rows: it tied with the scores (a recipe naming no output was refused), and named it failed the
    run check as an output to 'return batch-first'. A fixed-batch model's `[1, 5]` output stays its rows."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from qbench.modelinfo.signature import read_model_info

    def save(rows: str | int, stat: list) -> ModelInfo:
        weight = numpy_helper.from_array(np.ones((3, 5), np.float32), "w")
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["scores"]),
             helper.make_node("ReduceMax", ["scores"], ["best"], axes=[1], keepdims=0),
             helper.make_node("ReduceMean", ["best"], ["mean_score"], axes=[0], keepdims=1),
             helper.make_node("ArgMax", ["scores"], ["label"], axis=1, keepdims=0)],
            "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 3])],
            [helper.make_tensor_value_info("mean_score", TensorProto.FLOAT, stat),
             helper.make_tensor_value_info("scores", TensorProto.FLOAT, [rows, 5]),
             helper.make_tensor_value_info("label", TensorProto.INT64, [1])], [weight])  # fmt: skip
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
        return read_model_info(tmp_path / "m.onnx")

    model = save("batch", [1])
    # declared [1] as onnxmltools declares a LightGBM label, computed one per row: the graph, not the declaration
    assert (model.outputs["mean_score"].fixed, model.outputs["label"].fixed) == (True, False)
    [choice] = choose_outputs(get_task(task), model, None)
    assert (choice.name, choice.index) == ("scores", 1)
    with pytest.raises(QbenchError, match=r"^output 'mean_score' of shape \[1\] is fixed where input 'x' takes its "
                                          r"rows on a dynamic axis 0 \('batch'\): it gives 1 on axis 0 per call .*"
                                          r"outputs it can read: scores"):  # fmt: skip
        choose_outputs(get_task(task), model, ["mean_score"])
    fixed = save(1, [1, 5])  # a batch of exactly one row: its axis 0 is that row
    assert choose_outputs(get_task(task), fixed, ["mean_score"])[0].name == "mean_score"


def test_static_shapes_a_trace_left_inside_the_graph_do_not_make_per_row_outputs_fixed(tmp_path) -> None:
    """Outputs declared [1] and [1, 5] (a trace at batch 1) whose producers' value_info says the same: shape inference
    took those as given and confirmed the declarations, so a classifier running 4 rows to [4] and [4, 5] was refused
    as a per-call statistic ("no output task 'classification' can evaluate"). The graph's own computation decides."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from qbench.modelinfo.signature import read_model_info

    weight = numpy_helper.from_array(np.ones((3, 5), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["scores"]), helper.make_node("Identity", ["scores"], ["inner"]),
         helper.make_node("Identity", ["inner"], ["probabilities"]),
         helper.make_node("ArgMax", ["scores"], ["id"], axis=1, keepdims=0),
         helper.make_node("Identity", ["id"], ["label"])],
        "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [1, 5])], [weight],
        value_info=[helper.make_tensor_value_info("id", TensorProto.INT64, [1]),
                    helper.make_tensor_value_info("inner", TensorProto.FLOAT, [1, 5])])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    model = read_model_info(tmp_path / "m.onnx")
    assert (model.outputs["label"].fixed, model.outputs["probabilities"].fixed) == (False, False)
    assert [c.name for c in choose_outputs(get_task("classification"), model, None)] == ["probabilities"]


def test_a_fixed_batch_model_is_not_shape_inferred_for_outputs_fixed_per_call(tmp_path, monkeypatch) -> None:
    """Whether the graph computes an output fixed matters only beside an input with dynamic rows: a fixed-batch model
    (static axis 0, as exported for TensorRT or an NPU) ran onnx's shape inference for nothing (0.33 s of 0.58 s of
    reading a 4000-node [1, 64] MLP); beside dynamic rows it still runs."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from qbench.modelinfo import signature as modelinfo

    inferred = []
    real = modelinfo._computed_shapes
    monkeypatch.setattr(modelinfo, "_computed_shapes", lambda model: inferred.append(model.graph.name) or real(model))
    for rows in (1, "batch"):
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]),
                                   helper.make_node("ReduceMean", ["h"], ["stat"], axes=[0], keepdims=1)],
                                  f"rows {rows}",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 3])],
                                  [helper.make_tensor_value_info("stat", TensorProto.FLOAT, [1, 5])],
                                  [numpy_helper.from_array(np.ones((3, 5), np.float32), "w")])  # fmt: skip
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
        assert modelinfo.read_model_info(tmp_path / "m.onnx").outputs["stat"].fixed == (rows == "batch")
    assert inferred == ["rows batch"]


@pytest.mark.parametrize("task", ["classification", "multilabel"])
def test_an_axis_as_long_as_the_inputs_is_never_read_as_classes(task: str) -> None:
    """Token scores `[batch, seq]` with padding and an attention map `[batch, seq, seq]`: classification read the
    positions as classes (labels per row: the arg-max position, FP32 0.18 and every variant passed; token labels:
    the attention map as per-token class scores). A fixed class axis beside them is read."""
    ids = TensorMeta("ids", np.dtype("int64"), (None, None), dim_names=("batch", "seq"))
    scores = TensorMeta("token_scores", np.dtype("float32"), (None, None), dim_names=("batch", "seq"))
    attn = TensorMeta("attn", np.dtype("float32"), (None, None, None), dim_names=("batch", "seq", "seq"))
    own = TensorMeta("pairs", np.dtype("float32"), (None, 4, None), dim_names=("batch", None, "k"))
    fixed = TensorMeta("logits", np.dtype("float32"), (None, 3), dim_names=("batch", None))
    model = ModelInfo(inputs={"ids": ids}, outputs={o.name: o for o in (scores, attn, fixed)}, opset=17)
    assert [c.name for c in choose_outputs(get_task(task), model, None)] == ["logits"]
    with pytest.raises(QbenchError, match=r"^output 'token_scores' of shape \['batch', 'seq'\] has on its last axis a "
                                          r"length of the inputs \('seq', axis 1 of input 'ids'\), not a fixed set of "
                                          r"classes: .*outputs it can read: logits"):  # fmt: skip
        choose_outputs(get_task(task), model, ["token_scores"])
    alone = ModelInfo(inputs={"ids": ids}, outputs={"attn": attn, "pairs": own}, opset=17)
    with pytest.raises(QbenchError, match=r"output 'attn' .* \('seq', axis 1 of input 'ids'\)"):
        choose_outputs(get_task(task), alone, ["attn"])
    if task == "classification":  # a symbolic class axis no input carries stays classes (checked against FP32's width)
        assert choose_outputs(get_task(task), alone, ["pairs"])[0].name == "pairs"
    assert choose_outputs(get_task("regression"), model, ["token_scores"])[0].name == "token_scores"


@pytest.mark.parametrize("task", ["embedding", "regression", "multilabel"])
@pytest.mark.parametrize("dtype", ["int8", "uint8", "bool"])
def test_an_integer_output_of_a_float_task_is_refused_with_what_reads_it(task: str, dtype: str) -> None:
    """A score an exporter casts to int8 (or a `y > 0` flag): the refusal said what the task reads, not what to do."""
    cast = TensorMeta("y", np.dtype(dtype), (None, 1))
    with pytest.raises(QbenchError, match=rf"^output 'y' holds {dtype} values: task '{task}' reads float outputs only; "
                                          r"expected the float output before the Cast \(model.output\), task "
                                          r"classification for class ids, or task structured"):  # fmt: skip
        choose_outputs(get_task(task), _model(cast, EMBEDDING), ["y"])


def test_an_output_with_no_shape_stated_is_not_taken_for_a_scalar() -> None:
    unshaped = TensorMeta("unshaped", np.dtype("float32"), ())  # what its runs give is checked then
    assert choose_outputs(get_task("classification"), _model(unshaped), None)[0].name == "unshaped"


@pytest.mark.parametrize("task", ["classification", "embedding", "regression", "multilabel"])
def test_an_output_whose_rows_the_graph_puts_after_a_leading_axis_is_never_a_candidate(tmp_path, task: str) -> None:
    """[1, 'batch', 5] (a leading unit axis, as an Unsqueeze before the output leaves it): its rows are on axis 1.
    Classification took it for per-token scores (named, it was accepted; alone, token labels were asked for:
    'scores every token'), embedding and regression tied it with the real output and refused both."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from qbench.modelinfo.signature import read_model_info

    weight = numpy_helper.from_array(np.ones((3, 5), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["scores"]),
         helper.make_node("Unsqueeze", ["scores", "zero"], ["lead"])],
        "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("lead", TensorProto.FLOAT, [1, "batch", 5]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 5])],
        [weight, numpy_helper.from_array(np.array([0], np.int64), "zero")])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "m.onnx")
    model = read_model_info(tmp_path / "m.onnx")
    [choice] = choose_outputs(get_task(task), model, None)
    assert (choice.name, choice.index) == ("scores", 1)
    with pytest.raises(QbenchError, match=r"^output 'lead' of shape \[1, 'batch', 5\] gives its rows on axis 1 "
                                          r"\('batch', axis 0 of input 'x'\), not on axis 0: .*outputs it can read: "
                                          r"scores"):  # fmt: skip
        choose_outputs(get_task(task), model, ["lead"])


def test_an_output_sharing_the_inputs_row_axis_name_on_axis_0_is_read() -> None:
    """The rule reads names: rows first ('batch' on axis 0 of both), or an axis 0 the graph leaves unknown, stay."""
    x = TensorMeta("x", np.dtype("float32"), (None, 3), dim_names=("batch", None))
    first = TensorMeta("first", np.dtype("float32"), (None, 5), dim_names=("batch", None))
    unknown = TensorMeta("unknown", np.dtype("float32"), (None, None, 5), dim_names=(None, "batch", None))
    for output in (first, unknown):
        model = ModelInfo(inputs={"x": x}, outputs={output.name: output}, opset=17)
        assert choose_outputs(get_task("embedding"), model, None)[0].name == output.name


@pytest.mark.parametrize("task", ["classification", "embedding", "regression", "multilabel"])
def test_an_output_computed_from_no_input_is_never_a_candidate(tmp_path, task: str) -> None:
    """A converter's graph returning an initializer ('bias', [5]) or a Constant's value beside the scores: it is the
    same for every batch, and was tied with the scores ('several outputs ... could evaluate')."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from qbench.modelinfo.signature import read_model_info

    table = helper.make_tensor("table", TensorProto.FLOAT, [2, 5], np.zeros(10, np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["scores"]), helper.make_node("Constant", [], ["made"], value=table),
         helper.make_node("Relu", ["made"], ["table_out"])],
        "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("bias", TensorProto.FLOAT, [5]),
         helper.make_tensor_value_info("table_out", TensorProto.FLOAT, [2, 5]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 5])],
        [numpy_helper.from_array(np.ones((3, 5), np.float32), "w"),
         numpy_helper.from_array(np.ones(5, np.float32), "bias")])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "m.onnx")
    model = read_model_info(tmp_path / "m.onnx")
    [choice] = choose_outputs(get_task(task), model, None)
    assert (choice.name, choice.index) == ("scores", 2)
    for name in ("bias", "table_out"):
        with pytest.raises(QbenchError, match=rf"^output '{name}' is computed from no model input \(an initializer or "
                                              r"a Constant\): .*outputs it can read: scores"):  # fmt: skip
            choose_outputs(get_task(task), model, [name])


def test_a_tensor_inside_the_graph_is_named_as_such_with_how_to_return_it(tmp_path) -> None:
    """A detector's raw boxes before its NonMaxSuppression are a tensor of the graph, not an output: naming them in
    model.outputs said only `got 'raw', expected one of dets`, as if misspelt; it now says what the tensor is and how
    to return it."""
    import onnx
    from onnx import TensorProto, helper

    from qbench.modelinfo.signature import read_model_info

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["raw"]), helper.make_node("NonZero", ["raw"], ["dets"])], "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("dets", TensorProto.INT64, [2, "n"])])  # fmt: skip
    path = tmp_path / "det.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    model = read_model_info(path)
    assert model.inner == {"raw": "Relu"}
    with pytest.raises(QbenchError) as raised:
        choose_outputs(get_task("structured"), model, ["raw"])
    assert str(raised.value).startswith("model output 'raw' is a tensor inside the graph (made by a Relu node), not "
                                        "one of its outputs (dets): qbench evaluates the graph's outputs only;")
    assert "make_tensor_value_info('raw', elem_type, None) to model.graph.output" in str(raised.value)
    with pytest.raises(QbenchError, match=r"got 'dest', expected one of dets \(did you mean 'dets'\?\)"):
        choose_outputs(get_task("structured"), model, ["dest"])  # a misspelt output is still one


def test_outputs_left_out_of_the_evaluation_are_named_with_the_ones_judged() -> None:
    """A second head beside the scores (a regression 'aux') that the recipe does not evaluate is compared by no figure
    and no gate check: FP32's note names it and the output judged instead; an input's copy is no prediction to name,
    and nothing is said where every output is evaluated."""
    aux = TensorMeta("aux", np.dtype("float32"), (None, 1))
    model = _model(EMBEDDING, aux, COPY)
    chosen = choose_outputs(get_task("embedding"), model, ["embedding"])
    note = outputs_not_compared(outputs_left_out(model, chosen), chosen)
    assert note is not None and note.startswith("output aux (float32, [None, 1]) not compared with FP32: every figure "
                                                "and the gate judge 'embedding' alone")  # fmt: skip
    assert "ids_out" not in note
    both = choose_outputs(get_task("regression"), model, ["embedding", "aux"])
    assert outputs_left_out(model, both) == []


def test_many_outputs_left_out_are_counted_past_the_first_named() -> None:
    """A decoder returning its cache (present.0 ... present.9) beside the logits: the note names four and counts the
    rest, where it would list every cache tensor."""
    logits = TensorMeta("logits", np.dtype("float32"), (None, 8, 50))
    cache = [TensorMeta(f"present.{i}", np.dtype("float32"), (None, 2, 8, 4)) for i in range(10)]
    model = _model(logits, *cache)
    chosen = choose_outputs(get_task("structured"), model, ["logits"])
    note = outputs_not_compared(outputs_left_out(model, chosen), chosen)
    assert note is not None and note.startswith("outputs present.0 (float32, [None, 2, 8, 4]), present.1 (float32, "
                                                "[None, 2, 8, 4]), present.2 (float32, [None, 2, 8, 4]), present.3 "
                                                "(float32, [None, 2, 8, 4]) and 6 more not compared with "
                                                "FP32")  # fmt: skip
    assert "present.4" not in note


def test_a_classifiers_label_beside_its_judged_scores_is_not_named_but_another_integer_output_is(tmp_path) -> None:
    """skl2onnx's classifiers return the label the graph picks from its class table beside the scores: judging the
    scores judges that choice, so a note naming the label on every such model said nothing. An integer output the
    graph computes otherwise (no class table) is still named."""
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.linear_model import LogisticRegression

    from qbench.modelinfo.signature import read_model_info

    features = np.random.default_rng(0).normal(size=(60, 4)).astype(np.float32)
    classifier = LogisticRegression(max_iter=200).fit(features, (features[:, 0] > 0).astype(np.int64))
    path = tmp_path / "classifier.onnx"
    path.write_bytes(skl2onnx.to_onnx(classifier, features[:1], target_opset={"": 17, "ai.onnx.ml": 3})
                     .SerializeToString())  # fmt: skip
    model = read_model_info(path)
    chosen = choose_outputs(get_task("classification"), model, None)
    assert [c.name for c in chosen] == ["output_probability"]
    assert outputs_left_out(model, chosen) == []
    counts = TensorMeta("counts", np.dtype("int64"), (None,))
    with_counts = ModelInfo(inputs=model.inputs, outputs={**model.outputs, "counts": counts}, opset=17)
    note = outputs_not_compared(outputs_left_out(with_counts, chosen), chosen)
    assert note is not None and note.startswith("output counts (int64, [None]) not compared")
    assert "output_label" not in note
