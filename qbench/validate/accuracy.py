"""Accuracy of a variant against the labels and against the FP32 reference, overall and per slice.

What is measured is the task's business (qbench.tasks): per-row quantities are computed once
over the whole evaluation set, every slice is then a boolean mask over those rows. A row whose
variant output holds NaN or inf is counted, never dropped (see each task). When several outputs
are evaluated, every metric name is prefixed with its output: 'probabilities/accuracy'.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from qbench.backends.base import Runner
from qbench.errors import QbenchError, environment_cause
from qbench.results.schema import AccuracyResult, SliceMetrics
from qbench.tasks import CustomMetric, get_task
from qbench.tasks.base import SEQUENCE_IDS, MetricError, RowSummary, Task
from qbench.validate import catalogue, metrics
from qbench.validate.catalogue import OUTPUT_SEPARATOR
from qbench.validate.float_range import FloatFormat, beyond_format_note, float_format
from qbench.validate.kept import shared_cosine
from qbench.validate.outputs import VARIABLE_SHAPE, row_count, run_outputs

OVERALL = "overall"
Outputs = np.ndarray | Mapping[str, np.ndarray]


def _checked_labels(labels: np.ndarray | None, rows: int) -> np.ndarray | None:
    if labels is None:
        return None
    array = np.asarray(labels)
    if array.ndim == 0 or array.shape[0] != rows:
        raise QbenchError(f"got {array.shape[0] if array.ndim else 0} labels for {rows} evaluated rows")
    return array.reshape(rows) if array.ndim > 1 and array.size == rows else array


def _checked_masks(slices: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    masks: dict[str, np.ndarray] = {}
    for name, mask in slices.items():
        array = np.asarray(mask)
        if array.dtype != np.bool_ or array.shape != (rows,):
            raise QbenchError(
                f"slice {name!r}: expected a boolean mask over {rows} rows, got {array.dtype} {array.shape}"
            )
        masks[name] = array
    return masks


@dataclasses.dataclass(frozen=True)
class _OutputRows:
    """One evaluated output: the task's per-row summary, plus what custom metrics read."""

    prefix: str
    output: str  # the output's name ('' for a single unnamed one): what spread and kept are keyed by
    summary: RowSummary | None  # None: the task judges the outputs together (Task.together), not this one alone
    outputs: np.ndarray
    reference: np.ndarray
    labels: np.ndarray | None
    reference_nonfinite: np.ndarray  # rows where FP32's output has NaN/inf in a value the task reads
    reference_any_nonfinite: np.ndarray  # rows where it has NaN/inf in any value (what a custom metric may read; -inf
    # where the task reads it as a value ruled out is none)

    def summarise(self, name: str, mask: np.ndarray, custom: Sequence[CustomMetric],
                  feeds: Mapping[str, np.ndarray]) -> SliceMetrics:  # fmt: skip
        if self.summary is None:
            own = SliceMetrics(name=name, size=int(np.count_nonzero(mask)), metrics={})
        else:
            fp32_failed = bool((mask & self.reference_nonfinite).any())
            own = _undefined_where_fp32_failed(self.summary.summarise(name, mask), fp32_failed)
        values, raised = dict(own.metrics), {}
        for metric in custom:
            values[metric.name], why = _custom_value(metric, name, mask, {"": self}, self.labels, feeds)
            raised.update({f"{self.prefix}{metric.name}": why} if why else {})
        return dataclasses.replace(
            own,
            raised=raised,
            metrics={f"{self.prefix}{k}": v for k, v in values.items()},
            intervals={f"{self.prefix}{k}": v for k, v in own.intervals.items()},
            drop_intervals={f"{self.prefix}{k}": v for k, v in own.drop_intervals.items()},
            denominators={f"{self.prefix}{k}": v for k, v in own.denominators.items()},
            changed_together={f"{self.prefix}{k}": v for k, v in own.changed_together.items()},
            kept={self.output: v for v in own.kept.values()},
        )


def _custom_value(
    metric: CustomMetric, scope: str, mask: np.ndarray, parts: Mapping[str, _OutputRows], labels: np.ndarray | None,
    feeds: Mapping[str, np.ndarray],
) -> tuple[float, str | None]:
    """`metric` on the rows of `mask` FP32 scored on every one of `parts` (a single output: its key is ''; several:
    the metric gets dicts name -> array), and what it raised there (None: nothing); a metric taking `inputs` gets
    `feeds` of those rows alone, in the same order (the outputs' rows are the feeds' rows). A custom metric cannot
    say what a row FP32 failed on is worth: it reads only rows FP32 scored, for every result alike (FP32's own figure
    too), so a variant is never credited for rows where FP32 gave NaN/inf; where FP32 failed on every row of the scope
    there is nothing to compare (NaN). Where it raises, its figure on this scope is NaN and the error says why (one
    slice too small for it costs no other figure; `_raised_everywhere` fails the scoring where it raised on every
    scope)."""
    scored = mask.copy()
    for part in parts.values():
        scored &= ~part.reference_any_nonfinite
    if not scored.any() and mask.any():
        return math.nan, None
    if list(parts) == [""]:
        outputs, reference = parts[""].outputs[scored], parts[""].reference[scored]
    else:
        outputs = {name: part.outputs[scored] for name, part in parts.items()}
        reference = {name: part.reference[scored] for name, part in parts.items()}
    inputs = {name: values[scored] for name, values in feeds.items()} if metric.wants_inputs else None
    try:
        return metric.value(outputs, None if labels is None else labels[scored], reference, inputs), None
    except MetricError as exc:
        if environment_cause(exc):  # the machine's failure (out of memory, a full disk): the job's, to run again
            raise
        return math.nan, f"{exc} (on {scope}, {int(scored.sum())} rows)"


def _inputs_for(
    custom: Sequence[CustomMetric], feeds: Mapping[str, np.ndarray] | None, rows: int
) -> dict[str, np.ndarray]:
    """The model inputs a custom metric taking `inputs` is given (their scored rows), checked to be the outputs'
    rows; empty when no metric takes them."""
    if not any(metric.wants_inputs for metric in custom):
        return {}
    wanting = next(metric.name for metric in custom if metric.wants_inputs)
    if not feeds:
        raise QbenchError(f"custom metric {wanting!r} takes the model's inputs, and none were given")
    arrays = {name: np.asarray(values) for name, values in feeds.items()}
    uneven = {name: a.shape[0] if a.ndim else 0 for name, a in arrays.items() if a.ndim == 0 or a.shape[0] != rows}
    if uneven:
        name, count = next(iter(uneven.items()))
        raise QbenchError(f"custom metric {wanting!r} takes the model's inputs: input {name!r} has {count} rows, "
                          f"the outputs {rows}")  # fmt: skip
    return arrays


def _raised_everywhere(scopes: Sequence[SliceMetrics]) -> None:
    """A custom metric that raised on every scope (the overall one and each slice) measures nothing of these
    outputs: the scoring fails, with what it raised on the first (a MetricError naming the recipe's metric)."""
    for name, why in scopes[0].raised.items():
        if all(name in scope.raised for scope in scopes):
            raise MetricError(why, name.rpartition(OUTPUT_SEPARATOR)[2])


def _undefined_where_fp32_failed(scope: SliceMetrics, holds_fp32_nonfinite: bool) -> SliceMetrics:
    """`scope` with every task metric that does not count FP32's NaN/inf rows (the catalogue's
    counts_nonfinite_rows) NaN, with its interval, where the scope holds such a row: for FP32 and every variant
    alike. Such a row has no worth to compare with; a metric that counts it as a miss (accuracy, the agreements)
    stays defined, one that cannot (an error, cosine, KL, F1) would otherwise be computed over rows that differ
    from result to result, or credit a variant with rows FP32 could not score (a finite MAE against FP32's NaN)."""
    if not holds_fp32_nonfinite:
        return scope
    undefined = {name for name in scope.metrics
                 if name in catalogue.METRICS and not catalogue.METRICS[name].counts_nonfinite_rows}  # fmt: skip
    return dataclasses.replace(
        scope,
        metrics={name: math.nan if name in undefined else value for name, value in scope.metrics.items()},
        intervals={name: (math.nan, math.nan) if name in undefined else value
                   for name, value in scope.intervals.items()},
        drop_intervals={name: (math.nan, math.nan) if name in undefined else value
                        for name, value in scope.drop_intervals.items()},
    )


def _merged(name: str, parts: list[SliceMetrics]) -> SliceMetrics:
    return SliceMetrics(
        name=name,
        size=parts[0].size,
        metrics={k: v for part in parts for k, v in part.metrics.items()},
        intervals={k: v for part in parts for k, v in part.intervals.items()},
        drop_intervals={k: v for part in parts for k, v in part.drop_intervals.items()},
        denominators={k: v for part in parts for k, v in part.denominators.items()},
        changed_together={k: v for part in parts for k, v in part.changed_together.items()},
        kept={k: v for part in parts for k, v in part.kept.items()},
        raised={k: v for part in parts for k, v in part.raised.items()},
    )


def evaluate_accuracy(
    task: str,
    outputs: Outputs,
    reference_outputs: Outputs,
    labels: np.ndarray | None,
    slices: Mapping[str, np.ndarray],
    custom_metrics: Sequence[CustomMetric] = (),
    probabilities: Mapping[str, bool | None] | None = None,
    feeds: Mapping[str, np.ndarray] | None = None,
    task_options: Mapping[str, Any] | None = None,
    lowest_wins: Collection[str] = (),
    cuts: Mapping[str, metrics.BinaryCut] | None = None,
    precision: str | None = None,
    sequence_ids: np.ndarray | None = None,
) -> AccuracyResult:
    """Metrics of `outputs` against `reference_outputs` (FP32) and `labels`, overall and per slice.

    `probabilities`: output name -> whether the graph makes it as probabilities (TensorMeta.probabilities).
    `lowest_wins`: the outputs whose graph picks its label as their arg-min (TensorMeta.lowest_wins: KMeans'
    distances); a task deciding by arg-max (Task.decides_by_argmax) scores their negation, so that its decisions are
    the model's. Read by their arg-max, a KMeans scored 0.0 and a variant moving 10 % of rows to another cluster
    passed the gate. `cuts`: where the graph's own label splits a single score column (TensorMeta.decision_cut), which
    such a task decides by: read with '> 0', an IsolationForest's INT8 scores of exactly 0 (its quantization grid
    holds 0) were outliers the model's label calls inliers.
    `precision`: the variant's (VariantResult.precision); a -inf/+inf its float format gives where FP32's value is
    beyond that format and the task's decision does not hang on it is read as FP32's (Task.read_beyond_range).

    `outputs` is one array, or output name -> array (metrics then prefixed 'name/' when there are
    several). The metrics are the task's (see qbench.tasks), plus `custom_metrics` per output; a custom metric
    naming `outputs` is computed once over those (named) outputs, unprefixed.
    `slices` maps a slice name to a boolean mask over the rows. A task judging its outputs together (Task.together:
    span) gets them in the order given and `feeds`, the inputs the rows were run with; its metrics are unprefixed.
    A custom metric taking `inputs` (CustomMetric.wants_inputs) gets `feeds` too, the rows of each scope it scores.
    `sequence_ids`: the tokenizer's sequence ids of the rows' text pairs (qbench.data.feeds.sequence_ids), which the
    task reads with `feeds` (as SEQUENCE_IDS; span: the context's tokens, whether or not the model takes them in).
    """
    judge = get_task(task).configured(task_options or {})
    task_feeds = dict(feeds or {})
    if sequence_ids is not None:
        task_feeds[SEQUENCE_IDS] = np.asarray(sequence_ids)
    named = dict(outputs) if isinstance(outputs, Mapping) else {"": outputs}
    references = dict(reference_outputs) if isinstance(reference_outputs, Mapping) else {"": reference_outputs}
    if set(named) != set(references):
        raise QbenchError(f"variant outputs {sorted(named)} differ from the FP32 outputs {sorted(references)}")
    if judge.together and len(named) != len(judge.together):
        raise QbenchError(f"task {task!r} reads {len(judge.together)} outputs together ({', '.join(judge.together)}), "
                          f"got {len(named)}")  # fmt: skip
    per_output = [m for m in custom_metrics if not m.outputs]
    joint = [m for m in custom_metrics if m.outputs]
    for metric in joint:
        missing = [o for o in metric.outputs if o not in named]
        if missing:
            raise QbenchError(f"custom metric {metric.name!r} reads output {missing[0]!r}, which is not evaluated "
                              f"(evaluated: {', '.join(map(repr, named))})")  # fmt: skip
    prefixed = len(named) > 1
    parts: dict[str, _OutputRows] = {}
    read: dict[str, np.ndarray | None] = {}  # which values of each output the task reads (Task.values_read)
    masked: dict[str, bool] = {}  # whether it reads -inf as a value ruled out (Task.masks_with_neginf)
    rows = -1
    nonfinite = new_nonfinite = nonfinite_reference = np.zeros(0, dtype=bool)
    for name, values in named.items():
        values, reference = np.asarray(values), np.asarray(references[name])
        if values.ndim == 0 or values.shape != reference.shape:
            # its rows' length moved with the values (a rank change is another layout, not a length the data set)
            varies = values.ndim == reference.ndim > 1 and values.shape[0] == reference.shape[0]
            raise QbenchError(f"variant outputs{f' {name!r}' if name else ''} have shape {values.shape}, FP32 "
                              f"outputs {reference.shape}: they must match"
                              f"{f'; {VARIABLE_SHAPE}' if varies else ''}")  # fmt: skip
        if rows not in (-1, values.shape[0]):
            raise QbenchError(f"output {name!r} has {values.shape[0]} rows, the others {rows}")
        rows = values.shape[0]
        own_labels = _checked_labels(labels, rows)
        if not parts:
            masks = _checked_masks(slices, rows)
            judge = judge.for_slices(masks)
        flip = judge.decides_by_argmax and name in lowest_wins and values.ndim == 2 and values.shape[1] > 1
        values = _read_beyond_range(judge, values, reference, float_format(precision), flip)
        row_bad = judge.nonfinite_rows(values, own_labels, task_feeds, reference)
        reference_bad = judge.nonfinite_rows(reference, own_labels, task_feeds)
        row_new = row_bad & ~reference_bad
        nonfinite_reference = reference_bad if not parts else nonfinite_reference | reference_bad
        nonfinite = row_bad if nonfinite.size == 0 else nonfinite | row_bad
        new_nonfinite = row_new if new_nonfinite.size == 0 else new_nonfinite | row_new
        prefix = f"{name}{OUTPUT_SEPARATOR}" if prefixed else ""
        scale = (cuts or {}).get(name) if judge.decides_by_argmax else None
        scale = scale if scale is not None else (probabilities or {}).get(name)
        summary = None if judge.together else judge.rows(-values if flip else values, -reference if flip else reference,
                                                         own_labels, probabilities=scale)  # fmt: skip
        read[name] = judge.values_read(values, own_labels, task_feeds)
        masked[name] = judge.masks_with_neginf(reference)
        parts[name] = _OutputRows(prefix, name, summary, values, reference, own_labels, reference_bad,
                                  _nonfinite_rows(reference, masked[name]))  # fmt: skip
    labels = _checked_labels(labels, rows)
    inputs = _inputs_for(custom_metrics, feeds, rows)
    joint_parts: list[_OutputRows] = []
    if judge.together:
        joint_summary = judge.rows_together([p.outputs for p in parts.values()], [p.reference for p in parts.values()],
                                            labels, task_feeds)  # fmt: skip
        joint_parts.append(_OutputRows("", "", joint_summary, np.zeros(0), np.zeros(0), labels, nonfinite_reference,
                                       nonfinite_reference))  # fmt: skip

    def summarise(name: str, mask: np.ndarray) -> SliceMetrics:
        merged = _merged(name, [part.summarise(name, mask, per_output, inputs) for part in parts.values()]
                         + [part.summarise(name, mask, (), inputs) for part in joint_parts])  # fmt: skip
        together = {m.name: _custom_value(m, name, mask, {o: parts[o] for o in m.outputs}, labels, inputs)
                    for m in joint}  # fmt: skip
        merged = dataclasses.replace(merged, metrics={**merged.metrics, **{k: v for k, (v, _) in together.items()}},
                                     raised={**merged.raised, **{k: why for k, (_, why) in together.items() if why}})
        return dataclasses.replace(merged, nonfinite_outputs=int(np.count_nonzero(nonfinite & mask)),
                                   new_nonfinite_outputs=int(np.count_nonzero(new_nonfinite & mask)),
                                   spread={o: metrics.spread(p.outputs, mask, read[o], masked[o])
                                           for o, p in parts.items()})  # fmt: skip

    overall = summarise(OVERALL, np.ones(rows, dtype=bool))
    scored_slices = tuple(summarise(name, mask) for name, mask in masks.items())
    _raised_everywhere([overall, *scored_slices])
    return AccuracyResult(rows=rows, nonfinite_outputs=int(np.count_nonzero(nonfinite)), overall=overall,
                          slices=scored_slices)


def _read_beyond_range(judge: Task, values: np.ndarray, reference: np.ndarray, fmt: FloatFormat | None,
                       flip: bool) -> np.ndarray:  # fmt: skip
    """The variant's values as `judge` reads them beyond its float format (Task.read_beyond_range); `flip`: scores
    decided by their arg-min, read as their negation's arg-max is."""
    if flip:
        return -judge.read_beyond_range(-values, -reference, fmt)
    return judge.read_beyond_range(values, reference, fmt)


def beyond_range_notes(task: str, outputs: Mapping[str, np.ndarray], reference_outputs: Mapping[str, np.ndarray],
                       precision: str | None, lowest_wins: Collection[str] = ()) -> list[str]:  # fmt: skip
    """One line per output whose -inf/+inf the task reads as FP32's values beyond the variant's float format (as
    evaluate_accuracy reads them): the variant's notes say how many rows, so no reader takes their figures for the
    served model's values."""
    fmt = float_format(precision)
    if fmt is None:
        return []
    judge, notes = get_task(task), []
    for name, values in outputs.items():
        values, reference = np.asarray(values), np.asarray(reference_outputs[name])
        flip = judge.decides_by_argmax and name in lowest_wins and values.ndim == 2 and values.shape[1] > 1
        if values.shape == reference.shape:
            note = beyond_format_note(name, values, _read_beyond_range(judge, values, reference, fmt, flip), fmt)
            notes += [note] if note else []
    return notes


def scale_doubts(
    task: str, reference_outputs: Mapping[str, np.ndarray], probabilities: Mapping[str, bool | None]
) -> list[str]:
    """Why the graph's word on the scale of an FP32 output (TensorMeta.probabilities) is in doubt, one line per
    output: logits whose every value lies in [0, 1] (as probabilities' do), or probabilities with values outside it,
    when the task thresholds them by that scale and some decision lies between the thresholds (0 < value <= 0.5)."""
    judge = get_task(task)
    doubts = []
    for name, values in reference_outputs.items():
        stated = probabilities.get(name)
        values = np.asarray(values)
        if stated is None or not judge.thresholds_by_scale(values):
            continue
        finite = values[np.isfinite(values)].astype(np.float64)
        between = int(np.count_nonzero((finite > 0.0) & (finite <= 0.5)))
        if not finite.size or not between or metrics.looks_like_sigmoid(finite) == stated:
            continue
        if stated:
            said = "a Sigmoid or Softmax (probabilities, threshold 0.5)"
            seen, other = "values outside [0, 1]", "logits (threshold 0)"
        else:
            said = "a linear layer (logits, threshold 0)"
            seen, other = "every value within [0, 1]", "probabilities (threshold 0.5)"
        doubts.append(f"output {name!r}: the graph makes it with {said}, yet FP32 gives {seen}; read as {other}, "
                      f"{between} of {finite.size} FP32 decisions would differ: check how the model's last nodes make "
                      "it")  # fmt: skip
    return doubts


def one_class_readings(task: str, reference_outputs: Mapping[str, np.ndarray], probabilities: Mapping[str, bool | None],
                       cut: Collection[str], labels: np.ndarray | None, *,
                       task_stated: bool = True) -> dict[str, str]:  # fmt: skip
    """Output name -> why its decisions say little, for each single score column whose split FP32's values chose
    (no threshold in the graph: no comparison that makes its label, no Sigmoid or linear layer that makes it) and at
    which FP32 decides every finite evaluation row one class while the labels hold both. An anomaly score (an
    autoencoder's reconstruction error, within [0, 1], so read as a probability) split at 0.5 put all 897 rows of a
    digits detector in class 0: a variant's accuracy, agreement and flip_rate moved only where it carried a score
    across 0.5, far from every score, and every variant passed. Without labels, only where the recipe leaves `task` to
    its default (`task_stated` false): a regressor's output (a PolynomialFeatures + Ridge on diabetes, 25 .. 318) read
    as one logit put all 442 rows in class 1, and agreement was 1.0 for every variant, BF16 moving values by 1.5."""
    judge = get_task(task)
    found = {}
    for name, values in reference_outputs.items():
        values = np.asarray(values)
        stated_by_graph = name in cut or probabilities.get(name) is not None
        if stated_by_graph or (labels is None and task_stated) or not judge.thresholds_by_scale(values):
            continue
        if values.ndim == 0 or int(np.prod(values.shape[1:])) != 1:  # multilabel thresholds several columns too
            continue
        scores = values.reshape(values.shape[0]).astype(np.float64)
        finite = np.isfinite(scores)
        as_probability = metrics.looks_like_sigmoid(scores)
        decided = np.unique(metrics.top1(scores[finite], as_probability))
        held = None if labels is None else np.unique(np.asarray(labels).reshape(-1)[finite])
        if decided.size != 1 or (held is not None and held.size < 2):
            continue
        split = "read as a probability (every FP32 value lies within [0, 1]) and split at 0.5" if as_probability \
            else "read as a logit and split at 0"
        found[name] = (f"output {name!r}: a single score column whose graph states no threshold, {split}, puts every "
                       f"one of {int(finite.sum())} evaluation rows in class {int(decided[0])}{_held_text(held)} "
                       f"(FP32's scores lie within "
                       f"[{scores[finite].min():.4g}, {scores[finite].max():.4g}]): a variant's decisions change only "
                       "where it carries a score across that split, so accuracy, agreement and flip_rate say little; "
                       "expected the model's threshold in the graph (its label as Greater(score, t), which qbench "
                       "splits at t) or a metric of your own (metrics:)")  # fmt: skip
        if not task_stated:
            found[name] += ("; the recipe sets no task, so the output was read as class scores (task: "
                            "classification): a regressor's output is judged by task: regression")  # fmt: skip
    return found


def _held_text(held: np.ndarray | None) -> str:
    """What the labels hold, beside FP32's one class (nothing without labels)."""
    return "" if held is None else f" while the labels hold classes {', '.join(str(int(c)) for c in held)}"


def scale_notes(task: str, reference_outputs: Mapping[str, np.ndarray], probabilities: Mapping[str, bool | None],
                labels: np.ndarray | None) -> list[str]:
    """How the task reads each FP32 output's score columns, probabilities or logits, and why (Task.scale_reading):
    the reading every kl_mean rests on, one note per output that has one."""
    judge = get_task(task)
    notes = []
    for name, values in reference_outputs.items():
        values = np.asarray(values)
        reading = judge.scale_reading(values, _checked_labels(labels, values.shape[0]) if values.ndim else None,
                                      probabilities.get(name))  # fmt: skip
        if reading is not None:
            notes.append(reading.note(name))
    return notes


def _nonfinite_rows(values: np.ndarray, masked: bool) -> np.ndarray:
    """Rows holding NaN or inf (none for integer, boolean or string outputs); `masked`: -inf read as a value ruled
    out (Task.masks_with_neginf), so a custom metric reads the rows the task scores, -inf and all."""
    if values.dtype.kind not in "fc":
        return np.zeros(values.shape[0], dtype=bool)
    return metrics.nonfinite_rows(values, masked=masked)


def _slice_with_drops(current: SliceMetrics, reference: SliceMetrics | None) -> SliceMetrics:
    if reference is None:
        return dataclasses.replace(current, drops={})
    drops = {
        name: catalogue.drop(name, reference.metrics[name], value)
        for name, value in current.metrics.items()
        if name in catalogue.METRICS and name in reference.metrics
    }
    return dataclasses.replace(current, drops=drops)


def with_drops(result: AccuracyResult, reference: AccuracyResult) -> AccuracyResult:
    """`result` with every catalogue metric's drop vs `reference` filled in (positive = worse).

    Slices are matched by name; a slice the reference lacks gets no drops.
    """
    return dataclasses.replace(
        result,
        overall=_slice_with_drops(result.overall, reference.overall),
        slices=tuple(_slice_with_drops(s, reference.slice(s.name)) for s in result.slices),
    )


def run_batched(
    runner: Runner,
    feeds: Mapping[str, np.ndarray],
    batch_size: int,
    output_index: int = 0,
    description: str = "evaluate",
) -> np.ndarray:
    """Run every row through `runner` in batches of `batch_size`; output `output_index`, concatenated."""
    return run_outputs(runner, feeds, batch_size, {"": output_index}, description)[""]


def shared_cosines(task: str, reference_outputs: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Output name -> the cosine FP32's vectors share across the evaluation rows (kept.shared_cosine), for a task
    scoring cosines with FP32 (embedding); finite values only. A variant answering another row's FP32 vector scores
    about that cosine, so 1 minus it is the most a cosine can drop before it tells rows apart: mean-pooled vectors
    sharing one dominant direction (a small Whisper encoder's: 0.99987) leave a cosine tolerance of 0.01 nothing to
    judge (qbench.gate.notes.cosine_without_room)."""
    if "cosine" not in {info.name for info in get_task(task).metric_infos}:
        return {}
    shared = {name: shared_cosine(np.asarray(values)) for name, values in reference_outputs.items()}
    return {name: value for name, value in shared.items() if math.isfinite(value)}


__all__ = ["OVERALL", "evaluate_accuracy", "row_count", "run_batched", "run_outputs", "scale_doubts", "with_drops"]
