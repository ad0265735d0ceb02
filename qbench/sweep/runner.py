"""The sweep: build every variant, measure it on every backend against FP32, write and log the evidence.

    outcome = run_sweep("recipes/digits.yaml")      # same as `qbench sweep recipes/digits.yaml`
    outcome.results, outcome.gate, outcome.run_dir

A variant that fails to build or run is recorded as failed (with its error)
and the sweep goes on; the gate then fails closed on it.
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import qbench
from qbench.console import SHOWN_IN_SUMMARY
from qbench.environment import describe_environment
from qbench.errors import QbenchError
from qbench.execute import SweepPlan, make_executor, make_plan, run_plan, write_plan
from qbench.execute.cache import entries_in_use
from qbench.execute.jobs import describe_error
from qbench.execute.records import JOBS_FOLDER, read_records
from qbench.execute.resume import resume_target
from qbench.execute.snapshot import Snapshot, snapshot_keys, take_snapshot
from qbench.execute.store import build_store
from qbench.files import write_fault
from qbench.frontier.pareto import compute_frontier, gate_threshold, mixed_timing_machines
from qbench.frontier.svg import write_frontier_svg
from qbench.gate.evaluate import GateReport, evaluate_gate
from qbench.gate.notes import nonfinite_reference_rows
from qbench.gate.tolerance import reference_tolerances
from qbench.interrupt import EndedBySignal, Interrupted, SignalGuard
from qbench.preflight.prepare import Prepared, prepare
from qbench.provenance import (
    InputDigest,
    factory_file_digests,
    input_digests,
    project_module_digests,
    recipe_record,
)
from qbench.recipe.spec import Recipe, load_recipe
from qbench.report.html import write_html_report
from qbench.report.tables import write_markdown_report
from qbench.results.schema import RangeAnalysis, SweepResults, VariantResult, write_results
from qbench.runs import RESULTS_FILE, mark_complete, mark_incomplete, new_run_dir, record_tracking, utc_now
from qbench.supervisor import announce_run
from qbench.track.process import RemoteTracker
from qbench.validate.background import hand_over_beside_timing
from qbench.validate.catalogue import custom_metrics
from qbench.validate.clock import PhaseClock
from qbench.validate.contention import contention_notes
from qbench.variants import BuiltVariant

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # qbench.track imports MLflow: only a tracked sweep's tracking process loads it
    from qbench.sweep.data import SweepData


@dataclass(frozen=True)
class SweepOutcome:
    results: SweepResults
    gate: GateReport
    run_dir: Path
    results_path: Path
    report_path: Path
    plot_path: Path | None
    mlflow_run_id: str | None
    tracking_failure: str | None = None  # the tracking store failed during the sweep: MLflow lacks some of it


def run_sweep(
    recipe: Recipe | str | Path, *, track: bool = True, resume: bool = False, rerun_failed: bool = False,
    keep_failed: frozenset[str] = frozenset(), resume_run: Path | None = None,
) -> SweepOutcome:
    """Run the recipe's sweep end to end; returns the results, the gate verdict and where they were written.

    The sweep is a plan of jobs (qbench.execute) run by the recipe's executor (`executor:`; local by
    default). With `resume`, builds already in the build store and the finished jobs of the newest run of the
    same plan are reused: an interrupted run, or a finished one whose failed jobs failed for reasons outside their
    variants (only those run again); a QbenchError when that newest run finished with nothing to run again. With
    `rerun_failed` too, every job that run recorded as failed runs again, whatever the reason (a finished run with
    any failed job is taken up), but for the jobs in `keep_failed` (those the sweep's process died running during
    this command: the supervising `qbench` process's resume after a crash, qbench.supervisor, never runs them again).
    `resume_run` (that resume's too): the run folder taken up, the crashed sweep's, rather than the newest of the plan.
    SIGINT/SIGTERM or a crash leave the run folder marked INCOMPLETE with results.json (complete: false)
    holding every variant finished so far and a record per finished job, and the MLflow runs ended
    KILLED or FAILED; an interruption is then a QbenchError (exit 2) saying where the partial results are.
    A tracking store that fails during the sweep does not stop it: `tracking_failure` of the outcome says what failed.
    """
    started = time.perf_counter()
    clock = PhaseClock()
    if rerun_failed and not resume:
        raise QbenchError("--rerun-failed applies with --resume (or --plan): it says which jobs a resume runs again")
    if resume_run is not None and not resume:
        raise QbenchError("--resume-run applies with --resume: it names the run folder a resume takes up")
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    with custom_metrics(recipe.custom_metrics()):  # this recipe's directions, whatever else was loaded since
        return _sweep(recipe, started, clock, track=track, resume=resume, rerun_failed=rerun_failed,
                      keep_failed=keep_failed, resume_run=resume_run)


def _sweep(recipe: Recipe, started: float, clock: PhaseClock, *, track: bool, resume: bool, rerun_failed: bool,
           keep_failed: frozenset[str], resume_run: Path | None) -> SweepOutcome:  # fmt: skip
    mlflow_uri = None  # the MLflow store the sweep logs to
    if track:
        from qbench.track.uri import check_reachable, resolve_tracking_uri

        mlflow_uri = resolve_tracking_uri(recipe)
        check_reachable(mlflow_uri)
    with SignalGuard() as guard, ExitStack() as held:
        try:
            t = time.perf_counter()
            inputs = input_digests(recipe)  # before anything is read: what these results are made from
            plan = make_plan(recipe, inputs)
            resume_from = _resumable(recipe, plan, rerun_failed, resume_run) if resume else None
            store = build_store(recipe)

            def snapshot() -> Snapshot:
                """The inputs' copies, taken once the store is checked; every entry the sweep reads is first
                registered as in use for its whole run (a `qbench cache prune` meanwhile leaves them)."""
                keys = {job.build_key for job in plan.jobs} | snapshot_keys(inputs)
                held.enter_context(entries_in_use(store.local, keys))
                return take_snapshot(inputs, store.sources_root)

            # on a cluster, each backend is checked where its jobs run; the sweep reads only copies of the files
            # it hashed: a later edit to them cannot reach it
            local = recipe.executor.kind == "local"
            prepared = prepare(recipe, track=track, backends=local, snapshot=snapshot)
            # the modules of the user's project the recipe's code imported (its model's classes) are inputs too, as
            # are the files of it the factory read (a checkpoint it loads itself)
            modules = project_module_digests(recipe)
            torch_model = prepared.source.torch
            read = factory_file_digests(recipe, torch_model.read_files) if torch_model is not None else {}
            recorded_inputs = {**inputs, **modules, **read}
            if local:  # the reference runs every batch size asked for, or nothing is built (a cluster's nodes check)
                _check_reference_runs(prepared)
            clock.add("prepare", t)
            # absolute: builders may change the cwd; the recipe file named, so a gate tells its runs from others'
            run_dir = new_run_dir(recipe.output_path / recipe.name, recipe.source)
            announce_run(run_dir)  # a crash of this process is then reported with its run folder (qbench.supervisor)
            # what a resume compares
            write_plan(run_dir, plan, resumes=resume_from,
                       project_modules={name: entry.sha256 for name, entry in modules.items()})
            # `qbench gate` then knows an untracked run is in no MLflow store, and a tracked one's store wherever it
            # runs
            record_tracking(run_dir, track, mlflow_uri)
        except Interrupted as exc:
            raise EndedBySignal(f"sweep {exc} before anything was measured; nothing was written", exc) from None
        progress = _Progress(prepared, recorded_inputs, run_dir, clock, guard)
        try:
            progress.open_tracker(track, resumes=resume_from)
            return _run(prepared, plan, progress, started, resume=resume, resume_from=resume_from,
                        rerun_failed=rerun_failed, keep_failed=keep_failed)  # fmt: skip
        except BaseException as exc:
            guard.ignore()  # the clean-up runs to its end
            replacement = progress.stop(exc)
            if replacement is exc:
                raise
            raise replacement from None


def _check_reference_runs(prepared: Prepared) -> None:
    """`qbench validate`'s dry run of the FP32 reference on each backend (one row, then one batch of the largest size
    the sweep runs), before any variant is built: a reference that cannot run is the sweep's failure, found in
    seconds, not after every build (minutes for a large model). A message about the sweep's copy of the model names
    the user's file."""
    from qbench.backends import get_backend
    from qbench.validate.dry_run import dry_run

    for name in prepared.recipe.backends:
        try:
            dry_run(prepared, get_backend(name))
        except QbenchError as exc:
            if prepared.snapshot is not None:
                exc.args = (prepared.snapshot.shown(str(exc)),)
            raise


def _resumable(recipe: Recipe, plan: SweepPlan, rerun_failed: bool, crashed: Path | None) -> Path | None:
    """The run folder --resume takes up (qbench.execute.resume.resume_target): `crashed` where it names one."""
    run = resume_target(recipe.output_path / recipe.name, plan.fingerprint, rerun_failed=rerun_failed, crashed=crashed)
    if run is None:
        logger.info("no interrupted run of this recipe with the same plan finished a job: only builds in the store "
                    "are reused")  # fmt: skip
    return run


def _run(prepared: Prepared, plan: SweepPlan, progress: _Progress, started: float, *,
         resume: bool, resume_from: Path | None, rerun_failed: bool, keep_failed: frozenset[str]
         ) -> SweepOutcome:  # fmt: skip
    recipe, run_dir, clock = prepared.recipe, progress.run_dir, progress.clock
    store = build_store(recipe)
    executor = make_executor(recipe, prepared, store)
    try:
        executor.check_needs({job.needs for job in plan.jobs})
    except BaseException:
        executor.close()
        raise
    run = run_plan(plan, prepared, executor, store, progress, run_dir, clock, retries=recipe.executor.retries,
                   resume=resume, resume_from=resume_from, rerun_failed=rerun_failed,
                   keep_failed=keep_failed)  # fmt: skip
    hand_over_beside_timing()  # the last variant's MLflow logging runs beside the range analysis and the reports
    ranges = _range_analysis(prepared, run.calibrated, run.results, run_dir, clock)
    # the project's modules the recipe's code imported as it ran (a metric importing its helper when first called)
    # are inputs as much as those its preparation imported
    inputs = {**project_module_digests(recipe), **progress.inputs}
    results = replace(_assemble(prepared, run.results, clock, inputs), ranges=ranges, search=run.search)
    return _publish(recipe, results, progress, started)


@dataclass
class _Progress:
    """What a running sweep has finished, kept on disk (results.json, complete: false) and in MLflow as it goes."""

    prepared: Prepared
    inputs: dict[str, InputDigest]
    run_dir: Path
    clock: PhaseClock
    guard: SignalGuard
    tracker: RemoteTracker | None = None
    done: list[VariantResult] = field(default_factory=list)
    results_complete: bool = False
    _base: SweepResults | None = None

    def open_tracker(self, track: bool, *, resumes: Path | None = None) -> None:
        """Open the sweep's MLflow runs; a resumed sweep takes over those of the run folder it `resumes`."""
        if track:
            with self.guard.shielded():
                name = f"{self.prepared.recipe.name} sweep {self.run_dir.name}"
                recipe = self.prepared.recipe  # jobs run here: the runs open while the builds go on
                self.tracker = RemoteTracker.open(recipe, name, run_dir=self.run_dir, data=_sweep_data(self.prepared),
                                                 resumes=resumes, wait=recipe.executor.kind != "local")  # fmt: skip

    def started(self, variant: str, backend: str) -> None:
        """`variant` is being measured on `backend` (or searched: a build that times candidates); its MLflow run
        opens."""
        if self.tracker is not None:
            with self.guard.shielded():
                self.tracker.variant_started(variant, backend)

    def finished(self, result: VariantResult, *, reused: bool = False) -> None:
        """Keep one finished variant x backend: rewrite the partial results.json, end its MLflow run (one `reused`
        from the interrupted run this sweep resumes is in MLflow already)."""
        self.done.append(result)
        if result.variant == self.prepared.recipe.all_variants()[0].name:
            _check_reference_accuracy(self.prepared, result)
        if self._base is None:
            base = _assemble(self.prepared, [], self.clock, self.inputs)
            self._base = replace(base, complete=False, finished_at=None)
        partial = replace(self._base, variants=tuple(self.done), timings=dict(self.clock.seconds),
                          frontier=compute_frontier(self.done, self._base.gate_metric))  # fmt: skip
        with self.guard.shielded():
            write_results(partial, self.run_dir / RESULTS_FILE)
            if self.tracker is not None:
                self.tracker.variant_finished(partial, result, reused=reused)
        logger.info("  done: %s (%s)", result.key, result.status)

    def stop(self, exc: BaseException) -> BaseException:
        """After an interruption or a crash: mark the run folder and end the MLflow runs; returns what to raise.

        The clean-up may fail for the reason the sweep did (a full disk): its error is logged, and `exc`, the
        first error, is still the one reported."""
        interrupted = isinstance(exc, Interrupted)
        crash = describe_error(exc) if isinstance(exc, Exception) else repr(exc)
        reason = str(exc) if interrupted else f"failed: {crash}"
        if not self.results_complete:
            try:
                mark_incomplete(self.run_dir, reason)
            except Exception as unmarked:  # noqa: BLE001 - the first error is the one to report
                # a full disk: the marker left says "running", which the gate reads as a killed sweep
                logger.warning("%s: cannot mark the run incomplete: %s", self.run_dir, describe_error(unmarked))
        if self.tracker is not None:
            self.tracker.abort("KILLED" if interrupted else "FAILED", reason)
        if not interrupted and not (self.results_complete and isinstance(exc, QbenchError)):
            return exc
        if self.results_complete:  # a full disk after it (a report, the timings' rewrite) loses none of them
            where = f"the results are complete in {self.run_dir}"
            if self.tracker is not None:  # interrupted before the MLflow logging ended: say how to finish it
                where += (f", not in MLflow (log them there with `qbench track {self.prepared.recipe.source} "
                          f"{self.run_dir}`)")
        elif (self.run_dir / RESULTS_FILE).is_file():
            kept = f"{len(self.done)} variant run{'' if len(self.done) == 1 else 's'}"
            where = f"partial results ({kept}) in {self.run_dir / RESULTS_FILE}, marked incomplete{self._reusable()}"
        else:  # no variant in results.json yet: there is none to point to
            where = f"no variant run in results.json; {self.run_dir} is marked incomplete{self._reusable()}"
        return EndedBySignal(f"sweep {exc}: {where}", exc) if interrupted else QbenchError(f"{exc}; {where}")

    def _reusable(self) -> str:
        """What the run folder's job records keep for `--resume`: a job (a build, a measurement) is recorded as it
        ends, before results.json is rewritten, so the records, not `done`, say what an interruption left."""
        finished = [record for record in read_records(self.run_dir).values() if record.died is None]
        if not finished:
            return "; no job finished"
        jobs = f"{len(finished)} finished job{'' if len(finished) == 1 else 's'}"
        return (f"; {jobs} recorded in {self.run_dir / JOBS_FOLDER}, which `qbench sweep {self.prepared.recipe.source} "
                "--resume` reuses")


def _check_reference_accuracy(prepared: Prepared, reference: VariantResult) -> None:
    """Warn when FP32 itself gives NaN/inf on some rows, when the gate's tolerances cannot be formed from FP32's figure
    (relative ones of a figure that is 0: the gate will exit 2, so say it now, not after every variant is measured).
    FP32 scoring below chance against the labels (labels misread, most likely) is said as it is measured."""
    if reference.accuracy is not None and reference.accuracy.nonfinite_outputs:
        logger.warning("%s: variants are only checked not to add NaN/inf there",
                       nonfinite_reference_rows(reference.key, reference.accuracy))  # fmt: skip
    for gated in prepared.recipe.gate.per_metric() if reference.status == "ok" else []:  # each of gate.metrics
        try:
            reference_tolerances(reference, gated)
        except QbenchError as exc:
            logger.warning("%s: the gate cannot judge this sweep: %s", reference.key, exc)


def _sweep_data(prepared: Prepared) -> SweepData:
    """The evaluation and calibration rows the sweep measures on, for MLflow's dataset inputs."""
    from qbench.sweep.data import SweepData, concatenated

    recipe = prepared.recipe
    return SweepData(
        recipe_name=recipe.name, evaluation_source=recipe.data_path, evaluation=prepared.evaluation_feeds,
        labels=prepared.labels, slices=prepared.slices,
        calibration_source=recipe.calibration_data_path or recipe.data_path,
        calibration=concatenated(prepared.calibration_batches, prepared.calibration.size),
    )  # fmt: skip


def _range_analysis(
    prepared: Prepared, calibrated: list[BuiltVariant], measured: list[VariantResult], workdir: Path, clock: PhaseClock
) -> RangeAnalysis | None:
    """The FP32 range pass (recipe `analysis.ranges`); a failure is reported and the sweep goes on without it.
    Tensors over FP16's limit that every built FP16 variant keeps in FP32 or found harmless, and those over BF16's that
    every BF16 variant saturates, are marked so."""
    recipe = prepared.recipe
    if not recipe.analysis.ranges:
        return None
    from qbench.backends import BACKENDS
    from qbench.backends.base import form_run_by
    from qbench.validate.ranges import CalibratedVariant, analyse_ranges, bf16_saturated, fp16_handled
    from qbench.variants.base import ONNX

    graphs = [r for r in measured if r.status == "ok" and form_run_by(BACKENDS.get(r.backend)) == ONNX]  # the records
    fp16 = {r.variant: r.params for r in graphs if r.precision == "fp16"}  # name tensors of the graph a build wrote
    bf16 = {r.variant: r.params for r in graphs if r.precision == "bf16"}

    logger.info("range analysis (one FP32 pass)")
    t = time.perf_counter()
    try:
        analysis = analyse_ranges(
            prepared.source.onnx_path, prepared.evaluation_feeds, prepared.slices,
            batch_size=recipe.data.evaluation.batch_size,
            variants=[CalibratedVariant(b.name, b.precision, b.activation_ranges) for b in calibrated],
            calibration_counts=prepared.calibration.per_slice_counts, threads=recipe.latency.threads, workdir=workdir,
            whole=prepared.batch is not None, fp16_handled=fp16_handled(list(fp16.items())),
            bf16_saturated=bf16_saturated(list(bf16.items())),
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - a diagnostic: its failure must not lose the measurements
        if write_fault(exc):  # the disk's fault, not the analysis's: the run stops incomplete, --resume finishes it
            raise
        logger.error("  range analysis failed: %s", describe_error(exc))
        return None
    finally:
        clock.add("ranges", t)
    if analysis is None:
        logger.info("  skipped: no node of the model makes a float tensor of known type (nothing to analyse)")
        return None
    for warning in analysis.warnings:
        logger.warning("calibration coverage: %s", warning.message)
    return analysis


def _assemble(
    prepared: Prepared, variants: list[VariantResult], clock: PhaseClock, inputs: dict[str, InputDigest]
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
            "fingerprint": recipe.fingerprint(inputs),  # the digests it recorded: no file read again
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
        gate_metrics=recipe.gate.gated_metrics if recipe.gate.metrics else (),
        reference=recipe.all_variants()[0].name,
        variants=tuple(variants),
        frontier=compute_frontier(variants, recipe.gate.metric),
        timings=dict(clock.seconds),
        dropped_nonfinite=prepared.dropped_nonfinite,
        kept_nonfinite=prepared.kept_nonfinite,
        distinct_inputs=prepared.distinct_inputs,
        inputs={name: {"path": entry.path, "sha256": entry.sha256} for name, entry in inputs.items()},
        complete=True,
        finished_at=utc_now(),
    )


def _publish(recipe: Recipe, results: SweepResults, progress: _Progress, started: float) -> SweepOutcome:
    """Write the complete results.json first (so nothing measured is lost), then the plot, the reports and MLflow."""
    run_dir, clock = progress.run_dir, progress.clock
    t = time.perf_counter()
    gate = evaluate_gate(results, recipe.gate, slo=recipe.slo)
    for note in (*mixed_timing_machines(results), *contention_notes(results)):
        logger.warning(note, extra={SHOWN_IN_SUMMARY: True})  # for a library's caller: the CLI prints the summary
    with progress.guard.shielded():  # a signal now waits for the reports too (a second or so): complete, or not at all
        results_path = write_results(results, run_dir / RESULTS_FILE)
        mark_complete(run_dir)
        progress.results_complete = True
        threshold = gate_threshold(results, recipe.gate)
        plot_path = write_frontier_svg(results, run_dir / "frontier.svg", threshold=threshold)
        report_path = write_markdown_report(results, gate, plot_path, run_dir / "report.md")
        html_path = write_html_report(results, gate, run_dir / "report.html")
    clock.add("report", t)
    run_id = failure = None
    if progress.tracker is not None:
        t = time.perf_counter()
        artifacts = [recipe.source, results_path, report_path, html_path, plot_path]
        try:
            with progress.guard.shielded():
                run_id = progress.tracker.close(results, recipe, gate, [a for a in artifacts if a is not None])
        except Exception as exc:  # noqa: BLE001 - results are on disk; say where, then fail
            raise QbenchError(f"logging to MLflow failed ({exc})") from exc  # stop() says where the results are
        tracker, failure = progress.tracker, progress.tracker.failure
        progress.tracker = None  # the runs are ended: an interruption from here on must not end them KILLED again
        tracker.end()
        clock.add("track", t)
    timings = {**clock.seconds, "total": time.perf_counter() - started}
    results = _with_timings(results, timings)
    write_results(results, results_path, what="the sweep's timings into the complete results")
    return SweepOutcome(results, gate, run_dir, results_path, report_path, plot_path, run_id, failure)


def _with_timings(results: SweepResults, timings: dict[str, float]) -> SweepResults:
    return replace(results, timings={k: round(v, 4) for k, v in timings.items()})
