"""Integer classes that are not score columns (-1 / +1, 3 / 7 / 9) on models whose output is a label, or a label
beside probabilities, converted by skl2onnx with and without a ZipMap, through `qbench validate`, `sweep` and `gate`.

Every FP32 accuracy, overall and per slice, is compared with scikit-learn's on the same rows; an integer output whose
values the labels never take is refused, where it was scored 0 for FP32 and every variant and passed the gate.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from task_projects import fitted_linear, graph_model, iris, overall, project, run_all, said, table

from qbench.cli.app import main

pytestmark = pytest.mark.slow

skl2onnx = pytest.importorskip("skl2onnx")
FP32_TWICE = [{"name": "fp32", "precision": "fp32"}, {"name": "fp32-again", "precision": "fp32"}]


def _expected_by_scope(classifier, features: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """scikit-learn's accuracy overall and on each slice `table` makes (half=even / half=odd)."""
    right = classifier.predict(features) == labels
    even = np.arange(len(labels)) % 2 == 0
    return {
        "overall": float(right.mean()),
        "half=even": float(right[even].mean()),
        "half=odd": float(right[~even].mean()),
    }


@pytest.mark.parametrize(
    ("estimator", "zipmap", "outputs"),
    [
        ("svc", True, None),  # the SVC is judged by its label (its scores' arg-max is not its decision)
        ("svc", False, None),
        ("logistic", True, ["output_label"]),
        ("logistic", False, ["label", "probabilities"]),
        ("logistic", True, ["output_probability", "output_label"]),
    ],
    ids=["svc-zipmap", "svc-no-zipmap", "logistic-label", "logistic-label-and-probabilities", "logistic-map-and-label"],
)
def test_minus_one_and_plus_one_classes_on_label_outputs(tmp_path, monkeypatch, capsys, estimator, zipmap, outputs):
    """Classes [-1, 1] on a label output were refused ('-1 are negative; expected class ids >= 0') although the graph
    states them (the classifier's classlabels_ints): the label is now read as its position there, as the labels and
    a ZipMap keyed -1 / 1 are, so label and probabilities beside it are one coding."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import SVC

    features, ids = iris()
    labels = np.where(ids == 1, 1, -1)  # versicolor or not: not linearly separable, so accuracy is no trivial 1.0
    make = {"svc": lambda: SVC(C=0.05), "logistic": lambda: LogisticRegression(max_iter=500)}[estimator]
    classifier = make().fit(features[::2], labels[::2])
    options = None if zipmap else {id(classifier): {"zipmap": False}}
    model = skl2onnx.to_onnx(classifier, features[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})
    chosen = {} if outputs is None else {"model": {"path": "model.onnx", "outputs": outputs}}
    gate = {} if outputs is None or len(outputs) == 1 else {"gate": {"metric": f"{outputs[0]}/accuracy"}}
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, model, table(features, labels), variants=FP32_TWICE, **chosen, **gate)
    results, _ = run_all(recipe, capsys)
    expected = _expected_by_scope(classifier, features, labels)
    assert 0.6 < expected["overall"] < 1.0
    accuracies = [k for k in overall(results) if k.endswith("accuracy")]
    assert len(accuracies) == (1 if outputs is None else len(outputs))
    agreements = [k for k in overall(results, "fp32-again") if k.endswith("agreement")]
    fp32 = results.find("fp32", "onnxruntime-cpu").accuracy
    for key in accuracies:
        assert fp32.overall.metrics[key] == pytest.approx(expected["overall"], abs=1e-12), key
        for scope in ("half=even", "half=odd"):
            assert fp32.slice(scope).metrics[key] == pytest.approx(expected[scope], abs=1e-12), (key, scope)
    assert agreements and all(overall(results, "fp32-again")[key] == 1.0 for key in agreements)


def _argmax_of_a_symbolic_width() -> object:
    """The iris-fitted 4 -> 3 linear classifier whose only output is ArgMax of its logits, reshaped so that no shape
    inference can tell the class count: int64 class ids 0..2."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    label = helper.make_tensor_value_info("label", TensorProto.INT64, [None])
    nodes = [
        helper.make_node("MatMul", ["x", "fc_w"], ["mm"]),
        helper.make_node("Add", ["mm", "fc_b"], ["logits"]),
        helper.make_node("Shape", ["logits"], ["logits_shape"]),
        helper.make_node("Reshape", ["logits", "logits_shape"], ["scores"]),
        helper.make_node("ArgMax", ["scores"], ["label"], axis=1, keepdims=0),
    ]
    return graph_model(nodes, [x], [label], fitted_linear(*iris()))


def test_labels_no_value_of_an_integer_output_takes_are_refused(tmp_path, monkeypatch, capsys):
    """Class values 3, 7, 9 against an output of class ids 0..2 (a symbolic class count, so nothing to check before
    running): every row was wrong for FP32 and every variant, accuracy 0.0 with drops of 0, and the gate PASSed."""
    features, ids = iris()
    monkeypatch.chdir(tmp_path)
    recipe = project(tmp_path, _argmax_of_a_symbolic_width(), table(features, np.array([3, 7, 9])[ids]),
                     variants=FP32_TWICE)  # fmt: skip
    assert main(["validate", str(recipe)]) == 2  # validate's FP32 run on a few rows shows it
    assert said("data.label: column 'y': no label is a value FP32's output 'label' gives (labels: 3, 7, 9; output: 0",
                capsys.readouterr().err)  # fmt: skip
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 2  # the same dry run, before anything is built
    assert said("data.label: column 'y': no label is a value FP32's output 'label' gives (labels: 3, 7, 9; output: 0",
                capsys.readouterr().err)  # fmt: skip
    import qbench.sweep.runner

    # as a cluster's sweep: no dry run
    monkeypatch.setattr(qbench.sweep.runner, "_check_reference_runs", lambda prepared: None)
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 2  # FP32's measurement on every row shows it
    err = capsys.readouterr().err
    assert said("no label is a value FP32's output 'label' gives (labels: 3, 7, 9; output: 0, 1, 2): expected labels "
                "in the output's coding", err)  # fmt: skip
    assert main(["gate", str(recipe)]) == 2

    ids_recipe = project(tmp_path / "ids", _argmax_of_a_symbolic_width(), table(features, ids), variants=FP32_TWICE)
    results, _ = run_all(ids_recipe, capsys)  # the same model against its own class ids is judged
    assert overall(results)["accuracy"] > 0.9
