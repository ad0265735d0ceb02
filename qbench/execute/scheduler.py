"""Run a plan on an executor: start each job once what it waits for has finished, record it when it ends.

The driver (this module, in the sweep's process) is the only writer of the run folder and of MLflow:
each finished job is recorded atomically (qbench.execute.records; a build the store holds but the sweep stopped
before recording is recorded as the sweep stops) and reported to the sweep's progress
(partial results.json, the MLflow child run), whichever executor ran it. It also decides what needs no
job at all: a variant whose build failed fails on every backend, and one identical to an earlier
variant is reported from that variant's measurement.

A job whose worker was lost (killed, out of memory, node gone) runs again, at most `retries` times; after
that it is recorded failed, so the gate fails closed. Resuming (`resume_from`) reuses the finished jobs
of an earlier run of the same plan (interrupted, or finished with jobs failed for reasons outside their variant):
a build whose files are in the store, unchanged, built in this environment, and the measurements of exactly that
build (same model digest); a build or measurement that failed for the variant's own reason, which would fail
again; everything else (a job failed for a reason outside the variant, qbench.errors.environment_cause) runs.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from qbench.backends import get_backend
from qbench.backends.base import form_run_by
from qbench.errors import QbenchError
from qbench.execute.executors import BuildWork, Executor, JobDone, MeasureWork, Work
from qbench.execute.jobs import (
    BuildOutput,
    MeasureOutput,
    failed,
    identical,
    identities,
    is_int8_search,
    with_torch_form,
)
from qbench.execute.plan import Job, SweepPlan, build_facts
from qbench.execute.records import forget_started, read_records, record_build, record_measure, record_started
from qbench.execute.resume import (
    Decision,
    code_changes_by_run,
    decide_build,
    decide_measure,
    measured_with,
    reference_again,
    rerun_summary,
    runs_onnx_file,
)
from qbench.execute.store import BuildStore, built_from_manifest
from qbench.preflight.prepare import Prepared
from qbench.provenance import model_sha256
from qbench.results.schema import AccuracyResult, VariantResult
from qbench.results.search import SearchReport, search_from_dict
from qbench.runs import describe_run, run_folder_writes
from qbench.validate.background import busy_beside_timing, hand_over_beside_timing, settle_before_timing
from qbench.validate.clock import PhaseClock
from qbench.validate.measure import failed_result
from qbench.variants.base import BuiltVariant

logger = logging.getLogger(__name__)

RESUMED_NOTE = "resumed: measured by the "  # a reused result's note, naming the run that measured it


class SweepProgress(Protocol):
    def started(self, variant: str, backend: str) -> None: ...

    def finished(self, result: VariantResult, *, reused: bool = False) -> None: ...


@dataclass
class PlanRun:
    """What running a plan gave: every measurement in plan order, and the builds with calibrated ranges."""

    results: list[VariantResult]
    calibrated: list[BuiltVariant]
    reused: int = 0
    retried: dict[str, int] = field(default_factory=dict)
    search: SearchReport | None = None  # the recipe's INT8 search, when it has one


@dataclass
class _State:
    built: dict[str, BuiltVariant] = field(default_factory=dict)
    build_errors: dict[str, str] = field(default_factory=dict)
    identities: dict[str, dict[str, str]] = field(default_factory=dict)  # variant -> form run -> identity
    measured: dict[str, VariantResult] = field(default_factory=dict)
    reference_accuracy: dict[str, AccuracyResult] = field(default_factory=dict)
    reference_ready: bool = False  # FP32 on the first backend gave outputs every measurement compares with
    done: set[str] = field(default_factory=set)
    running: dict[str, Work] = field(default_factory=dict)
    attempts: Counter[str] = field(default_factory=Counter)
    opened: set[str] = field(default_factory=set)  # variant@backend whose MLflow run is open
    times: dict[str, dict[str, float]] = field(default_factory=dict)  # job -> when it was submitted, ran
    recorded: set[str] = field(default_factory=set)  # measure jobs the executor had recorded as they returned
    search: SearchReport | None = None


class Scheduler:
    def __init__(self, plan: SweepPlan, prepared: Prepared, executor: Executor, store: BuildStore,
                 progress: SweepProgress, run_dir: Path, clock: PhaseClock, *, retries: int) -> None:  # fmt: skip
        self.plan = plan
        self.prepared = prepared
        self.executor = executor
        self.store = store
        self.progress = progress
        self.run_dir = run_dir
        self.models = run_dir / "models"
        self.clock = clock
        self.retries = retries
        self.state = _State()
        self.specs = {spec.name: spec for spec in prepared.recipe.planned_variants()}
        self.reference_job = f"measure:{plan.reference}@{plan.backends[0]}"
        executor.record_with(self._record_returned)

    # -- the loop ----------------------------------------------------------------------------------

    def run(self, *, resume: bool = False, resume_from: Path | None = None, rerun_failed: bool = False,
            keep_failed: frozenset[str] = frozenset()) -> PlanRun:  # fmt: skip
        reused = self._resume(resume_from, rerun_failed, keep_failed) if resume else 0
        pending = [job for job in self.plan.jobs if job.id not in self.state.done]
        logger.info("%d jobs (%d to run) on %s", len(self.plan.jobs), len(pending), self.executor.where())
        try:
            while pending or self.state.running:
                pending = self._start_ready(pending)
                if not self.state.running:
                    if pending:  # cannot happen with a plan from make_plan: every job's dependencies come first
                        raise RuntimeError(f"no job can start: {[job.id for job in pending]}")
                    break
                self._finish(self.executor.next_done())
        finally:
            self.executor.close()
            self._record_published_builds()
            if self.executor.in_process:  # stopped here, by a signal or an error: no job died in this process
                for job_id in self.state.running:
                    forget_started(self.run_dir, job_id)
        results = [self.state.measured[job.id] for job in self.plan.jobs if job.kind == "measure"]
        calibrated = [b for spec in self.specs if (b := self.state.built.get(spec)) and b.activation_ranges]
        retried = {job: n for job, n in self.state.attempts.items() if n > 1}
        return PlanRun(results, calibrated, reused, retried, self.state.search)

    def _record_published_builds(self) -> None:
        """Record the builds this sweep started and the store now holds, though the sweep stopped before it recorded
        them (a signal right after a build returned, before its record): with no record, `--resume` would not take
        this run up. What cannot be read or written here is logged; the reason the sweep stopped stands."""
        for job_id in sorted(self.state.times.keys() - self.state.done):
            job = self.plan.job(job_id)
            if job.kind != "build":
                continue
            try:
                manifest = self.store.manifest(job.build_key)
                if manifest is not None:
                    record_build(self.run_dir, job.id, self.state.attempts[job.id], manifest, None, self._times(job.id))
            except (OSError, QbenchError) as exc:
                logger.warning("%s: cannot record the finished build of %s (%s): a resume builds it again",
                               self.run_dir, job.id, exc)  # fmt: skip

    def _start_ready(self, pending: list[Job]) -> list[Job]:
        """Start (or settle without running) every job whose dependencies are done, in plan order; in this process,
        while work beside the measurements is busy (the MLflow logging: qbench.validate.background), jobs that time
        nothing (builds) first, the work held handed over as they start. A job that times waits here for the work
        handed over to settle, so that a store refusing the sweep's runs stops the sweep here, not inside a job."""
        here = self.executor.in_process
        order = sorted(pending, key=lambda job: job.needs.timing) if here and busy_beside_timing() else pending
        started: set[str] = set()
        for job in order:
            if len(self.state.running) >= self.executor.capacity or not self._ready(job):
                continue
            started.add(job.id)
            settled = self._settle(job) if job.kind == "measure" else None
            if settled is not None:
                self._measured(job, settled, None)
                continue
            work = self._work(job)
            if job.needs.timing and here:  # what is held stays so: the job hands it over where it times nothing
                t = time.perf_counter()
                settle_before_timing(keep_held=True)
                self.clock.add("track", t)  # waiting for it is MLflow's cost (as in measure)
            else:  # a build times nothing; a job run elsewhere times nothing here
                hand_over_beside_timing()
            if job.needs.timing:  # a build that times nothing opens no run: its variant's measurement does
                self._open(job.variant, job.backend or self.plan.backends[0])
            self._submit(job, work)
        return [job for job in pending if job.id not in started]

    def _submit(self, job: Job, work: Work) -> None:
        self.state.running[job.id] = work
        self.state.attempts[job.id] += 1
        self.state.times[job.id] = {"submitted": time.time()}
        if self.executor.in_process:
            record_started(self.run_dir, job.id, self.state.attempts[job.id])
        self.executor.start(job, work)

    def _ready(self, job: Job) -> bool:
        if not all(dep in self.state.done for dep in job.after):
            return False
        twin = self._twin(job)
        return twin is None or twin in self.state.done

    def _twin(self, job: Job) -> str | None:
        """The measurement of an earlier variant identical to this one, on the same backend."""
        if job.kind != "measure" or job.variant not in self.state.identities:
            return None
        form = form_run_by(get_backend(job.backend))
        mine = self.state.identities[job.variant][form]
        for earlier in self.specs:
            if earlier == job.variant:
                return None
            if self.state.identities.get(earlier, {}).get(form) == mine:
                return f"measure:{earlier}@{job.backend}"
        return None

    def _settle(self, job: Job) -> VariantResult | None:
        """The result of a measure job that needs no run (failed build, identical twin); None if it must run."""
        assert job.backend is not None
        spec = self.specs[job.variant]
        if job.variant in self.state.build_errors:
            return failed(
                spec.name,
                spec.precision,
                job.backend,
                self.state.build_errors[job.variant],
            )
        twin = self._twin(job)
        if twin is not None:
            return identical(self.state.built[job.variant], self.state.measured[twin])
        return None

    def _work(self, job: Job) -> Work:
        first = self.plan.backends[0]
        reference = self.reference_job if self.state.reference_ready else None
        if job.kind == "build":
            search = (job.backend, reference) if job.backend is not None else None
            return BuildWork(
                self.specs[job.variant],
                job.build_key,
                search,
                self.state.reference_accuracy.get(first),
            )
        assert job.backend is not None
        is_reference = job.id == self.reference_job
        # a variant's drops are taken against FP32 on its backend; FP32's own on a later backend against the first's
        # (results_evidence 'fp32_drops'): the gate judges it against that one as it judges a variant
        against = first if job.variant == self.plan.reference else job.backend
        return MeasureWork(
            backend=job.backend, built=self.state.built[job.variant], key=job.build_key,
            reference_job=None if is_reference else reference,
            reference_accuracy=None if is_reference else self.state.reference_accuracy.get(against),
            keep_outputs=is_reference,
        )  # fmt: skip

    def _open(self, variant: str, backend: str) -> None:
        key = f"{variant}@{backend}"
        if key not in self.state.opened:
            self.state.opened.add(key)
            self.progress.started(variant, backend)

    # -- finished jobs -----------------------------------------------------------------------------

    def _finish(self, done: JobDone) -> None:
        job = self.plan.job(done.job)
        work = self.state.running.pop(job.id)
        attempts = self.state.attempts[job.id]
        if done.output is None:
            if attempts <= self.retries and done.retry:
                logger.warning("  worker lost running %s (%s): running it again (attempt %d of %d)", job.id, done.lost,
                               attempts + 1, self.retries + 1)  # fmt: skip
                self._submit(job, work)
                return
            error = f"worker lost {attempts} times, last: {done.lost}" if done.retry else str(done.lost)
            if job.kind == "build":
                self._built(job, BuildOutput(job.variant, None, error, environment=error))
            else:
                assert isinstance(work, MeasureWork)
                result = failed_result(work.built, get_backend(work.backend), error)
                self._measured(job, result, None, environment=error)
            return
        self.clock.merge(done.output.seconds)
        self._ran(job.id, done.output)
        if isinstance(done.output, BuildOutput):
            self._built(job, done.output)
        else:
            output: MeasureOutput = done.output
            self._measured(job, output.result, output.outputs, where=output.where, environment=output.environment,
                           measured_with=output.measured_with,
                           record=job.id not in self.state.recorded)  # fmt: skip

    def _ran(self, job_id: str, output: BuildOutput | MeasureOutput) -> None:
        if output.span is not None:
            self.state.times[job_id].update(zip(("started", "ended"), output.span, strict=True))

    def _record_returned(self, job_id: str, output: MeasureOutput) -> None:
        """Record a measurement as the job returns it, in the job (an executor running it in this process, shielded
        from signals): a signal before `_finish` then leaves it for `--resume`, which reuses it as it reuses any
        record (the same plan, the same build's model digest, read back whole)."""
        self._ran(job_id, output)
        self._record_measure(self.plan.job(job_id), self._local_paths(output.result), output.outputs,
                             output.environment,
                             output.measured_with)  # fmt: skip
        self.state.recorded.add(job_id)

    def _built(self, job: Job, output: BuildOutput, *, record: bool = True) -> None:
        variant = job.variant
        if record:
            record_build(
                self.run_dir,
                job.id,
                self.state.attempts[job.id],
                output.manifest,
                output.error,
                self._times(job.id),
                output.environment,
            )
        report = output.search if output.manifest is None else output.manifest.get("search")
        if report is not None:
            self.state.search = search_from_dict(report)
        if output.manifest is None:
            self.state.build_errors[variant] = output.error or "build failed"
        else:
            with run_folder_writes(self.run_dir):
                self.store.materialise(job.build_key, output.manifest, self.models)
            built = built_from_manifest(output.manifest, self.models, self.prepared.source.onnx_path)
            if not is_int8_search(self.specs[variant], self.prepared):  # the search's pick runs as built (ONNX)
                built = with_torch_form(built, self.specs[variant], self.prepared, output.torch_module)
            self.state.built[variant] = built
            self.state.identities[variant] = identities(built)
        self.state.done.add(job.id)
        self._report(f"{job.id}: {'built' if output.manifest else 'failed'}", output.where)

    def _measured(self, job: Job, result: VariantResult, outputs: object, *, where: str = "", record: bool = True,
                  reused: bool = False, environment: str | None = None, measured_with: dict[str, str] | None = None
                  ) -> None:  # fmt: skip
        """Keep a measure job's result; `reused`: taken from an earlier run, so no work on it is started;
        `environment`: why it failed, when for a reason outside the variant; `measured_with`: what measured it where
        it ran (None: settled here, by this machine)."""
        assert job.backend is not None
        result = self._local_paths(result)
        if job.variant == self.plan.reference and result.accuracy is not None:
            self.state.reference_accuracy.setdefault(job.backend, result.accuracy)
            if job.id == self.reference_job and outputs is not None:
                self.state.reference_ready = True
        if record:
            self._record_measure(job, result, outputs, environment, measured_with)
        self.state.measured[job.id] = result
        self.state.done.add(job.id)
        if not reused:
            self._open(job.variant, job.backend)
        self.progress.finished(result, reused=reused)
        self._report(f"{job.id}: {result.status}", where)

    def _record_measure(self, job: Job, result: VariantResult, outputs: object, environment: str | None,
                        measured_with: dict[str, str] | None = None) -> None:  # fmt: skip
        record_measure(self.run_dir, job.id, max(self.state.attempts[job.id], 1), result,
                       outputs if job.id == self.reference_job else None,  # type: ignore[arg-type]
                       self._times(job.id), environment, measured_with or self._measured_with(job))  # fmt: skip

    def _measured_with(self, job: Job) -> dict[str, str]:
        """What this machine measures `job` with (qbench.execute.resume.measured_with)."""
        return measured_with(str(job.backend), self.prepared.recipe.latency.threads)

    def _times(self, job_id: str) -> dict[str, float] | None:
        """When a job that ran was submitted, started, ended and (now) recorded; None for a job settled here."""
        times = self.state.times.get(job_id)
        return {**times, "recorded": time.time()} if times is not None else None

    def _local_paths(self, result: VariantResult) -> VariantResult:
        """A result measured on another node names its model where that node had it: name the run folder's copy."""
        paths = {
            "model_path": result.model_path,
            "evaluated_model_path": result.evaluated_model_path,
        }
        local = {k: str(self.models / Path(v).name) for k, v in paths.items() if v and not Path(v).is_file()}
        return replace(result, **{k: v for k, v in local.items() if Path(v).is_file()})

    def _report(self, what: str, where: str) -> None:
        total = len(self.plan.jobs)
        finished = len(self.state.done)
        running = len(self.state.running)
        place = f" on {where}" if where and self.executor.name != "local" else ""
        logger.info("  [%d/%d jobs done · %d running · %d left] %s%s", finished, total, running,
                    total - finished - running, what, place)  # fmt: skip

    # -- resume ------------------------------------------------------------------------------------

    def _resume(self, folder: Path | None, rerun_failed: bool, keep_failed: frozenset[str]) -> int:
        """Take over the builds in the store and the still-valid finished jobs of `folder` (the rules of
        qbench.execute.resume, which `qbench sweep --plan` shows; `rerun_failed`: its failed jobs run again, but for
        those in `keep_failed`); returns how many."""
        records = read_records(folder) if folder is not None else {}
        reference = model_sha256(self.prepared.source.onnx_path)  # builds from another FP32 model are not reused
        name = folder.name if folder is not None else ""
        builds: dict[str, Decision] = {}
        measures: dict[str, Decision] = {}
        code = code_changes_by_run(self.prepared.recipe)
        reused = 0
        for job in self.plan.jobs:
            record = records.get(job.id)
            again = rerun_failed and job.id not in keep_failed
            if job.kind == "build":
                # this machine's, for the key's build
                facts = build_facts(self.prepared.recipe, self.specs[job.variant])
                stored = self.store.reusable(job.build_key, facts, reference)
                builds[job.variant] = decision = decide_build(record, stored, name, rerun_failed=again)
                if stored is not None:
                    self._built(job, BuildOutput(job.variant, stored, where="the build store"))
                elif decision.reused:  # the variant's own failure: built again, it would fail again
                    assert record is not None
                    self._built(job,
                                BuildOutput(job.variant, None, record.error or record.died, where="an earlier run"))
                reused += decision.reused
                continue
            built = self.state.built.get(job.variant)
            ran_file = runs_onnx_file(str(job.backend))
            decision = measures[job.id] = decide_measure(
                record, name, build=builds[job.variant],
                built_sha256=model_sha256(built.onnx_path) if built is not None else None,
                needs_outputs=job.id == self.reference_job, current=self._measured_with(job),
                reference_again=reference_again(job, self.plan, measures), rerun_failed=again, ran_file=ran_file,
                code=code(record))
            if decision.reused and record is not None and record.died is not None and not builds[job.variant].failed:
                died = failed_result(self.state.built[job.variant], get_backend(str(job.backend)), record.died)
                self.state.attempts[job.id] = record.attempts
                self._measured(job, died, None, where="an earlier run", reused=True)
                reused += 1
            elif decision.reused and not builds[job.variant].failed:
                # else it fails with its build (settled when ready)
                assert record is not None and record.result is not None and folder is not None
                notes = record.result.notes
                if not any(note.startswith(RESUMED_NOTE) for note in notes):  # else reused before: it names that run
                    notes = (*notes, _measured_by(folder.parent / (record.run or folder.name)))
                result = replace(record.result, notes=notes,
                                 model_path=str(self.state.built[job.variant].onnx_path) if ran_file else None,
                                 evaluated_model_path=self._carried(record.result.evaluated_model_path))  # fmt: skip
                if record.outputs is not None:
                    self.executor.provide_outputs(job.id, record.outputs)
                self._measured(job, result, record.outputs, where="an earlier run", reused=True,
                               measured_with=record.measured_with)  # fmt: skip
                reused += 1
        for line in rerun_summary(measures.values()):
            logger.warning("resuming: %s", line)
        source = f"the build store and {folder}" if folder is not None else "the build store"
        logger.info("resuming: %d of %d jobs reused from %s", reused, len(self.plan.jobs), source)
        return reused

    def _carried(self, path: str | None) -> str | None:
        """A file the interrupted run wrote while measuring (an emulation's scored model), copied into this run's
        models folder: the results name this run's files, which outlive the interrupted run."""
        if path is None:
            return None
        source, target = Path(path), self.models / Path(path).name
        if not target.exists() and source.is_file():
            with run_folder_writes(self.run_dir):
                shutil.copyfile(source, target)
        return str(target) if target.exists() else path


def _measured_by(folder: Path) -> str:
    """The note of a result reused from the run `folder`, which measured it."""
    earlier = describe_run(folder)
    return f"{RESUMED_NOTE}{'run' if earlier is not None and earlier.complete else 'interrupted run'} {folder.name}"


def run_plan(plan: SweepPlan, prepared: Prepared, executor: Executor, store: BuildStore, progress: SweepProgress,
             run_dir: Path, clock: PhaseClock, *, retries: int, resume: bool = False,
             resume_from: Path | None = None, rerun_failed: bool = False, keep_failed: frozenset[str] = frozenset(),
             ) -> PlanRun:  # fmt: skip
    """Run every job of `plan` (see the module docstring); the executor is closed when this returns.

    With `resume`, builds already in the store and the finished jobs of `resume_from` are reused (with
    `rerun_failed`, not its failed ones but for those in `keep_failed`)."""
    started = time.perf_counter()
    try:
        scheduler = Scheduler(plan, prepared, executor, store, progress, run_dir, clock, retries=retries)
        return scheduler.run(resume=resume, resume_from=resume_from, rerun_failed=rerun_failed, keep_failed=keep_failed)
    finally:
        clock.add("jobs", started)
