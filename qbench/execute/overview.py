"""`qbench sweep --plan`: every job of a sweep, where it would run, and what is already done.

Nothing is built, measured or prepared: the plan needs only the recipe and its input files' digests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qbench.execute.plan import SweepPlan, make_plan
from qbench.execute.records import read_records, resumable_run
from qbench.execute.store import BuildStore, build_environment
from qbench.provenance import input_digests
from qbench.recipe import Recipe


@dataclass(frozen=True)
class PlanRow:
    job: str
    needs: str
    after: str
    cached: str  # what a resumed sweep would reuse ("" when the job would run)


@dataclass(frozen=True)
class PlanOverview:
    plan: SweepPlan
    executor: str
    store: str
    resumable: Path | None
    rows: tuple[PlanRow, ...]

    @property
    def cached(self) -> int:
        return sum(1 for row in self.rows if row.cached)


def plan_overview(recipe: Recipe, store: BuildStore) -> PlanOverview:
    """The recipe's plan with, per job, what it needs and whether `--resume` would reuse it."""
    plan = make_plan(recipe, input_digests(recipe))
    run = resumable_run(recipe.output_path / recipe.name, plan.fingerprint)
    records = read_records(run.path) if run is not None else {}
    environment = build_environment()
    reusable_builds: set[str] = set()
    rows = []
    for job in plan.jobs:
        record = records.get(job.id)
        cached = ""
        if job.kind == "build":
            stored = store.reusable(job.build_key, environment)
            if stored is not None:
                reusable_builds.add(job.variant)
                cached = f"finished in {run.path.name}" if record and record.manifest == stored and run else "in store"
        elif record is not None and record.result is not None and record.result.status in ("ok", "skipped"):
            cached = f"finished in {run.path.name}" if job.variant in reusable_builds and run else ""
        after = ", ".join(job.after) if job.after else "—"
        rows.append(PlanRow(job.id, job.needs.describe(), after, cached))
    executor = recipe.executor.kind + (f" ({recipe.executor.address})" if recipe.executor.address else "")
    return PlanOverview(plan, executor, store.root, run.path if run else None, tuple(rows))
