"""`qbench sweep --plan`: the jobs a sweep would run, where, and what a resume would reuse, without running any."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from qbench.console import print_wide
from qbench.console import stdout_console as out

if TYPE_CHECKING:
    from qbench.recipe.spec import Recipe


def print_plan(recipe: Recipe, *, rerun_failed: bool) -> None:
    """What `qbench sweep --plan` prints: each job, what it needs and follows, what a resume would do with it."""
    from qbench.execute.overview import plan_overview
    from qbench.execute.resume import NEW, RERUN, REUSE
    from qbench.execute.store import build_store

    overview = plan_overview(recipe, build_store(recipe), rerun_failed=rerun_failed)
    resume = "--resume --rerun-failed" if rerun_failed else "--resume"
    table = Table(box=None, pad_edge=False)
    for column in ("job", "needs", "after", resume, "why"):
        table.add_column(column)
    for row in overview.rows:
        table.add_row(escape(row.job), row.needs, escape(row.after), row.resume.action, escape(row.resume.why))
    out.print(f"plan {overview.plan.fingerprint[:12]}: {len(overview.rows)} jobs on executor "
              f"{escape(overview.executor)}, builds stored in {escape(overview.store)}")  # fmt: skip
    print_wide(table, out)
    if overview.refused:
        out.print(escape(f"{overview.refused} (the column says what it would reuse from the build store alone)"))
        return
    counts = ", ".join(f"{overview.count(action)} {action}" for action in (REUSE, RERUN, NEW))
    taken = f"takes up {overview.resumable}" if overview.resumable else "takes up no run (only builds in the store)"
    out.print(escape(f"`qbench sweep {resume}` {taken}: of {len(overview.rows)} jobs, {counts}"))
    for line in overview.changes:
        out.print(escape(line))
