"""The sweep: build every variant, measure it on every backend against FP32, write and log the evidence.

    outcome = run_sweep("recipes/digits.yaml")      # same as `qbench sweep recipes/digits.yaml`
    outcome.results, outcome.gate, outcome.run_dir

A variant that fails to build or run is recorded as failed (with its error)
and the sweep goes on; the gate then fails closed on it.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

import qbench
from qbench.backends import Backend, Runner, get_backend
from qbench.backends.base import RunOptions
from qbench.environment import describe_environment
from qbench.errors import QbenchError
from qbench.frontier import compute_frontier, gate_threshold, plot_frontier
from qbench.gate import GateReport, evaluate_gate
from qbench.interrupt import Interrupted, SignalGuard
from qbench.preflight import Prepared, prepare
from qbench.provenance import InputDigest, input_digests, model_sha256, recipe_record
from qbench.recipe import Recipe, VariantSpec, load_recipe
from qbench.report import write_markdown_report
from qbench.report_html import write_html_report
from qbench.results import AccuracyResult, LatencyResult, RangeAnalysis, SweepResults, VariantResult, write_results
from qbench.runs import RESULTS_FILE, mark_complete, mark_incomplete, new_run_dir, utc_now
from qbench.slo import serving_figures
from qbench.validate.accuracy import evaluate_accuracy, run_outputs, with_drops
from qbench.validate.fidelity import plan_measurement
from qbench.validate.latency import (
    latency_points,
    measure_cold_start,
    measure_samples,
    stability_rule,
    take_batch,
)
from qbench.variants import BuildContext, BuiltVariant, build_variant

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # qbench.track imports MLflow: only a tracked sweep loads it
    from qbench.track import SweepTracker
    from qbench.track_datasets import SweepData


@dataclass(frozen=True)
class SweepOutcome:
    results: SweepResults
    gate: GateReport
    run_dir: Path
    results_path: Path
    report_path: Path
    plot_path: Path | None
    mlflow_run_id: str | None


@dataclass
class _Clock:
    """Seconds spent per phase, so the sweep's own overhead can be reported."""

    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, started: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - started


@dataclass(frozen=True)
class _Measured:
    result: VariantResult
    outputs: dict[str, np.ndarray] | None  # evaluated output name -> values


def run_sweep(recipe: Recipe | str | Path, *, track: bool = True) -> SweepOutcome:
    """Run the recipe's sweep end to end; returns the results, the gate verdict and where they were written.

    SIGINT/SIGTERM or a crash leave the run folder marked INCOMPLETE with results.json (complete: false)
    holding every variant finished so far, and the MLflow runs ended KILLED or FAILED; an interruption
    is then a QbenchError (exit 2) saying where the partial results are.
    """
    started = time.perf_counter()
    clock = _Clock()
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    if track:
        from qbench.track import check_reachable, resolve_tracking_uri

        check_reachable(resolve_tracking_uri(recipe))
    with SignalGuard() as guard:
        try:
            t = time.perf_counter()
            inputs = input_digests(recipe)  # before anything is read: what these results are made from
            prepared = prepare(recipe, track=track)
            clock.add("prepare", t)
            run_dir = new_run_dir(recipe.output_path / recipe.name)  # absolute: builders may change the cwd
        except Interrupted as exc:
            raise QbenchError(f"sweep {exc} before anything was measured; nothing was written") from None
        progress = _Progress(prepared, inputs, run_dir, clock, guard)
        try:
            progress.open_tracker(track)
            return _run(prepared, progress, started)
        except BaseException as exc:
            guard.ignore()  # the clean-up runs to its end
            replacement = progress.stop(exc)
            if replacement is exc:
                raise
            raise replacement from None


def _run(prepared: Prepared, progress: _Progress, started: float) -> SweepOutcome:
    run_dir, clock = progress.run_dir, progress.clock
    if prepared.calibration_overlap:
        logger.warning("%d calibration rows are also evaluation rows; INT8 accuracy may look better than on unseen "
                       "data", prepared.calibration_overlap)  # fmt: skip
    calibrated: list[BuiltVariant] = []
    variants = _measure_all(prepared, run_dir / "models", clock, calibrated, progress)
    ranges = _range_analysis(prepared, calibrated, run_dir, clock)
    results = replace(_assemble(prepared, variants, clock, progress.inputs), ranges=ranges)
    return _publish(prepared.recipe, results, progress, started)


@dataclass
class _Progress:
    """What a running sweep has finished, kept on disk (results.json, complete: false) and in MLflow as it goes."""

    prepared: Prepared
    inputs: dict[str, InputDigest]
    run_dir: Path
    clock: _Clock
    guard: SignalGuard
    tracker: SweepTracker | None = None
    done: list[VariantResult] = field(default_factory=list)
    results_complete: bool = False
    _base: SweepResults | None = None

    def open_tracker(self, track: bool) -> None:
        if track:
            from qbench.track import SweepTracker

            with self.guard.shielded():
                name = f"{self.prepared.recipe.name} sweep {self.run_dir.name}"
                self.tracker = SweepTracker.open(self.prepared.recipe, name, run_dir=self.run_dir,
                                                 data=_sweep_data(self.prepared))  # fmt: skip

    def started(self, variant: str, backend: str) -> None:
        if self.tracker is not None:
            with self.guard.shielded():
                self.tracker.variant_started(variant, backend)

    def finished(self, result: VariantResult) -> None:
        """Keep one finished variant x backend: rewrite the partial results.json, end its MLflow run."""
        self.done.append(result)
        if self._base is None:
            base = _assemble(self.prepared, [], self.clock, self.inputs)
            self._base = replace(base, complete=False, finished_at=None)
        partial = replace(self._base, variants=tuple(self.done), timings=dict(self.clock.seconds),
                          frontier=compute_frontier(self.done, self._base.gate_metric))  # fmt: skip
        with self.guard.shielded():
            write_results(partial, self.run_dir / RESULTS_FILE)
            if self.tracker is not None:
                self.tracker.variant_finished(partial, result)
        logger.info("  done: %s (%s)", result.key, result.status)

    def stop(self, exc: BaseException) -> BaseException:
        """After an interruption or a crash: mark the run folder and end the MLflow runs; returns what to raise."""
        interrupted = isinstance(exc, Interrupted)
        crash = _describe_error(exc) if isinstance(exc, Exception) else repr(exc)
        reason = str(exc) if interrupted else f"failed: {crash}"
        if not self.results_complete:
            mark_incomplete(self.run_dir, reason)
        if self.tracker is not None:
            self.tracker.abort("KILLED" if interrupted else "FAILED", reason)
        if not interrupted:
            return exc
        if self.results_complete:
            where = f"the results are complete in {self.run_dir}"
        else:
            kept = f"{len(self.done)} variant run{'' if len(self.done) == 1 else 's'}"
            where = f"partial results ({kept}) in {self.run_dir / RESULTS_FILE}, marked incomplete"
        return QbenchError(f"sweep {exc}: {where}")


def _sweep_data(prepared: Prepared) -> SweepData:
    """The evaluation and calibration rows the sweep measures on, for MLflow's dataset inputs."""
    from qbench.track_datasets import SweepData, concatenated

    recipe = prepared.recipe
    return SweepData(
        recipe_name=recipe.name, evaluation_source=recipe.data_path, evaluation=prepared.evaluation_feeds,
        labels=prepared.labels, slices=prepared.slices,
        calibration_source=recipe.calibration_data_path or recipe.data_path,
        calibration=concatenated(prepared.calibration_batches),
    )  # fmt: skip


def _measure_all(
    prepared: Prepared, models_dir: Path, clock: _Clock, calibrated: list[BuiltVariant], progress: _Progress
) -> list[VariantResult]:
    """Build each variant once, then measure it on each backend; FP32 on the first backend is the reference.

    Built variants with calibrated activation ranges are appended to `calibrated` (for the range analysis)."""
    recipe = prepared.recipe
    backends = [get_backend(name) for name in recipe.backends]
    reference_outputs: dict[str, np.ndarray] | None = None
    reference_accuracy: dict[str, AccuracyResult] = {}
    measured: list[VariantResult] = []
    by_identity: dict[str, dict[str, VariantResult]] = {}  # identity -> backend -> the measured result
    for spec in recipe.all_variants():
        logger.info("%s (%s)", spec.name, spec.precision)
        progress.started(spec.name, backends[0].name)  # the first backend's run includes the build
        evaluate = _search_evaluator(backends[0], prepared, reference_outputs, reference_accuracy, clock)
        built, error = _build(spec, prepared, models_dir, clock, evaluate)
        if built is not None and built.activation_ranges:
            calibrated.append(built)
        twins = by_identity.setdefault(_identity(built), {}) if built is not None else {}
        for index, backend in enumerate(backends):
            if index:
                progress.started(spec.name, backend.name)
            if built is None:
                measured.append(_failed(spec, backend.name, error or "build failed"))
                progress.finished(measured[-1])
                continue
            if backend.name in twins:
                measured.append(_identical(built, twins[backend.name]))
                progress.finished(measured[-1])
                continue
            outcome = _measure(backend, built, prepared, reference_outputs, reference_accuracy.get(backend.name), clock)
            if spec.precision == "fp32" and outcome.result.accuracy is not None:
                reference_outputs = reference_outputs if reference_outputs is not None else outcome.outputs
                reference_accuracy[backend.name] = outcome.result.accuracy
            twins[backend.name] = outcome.result
            measured.append(outcome.result)
            progress.finished(outcome.result)
    return measured


def _identity(built: BuiltVariant) -> str:
    """What decides a variant's figures: its graph (digest), how backends must run it, and its torch form."""
    from qbench.variants.onnx_utils import graph_digest
    from qbench.variants.torch_forms import TORCH_FORM

    try:
        graph = graph_digest(built.onnx_path)
    except Exception:  # noqa: BLE001 - an unreadable model is measured (and fails) on its own
        graph = f"unread:{built.name}"
    return f"{graph}|{sorted(built.session_hints.items())}|{built.params.get(TORCH_FORM)}"


def _identical(built: BuiltVariant, twin: VariantResult) -> VariantResult:
    """`built` computes exactly what `twin` measured: report `twin`'s figures under its name, saying so."""
    note = f"identical to {twin.variant} (same graph and weights): not run again, the figures are {twin.variant}'s"
    logger.info("  %s: %s", twin.backend, note)
    return replace(
        twin, variant=built.name, precision=built.precision, params={**built.params, "identical_to": twin.variant},
        model_path=str(built.onnx_path), build_seconds=built.build_seconds, notes=(*built.notes, note),
    )  # fmt: skip


def _range_analysis(
    prepared: Prepared, calibrated: list[BuiltVariant], workdir: Path, clock: _Clock
) -> RangeAnalysis | None:
    """The FP32 range pass (recipe `analysis.ranges`); a failure is reported and the sweep goes on without it."""
    recipe = prepared.recipe
    if not recipe.analysis.ranges:
        return None
    from qbench.validate.ranges import CalibratedVariant, analyse_ranges

    logger.info("range analysis (one FP32 pass)")
    t = time.perf_counter()
    try:
        analysis = analyse_ranges(
            prepared.source.onnx_path, prepared.evaluation_feeds, prepared.slices,
            batch_size=recipe.data.evaluation.batch_size,
            variants=[CalibratedVariant(b.name, b.precision, b.activation_ranges) for b in calibrated],
            calibration_counts=prepared.calibration.per_slice_counts, threads=recipe.latency.threads, workdir=workdir,
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - a diagnostic: its failure must not lose the measurements
        logger.error("  range analysis failed: %s", _describe_error(exc))
        return None
    finally:
        clock.add("ranges", t)
    for warning in analysis.warnings:
        logger.warning("calibration coverage: %s", warning.message)
    return analysis


def _search_evaluator(
    backend: Backend,
    prepared: Prepared,
    reference_outputs: dict[str, np.ndarray] | None,
    reference_accuracy: dict[str, AccuracyResult],
    clock: _Clock,
) -> Callable[[BuiltVariant], VariantResult]:
    """Measure a candidate variant on the first backend against FP32 (for fallback / calibrator search)."""

    def evaluate(candidate: BuiltVariant) -> VariantResult:
        return _measure(
            backend, candidate, prepared, reference_outputs, reference_accuracy.get(backend.name), clock
        ).result

    return evaluate


def _build(
    spec: VariantSpec,
    prepared: Prepared,
    models_dir: Path,
    clock: _Clock,
    evaluate: Callable[[BuiltVariant], VariantResult],
) -> tuple[BuiltVariant | None, str | None]:
    """Build one variant; a variant with `fallback` or `calibrator: auto` is searched with `evaluate`."""
    t = time.perf_counter()
    ctx = BuildContext(
        reference_path=prepared.source.onnx_path,
        workdir=models_dir,
        calibration=prepared.calibration_batches,
        torch_model=prepared.source.torch,
        training=prepared.training.get(spec.name),
    )
    try:
        logger.info("  building: %s", _technique(spec))
        return _build_one(spec, ctx, evaluate, prepared), None
    except Exception as exc:  # noqa: BLE001 - one variant's failure is recorded, the sweep goes on
        logger.error("  build failed: %s", exc)
        return None, _describe_error(exc)
    finally:
        clock.add("build", t)


def _technique(spec: VariantSpec) -> str:
    """What building this variant involves, for the progress line."""
    if spec.qat is not None:
        return f"QAT, {spec.qat.epochs} epochs"
    if spec.calibrator is None:
        return spec.precision
    return f"{spec.precision}, {spec.technique_name}, {spec.calibrator} calibration"


def _build_one(
    spec: VariantSpec, ctx: BuildContext, evaluate: Callable[[BuiltVariant], VariantResult], prepared: Prepared
) -> BuiltVariant:
    """The variant, searched when it asks for a fallback or calibrator auto, with its torch form attached."""
    if spec.fallback is not None or spec.calibrator == "auto":
        from qbench.fallback import build_with_search

        built = build_with_search(spec, ctx, evaluate=evaluate, gate=prepared.recipe.gate)
    else:
        built = build_variant(spec, ctx)
    if prepared.source.torch is not None and built.torch_module is None:
        from qbench.variants.torch_forms import attach_torch_form

        built = attach_torch_form(built, spec, prepared.source.torch)
    return built


def _measure(
    backend: Backend,
    built: BuiltVariant,
    prepared: Prepared,
    reference_outputs: dict[str, np.ndarray] | None,
    reference_accuracy: AccuracyResult | None,
    clock: _Clock,
) -> _Measured:
    """Cold start, accuracy on every evaluation row, then steady-state latency: one session alive at a time.

    The timed and the scored model differ when the backend cannot compute the variant's precision
    (qbench.validate.fidelity): the scored emulation then runs first, in its own session.
    """
    recipe = prepared.recipe
    unsupported = backend.supports(built)
    if unsupported:
        logger.info("  %s: skipped (%s)", backend.name, unsupported)
        return _Measured(_failed_built(built, backend.name, unsupported, status="skipped"), None)
    feeds = prepared.evaluation_feeds
    label = f"{built.name}@{backend.name}"
    t = time.perf_counter()
    try:
        batch_sizes = tuple(sorted({*recipe.latency.batch_sizes, recipe.data.evaluation.batch_size, 1}))
        options = RunOptions(threads=recipe.latency.threads, batch_sizes=batch_sizes)
        plan = plan_measurement(backend, built)
        outputs = None
        if plan.separate:
            outputs = _score(backend.load(plan.scored, options), prepared, f"{label} evaluate (emulated)")
        runner, create_ms, first_ms = measure_cold_start(
            lambda: backend.load(plan.timed, options), take_batch(feeds, 1)
        )
        try:
            if outputs is None:
                outputs = _score(runner, prepared, f"{label} evaluate", close=False)
            samples = measure_samples(
                runner, feeds, recipe.latency.batch_sizes, recipe.latency.warmup, recipe.latency.iterations,
                description=f"{label} latency", stability=recipe.latency.stability,
            )  # fmt: skip
            rule = stability_rule(recipe.latency.stability, recipe.latency.iterations)
            points = latency_points(samples, recipe.latency.warmup, rule)
            runtime = runner.describe()
        finally:
            runner.close()
    except Exception as exc:  # noqa: BLE001
        logger.error("  %s failed: %s", backend.name, exc)
        return _Measured(_failed_built(built, backend.name, _describe_error(exc)), None)
    finally:
        clock.add("inference", t)
    reference = reference_outputs if reference_outputs is not None else outputs
    accuracy = evaluate_accuracy(
        recipe.task, outputs, reference, prepared.labels, prepared.slices, prepared.custom_metrics
    )
    accuracy = with_drops(accuracy, reference_accuracy or accuracy)
    latency = LatencyResult(
        threads=recipe.latency.threads, session_create_ms=create_ms, first_run_ms=first_ms, points=tuple(points)
    )
    model_bytes = built.onnx_path.stat().st_size
    serving = serving_figures(recipe, backend.name, samples, points, model_bytes=model_bytes, runtime=runtime,
                              preprocess_ms_per_row=prepared.preprocess_ms_per_row)  # fmt: skip
    return _Measured(
        VariantResult(
            variant=built.name,
            backend=backend.name,
            precision=built.precision,
            status="ok",
            params={**built.params, **{f"runtime.{k}": v for k, v in runtime.items()}},
            model_path=str(built.onnx_path),
            model_bytes=model_bytes,
            model_sha256=model_sha256(built.onnx_path),
            build_seconds=built.build_seconds,
            notes=built.notes,
            accuracy=accuracy,
            latency=latency,
            fidelity=plan.fidelity,
            evaluated_model_path=str(plan.scored.onnx_path) if plan.separate else None,
            serving=serving,
        ),
        outputs,
    )


def _score(runner: Runner, prepared: Prepared, description: str, *, close: bool = True) -> dict[str, np.ndarray]:
    """The evaluation outputs of `runner` (closed afterwards unless the caller goes on timing it)."""
    try:
        batch_size = prepared.recipe.data.evaluation.batch_size
        return run_outputs(runner, prepared.evaluation_feeds, batch_size, prepared.output_indices,
                           description=description)  # fmt: skip
    finally:
        if close:
            runner.close()


def _failed(spec: VariantSpec, backend: str, error: str) -> VariantResult:
    return VariantResult(variant=spec.name, backend=backend, precision=spec.precision, status="failed", error=error)


def _failed_built(built: BuiltVariant, backend: str, error: str, status: str = "failed") -> VariantResult:
    """A built variant that did not run on `backend`: failed, or skipped (the backend cannot run it)."""
    return VariantResult(
        variant=built.name, backend=backend, precision=built.precision, status=status, error=error,
        params=dict(built.params), model_path=str(built.onnx_path), build_seconds=built.build_seconds,
        notes=built.notes,
    )  # fmt: skip


def _describe_error(exc: Exception) -> str:
    """User errors keep their message; anything else gets its type and the innermost frame, for a bug report."""
    if isinstance(exc, QbenchError):
        return str(exc)
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" (at {Path(frame.filename).name}:{frame.lineno})" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _assemble(
    prepared: Prepared, variants: list[VariantResult], clock: _Clock, inputs: dict[str, InputDigest]
) -> SweepResults:
    """The results of a finished sweep, with the whole resolved recipe and a digest of every input."""
    recipe = prepared.recipe
    return SweepResults(
        qbench_version=qbench.__version__,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        recipe={
            "name": recipe.name,
            "path": str(recipe.source),
            "sha256": recipe.sha256,
            "fingerprint": recipe.fingerprint(),
            "task": recipe.task,
            "model_path": str(prepared.source.onnx_path),
            "model_source": recipe.model.torch or "onnx",
            "data_path": str(recipe.data_path),
            "model_output": prepared.output_name,
            "backends": list(recipe.backends),
            "gate": recipe.gate.model_dump(mode="json"),
            "latency": recipe.latency.model_dump(mode="json"),
            **recipe_record(recipe),
            "slo": recipe.slo.model_dump(mode="json") if recipe.slo is not None else None,
            "cost": recipe.cost.model_dump(mode="json") if recipe.cost is not None else None,
        },
        environment={**describe_environment(), "calibration_overlap_rows": prepared.calibration_overlap},
        calibration=prepared.calibration,
        evaluation_rows=len(prepared.evaluation_rows),
        gate_metric=recipe.gate.metric,
        reference=recipe.all_variants()[0].name,
        variants=tuple(variants),
        frontier=compute_frontier(variants, recipe.gate.metric),
        timings=dict(clock.seconds),
        dropped_nonfinite=prepared.dropped_nonfinite,
        inputs={name: {"path": entry.path, "sha256": entry.sha256} for name, entry in inputs.items()},
        complete=True,
        finished_at=utc_now(),
    )


def _publish(recipe: Recipe, results: SweepResults, progress: _Progress, started: float) -> SweepOutcome:
    """Write the complete results.json first (so nothing measured is lost), then the plot, the reports and MLflow."""
    run_dir, clock = progress.run_dir, progress.clock
    t = time.perf_counter()
    gate = evaluate_gate(results, recipe.gate, slo=recipe.slo)
    with progress.guard.shielded():
        results_path = write_results(results, run_dir / RESULTS_FILE)
        mark_complete(run_dir)
        progress.results_complete = True
    plot_path = plot_frontier(results, run_dir / "frontier.png", threshold=gate_threshold(results, recipe.gate.max_drop))
    report_path = write_markdown_report(results, gate, plot_path, run_dir / "report.md")
    html_path = write_html_report(results, gate, run_dir / "report.html")
    clock.add("report", t)
    run_id = None
    if progress.tracker is not None:
        t = time.perf_counter()
        artifacts = [recipe.source, results_path, report_path, html_path, plot_path]
        try:
            with progress.guard.shielded():
                run_id = progress.tracker.close(results, recipe, gate, [a for a in artifacts if a is not None])
        except Exception as exc:  # noqa: BLE001 - results are on disk; say where, then fail
            raise QbenchError(f"logging to MLflow failed ({exc}); the results are saved in {run_dir}") from exc
        clock.add("track", t)
    timings = {**clock.seconds, "total": time.perf_counter() - started}
    results = _with_timings(results, timings)
    write_results(results, results_path)
    return SweepOutcome(results, gate, run_dir, results_path, report_path, plot_path, run_id)


def _with_timings(results: SweepResults, timings: dict[str, float]) -> SweepResults:
    return replace(results, timings={k: round(v, 4) for k, v in timings.items()})
