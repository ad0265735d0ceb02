"""What a run folder keeps of its jobs, so an interrupted sweep can be resumed.

    <run>/plan.json                 the plan: its fingerprint, every job, the run it resumes (`resumes`) and the
                                    digest of each module of the user's project its recipe's code imported
                                    (`project_modules`: the code every job of the run ran)
    <run>/jobs/<job>.json           one finished job (written atomically by the driver as it finishes; a
                                    measurement in the sweep's process, inside its job: qbench.execute.jobs)
    <run>/jobs/<job>.outputs.npz    FP32's evaluated outputs on the first backend (the reference)
    <run>/jobs/<job>.started        a job running in the sweep's own process, written before it starts and removed
                                    when the sweep stops it; left with no record, the process died running it

A record of a job that ran also keeps when (`times`, epoch seconds): `submitted` to the executor and
`recorded` by the driver (the driver's clock), `started` and `ended` where it ran (that node's clock). A measurement's
record keeps what measured it (`measured_with`) and the kinds of evidence its qbench records (`evidence`, from
qbench.results.evidence): a resume reuses it only where both are today's (qbench.execute.resume).

A job that failed for a reason outside the variant (qbench.errors.environment_cause: out of memory, a full disk,
a worker lost after its retries) says why in `environment`. A job the sweep's process died running (a native crash,
the out-of-memory killer: no Python code could record it) is read back as `died`, with the signal when the supervising
`qbench` process recorded it (qbench.supervisor.DIED_FILE): resumed, it is failed, not run again to crash again. A
sweep that ran supervised with nothing recorded was ended from outside (the whole process tree killed: a cancelled CI
job; or a signal its supervising process passed on: the terminal closed); the job it was running is no cause and runs
again.

`qbench sweep --resume` picks the newest run of the recipe whose plan has the same fingerprint
(qbench.execute.plan.plan_fingerprint) that is incomplete and recorded a finished job, or finished with such an
environment failure, and reuses its finished jobs (see qbench.execute.scheduler for which ones): in a finished
run, every job but those failed ones. Each record carries the digest of its
content (and of its outputs file): one that cannot be read back (a truncated JSON or .npz) or that changed
since it was written is logged and left out, and its job runs again.

A resumed run records each job it takes over as it takes it over; one stopped before it had (a signal or a crash
while it read them back) would otherwise hide the rest behind its own few records, the newest run of the plan: a run's
records are its own, and for every job it did not record, those of the run it resumes (plan.json's `resumes`, a
folder beside it with the same fingerprint), and so on down the chain.
"""

from __future__ import annotations

import json
import logging
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from qbench.digests import file_sha256
from qbench.errors import QbenchError
from qbench.execute.plan import SweepPlan
from qbench.files import replace_atomically, write_atomically
from qbench.results.evidence import RECORDED, evidence_from_dict
from qbench.results.schema import VariantResult, canonical_sha256, to_jsonable, variant_from_dict
from qbench.runs import RunFolder, describe_run, ran_supervised, running_here
from qbench.supervisor import DIED_FILE, JOBS_FOLDER, STARTED

logger = logging.getLogger(__name__)

PLAN_FILE = "plan.json"
RECORD_DIGEST = "digest"  # sha256 of the record's canonical JSON without this field
RESUMES = "resumes"  # plan.json: the name of the run folder this run resumes
PROJECT_MODULES = "project_modules"  # plan.json: input name -> sha256 of each project module the recipe's code imported


@dataclass(frozen=True)
class JobRecord:
    """One finished job read back: a build's manifest (or error), or a measurement's result."""

    job: str
    attempts: int
    manifest: dict[str, Any] | None = None
    error: str | None = None
    result: VariantResult | None = None
    outputs: dict[str, np.ndarray] | None = None
    times: dict[str, float] | None = None  # submitted, started, ended, recorded (see the module docstring)
    environment: str | None = None  # failed for a reason outside the variant: a finished run's --resume runs it again
    died: str | None = None  # the sweep's process died while running it (no result): failed, unless --rerun-failed
    run: str = ""  # the name of the run folder that recorded it (the one taken up, or one it resumes)
    # a measurement's: what measured it (qbench.environment.measurement_facts); None: recorded by an older qbench
    measured_with: dict[str, str] | None = None
    # a measurement's: the kinds of evidence (qbench.results.evidence) the qbench that recorded it records; () when
    # recorded by one from before records kept them
    evidence: tuple[str, ...] = RECORDED
    # input name -> sha256 of each module of the user's project the run that recorded it ran (its plan.json's
    # `project_modules`); None: that run recorded none (an older qbench)
    project_modules: dict[str, str] | None = None


def _file_name(job_id: str) -> str:
    return re.sub(r"[^\w.@+-]", "_", job_id)


def _write_json(path: Path, content: dict[str, Any]) -> None:
    write_atomically(path, json.dumps(content, indent=2, allow_nan=False), what="the job record")


def write_plan(run_dir: Path, plan: SweepPlan, resumes: Path | None = None,
               project_modules: Mapping[str, str] | None = None) -> None:  # fmt: skip
    """`resumes`: the run folder (beside `run_dir`) this run takes up, whose records stand for the jobs it has not
    recorded yet; `project_modules`: input name -> sha256 of each module of the user's project the recipe's code
    imported (qbench.provenance.project_module_digests), the code this run's jobs run, which a resume compares."""
    jobs = [{"id": j.id, "kind": j.kind, "variant": j.variant, "backend": j.backend, "needs": j.needs.describe(),
             "after": list(j.after), "build_key": j.build_key} for j in plan.jobs]  # fmt: skip
    _write_json(
        run_dir / PLAN_FILE,
        {"fingerprint": plan.fingerprint, "reference": plan.reference, "jobs": jobs,
         RESUMES: resumes.name if resumes is not None else None, PROJECT_MODULES: dict(project_modules or {})},
    )


def record_build(
    run_dir: Path,
    job_id: str,
    attempts: int,
    manifest: dict[str, Any] | None,
    error: str | None,
    times: dict[str, float] | None = None,
    environment: str | None = None,
) -> None:
    _write_record(run_dir / JOBS_FOLDER / f"{_file_name(job_id)}.json",
                  {"job": job_id, "attempts": attempts, "manifest": manifest, "error": error, "times": times,
                   "environment": environment})  # fmt: skip


def record_measure(
    run_dir: Path,
    job_id: str,
    attempts: int,
    result: VariantResult,
    outputs: dict[str, np.ndarray] | None,
    times: dict[str, float] | None = None,
    environment: str | None = None,
    measured_with: dict[str, str] | None = None,
) -> None:
    """Write the outputs first (when kept), then the record that refers to them. `measured_with`: the runtime and
    machine facts of where it was measured (qbench.environment.measurement_facts), which a resume compares."""
    name = _file_name(job_id)
    content: dict[str, Any] = {
        "job": job_id,
        "attempts": attempts,
        "result": to_jsonable(result),
        "times": times,
        "environment": environment,
        "measured_with": measured_with,
        "evidence": list(RECORDED),
    }
    if outputs is not None:
        replace_atomically(run_dir / JOBS_FOLDER / f"{name}.outputs.npz",
                           lambda temporary: np.savez(temporary, **outputs),
                           what="the reference outputs", suffix=".npz")  # fmt: skip
        content["outputs"] = f"{name}.outputs.npz"
        content["outputs_sha256"] = file_sha256(run_dir / JOBS_FOLDER / f"{name}.outputs.npz")
    _write_record(run_dir / JOBS_FOLDER / f"{name}.json", content)


def record_started(run_dir: Path, job_id: str, attempts: int) -> None:
    """Before a job runs in the sweep's own process: should the process die in it, a resume knows which job. Not
    synced to the disk (qbench.files): a process that dies leaves its writes with the kernel, and a power loss is no
    fault of the job, which a mark it took away lets run again (as a supervised sweep's resume does with one it
    left)."""
    write_atomically(run_dir / JOBS_FOLDER / f"{_file_name(job_id)}{STARTED}",
                     json.dumps({"job": job_id, "attempts": attempts}), what="the job's mark as started",
                     durable=False)  # fmt: skip


def forget_started(run_dir: Path, job_id: str) -> None:
    """The sweep stopped the job itself (interrupted, an error elsewhere): it did not die in it."""
    try:
        (run_dir / JOBS_FOLDER / f"{_file_name(job_id)}{STARTED}").unlink(missing_ok=True)
    except OSError as exc:
        logger.warning("%s: cannot remove the mark of %s as started (%s): a resume records it failed", run_dir,
                       job_id, exc)  # fmt: skip


def _write_record(path: Path, content: dict[str, Any]) -> None:
    """The record, then the job's mark as started goes (the record says all it said)."""
    _write_json(path, {**content, RECORD_DIGEST: canonical_sha256(to_jsonable(content))})
    forget_started(path.parent.parent, str(content["job"]))


def read_records(run_dir: Path) -> dict[str, JobRecord]:
    """Every readable job record of a run folder (a damaged one is logged and left out: its job runs again), and for
    each job it did not record, the record of the run it resumes (see the module docstring)."""
    return _chained_records(run_dir, set())


def _chained_records(run_dir: Path, seen: set[Path]) -> dict[str, JobRecord]:
    seen.add(run_dir.resolve())
    records = _own_records(run_dir)
    earlier = _resumed(run_dir)
    if earlier is not None and earlier.resolve() not in seen:
        for job, record in _chained_records(earlier, seen).items():
            records.setdefault(job, record)
    return records


def _resumed(run_dir: Path) -> Path | None:
    """The run folder `run_dir` resumes, when its plan names one beside it with the same fingerprint."""
    plan = _plan(run_dir)
    name = plan.get(RESUMES) if plan is not None else None
    if plan is None or not isinstance(name, str) or not name or Path(name).name != name:
        return None
    earlier = _plan(run_dir.parent / name)
    if earlier is None or earlier.get("fingerprint") != plan.get("fingerprint"):
        return None
    return run_dir.parent / name


def _plan(run_dir: Path) -> dict[str, Any] | None:
    try:
        plan = json.loads((run_dir / PLAN_FILE).read_text())
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, dict) else None


def _project_modules(run_dir: Path) -> dict[str, str] | None:
    """The project modules' digests `run_dir`'s plan records (`write_plan`); None when it records none."""
    plan = _plan(run_dir)
    modules = plan.get(PROJECT_MODULES) if plan is not None else None
    if not isinstance(modules, dict):
        return None
    return {str(name): str(sha) for name, sha in modules.items()}


def _own_records(run_dir: Path) -> dict[str, JobRecord]:
    records: dict[str, JobRecord] = {}
    modules = _project_modules(run_dir)
    for path in _record_files(run_dir):
        try:
            record = replace(_record(json.loads(path.read_text()), path.parent), run=run_dir.name,
                             project_modules=modules)  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
            logger.warning("job record %s cannot be read back (%s: %s): its job runs again", path,
                           type(exc).__name__, exc)  # fmt: skip
            continue
        records[record.job] = record
    running = {job: attempts for job, attempts in _started(run_dir).items() if job not in records}
    death = _death(run_dir) if running else None
    for job, attempts in running.items():
        if death is None:
            logger.warning("%s was running in %s when the sweep's process was ended from outside (killed together "
                           "with its supervising `qbench` process: a cancelled CI job, a runner gone; or a signal "
                           "passed on to it: the terminal closed), no fault of the job: it runs again", job,
                           run_dir)  # fmt: skip
            continue
        records[job] = JobRecord(job, attempts, died=f"the sweep's process died while running it: {death}",
                                 run=run_dir.name, project_modules=modules)  # fmt: skip
    return records


def _started(run_dir: Path) -> dict[str, int]:
    """job -> attempts, for every job marked as started in the sweep's process (an unreadable mark: attempt 1)."""
    started = {}
    for path in _started_files(run_dir):
        try:
            raw = json.loads(path.read_text())
            started[str(raw["job"])] = int(raw["attempts"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("%s cannot be read back (%s): its job is not known to have started", path, exc)
    return started


def _death(run_dir: Path) -> str | None:
    """How the sweep's process died running a job, as the supervising process recorded it (qbench.supervisor); None
    when that process ran supervised and nothing was recorded: it was ended from outside, killed with the supervising
    process or by a signal that process passed on (the job is no cause, it runs again)."""
    try:
        return str(json.loads((run_dir / DIED_FILE).read_text())["cause"])
    except (OSError, ValueError, KeyError, TypeError):
        if ran_supervised(run_dir):
            return None
        return "how is not known (no supervising `qbench` process recorded a signal)"


def _started_files(run_dir: Path) -> list[Path]:
    folder = run_dir / JOBS_FOLDER
    return sorted(folder.glob(f"*{STARTED}")) if folder.is_dir() else []


def _record_files(run_dir: Path) -> list[Path]:
    folder = run_dir / JOBS_FOLDER
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def _record(raw: dict[str, Any], folder: Path) -> JobRecord:
    recorded = raw.pop(RECORD_DIGEST, None)
    if recorded != canonical_sha256(raw):
        raise ValueError("its content does not match its digest (changed after it was written, or written by an "
                         "older qbench)")  # fmt: skip
    outputs = None
    if raw.get("outputs"):
        path = folder / raw["outputs"]
        if file_sha256(path) != raw.get("outputs_sha256"):
            raise ValueError(f"{path} changed after it was written")
        try:
            with np.load(path, allow_pickle=False) as saved:
                outputs = {name: saved[name] for name in saved.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # truncated or gone since
            raise ValueError(f"{path}: {type(exc).__name__}: {exc}") from exc
    result = variant_from_dict(raw["result"]) if raw.get("result") is not None else None
    times = {str(k): float(v) for k, v in raw["times"].items()} if raw.get("times") else None
    environment = str(raw["environment"]) if raw.get("environment") else None
    facts = raw.get("measured_with")
    measured_with = {str(k): str(v) for k, v in facts.items()} if isinstance(facts, dict) else None
    try:
        evidence = evidence_from_dict(raw.get("evidence"))
    except QbenchError as exc:  # a kind this qbench does not know: another qbench's record
        raise ValueError(str(exc)) from exc
    return JobRecord(job=str(raw["job"]), attempts=int(raw["attempts"]), manifest=raw.get("manifest"),
                     error=raw.get("error"), result=result, outputs=outputs, times=times, environment=environment,
                     measured_with=measured_with, evidence=evidence)  # fmt: skip


def resumable_run(root: Path, fingerprint: str, *, rerun_failed: bool = False, only: Path | None = None
                  ) -> RunFolder | None:  # fmt: skip
    """The run `--resume` takes up: the newest run folder under `root` whose plan has `fingerprint` and that is
    either incomplete having recorded a finished job (or one its process died running; never one whose sweep still
    runs on this host: `running_here`), or finished with a job that failed for a reason outside the
    variant (`environment_failures`; with `rerun_failed`, any failed job: `failed_jobs`); None when there is none.
    A run interrupted before any job finished has nothing to resume: an earlier run of the same plan is taken over it.
    `only`: that run folder alone is considered (the one a crashed sweep wrote: qbench.supervisor.RESUME_RUN)."""
    runs_again = failed_jobs if rerun_failed else environment_failures
    candidates = []
    for run in _same_plan(root, fingerprint):
        if only is not None and run.path.resolve() != only.resolve():
            continue
        if run.complete:
            if runs_again(read_records(run.path)):
                candidates.append(run)
        elif (pid := running_here(run.path)) is not None:
            logger.info("run %s is still running (pid %d on this host), not interrupted: not taken up", run.path, pid)
        elif _record_files(run.path) or _started_files(run.path):
            candidates.append(run)
        else:
            logger.info("interrupted run %s has the same plan but no finished job: nothing to resume there", run.path)
    return max(candidates, key=_newest, default=None)


def finished_run(root: Path, fingerprint: str) -> RunFolder | None:
    """The newest finished run folder under `root` whose plan has `fingerprint`, whatever its jobs gave."""
    return max((run for run in _same_plan(root, fingerprint) if run.complete), key=_newest, default=None)


def environment_failures(records: dict[str, JobRecord]) -> dict[str, str]:
    """job -> why, for every recorded job that failed for a reason outside the variant (out of memory, a full disk, a
    worker lost after its retries: qbench.errors.environment_cause), which may not happen again."""
    return {job: record.environment for job, record in records.items() if record.environment is not None}


def failed_jobs(records: dict[str, JobRecord]) -> dict[str, str]:
    """job -> its error, for every recorded job that failed: a build with an error, a measurement whose result failed
    (for whatever reason: what `--rerun-failed` runs again)."""
    failed = {job: record.error for job, record in records.items() if record.error is not None}
    failed.update({job: record.died for job, record in records.items() if record.died is not None})
    failed.update({job: record.result.error or "" for job, record in records.items()
                   if record.error is None and record.result is not None
                   and record.result.status == "failed"})  # fmt: skip
    return failed


def _newest(run: RunFolder) -> tuple[object, str]:
    return run.recorded_at, run.path.name


def _same_plan(root: Path, fingerprint: str) -> list[RunFolder]:
    folders = [folder for folder in root.iterdir() if folder.is_dir()] if root.is_dir() else []
    runs = []
    for run in filter(None, map(describe_run, folders)):
        plan = _plan(run.path)
        if plan is not None and plan.get("fingerprint") == fingerprint:
            runs.append(run)
    return runs
