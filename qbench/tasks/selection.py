"""Which model outputs a task evaluates: the recipe's choice, checked, or one picked by the task's rules."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from qbench.errors import QbenchError, expected_one_of, first_named, plain_name
from qbench.modelinfo.signature import ModelInfo, TensorMeta, rows_input
from qbench.tasks.base import Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutputChoice:
    """One evaluated output: its position in the model's outputs and what it is."""

    index: int
    meta: TensorMeta

    @property
    def name(self) -> str:
        return self.meta.name


def _listing(model: ModelInfo) -> str:
    return "; ".join(meta.describe() for meta in model.outputs.values())


def choose_outputs(
    task: Task, model: ModelInfo, wanted: Sequence[str] | None, labels: Sequence[Any] | None = None
) -> list[OutputChoice]:
    """The outputs to evaluate, in the order given. QbenchError naming the outputs when the choice is
    impossible: a named output the task cannot read (an integer for embedding, a copy of an input, a
    structured output), or no/several equally suitable outputs when the recipe names none.

    `labels`: the label column's values, when the recipe has one. Unless the recipe names the outputs, those its
    labels cannot score (Task.labels_fit: a CLS embedding beside the per-token logits that token labels score) are
    passed over whatever their rank, when another output fits; when none does, the label check says why."""
    names = list(model.outputs)
    if task.together:
        return _together(task, model, wanted, names)
    if wanted:
        return [_named(task, model, name, names) for name in wanted]
    ranked = [(rank, i) for i, meta in enumerate(model.outputs.values())
              if (rank := _rank(task, model, meta)) is not None]
    if labels is not None:
        fitting = [(rank, i) for rank, i in ranked if task.labels_fit(model.outputs[names[i]], labels)]
        if fitting:
            for _, i in sorted(set(ranked) - set(fitting)):
                log.info("output %r passed over: the labels cannot score it", names[i])
            ranked = fitting
    for meta in model.outputs.values():
        if meta.passthrough_of is not None:
            log.info("output %r skipped: it is a copy of the input %r", meta.name, meta.passthrough_of)
    if not ranked:
        reasons = "; ".join(str(_problem(task, model, meta)) for meta in model.outputs.values())
        raise QbenchError(f"no output task {task.name!r} can evaluate: {reasons}")
    best = min(rank for rank, _ in ranked)
    tied = [i for rank, i in ranked if rank == best]
    if len(tied) > 1:
        candidates = ", ".join(repr(names[i]) for i in tied)
        raise QbenchError(
            f"the model has several outputs task {task.name!r} could evaluate ({candidates}); name one in "
            f"model.output (or several in model.outputs). Outputs: {_listing(model)}"
        )
    choice = OutputChoice(tied[0], model.outputs[names[tied[0]]])
    log.info("evaluating output %s (task %s; model.output not set)", choice.meta.describe(), task.name)
    _warn_off_label(task, choice.meta)
    return [choice]


def _together(task: Task, model: ModelInfo, wanted: Sequence[str] | None, names: list[str]) -> list[OutputChoice]:
    """The outputs a task judging several at once reads: as many as it has roles, the recipe's or the task's pick."""
    roles = " and ".join(task.together)
    if not wanted:
        wanted = task.pick_outputs([meta for meta in model.outputs.values() if _problem(task, model, meta) is None])
        if wanted is None:
            raise QbenchError(f"task {task.name!r} reads the {roles} outputs together and cannot tell them apart by "
                              "name; list them in model.outputs, in that order. "
                              f"Outputs: {_listing(model)}")  # fmt: skip
        log.info("evaluating outputs %s as the %s (task %s; model.outputs not set)",
                 ", ".join(map(repr, wanted)), roles, task.name)  # fmt: skip
    if len(wanted) != len(task.together):
        raise QbenchError(f"task {task.name!r} reads {len(task.together)} outputs together (the {roles}, in that "
                          f"order); got {len(wanted)}: {', '.join(map(repr, wanted))}")  # fmt: skip
    return [_named(task, model, name, names) for name in wanted]


def _warn_off_label(task: Task, meta: TensorMeta) -> None:
    if meta.lowest_wins and task.decides_by_argmax:
        log.info("output %r: %s; each row's class is its lowest score, as the graph's label is",
                 meta.name, meta.off_label)  # fmt: skip
    elif meta.off_label:
        log.warning("output %r: %s; figures read from its highest score may not be the model's own label",
                    meta.name, meta.off_label)  # fmt: skip


def _named(task: Task, model: ModelInfo, name: str, names: list[str]) -> OutputChoice:
    if name not in model.outputs:
        if (op := model.inner.get(name)) is not None:
            raise QbenchError(_inner_tensor(name, op, names))
        raise QbenchError(f"model output {expected_one_of(name, names)}")
    meta = model.outputs[name]
    problem = _problem(task, model, meta)
    if problem is not None:
        usable = [m.describe() for m in model.outputs.values() if _rank(task, model, m) is not None]
        hint = f"; outputs it can read: {', '.join(usable)}" if usable else "; no output of this model is one"
        raise QbenchError(f"{problem}{hint}")
    _warn_off_label(task, meta)
    return OutputChoice(names.index(name), meta)


def _inner_tensor(name: str, op: str, names: list[str]) -> str:
    """A named tensor the graph computes but does not return (a detector's raw boxes before its NonMaxSuppression):
    qbench runs the graph's outputs only, so it says so and how to return that tensor, not merely 'no such output'."""
    return (f"model output {name!r} is a tensor inside the graph (made by a {op} node), not one of its outputs "
            f"({', '.join(map(plain_name, names))}): qbench evaluates the graph's outputs only; expected one of them, "
            f"or the model saved with {name!r} among its outputs (onnx: append "
            f"onnx.helper.make_tensor_value_info({name!r}, elem_type, None) to model.graph.output and save it), "
            "named here")


NAMED_LEFT_OUT = 4  # outputs a note names (a decoder returns dozens of cache tensors): the rest are counted


def outputs_left_out(model: ModelInfo, evaluated: Sequence[OutputChoice]) -> list[TensorMeta]:
    """The model's outputs that no figure reads, copies of an input aside: a variant that breaks one of them (a second
    head, a count beside its boxes) changes no figure and no gate check."""
    names = {choice.name for choice in evaluated}
    scored = any(choice.meta.kind == "map" or choice.meta.dtype.kind == "f" for choice in evaluated)
    return [meta for meta in model.outputs.values()
            if meta.name not in names and meta.passthrough_of is None and not (scored and _graphs_label(meta))]


def outputs_not_compared(left_out: Sequence[TensorMeta], evaluated: Sequence[OutputChoice]) -> str | None:
    """FP32's note naming the outputs `left_out` of the evaluation (`outputs_left_out`), or None where there are none:
    the results say which outputs their figures cover and which they leave out."""
    if not left_out:
        return None
    judged = ", ".join(repr(choice.name) for choice in evaluated)
    plural = "s" if len(left_out) > 1 else ""
    named = first_named([meta.describe() for meta in left_out], NAMED_LEFT_OUT)
    return (f"output{plural} {named} not compared with FP32: every figure and the gate judge {judged} "
            f"alone, so a variant changing {'them' if plural else 'it'} passes unremarked; expected the outputs to "
            "judge listed in model.outputs (task structured with a metric of your own reads any of them)")


def _graphs_label(meta: TensorMeta) -> bool:
    """Whether `meta` is a classifier's label output, the class its graph picks from a class table it states (an
    ONNX-ML classifier's first output, `classes[ArgMax(scores)]`): judging the scores beside it judges that choice
    (skl2onnx's classifiers all have one), so leaving it out leaves nothing unjudged."""
    return meta.kind == "tensor" and meta.dtype.kind != "f" and meta.picks_from_table


def _rows_elsewhere(model: ModelInfo, meta: TensorMeta) -> str | None:
    """Why `meta` gives its rows on another axis than 0: a later axis carries the dimension the inputs take their
    rows on (axis 0 of an input, by name) and axis 0 does not (a leading unit axis, [1, 'N', 3]; [seq, batch, ...])."""
    rows = {names[0]: name for name, m in model.inputs.items() if (names := m.dim_names) and names[0]}
    if meta.kind != "tensor" or not meta.dim_names or meta.dim_names[0] in rows:
        return None
    if meta.shape[0] is None and not meta.dim_names[0]:
        return None  # an axis 0 the graph leaves unknown may be the rows: the run check sees
    axis = next((i for i, n in enumerate(meta.dim_names) if n in rows), None)
    if axis is None:
        return None
    symbol = meta.dim_names[axis]
    return (f"output {meta.name!r} of shape {meta.shape_text()} gives its rows on axis {axis} ({symbol!r}, axis 0 of "
            f"input {rows[symbol]!r}), not on axis 0: qbench reads one output row per input row along axis 0; export "
            "the output with the rows first (a leading unit axis dropped: Squeeze, or the model's own batch-first "
            "layout)")  # fmt: skip


def _rows_across(model: ModelInfo, meta: TensorMeta) -> str | None:
    """Why `meta` is no output per row though its axis 0 is the rows: a later axis is the rows too (the inputs' axis 0
    symbol again, [batch, batch]: a similarity of every row with every other row of the batch, as a dual encoder's
    logits), so each row's values depend on what is batched with it."""
    rows = {names[0] for m in model.inputs.values() if (names := m.dim_names) and names[0]}
    if meta.kind != "tensor" or not meta.dim_names or meta.dim_names[0] not in rows:
        return None
    axis = next((i for i, n in enumerate(meta.dim_names[1:], 1) if n == meta.dim_names[0]), None)
    if axis is None:
        return None
    return (f"output {meta.name!r} of shape {meta.shape_text()} has the rows on axis {axis} too "
            f"({meta.dim_names[0]!r}): {ACROSS_ROWS}")


ACROSS_ROWS = ("its values pair each row with every row of the batch (a similarity matrix, as a dual encoder's "
               "logits), so they depend on what is batched with it, where qbench reads one output row per input row: "
               "evaluate the per-row outputs it is computed from (a dual encoder's two embeddings) and compute the "
               "matrix in a metric of your own (docs/recipe-reference.md: Custom metrics)")


def _rows_fixed(model: ModelInfo, meta: TensorMeta) -> str | None:
    """Why `meta` gives no row per input row though its rank says nothing against it: the graph computes every axis
    of it static (`[1]`, `[1, 3]`: TensorMeta.fixed) where every input takes its rows on a dynamic axis 0, so its
    length stays whatever the batch (a statistic of the whole batch: its mean score). A fixed-batch model (an input's
    axis 0 static) is left alone, and so is an output with a dynamic axis (`[3, None]`: the run check tells whether
    the rows are there) or one a converter declares static that inference cannot confirm."""
    rows = rows_input(model.inputs)
    if meta.kind != "tensor" or not meta.fixed or rows is None:
        return None
    symbol = model.inputs[rows].dim_names[:1]
    axis = f"a dynamic axis 0 ({symbol[0]!r})" if symbol and symbol[0] else "a dynamic axis 0"
    return (f"output {meta.name!r} of shape {meta.shape_text()} is fixed where input {rows!r} takes its rows "
            f"on {axis}: it gives {meta.shape[0]} on axis 0 per call whatever the rows (a statistic "
            "of the whole batch, such as its mean score), not one row per input row; evaluate the per-row outputs "
            "and compute such a statistic in a metric of your own "
            "(docs/recipe-reference.md: Custom metrics)")  # fmt: skip


def _classes_by_length(task: Task, model: ModelInfo, meta: TensorMeta) -> str | None:
    """Why `meta`'s last axis is no set of classes for a task reading it as one: the graph names it as a length of
    the inputs (a later axis of an input, 'seq') or as another of its own later axes ([batch, seq, seq]), so it grows
    with the input (token scores with padding, an attention map), and an arg-max over it picks a position."""
    names = meta.dim_names
    if not task.columns_are_classes or meta.kind != "tensor" or len(names) < 2 or not names[-1]:
        return None
    lengths = {n: f"axis {axis} of input {name!r}" for name, m in model.inputs.items()
               for axis, n in enumerate(m.dim_names[1:], 1) if n}  # fmt: skip
    for axis, n in enumerate(names[1:-1], 1):
        if n:
            lengths.setdefault(n, f"axis {axis} of this output too")
    if (where := lengths.get(names[-1])) is None:
        return None
    return (f"output {meta.name!r} of shape {meta.shape_text()} has on its last axis a length of the inputs "
            f"({names[-1]!r}, {where}), not a fixed set of classes: its values are per position (token scores, an "
            f"attention map), and task {task.name!r} would read each position as a class; expected classes on a "
            "fixed last axis: per-token class scores (rows, tokens, classes), task span for start and end scores "
            "per token, or task structured with a metric of your own")  # fmt: skip


def _problem(task: Task, model: ModelInfo, meta: TensorMeta) -> str | None:
    """Why `task` cannot evaluate `meta`: an output with a static 0 beside the batch axis holds nothing to judge,
    a scalar, a constant or a fixed axis 0 beside dynamic rows no row per input row, and one whose rows the graph puts
    on a later axis none on axis 0, whatever the task; otherwise the task's own reason."""
    if (elsewhere := _rows_elsewhere(model, meta) or _rows_across(model, meta)) is not None:
        return elsewhere
    if meta.kind == "tensor" and 0 in meta.shape[1:]:
        return f"output {meta.name!r} of shape {list(meta.shape)} holds no values (a dimension of 0)"
    if meta.constant:
        return (f"output {meta.name!r} is computed from no model input (an initializer or a Constant): it is the same "
                "whatever the rows, not one row per input row")  # fmt: skip
    if meta.kind == "tensor" and meta.scalar:
        return (f"output {meta.name!r} is a scalar (shape []): qbench reads one output row per input row, "
                "along axis 0")  # fmt: skip
    return _rows_fixed(model, meta) or _classes_by_length(task, model, meta) or task.output_problem(meta)


def _rank(task: Task, model: ModelInfo, meta: TensorMeta) -> int | None:
    return None if _problem(task, model, meta) is not None else task.output_rank(meta)
