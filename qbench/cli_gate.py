"""How the CLI reports a gate verdict (`qbench gate`, `qbench sweep --gate`): the console lines, the report files,
GITHUB_STEP_SUMMARY and the registry; and, when there is no verdict, report files that say why."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qbench.console import console as err_console
from qbench.console import names_stdout, print_wide, write_document
from qbench.console import stdout_console as out
from qbench.errors import QbenchError, one_line

if TYPE_CHECKING:
    from qbench.gate import GateReport
    from qbench.recipe import Recipe
    from qbench.recipe_registry import RegistrySpec
    from qbench.results import SweepResults

EXIT_OK, EXIT_BREACH, EXIT_ERROR = 0, 1, 2


class _Breach(int):
    """Exit code 1 as a gate verdict returns it (`BREACH`): a 1 from anywhere else (click's Exit(1), which typer
    hands back as the command's result; a library's own exit code) is no verdict, and `main` makes it 2."""


BREACH = _Breach(EXIT_BREACH)


@dataclass(frozen=True)
class GateOutput:
    """What `qbench gate` and `qbench sweep --gate` do with a verdict beside printing it."""

    verbose: bool = False
    junit: Path | None = None
    json_path: Path | None = None
    register: str | None = None
    alias: str | None = None
    no_register: bool = False

    def registry(self, section: RegistrySpec | None) -> RegistrySpec | None:
        """What to register: the recipe's registry section under --register / --alias / --no-register."""
        from qbench.recipe_registry import requested_registry

        return requested_registry(section, model=self.register, alias=self.alias, skip=self.no_register)

    def on_stdout(self) -> bool:
        """Whether a report goes to stdout (`--json -`, `--junit /dev/stdout`); two there would be no document."""
        if self.junit is not None and self.json_path is not None and names_stdout(self.junit) and names_stdout(self.json_path):  # fmt: skip
            raise QbenchError(f"--junit {self.junit} and --json {self.json_path} both name stdout; expected at most "
                              "one report there")  # fmt: skip
        return any(path is not None and names_stdout(path) for path in (self.junit, self.json_path))

    def refuse_overwriting(self, *inputs: Path | None) -> None:
        """--junit / --json must not name a file the gate reads (the recipe, the results judged): writing the
        report there would destroy what it judged, before anyone could see why it failed."""
        from qbench.gate_report import check_report_path

        protected = {p.resolve() for p in inputs if p is not None}
        for option, path in (("--junit", self.junit), ("--json", self.json_path)):
            if path is not None and names_stdout(path):
                continue
            if path is not None and path.resolve() in protected:
                raise QbenchError(
                    f"{option} {path}: that is a file the gate reads; expected another path for the report"
                )
            if path is not None:
                check_report_path(path)


def describe(exc: BaseException) -> str:
    """A QbenchError's message; any other exception (a bug) with its type, as `main` prints it."""
    return one_line(exc) if isinstance(exc, QbenchError) else f"{type(exc).__name__}: {one_line(exc)}"


@contextlib.contextmanager
def reported_when_unusable(output: GateOutput) -> Iterator[None]:
    """No verdict comes out of the block (no results, unreadable or stale ones, a bug while judging or printing, and
    with `sweep --gate` a sweep that failed or was interrupted: run_sweep raises that as a QbenchError): the report
    files and the step summary still say why, since CI uploads them whatever happened. The error itself goes on to
    `main` (exit 2). A signal anywhere else is no Exception and writes nothing more: the stop asked for comes first
    (a report path may be a pipe nobody reads)."""
    from qbench.gate import GateReport

    try:
        yield
    except Exception as exc:
        try:
            write_reports(GateReport(metric="unknown", problems=(describe(exc),)), output)
        except Exception as unwritten:  # noqa: BLE001 - the first error is the one to end with
            err_console.print(f"error: {describe(unwritten)}", soft_wrap=True, markup=False)
        raise


def report_gate(asked: Recipe | None, judged: SweepResults, report: GateReport, results_path: Path,
                output: GateOutput, registry: RegistrySpec | None, *, untracked: str | None = None) -> int:  # fmt: skip
    """The one way a verdict is reported (`gate` and `sweep --gate`): the header, the SLO lines, the breaches
    and summary (every check with --verbose), the report files, GITHUB_STEP_SUMMARY, then the registry."""
    from qbench.report_serving import slo_lines

    with reported_when_unusable(output):
        out.print(f"gate on {judged.recipe.get('name', '?')} ({judged.created_at}), metric {report.metric}",
                  markup=False)  # fmt: skip
        for line in slo_lines(judged, report):
            out.print(line, markup=False)
        _print_verdict(report, verbose=output.verbose)
    write_reports(report, output)
    if registry is not None:
        _register(asked, judged, report, results_path, registry, untracked=untracked)
    return BREACH if report.exit_code == EXIT_BREACH else report.exit_code


def _register(asked: Recipe | None, judged: SweepResults, report: GateReport, results_path: Path,
              spec: RegistrySpec, *, untracked: str | None) -> None:  # fmt: skip
    """On a pass, register the winners `spec` asks for and print them; otherwise say that nothing moved."""
    if report.exit_code != 0 or asked is None:
        err_console.print(f"registry: gate did not pass, {spec.model!r} not registered, alias {spec.alias!r} not moved",
                          markup=False)  # fmt: skip
        return
    if untracked:
        err_console.print(f"registry: {spec.model!r} not registered: {untracked}", markup=False)
        return
    from qbench.track_registry import register_best

    for entry in register_best(asked, judged, report, results_path.parent, spec):
        done = "is already" if entry.existing else "registered as"
        out.print(f"{entry.variant}@{entry.backend} {done} {entry.name} version {entry.version} "
                  f"(run {entry.run_id}); aliases: {', '.join(entry.aliases) or 'none'}", markup=False)  # fmt: skip


def tag_tracked_runs(asked: Recipe | None, results_path: Path, report: GateReport) -> None:
    """`qbench gate` on results a tracked sweep logged: its MLflow runs' gate tags become this verdict's (the UI
    shows what CI concluded last). A courtesy beside the verdict, as the step summary is: a store that fails is a
    warning and the exit code stands; results no store holds (an untracked sweep) are left alone. MLflow (seconds
    to import) is loaded only where the run folder may be in a store and the recipe's store exists."""
    from qbench.runs import may_be_tracked
    from qbench.track_uri import resolve_tracking_uri, store_absent

    if asked is None or not may_be_tracked(results_path.parent) or store_absent(resolve_tracking_uri(asked)):
        return
    from qbench.track_saved import tag_gate_verdict

    try:
        run_id = tag_gate_verdict(asked, results_path.parent, report)
    except QbenchError as exc:
        err_console.print(f"warning: {one_line(exc)}; the MLflow runs keep their earlier gate tags; the verdict stands",
                          soft_wrap=True, markup=False)  # fmt: skip
        return
    if run_id is not None:
        err_console.print(f"MLflow: gate verdict tagged on sweep run {run_id} and its variants' runs", markup=False)


def _print_verdict(report: GateReport, *, verbose: bool) -> None:
    """The notes, the breaches and problems (every check when verbose), then one summary line."""
    from qbench import gate_report

    for note in report.notes:
        out.print(f"gate note: {note}", markup=False)
    if verbose:
        from qbench.report import gate_table

        print_wide(gate_table(report, notes=False), out)  # the notes are printed above
    else:
        for line in gate_report.console_lines(report):
            out.print(line, style="red", markup=False, highlight=False)
    out.print(gate_report.summary_line(report), style="green" if report.exit_code == 0 else "bold red",
              markup=False, highlight=False)  # fmt: skip


def write_reports(report: GateReport, output: GateOutput) -> None:
    """The requested report files, then the GitHub step summary; each is tried whatever became of the others.

    A report file that cannot be written is a QbenchError (raised once all were tried; CI uploads them, so a
    missing one is no clean run). The step summary is a courtesy display in a file the job's other steps share,
    which the gate was not asked for: one that cannot take the section is a warning, and the verdict's exit code
    stands (a breach stays 1, a pass 0); the console and the report files still carry the verdict."""
    from qbench import gate_report

    unwritten: list[QbenchError] = []
    for path, render in ((output.junit, gate_report.junit_xml), (output.json_path, gate_report.report_json)):
        if path is not None and names_stdout(path):
            write_document(render(report))
        elif path is not None:
            try:
                err_console.print(f"gate report: {gate_report.write_report(path, render(report))}", markup=False)
            except QbenchError as exc:
                unwritten.append(exc)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        try:
            gate_report.append_step_summary(Path(step_summary), report)
        except QbenchError as exc:
            err_console.print(f"warning: GITHUB_STEP_SUMMARY {one_line(exc)}; the verdict stands", soft_wrap=True,
                              markup=False)  # fmt: skip
    for exc in unwritten[1:]:
        err_console.print(f"error: {one_line(exc)}", soft_wrap=True, markup=False)
    if unwritten:
        raise unwritten[0]
