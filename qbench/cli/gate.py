"""How the CLI reports a gate verdict (`qbench gate`, `qbench sweep --gate`): the console lines, the report files,
GITHUB_STEP_SUMMARY and the registry; the report files say how the command ended, whichever way (`reported_ending`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qbench.console import annotate_error, names_stdout, print_wide, write_document
from qbench.console import console as err_console
from qbench.console import stdout_console as out
from qbench.errors import OUT_OF_MEMORY, QbenchError, environment_cause, one_line
from qbench.gate.report_paths import check_report_path
from qbench.supervisor import address_space_note

if TYPE_CHECKING:
    from qbench.gate.evaluate import GateReport
    from qbench.recipe.registry import RegistrySpec
    from qbench.recipe.spec import Recipe
    from qbench.results.schema import SweepResults

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
        from qbench.recipe.registry import requested_registry

        return requested_registry(section, model=self.register, alias=self.alias, skip=self.no_register)

    def on_stdout(self) -> bool:
        """Whether a report goes to stdout (`--json -`, `--junit /dev/stdout`); two there would be no document, nor
        two in one file (the second replaced the first: CI read the JSON as its JUnit report, beside exit 0)."""
        if self.junit is not None and self.json_path is not None:
            if names_stdout(self.junit) and names_stdout(self.json_path):
                raise QbenchError(f"--junit {self.junit} and --json {self.json_path} both name stdout; expected at "
                                  "most one report there")  # fmt: skip
            if _one_file(self.junit, self.json_path):
                raise QbenchError(f"--junit {self.junit} and --json {self.json_path} name one file; expected a file "
                                  "of its own for each report")  # fmt: skip
        return any(path is not None and names_stdout(path) for path in (self.junit, self.json_path))

    def refuse_overwriting(self, *inputs: Path | None) -> None:
        """--junit / --json must not name a file the gate reads (the recipe, the results judged): writing the
        report there would destroy what it judged, before anyone could see why it failed."""
        protected = {p.resolve() for p in inputs if p is not None}
        for option, path in (("--junit", self.junit), ("--json", self.json_path)):
            if path is not None and names_stdout(path):
                continue
            if path is not None and path.resolve() in protected:
                raise ReportPathRefused(
                    f"{option} {path}: that is a file the gate reads; expected another path for the report"
                )
            if path is not None:
                try:
                    check_report_path(path)
                except QbenchError as exc:
                    raise ReportPathRefused(str(exc)) from None


def _one_file(first: Path, second: Path) -> bool:
    """Whether two paths name one file: the same path once links are followed, or two links to one file."""
    try:
        return first.resolve() == second.resolve() or (first.exists() and second.exists() and first.samefile(second))
    except (OSError, RuntimeError):  # a loop of links: writing the report says why
        return False


def describe(exc: BaseException) -> str:
    """A QbenchError's message; any other exception (a bug) with its type, as `main` prints it, and what the machine
    ran into where that was its cause (qbench.errors.environment_cause): a MemoryError carries no message, and
    `MemoryError: ` alone said nothing of an address-space limit (ulimit -v) that caused it."""
    if isinstance(exc, QbenchError):
        return one_line(exc)
    message = one_line(exc)
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    cause = environment_cause(exc)
    if cause is None:  # the interpreter's own failure under `ulimit -v` (a C function returning NULL, as `compile`
        # did importing a module there) is an allocation that raised no MemoryError: the limit is named with it
        limit = address_space_note() if isinstance(exc, SystemError) else ""
        return f"{text} (perhaps out of memory{limit})" if limit else text
    return f"{text} ({cause}{address_space_note() if cause == OUT_OF_MEMORY else ''})"


class ReportPathRefused(QbenchError):
    """A report path that names a file the gate reads or a file no report may replace: nothing is written there."""


class ReportsUnwritten(QbenchError):
    """Report files that could not be written (a full disk, a path under a file); the others say so."""


def _signalled(exc: BaseException) -> bool:
    """Whether the command was stopped by SIGINT or SIGTERM (Ctrl+C, a CI timeout, a cancelled job), itself or as the
    error a sweep raises in its place once it cleaned up (EndedBySignal)."""
    from click.exceptions import Abort

    from qbench.interrupt import EndedBySignal, Interrupted

    return isinstance(exc, (Interrupted, KeyboardInterrupt, Abort, EndedBySignal))


def ending_reason(exc: BaseException) -> str:
    """Why a gate command ended without its verdict standing, in the words the report files carry."""
    from qbench.interrupt import EndedBySignal, Interrupted

    if _signalled(exc) and not isinstance(exc, EndedBySignal):  # that one says where the sweep's results are
        signal_name = exc.signal_name if isinstance(exc, Interrupted) else "SIGINT"
        return (f"qbench was interrupted by {signal_name} before the gate command finished (a CI timeout or a "
                "cancelled job sends it), so there is no verdict")  # fmt: skip
    return describe(exc)


UNFINISHED = ("the gate command did not finish: its process ended before it could say how (a native library's crash, "
              "the out-of-memory killer's SIGKILL), so there is no verdict")


class GateEnding:
    """What the report files of one `qbench gate` or `qbench sweep --gate` say: the verdict once `report_gate` has
    it, written when the command ends, however it ends (see `reported_ending`)."""

    def __init__(self, output: GateOutput) -> None:
        self.output = output
        self.verdict: GateReport | None = None

    def promise(self) -> None:
        """Write each report file (not stdout, a pipe or a device) saying the command has not finished, before the
        work that may kill its process: the ending replaces it (the verdict, or why it ended otherwise), but a process
        that dies (a native crash, the out-of-memory killer's SIGKILL) writes nothing, and an earlier run's report
        there said 'pass' beside the exit 2 the command ended with. One that cannot be written now is left to the
        ending, which says why (`_write_ending`)."""
        files = [file for file in _report_files(self.output) if not _is_stream(file[0])]
        _write_files(_with_problem(None, UNFINISHED, interrupted=True), files, shown=False)


@contextlib.contextmanager
def reported_ending(output: GateOutput) -> Iterator[GateEnding]:
    """The one place the report files and the step summary are written, on every way the command ends, since CI
    uploads them whatever happened: the verdict when the block ends normally; otherwise (no results, unreadable or
    stale ones, a bad recipe, a failed or interrupted sweep, a bug, a registry or tracking failure after the verdict,
    SIGTERM or SIGINT anywhere inside) the verdict so far, if any, with the reason as one more problem, so the files
    carry exit code 2 and why. The exception itself goes on to `main` (exit 2). A second signal while the files are
    written stops the writing (each file is replaced whole or left as it was): the stop asked for comes first."""
    ending = GateEnding(output)
    try:
        yield ending
        if ending.verdict is not None:  # a signal while these are written is an ending like any other
            unwritten = _write_ending(ending.verdict, output)
            if unwritten:
                raise ReportsUnwritten("; ".join(one_line(exc) for exc in unwritten))
    except (ReportPathRefused, ReportsUnwritten):
        raise  # refused: writing there would destroy what the gate reads; unwritten: the others say so already
    except BaseException as exc:
        reported = _with_problem(ending.verdict, ending_reason(exc), interrupted=_signalled(exc))
        # after a signal, no stream: one may wait for a reader for ever (a pipe nobody reads); the stop comes first
        for unwritten_file in _write_ending(reported, output, write_streams=not _signalled(exc)):
            err_console.print(f"error: {one_line(unwritten_file)}", soft_wrap=True, markup=False)
        raise


def _with_problem(verdict: GateReport | None, problem: str, *, interrupted: bool = False) -> GateReport:
    """The verdict so far (or an empty report) with one more problem: exit code 2, the reason listed; `interrupted`:
    that reason is a signal's, which the reports call 'interrupted' (GateReport.interrupted); otherwise, where a verdict
    of 0 or 1 stood, it came after it: 'error' (GateReport.failed_after_verdict), since the results were judged."""
    import dataclasses

    from qbench.gate.evaluate import GateReport

    base = GateReport(metric="unknown") if verdict is None else verdict
    after = not interrupted and verdict is not None and verdict.exit_code in (EXIT_OK, EXIT_BREACH)
    return dataclasses.replace(base, problems=(*base.problems, problem),
                               interrupted=problem if interrupted else base.interrupted,
                               failed_after_verdict=problem if after else base.failed_after_verdict)  # fmt: skip


def crashed_no_pass(report: GateReport, died: Sequence[str] | None) -> GateReport:
    """The verdict of a `qbench sweep --gate` whose process died running the jobs `died` in this command (a native
    crash, the out-of-memory killer: the resume that went on recorded them failed, qbench.supervisor): no pass, judged
    or not, as the command's exit code 2 says; its report files said pass beside it, and the registry moved."""
    if not died:
        return report
    return _with_problem(report, f"the sweep's process died running {', '.join(died)} in this command (recorded "
                                 "failed): a crashed job is no pass, whether or not the gate judges it")


def report_gate(asked: Recipe | None, judged: SweepResults, report: GateReport, results_path: Path,
                ending: GateEnding, registry: RegistrySpec | None, *, untracked: str | None = None) -> int:  # fmt: skip
    """The one way a verdict is reported (`gate` and `sweep --gate`): the header, the SLO lines, the breaches
    and summary (every check with --verbose), then the registry; the report files and GITHUB_STEP_SUMMARY say the
    verdict when the command's `reported_ending` block ends (the verdict and why, should it end otherwise)."""
    from qbench.report.serving import slo_lines

    ending.verdict = report  # from here on, an ending other than this verdict is reported beside its checks
    out.print(f"gate on {judged.recipe.get('name', '?')} ({judged.created_at}), "
              f"{'metrics' if len(report.gated_metrics) > 1 else 'metric'} {report.metric_text}",
              markup=False)  # fmt: skip
    for line in slo_lines(judged, report):
        out.print(line, markup=False)
    _print_verdict(report, verbose=ending.output.verbose)
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
    from qbench.track.registry import register_best

    for entry in register_best(asked, judged, report, results_path.parent, spec):
        done = "is already" if entry.existing else "registered as"
        out.print(f"{entry.variant}@{entry.backend} {done} {entry.name} version {entry.version} "
                  f"(run {entry.run_id}); aliases: {', '.join(entry.aliases) or 'none'}", markup=False)  # fmt: skip


def tag_tracked_runs(asked: Recipe | None, judged: SweepResults, results_path: Path, report: GateReport) -> None:
    """`qbench gate` on results a tracked sweep logged: its MLflow runs' gate tags become this verdict's (the UI
    shows what CI concluded last). A courtesy beside the verdict, as the step summary is: a store that fails is a
    warning and the exit code stands; results no store holds (an untracked sweep) are left alone. MLflow (seconds
    to import) is loaded only where the run folder may be in a store and the recipe's store exists."""
    from qbench.runs import may_be_tracked
    from qbench.track.uri import run_store_uri, store_absent

    run_folder = results_path.parent
    if asked is None or not may_be_tracked(run_folder) or store_absent(run_store_uri(asked, run_folder)):
        return
    from qbench.track.saved import tag_gate_verdict

    try:
        run_id = tag_gate_verdict(asked, results_path.parent, report, judged)
    except QbenchError as exc:
        err_console.print(f"warning: {one_line(exc)}; the MLflow runs keep their earlier gate tags; the verdict stands",
                          soft_wrap=True, markup=False)  # fmt: skip
        return
    if run_id is not None:
        err_console.print(f"MLflow: gate verdict tagged on sweep run {run_id} and its variants' runs", markup=False)


def _print_verdict(report: GateReport, *, verbose: bool) -> None:
    """The notes, the breaches and problems (every check when verbose), then one summary line."""
    from qbench.gate import report as gate_report

    for note in report.notes:
        out.print(f"gate note: {note}", markup=False)
    if verbose:
        from qbench.report.tables import gate_table

        print_wide(gate_table(report, notes=False), out)  # the notes are printed above
    else:
        for line in gate_report.console_lines(report):
            out.print(line, style="red", markup=False, highlight=False)
    summary = gate_report.summary_line(report)
    out.print(summary, style="green" if report.exit_code == 0 else "bold red", markup=False, highlight=False)
    if report.exit_code != 0:  # a breach or unusable results: the annotation names the first problems, if any
        more = [f"{len(report.problems) - 3} more in the log"] if len(report.problems) > 3 else []
        annotate_error("qbench gate", "; ".join([summary, *report.problems[:3], *more]))


def _write_ending(report: GateReport, output: GateOutput, *, write_streams: bool = True) -> list[QbenchError]:
    """The requested report files, then the GitHub step summary; each is tried whatever became of the others;
    without `write_streams`, none that is stdout, a pipe or a device (regular files only).
    Returns why the report files that could not be written were not (CI uploads them: a missing one is exit 2);
    the others are then written again with that reason as a problem, so that they carry exit code 2 and why. One
    that cannot take that either is removed, not left saying a verdict the exit code contradicts (each file is
    replaced whole or not at all: nothing half-written), as is the gate report one could not replace (the promise
    that the command has not finished, or an earlier run's verdict).

    The step summary is a courtesy display in a file the job's other steps share, which the gate was not asked
    for: one that cannot take the section is a warning, and the exit code stands (a breach stays 1, a pass 0)."""
    from qbench.gate.report import append_step_summary

    files = _report_files(output)
    streams = [file for file in files if _is_stream(file[0])]  # written once, last: a reader gets one document
    unwritten = list(_write_files(report, [file for file in files if file not in streams]).items())
    for path, _ in unwritten:
        _remove_gate_report(path)
    if unwritten:
        report = _with_problem(report, "; ".join(one_line(exc) for _, exc in unwritten))
        written = [file for file in files if file not in streams and file[0] not in dict(unwritten)]
        for path, exc in _write_files(report, written, again=True).items():
            path.unlink(missing_ok=True)
            unwritten.append((path, QbenchError(f"{one_line(exc)} (removed: it held the verdict alone)")))
    unwritten += _write_files(report, streams if write_streams else []).items()
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        try:
            append_step_summary(Path(step_summary), report)
        except QbenchError as exc:
            stands = "the verdict stands" if report.exit_code != EXIT_ERROR else "the exit code stays 2"
            err_console.print(f"warning: GITHUB_STEP_SUMMARY {one_line(exc)}; {stands}", soft_wrap=True,
                              markup=False)  # fmt: skip
    return [exc for _, exc in unwritten]


def _remove_gate_report(path: Path) -> None:
    """Remove the gate report at `path` (never a file of another kind: qbench.gate.report_paths), where it can be."""
    with contextlib.suppress(QbenchError, OSError):
        check_report_path(path)
        path.unlink(missing_ok=True)


def _report_files(output: GateOutput) -> list[tuple[Path, Callable[[GateReport], str]]]:
    """Each report file asked for (--junit, --json), with what renders it."""
    from qbench.gate.report import report_json

    renders: list[tuple[Path | None, Callable[[GateReport], str]]] = [(output.json_path, report_json)]
    if output.junit is not None:  # an XML writer is imported for the JUnit report alone
        from qbench.gate.junit import junit_xml

        renders.insert(0, (output.junit, junit_xml))
    return [(path, render) for path, render in renders if path is not None]


def _is_stream(path: Path) -> bool:
    """stdout (`-`, `/dev/stdout`), a pipe or a device: what is written there cannot be taken back."""
    try:
        return names_stdout(path) or (path.exists() and not path.resolve().is_file())
    except OSError:
        return False


def _write_files(report: GateReport, files: list[tuple[Path, Callable[[GateReport], str]]], *,
                 again: bool = False, shown: bool = True) -> dict[Path, QbenchError]:  # fmt: skip
    """Write each report file (stdout for `-`); those that cannot be written, with why. `again`: each was written
    before, and now takes the reason another could not be: its line says so (the same line twice read as a
    repeat in a CI log); without `shown`, no line says it was written (GateEnding.promise's, which the ending
    replaces)."""
    from qbench.gate import report as gate_report

    unwritten: dict[Path, QbenchError] = {}
    said = " (written again: exit code 2, as another report could not be written)" if again else ""
    for path, render in files:
        if names_stdout(path):
            write_document(render(report))
            continue
        try:
            written = gate_report.write_report(path, render(report))
            if shown:
                err_console.print(f"gate report: {written}{said}", markup=False)
        except QbenchError as exc:
            unwritten[path] = exc
    return unwritten
