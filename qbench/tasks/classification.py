"""Classification: class scores (logits, probabilities, a {class: probability} map) or class ids.

A float output of shape (rows, classes) — or a converter's ZipMap, read as such a matrix — gives
accuracy, agreement and flip rate of the top-1 class, the KL divergence of the softmax and the
largest score difference. A 1-D integer output is class ids and gives accuracy, agreement and
flip rate only: an integer is never read as a score. A 1-D string or integer label output is read the
same way when the graph states the classes it picks from (an ONNX-ML classifier's label, a constant
table): each value becomes its position in that table (qbench.validate.outputs), as the labels do.
A float output (rows, tokens, classes) scores every token (token classification, qbench.tasks.tokens): its labels
are a list of one class id per token, and its metrics are per scored token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from qbench.modelinfo.classes import keys_are_columns
from qbench.modelinfo.signature import TensorMeta
from qbench.results.schema import SliceMetrics
from qbench.tasks.base import (
    LabelError,
    RowSummary,
    Task,
    container_problem,
    example_rows,
    is_float,
    is_integer,
    mean_or_nan,
    no_label,
    thresholded_log_problem,
    wilson,
)
from qbench.tasks.class_labels import (
    as_number,
    class_key,
    decisions_beyond_labels,
    integral,
    label_columns,
    plain_class_ids,
    text_class_ids,
)
from qbench.tasks.class_scores import (
    ONE_COLUMN_CLASSES,
    class_count,
    column_classes,
    listed_classes,
    named_labels,
    one_score_column,
)
from qbench.tasks.tokens import (
    TokenRows,
    any_token_list,
    check_token_labels,
    is_token_scores,
    labels_from_lists,
    token_axis,
)
from qbench.validate import kept as kept_rules
from qbench.validate import metrics
from qbench.validate.catalogue import MAX_ABS_ERROR, MetricInfo, share_of_rows
from qbench.validate.float_range import FloatFormat, read_as_reference
from qbench.validate.scores_scale import ScaleReading, read_scale

if TYPE_CHECKING:  # pragma: no cover
    import torch

_STRUCTURED = ("structured outputs (detection boxes, masks, sequences) are not supported by task 'classification' "
               "(task 'structured' judges them by your own metrics)")


def _positional_scores(output: TensorMeta, values: np.ndarray) -> bool:
    """Whether FP32's `values` of `output` are scores whose arg-max is a column number a row label is read as: a float
    (rows, columns) tensor of three or more columns, decided by its highest, whose graph names no class per column."""
    return (output.kind == "tensor" and is_float(output) and np.ndim(values) == 2 and np.shape(values)[1] > 2
            and not output.lowest_wins and not output.off_label and column_classes(output) is None)


def _negative(value: Any) -> bool:
    """Whether a label cell writes a negative number (a CSV's text "-1" too)."""
    number = as_number(value)
    return isinstance(number, (int, float, np.integer, np.floating)) and not isinstance(number, bool) and number < 0


def _score_shape_problem(output: TensorMeta) -> str | None:
    if token_axis(output):
        return None
    if len(output.shape) > 2 and any(d != 1 for d in output.shape[1:-1]):
        return (f"output {output.name!r} has shape {list(output.shape)}, neither (rows, classes) nor (rows, tokens, "
                f"classes): {_STRUCTURED}")  # fmt: skip
    return None


@dataclass(frozen=True)
class ClassificationRows:
    outputs: np.ndarray
    reference: np.ndarray
    labels: np.ndarray | None
    predicted: np.ndarray
    reference_predicted: np.ndarray
    kl: np.ndarray | None  # None for class-id outputs
    masked: bool = False  # -inf scores are classes ruled out (Classification.masks_with_neginf)

    def summarise(self, name: str, mask: np.ndarray) -> SliceMetrics:
        size = int(np.count_nonzero(mask))
        predicted, reference_predicted = self.predicted[mask], self.reference_predicted[mask]
        agreement = metrics.agreement(predicted, reference_predicted)
        flips = metrics.flip_rate(predicted, reference_predicted)
        accuracy = agreement if self.labels is None else metrics.accuracy(predicted, self.labels[mask])
        values = {"accuracy": accuracy, "agreement": agreement, "flip_rate": flips}
        intervals = {name_: wilson(value, size) for name_, value in values.items()}
        if self.kl is not None:
            kl = self.kl[mask]
            values["kl_mean"] = mean_or_nan(kl)
            values["max_abs_error"] = metrics.max_abs_error(self.outputs[mask], self.reference[mask], self.masked)
            intervals["kl_mean"] = metrics.mean_interval(kl)
        kept = kept_rules.decisions_kept(predicted, reference_predicted)
        return SliceMetrics(name=name, size=size, metrics=values, intervals=intervals, kept={"": kept} if kept else {})


def _class_ids(outputs: np.ndarray) -> np.ndarray:
    return np.asarray(outputs).reshape(np.shape(outputs)[0]).astype(np.int64)


def _class_codes(predicted: np.ndarray, reference: np.ndarray,
                 labels: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:  # fmt: skip
    """Class values of an integer output (an IsolationForest's -1 outlier, 1 inlier) coded as their rank among all
    the values given, when some is negative: -1 is metrics.INVALID_CLASS, which matches nothing, so FP32 agreed with
    itself on 88 % of rows. Equal values stay equal, so every metric is unchanged."""
    parts = [predicted, reference] + ([] if labels is None else [np.asarray(labels, dtype=np.int64)])
    if min(int(part.min(initial=0)) for part in parts) >= 0:
        return predicted, reference, labels
    codes = np.unique(np.concatenate(parts), return_inverse=True)[1].reshape(-1)
    ends = np.cumsum([len(part) for part in parts])
    coded = np.split(codes, ends[:-1])
    return coded[0], coded[1], coded[2] if labels is not None else None


class Classification(Task):
    name = "classification"
    metric_infos = (
        share_of_rows("accuracy", True,
                      "top-1 accuracy vs labels (vs FP32 top-1 without labels), per row or scored token",
                      decisions="agreement", row_mean=True),
        share_of_rows("agreement", True, "fraction of rows (scored tokens) whose top-1 matches FP32"),
        share_of_rows("flip_rate", False, "fraction of rows (scored tokens) whose top-1 differs from FP32",
                      row_mean=True),
        MetricInfo("kl_mean", False, "mean KL(FP32 || variant) of the softmax outputs (score outputs only)", low=0.0),
        MAX_ABS_ERROR,
    )
    default_gate_metric = "accuracy"
    labels_name_classes = True
    decides_by_argmax = True
    columns_are_classes = True

    def labels_from_values(self, values: Sequence[Any], positions: np.ndarray) -> np.ndarray:
        labels = plain_class_ids(values)
        if labels is None:
            labels = text_class_ids(values)
        if labels is not None:
            return labels
        if any_token_list(values):
            return labels_from_lists(values, positions, integral)
        values = [as_number(v) for v in values]
        missing = np.array([no_label(v) for v in values], dtype=bool)
        if missing.any():
            raise LabelError(f"{example_rows(missing, values, positions)} have no label; expected integer class ids")
        not_ids = np.array([not integral(v) for v in values], dtype=bool)
        if not_ids.any():
            raise LabelError(f"{example_rows(not_ids, values, positions)} are not integer class ids (for class names, "
                             "list them in the order of the model's score columns in data.classes; "
                             f"{ONE_COLUMN_CLASSES})")  # fmt: skip
        return np.array([int(v) for v in values], dtype=np.int64)  # negative ones: check_labels, per output

    def labels_needed(self, output: TensorMeta) -> str | None:
        """Scores per token are read as token classification only with token labels: they say which tokens to score
        (-100: padding, special tokens), and a structured output of that shape (detection boxes) has none."""
        if not token_axis(output):
            return None
        return (f"output {output.name!r} of shape {list(output.shape)} is read as class scores per token (token "
                f"classification): expected data.label naming a list of one class id per token in each row "
                f"({metrics.IGNORE_LABEL} for a token not to score); other {_STRUCTURED}")  # fmt: skip

    def metrics_not_computed(self, output: TensorMeta) -> dict[str, str]:
        if is_integer(output) or named_labels(output):
            reason = "it holds class ids, and the metric needs scores"
            return {"kl_mean": reason, "max_abs_error": reason}
        return {}

    def decode_label_names(
        self, values: Sequence[Any], outputs: Sequence[TensorMeta], positions: np.ndarray
    ) -> Sequence[Any]:
        """Labels naming classes become the column the evaluated scores give that class: its position among a string
        ZipMap's sorted keys (as the map is read), or in a score or label tensor's class table
        (qbench.modelinfo.classes). Labels that are no class of such an output are an error; without one, labels are
        column ids. A label output read through its table is refused beside an output stating other classes."""
        stated = [(o, table) for o in outputs if (table := column_classes(o)) is not None]
        if not stated:
            return values  # no stated classes: the values are judged as ids
        named, classes = stated[0]
        other = next(((o, table) for o, table in stated if table != classes), None)
        if other is not None:
            if not any(named_labels(o) for o, _ in stated):
                return values  # score outputs that disagree on their classes: the values are judged as ids
            raise LabelError(f"outputs {named.name!r} and {other[0].name!r} state different classes "
                             f"({listed_classes(classes)}; {listed_classes(other[1])}): "
                             "expected one of them in model.outputs")  # fmt: skip
        names = {k for k in classes if isinstance(k, str)}
        if len(names) == len(classes) and not any(
            isinstance(as_number(v), str) or class_key(v) in names for v in values
        ):
            return values  # ids (numbers, or a CSV's text of them) naming none of the named classes: read as columns
        # A number whose text names a class names it, as that text in a CSV does: a Parquet integer 2 against the
        # classes '0', '1', '10', '2' (sorted as text) is class '2' (column 3), never column 2 ('10').
        ids = [o.name for o in outputs if o.kind == "tensor" and is_integer(o) and not named_labels(o)]
        if ids:
            raise LabelError(f"output {named.name!r} scores the classes {listed_classes(classes)} by column, while "
                             f"output {ids[0]!r} gives class values: "
                             "expected one of them in model.outputs")  # fmt: skip
        unknown = f"name classes the output {named.name!r} does not have (its classes: {listed_classes(classes)})"
        return label_columns(values, classes, positions, unknown=unknown)

    def check_labels(self, labels: np.ndarray, output: TensorMeta, positions: np.ndarray) -> None:
        check_token_labels(labels, output, positions, class_count(output))
        if labels.ndim == 2:
            return
        negative = labels < 0
        if negative.any() and not (is_integer(output) and class_count(output) is None):
            raise LabelError(f"{example_rows(negative, labels.tolist(), positions)} are negative; expected class ids "
                             f">= 0 (output {output.name!r} gives class ids, not class values)")  # fmt: skip
        if output.kind == "map" and output.class_keys is not None and keys_are_columns(output.class_keys):
            outside = ~np.isin(labels, np.array(output.class_keys, dtype=np.int64))
            if outside.any():
                keys = ", ".join(str(k) for k in output.class_keys)
                raise LabelError(
                    f"{example_rows(outside, labels.tolist(), positions)} hold classes the output "
                    f"{output.name!r} does not have (its classes: {keys})"
                )
            return
        classes = class_count(output)
        if classes is not None:
            outside = labels >= classes
            if outside.any():
                raise LabelError(
                    f"{example_rows(outside, labels.tolist(), positions)} hold class ids outside 0..{classes - 1} "
                    f"(output {output.name!r} has {classes} classes)"
                )

    def check_labels_against_reference(self, labels: np.ndarray, output: TensorMeta, values: np.ndarray,
                                       ran_labels: np.ndarray) -> None:
        """An integer output the graph states no class table for gives class ids or class values of its own; labels
        sharing none of the values FP32 gives are in another coding (class values against ids, ids of a symbolic
        class dimension beyond the scores): every row would be wrong for every variant, and a gate would pass drops
        of 0 from an FP32 accuracy of 0. A score tensor whose top column FP32 puts beyond every label on most rows
        is no set of the labels' classes either (class_labels.decisions_beyond_labels)."""
        shown = f"output {output.name!r} of shape {output.shape_text()}"
        if _positional_scores(output, values) and (why := decisions_beyond_labels(values, ran_labels, shown)):
            raise LabelError(why)
        if not is_integer(output) or named_labels(output) or not labels.size:
            return
        given = np.unique(np.asarray(values).reshape(-1))
        if not np.isin(labels, given).any():
            raise LabelError(f"no label is a value FP32's output {output.name!r} gives (labels: "
                             f"{listed_classes(np.unique(labels))}; output: {listed_classes(given)}): expected labels "
                             "in the output's coding (its class ids, "
                             "or the classes the model was trained on)")  # fmt: skip

    def output_rank(self, output: TensorMeta) -> int | None:
        if self.output_problem(output) is not None:
            return None
        if is_integer(output) or named_labels(output):
            return 1
        if token_axis(output):  # per-token scores beside a (rows, classes) output are its hidden states, mostly
            return 3
        return 2 if output.off_label else 0  # scores say more than ids, unless their arg-max is not the label

    def labels_fit(self, output: TensorMeta, values: Sequence[Any]) -> bool:
        """Token labels (a list per row) score a per-token output only, one label per row only an output per row; and
        negative labels (an IsolationForest's or OneClassSVM's -1 outlier, 1 inlier) only an output giving class values
        (an integer label with no class table) or stating its classes: an output giving class ids by position (the
        anomaly score beside that label, split into 0 and 1) cannot hold -1, and was picked and refused."""
        if any_token_list(values) != token_axis(output):
            return False
        if token_axis(output) or not any(_negative(v) for v in values):
            return True
        return (is_integer(output) and class_count(output) is None) or column_classes(output) is not None

    def output_problem(self, output: TensorMeta) -> str | None:
        if output.passthrough_of is not None:
            return f"output {output.name!r} is a copy of the input {output.passthrough_of!r}, not a prediction"
        if output.kind == "map":
            return None if output.dtype.kind == "f" else (f"output {output.name!r} "
                                                          f"({output.type_name}) has no float scores")
        if output.kind != "tensor":
            return container_problem(self.name, output)
        if is_integer(output) or named_labels(output):
            if len(output.shape) > 2 or (len(output.shape) == 2 and output.shape[1] != 1):
                kind = "integer" if is_integer(output) else "string"
                return f"{kind} output {output.name!r} of shape {list(output.shape)} is neither class ids nor scores"
            return None
        if output.dtype == object:
            return (f"output {output.name!r} holds strings the graph states no class table for (no ONNX-ML "
                    "classifier's label nor a constant table it is looked up in): neither class ids nor scores")
        if not is_float(output):
            return f"output {output.name!r} holds {output.dtype} values, neither class ids nor scores"
        if one_score_column(output):  # more columns are decided by their arg-max, whatever their scale
            problem = thresholded_log_problem(output)
            if problem is not None:
                return problem
        return _score_shape_problem(output)

    def rows(
        self, outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None, *,
        probabilities: bool | metrics.BinaryCut | None = None,
    ) -> RowSummary:
        outputs, reference = np.asarray(outputs), np.asarray(reference)
        if labels is not None and np.asarray(labels).dtype.kind not in "biu":
            raise LabelError(f"labels must be integer class indices, got {np.asarray(labels).dtype} values")
        if outputs.dtype.kind in "iub":
            predicted, reference_predicted, labels = _class_codes(_class_ids(outputs), _class_ids(reference), labels)
            return ClassificationRows(outputs, reference, labels, predicted, reference_predicted, kl=None)
        cut = probabilities if isinstance(probabilities, metrics.BinaryCut) else None
        scale = probabilities if cut is None else None
        masked = self.masks_with_neginf(reference)
        if is_token_scores(outputs, labels):
            return TokenRows.of(outputs, reference, labels, self.scale_reading(reference, labels, scale), masked)
        columns = 1 if outputs.ndim == 1 else int(outputs.shape[-1])
        if labels is not None and labels.size and columns > 1 and int(labels.max()) >= columns:
            raise LabelError(f"labels go up to class {int(labels.max())} but the output has {columns} classes")
        binary_probabilities = metrics.looks_like_sigmoid(reference) if scale is None else scale
        # one column: the graph's cut, else its word, else FP32's values decide, and the variant is read as FP32 is
        decision = cut if cut is not None and columns == 1 else binary_probabilities
        reference_predicted = metrics.top1(reference, decision, masked)
        predicted = metrics.top1(outputs, decision, masked)
        if masked:  # classes ruled out where FP32 scores them (or the reverse): the variant's failure on that row
            predicted[metrics.mask_changed_rows(outputs, reference)] = metrics.INVALID_CLASS
        predicted = metrics.unscored_where_reference_is(predicted, reference_predicted)
        return ClassificationRows(
            outputs, reference, labels, predicted, reference_predicted,
            kl=metrics.kl_rows(reference, outputs, binary_probabilities if columns == 1
                               else self.scale_reading(reference, labels, scale).probabilities, masked),
            masked=masked,
        )  # fmt: skip

    def scale_reading(self, reference: np.ndarray, labels: np.ndarray | None,
                      stated: bool | None) -> ScaleReading | None:
        """Several float score columns (per row, or per scored token: padding an export zeroes says nothing of
        their scale) are read by the graph's word, else by FP32's rows (qbench.validate.scores_scale)."""
        reference = np.asarray(reference)
        if reference.dtype.kind != "f" or reference.ndim < 2 or reference.shape[-1] < 2:
            return None
        if is_token_scores(reference, labels):
            scored = np.ones(reference.shape[:2], dtype=bool) if labels is None else metrics.scored_tokens(labels)
            reference = metrics.token_scores(reference, scored)
        return read_scale(reference, stated)

    def values_read(self, outputs: np.ndarray, labels: np.ndarray | None,
                    feeds: Mapping[str, np.ndarray]) -> np.ndarray | None:  # fmt: skip
        """Per token with labels that fit: the scored tokens. A NaN/inf on a token labelled IGNORE_LABEL is read by
        no metric, so it neither makes the row FP32's failure (leaving kl_mean and max_abs_error undefined) nor
        counts as the variant's; without labels, or when they do not fit (TokenRows.of says why), every token."""
        if labels is not None and is_token_scores(outputs, labels) and np.shape(labels) == np.shape(outputs)[:2]:
            return metrics.scored_tokens(labels)
        return None

    def masks_with_neginf(self, outputs: np.ndarray) -> bool:
        """Several float score columns (per row or per token) are decided by their arg-max, which -inf leaves well
        defined: a class scored -inf is one the model rules out on that row (a -inf mask before log_softmax)."""
        outputs = np.asarray(outputs)
        return outputs.dtype.kind == "f" and outputs.ndim >= 2 and outputs.shape[-1] > 1

    def read_beyond_range(self, outputs: np.ndarray, reference: np.ndarray, fmt: FloatFormat | None) -> np.ndarray:
        """Several score columns are decided by their arg-max: a class the variant's format rounds to -inf where FP32
        gives it a probability the format cannot hold, or its highest score rounded to +inf beyond the format's range,
        the arg-max unchanged, is FP32's value, not the variant's failure (float_range). One score column is cut at a
        threshold, class ids hold no scores: read as they are."""
        return read_as_reference(outputs, reference, fmt) if self.masks_with_neginf(reference) else np.asarray(outputs)

    def thresholds_by_scale(self, reference: np.ndarray) -> bool:
        reference = np.asarray(reference)
        return reference.dtype.kind == "f" and reference.ndim > 0 and int(np.prod(reference.shape[1:])) == 1

    def qat_reads_probabilities(self, teacher_output: np.ndarray, stated: bool | None) -> bool:
        reading = self.scale_reading(teacher_output, None, stated)
        return reading is not None and reading.probabilities

    def qat_logits(self, probabilities: torch.Tensor) -> torch.Tensor:
        """log p: cross-entropy and the distillation KL then compare the distributions the model outputs (on p itself,
        a correct prediction scored a loss of at least 1.46 with 10 classes, and KL compared two flattened
        softmaxes)."""
        import torch

        return torch.log(probabilities.clamp_min(torch.finfo(probabilities.dtype).tiny))

    def qat_label_targets(self, labels: np.ndarray, output: torch.Tensor) -> torch.Tensor:
        import torch

        if output.ndim != 2:
            raise LabelError(
                f"qat.loss 'label' needs class scores [batch, classes] as the model's first output; "
                f"it returns shape {list(output.shape)} (use loss 'distill')"
            )
        targets = torch.as_tensor(np.array(labels)).long()
        if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= output.shape[1]):
            raise LabelError(
                f"qat.loss 'label' needs one label in 0..{output.shape[1] - 1} per training row; "
                f"got labels in {int(targets.min())}..{int(targets.max())}"
            )
        return targets

    def qat_distill_targets(self, teacher_output: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        return F.log_softmax(teacher_output.detach(), dim=-1)

    def qat_loss(self, kind: str, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        if kind == "label":
            return F.cross_entropy(output, targets)
        # KL(teacher || student) over the last dimension, averaged over rows
        return F.kl_div(F.log_softmax(output, dim=-1), targets, reduction="batchmean", log_target=True)


CLASSIFICATION = Classification()
