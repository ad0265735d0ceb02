"""Model info of graphs converters produce: sequence/map outputs and outputs that copy an input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qbench.modelinfo.signature import TensorMeta, read_model_info, shared_by_batch


def _save(tmp_path: Path, nodes: list, inputs: list, outputs: list, ml: bool = False) -> Path:
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("ai.onnx.ml", 3)] if ml else [])
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs), opset_imports=opsets)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    return path


def test_dynamic_dims_keep_their_names(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, "batch", None, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, "batch", None, 6])
    meta = read_model_info(_save(tmp_path, [helper.make_node("Identity", ["x"], ["y"])], [x], [y])).inputs["x"]
    assert meta.shape == (8, None, None, 6)
    assert meta.dim_names == (None, "batch", None, None)
    assert meta.shape_text() == "[8, 'batch', None, 6]"


def test_a_zipmap_output_is_a_map_with_its_class_keys(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])
    map_type = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    )
    probabilities = helper.make_value_info("probabilities", map_type)
    zipmap = helper.make_node("ZipMap", ["x"], ["probabilities"], domain="ai.onnx.ml", classlabels_int64s=[1, 5, 7])
    info = read_model_info(_save(tmp_path, [zipmap], [x], [probabilities], ml=True))
    meta = info.outputs["probabilities"]
    assert (meta.kind, meta.dtype, meta.shape, meta.class_keys) == ("map", np.dtype("float32"), (None, 3), (1, 5, 7))
    assert meta.describe() == "probabilities (seq(map(int64,tensor(float32))))"


def test_other_non_tensor_outputs_are_kept_and_named(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])
    sequence = helper.make_value_info("parts", helper.make_sequence_type_proto(helper.make_tensor_type_proto(1, None)))
    node = helper.make_node("SequenceConstruct", ["x", "x"], ["parts"])
    meta = read_model_info(_save(tmp_path, [node], [x], [sequence])).outputs["parts"]
    assert (meta.kind, meta.type_name) == ("other", "seq(tensor(float32))")


def test_an_output_without_a_stated_shape_is_described_so_not_as_a_scalar(tmp_path: Path) -> None:
    """A ConcatFromSequence output added as onnx.helper.make_tensor_value_info(name, type, None): it was listed
    'joined (float32, [])', as a scalar output is, which qbench passes over."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])
    joined = helper.make_tensor_value_info("joined", TensorProto.FLOAT, None)
    total = helper.make_tensor_value_info("total", TensorProto.FLOAT, [])
    nodes = [helper.make_node("Relu", ["x"], ["joined"]), helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0)]
    outputs = read_model_info(_save(tmp_path, nodes, [x], [joined, total])).outputs
    assert [outputs["joined"].describe(), outputs["total"].describe()] == [
        "joined (float32, shape not stated)", "total (float32, [])"]


def test_outputs_copying_an_input_are_marked(tmp_path: Path) -> None:
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [None, 4])
    copy = helper.make_tensor_value_info("ids_copy", TensorProto.FLOAT, [None, 4])
    real = helper.make_tensor_value_info("doubled", TensorProto.INT64, [None, 4])
    nodes = [
        helper.make_node("Identity", ["input_ids"], ["i1"]),
        helper.make_node("Cast", ["i1"], ["ids_copy"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["input_ids", "input_ids"], ["doubled"]),
    ]
    outputs = read_model_info(_save(tmp_path, nodes, [ids], [copy, real])).outputs
    assert outputs["ids_copy"].passthrough_of == "input_ids"
    assert outputs["doubled"].passthrough_of is None


def _model(nodes: list, outputs: list, initializers: list | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
                              outputs, initializers or [])  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def test_a_classifiers_class_labels_name_its_score_columns(tmp_path: Path) -> None:
    """An ONNX-ML LinearClassifier scores its classes in classlabels order; a Normalizer keeps the columns."""
    scores = helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 3])
    label = helper.make_tensor_value_info("label", TensorProto.INT64, [None])
    nodes = [helper.make_node("LinearClassifier", ["x"], ["label", "raw"], domain="ai.onnx.ml",
                              classlabels_ints=[1, 2, 5],
                              coefficients=[0.0] * 12, intercepts=[0.0] * 3),
             helper.make_node("Normalizer", ["raw"], ["probabilities"], domain="ai.onnx.ml", norm="L1")]  # fmt: skip
    onnx.save(_model(nodes, [label, scores]), str(tmp_path / "m.onnx"))
    outputs = read_model_info(tmp_path / "m.onnx").outputs
    assert outputs["probabilities"].class_keys == (1, 2, 5)
    assert outputs["label"].class_keys is None


@pytest.mark.parametrize(("op", "constant", "named"), [("Mul", 1.0, True), ("Add", -3.0, True), ("Div", 2.0, True),
                                                     ("Mul", -1.0, False), ("Mul", "vector", False)])
def test_scores_scaled_by_one_positive_constant_keep_the_classifiers_class_table(tmp_path: Path, op, constant,
                                                                                named) -> None:
    """onnxmltools writes a LightGBM classifier's probabilities as Mul(scores, 1): the class table stopped there, so
    string classes were refused ('not integer class ids') and classes [1, 2, 5] were read as column ids. A shift by
    one constant or a scale by one positive constant keeps each column's class; a negative one (which reverses the
    order) or a constant per column does not pass as one."""
    from onnx import numpy_helper

    value = np.array([1.0, 2.0, 3.0], np.float32) if constant == "vector" else np.array(constant, np.float32)
    scores = helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 3])
    label = helper.make_tensor_value_info("label", TensorProto.STRING, [None])
    nodes = [helper.make_node("LinearClassifier", ["x"], ["label", "raw"], domain="ai.onnx.ml",
                              classlabels_strings=["a", "b", "c"], coefficients=[0.0] * 12, intercepts=[0.0] * 3),
             helper.make_node(op, ["raw", "c"], ["probabilities"])]  # fmt: skip
    onnx.save(_model(nodes, [label, scores], [numpy_helper.from_array(value, "c")]), str(tmp_path / "m.onnx"))
    outputs = read_model_info(tmp_path / "m.onnx").outputs
    assert outputs["probabilities"].class_keys == (("a", "b", "c") if named else None)


def test_a_constant_table_indexed_by_the_argmax_names_the_columns(tmp_path: Path) -> None:
    """label = classes[ArgMax(scores, axis=1)] through a Reshape, the table a Constant node; an arg-max over the rows
    (axis 0) is no class lookup."""
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, 4])
    label = helper.make_tensor_value_info("label", TensorProto.STRING, [None])
    table = helper.make_tensor("t", TensorProto.STRING, [3], [b"cat", b"dog", b"owl"])

    def nodes(axis: int) -> list:
        return [helper.make_node("Softmax", ["x"], ["p"], axis=1), helper.make_node("Identity", ["p"], ["scores"]),
                helper.make_node("ArgMax", ["p"], ["i"], axis=axis, keepdims=1),
                helper.make_node("Reshape", ["i", "flat"], ["i1"]),
                helper.make_node("Constant", [], ["classes"], value=table),
                helper.make_node("Gather", ["classes", "i1"], ["label"], axis=0)]  # fmt: skip

    flat = onnx.numpy_helper.from_array(np.array([-1], np.int64), "flat")
    onnx.save(_model(nodes(1), [scores, label], [flat]), str(tmp_path / "by_class.onnx"))
    assert read_model_info(tmp_path / "by_class.onnx").outputs["scores"].class_keys == ("cat", "dog", "owl")
    onnx.save(_model(nodes(0), [scores, label], [flat]), str(tmp_path / "by_row.onnx"))
    assert read_model_info(tmp_path / "by_row.onnx").outputs["scores"].class_keys is None


def _sklearn_onnx(tmp_path: Path, estimator, name: str) -> Path:
    skl2onnx = __import__("pytest").importorskip("skl2onnx")
    from sklearn.datasets import load_iris

    x, y = load_iris(return_X_y=True)
    fitted = estimator.fit(x.astype(np.float32), y)
    options = {} if name == "kmeans" else {"zipmap": False}  # a clusterer has no ZipMap to switch off
    onx = skl2onnx.to_onnx(fitted, x[:1].astype(np.float32), options=options, target_opset={"": 17, "ai.onnx.ml": 3})
    path = tmp_path / f"{name}.onnx"
    onnx.save(onx, str(path))
    return path


def test_scores_whose_argmax_is_not_the_graphs_label_are_marked_and_the_label_is_evaluated(tmp_path: Path) -> None:
    """KMeans' label is ArgMin(distances) behind a Sqrt; an SVC without probabilities labels by one-vs-one votes.
    Reading either score output by its arg-max scored KMeans 0.0 (the farthest cluster) for a model at 1.0."""
    from sklearn.cluster import KMeans
    from sklearn.svm import SVC

    from qbench.tasks import get_task
    from qbench.tasks.selection import choose_outputs

    for estimator, name, scores in ((KMeans(3, n_init=3, random_state=0), "kmeans", "scores"),
                                    (SVC(probability=False), "svc", "probabilities")):  # fmt: skip
        info = read_model_info(_sklearn_onnx(tmp_path, estimator, name))
        assert info.outputs[scores].off_label is not None and info.outputs["label"].off_label is None
        assert info.outputs[scores].lowest_wins == (name == "kmeans")  # decided by their arg-min, as the label is
        [choice] = choose_outputs(get_task("classification"), info, None)
        assert choice.name == "label"
    from sklearn.linear_model import LogisticRegression

    logistic = read_model_info(_sklearn_onnx(tmp_path, LogisticRegression(max_iter=300), "logistic"))
    assert logistic.outputs["probabilities"].off_label is None
    assert choose_outputs(get_task("classification"), logistic, None)[0].name == "probabilities"


def test_the_graph_says_whether_its_scores_are_probabilities_or_logits(tmp_path: Path) -> None:
    """A one-column binary score was read as a probability whenever FP32's values fell within [0, 1], so logits of
    0.38..0.74 were thresholded at 0.5 (accuracy 0.90 instead of the model's 0.67)."""
    weight = onnx.numpy_helper.from_array(np.ones((4, 1), np.float32), "w")
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 1])
               for n in ("logit", "probability", "other")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["raw"]), helper.make_node("Flatten", ["raw"], ["logit"]),
             helper.make_node("Sigmoid", ["raw"], ["p"]), helper.make_node("Identity", ["p"], ["probability"]),
             helper.make_node("Abs", ["raw"], ["other"])]  # fmt: skip
    onnx.save(_model(nodes, outputs, [weight]), str(tmp_path / "m.onnx"))
    found = read_model_info(tmp_path / "m.onnx").outputs
    assert (found["logit"].probabilities, found["probability"].probabilities, found["other"].probabilities) == (
        False, True, None
    )  # fmt: skip



@pytest.mark.parametrize(("op", "score_first", "cut"), [
    ("Less", True, (0.25, True)), ("GreaterOrEqual", True, (0.25, True)), ("Greater", True, (0.25, False)),
    ("LessOrEqual", True, (0.25, False)), ("Less", False, (0.25, False)), ("Greater", False, (0.25, True)),
])  # fmt: skip
def test_a_score_the_graph_compares_with_a_constant_is_split_there(tmp_path: Path, op, score_first, cut) -> None:
    """Where a label is a comparison of a single score column (here through a Reshape) with one constant, a score equal
    to it is the upper class exactly when the comparison says so (Less(s, c) is false at s = c: upper; Less(c, s) is
    false there too: lower). A score nothing compares, or one compared with two different constants, states no cut; a
    comparison that makes no label (a float output of its own) is no cut either."""
    constants = [onnx.numpy_helper.from_array(np.ones((4, 1), np.float32), "w"),
                 onnx.numpy_helper.from_array(np.array([0.25], np.float32), "c"),
                 onnx.numpy_helper.from_array(np.array(0.5, np.float32), "d"),
                 onnx.numpy_helper.from_array(np.array([-1, 1], np.int64), "shape")]  # fmt: skip
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 1]) for n in ("scores", "plain", "twice")]
    outputs += [helper.make_tensor_value_info(n, TensorProto.BOOL, [None, 1]) for n in ("flag", "flag2", "flag3")]
    outputs.append(helper.make_tensor_value_info("weight", TensorProto.FLOAT, [None]))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["scores"]),
             helper.make_node("Reshape", ["scores", "shape"], ["flat"]),
             helper.make_node(op, ["flat", "c"] if score_first else ["c", "flat"], ["flag"]),
             helper.make_node("Abs", ["scores"], ["plain"]), helper.make_node("Neg", ["scores"], ["twice"]),
             helper.make_node("Less", ["twice", "c"], ["flag2"]), helper.make_node("Less", ["twice", "d"], ["flag3"]),
             helper.make_node("Less", ["flat", "d"], ["small"]),
             helper.make_node("Cast", ["small"], ["weight"], to=TensorProto.FLOAT)]  # fmt: skip
    onnx.save(_model(nodes, outputs, constants), str(tmp_path / "m.onnx"))
    found = read_model_info(tmp_path / "m.onnx").outputs
    assert found["scores"].decision_cut == cut
    assert (found["plain"].decision_cut, found["twice"].decision_cut) == (None, None)


def _string_class_onnx(tmp_path: Path, estimator, name: str, zipmap: bool) -> Path:
    """`estimator` fitted on iris with string classes 'no' / 'yes' (setosa or not), converted by skl2onnx."""
    skl2onnx = __import__("pytest").importorskip("skl2onnx")
    from sklearn.datasets import load_iris

    x, y = load_iris(return_X_y=True)
    fitted = estimator.fit(x.astype(np.float32), np.where(y == 0, "yes", "no"))
    onx = skl2onnx.to_onnx(fitted, x[:1].astype(np.float32), options={} if zipmap else {"zipmap": False},
                           target_opset={"": 17, "ai.onnx.ml": 3})  # fmt: skip
    path = tmp_path / f"{name}-{'zipmap' if zipmap else 'tensor'}.onnx"
    onnx.save(onx, str(path))
    return path


def test_a_string_label_output_carries_its_classifiers_class_table(tmp_path: Path) -> None:
    """A binary SVC's string label was refused ('holds object values'), so its scores [-d, d] were evaluated and read
    backwards. The label now carries the SVMClassifier's classes and is evaluated; its scores (tensor or ZipMap) are
    marked off-label."""
    from sklearn.svm import SVC

    from qbench.tasks import get_task
    from qbench.tasks.selection import choose_outputs

    for zipmap, label, scores in ((False, "label", "probabilities"), (True, "output_label", "output_probability")):
        info = read_model_info(_string_class_onnx(tmp_path, SVC(), "svc", zipmap))
        assert info.outputs[label].dtype == object and info.outputs[label].class_keys == ("no", "yes")
        assert info.outputs[scores].off_label is not None
        assert [c.name for c in choose_outputs(get_task("classification"), info, None)] == [label]


def test_scores_normalised_by_a_statistic_of_their_row_keep_the_class_table(tmp_path: Path) -> None:
    """GaussianNB's probabilities are exp(scores - logsumexp(scores)), KNN's votes / their sum: the graph's
    classes[ArgMax(scores)] still names the columns, so string labels read through it."""
    from sklearn.naive_bayes import GaussianNB
    from sklearn.neighbors import KNeighborsClassifier

    for estimator, name in ((GaussianNB(), "gnb"), (KNeighborsClassifier(), "knn")):
        info = read_model_info(_string_class_onnx(tmp_path, estimator, name, zipmap=False))
        assert info.outputs["probabilities"].class_keys == ("no", "yes"), name
        assert info.outputs["label"].class_keys == ("no", "yes"), name


def test_an_argmax_output_knows_how_many_class_ids_it_can_give(tmp_path: Path) -> None:
    """ids = Cast(ArgMax(x @ w, axis=-1)) with w (4, 10): ten classes, so a label 42 is no class of this model; an
    arg-max over a dynamic axis says nothing."""
    from qbench.tasks.base import LabelError
    from qbench.tasks.classification import Classification

    weights = onnx.numpy_helper.from_array(np.zeros((4, 10), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["s"]),
             helper.make_node("ArgMax", ["s"], ["i"], axis=-1, keepdims=0),
             helper.make_node("Cast", ["i"], ["ids"], to=TensorProto.INT32)]  # fmt: skip
    ids = helper.make_tensor_value_info("ids", TensorProto.INT32, [None])
    onnx.save(_model(nodes, [ids], [weights]), str(tmp_path / "ids.onnx"))
    meta = read_model_info(tmp_path / "ids.onnx").outputs["ids"]
    assert meta.class_count == 10
    task = Classification()
    task.check_labels(np.array([0, 9, 3]), meta, np.arange(3))
    with pytest.raises(LabelError, match=r"42 hold class ids outside 0..9 \(output 'ids' has 10 classes\)"):
        task.check_labels(np.array([0, 42, 3]), meta, np.arange(3))
    by_rows = [helper.make_node("ArgMax", ["x"], ["ids"], axis=0, keepdims=0)]  # over the (dynamic) rows
    onnx.save(_model(by_rows, [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])]),
              str(tmp_path / "rows.onnx"))  # fmt: skip
    assert read_model_info(tmp_path / "rows.onnx").outputs["ids"].class_count is None


def test_arithmetic_on_scores_is_traced_back_to_what_makes_them(tmp_path: Path) -> None:
    """Any Add or Sub making the output was read as a linear layer's logits, so an average of two sigmoids (a
    probability) was thresholded at 0 and every row became class 1. The walk now goes back through element-wise
    arithmetic (constants aside) to a Sigmoid/Softmax or a linear layer; other ops, or branches that disagree, say
    nothing (FP32's values then decide)."""
    constants = [onnx.numpy_helper.from_array(np.array(v, np.float32), n)
                 for n, v in (("w", np.ones((4, 1))), ("b", [0.5]), ("half", 0.5), ("k", 1.1), ("one", 1.0),
                              ("t", 2.0))]  # fmt: skip
    node = helper.make_node
    nodes = [node("MatMul", ["x", "w"], ["z"]), node("Sigmoid", ["z"], ["p1"]), node("Mul", ["z", "k"], ["z2"]),
             node("Sigmoid", ["z2"], ["p2"]), node("Mul", ["p1", "half"], ["a"]), node("Mul", ["p2", "half"], ["c"]),
             node("Add", ["a", "c"], ["averaged"]), node("Mean", ["p1", "p2"], ["mean"]),
             node("Sub", ["one", "p1"], ["complement"]), node("Add", ["z", "b"], ["biased"]),
             node("Div", ["biased", "t"], ["tempered"]), node("Add", ["p1", "z"], ["mixed"]),
             node("Relu", ["z"], ["r"]), node("Add", ["r", "b"], ["rectified"]),
             node("Einsum", ["p1"], ["summed"], equation="bk->b")]  # fmt: skip
    expected = {"averaged": True, "mean": True, "complement": True, "biased": False, "tempered": False,
                "mixed": None, "rectified": None, "summed": None}  # fmt: skip
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in expected]
    onnx.save(_model(nodes, outputs, constants), str(tmp_path / "m.onnx"))
    found = read_model_info(tmp_path / "m.onnx").outputs
    assert {name: found[name].probabilities for name in expected} == expected


def test_a_clip_and_onnx_ml_classifiers_say_whether_scores_are_probabilities(tmp_path: Path) -> None:
    """A Clip of a Softmax, a ZipMap of a LogisticRegression's probabilities and a forest's averaged votes were all
    unstated, left to FP32's values (a clip past 1e-3 of a row sum read every row as logits). A Clip keeps its
    input's scale, a ZipMap or Normalizer its input's, and an ONNX-ML classifier's probability transform makes
    probabilities; its NONE (a forest's votes, a linear SVM's margins) says nothing."""
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.datasets import load_iris
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    x, y = load_iris(return_X_y=True)
    x = x.astype(np.float32)
    found = {}
    for estimator, zipmap in ((LogisticRegression(max_iter=500), True), (LogisticRegression(max_iter=500), False),
                              (RandomForestClassifier(n_estimators=3, random_state=0), True),
                              (LinearSVC(), None)):  # fmt: skip
        options = {} if zipmap is None else {"zipmap": zipmap}
        onx = skl2onnx.to_onnx(estimator.fit(x, y), x[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})
        path = tmp_path / f"{type(estimator).__name__}{zipmap}.onnx"
        onnx.save(onx, str(path))
        outputs = read_model_info(path).outputs
        found[path.stem] = outputs.get("output_probability", outputs.get("probabilities")).probabilities
    assert found == {"LogisticRegressionTrue": True, "LogisticRegressionFalse": True,
                     "RandomForestClassifierTrue": None, "LinearSVCNone": None}  # fmt: skip
    bounds = [onnx.numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", 0.02), ("hi", 1.0))]
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=1),
             helper.make_node("Clip", ["p", "lo", "hi"], ["clipped"])]  # fmt: skip
    onnx.save(_model(nodes, [helper.make_tensor_value_info("clipped", TensorProto.FLOAT, [None, 4])], bounds),
              str(tmp_path / "clip.onnx"))  # fmt: skip
    assert read_model_info(tmp_path / "clip.onnx").outputs["clipped"].probabilities is True


def test_an_input_with_no_row_axis_is_shared_by_the_batch() -> None:
    """A scalar, or a tensor every axis of which is fixed beside an input whose axis 0 is dynamic, is one value per
    call; a leading 1 (a batch of one row), a dynamic axis, or a model whose inputs all fix axis 0 keep a row axis."""

    def inputs(**shapes: tuple[int | None, ...]) -> dict[str, TensorMeta]:
        return {name: TensorMeta(name, np.dtype(np.float32), shape, scalar=shape == ())
                for name, shape in shapes.items()}

    beside_batch = inputs(x=(None, 6), t=(), scale=(4,), proj=(6, 3), one=(1,), h0=(1, None, 8), state=(2, None))
    shared = [name for name, meta in beside_batch.items() if shared_by_batch(meta, beside_batch)]
    assert shared == ["t", "scale", "proj"]
    fixed = inputs(x=(8, 6), weights=(8,), proj=(6, 3))
    assert not any(shared_by_batch(meta, fixed) for meta in fixed.values())


@pytest.mark.parametrize("declared", [[None, 1], [None, None]])
def test_an_onnx_ml_regressor_s_stated_targets_are_its_output_width(tmp_path: Path, declared: list) -> None:
    """A LinearRegressor of targets=2 (read through a Cast) declared [None, 1], as skl2onnx declares a two-target
    forest: ONNX Runtime returns 2 values per row, and labels of 2 targets were refused ('2 targets per row, but output
    'y' has shape [None, 1]'); its width is now the attribute's, and the labels fit."""
    from qbench.tasks import get_task

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, declared)
    nodes = [helper.make_node("LinearRegressor", ["x"], ["raw"], domain="ai.onnx.ml", targets=2,
                              coefficients=[1.0, 0.0, 0.0, 0.0, 1.0, 0.0], intercepts=[0.5, -0.5]),
             helper.make_node("Cast", ["raw"], ["y"], to=TensorProto.FLOAT)]  # fmt: skip
    path = _save(tmp_path, nodes, [x], [y], ml=True)
    meta = read_model_info(path).outputs["y"]
    assert meta.shape == (None, 2)
    import onnxruntime as ort

    ran = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": np.eye(3, dtype=np.float32)})
    assert ran[0].shape == (3, 2)
    get_task("regression").check_labels(np.zeros((3, 2)), meta, np.arange(3))  # raised LabelError before


def test_a_two_target_forest_from_skl2onnx_validates_with_its_two_label_columns(tmp_path: Path) -> None:
    """skl2onnx's RandomForestRegressor on two targets: `qbench validate` refused the recipe (exit 2), now passes."""
    pytest.importorskip("sklearn")
    skl2onnx = pytest.importorskip("skl2onnx")
    import pandas as pd
    import yaml
    from sklearn.ensemble import RandomForestRegressor

    from qbench.cli.app import main

    rng = np.random.default_rng(0)
    features = rng.normal(size=(200, 4)).astype(np.float32)
    targets = np.stack([features[:, 0] * 2, np.abs(features[:, 1])], axis=1).astype(np.float32)
    forest = RandomForestRegressor(n_estimators=5, max_depth=4, random_state=0).fit(features, targets)
    onnx.save(skl2onnx.to_onnx(forest, features[:1], target_opset=17), str(tmp_path / "forest.onnx"))
    pd.DataFrame({"x": list(features), "y": list(targets)}).to_parquet(tmp_path / "rows.parquet")
    recipe = {"name": "forest", "task": "regression", "model": {"path": "forest.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "X"}, "label": "y"},
              "variants": [{"name": "fp16", "precision": "fp16"}], "backends": ["onnxruntime-cpu"]}  # fmt: skip
    (tmp_path / "qbench.yaml").write_text(yaml.safe_dump(recipe))
    assert read_model_info(tmp_path / "forest.onnx").outputs["variable"].shape == (None, 2)
    assert main(["validate", str(tmp_path / "qbench.yaml")]) == 0


def _two_column_matmul(path: Path, declared: list) -> Path:
    """y = x @ W with W [3, 2]: two values per row whatever `declared`, the shape the graph states for y."""
    weight = onnx.numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, declared)], [weight])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_an_output_declared_with_other_sizes_than_its_operators_compute_is_read_as_computed(tmp_path: Path) -> None:
    """y declared ['batch', 1] while its MatMul makes 2 values per row (ONNX Runtime returns 2 and prints a coloured
    VerifyOutputSizes warning): labels of 2 targets were refused ('2 targets per row, but output 'y' has shape
    [None, 1]'); the computed width is now read, the declaration kept and said in one line. A dynamic axis the
    graph leaves dynamic stays as declared, and a declaration agreeing with the graph is no note."""
    from qbench.tasks import get_task

    meta = read_model_info(_two_column_matmul(tmp_path / "m.onnx", ["batch", 1])).outputs["y"]
    assert (meta.shape, meta.dim_names, meta.declared_shape) == ((None, 2), ("batch", None), (None, 1))
    assert meta.declaration_note() == ("output 'y' is declared ['batch', 1] but its operators compute ['batch', 2] "
                                       "(ONNX Runtime returns the computed shape, with a VerifyOutputSizes warning): "
                                       "read as computed")  # fmt: skip
    get_task("regression").check_labels(np.zeros((3, 2)), meta, np.arange(3))  # raised LabelError before
    stated = read_model_info(_two_column_matmul(tmp_path / "n.onnx", ["batch", 2])).outputs["y"]
    assert (stated.shape, stated.declared_shape, stated.declaration_note()) == ((None, 2), None, None)
    unsized = read_model_info(_two_column_matmul(tmp_path / "u.onnx", ["batch", "width"])).outputs["y"]
    assert (unsized.shape, unsized.declared_shape) == ((None, None), None)


def test_a_regression_recipe_on_a_mis_declared_output_validates_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`qbench validate` exited 2 on the declaration; it now passes with one warning line naming both shapes."""
    import yaml

    from qbench.cli.app import main

    _two_column_matmul(tmp_path / "model.onnx", ["batch", 1])
    x = np.random.default_rng(0).normal(size=(80, 3)).astype(np.float32)
    np.savez(tmp_path / "rows.npz", x=x, y=x @ np.arange(6, dtype=np.float32).reshape(3, 2))
    recipe = {"name": "declared", "task": "regression", "model": {"path": "model.onnx"},
              "data": {"path": "rows.npz", "inputs": {"x": "x"}, "label": "y", "calibration": {"samples": 16}},
              "variants": [{"name": "fp16", "precision": "fp16"}]}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["validate", str(tmp_path / "recipe.yaml"), "--no-track"]) == 0
    err = capsys.readouterr().err
    assert "warning: output 'y' is declared ['batch', 1] but its operators compute ['batch', 2]" in err
    assert "error:" not in err
