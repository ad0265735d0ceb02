"""evaluate_accuracy / with_drops / run_batched on hand-made arrays, with hand-computed expectations."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pytest

from qbench.errors import QbenchError
from qbench.tasks import CustomMetric
from qbench.validate import metrics
from qbench.validate.accuracy import (
    evaluate_accuracy,
    one_class_readings,
    row_count,
    run_batched,
    scale_doubts,
    with_drops,
)

NAN = float("nan")

# FP32 reference logits -> top-1 [0, 1, 2, 0]
REFERENCE = np.array([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0], [2.0, 0.0, 0.0]])
# variant: row 0 same, row 1 flips to 0, row 2 same, row 3 holds NaN -> top-1 [0, 0, 2, -1]
VARIANT = np.array([[2.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 2.0], [NAN, 0.0, 0.0]])
LABELS = np.array([0, 1, 1, 0])
SLICES = {"a": np.array([True, True, False, False]), "b": np.array([False, False, True, True])}
# row 1: P = softmax[0, 2, 0] = (x, y, x), Q = softmax[2, 0, 0] = (y, x, x) with
# x = 1 / (e^2 + 2), y = e^2 / (e^2 + 2): KL = x ln(x/y) + y ln(y/x) = (y - x) * 2
KL_ROW_1 = 2 * (math.e**2 - 1) / (math.e**2 + 2)


def test_classification_overall_and_slices_with_labels() -> None:
    result = evaluate_accuracy("classification", VARIANT, REFERENCE, LABELS, SLICES)
    assert result.rows == 4 and result.nonfinite_outputs == 1
    overall = result.overall
    assert overall.name == "overall" and overall.size == 4
    # predictions [0, 0, 2, -1] vs labels [0, 1, 1, 0] -> 1/4; vs FP32 [0, 1, 2, 0] -> 2/4
    assert overall.metrics["accuracy"] == pytest.approx(0.25)
    assert overall.metrics["agreement"] == pytest.approx(0.5)
    assert overall.metrics["flip_rate"] == pytest.approx(0.5)
    assert math.isnan(overall.metrics["kl_mean"])  # the NaN row makes KL unknowable
    assert math.isnan(overall.metrics["max_abs_error"])
    assert overall.intervals["accuracy"] == pytest.approx(metrics.wilson_interval(1, 4))
    assert overall.intervals["flip_rate"] == pytest.approx(metrics.wilson_interval(2, 4))

    a, b = result.slices
    assert (a.name, a.size, b.name, b.size) == ("a", 2, "b", 2)
    # slice a: rows 0, 1 -> predictions [0, 0] vs labels [0, 1] and FP32 [0, 1]
    assert a.metrics["accuracy"] == pytest.approx(0.5)
    assert a.metrics["agreement"] == pytest.approx(0.5)
    assert a.metrics["kl_mean"] == pytest.approx(KL_ROW_1 / 2)
    assert a.metrics["max_abs_error"] == pytest.approx(2.0)  # row 1: |2 - 0|
    assert a.intervals["kl_mean"] == pytest.approx(metrics.mean_interval(np.array([0.0, KL_ROW_1])))
    # slice b: rows 2, 3 -> predictions [2, -1] vs labels [1, 0] -> 0; vs FP32 [2, 0] -> 1/2
    assert b.metrics["accuracy"] == 0.0
    assert b.metrics["agreement"] == pytest.approx(0.5)
    assert result.slice("b") is b and result.slice("missing") is None


def test_classification_without_labels_scores_accuracy_as_agreement() -> None:
    result = evaluate_accuracy("classification", VARIANT, REFERENCE, None, SLICES)
    for summary in (result.overall, *result.slices):
        assert summary.metrics["accuracy"] == summary.metrics["agreement"]
    assert result.overall.metrics["accuracy"] == pytest.approx(0.5)


def test_reference_against_itself_is_perfect() -> None:
    result = evaluate_accuracy("classification", REFERENCE, REFERENCE, LABELS, {})
    assert result.slices == ()
    assert result.overall.metrics["agreement"] == 1.0
    assert result.overall.metrics["flip_rate"] == 0.0
    assert result.overall.metrics["kl_mean"] == pytest.approx(0.0, abs=1e-12)
    assert result.overall.metrics["accuracy"] == pytest.approx(0.75)  # [0, 1, 2, 0] vs [0, 1, 1, 0]


def test_embedding_metrics_count_nonfinite_rows_as_cosine_zero() -> None:
    reference = np.array([[1.0, 0.0], [3.0, 4.0], [1.0, 1.0]])
    outputs = np.array([[2.0, 0.0], [4.0, 3.0], [NAN, 1.0]])
    first_two = {"first_two": np.array([True, True, False])}
    result = evaluate_accuracy("embedding", outputs, reference, None, first_two)
    # cosines: parallel 1, (12 + 12) / 25 = 0.96, NaN row -> 0
    assert result.nonfinite_outputs == 1
    assert result.overall.metrics["cosine"] == pytest.approx(1.96 / 3)
    assert result.overall.metrics["cosine_min"] == 0.0
    assert math.isnan(result.overall.metrics["max_abs_error"])
    assert result.overall.intervals["cosine"] == pytest.approx(metrics.mean_interval(np.array([1.0, 0.96, 0.0])))
    (sliced,) = result.slices
    assert sliced.metrics["cosine"] == pytest.approx(0.98)
    assert sliced.metrics["cosine_min"] == pytest.approx(0.96)
    assert sliced.metrics["max_abs_error"] == pytest.approx(1.0)  # |2-1|, |4-3|, |3-4|
    assert set(sliced.metrics) == {"cosine", "cosine_min", "nn_agreement", "max_abs_error"}


def test_empty_slice_gives_nan_not_an_error() -> None:
    result = evaluate_accuracy("classification", VARIANT, REFERENCE, LABELS, {"none": np.zeros(4, dtype=bool)})
    (empty,) = result.slices
    assert empty.size == 0
    assert all(math.isnan(v) for v in empty.metrics.values())
    assert all(math.isnan(v) for pair in empty.intervals.values() for v in pair)


def test_with_drops_signs_and_missing_slices() -> None:
    reference = evaluate_accuracy("classification", REFERENCE, REFERENCE, LABELS, SLICES)
    variant = evaluate_accuracy(
        "classification", VARIANT, REFERENCE, LABELS, {**SLICES, "extra": np.array([True, False, False, False])}
    )
    dropped = with_drops(variant, reference)
    # higher is better: accuracy 0.75 -> 0.25 is a drop of +0.5
    assert dropped.overall.drops["accuracy"] == pytest.approx(0.5)
    # lower is better: flip_rate 0 -> 0.5 and kl_mean 0 -> KL_ROW_1/2 on slice a are positive drops too
    assert dropped.overall.drops["flip_rate"] == pytest.approx(0.5)
    assert dropped.slice("a").drops["kl_mean"] == pytest.approx(KL_ROW_1 / 2)
    assert set(dropped.slice("a").drops) == set(variant.slice("a").metrics)
    assert dropped.slice("extra").drops == {}
    assert variant.overall.drops == {}  # the input is not modified


def test_with_drops_is_negative_for_an_improvement() -> None:
    worse = evaluate_accuracy("classification", VARIANT, REFERENCE, LABELS, {})
    better = evaluate_accuracy("classification", REFERENCE, REFERENCE, LABELS, {})
    assert with_drops(better, worse).overall.drops["accuracy"] == pytest.approx(-0.5)
    assert with_drops(better, worse).overall.drops["flip_rate"] == pytest.approx(-0.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"task": "clasification"}, r"expected one of .* \(did you mean 'classification'"),
        ({"task": "detection"}, "task 'detection' is not supported"),
        ({"outputs": VARIANT[:3]}, "must match"),
        ({"labels": np.array([0, 1])}, "2 labels for 4"),
        ({"labels": np.array(["a", "b", "c", "d"])}, "class indices"),
        ({"slices": {"a": np.array([1, 0, 0, 1])}}, "boolean mask"),
    ],
)
def test_bad_inputs_are_user_errors(kwargs: dict, message: str) -> None:
    args = dict(task="classification", outputs=VARIANT, reference_outputs=REFERENCE, labels=LABELS, slices={})
    with pytest.raises(QbenchError, match=message):
        evaluate_accuracy(**{**args, **kwargs})


class _RecordingRunner:
    """Returns [x * 2, x + 1] and records the batch sizes it saw."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        x = feeds["x"]
        self.batches.append(len(x))
        return [x * 2, x + 1]

    def describe(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def test_run_batched_covers_every_row_in_order() -> None:
    runner = _RecordingRunner()
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    out = run_batched(runner, {"x": x}, batch_size=4, output_index=1)
    assert runner.batches == [4, 4, 2]
    np.testing.assert_array_equal(out, x + 1)


def test_run_batched_rejects_bad_feeds_and_output_index() -> None:
    with pytest.raises(QbenchError, match="row counts"):
        run_batched(_RecordingRunner(), {"x": np.zeros((3, 2)), "y": np.zeros((4, 2))}, batch_size=2)
    with pytest.raises(QbenchError, match="output index"):
        run_batched(_RecordingRunner(), {"x": np.zeros((3, 2))}, batch_size=2, output_index=2)
    assert row_count({"x": np.zeros((0, 2))}) == 0
    assert run_batched(_RecordingRunner(), {"x": np.zeros((0, 2))}, batch_size=2).shape[0] == 0


def test_embedding_nn_agreement_per_slice_searches_neighbours_among_all_rows() -> None:
    # reference neighbours 0 <-> 1, 2 <-> 3; in the variant row 1 moves next to row 3 (cosine 0.991)
    reference = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    outputs = np.array([[1.0, 0.0], [0.2, 0.8], [0.0, 1.0], [0.1, 0.9]])
    slices = {"x_cluster": np.array([True, True, False, False]), "y_cluster": np.array([False, False, True, True])}
    result = evaluate_accuracy("embedding", outputs, reference, None, slices)
    assert result.overall.metrics["nn_agreement"] == pytest.approx(0.75)
    assert result.overall.intervals["nn_agreement"] == pytest.approx(metrics.wilson_interval(3, 4))
    # searched within the slice alone, row 1 would still find row 0; among all rows it finds row 3
    assert result.slice("x_cluster").metrics["nn_agreement"] == pytest.approx(0.5)
    assert result.slice("y_cluster").metrics["nn_agreement"] == 1.0
    drops = with_drops(result, evaluate_accuracy("embedding", reference, reference, None, slices))
    assert drops.slice("x_cluster").drops["nn_agreement"] == pytest.approx(0.5)


def test_new_nonfinite_rows_are_those_where_fp32_is_finite() -> None:
    """FP32 NaN on rows 0 and 1; the variant is finite there but NaN on rows 2 and 3: as many NaN rows as FP32
    (2 = 2), yet both are new."""
    reference = REFERENCE.copy()
    reference[[0, 1], 0] = NAN
    variant = REFERENCE.copy()
    variant[[2, 3], 1] = NAN
    result = evaluate_accuracy("classification", variant, reference, LABELS, SLICES)
    assert (result.overall.nonfinite_outputs, result.overall.new_nonfinite_outputs) == (2, 2)
    assert [(s.name, s.nonfinite_outputs, s.new_nonfinite_outputs) for s in result.slices] == [("a", 0, 0), ("b", 2, 2)]
    own = evaluate_accuracy("classification", reference, reference, LABELS, SLICES)
    assert (own.overall.nonfinite_outputs, own.overall.new_nonfinite_outputs) == (2, 0)  # FP32 against itself


def test_fp32_values_that_contradict_the_graphs_word_on_the_scale_are_named() -> None:
    """Logits all within [0, 1] are thresholded at 0, which calls every row positive: worth a line naming the output
    when the other reading would move some decision (values in (0, 0.5]), and only for thresholded outputs."""
    within = np.array([[0.1], [0.7], [0.4], [0.9]])
    [line] = scale_doubts("classification", {"p": within}, {"p": False})
    assert line.startswith("output 'p': the graph makes it with a linear layer (logits, threshold 0), yet FP32 gives "
                           "every value within [0, 1]; read as probabilities (threshold 0.5), 2 of 4 FP32 decisions "
                           "would differ")  # fmt: skip
    assert scale_doubts("multilabel", {"p": within.reshape(2, 2)}, {"p": False})  # every label decision is thresholded
    [line] = scale_doubts("classification", {"p": within * 2 - 0.6}, {"p": True})  # probabilities outside [0, 1]
    assert "a Sigmoid or Softmax (probabilities, threshold 0.5), yet FP32 gives values outside [0, 1]" in line
    assert scale_doubts("classification", {"p": np.array([[0.0], [0.7], [0.9]])}, {"p": False}) == []  # same decisions
    assert scale_doubts("classification", {"p": within}, {"p": None}) == []  # unstated: FP32's values decide anyway
    assert scale_doubts("classification", {"p": within}, {"p": True}) == []  # agreed
    assert scale_doubts("classification", {"p": np.hstack([within, within])}, {"p": False}) == []  # an arg-max
    assert scale_doubts("regression", {"p": within}, {"p": False}) == []


def _within_half(outputs: np.ndarray, labels: np.ndarray | None) -> float:
    """A user's metric: the share of rows predicted within 0.5 of the label (a NaN prediction is a miss)."""
    return float(np.mean(np.abs(outputs[:, 0] - labels) < 0.5))


def test_custom_metrics_read_only_rows_fp32_scored_for_every_result() -> None:
    """FP32 gives NaN on rows 0-1, where the variant is right; elsewhere FP32 is right on all 8 rows and the variant
    on 7. By hand, on the rows FP32 scored: FP32 1.0, the variant 7/8 (drop 0.125). Counting FP32's NaN rows as its
    misses credited the variant: FP32 0.8, the variant 0.9, a drop of -0.1 that passes any tolerance."""
    labels = np.arange(10, dtype=np.float64)
    fp32 = labels[:, None].copy()
    fp32[:2] = np.nan
    variant = labels[:, None].copy()
    variant[5] += 3.0
    custom = [CustomMetric("within_half", _within_half, higher_is_better=True, wants_reference=False)]
    slices = {"first": np.arange(10) < 2, "rest": np.arange(10) >= 2}
    reference = evaluate_accuracy("regression", fp32, fp32, labels, slices, custom)
    measured = evaluate_accuracy("regression", variant, fp32, labels, slices, custom)
    assert reference.overall.metrics["within_half"] == 1.0
    assert measured.overall.metrics["within_half"] == pytest.approx(7 / 8)
    by_name = {s.name: s for s in measured.slices}
    assert math.isnan(by_name["first"].metrics["within_half"])  # FP32 failed on every row there: no figure
    assert by_name["rest"].metrics["within_half"] == pytest.approx(7 / 8)


def test_a_metric_that_cannot_count_fp32s_nan_rows_is_nan_for_every_result_on_a_scope_holding_one() -> None:
    """FP32 NaN on row 0 (slice 'first'); the variant finite everywhere, 0.5 off on row 5. The variant's MAE was
    0.05 overall against FP32's NaN: credited with the row FP32 could not score. Every task metric the catalogue
    says does not count such rows (counts_nonfinite_rows) is now NaN there, interval too, for FP32 and the variant;
    those that count them stay defined, and a scope without such a row is untouched: MAE 0.5 / 9 on 'rest'."""
    labels = np.arange(10, dtype=np.float64)
    fp32 = labels[:, None].copy()
    fp32[0] = np.nan
    variant = labels[:, None].copy()
    variant[5] += 0.5
    slices = {"first": np.arange(10) < 2, "rest": np.arange(10) >= 1}
    for outputs in (fp32, variant):
        result = evaluate_accuracy("regression", outputs, fp32, labels, slices)
        for scope in (result.overall, result.slice("first")):
            assert all(math.isnan(scope.metrics[name]) for name in ("mae", "rmse", "r2", "r2_min", "max_error"))
            assert all(math.isnan(bound) for bound in scope.intervals["mae"])
            assert math.isfinite(scope.metrics["agreement"])
    rest = evaluate_accuracy("regression", variant, fp32, labels, slices).slice("rest")
    assert rest.metrics["mae"] == pytest.approx(0.5 / 9) and rest.metrics["max_error"] == pytest.approx(0.5)
    assert rest.metrics["agreement"] == pytest.approx(8 / 9)


def test_a_metric_of_several_outputs_gets_them_together_on_the_rows_fp32_scored_on_all() -> None:
    """A detector's metric needs its boxes with their scores: `outputs: (boxes, scores)` calls it once per scope with
    dicts name -> array of the same rows (the variant's and FP32's), unprefixed beside each output's own metrics.
    FP32 gives NaN on row 0's scores only: the metric reads neither output of row 0, for FP32 and the variant alike;
    slice 'first' (rows 0, 1) is then judged on row 1, and slice 'zero' (row 0 alone) cannot be judged (NaN)."""
    seen: list[tuple[set[str], int, int]] = []

    def kept_box_area(outputs, labels, reference_outputs):
        seen.append((set(outputs) | set(reference_outputs), len(outputs["boxes"]), len(labels)))
        boxes, scores = outputs["boxes"], outputs["scores"]
        areas = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
        return float(np.sum(areas * (scores > 0.5)) / len(boxes))

    rows = 6
    boxes = np.tile(np.array([0.0, 0.0, 1.0, 2.0]), (rows, 2, 1))  # two boxes of area 2 per row
    scores = np.tile(np.array([0.9, 0.1]), (rows, 1))  # the first box kept, the second not
    fp32 = {"boxes": boxes, "scores": scores.copy()}
    fp32["scores"][0, 1] = np.nan
    variant = {"boxes": boxes.copy(), "scores": fp32["scores"].copy()}
    variant["scores"][3] = [0.4, 0.1]  # row 3 loses its box
    variant["boxes"][4, 0, 3] = 3.0  # row 4's kept box grows to area 3
    metric = CustomMetric("kept_area", kept_box_area, higher_is_better=True, wants_reference=True,
                          outputs=("boxes", "scores"))  # fmt: skip
    slices = {"first": np.arange(rows) < 2, "zero": np.arange(rows) == 0, "late": np.arange(rows) >= 3}
    labels = np.arange(rows)
    reference = evaluate_accuracy("structured", fp32, fp32, labels, slices, [metric])
    measured = evaluate_accuracy("structured", variant, fp32, labels, slices, [metric])
    assert reference.overall.metrics["kept_area"] == 2.0
    assert measured.overall.metrics["kept_area"] == pytest.approx((2 + 2 + 0 + 3 + 2) / 5)  # rows 1..5
    assert measured.slice("first").metrics["kept_area"] == 2.0
    assert math.isnan(measured.slice("zero").metrics["kept_area"])
    assert measured.slice("late").metrics["kept_area"] == pytest.approx((0 + 3 + 2) / 3)
    assert {"boxes/agreement", "scores/max_abs_error", "kept_area"} <= set(measured.overall.metrics)
    assert "boxes/kept_area" not in measured.overall.metrics  # computed once over both, not per output
    assert all(names == {"boxes", "scores"} for names, _, _ in seen)
    assert (seen[-1][1], seen[-1][2]) == (3, 3)  # the 'late' slice: boxes and labels of the same 3 rows


def test_a_metric_of_several_outputs_naming_one_not_evaluated_is_an_error() -> None:
    metric = CustomMetric("joint", lambda outputs, labels: 0.0, higher_is_better=True, wants_reference=False,
                          outputs=("boxes", "scores"))  # fmt: skip
    with pytest.raises(QbenchError, match="custom metric 'joint' reads output 'scores', which is not evaluated"):
        evaluate_accuracy("structured", {"boxes": np.zeros((2, 4))}, {"boxes": np.zeros((2, 4))}, None, {}, [metric])


def test_outputs_of_another_length_than_fp32s_say_why_they_cannot_be_judged() -> None:
    """FP32 keeps 5 values per row, the variant 6 (a score threshold crossed after quantization): refused with what
    to evaluate instead, never cut to the shorter."""
    reference = np.arange(20, dtype=np.float32).reshape(4, 5)
    variant = np.hstack([reference, np.ones((4, 1), np.float32)])
    with pytest.raises(QbenchError, match=r"variant outputs have shape \(4, 6\), FP32 outputs \(4, 5\): they must "
                                          r"match; qbench compares outputs row by row and value by value"):  # fmt: skip
        evaluate_accuracy("regression", variant, reference, None, {})
    with pytest.raises(QbenchError) as caught:  # another rank: a layout change, which no data-dependent length explains
        evaluate_accuracy("regression", reference[:, None, :], reference, None, {})
    assert str(caught.value) == "variant outputs have shape (4, 1, 5), FP32 outputs (4, 5): they must match"


def test_a_single_score_split_by_its_values_into_one_class_while_labels_hold_two_is_named():
    """An autoencoder's reconstruction error (rows x 1, within [0, 1]) is read as a probability and split at 0.5: every
    row is class 0, the labels hold anomalies (class 1), and every variant passed on accuracy unless it carried a
    score past 0.5. The reading is named; a split the graph states, a scale it states, decisions of both classes, or
    labels of one class are not."""
    scores = np.array([[0.01], [0.02], [0.3], [0.12]], dtype=np.float32)
    labels = np.array([0, 0, 1, 1])
    [(name, line)] = one_class_readings("classification", {"score": scores}, {"score": None}, set(), labels).items()
    assert name == "score"
    assert line.startswith("output 'score': a single score column whose graph states no threshold, read as a "
                           "probability (every FP32 value lies within [0, 1]) and split at 0.5, puts every one of 4 "
                           "evaluation rows in class 0 while the labels hold classes 0, 1 (FP32's scores lie within "
                           "[0.01, 0.3])")  # fmt: skip
    [line] = one_class_readings("classification", {"s": scores * 10 + 1}, {"s": None}, set(), labels).values()
    assert "read as a logit and split at 0, puts every one of 4 evaluation rows in class 1" in line
    # graph's cut
    assert one_class_readings("classification", {"score": scores}, {"score": None}, {"score"}, labels) == {}
    assert one_class_readings("classification", {"score": scores}, {"score": True}, set(), labels) == {}  # a Sigmoid's
    assert one_class_readings("classification", {"score": scores}, {"score": None}, set(), np.zeros(4, int)) == {}
    # 0.9 > 0.5
    assert one_class_readings("classification", {"score": scores * 3}, {"score": None}, set(), labels) == {}
    assert one_class_readings("classification", {"score": scores}, {"score": None}, set(), None) == {}
    assert one_class_readings("regression", {"score": scores}, {"score": None}, set(), labels) == {}
    assert one_class_readings("classification", {"p": np.hstack([scores, 1 - scores])}, {"p": None}, set(), labels) == {}


def test_a_score_of_several_columns_is_no_single_score_split_into_one_class():
    """multilabel thresholds every float output by its scale, several columns too: a [rows, 3] output whose graph
    states no scale (a Relu over a linear layer) stopped `qbench validate` and every sweep of such a model with
    "ValueError: cannot reshape array of size 12 into shape (4,)". It is no single score column: nothing to name."""
    scores = np.array([[0.1, 0.2, 0.0], [0.3, 0.0, 0.1], [0.2, 0.1, 0.4], [0.0, 0.3, 0.2]], dtype=np.float32)
    labels = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 1], [1, 1, 0]])
    assert one_class_readings("multilabel", {"scores": scores}, {"scores": None}, set(), labels) == {}
    [line] = one_class_readings("multilabel", {"s": scores[:, :1]}, {"s": None}, set(), labels[:, :1]).values()
    assert "puts every one of 4 evaluation rows in class 0 while the labels hold classes 0, 1" in line


def test_a_single_score_in_one_class_without_labels_is_named_only_where_the_task_was_left_to_its_default():
    """A regressor's output (diabetes targets, 25 .. 350) under a recipe without `task` was read as one logit: every
    row class 1, agreement 1.0 for every variant whatever it did to the values, and nothing said. Without labels the
    reading is named where the task is the default, with the task to set; a stated classification is left alone."""
    values = np.array([[151.0], [75.0], [141.0], [206.0]], dtype=np.float32)
    [line] = one_class_readings("classification", {"variable": values}, {"variable": None}, set(), None,
                                task_stated=False).values()  # fmt: skip
    assert "read as a logit and split at 0, puts every one of 4 evaluation rows in class 1 (FP32's scores lie " \
           "within [75, 206])" in line
    assert line.endswith("the recipe sets no task, so the output was read as class scores (task: classification): "
                         "a regressor's output is judged by task: regression")  # fmt: skip
    assert "labels hold" not in line
    assert one_class_readings("classification", {"variable": values}, {"variable": None}, set(), None) == {}
    both = np.array([[-1.0], [2.0], [3.0], [4.0]], dtype=np.float32)  # FP32 decides both classes: nothing to name
    assert one_class_readings("classification", {"s": both}, {"s": None}, set(), None, task_stated=False) == {}
