"""`qbench sweep --plan`: every job of a sweep, where it would run, and what `--resume` would do with it.

Nothing is built, measured or prepared: the plan needs only the recipe and its input files' digests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qbench.errors import QbenchError
from qbench.execute.plan import SweepPlan, build_facts, make_plan
from qbench.execute.records import read_records
from qbench.execute.resume import (
    Decision,
    code_changes_by_run,
    decide_build,
    decide_measure,
    measured_with,
    reference_again,
    rerun_summary,
    resume_target,
    runs_onnx_file,
)
from qbench.execute.store import BuildStore, built_from_manifest
from qbench.provenance import input_digests, model_sha256
from qbench.recipe.spec import Recipe


@dataclass(frozen=True)
class PlanRow:
    job: str
    needs: str
    after: str
    resume: Decision  # what `--resume` does with it and why (qbench.execute.resume)


@dataclass(frozen=True)
class PlanOverview:
    plan: SweepPlan
    executor: str
    store: str
    resumable: Path | None
    rows: tuple[PlanRow, ...]
    refused: str | None = None  # why `--resume` would stop before running anything

    @property
    def changes(self) -> list[str]:
        """One line per kind of difference in what measures that runs measurements again (rerun_summary)."""
        return rerun_summary(row.resume for row in self.rows)

    def count(self, action: str) -> int:
        return sum(1 for row in self.rows if row.resume.action == action)


def plan_overview(recipe: Recipe, store: BuildStore, *, rerun_failed: bool = False) -> PlanOverview:
    """The recipe's plan with, per job, what it needs and what `--resume` (with `rerun_failed`, `--resume
    --rerun-failed`) would do with it, by the rules the resumed sweep follows (qbench.execute.resume)."""
    plan = make_plan(recipe, input_digests(recipe))
    refused = None
    try:
        run = resume_target(recipe.output_path / recipe.name, plan.fingerprint, rerun_failed=rerun_failed)
    except QbenchError as exc:
        run, refused = None, str(exc)
    records = read_records(run) if run is not None else {}
    specs = {spec.name: spec for spec in recipe.planned_variants()}
    source = recipe.model_path  # a PyTorch source's export is not known before the sweep: its builds are not checked
    reference = model_sha256(source) if source is not None else None
    name = run.name if run is not None else ""
    builds: dict[str, tuple[Decision, str | None]] = {}
    measures: dict[str, Decision] = {}
    code = code_changes_by_run(recipe)
    rows = []
    for job in plan.jobs:
        record = records.get(job.id)
        if job.kind == "build":
            stored = store.reusable(job.build_key, build_facts(recipe, specs[job.variant]), reference)
            decision = decide_build(record, stored, name, rerun_failed=rerun_failed)
            builds[job.variant] = (decision, _model_sha256(store, job.build_key, stored, source))
        else:
            build, built_sha256 = builds[job.variant]
            decision = measures[job.id] = decide_measure(
                record, name, build=build, built_sha256=built_sha256,
                needs_outputs=job.id == f"measure:{plan.reference}@{plan.backends[0]}",
                current=measured_with(str(job.backend), recipe.latency.threads),
                reference_again=reference_again(job, plan, measures), rerun_failed=rerun_failed,
                ran_file=runs_onnx_file(str(job.backend)), code=code(record))
        after = ", ".join(job.after) if job.after else "—"
        rows.append(PlanRow(job.id, job.needs.describe(), after, decision))
    executor = recipe.executor.kind + (f" ({recipe.executor.address})" if recipe.executor.address else "")
    return PlanOverview(plan, executor, store.root, run, tuple(rows), refused)


def _model_sha256(store: BuildStore, key: str, stored: dict[str, Any] | None, source: Path | None) -> str | None:
    """The model digest of the stored build `stored` (what a measurement of it recorded), read from its files in the
    store (fetched to this machine's cache from a store behind a URI); None without one."""
    if stored is None or source is None:
        return None
    return model_sha256(store.local_copy(built_from_manifest(stored, store.entry(key), source), key).onnx_path)
