"""The contract of a task: how its labels are read, which outputs it evaluates, its metrics, its QAT loss.

A task is one module holding one `Task` subclass, registered by name in `qbench.tasks`.
Everything task-specific that the pipeline needs goes through this interface, so a new
task never falls into another task's path.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from qbench.errors import QbenchError
from qbench.modelinfo.signature import TensorMeta
from qbench.results.schema import SliceMetrics
from qbench.validate import metrics
from qbench.validate.catalogue import MetricInfo
from qbench.validate.float_range import FloatFormat

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from qbench.validate.scores_scale import ScaleReading


Outputs = np.ndarray | dict[str, np.ndarray]  # what a custom metric is given: one output, or several by name


class LabelError(QbenchError):
    """Labels that do not fit the task; the caller turns it into a RecipeError naming the label column."""


class RowSummary(Protocol):
    """Per-row quantities computed once over all evaluation rows; a slice is a boolean mask over them."""

    def summarise(self, name: str, mask: np.ndarray) -> SliceMetrics: ...


class MetricError(QbenchError):
    """A recipe's own metric raised: the recipe's code failed, not the model it scores (`metric`: its name)."""

    def __init__(self, message: str, metric: str) -> None:
        super().__init__(message)
        self.metric = metric


INPUTS_PARAMETER = "inputs"  # the custom metric's parameter that is given the scored rows' model inputs
SEQUENCE_IDS = "<tokenizer sequence ids>"
"""The key, in the feeds a task reads (values_read, rows_together), of the tokenizer's sequence ids of a text pair
(qbench.data.text.pair_sequence_ids: 0 first text, 1 second, -1 special or padding), where the rows encode one;
named as no model input is, since it is never fed to the model."""


@dataclass(frozen=True)
class CustomMetric:
    """A recipe's own per-slice metric: `function(outputs, labels[, reference_outputs][, inputs]) -> float`.

    Without `outputs` it is called once per evaluated output with arrays; with them, once over those outputs of the
    same rows, `outputs` and `reference_outputs` then dicts output name -> array (a detector's boxes with its scores).
    `wants_inputs`: it declares a parameter `inputs`, given by keyword a dict model input name -> array of the same
    rows, as the model was fed (an autoencoder's reconstruction error needs what it reconstructs)."""

    name: str
    function: Callable[..., float]
    higher_is_better: bool
    wants_reference: bool
    outputs: tuple[str, ...] = ()
    wants_inputs: bool = False

    def value(self, outputs: Outputs, labels: np.ndarray | None, reference: Outputs,
              inputs: Mapping[str, np.ndarray] | None = None) -> float:  # fmt: skip
        args: tuple[Any, ...] = (outputs, labels, reference) if self.wants_reference else (outputs, labels)
        keywords = {INPUTS_PARAMETER: inputs} if self.wants_inputs else {}
        try:
            return float(self.function(*args, **keywords))
        except Exception as exc:
            raise MetricError(f"custom metric {self.name!r} failed: {type(exc).__name__}: {exc}", self.name) from exc


def wilson(rate: float, n: int) -> tuple[float, float]:
    """Wilson interval of a rate measured over `n` rows (the count is recovered from the rate)."""
    if n == 0 or np.isnan(rate):
        return metrics.wilson_interval(0, 0)
    return metrics.wilson_interval(round(rate * n), n)


def no_label(value: Any) -> bool:
    """None, NaN, or pandas' NA (a nullable integer column's empty cell, a list column's null element)."""
    from pandas import NA  # imported by the table the value comes from: loading a recipe needs no pandas

    return value is None or value is NA or (isinstance(value, (float, np.floating)) and np.isnan(value))


def mean_or_nan(values: np.ndarray) -> float:
    return float(np.mean(values)) if np.size(values) else float("nan")


def example_rows(bad: np.ndarray, values: Sequence[Any], positions: np.ndarray | None = None) -> str:
    """'3 rows, e.g. row 17: 2.5' for the rows flagged in `bad` (positions: the data-file row numbers)."""
    where = np.flatnonzero(bad)
    first = int(where[0])
    row = int(positions[first]) if positions is not None else first
    return f"{where.size} row{'s' if where.size != 1 else ''}, e.g. row {row}: {values[first]!r}"


class Task(ABC):
    """One kind of model output and how it is judged against labels and against FP32."""

    name: ClassVar[str]
    metric_infos: ClassVar[tuple[MetricInfo, ...]]
    default_gate_metric: ClassVar[str | None]  # None: the recipe's first custom metric
    labels_name_classes: ClassVar[bool] = False  # label cells are names ("01" and "1" two classes), not numbers
    decides_by_argmax: ClassVar[bool] = False  # rows decides among score columns by their arg-max
    columns_are_classes: ClassVar[bool] = False  # an output's last axis is its classes (labels): never an input length
    reads_label_columns: ClassVar[bool] = False  # `data.label` may be a list of columns (one 0/1 column per label)
    labels_may_be_fed: ClassVar[bool] = False
    """Whether a label column may also feed a model input: a reconstruction (an autoencoder) is judged against the
    input it was fed. Where labels are classes, token tags or spans, a fed label is the answer itself (a leak)."""
    together: ClassVar[tuple[str, ...]] = ()
    """What each output is, for a task that judges several outputs of a row at once (span: its start and end scores),
    in the order `model.outputs` names them; its metrics are then unprefixed and come from `rows_together`. Empty:
    each evaluated output is judged on its own by `rows`."""

    def configured(self, options: Mapping[str, Any]) -> Task:
        """This task with the recipe's `task_options`; QbenchError starting with the option it cannot take."""
        if options:
            raise QbenchError(f"{sorted(options)[0]}: task {self.name!r} takes no options")
        return self

    def whole_number_option(
        self, options: Mapping[str, Any], name: str, default: int, *, minimum: int, unit: str, null: str = ""
    ) -> int | None:
        """The task's one option `name` from `options` (`default` when absent): a whole number >= `minimum`, or null
        where `null` says what null means; QbenchError starting with the option otherwise, or with one it lacks."""
        unknown = sorted(set(options) - {name})
        if unknown:
            raise QbenchError(f"{unknown[0]}: not an option of task {self.name!r}; expected {name}")
        value = options.get(name, default)
        if value is None and null:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            also = f", or null for {null}" if null else ""
            raise QbenchError(f"{name}: got {value!r}, expected a whole number of {unit} >= {minimum}{also}")
        return value

    def for_slices(self, slices: Mapping[str, np.ndarray]) -> Task:
        """This task for an evaluation whose slices are `slices` (name -> boolean mask over the rows), for a task
        whose per-row figures depend on them (embedding: which rows are sampled as queries); by default itself."""
        return self

    # -- labels ----------------------------------------------------------------------------------

    @abstractmethod
    def labels_from_values(self, values: Sequence[Any], positions: np.ndarray) -> np.ndarray:
        """The label column's values (one per evaluation row) as the array the metrics use.

        Raises LabelError naming the bad count and an example row (positions: data-file row numbers).
        """

    def check_labels(self, labels: np.ndarray, output: TensorMeta, positions: np.ndarray) -> None:
        """Labels against what the chosen output can express (class count, label width); LabelError if not."""

    def check_labels_against_reference(
        self, labels: np.ndarray, output: TensorMeta, values: np.ndarray, ran_labels: np.ndarray
    ) -> None:
        """Every evaluation label (`labels`) against the values FP32's `output` gave on the rows it ran, whose labels
        are `ran_labels` (row for row), for what the graph alone cannot tell (a label coding the output never uses);
        LabelError if they cannot be judged against each other."""

    def labels_needed(self, output: TensorMeta) -> str | None:
        """Why `output` cannot be judged without labels (a recipe without data.label is then refused), or None."""
        return None

    def metrics_not_computed(self, output: TensorMeta) -> dict[str, str]:
        """The task's metrics this output cannot give, each with the reason (gating on one fails before the sweep)."""
        return {}

    def decode_label_names(
        self, values: Sequence[Any], outputs: Sequence[TensorMeta], positions: np.ndarray
    ) -> Sequence[Any]:
        """Label values written as names the outputs define (e.g. a ZipMap's class names) turned into what
        `labels_from_values` reads; by default the values as they are."""
        return values

    # -- outputs ---------------------------------------------------------------------------------

    def output_rank(self, output: TensorMeta) -> int | None:
        """How well `output` suits this task when the recipe names none (0 = best); None: not evaluable.

        By default every output the task can evaluate ranks 0."""
        return None if self.output_problem(output) is not None else 0

    def pick_outputs(self, outputs: Sequence[TensorMeta]) -> list[str] | None:
        """The outputs a task of `together` reads when the recipe names none, in its order (None: it cannot tell)."""
        return None

    def labels_fit(self, output: TensorMeta, values: Sequence[Any]) -> bool:
        """Whether label cells of the form of `values` (the label column's) can be scored against `output`: among
        the outputs the recipe does not name, those the labels cannot score are passed over. By default all can."""
        return True

    @abstractmethod
    def output_problem(self, output: TensorMeta) -> str | None:
        """Why this task cannot evaluate `output` (None when it can); shown when the recipe names it."""

    # -- evaluation ------------------------------------------------------------------------------

    @abstractmethod
    def rows(
        self, outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None, *,
        probabilities: bool | None = None
    ) -> RowSummary:
        """Per-row quantities of `outputs` vs `reference` (FP32) and `labels`, ready to summarise per slice.

        `probabilities`: the graph makes these scores as probabilities (True) or logits (False); None when it does
        not say (TensorMeta.probabilities). Tasks that threshold scores read it; others ignore it."""

    def nonfinite_rows(self, outputs: np.ndarray, labels: np.ndarray | None,
                       feeds: Mapping[str, np.ndarray] | None = None,
                       reference: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        """Rows whose output holds NaN/inf in a value this task's metrics read (values_read; none for integer,
        boolean or string outputs): what a scope's NaN/inf counts, the gate's NaN/inf checks and the metrics left
        undefined where FP32 fails rest on. Where the task reads -inf as a value ruled out (masks_with_neginf), a
        row is counted only where no value is left or, given FP32's `reference`, where its -inf positions are not
        FP32's (metrics.mask_changed_rows): a class the variant rules out or lets back in is its failure there."""
        outputs = np.asarray(outputs)
        if outputs.dtype.kind not in "fc":
            return np.zeros(outputs.shape[0], dtype=bool)
        read, masked = self.values_read(outputs, labels, feeds or {}), self.masks_with_neginf(outputs)
        bad = metrics.nonfinite_rows(outputs, read, masked=masked)
        if masked and reference is not None:
            bad |= metrics.mask_changed_rows(outputs, reference, read)
        return bad

    def read_beyond_range(self, outputs: np.ndarray, reference: np.ndarray, fmt: FloatFormat | None) -> np.ndarray:
        """A variant's `outputs` as this task's metrics read them, `fmt` the float format its precision passes values
        through (float_range.float_format; None: none bounds them). Where a -inf/+inf only rounds an FP32 value the
        format cannot hold and no decision of the task hangs on it, a task may read FP32's value there
        (float_range.read_as_reference). By default every value as it is: a regression output or an embedding beyond
        the format is lost, the variant's NaN/inf row."""
        return np.asarray(outputs)

    def masks_with_neginf(self, outputs: np.ndarray) -> bool:
        """Whether this task reads -inf among these float outputs as a value ruled out rather than a failure: log
        probabilities after a -inf mask (log_softmax of masked logits, a constrained decoder's vocabulary, classes a
        row's category does not allow). By default every NaN/inf is a failure."""
        return False

    def values_read(self, outputs: np.ndarray, labels: np.ndarray | None,
                    feeds: Mapping[str, np.ndarray]) -> np.ndarray | None:  # fmt: skip
        """(rows, n) bool: which entries along axis 1 of `outputs` (a token's scores) this task's metrics read, where
        they read only some (token classification: the scored tokens; span: the context's); None where every value
        is read. `feeds`: the inputs the rows were run with. A NaN/inf elsewhere is no failure (nonfinite_rows), and
        the gate's output_spread varies over these alone: a padding token no metric reads is no sign of a collapse."""
        return None

    def rows_together(
        self, outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray], labels: np.ndarray | None,
        feeds: Mapping[str, np.ndarray],
    ) -> RowSummary:
        """Per-row quantities of the outputs of `together` (in its order) vs FP32's and `labels`; `feeds`: the model
        inputs the rows were run with, and SEQUENCE_IDS where known (which tokens a row's answer may lie in)."""
        raise QbenchError(f"task {self.name!r} judges each output on its own")

    def scale_reading(self, reference: np.ndarray, labels: np.ndarray | None,
                      stated: bool | None) -> ScaleReading | None:
        """How `rows` reads several score columns of these FP32 outputs, probabilities or logits, and why (None when
        it reads no such scale); `stated`: the graph's word. FP32's notes give it."""
        return None

    def thresholds_by_scale(self, reference: np.ndarray) -> bool:
        """Whether `rows` decides these (FP32) outputs at a threshold set by their scale (0.5 for probabilities, 0 for
        logits), so that reading the scale wrong turns decisions. By default nothing is thresholded."""
        return False

    # -- QAT ---------------------------------------------------------------------------------------

    @property
    def has_qat_label_loss(self) -> bool:
        """Whether qat.loss 'label' applies: the task turns labels into QAT targets (it overrides qat_label_targets)."""
        return type(self).qat_label_targets is not Task.qat_label_targets

    def qat_reads_probabilities(self, teacher_output: np.ndarray, stated: bool | None) -> bool:
        """Whether the module's scores are probabilities, read as `rows` reads them (`stated`: the graph's word, else
        FP32's values on the training rows): the QAT loss then takes them through qat_logits first."""
        return False

    def qat_logits(self, probabilities: torch.Tensor) -> torch.Tensor:
        """Probabilities as the logits the QAT losses expect (a softmax or sigmoid of them gives them back)."""
        return probabilities

    def qat_label_targets(self, labels: np.ndarray, output: torch.Tensor) -> torch.Tensor:
        """Labels as the targets of `qat_loss('label', ...)`, checked against a sample of the module's output."""
        raise QbenchError(f"task {self.name!r} has no label loss for QAT; use qat.loss 'distill'")

    def qat_distill_targets(self, teacher_output: torch.Tensor) -> torch.Tensor:
        """The FP32 teacher's output as the targets of `qat_loss('distill', ...)`."""
        return teacher_output.detach()

    def qat_loss(self, kind: str, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The fine-tuning loss of `output` against targets from qat_label_targets / qat_distill_targets."""
        import torch.nn.functional as F

        if kind == "label":
            raise QbenchError(f"task {self.name!r} has no label loss for QAT; use qat.loss 'distill'")
        return F.mse_loss(output, targets)


def is_float(output: TensorMeta) -> bool:
    return output.kind == "tensor" and output.dtype.kind == "f"


def is_integer(output: TensorMeta) -> bool:
    return output.kind == "tensor" and output.dtype.kind in "iub"


def thresholded_log_problem(output: TensorMeta) -> str | None:
    """Why scores cut at a threshold (one score column, multilabel) cannot be read when they are log-probabilities:
    read as a probability (cut at 0.5) or a logit (cut at 0), every value of log(p) <= 0 is a 'no'."""
    if not output.log_probabilities:
        return None
    return (f"output {output.name!r} is the log of a probability (a Log of a Sigmoid, or a LogSoftmax): each score is "
            "cut at a probability's threshold (0.5) or a logit's (0), never at log(0.5), so every decision would be "
            "wrong; name the output before the Log, or export the logits")


def container_problem(task: str, output: TensorMeta) -> str | None:
    """Why `task` cannot read an output that is no tensor, and what to return instead; None for a tensor. A ZipMap's
    per-row maps are classification's alone; a sequence, an optional or a map of its own no task reads (each reads the
    rows on axis 0 of a tensor), so the refusal says how to make a tensor of it, never which other task to try."""
    if output.kind == "tensor":
        return None
    if output.kind == "map":
        return (f"output {output.name!r} is a {output.type_name} (per-row class scores, as a ZipMap writes): task "
                f"{task!r} cannot read it; expected a tensor output, or task 'classification'")
    if output.type_name.startswith("seq("):
        remedy = ("add the tensors the sequence is made from to the graph's outputs and name them in model.outputs, or "
                  "join it into one tensor with ConcatFromSequence (the rows on axis 0)")
    elif output.type_name.startswith("optional("):
        remedy = "return its value through OptionalGetElement"
    else:
        remedy = "return the tensor it is made from"
    return (f"output {output.name!r} is a {output.type_name}, not a tensor: no task reads it (each reads a tensor "
            f"holding the rows on axis 0); expected a tensor output: {remedy}")


def float_output_problem(task: str, output: TensorMeta) -> str | None:
    """The common refusal of tasks that read only float tensors (embedding, regression, multilabel)."""
    if output.passthrough_of is not None:
        return f"output {output.name!r} is a copy of the input {output.passthrough_of!r}, not a prediction"
    if output.kind != "tensor":
        return container_problem(task, output)
    if not is_float(output):
        return (f"output {output.name!r} holds {output.dtype} values: task {task!r} reads float outputs only; expected "
                "the float output before the Cast (model.output), task classification for class ids, or task "
                "structured, which compares integer values with FP32's as integers")
    return None
