"""Classification: label checks and class-id outputs, against hand-computed values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from qbench.gate.evaluate import EXIT_UNUSABLE, GateReport, judge
from qbench.modelinfo.signature import TensorMeta
from qbench.recipe.spec import GateSpec
from qbench.results.schema import VariantResult
from qbench.tasks import LabelError, get_task
from qbench.tasks.class_labels import label_columns
from qbench.tasks.class_scores import class_count
from qbench.validate import metrics
from qbench.validate.accuracy import evaluate_accuracy

TASK = get_task("classification")
POSITIONS = np.array([10, 11, 12, 13])


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([0, 1.5, 2, 2.5], r"2 rows, e.g. row 11: 1.5 are not integer class ids"),
        ([0, None, 1, 1], r"1 row, e.g. row 11: None have no label"),
        ([0, "cat", 1, 1], r"1 row, e.g. row 11: 'cat' are not integer class ids"),
        ([0, 1e20, 1, 1], r"1 row, e.g. row 11: 1e\+20 are not integer class ids"),  # was an OverflowError
        ([0, pd.NA, 1, 1], r"1 row, e.g. row 11: <NA> have no label"),  # a nullable Int64 column's empty cell
    ],
)
def test_bad_labels_name_the_count_and_an_example_row(values: list, message: str) -> None:
    with pytest.raises(LabelError, match=message):
        TASK.labels_from_values(values, POSITIONS)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([0, 2**63, 1, 1], r"1 row, e.g. row 11: 9223372036854775808 are not integer class ids"),
        ([0, -(2**70), 1, 1], r"1 row, e.g. row 11: -1180591620717411303424 are not integer class ids"),
    ],
)
def test_integer_labels_read_in_one_pass_are_checked_as_any_others(values: list, message: str) -> None:
    """Python ints (a Parquet integer column) are read whole into int64, except where the value-by-value checks
    have something to say: beyond int64, or negative."""
    from qbench.tasks.class_labels import plain_class_ids

    assert plain_class_ids([0, -3, 1, 1]) is None and TASK.labels_from_values([0, -3, 1, 1], POSITIONS).tolist() == [
        0, -3, 1, 1
    ]  # fmt: skip
    assert plain_class_ids(values) is None
    with pytest.raises(LabelError, match=message):
        TASK.labels_from_values(values, POSITIONS)
    plain = plain_class_ids([3, 0, 2**62, 1])
    assert plain is not None and plain.dtype == np.int64 and plain.tolist() == [3, 0, 2**62, 1]
    assert TASK.labels_from_values([3, 0, 1, 1], POSITIONS).tolist() == [3, 0, 1, 1]
    assert plain_class_ids([]) is None and plain_class_ids([1, True]) is None and plain_class_ids([1, 2.0]) is None


def test_negative_labels_are_class_values_of_an_integer_output_only() -> None:
    """-1 was refused by every output ('expected class ids >= 0'), so an IsolationForest's label (-1 outlier, 1
    inlier), an integer output stating no class table, could not be judged at all. It is a class value there; scores,
    a ZipMap, an ArgMax's ids and a boolean decision index classes by position, and refuse it."""
    labels = TASK.labels_from_values([1, -1, 1, -1], POSITIONS)
    TASK.check_labels(labels, TensorMeta("label", np.dtype(np.int64), (None,)), POSITIONS)
    for output in (TensorMeta("scores", np.dtype(np.float32), (None, 3)),
                   TensorMeta("ids", np.dtype(np.int64), (None,), class_count=3),
                   TensorMeta("decision", np.dtype(bool), (None,))):  # fmt: skip
        with pytest.raises(LabelError, match=r"2 rows, e.g. row 11: -1 are negative; expected class ids >= 0 \(output"):
            TASK.check_labels(labels, output, POSITIONS)


def test_labels_accept_integral_floats_and_booleans() -> None:
    assert TASK.labels_from_values([0, 1.0, True, 2], POSITIONS).tolist() == [0, 1, 1, 2]


def test_labels_must_fit_the_output_classes() -> None:
    scores = TensorMeta("scores", np.dtype("float32"), (None, 3))
    with pytest.raises(LabelError,
                       match=r"1 row, e.g. row 13: 3 hold class ids outside 0..2 \(output 'scores' has 3 classes\)"):
        TASK.check_labels(np.array([0, 1, 2, 3]), scores, POSITIONS)
    zipmap = TensorMeta("probs", np.dtype("float32"), (None, 3), "map", "seq(map(int64,tensor(float32)))", (1, 5, 7))
    TASK.check_labels(np.array([1, 5, 7, 5]), zipmap, POSITIONS)
    with pytest.raises(LabelError,
                       match=r"e.g. row 10: 0 hold classes the output 'probs' does not have \(its classes: 1, 5, 7\)"):
        TASK.check_labels(np.array([0, 5, 7, 5]), zipmap, POSITIONS)
    TASK.check_labels(np.array([0, 9]), TensorMeta("ids", np.dtype("int64"), (None,)), POSITIONS)  # no class count
    decision = TensorMeta("is_fraud", np.dtype("bool"), (None,))  # a boolean output decides between two classes
    TASK.check_labels(np.array([0, 1, 1, 0]), decision, POSITIONS)
    with pytest.raises(LabelError,
                       match=r"e.g. row 11: 7 hold class ids outside 0..1 \(output 'is_fraud' has 2 classes\)"):
        TASK.check_labels(np.array([0, 7, 1, 0]), decision, POSITIONS)
    assert class_count(TensorMeta("p", np.dtype("float32"), (None, 1))) == 2  # one binary score
    for rows in (None, 8):  # one score per row: its only dimension is the rows, not the classes
        score = TensorMeta("p", np.dtype("float32"), (rows,))
        assert class_count(score) == 2
        with pytest.raises(LabelError,
                           match=r"e.g. row 12: 2 hold class ids outside 0..1 \(output 'p' has 2 classes\)"):
            TASK.check_labels(np.array([0, 1, 2, 0]), score, POSITIONS)


def test_labels_of_a_map_with_negative_keys_are_read_through_its_keys() -> None:
    """-1 / +1 labels of a ZipMap keyed [-1, 1] were refused as negative class ids before the map's keys were
    consulted; they are now its sorted key positions, and a label that is none of its keys is named."""
    zipmap = TensorMeta("probs", np.dtype("float32"), (None, 2), "map", "seq(map(int64,tensor(float32)))", (1, -1))
    labels = TASK.labels_from_values(TASK.decode_label_names([-1, 1, 1.0, -1], [zipmap], POSITIONS), POSITIONS)
    assert labels.tolist() == [0, 1, 1, 0]
    TASK.check_labels(labels, zipmap, POSITIONS)
    with pytest.raises(LabelError,
                       match=r"1 row, e.g. row 12: 0 name classes the output "
                             r"'probs' does not have \(its classes: -1, 1\)"):
        TASK.decode_label_names([-1, 1, 0, -1], [zipmap], POSITIONS)


def test_class_id_outputs_give_accuracy_and_agreement_but_no_score_metrics() -> None:
    ids = np.array([0, 2, 1, 1], dtype=np.int64)
    reference = np.array([0, 2, 2, 1], dtype=np.int64)
    labels = np.array([0, 2, 2, 0])
    summary = TASK.rows(ids, reference, labels).summarise("overall", np.ones(4, dtype=bool))
    assert summary.metrics == {"accuracy": 0.5, "agreement": 0.75, "flip_rate": 0.25}


def test_labels_beyond_the_score_columns_are_an_error_at_evaluation() -> None:
    scores = np.eye(3, dtype=np.float32)
    with pytest.raises(LabelError, match="labels go up to class 4 but the output has 3 classes"):
        TASK.rows(scores, scores, np.array([0, 1, 4]))


def _string_zipmap(name: str, keys: tuple[str, ...]) -> TensorMeta:
    return TensorMeta(name, np.dtype("float32"), (None, len(keys)), "map", "seq(map(string,tensor(float32)))", keys)


def test_string_labels_naming_a_zipmaps_classes_become_their_sorted_columns() -> None:
    """scikit-learn with string classes: the label 'malignant' is the column the map reads it into."""
    from qbench.validate.outputs import maps_to_matrix

    probs = _string_zipmap("probs", ("malignant", "benign", "cyst"))  # ZipMap order need not be sorted
    values = TASK.decode_label_names(["malignant", "benign", "cyst", "benign"], [probs], POSITIONS)
    assert list(values) == [2, 0, 1, 0]
    matrix = maps_to_matrix([{"malignant": 0.7, "benign": 0.2, "cyst": 0.1}])
    assert int(np.argmax(matrix[0])) == values[0]  # the column of 'malignant' holds its score
    with pytest.raises(LabelError, match=r"1 row, e.g. row 12: 'tumour' name classes the output 'probs' does not "
                                         r"have \(its classes: benign, cyst, malignant\)"):  # fmt: skip
        TASK.decode_label_names(["benign", "cyst", "tumour", "cyst"], [probs], POSITIONS)


def test_label_names_are_left_alone_without_string_classes() -> None:
    scores = TensorMeta("scores", np.dtype("float32"), (None, 3))
    assert TASK.decode_label_names(["a", 1, 2, 0], [scores], POSITIONS) == ["a", 1, 2, 0]
    other = _string_zipmap("other", ("a", "b"))
    disagreeing = [_string_zipmap("probs", ("a", "c")), other]
    assert TASK.decode_label_names(["a", "a", "a", "a"], disagreeing, POSITIONS) == ["a", "a", "a", "a"]
    assert TASK.decode_label_names([0, 1, 1, 0], [other], POSITIONS) == [0, 1, 1, 0]


def test_numbers_whose_text_names_a_string_class_are_that_class() -> None:
    """Integer labels against classes sorted as text ('0', '1', '10', '2'): 2 is class '2' (column 3), as the text
    '2' and the float 2.0 of a column with gaps are, not column 2 (class '10'); numbers naming no class stay ids."""
    scores = TensorMeta("probabilities", np.dtype("float32"), (None, 4), class_keys=("0", "1", "10", "2"))
    assert list(TASK.decode_label_names([2, 0, 1, 2], [scores], POSITIONS)) == [3, 0, 1, 3]
    assert list(TASK.decode_label_names(["2", 2.0, 10, 1], [scores], POSITIONS)) == [3, 3, 2, 1]
    with pytest.raises(LabelError, match=r"row 13: 3 name classes the output 'probabilities' does not have"):
        TASK.decode_label_names([2, 0, 1, 3], [scores], POSITIONS)
    letters = TensorMeta("probabilities", np.dtype("float32"), (None, 3), class_keys=("a", "b", "c"))
    assert TASK.decode_label_names([2, 0, 1, 1], [letters], POSITIONS) == [2, 0, 1, 1]


def test_labels_naming_a_score_tensors_class_table_become_its_columns() -> None:
    """A table in column order (not sorted): class values and names both map to their column; [0, 1, 2] is the
    identity; a class-id output evaluated beside the table's scores is refused (it gives values, not columns)."""
    scores = TensorMeta("probabilities", np.dtype("float32"), (None, 3), class_keys=(5, 1, 2))
    assert list(TASK.decode_label_names([1, 2.0, "5", 1], [scores], POSITIONS)) == [1, 2, 0, 1]
    with pytest.raises(LabelError, match=r"row 11: 3 name classes the output 'probabilities' does not have \(its "
                                         r"classes: 5, 1, 2\)"):  # fmt: skip
        TASK.decode_label_names([1, 3, 5, 5], [scores], POSITIONS)
    identity = TensorMeta("probabilities", np.dtype("float32"), (None, 3), class_keys=(0, 1, 2))
    assert TASK.decode_label_names([2, 0, 1, 1], [identity], POSITIONS) == [2, 0, 1, 1]
    label = TensorMeta("label", np.dtype("int64"), (None,))
    with pytest.raises(LabelError, match="output 'label' gives class values: expected one of them in model.outputs"):
        TASK.decode_label_names([1, 2, 5, 5], [scores, label], POSITIONS)


def test_class_id_outputs_do_not_give_score_metrics() -> None:
    ids = TensorMeta("cls", np.dtype("int64"), (None,))
    assert set(TASK.metrics_not_computed(ids)) == {"kl_mean", "max_abs_error"}
    assert TASK.metrics_not_computed(TensorMeta("scores", np.dtype("float32"), (None, 3))) == {}
    assert TASK.metrics_not_computed(_string_zipmap("probs", ("a", "b"))) == {}


def test_a_string_label_output_is_read_only_through_a_class_table_the_graph_states() -> None:
    named = TensorMeta("label", np.dtype(object), (None,), class_keys=("no", "yes"))
    assert TASK.output_problem(named) is None and TASK.output_rank(named) == 1
    assert set(TASK.metrics_not_computed(named)) == {"kl_mean", "max_abs_error"}
    assert list(TASK.decode_label_names(["yes", "no", "yes"], [named], POSITIONS[:3])) == [1, 0, 1]
    bare = TensorMeta("label", np.dtype(object), (None,))
    assert "holds strings the graph states no class table for" in str(TASK.output_problem(bare))
    assert TASK.output_rank(bare) is None


def test_a_binary_score_column_is_read_in_the_variant_as_in_fp32() -> None:
    """FP32 gives probabilities (threshold 0.5); one variant score of 1.01 must not turn the variant into logits
    (threshold 0, every row class 1): rows 0 and 3 stay class 0 and agree with FP32."""
    reference = np.array([[0.3], [0.6], [0.9], [0.4]], dtype=np.float32)
    variant = np.array([[0.3], [0.6], [1.01], [0.4]], dtype=np.float32)
    summary = TASK.rows(variant, reference, np.array([0, 1, 1, 0])).summarise("overall", np.ones(4, dtype=bool))
    assert summary.metrics["agreement"] == 1.0 and summary.metrics["accuracy"] == 1.0
    logits = np.array([[-2.0], [0.5], [3.0], [-0.1]], dtype=np.float32)  # FP32 logits: threshold 0 for both
    summary = TASK.rows(logits * 0.1 + 0.5, logits, None).summarise("overall", np.ones(4, dtype=bool))
    assert summary.metrics["agreement"] == 0.5  # as logits every shifted score is > 0: class 1, FP32 has [0, 1, 1, 0]


def test_an_fp32_accuracy_below_a_uniform_guess_is_suspect() -> None:
    from qbench.tasks.class_scores import below_chance

    scores = TensorMeta("logits", np.dtype("float32"), (None, 4))
    labels = np.array([0, 1, 1, 2])
    assert below_chance(0.2499, scores, labels).startswith("FP32 accuracy 0.2499 on output 'logits' is below a "
                                                           "uniform guess over 4 classes (0.2500)")  # fmt: skip
    assert below_chance(0.25, scores, labels) is None
    ids = TensorMeta("label", np.dtype("int64"), (None,))  # no stated width: the labels' distinct classes (3)
    assert below_chance(0.3, ids, labels) is not None and below_chance(0.34, ids, labels) is None


def test_below_chance_with_data_classes_points_at_their_order() -> None:
    from qbench.tasks.class_scores import below_chance

    column = TensorMeta("prob", np.dtype("float32"), (None, 1))
    why = below_chance(0.14, column, np.array([0, 1, 1, 0]), ["yes", "no"])
    assert why == ("FP32 accuracy 0.1400 on output 'prob' is below a uniform guess over 2 classes (0.5000): check the "
                   "order of data.classes (yes, no): it names each score column's class in column order; a single "
                   "score column stands for two classes, listed "
                   "as [negative, positive], e.g. ['no', 'yes']")  # fmt: skip


def test_below_chance_beside_the_graphs_class_table_points_at_it_not_at_data_classes() -> None:
    """scikit-learn's breast-cancer labels (0 malignant) against a model of string classes (benign, malignant): the
    hint named data.classes, which is refused beside a graph's own class table."""
    from qbench.tasks.class_scores import below_chance

    scores = TensorMeta("probabilities", np.dtype("float32"), (None, 2), class_keys=("benign", "malignant"))
    why = below_chance(0.0409, scores, np.array([0, 1, 1, 0]))
    assert why == ("FP32 accuracy 0.0409 on output 'probabilities' is below a uniform guess over 2 classes (0.5000): "
                   "the graph names its classes (benign, malignant), so a number label is the position of its class "
                   "there (0: benign); write the labels as those "
                   "classes, or recode them to those positions")  # fmt: skip


def test_a_one_column_score_follows_the_graphs_word_on_probabilities() -> None:
    """Values within [0, 1] are read as probabilities only when the graph does not say they are logits."""
    scores = np.array([[0.38], [0.45], [0.74], [0.6]], np.float32)
    labels = np.array([1, 1, 1, 0])
    guessed = TASK.rows(scores, scores, labels)
    stated = TASK.rows(scores, scores, labels, probabilities=False)
    assert guessed.predicted.tolist() == [0, 0, 1, 1] and stated.predicted.tolist() == [1, 1, 1, 1]


def test_integer_labels_read_through_a_label_output_and_refused_beside_other_classes() -> None:
    """A label output whose graph states classes -1 / +1 reads the labels as positions there (they were refused as
    negative ids); beside scores stating other classes, the two codings cannot both hold and the labels are refused."""
    label = TensorMeta("label", np.dtype("int64"), (None,), class_keys=(-1, 1))
    assert list(TASK.decode_label_names([-1, 1, 1, -1], [label], POSITIONS)) == [0, 1, 1, 0]
    scores = TensorMeta("scores", np.dtype("float32"), (None, 2), class_keys=(1, -1))
    with pytest.raises(LabelError, match=r"outputs 'label' and 'scores' state different classes \(-1, 1; 1, -1\)"):
        TASK.decode_label_names([-1, 1, 1, -1], [label, scores], POSITIONS)


def test_an_integer_output_whose_values_no_label_takes_is_refused() -> None:
    ids = TensorMeta("label", np.dtype("int64"), (None,))
    refused = r"no label is a value FP32's output 'label' gives \(labels: 3, 7; output: 0, 1\)"
    with pytest.raises(LabelError, match=refused):
        TASK.check_labels_against_reference(np.array([3, 7, 7, 3]), ids, np.array([0, 1, 1, 0]), np.array([3, 7, 7, 3]))
    TASK.check_labels_against_reference(np.array([1, 7, 7, 3]), ids, np.array([0, 1, 1, 0]),
                                        np.array([1, 7, 7, 3]))  # one shared value: judged


def test_labels_as_a_csv_holds_them_text_of_numbers_or_names() -> None:
    """A CSV label column keeps its file's text (qbench.data.load): text of numbers is class ids or integer classes,
    text naming a string class is that class ("01" and "1" two of them)."""
    assert TASK.labels_from_values(["0", "2", " 1", "3.0"], POSITIONS).tolist() == [0, 2, 1, 3]
    assert TASK.labels_from_values(["True", "false", "TRUE", "0"], POSITIONS).tolist() == [1, 0, 1, 0]
    scores = TensorMeta("scores", np.dtype(np.float32), (None, 3))
    with pytest.raises(LabelError, match=r"1 row, e.g. row 11: -1 are negative"):
        TASK.check_labels(TASK.labels_from_values(["0", "-1", "1", "1"], POSITIONS), scores, POSITIONS)
    named = TensorMeta("label", np.dtype(object), (None,), class_keys=("01", "1", "2"))
    assert list(TASK.decode_label_names(["1", "01", "2", "01"], [named], POSITIONS)) == [1, 0, 2, 0]
    pets = TensorMeta("label", np.dtype(object), (None,), class_keys=("cat", "dog"))
    assert list(TASK.decode_label_names(["1", "0", "1", "0"], [pets], POSITIONS)) == ["1", "0", "1", "0"]  # ids
    sevens = TensorMeta("scores", np.dtype("float32"), (None, 3), class_keys=(-7, 0, 7))
    assert list(TASK.decode_label_names(["07", "-7", "0", "7"], [sevens], POSITIONS)) == [2, 0, 1, 2]


def _judged(task: str, reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray, metric: str) -> GateReport:
    """The gate's verdict on `outputs` against FP32's `reference` (overall only), as `qbench gate` gives it."""

    def result(name: str, values: np.ndarray) -> VariantResult:
        accuracy = evaluate_accuracy(task, values, reference, labels, {})
        return VariantResult(variant=name, backend="b", precision="fp32" if name == "fp32" else "int8", status="ok",
                             accuracy=accuracy)  # fmt: skip

    return judge(result("fp32", reference), result("int8", outputs), GateSpec(metric=metric, max_drop=0.01))


def test_rows_fp32_gives_nan_on_are_misses_for_every_variant_against_the_labels_too() -> None:
    """FP32 overflows on 10 of 100 rows (NaN there), an INT8 variant clamps and is finite and right on them, but
    wrong on 5 rows FP32 gets right. Those 10 rows were credited to the variant against the labels: accuracy 0.95
    vs FP32's 0.90, a drop of -0.05 and a pass, while on the rows FP32 scores it lost 5 of 90. Counted as misses
    for every result (as agreement always did), the drop is 0.05 by hand and the gate breaches."""
    labels = np.zeros(100, dtype=np.int64)
    reference = np.tile([[5.0, 0.0]], (100, 1))
    reference[:10] = np.nan
    outputs = reference.copy()
    outputs[:10] = [5.0, 0.0]
    outputs[10:15] = [0.0, 5.0]
    verdict = _judged("classification", reference, outputs, labels, "accuracy")
    overall = next(c for c in verdict.checks if c.metric == "accuracy")
    assert (overall.reference, overall.observed) == (pytest.approx(0.90), pytest.approx(0.85))
    assert overall.status == "breach" and overall.drop == pytest.approx(0.05)
    agreement = TASK.rows(outputs, reference, labels).summarise("overall", np.ones(100, dtype=bool)).metrics
    assert agreement["agreement"] == pytest.approx(0.85) and agreement["flip_rate"] == pytest.approx(0.15)


def test_kl_of_one_logit_column_reads_it_as_its_decisions_do() -> None:
    """A linear layer's single logit whose FP32 values happen to lie in [0, 1]: decisions and KL both read it as a
    logit (the graph's word), so KL compares sigmoid(0.4) with sigmoid(0.3), not 0.4 with 0.3 (0.0226, 19x more)."""
    reference, outputs = np.array([[0.4], [0.6]]), np.array([[0.3], [0.6]])
    summary = TASK.rows(outputs, reference, np.array([1, 1]), probabilities=False)
    p, q = 1 / (1 + np.exp(-0.4)), 1 / (1 + np.exp(-0.3))
    by_hand = p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))
    assert summary.summarise("overall", np.ones(2, dtype=bool)).metrics["kl_mean"] == pytest.approx(by_hand / 2, abs=1e-12)


@pytest.mark.parametrize(
    "values",
    [
        ["1", "0", "007", "+3"],
        ["1", "-1", "2", "0"],  # negative: the per-value checks name it
        ["1", " 2", "3 ", "0"],  # spaces: read by the per-value path
        ["1", "2.0", "true", "0"],
        ["1", "99999999999999999999", "2", "0"],  # beyond int64
        ["1", "2\n3", "4", "0"],  # a line break inside a label
        ["1", "٣", "2", "0"],  # a digit that is not ASCII
        ["1", "", "2", "0"],
        ["1", "cat", "2", "0"],
        ["+", "1", "2", "0"],
        ["1", "++3", "3+", "0"],
        ["-0", "1", "2", "+0"],
        ["1", "2", "0", "\n"],
    ],
    ids=["ids", "negative", "spaces", "float-and-bool", "overflow", "line-break", "arabic-digit", "empty", "name",
         "sign-alone", "signs-misplaced", "minus-zero", "only-a-line-break"],
)
def test_text_class_ids_read_at_once_as_label_by_label(values: list[str], monkeypatch) -> None:
    """A CSV label column read as text ran a regex per label; the one-pass reading gives the same ids or error."""
    import qbench.tasks.classification as classification

    def read() -> object:
        try:
            return TASK.labels_from_values(values, POSITIONS).tolist()
        except LabelError as exc:
            return str(exc)

    fast = read()
    monkeypatch.setattr(classification, "text_class_ids", lambda values: None)
    assert fast == read()


def test_text_class_ids_are_read_without_a_regex_per_label(monkeypatch) -> None:
    import qbench.tasks.classification as classification

    monkeypatch.setattr(classification, "as_number", lambda value: pytest.fail("per-label path ran"))
    assert TASK.labels_from_values(["1", "0", "007", "+3"], POSITIONS).tolist() == [1, 0, 7, 3]


def test_kl_mean_never_averages_in_rows_fp32_overflows_on() -> None:
    """FP32's single logit overflows to +inf on 10 of 20 rows, where an INT8 variant clamps to 30: both sigmoids are
    1, so those rows gave a KL of 0 for FP32 and the variant alike and halved the variant's mean KL over the rows
    FP32 scores (0.0075 <= 0.01, a pass, where those rows alone give 0.015). FP32's NaN/inf rows leave kl_mean
    undefined, as for NaN logits: the gate says so and asks for a metric that counts such rows."""
    reference = np.array([[np.inf]] * 10 + [[2.0]] * 10)
    outputs = np.array([[30.0]] * 10 + [[1.45]] * 10)
    scored = metrics.kl_rows(reference[10:], outputs[10:], as_probabilities=False)
    assert scored.mean() > 0.01 >= scored.mean() / 2  # what the dilution hid
    verdict = _judged("classification", reference, outputs, np.ones(20, dtype=np.int64), "kl_mean")
    assert verdict.exit_code == EXIT_UNUSABLE and not verdict.checks
    assert "FP32 itself gives NaN/inf on 10 of its 20 rows" in verdict.problems[0]


@pytest.mark.parametrize(("label", "near"), [(" dog ", "dog"), ("DOG", "dog"), ("Bird\t", "bird")])
def test_a_label_differing_from_a_class_only_in_case_or_spaces_is_refused_naming_the_class(label: str, near: str) -> None:
    """Exported labels often carry stray spaces or another case: the error said only that they were no class."""
    values = ["cat", "dog", label, "bird"]
    with pytest.raises(LabelError) as info:
        label_columns(values, ["cat", "dog", "bird"], np.arange(4), unknown="are none of data.classes")
    assert str(info.value) == (f"1 row, e.g. row 2: {label!r} are none of data.classes; {label!r} differs from class "
                               f"{near!r} only in case or surrounding "
                               "spaces (labels name a class exactly)")  # fmt: skip


def test_a_label_near_no_class_gets_no_hint() -> None:
    with pytest.raises(LabelError) as info:
        label_columns(["cat", "cow"], ["cat", "dog"], np.arange(2), unknown="are none of data.classes")
    assert str(info.value) == "1 row, e.g. row 1: 'cow' are none of data.classes"
