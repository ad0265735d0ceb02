"""Executors run a plan's jobs; the scheduler (qbench.execute.scheduler) decides which job runs when.

An executor is told to `start` a job with its `Work` (what to build or measure, and which earlier job's
outputs are its reference) and hands back finished jobs one at a time (`next_done`). Both executors run
the same job functions (qbench.execute.jobs):

    local   in this process, one job at a time, in plan order (no Ray import)
    ray     as Ray tasks on a cluster, as many at once as the cluster's resources allow
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from qbench.errors import MissingExtraError
from qbench.execute.jobs import (
    BuildOutput,
    MeasureOutput,
    Outputs,
    fp32_reference,
    run_build,
    run_measure,
)
from qbench.execute.plan import Job, JobNeeds
from qbench.execute.store import BuildStore
from qbench.preflight.prepare import Prepared
from qbench.recipe.spec import Recipe, VariantSpec
from qbench.results.schema import AccuracyResult
from qbench.variants.base import BuiltVariant

RAY_EXTRA = "ray"


@dataclass(frozen=True)
class BuildWork:
    spec: VariantSpec
    key: str
    search: tuple[str, str | None] | None = None  # (first backend, the job whose outputs are the reference)
    reference_accuracy: AccuracyResult | None = None


@dataclass(frozen=True)
class MeasureWork:
    backend: str
    built: BuiltVariant
    key: str
    reference_job: str | None  # the job whose outputs are the reference; None: compare with its own outputs
    reference_accuracy: AccuracyResult | None
    keep_outputs: bool  # hand the outputs back (the reference's, which later jobs and a resume need)


Work = BuildWork | MeasureWork


@dataclass(frozen=True)
class JobDone:
    """A job that ended: its output, or why the worker running it was lost (the job may run again)."""

    job: str
    output: BuildOutput | MeasureOutput | None
    lost: str | None = None
    retry: bool = True  # False: the job is failed for good, `lost` saying why (it ran past `executor.timeout_s`)


class Executor(Protocol):
    name: str
    capacity: int  # jobs it runs at once
    in_process: bool  # runs them in the sweep's process: one that crashes there takes the sweep with it

    def start(self, job: Job, work: Work) -> None: ...

    def next_done(self) -> JobDone:
        """Block until a started job ends."""
        ...

    def provide_outputs(self, job_id: str, outputs: Outputs) -> None:
        """Outputs of a job finished in an earlier run (a resumed reference), for the jobs that compare with it."""
        ...

    def record_with(self, record: Callable[[str, MeasureOutput], None]) -> None:
        """`record(job, output)` makes a finished measurement durable (the driver's job record): an executor running
        jobs in this process calls it inside the job, before the job returns, so that no signal between the job's
        end and `next_done`'s caller loses it; one running them elsewhere leaves it to the driver."""
        ...

    def where(self) -> str:
        """Where the jobs run, for the progress lines."""
        ...

    def check_needs(self, needs: set[JobNeeds]) -> None:
        """Raise a QbenchError naming what is missing when some kind of job could never be placed."""
        ...

    def close(self) -> None: ...


class LocalExecutor:
    """Runs each job in this process when it is its turn: the sweep as it always ran, one job at a time."""

    name = "local"
    capacity = 1
    in_process = True

    def __init__(self, prepared: Prepared, store: BuildStore) -> None:
        self._prepared = prepared
        self._store = store
        self._queue: deque[tuple[Job, Work]] = deque()
        self._outputs: dict[str, Outputs] = {}
        self._record: Callable[[str, MeasureOutput], None] | None = None

    def record_with(self, record: Callable[[str, MeasureOutput], None]) -> None:
        self._record = record

    def start(self, job: Job, work: Work) -> None:
        self._queue.append((job, work))

    def provide_outputs(self, job_id: str, outputs: Outputs) -> None:
        self._outputs[job_id] = outputs

    def next_done(self) -> JobDone:
        job, work = self._queue.popleft()
        if isinstance(work, BuildWork):
            search = None
            if work.search is not None:
                backend, reference_job = work.search
                outputs = self._outputs.get(reference_job) if reference_job else None
                search = (backend, fp32_reference(outputs, work.reference_accuracy))
            return JobDone(
                job.id,
                run_build(work.spec, self._prepared, self._store, work.key, search),
            )
        outputs = self._outputs.get(work.reference_job) if work.reference_job else None
        record = self._record
        done = run_measure(work.backend, work.built, self._prepared, fp32_reference(outputs, work.reference_accuracy),
                           keep_outputs=work.keep_outputs,
                           record=(lambda output: record(job.id, output)) if record is not None else None)  # fmt: skip
        if work.keep_outputs and done.outputs is not None:
            self._outputs[job.id] = done.outputs
        return JobDone(job.id, done)

    def where(self) -> str:
        return "this process"

    def check_needs(self, needs: set[JobNeeds]) -> None:
        """Nothing to place: every job runs here (the backends were checked when the recipe was prepared)."""

    def close(self) -> None:
        self._queue.clear()


def make_executor(recipe: Recipe, prepared: Prepared, store: BuildStore) -> Executor:
    """The recipe's executor (`executor.kind`); Ray is imported only for `ray`, with an error naming the extra."""
    if recipe.executor.kind == "local":
        return LocalExecutor(prepared, store)
    from qbench.execute.ray_executor import RayExecutor
    from qbench.provenance import input_digests

    # the workers read the driver's snapshot (a sweep's), or one of the inputs as they are now
    inputs = prepared.snapshot.inputs if prepared.snapshot is not None else input_digests(recipe)
    return RayExecutor(recipe, store, inputs)


RAY_NO_FAILURE_SIGNAL_HANDLER = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"  # read when ray is imported


def import_ray() -> object:
    """The `ray` module; without it, an error naming the extra (executor 'ray' is the only user).

    Imported first here, Ray leaves its C++ failure-signal handler out of this process (the driver; its workers,
    started later, keep theirs): that handler also takes SIGTERM, which then never reaches the sweep's handler as
    it should (a sweep stopped while Ray started crashed on exit, status -11), and Ray's stop sets SIGTERM's action
    back to the default. RAY_DISABLE_FAILURE_SIGNAL_HANDLER=0 in the environment keeps it.
    """
    unset = RAY_NO_FAILURE_SIGNAL_HANDLER not in os.environ
    if unset:
        os.environ[RAY_NO_FAILURE_SIGNAL_HANDLER] = "1"
    try:
        import ray
    except ImportError:
        raise MissingExtraError("Ray (for `executor: {kind: ray}`)", RAY_EXTRA) from None
    finally:
        if unset:  # not inherited by the processes Ray starts
            del os.environ[RAY_NO_FAILURE_SIGNAL_HANDLER]
    return ray
