"""One way to measure a built variant: load it, run rows through it, compare with FP32, time it, close it.

    measured = measure(backend, built, prepared, reference=fp32, timing=recipe.latency)

The sweep, `qbench explain`, the fallback and the INT8 search all call `measure`, so a candidate
scored by a search is scored exactly as the sweep scores the variant it becomes. Exactly one
runner is alive at a time (idle ONNX Runtime sessions distort timings); the scored model is run
first in its own session when the backend cannot compute the variant's precision
(qbench.validate.fidelity).
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from qbench.backends import Backend, Runner
from qbench.backends.base import RunOptions, form_run_by, timed_load
from qbench.data.leakage import distinct_inputs
from qbench.data.nonfinite import MISSING_SLICE
from qbench.data.text import token_padding
from qbench.environment import timed_threads, timing_machine
from qbench.errors import QbenchError, RecipeError, environment_cause
from qbench.preflight.labels import check_labels_beat_chance, check_labels_fit_outputs
from qbench.preflight.prepare import Prepared
from qbench.provenance import model_bytes, model_sha256
from qbench.recipe.spec import LatencySpec
from qbench.results.schema import AccuracyResult, LatencyResult, SliceMetrics, VariantResult
from qbench.serving import idle_ms, server_for, serving_figures
from qbench.tasks.base import MetricError
from qbench.tasks.selection import outputs_left_out, outputs_not_compared
from qbench.validate import metrics
from qbench.validate.accuracy import (
    beyond_range_notes,
    evaluate_accuracy,
    one_class_readings,
    run_outputs,
    scale_doubts,
    scale_notes,
    shared_cosines,
    with_drops,
)
from qbench.validate.background import settle_before_timing
from qbench.validate.batch_mix import (
    Arrangement,
    batch_dependence,
    judged_note,
    run_arrangements,
    served_arrangements,
    worst_scopes,
)
from qbench.validate.bound import lookup_table_bytes
from qbench.validate.catalogue import ONE_CLASS_OUTPUTS, SHARED_COSINES, UNCOMPARED_OUTPUTS
from qbench.validate.clock import PhaseClock
from qbench.validate.contention import oversubscription_note
from qbench.validate.fidelity import plan_measurement
from qbench.validate.latency import (
    latency_points,
    measure_batcher_samples,
    measure_cold_start,
    measure_samples,
)
from qbench.validate.reuse import KnownOutputs, with_known
from qbench.variants import BuiltVariant
from qbench.variants.base import ONNX

logger = logging.getLogger(__name__)

Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class Rows:
    """The rows a measurement runs: feeds, labels and slice masks over them, and the batch size to run them in;
    `digests`: each row's digest of what it feeds the model (None: unknown), from which a verdict on these rows
    counts their distinct inputs (`distinct_inputs`), as the gate does on the evaluation rows; `sequence_ids`: the
    tokenizer's sequence ids of their text pairs (qbench.data.feeds.sequence_ids), which the task reads, never fed."""

    feeds: Feeds
    labels: np.ndarray | None
    slices: dict[str, np.ndarray]
    batch_size: int
    digests: np.ndarray | None = None
    sequence_ids: np.ndarray | None = None

    @classmethod
    def evaluation(cls, prepared: Prepared) -> Rows:
        return cls(prepared.evaluation_feeds, prepared.labels, prepared.slices,
                   prepared.recipe.data.evaluation.batch_size, prepared.evaluation_digests,
                   prepared.evaluation_sequence_ids)  # fmt: skip

    @classmethod
    def selection(cls, prepared: Prepared) -> Rows | None:
        """The rows searches choose among candidates on (qbench.selection_rows); None: there are none."""
        chosen = prepared.selection
        if chosen is None:
            return None
        return cls(chosen.feeds, chosen.labels, chosen.slices, prepared.recipe.data.evaluation.batch_size,
                   chosen.digests, chosen.sequence_ids)  # fmt: skip

    @classmethod
    def judged_on(cls, prepared: Prepared) -> Rows:
        """The rows a search (the INT8 search, `fallback:`, `calibrator: auto`) judges its candidates on: the selection
        rows, else the evaluation rows. Their `distinct_inputs` is what the gate's rows rule counts there."""
        return cls.selection(prepared) or cls.evaluation(prepared)

    @classmethod
    def from_batches(cls, batches: Sequence[Mapping[str, np.ndarray]], rows: int) -> Rows:
        """Up to the first `rows` rows of `batches` (calibration batches), unlabelled and unsliced; batches
        whose shapes differ beyond the rows (text padded per batch) are not joined: the first one is used."""
        taken: list[Mapping[str, np.ndarray]] = []
        for batch in batches:
            if taken and any(batch[k].shape[1:] != taken[0][k].shape[1:] for k in batch):
                break
            taken.append(batch)
            if sum(len(next(iter(b.values()))) for b in taken) >= rows:
                break
        if not taken:
            raise QbenchError("no calibration rows to measure on")
        feeds = {k: np.concatenate([b[k] for b in taken])[:rows] for k in taken[0]}
        return cls(feeds, None, {}, len(next(iter(taken[0].values()))))

    @property
    def count(self) -> int:
        return len(next(iter(self.feeds.values())))

    @cached_property
    def distinct_inputs(self) -> dict[str, int]:
        """Scope -> distinct inputs, for the scopes whose rows repeat some (qbench.data.leakage.distinct_inputs)."""
        return {} if self.digests is None else distinct_inputs(self.digests, self.slices)

    def subset(self, indices: np.ndarray) -> Rows:
        labels = None if self.labels is None else self.labels[indices]
        digests, ids = (None if a is None else a[indices] for a in (self.digests, self.sequence_ids))
        return Rows({k: v[indices] for k, v in self.feeds.items()}, labels,
                    {k: m[indices] for k, m in self.slices.items()}, self.batch_size, digests, ids)  # fmt: skip


@dataclass(frozen=True)
class Reference:
    """FP32's outputs and accuracy on the same rows: what a variant is compared with (drops are taken
    against `accuracy`, or against the variant itself, i.e. none, when FP32 has no accuracy on its backend)."""

    outputs: dict[str, np.ndarray]
    accuracy: AccuracyResult | None


@dataclass(frozen=True)
class Measured:
    """A measurement: the result (status ok, failed or skipped), the outputs scored and their noise vs FP32.

    nsr: noise-to-signal ratio of the outputs vs the reference's over every float output (inf when not
    finite, NaN when unscored or without a reference)."""

    result: VariantResult
    outputs: dict[str, np.ndarray] | None
    nsr: float = math.nan
    environment: str | None = None  # failed for a reason outside the variant (qbench.errors.environment_cause)
    metric_error: MetricError | None = None  # failed because a recipe's own metric raised on its outputs
    rows_independent: bool = False  # its rows were seen not to depend on their batch (batch_mix.batch_dependence)

    @property
    def reference(self) -> Reference | None:
        """This measurement as the reference of later ones (FP32 measured first)."""
        if self.outputs is None or self.result.accuracy is None:
            return None
        return Reference(self.outputs, self.result.accuracy)


def measure(
    backend: Backend,
    built: BuiltVariant,
    prepared: Prepared,
    *,
    reference: Reference | None = None,
    rows: Rows | None = None,
    timing: LatencySpec | None = None,
    score: bool = True,
    clock: PhaseClock | None = None,
    quiet: bool = False,
    serving: bool = False,
    known: KnownOutputs | None = None,
) -> Measured:
    """Measure `built` on `backend`: its outputs on `rows` (default: the evaluation rows) compared with
    `reference` (without one, with themselves: the FP32 reference), then, with `timing`, cold start and
    steady-state latency, and with `serving` too the figures a sweep reports from those timings (load
    simulation, cost, bound). `score=False` only times. A failure is returned as a failed result, never raised;
    labels FP32's outputs show to lie beyond the classes are the recipe's error, raised (a RecipeError).
    The result carries only the params and notes true of the form `backend` runs (BuiltVariant.as_run_in).
    `known`: outputs this variant gave on some of `rows` in an earlier run, not run again (qbench.validate.reuse).
    """
    built = built.as_run_in(form_run_by(backend))
    rows = rows or Rows.evaluation(prepared)
    unsupported = backend.supports(built)
    if unsupported:
        if not quiet:
            logger.info("  %s: skipped (%s)", backend.name, unsupported)
        return Measured(failed_result(built, backend, unsupported, status="skipped"), None)
    label = f"{built.name}@{backend.name}"
    threads = timing.threads if timing is not None else prepared.recipe.latency.threads
    fixed = prepared.batch
    # a variant's rows whose outputs follow their batch are judged also as served (qbench.validate.batch_mix);
    # FP32 has its own check (qbench.preflight.rows), a fixed batch is served as evaluated
    mix = served_arrangements(prepared.recipe) if score and reference is not None and fixed is None else []
    batch_sizes = (fixed,) if fixed is not None else (*(timing.batch_sizes if timing is not None else ()),
                                                      *(a.batch_size for a in mix), rows.batch_size, 1)  # fmt: skip
    options = RunOptions(threads=threads, batch_sizes=tuple(sorted(set(batch_sizes))))
    t = time.perf_counter()
    # the sweep's MLflow logging, in its own process, idle from here on; the logging held since the last measurement
    # runs beside this one's load simulation, which times nothing (qbench.serving), where there is one
    simulates = timing is not None and serving and prepared.recipe.slo is not None
    settle_before_timing(keep_held=simulates)
    if clock is not None:
        clock.add("track", t)  # waiting for it is MLflow's cost, not inference
    t, carved = time.perf_counter(), clock.carved if clock is not None else 0.0
    try:
        plan = plan_measurement(backend, built)
        outputs, mixed = None, None
        if score and plan.separate:
            outputs, mixed = _run_rows(backend.load(plan.scored, options), prepared, rows,
                                       f"{label} evaluate (emulated)", mix, quiet=quiet, known=known)  # fmt: skip
        padding = token_padding(prepared.recipe.data.inputs, rows.feeds,
                                {name: meta.shape for name, meta in prepared.model.inputs.items()})
        runner, create_ms, first_ms = measure_cold_start(timed_load(backend, plan.timed, options), rows.feeds,
                                                         fixed or 1, padding)  # fmt: skip
        try:
            if score and outputs is None:
                outputs, mixed = _run_rows(runner, prepared, rows, f"{label} evaluate", mix, close=False, quiet=quiet,
                                           known=known)  # fmt: skip
            samples, batcher = {}, None
            if timing is not None:
                samples = measure_samples(runner, rows.feeds, timing.batch_sizes, timing.warmup, timing.iterations,
                                          description=f"{label} latency", stability=timing.stability,
                                          padding=padding)  # fmt: skip
                slo = prepared.recipe.slo
                if serving and slo is not None:
                    batcher = measure_batcher_samples(runner, rows.feeds, timing.batch_sizes, timing.iterations,
                                                      idle_ms(slo, backend.name), padding=padding)  # fmt: skip
            runtime = runner.describe()
            ran = ran_fields(runner, built, runtime)
            serving_result = None
            if timing is not None and serving:  # with `slo:`, real runs on the open runner check the highest rate
                slo = prepared.recipe.slo
                server = server_for(slo, backend.name, timing.batch_sizes, runner, rows.feeds, padding,
                                    fixed) if slo else None  # fmt: skip
                serving_result = serving_figures(prepared.recipe, backend.name, samples,
                                                 latency_points(samples, timing.warmup), model_bytes=ran["model_bytes"],
                                                 lookup_bytes=lookup_table_bytes(Path(ran["model_path"]))
                                                 if ran["model_path"] else 0,
                                                 runtime=runtime, preprocess_ms_per_row=prepared.preprocess_ms_per_row,
                                                 batcher=batcher, server=server, clock=clock)  # fmt: skip
        finally:
            runner.close()
    except Exception as exc:  # noqa: BLE001 - one variant's failure is recorded, the caller goes on
        return replace(_failed(built, backend, describe_error(exc), quiet=quiet), environment=environment_cause(exc))
    finally:
        if clock is not None:
            clock.add("inference", t, less=clock.carved - carved)
    accuracy, nsr, scale_read, one_class, shared, chance, beyond, mixed_note = None, math.nan, [], {}, {}, [], [], None
    left_out: list[str] = []  # FP32's outputs no figure reads (the gate names them with its verdict)
    if outputs is not None:
        base = reference.outputs if reference is not None else outputs
        recipe = prepared.recipe
        scales = {c.name: c.meta.probabilities for c in prepared.outputs}
        if reference is None:  # FP32 itself: what its outputs show about the labels and the graph's reading
            _check_reference_outputs(prepared, label, outputs, rows, scales, quiet=quiet)
            one_class = one_class_readings(recipe.task, outputs, scales, {c.name for c in prepared.outputs
                                                                           if c.meta.decision_cut is not None},
                                           rows.labels, task_stated="task" in recipe.model_fields_set)  # fmt: skip
            for reading in () if quiet else one_class.values():
                logger.warning("%s: %s", label, reading)
            uncompared = outputs_left_out(prepared.model, prepared.outputs)
            left_out = [meta.name for meta in uncompared]
            left_note = outputs_not_compared(uncompared, prepared.outputs)
            scale_read = [*scale_notes(recipe.task, outputs, scales, rows.labels), *one_class.values(),
                          *([left_note] if left_note else [])]
            shared = shared_cosines(recipe.task, outputs)
        options = {"probabilities": scales, "task_options": recipe.task_options,
                   "lowest_wins": {c.name for c in prepared.outputs if c.meta.lowest_wins},
                   "cuts": {c.name: metrics.BinaryCut(*c.meta.decision_cut) for c in prepared.outputs
                            if c.meta.decision_cut is not None}, "precision": built.precision,
                   "sequence_ids": rows.sequence_ids}  # fmt: skip
        against = reference.accuracy if reference is not None and reference.accuracy else None
        try:
            accuracy = evaluate_accuracy(recipe.task, outputs, base, rows.labels, rows.slices, prepared.custom_metrics,
                                         feeds=rows.feeds, **options)  # fmt: skip
            accuracy = with_drops(accuracy, against or accuracy)
            if mixed is not None:
                accuracy, mixed_note = _judged_as_served(prepared, rows, accuracy, mixed, options, base, against)
        except QbenchError as exc:  # its outputs (as evaluated or as served) cannot be scored (a custom metric raised
            # on every scope): it failed
            return replace(_failed(built, backend, f"scoring failed: {exc}", quiet=quiet),
                           environment=environment_cause(exc),
                           metric_error=exc if isinstance(exc, MetricError) else None)  # fmt: skip
        if reference is None and rows.labels is not None and not quiet:  # FP32 on every evaluation row
            def unpaired() -> SliceMetrics:  # FP32 against labels shuffled across rows: a guess blind to the input
                shuffled = rows.labels[np.random.default_rng(0).permutation(len(rows.labels))]
                return evaluate_accuracy(recipe.task, outputs, base, shuffled, {}, **options).overall

            # logged here and kept in FP32's notes: a Ray worker's log never reaches the sweep (log_to_driver off)
            chance = check_labels_beat_chance(recipe, prepared.outputs, accuracy.overall, rows.labels, unpaired)
            for why in chance:
                logger.warning("%s: %s", label, why)
        beyond = [] if reference is None else beyond_range_notes(recipe.task, outputs, base, built.precision,
                                                                 options["lowest_wins"])  # fmt: skip
        nsr = output_nsr([base[k] for k in outputs], list(outputs.values()))
    latency, size = None, ran["model_bytes"]
    if timing is not None:
        points = latency_points(samples, timing.warmup)
        latency = LatencyResult(threads=timed_threads(timing.threads), session_create_ms=create_ms,
                                first_run_ms=first_ms, points=tuple(points),
                                machine=timing_machine(runtime.get("device")))  # fmt: skip
    crowded = oversubscription_note(latency)  # more threads than usable CPUs: every latency figure says so
    result = VariantResult(
        variant=built.name, backend=backend.name, precision=built.precision, status="ok",
        params={**built.params, **{f"runtime.{k}": v for k, v in runtime.items()},
                **({ONE_CLASS_OUTPUTS: sorted(one_class)} if one_class else {}),
                **({SHARED_COSINES: shared} if shared else {}),
                **({UNCOMPARED_OUTPUTS: left_out} if left_out else {})}, model_path=ran["model_path"],
        model_bytes=size, model_sha256=ran["model_sha256"], build_seconds=built.build_seconds,
        notes=(*built.notes, *([mixed_note] if mixed_note else []), *ran["notes"], *scale_read, *chance, *beyond,
               *_raised_notes(accuracy),
               *([crowded] if crowded else [])), accuracy=accuracy,
        latency=latency, fidelity=ran.get("fidelity", plan.fidelity),
        evaluated_model_path=str(plan.scored.onnx_path) if plan.separate else None, serving=serving_result,
    )  # fmt: skip
    return Measured(result, outputs, nsr, rows_independent=bool(mix) and outputs is not None and mixed is None)


def _raised_notes(accuracy: AccuracyResult | None) -> list[str]:
    """One line per custom metric and scope it raised on (SliceMetrics.raised): its figure there is NaN."""
    scopes = () if accuracy is None else (accuracy.overall, *accuracy.slices)
    return [f"{why}: {name} is NaN on {scope.name}, every other figure stands" for scope in scopes
            for name, why in scope.raised.items()]  # fmt: skip


def ran_fields(runner: Runner, built: BuiltVariant, description: Mapping[str, Any]) -> dict[str, Any]:
    """The result's record of the model that ran: the variant's ONNX file (path, bytes, sha256), unless the runner
    ran something else and says what (`result_fields(description)`: a torch runner's module, and whether its
    figures are native)."""
    own = getattr(runner, "result_fields", None)
    fields = {"model_path": str(built.onnx_path), "model_bytes": model_bytes(built.onnx_path),
              "model_sha256": model_sha256(built.onnx_path), "notes": ()}  # fmt: skip
    return {**fields, **own(description)} if own is not None else fields


def _check_reference_outputs(
    prepared: Prepared, label: str, outputs: Feeds, rows: Rows, scales: Mapping[str, bool | None], *, quiet: bool
) -> None:
    """Labels beyond the classes FP32's outputs show (a symbolic class dimension) are a recipe error, raised: no
    variant can be scored against them. A graph whose word on the scores' scale FP32's values contradict is
    warned about (unless `quiet`: a screen on a few rows)."""
    if rows.labels is not None:
        check_labels_fit_outputs(prepared, outputs, rows.labels)
    if prepared.recipe.data.nonfinite_inputs == "keep":
        _check_reads_missing(prepared, outputs, rows)
    if not quiet:
        for doubt in scale_doubts(prepared.recipe.task, outputs, scales):
            logger.warning("%s: %s", label, doubt)


def _check_reads_missing(prepared: Prepared, outputs: Feeds, rows: Rows) -> None:
    """Under `data.nonfinite_inputs: keep`, a RecipeError when FP32 gives NaN/inf on rows fed NaN/inf (the rows of a
    `missing:<column>` slice): the model does not read NaN as missing, so those rows' figures would compare garbage
    (a variant saturating where FP32 propagates NaN would look like a change, or none)."""
    bad = np.zeros(rows.count, dtype=bool)
    for values in outputs.values():
        if np.asarray(values).dtype.kind in "fc":
            bad |= metrics.nonfinite_rows(values)
    for name, mask in rows.slices.items():
        if not name.startswith(MISSING_SLICE) or not (bad & mask).any():
            continue
        column, count = name.removeprefix(MISSING_SLICE), int((bad & mask).sum())
        raise RecipeError(
            prepared.recipe.source, "data.nonfinite_inputs",
            f"the FP32 model gives NaN/inf outputs on {count} of the {int(mask.sum())} rows measured whose input "
            f"column {column!r} holds NaN/inf (slice {name!r}); expected "
            "finite outputs: keep is for a model that reads NaN as missing (trees, an Imputer); this one does not, "
            "so set error or drop",
        )  # fmt: skip


def _failed(built: BuiltVariant, backend: Backend, error: str, *, quiet: bool) -> Measured:
    """`built` failed on `backend`: the failed result, said in the log unless `quiet`."""
    if not quiet:
        logger.error("  %s failed: %s", backend.name, error)
    return Measured(failed_result(built, backend, error), None)


def _judged_as_served(
    prepared: Prepared, rows: Rows, accuracy: AccuracyResult, mixed: tuple[str, dict[Arrangement, Feeds]],
    options: Mapping[str, Any], base: Feeds, against: AccuracyResult | None,
) -> tuple[AccuracyResult, str]:  # fmt: skip
    """`accuracy` (the evaluation's arrangement) with each scope's figures from the arrangement where its gate metric
    drops most among it and the served ones (`mixed`: why the rows follow their batch, each arrangement's outputs),
    and the note saying so. Drops are taken against `against` (FP32's accuracy; None: each against itself)."""
    why, arranged = mixed
    recipe = prepared.recipe
    judged = {Arrangement(rows.batch_size, mixed=False): accuracy}
    for arrangement, outputs in arranged.items():
        figures = evaluate_accuracy(recipe.task, outputs, base, rows.labels, rows.slices, prepared.custom_metrics,
                                    feeds=rows.feeds, **options)  # fmt: skip
        judged[arrangement] = with_drops(figures, against or figures)
    worst, chosen = worst_scopes(judged, recipe.gate.gated_metrics, against)
    return worst, judged_note(why, judged, chosen, recipe.gate.metric)


def _run_rows(
    runner: Runner, prepared: Prepared, rows: Rows, description: str, mix: list[Arrangement], *, close: bool = True,
    quiet: bool = False, known: KnownOutputs | None = None,
) -> tuple[Feeds, tuple[str, dict[Arrangement, Feeds]] | None]:
    """The evaluated outputs of `runner` on `rows` (closed afterwards unless the caller goes on timing it; a model
    with a fixed batch runs whole batches of it), and, where `mix` names arrangements and the rows' outputs depend on
    their batch (batch_mix.batch_dependence), why, and the outputs in each of those arrangements (logged unless
    `quiet`: a search's candidate, whose result's note says so). The `known` rows' outputs are taken, the others run,
    unless the rows depend on their batch: then every row is run, as without them."""

    def run(feeds: Mapping[str, np.ndarray], batch_size: int, what: str = description) -> Feeds:
        return run_outputs(runner, feeds, batch_size, prepared.output_indices, description=what,
                           whole=prepared.batch is not None, tables=prepared.label_tables)  # fmt: skip

    try:
        size = prepared.batch or rows.batch_size
        outputs = with_known(run, rows.feeds, size, known) if known is not None else run(rows.feeds, size)
        if not mix:
            return outputs, None
        why = batch_dependence(lambda feeds, size: run(feeds, size, f"{description} (batch dependence)"), rows.feeds,
                               min(rows.batch_size, rows.count))  # fmt: skip
        if why is None:
            return outputs, None
        outputs = run(rows.feeds, size) if known is not None else outputs  # the known rows ran in other batches
        logger.log(logging.DEBUG if quiet else logging.INFO, "%s: rows depend on their batch (%s): judged also in %s",
                   description, why, ", ".join(a.describe() for a in mix))  # fmt: skip
        return outputs, (why, run_arrangements(lambda feeds, size: run(feeds, size, f"{description} ({size} a batch)"),
                                               rows.feeds, mix))  # fmt: skip
    finally:
        if close:
            runner.close()


def output_nsr(reference: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> float:
    """Noise-to-signal ratio of `outputs` vs `reference` over every float array (inf when not finite).

    Summed in float64 block by block of rows (metrics.row_blocks), so no output is widened whole: the sums equal a
    whole-array sum up to float64 rounding (a relative 1e-12 or so), not to the bit."""
    signal = noise = 0.0
    for r, o in zip(reference, outputs):
        r, o = np.asarray(r), np.asarray(o)
        if r.dtype.kind != "f":
            continue
        if r.ndim == 0:
            r, o = r.reshape(1), o.reshape(1)
        for block in metrics.row_blocks(r.shape[0], int(np.prod(r.shape[1:], dtype=np.int64))):
            r64, o64 = r[block].astype(np.float64), np.asarray(o[block], np.float64)
            signal += float(np.sum(r64 * r64))
            noise += float(np.sum((o64 - r64) ** 2)) if np.all(np.isfinite(o64)) else math.inf
    return noise / signal if signal > 0 else (0.0 if noise == 0 else math.inf)


def failed_result(built: BuiltVariant, backend: Backend, error: str, status: str = "failed") -> VariantResult:
    """A built variant that did not run on `backend`: failed, or skipped (the backend cannot run it). Like a measured
    result it records only the form `backend` runs: the params and notes of that form, and the ONNX file as its model
    only when `backend` runs the file (a torch backend runs a module, which a result that did not run has none of)."""
    form = form_run_by(backend)
    built = built.as_run_in(form)
    return VariantResult(
        variant=built.name, backend=backend.name, precision=built.precision, status=status, error=error,
        params=dict(built.params), model_path=str(built.onnx_path) if form == ONNX else None,
        build_seconds=built.build_seconds, notes=built.notes,
    )  # fmt: skip


def describe_error(exc: Exception) -> str:
    """User errors keep their message; anything else gets its type and the innermost frame, for a bug report."""
    if isinstance(exc, QbenchError):
        return str(exc)
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" (at {Path(frame.filename).name}:{frame.lineno})" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"
