"""The task registry: names, refusals, and every task's metrics in the catalogue the gate reads."""

from __future__ import annotations

import numpy as np
import pytest

from qbench.errors import QbenchError
from qbench.modelinfo.signature import TensorMeta
from qbench.tasks import TASKS, Task, gate_metric_names, get_task
from qbench.validate.catalogue import METRICS

FLOAT_SCORES = TensorMeta("scores", np.dtype("float32"), (None, 3))
INT_IDS = TensorMeta("label", np.dtype("int64"), (None,))
COPY = TensorMeta("ids_out", np.dtype("int64"), (None, 8), passthrough_of="input_ids")
SEQUENCE = TensorMeta("boxes", np.dtype(object), (), "other", "seq(tensor(float))")


def test_every_registered_task_is_a_task_with_its_metrics_in_the_catalogue() -> None:
    assert TASKS.names() == ["classification", "embedding", "multilabel", "regression", "span", "structured"]
    for name in TASKS.names():
        task = get_task(name)
        assert isinstance(task, Task) and task.name == name
        # None: the recipe's own first metric (task structured)
        assert task.default_gate_metric in [*gate_metric_names(name), None]
        for info in task.metric_infos:
            assert METRICS[info.name].higher_is_better == info.higher_is_better


def test_unknown_and_structured_tasks_are_refused_clearly() -> None:
    with pytest.raises(QbenchError, match=r"expected one of classification, embedding, multilabel, regression, span, "
                                          r"structured \(did you mean 'multilabel'\?\)"):  # noqa: E501
        get_task("multilable")
    with pytest.raises(QbenchError, match="task 'detection' is not supported"):
        get_task("detection")


@pytest.mark.parametrize(
    ("task", "output", "rank"),
    [
        ("classification", FLOAT_SCORES, 0),
        ("classification", INT_IDS, 1),  # ids only when there are no scores
        ("classification", COPY, None),
        ("classification", SEQUENCE, None),
        ("embedding", FLOAT_SCORES, 0),
        ("embedding", INT_IDS, None),  # never a cosine over integers
        ("regression", INT_IDS, None),
        ("multilabel", FLOAT_SCORES, 0),
        ("multilabel", TensorMeta("v", np.dtype("float32"), (None,)), None),
    ],
)
def test_which_outputs_each_task_reads(task: str, output: TensorMeta, rank: int | None) -> None:
    judge = get_task(task)
    assert judge.output_rank(output) == rank
    assert (judge.output_problem(output) is None) == (rank is not None)


def test_structured_outputs_are_named_not_supported() -> None:
    problem = get_task("classification").output_problem(TensorMeta("masks", np.dtype("float32"), (None, 100, 4, 6)))
    assert problem is not None and "neither (rows, classes) nor (rows, tokens, classes)" in problem and "not supported" in problem
    # (rows, boxes, 6) has the shape of token scores: without token labels it is refused
    needed = get_task("classification").labels_needed(TensorMeta("dets", np.dtype("float32"), (None, 100, 6)))
    assert needed is not None and "not supported" in needed


@pytest.mark.parametrize("task", TASKS.names())
def test_a_sequence_output_is_refused_by_every_task_with_how_to_make_a_tensor_of_it(task: str) -> None:
    """A SplitToSequence output: classification's refusal sent the user to task structured, which refused it too."""
    problem = get_task(task).output_problem(SEQUENCE)
    assert problem == ("output 'boxes' is a seq(tensor(float)), not a tensor: no task reads it (each reads a tensor "
                       "holding the rows on axis 0); expected a tensor output: add the tensors the sequence is made "
                       "from to the graph's outputs and name them in model.outputs, or join it into one tensor with "
                       "ConcatFromSequence (the rows on axis 0)")  # fmt: skip


def test_an_optional_output_is_refused_with_how_to_read_its_value() -> None:
    optional = TensorMeta("maybe", np.dtype(object), (), "other", "optional(tensor(float32))")
    for task in TASKS.names():
        problem = get_task(task).output_problem(optional)
        assert problem is not None and problem.endswith("expected a tensor output: return its value through "
                                                        "OptionalGetElement")  # fmt: skip


def test_each_task_owns_its_qat_loss() -> None:
    torch = pytest.importorskip("torch")
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    classification = get_task("classification")
    targets = classification.qat_label_targets(np.array([0, 1]), logits)
    expected = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1]))
    assert float(classification.qat_loss("label", logits, targets)) == pytest.approx(float(expected))
    teacher = classification.qat_distill_targets(logits)
    assert float(classification.qat_loss("distill", logits, teacher)) == pytest.approx(0.0, abs=1e-7)

    regression = get_task("regression")
    values = torch.tensor([[1.0], [3.0]])
    targets = regression.qat_label_targets(np.array([2.0, 3.0]), values)
    assert float(regression.qat_loss("label", values, targets)) == pytest.approx(0.5)  # (1 + 0) / 2

    multilabel = get_task("multilabel")
    zero = torch.zeros(1, 2)
    targets = multilabel.qat_label_targets(np.array([[1, 0]]), zero)
    assert float(multilabel.qat_loss("label", zero, targets)) == pytest.approx(float(np.log(2)))

    embedding = get_task("embedding")
    vectors = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    assert float(embedding.qat_loss("distill", vectors, torch.tensor([[0.0, 1.0], [0.0, 1.0]]))) == pytest.approx(0.5)
    with pytest.raises(QbenchError, match="task 'embedding' has no label loss for QAT"):
        embedding.qat_label_targets(np.array([0, 1]), vectors)


def test_every_metric_the_catalogue_says_counts_fp32_s_nan_rows_stays_defined_where_fp32_gives_nan() -> None:
    """The gate suggests these metrics where FP32's NaN/inf rows leave the gated one undefined: each must be finite
    there, for FP32 and a variant alike, and every task has one."""
    from qbench.validate.accuracy import evaluate_accuracy

    reference = np.array([[1.0, 0.2, 0.1], [0.1, 1.0, 0.3], [0.2, 0.1, 1.0], [np.nan, 0.5, 0.5]])
    for name in TASKS.names():
        counting = [info.name for info in get_task(name).metric_infos if info.counts_nonfinite_rows]
        assert counting, name
        together = len(get_task(name).together)  # a task reading several outputs at once gets as many
        for outputs in (reference, reference[::-1] + 0.3):
            values = evaluate_accuracy(name, {f"o{i}": outputs for i in range(together)} if together else outputs,
                                       {f"o{i}": reference for i in range(together)} if together else reference,
                                       None, {}).overall.metrics  # fmt: skip
            assert all(np.isfinite(values[metric]) for metric in counting), (name, values)


def test_qat_losses_read_probabilities_as_the_metrics_do() -> None:
    """Scores that are probabilities go through the task's qat_logits: cross-entropy and BCE then score the
    probabilities the model gave (on p itself, a right answer of 0.9 scored as if 0.9 were a logit)."""
    torch = pytest.importorskip("torch")
    probabilities = np.array([[0.9, 0.1], [0.2, 0.8]], dtype=np.float32)
    expected = -(np.log(0.9) + np.log(0.8)) / 2  # 0.16425
    classification = get_task("classification")
    assert classification.qat_reads_probabilities(probabilities, None)  # rows are distributions
    assert not classification.qat_reads_probabilities(probabilities, False)  # the graph says logits
    assert not classification.qat_reads_probabilities(np.array([[2.0, -1.0], [0.5, 3.0]]), None)
    scores = classification.qat_logits(torch.from_numpy(probabilities))
    targets = classification.qat_label_targets(np.array([0, 1]), scores)
    assert float(classification.qat_loss("label", scores, targets)) == pytest.approx(expected, rel=1e-5)
    teacher = classification.qat_distill_targets(scores)
    assert torch.allclose(teacher.exp(), torch.from_numpy(probabilities))

    multilabel = get_task("multilabel")
    sigmoids = np.array([[0.9, 0.2]], dtype=np.float32)
    assert multilabel.qat_reads_probabilities(sigmoids, None) and not multilabel.qat_reads_probabilities(sigmoids - 1, None)
    scores = multilabel.qat_logits(torch.from_numpy(sigmoids))
    targets = multilabel.qat_label_targets(np.array([[1, 0]]), scores)
    assert float(multilabel.qat_loss("label", scores, targets)) == pytest.approx(expected, rel=1e-5)
    assert not get_task("regression").qat_reads_probabilities(sigmoids, None)
