"""What `qbench sweep --resume` does with each job of a plan, and why.

One set of rules, which the resumed sweep acts on (qbench.execute.scheduler) and `qbench sweep --plan` shows
(qbench.execute.overview), so that what the plan says is what the resume does. Per job:

    reuse    a build in the store; a finished measurement of exactly that build; a job that failed for the
             variant's own reason (it would fail again); a measurement whose build is reused as failed
    re-run   a job recorded by the run taken up that failed for a reason outside the variant (out of memory, a
             full disk, a lost worker: qbench.errors.environment_cause), or whose build runs again; a measurement
             made with another runtime or on another kind of machine than this resume's (`measured_with`), or
             relative to an FP32 reference measurement that runs again (`reference_again`), or recorded by a qbench
             that did not record every kind of evidence this one's results claim (qbench.results.evidence), or by
             a run whose recipe's code imported a module of the user's project that has changed since (`code_changes`)
    new      a job the run taken up did not record

A job the sweep's process died running (a native crash, the out-of-memory killer: qbench.execute.records) is failed,
reused as such: run again, it would most likely kill the sweep again, and the gate fails closed on it.

`rerun_failed` (`--resume --rerun-failed`) runs again every job recorded as failed, whatever the reason: the user
fixed a cause the plan does not see (a package upgraded, a device freed, code outside the input digests), and the
measurements of a build that runs again run with it; every other job is reused as without it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbench.errors import QbenchError, one_line
from qbench.execute.plan import Job, SweepPlan, measure_id
from qbench.execute.records import JobRecord, failed_jobs, finished_run, read_records, resumable_run
from qbench.provenance import PROJECT_MODULE_INPUT, changed_inputs, code_modules, recorded_module_files
from qbench.results.evidence import unrecorded

if TYPE_CHECKING:  # pragma: no cover
    from qbench.recipe.spec import Recipe

REUSE, RERUN, NEW = "reuse", "re-run", "new"


def runs_onnx_file(backend: str) -> bool:
    """Whether `backend` runs a variant's ONNX file (its results record the file's digest), not its torch module
    (whose results record the module's): `decide_measure`'s `ran_file`, for the plan and the resume alike."""
    from qbench.backends import get_backend
    from qbench.backends.base import form_run_by
    from qbench.variants.base import ONNX

    return form_run_by(get_backend(backend)) == ONNX


@dataclass(frozen=True)
class Decision:
    action: str  # REUSE, RERUN or NEW
    why: str
    failed: bool = False  # a failure reused as it is (a build's: its measurements fail with it)
    changes: tuple[str, ...] = ()  # a measurement run again: what differs from what measured it (`rerun_summary`)

    @property
    def reused(self) -> bool:
        return self.action == REUSE


def _error(text: str | None) -> str:
    return one_line(text or "no reason recorded", 120)


def decide_build(record: JobRecord | None, stored: dict[str, Any] | None, run: str, *, rerun_failed: bool = False
                 ) -> Decision:  # fmt: skip
    """A build job: `stored` is the store's reusable manifest of its key (None when there is none), `record` the job's
    record in the run `run` that is taken up; `rerun_failed`: a build failed for the variant's own reason runs again."""
    run = _recorded_in(record, run)
    if stored is not None:
        return Decision(REUSE, f"finished in {run}" if record is not None and record.manifest == stored else "in store")
    if record is None:
        return Decision(NEW, "not in the store")
    if record.manifest is not None:
        return Decision(RERUN, f"built in {run}, no longer in the store as built")
    if record.died is not None:
        return _died(record.died, run, rerun_failed)
    if record.environment is not None:
        return Decision(RERUN, f"failed in {run} for a reason outside the variant ({record.environment})")
    if rerun_failed:
        return Decision(RERUN, f"failed in {run}, run again (--rerun-failed): {_error(record.error)}")
    return Decision(REUSE,
                    f"failed in {run} for the variant's own reason, which would fail again: {_error(record.error)}",
                    failed=True)  # fmt: skip


def measured_with(backend: str, threads: int | None) -> dict[str, str]:
    """What a measurement on `backend` with `threads` is made with, here: its runtime's package versions and this
    machine's facts (qbench.environment.measurement_facts). Recorded by the job where it ran, and compared by a
    resume with the resuming machine's."""
    from qbench.backends import BACKENDS
    from qbench.backends.base import needs_gpu, runtime_packages
    from qbench.environment import measurement_facts

    backend_class = BACKENDS.get(backend)
    return measurement_facts(runtime_packages(backend_class), threads, gpu=needs_gpu(backend_class))


def decide_measure(
    record: JobRecord | None, run: str, *, build: Decision, built_sha256: str | None, needs_outputs: bool,
    current: Mapping[str, str], reference_again: bool = False, rerun_failed: bool = False, ran_file: bool = True,
    code: tuple[str, ...] = (),
) -> Decision:
    """A measure job: `build` is its variant's build decision, `built_sha256` the model digest of that build when
    it is reused (qbench.provenance.model_sha256), `needs_outputs` whether it gives the reference outputs;
    `rerun_failed`: a measurement failed for the variant's own reason runs again. `ran_file`: the job's backend ran
    that ONNX file, so its result records the file's digest; a torch backend's records its module's
    (qbench.backends.torch_state), which the reused build decides as it decides the file. `current`: what this
    resume measures the job with (`measured_with`): a result made with anything else runs again, so that one table
    never mixes runtimes or machines; `reference_again`: an FP32 measurement its figures are relative to runs again
    (`reference_again`), so must it; `code`: the modules of the user's project that changed since the run that
    recorded it ran them (`code_changes`): its figures (a failure or a crash included) are the old code's."""
    run = _recorded_in(record, run)
    if build.failed:
        return Decision(REUSE, "its build failed: fails with it")
    if record is not None and code:
        return Decision(RERUN, f"measured in {run} with code since changed ({'; '.join(code)})", changes=code)
    if record is not None and record.died is not None:  # its failed result names the build: one reused
        if build.reused:
            return _died(record.died, run, rerun_failed)
        return Decision(RERUN, f"{record.died} in {run}, but its build runs again")
    if record is None or record.result is None:
        return Decision(NEW, "not measured yet")
    if record.environment is not None:
        return Decision(RERUN, f"failed in {run} for a reason outside the variant ({record.environment})")
    if not build.reused:
        return Decision(RERUN, f"measured in {run}, but its build runs again")
    if needs_outputs and record.outputs is None:
        return Decision(RERUN, f"measured in {run} without the reference outputs")
    changes = _changes(record.measured_with, current)
    if changes:
        return Decision(RERUN, f"measured in {run} with {'; '.join(changes)}", changes=changes)
    lacking = _unrecorded(record.evidence)
    if lacking:
        return Decision(RERUN, f"measured in {run} by a qbench that recorded no {lacking}",
                        changes=(f"evidence {lacking} not recorded (an older qbench)",))  # fmt: skip
    result = record.result
    if result.status == "failed" and rerun_failed:
        return Decision(RERUN, f"failed in {run}, run again (--rerun-failed): {_error(result.error)}")
    if result.status == "failed":
        return Decision(REUSE, f"failed in {run} for the variant's own reason, which would fail again: "
                               f"{_error(result.error)}")  # fmt: skip
    if result.status == "skipped":
        return Decision(REUSE, f"skipped in {run}: {_error(result.error)}")
    if ran_file and result.model_sha256 != built_sha256:
        return Decision(RERUN, f"measured another build in {run}")
    if reference_again:
        return Decision(RERUN, f"measured in {run} relative to an FP32 reference that is measured again",
                        changes=(_REFERENCE_AGAIN,))  # fmt: skip
    return Decision(REUSE, f"finished in {run}")


_REFERENCE_AGAIN = "its FP32 reference measured again"
_FACT_NAMES = {"cpu": "CPU", "cpus": "usable CPUs", "cpu_quota": "CPU quota", "machine": "architecture",
               "threads": "threads", "gpu": "GPU"}  # else packages
_NOT_RECORDED = "what measured it not recorded (an older qbench)"
_CODE_NOT_RECORDED = "the project modules its code imported not recorded (an older qbench)"


def _changes(recorded: Mapping[str, str] | None, current: Mapping[str, str]) -> tuple[str, ...]:
    """'<fact> <then> -> <now>' for each fact of what measured a job that differs now; a record without them (written
    by an older qbench) cannot show it was measured alike."""
    if recorded is None:
        return (_NOT_RECORDED,)
    keys = [*current, *(key for key in recorded if key not in current)]
    return tuple(f"{_FACT_NAMES.get(key, key)} {recorded.get(key, 'not recorded')} -> "
                 f"{current.get(key, 'not recorded')}"
                 for key in keys if recorded.get(key) != current.get(key))  # fmt: skip


def _unrecorded(evidence: tuple[str, ...]) -> str:
    """'' when a record's `evidence` holds every kind this qbench records (qbench.results.evidence), else which it
    lacks: results.json claims every kind for what it holds, so a result lacking one would pass checks never applied
    (and a gate told so would refuse the whole file), so it is measured again. The kinds of a recipe's code are the
    resuming sweep's own record (the project modules it imported), never a job's."""
    return ", ".join(e.name for e in unrecorded(evidence, slo=True, names_code=False))


def code_changes(recorded: Mapping[str, str] | None, recipe: Recipe) -> tuple[str, ...]:
    """'python module <name> changed' (or 'no longer found') for each module of the user's project whose digest a run
    recorded (`recorded`: its plan's `project_modules`) and whose file, found by its name as an import from the
    recipe's folder finds it, differs now: the gate's rule (qbench.gate.fresh.stale_inputs), applied before anything
    is imported, so `--plan` and the resume say the same. A run that recorded none (an older qbench) cannot show the
    code it ran was this one, for a recipe that names code."""
    if recorded is None:
        return (_CODE_NOT_RECORDED,) if code_modules(recipe) else ()
    files = recorded_module_files(recorded, recipe)
    edited = set(changed_inputs({name: {"sha256": recorded[name]} for name in files}, files).changed)
    return tuple(f"python module {name.removeprefix(PROJECT_MODULE_INPUT)} "
                 + ("no longer found" if name not in files else "changed")
                 for name in recorded if name not in files or name in edited)  # fmt: skip


def code_changes_by_run(recipe: Recipe) -> Callable[[JobRecord | None], tuple[str, ...]]:
    """`code_changes` of the run that recorded a job record (every record of one run shares them: hashed once)."""
    found: dict[str, tuple[str, ...]] = {}

    def changes(record: JobRecord | None) -> tuple[str, ...]:
        if record is None:
            return ()
        if record.run not in found:
            found[record.run] = code_changes(record.project_modules, recipe)
        return found[record.run]

    return changes


def reference_again(job: Job, plan: SweepPlan, decisions: Mapping[str, Decision]) -> bool:
    """Whether an FP32 measurement `job`'s figures are relative to runs again (decided in `decisions`): the
    reference on its backend (accuracy drops, speed-ups) or the reference outputs (the first backend's)."""
    references = {measure_id(plan.reference, plan.backends[0]), measure_id(plan.reference, str(job.backend))} - {job.id}
    return any(ref in decisions and not decisions[ref].reused for ref in references)


def rerun_summary(decisions: Iterable[Decision]) -> list[str]:
    """One line per kind of difference that runs measurements again ('onnxruntime 1.31.0 -> 1.32.0: 7 measurements
    run again'), in the order first met."""
    counts = Counter(change for decision in decisions for change in decision.changes)
    return [f"{change}: {n} measurement{'' if n == 1 else 's'} run again" for change, n in counts.items()]


def _recorded_in(record: JobRecord | None, run: str) -> str:
    """The run that recorded `record`: `run`, or the earlier run it resumes (qbench.execute.records.read_records)."""
    return record.run if record is not None and record.run else run


def _died(why: str, run: str, rerun_failed: bool) -> Decision:
    if rerun_failed:
        return Decision(RERUN, f"failed in {run}, run again (--rerun-failed): {why}")
    return Decision(REUSE, f"failed in {run}: {why}", failed=True)


def resume_target(root: Path, fingerprint: str, *, rerun_failed: bool = False, crashed: Path | None = None
                  ) -> Path | None:  # fmt: skip
    """The run folder --resume takes up (qbench.execute.records.resumable_run); None when there is none. A
    QbenchError when the newest run of this plan finished and none of its jobs would run again (none failed for a
    reason outside the variant; with `rerun_failed`, none failed): resuming it would change nothing.

    `crashed`: the run folder of the sweep whose process just died, which the supervising `qbench` process resumes
    (qbench.supervisor.RESUME_RUN): that run is taken up, never the newest of the plan (another sweep of the same
    recipe running meanwhile, a second CI job on the runner, wrote a newer one), and a QbenchError where it is no
    run of this plan under `root` that a resume takes up."""
    if crashed is not None:
        named = resumable_run(root, fingerprint, rerun_failed=rerun_failed, only=crashed)
        if named is None:
            raise QbenchError(f"cannot resume the crashed sweep's run {crashed}: expected a run folder under {root} of "
                              "this recipe's plan (the same fingerprint) that a resume takes up")  # fmt: skip
        return named.path
    run = resumable_run(root, fingerprint, rerun_failed=rerun_failed)
    finished = finished_run(root, fingerprint)
    if finished is not None and (run is None
                                 or (finished.recorded_at, finished.path.name) > (run.recorded_at, run.path.name)):
        flag = "--resume --rerun-failed" if rerun_failed else "--resume"
        raise QbenchError(f"{flag}: the newest run of this plan, {finished.path}, "
                          f"finished{_own_failures(finished.path)}: resuming it would change nothing; run `qbench "
                          "sweep` without --resume to measure everything again")  # fmt: skip
    return run.path if run is not None else None


def _own_failures(folder: Path) -> str:
    """What failed in the finished run `folder`, every failure the variant's own: '' when nothing failed."""
    failed = sorted(failed_jobs(read_records(folder)))
    if not failed:
        return " with every job done"
    return (f" and its {len(failed)} failed job{'' if len(failed) == 1 else 's'} ({', '.join(failed)}) failed for "
            "the variant's own reasons, which would fail again (once their cause is fixed outside the recipe and "
            "its input files, `--resume --rerun-failed` runs them again)")
