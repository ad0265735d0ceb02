"""Task 'structured': a segmentation net's `[N, C, H, W]` scores with per-pixel labels (a Parquet list column),
judged by the recipe's own mean IoU, which the gate takes as its metric; and the recipe errors around it."""

from __future__ import annotations

import textwrap

import numpy as np
import onnxruntime as ort
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper
from task_projects import INT8, graph_model, plain_ort, project, run_all, said, table
from task_projects import ROWS as TABLE_ROWS

from qbench.cli.app import main
from qbench.errors import QbenchError
from qbench.tasks import get_task
from qbench.tasks.base import LabelError

ROWS, CLASSES, SIDE = 48, 3, 6

METRIC_MODULE = textwrap.dedent(
    """
    import numpy as np

    def miou(outputs, labels):
        predicted = outputs.argmax(axis=1).reshape(len(outputs), -1)
        ious = [np.sum((predicted == c) & (labels == c)) / np.sum((predicted == c) | (labels == c))
                for c in range(outputs.shape[1]) if np.any((predicted == c) | (labels == c))]
        return float(np.mean(ious))
    """
)


def _segmentation_model():
    """Conv 1 -> 4 channels, Relu, Conv 1x1 -> CLASSES: per-pixel class scores [N, CLASSES, SIDE, SIDE]."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 1, SIDE, SIDE])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, CLASSES, SIDE, SIDE])
    weights = [
        numpy_helper.from_array(rng.normal(size=(4, 1, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(size=(CLASSES, 4, 1, 1)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["scores"]),
    ]
    return graph_model(nodes, [x], [scores], weights)


def _mean_iou(outputs, labels):
    namespace: dict = {}
    exec(METRIC_MODULE, namespace)  # the user's own function, as the sweep imports it
    return namespace["miou"](outputs, labels)


def _segmentation_project(tmp_path, **changes):
    model = _segmentation_model()
    rng = np.random.default_rng(1)
    images = rng.normal(size=(ROWS, 1, SIDE, SIDE)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    truth = session.run(None, {"x": images})[0].argmax(axis=1).reshape(ROWS, -1)
    truth = np.where(rng.random(truth.shape) < 0.2, (truth + 1) % CLASSES, truth)  # FP32 is not perfect
    table = pd.DataFrame({"x": [row.ravel() for row in images],
                          "half": np.where(np.arange(ROWS) % 2 == 0, "even", "odd"),
                          "y": [row.tolist() for row in truth]})  # fmt: skip
    (tmp_path / "seg_metrics.py").write_text(METRIC_MODULE)
    recipe = {"task": "structured", "data": {"label": "y"},
              "metrics": [{"name": "miou", "function": "seg_metrics:miou", "higher_is_better": True}],
              **changes}  # fmt: skip
    return project(tmp_path, model, table, **recipe), images, truth


@pytest.mark.slow
def test_segmentation_scores_are_judged_per_pixel_by_the_recipes_own_metric(tmp_path, monkeypatch, capsys):
    recipe, images, truth = _segmentation_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    results, shown = run_all(recipe, capsys)
    assert results.gate_metric == "miou" and said("Gate on miou", shown)  # the first custom metric, by default
    reference = plain_ort(tmp_path / "model.onnx", {"x": images})["scores"]
    fp32 = results.find("fp32", "onnxruntime-cpu").accuracy
    assert fp32.overall.metrics["miou"] == pytest.approx(_mean_iou(reference, truth), abs=1e-12)
    even = fp32.slice("half=even")
    assert even.metrics["miou"] == pytest.approx(_mean_iou(reference[::2], truth[::2]), abs=1e-12)
    int8 = results.find("int8", "onnxruntime-cpu")
    built = plain_ort(int8.model_path, {"x": images})["scores"]
    assert int8.accuracy.overall.metrics["miou"] == pytest.approx(_mean_iou(built, truth), abs=1e-12)
    assert int8.accuracy.overall.metrics["max_abs_error"] == pytest.approx(float(np.abs(built - reference).max()))
    tolerance = 0.01 * reference.reshape(ROWS, -1).std(axis=0)  # 1 % of each value's FP32 spread
    close = (np.abs(built - reference).reshape(ROWS, -1) <= tolerance).all(axis=1)
    assert int8.accuracy.overall.metrics["agreement"] == pytest.approx(float(close.mean()), abs=1e-12)
    assert fp32.overall.metrics["agreement"] == 1.0


def test_a_segmentation_output_stays_refused_by_classification(tmp_path, capsys):
    recipe, _, _ = _segmentation_project(tmp_path, task="classification", gate={"metric": "miou"})
    assert main(["validate", str(recipe)]) == 2
    assert said("are not supported by task 'classification' (task 'structured' judges them", capsys.readouterr().err)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"metrics": []}, "metrics: task 'structured' is judged by the recipe's own metrics; expected at least one"),
        ({"gate": {"metric": "accuracy"}},
         "gate.metric: got 'accuracy', expected one of agreement, max_abs_error, miou"),
    ],
)  # fmt: skip
def test_structured_recipes_without_a_metric_of_their_own_are_refused(tmp_path, capsys, changes, message):
    recipe, _, _ = _segmentation_project(tmp_path, **changes)
    assert main(["validate", str(recipe)]) == 2
    assert said(message, capsys.readouterr().err)


def test_label_cells_are_stacked_when_rectangular_and_kept_per_row_when_not():
    task = get_task("structured")
    positions = np.arange(3)
    per_pixel = task.labels_from_values([np.array([0, 1, 2, 1]), [1, 1, 0, 0], np.array([2, 2, 2, 2])], positions)
    assert per_pixel.shape == (3, 4) and per_pixel.dtype.kind == "i"
    boxes = task.labels_from_values([[[0, 0, 1, 1]], [[0, 0, 2, 2], [1, 1, 3, 3]], [[0.5, 0.5, 1, 1]]], positions)
    assert boxes.dtype == object and [cell.shape for cell in boxes] == [(1, 4), (2, 4), (1, 4)]
    for bad, shown in [([1, None, 2], "row 1"), ([[1, 2], [1, None], [3, 4]], "row 1"),
                       ([[1], [[1, 2], [3]], [2]], "row 1")]:  # fmt: skip
        with pytest.raises(LabelError, match=f"1 row, e.g. {shown}"):
            task.labels_from_values(bad, positions)


def test_text_label_cells_are_refused_as_no_numbers(tmp_path, capsys):
    """'expected a number or a list of numbers per row', but a text cell was handed to the metrics as text: a label
    list pandas' to_csv wrote ('[0. 1.87]', as NumPy prints an array) reached the user's metric as one string per
    row, which failed on it. It is now a data.label error naming the row and what such cells are."""
    task = get_task("structured")
    with pytest.raises(LabelError, match=r"2 rows, e\.g\. row 0: '\[0\. 1\.5\]' hold no label or no rectangular"):
        task.labels_from_values(["[0. 1.5]", [1.0, 2.0], "[2. 0.5]"], np.arange(3))
    assert task.labels_from_values([3, 1.5, True], np.arange(3)).tolist() == [3.0, 1.5, 1.0]  # numbers stay labels
    recipe, _, truth = _segmentation_project(tmp_path)
    table = pd.read_parquet(tmp_path / "data.parquet")
    table["y"] = [str(np.array(row, dtype=np.float64)) for row in truth]  # what to_csv writes, as text
    table.to_parquet(tmp_path / "data.parquet")
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert f"data.label: column 'y': {ROWS} rows, e.g. row 0: " in err
    assert "are arrays as NumPy prints them (pandas' to_csv writes array cells so): expected a JSON list" in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1


def test_asking_for_segmentation_by_name_points_to_the_structured_task():
    with pytest.raises(QbenchError, match="task 'segmentation' is not supported as such: use task 'structured'"):
        get_task("segmentation")


# -- a detector: boxes [N, K, 4] and scores [N, K], judged by one metric that reads both ------------------------------

BOXES = 3

DETECTION_METRIC = textwrap.dedent(
    """
    import numpy as np

    def box_iou(outputs, labels):
        # per ground-truth box, the best IoU among the boxes scored over 0.5 (0 without one); the mean over all
        values = []
        for boxes, scores, truth in zip(outputs["boxes"], outputs["scores"], labels):
            kept = boxes[scores > 0.5]
            for box in np.asarray(truth).reshape(-1, 4):
                lo, hi = np.maximum(kept[:, :2], box[:2]), np.minimum(kept[:, 2:], box[2:])
                inter = np.prod(np.clip(hi - lo, 0, None), axis=1)
                union = np.prod(kept[:, 2:] - kept[:, :2], axis=1) + np.prod(box[2:] - box[:2]) - inter
                values.append(float(np.max(inter / union, initial=0.0)))
        return float(np.mean(values))
    """
)


def _detection_model():
    """x [N, 8] -> Relu(MatMul) -> box centres c and half-sizes h (sigmoids): boxes Concat(c - h, c + h) [N, K, 4];
    scores Sigmoid(MatMul) [N, K]."""
    rng = np.random.default_rng(2)
    weights = [numpy_helper.from_array(rng.normal(size=shape).astype(np.float32) * scale, name)
               for name, shape, scale in [("w", (8, 16), 1.0), ("wc", (16, 2 * BOXES), 0.5),
                                          ("wh", (16, 2 * BOXES), 0.3),
                                          ("ws", (16, BOXES), 1.0)]]  # fmt: skip
    weights += [numpy_helper.from_array(np.array([-1, BOXES, 2], np.int64), "shape"),
                numpy_helper.from_array(np.array(0.25, np.float32), "quarter")]  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
        helper.make_node("MatMul", ["r", "wc"], ["c0"]), helper.make_node("Sigmoid", ["c0"], ["c1"]),
        helper.make_node("Reshape", ["c1", "shape"], ["c"]),
        helper.make_node("MatMul", ["r", "wh"], ["h0"]), helper.make_node("Sigmoid", ["h0"], ["h1"]),
        helper.make_node("Mul", ["h1", "quarter"], ["h2"]), helper.make_node("Reshape", ["h2", "shape"], ["h"]),
        helper.make_node("Sub", ["c", "h"], ["lo"]), helper.make_node("Add", ["c", "h"], ["hi"]),
        helper.make_node("Concat", ["lo", "hi"], ["boxes"], axis=2),
        helper.make_node("MatMul", ["r", "ws"], ["s0"]), helper.make_node("Sigmoid", ["s0"], ["scores"]),
    ]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])
    outputs = [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [None, BOXES, 4]),
               helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, BOXES])]  # fmt: skip
    return graph_model(nodes, [x], outputs, weights)


def _detection_project(tmp_path, **changes):
    """Ground truth: FP32's first one or two boxes per row, jittered (a variable number of boxes per row)."""
    model = _detection_model()
    rng = np.random.default_rng(3)
    features = rng.normal(size=(ROWS, 8)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    boxes = session.run(["boxes"], {"x": features})[0]
    truth = [(boxes[i, : 1 + i % 2] + rng.normal(scale=0.03, size=(1 + i % 2, 4))).tolist() for i in range(ROWS)]
    table = pd.DataFrame({"x": list(features), "half": np.where(np.arange(ROWS) % 2 == 0, "even", "odd"), "y": truth})
    (tmp_path / "det_metrics.py").write_text(DETECTION_METRIC)
    recipe = {"task": "structured", "model": {"path": "model.onnx", "outputs": ["boxes", "scores"]},
              "data": {"label": "y"}, "variants": [{"name": "fp16", "precision": "fp16"}, INT8],
              "metrics": [{"name": "box_iou", "function": "det_metrics:box_iou", "outputs": ["boxes", "scores"],
                           "higher_is_better": True}], **changes}  # fmt: skip
    return project(tmp_path, model, table, **recipe), features, [np.array(t) for t in truth]


@pytest.mark.slow
def test_a_detectors_boxes_and_scores_are_judged_together_by_one_metric_per_slice(tmp_path, monkeypatch, capsys):
    recipe, features, truth = _detection_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    results, shown = run_all(recipe, capsys)
    assert results.gate_metric == "box_iou" and said("Gate on box_iou", shown)
    namespace: dict = {}
    exec(DETECTION_METRIC, namespace)  # the user's own function, as the sweep imports it
    even = np.arange(ROWS) % 2 == 0
    for variant in ("fp32", "fp16", "int8"):
        found = results.find(variant, "onnxruntime-cpu")
        given = plain_ort(found.evaluated_model_path or found.model_path, {"x": features})  # fp16: its emulation
        for scope, mask in [("overall", np.ones(ROWS, bool)), ("half=even", even), ("half=odd", ~even)]:
            expected = namespace["box_iou"]({k: v[mask] for k, v in given.items()},
                                            [t for t, m in zip(truth, mask) if m])  # fmt: skip
            figures = found.accuracy.overall if scope == "overall" else found.accuracy.slice(scope)
            assert figures.metrics["box_iou"] == pytest.approx(expected, abs=1e-12), (variant, scope)
        assert {"boxes/agreement", "scores/agreement", "box_iou"} <= set(found.accuracy.overall.metrics)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"metrics": [{"name": "box_iou", "function": "det_metrics:box_iou", "outputs": ["bxes", "scores"],
                       "higher_is_better": True}]},
         "metrics[0].outputs: not an output the recipe evaluates (model.outputs): got 'bxes', expected one of boxes, "
         "scores (did you mean 'boxes'?)"),
        ({"model": {"path": "model.onnx"}},
         "metrics[0].outputs: 'boxes' is not an evaluated output; expected the outputs a metric reads listed in "
         "model.outputs (now none)"),
        ({"metrics": [{"name": "box_iou", "function": "det_metrics:box_iou", "outputs": [], "higher_is_better": True}]},
         "metrics[0].outputs: expected a non-empty list of distinct output names"),
        ({"metrics": [{"name": "box_iou", "function": "det_metrics:box_iou", "higher_is_better": True},
                      {"name": "box_max", "function": "det_metrics:box_iou", "higher_is_better": True}]},
         "recipe.yaml: gate.metric: not set, and task 'structured' "
         "evaluates several outputs (boxes, scores), each with its own metrics named 'output/metric'; expected one of "
         "boxes/agreement, boxes/box_iou, boxes/box_max, boxes/max_abs_error, scores/agreement, scores/box_iou, "
         "scores/box_max, scores/max_abs_error"),
    ],
)  # fmt: skip
def test_a_metric_naming_outputs_the_recipe_does_not_evaluate_is_refused(tmp_path, capsys, changes, message):
    recipe, _, _ = _detection_project(tmp_path, **changes)
    assert main(["validate", str(recipe)]) == 2
    assert said(message, capsys.readouterr().err)


# -- a retrieval head: item ids (int64) of the top-k scores, through TopK and GatherElements ---------------------------

ITEMS, TOP = 40, 3
ID_BASE, ID_STEP = 10**12, 7919  # ids spread 3e5 apart at a magnitude of 1e12: under one FP16 ULP there (1e9)

IDS_METRIC = textwrap.dedent(
    """
    import numpy as np

    def recall(outputs, labels, reference_outputs):  # of FP32's top-k ids, the share the variant returns
        pairs = zip(outputs["ids"].tolist(), reference_outputs["ids"].tolist())
        return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in pairs]))
    """
)


def _retrieval_model():
    """x [N, 8] -> MatMul with a stored item table [8, ITEMS] -> TopK (k=TOP) -> the items' int64 ids through
    GatherElements of the id table expanded to the batch: outputs top-k scores [N, TOP] and ids [N, TOP]."""
    rng = np.random.default_rng(5)
    weights = [numpy_helper.from_array(rng.normal(size=(8, ITEMS)).astype(np.float32), "table"),
               numpy_helper.from_array(ID_BASE + ID_STEP * np.arange(ITEMS, dtype=np.int64)[None, :], "item_ids"),
               numpy_helper.from_array(np.array([TOP], np.int64), "k"),
               numpy_helper.from_array(np.array([ITEMS], np.int64), "width")]  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "table"], ["all"]),
        helper.make_node("TopK", ["all", "k"], ["scores", "top"], axis=1),
        helper.make_node("Shape", ["x"], ["xs"], end=1), helper.make_node("Concat", ["xs", "width"], ["wide"], axis=0),
        helper.make_node("Expand", ["item_ids", "wide"], ["ids_all"]),
        helper.make_node("GatherElements", ["ids_all", "top"], ["ids"], axis=1),
    ]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])
    outputs = [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, TOP]),
               helper.make_tensor_value_info("ids", TensorProto.INT64, [None, TOP])]  # fmt: skip
    return graph_model(nodes, [x], outputs, weights)


@pytest.mark.slow
def test_integer_ids_agree_with_fp32_only_where_every_id_is_fp32s(tmp_path, monkeypatch, capsys):
    """Every id of a row of a spread far under FP16's resolution at its magnitude: the spread-relative tolerance's
    floor (2 FP16 ULPs at 1e12: 2e9) let every id agree, so ids/agreement was 1.0 where INT8 changed rows' ids."""
    model = _retrieval_model()
    features = np.random.default_rng(6).normal(size=(TABLE_ROWS, 8)).astype(np.float32)
    (tmp_path / "ids_metrics.py").write_text(IDS_METRIC)
    metric = {"name": "recall", "function": "ids_metrics:recall", "outputs": ["ids"], "higher_is_better": True}
    recipe = project(tmp_path, model, table(features), task="structured", metrics=[metric],
                     model={"path": "model.onnx", "outputs": ["scores", "ids"]}, gate={"metric": "recall"})
    monkeypatch.chdir(tmp_path)
    results, _ = run_all(recipe, capsys)
    fp32_ids = plain_ort(tmp_path / "model.onnx", {"x": features})["ids"]
    found = results.find("int8", "onnxruntime-cpu")
    int8_ids = plain_ort(found.model_path, {"x": features})["ids"]
    by_hand = float(np.mean((int8_ids == fp32_ids).all(axis=1)))
    assert 0.0 < by_hand < 1.0  # INT8 changed some rows' ids, not all
    assert found.accuracy.overall.metrics["ids/agreement"] == pytest.approx(by_hand, abs=1e-12)
    assert results.find("fp32", "onnxruntime-cpu").accuracy.overall.metrics["ids/agreement"] == 1.0


def test_integer_outputs_are_compared_as_integers_past_float64s_precision():
    """Ids past 2**53 one apart are one value in float64: compared as integers, they are two answers."""
    reference = np.array([[2**62, 2**62 + 2], [5, 6], [7, 8]], dtype=np.int64)
    outputs = np.array([[2**62 + 1, 2**62 + 2], [5, 6], [7, 9]], dtype=np.int64)
    rows = get_task("structured").rows(outputs, reference, None)
    assert rows.summarise("overall", np.ones(3, bool)).metrics["agreement"] == pytest.approx(1 / 3)
