"""`qbench` command line: a thin layer over the library (each command is a few calls into qbench.*).

`main` runs a command in this process (tests call it); the `qbench` script runs it in a supervised child
(qbench.cli, qbench.supervisor), started as `python -m qbench.cli.child ARGS`.
Exit codes: 0 success / gate passed, 1 gate breached, 2 anything else (see `main`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape
from typer.exceptions import TyperException

from qbench.cli.cache import cache_app
from qbench.cli.gate import (
    BREACH,
    EXIT_BREACH,
    EXIT_ERROR,
    EXIT_OK,
    GateOutput,
    crashed_no_pass,
    describe,
    report_gate,
    reported_ending,
    tag_tracked_runs,
)
from qbench.console import console as err_console
from qbench.console import (
    forgiving_standard_streams,
    library_output_on_console,
    print_error,
    print_wide,
    stdout_kept_for_a_document,
    unwrap_help,
)
from qbench.console import stdout_console as out
from qbench.errors import QbenchError, one_line
from qbench.interrupt import held
from qbench.startup import uncollected_setup
from qbench.supervisor import KEEP_FAILED, RESUME_RUN, STOP_ON_CRASH, address_space_note, supervised

if TYPE_CHECKING:
    from qbench.results.schema import SweepResults

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Build FP16/BF16/FP8/INT8 variants of a model, validate them against FP32 "
    "(latency and per-slice accuracy), log to MLflow, and gate them in CI.",
)

RecipeArg = Annotated[Path, typer.Argument(help="recipe YAML file", show_default=False)]

VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="print every check, not only the breaches")]
JunitOption = Annotated[
    Optional[Path], typer.Option("--junit", help="write JUnit XML (a test case per check; - for stdout)")
]
JsonOption = Annotated[
    Optional[Path], typer.Option("--json", help="write the machine-readable gate report (- for stdout)")
]
RegisterOption = Annotated[
    Optional[str], typer.Option("--register", help="on a pass, register each backend's fastest passing variant as "
                                "a version of this MLflow model (over the recipe's registry.model)",
                                show_default=False)  # fmt: skip
]
AliasOption = Annotated[
    Optional[str], typer.Option("--alias", help="alias pointed at the registered version (over registry.alias; "
                                "default candidate)", show_default=False)  # fmt: skip
]
NoRegisterOption = Annotated[bool, typer.Option("--no-register", help="register nothing, whatever the recipe says")]
TrackOption = Annotated[bool, typer.Option("--track/--no-track", help="log to MLflow")]


@app.command()
def sweep(
    recipe: RecipeArg,
    gate: Annotated[bool, typer.Option("--gate", help="also run the gate; exit 1 if any variant breaches")] = False,
    track: TrackOption = True,
    price: Annotated[
        Optional[list[str]], typer.Option("--price", help="backend=USD per hour, for cost per inference (repeatable)")
    ] = None,
    verbose: VerboseOption = False,
    junit: JunitOption = None,
    json_path: JsonOption = None,
    register: RegisterOption = None,
    alias: AliasOption = None,
    no_register: NoRegisterOption = False,
    plan: Annotated[bool, typer.Option("--plan", help="print the jobs, where each would run and what is cached; "
                                       "run nothing")] = False,  # fmt: skip
    executor: Annotated[
        Optional[str], typer.Option("--executor", help="local or ray (default: the recipe's executor.kind)")
    ] = None,
    address: Annotated[
        Optional[str], typer.Option("--address", help="ray: the cluster to join (auto, ray://host:10001)")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="reuse stored builds and the finished jobs of the last interrupted run, "
                                 "or of the last finished one whose failed jobs failed for reasons outside the "
                                 "variants")
    ] = False,
    rerun_failed: Annotated[
        bool, typer.Option("--rerun-failed", help="with --resume (or --plan): also run again the jobs that failed for "
                                 "their variant's own reason, once their cause is fixed outside the recipe and inputs")
    ] = False,
    stop_on_crash: Annotated[  # read by the supervising process (qbench.supervisor), which resumes a crashed sweep
        bool, typer.Option(STOP_ON_CRASH, help="end the command when the sweep's process crashes in a job (a native "
                           "library's fault, the out-of-memory killer) instead of going on without that job")
    ] = False,
    keep_failed: Annotated[  # the supervising process's resume after a crash: the jobs that died in this command
        Optional[list[str]], typer.Option(KEEP_FAILED, hidden=True)
    ] = None,
    resume_run: Annotated[Optional[Path], typer.Option(RESUME_RUN, hidden=True)] = None,  # that resume's run folder
) -> int:
    """Build every variant, measure it against FP32, write reports/<name>/<time>/ and log to MLflow.

    With --gate, the verdict is reported as `qbench gate` reports it (the same options, the same
    GITHUB_STEP_SUMMARY table) and the recipe's registry section (or --register) registers the winners.
    """
    output = GateOutput(verbose, junit, json_path, register, alias, no_register)
    if not gate and output != GateOutput():
        raise QbenchError("--verbose, --junit, --json, --register, --alias and --no-register apply with --gate")
    with stdout_kept_for_a_document(output.on_stdout()):  # `--json -`: the report alone there
        output.refuse_overwriting(recipe)
        # --gate: the report files say how the command ended, a signal during the imports below included
        with reported_ending(output) if gate and not plan else contextlib.nullcontext() as ending:
            # a signal waits for the imports: a module cut short in its import cannot write the reports; in the
            # supervised command's process, they run without the garbage collector (qbench.startup)
            with held(), uncollected_setup(own_process=supervised()):
                if track and not plan:  # its import of MLflow overlaps this process's imports and the preparation
                    from qbench.track.process import prestart

                    prestart()
                from qbench.pricing import with_prices
                from qbench.recipe.executor import with_executor
                from qbench.recipe.spec import load_recipe
                from qbench.report.tables import print_summary
                from qbench.sweep.runner import run_sweep

            loaded = with_executor(with_prices(load_recipe(recipe), price or []), kind=executor, address=address)
            if plan:
                from qbench.cli.plan import print_plan

                print_plan(loaded, rerun_failed=rerun_failed)
                return 0
            registry = output.registry(loaded.registry) if gate else None  # before the sweep: a bad option costs none
            if ending is not None:  # the report files say the sweep has not finished until it has
                ending.promise()
            outcome = run_sweep(loaded, track=track, resume=resume, rerun_failed=rerun_failed,
                                keep_failed=frozenset(keep_failed or ()), resume_run=resume_run)
            print_summary(outcome.results, outcome.gate, gate_notes=not gate)  # --gate's verdict prints the notes
            untracked = None if track else "the sweep was not tracked (--no-track)"
            if outcome.tracking_failure:
                untracked = "MLflow tracking failed during the sweep"
            try:
                code = (_measured_everything(outcome.results) if ending is None else
                        report_gate(loaded, outcome.results, crashed_no_pass(outcome.gate, keep_failed),
                                    outcome.results_path, ending, registry, untracked=untracked))  # fmt: skip
            finally:  # where the results are, under the verdict: a log's last lines say both, however many breaches
                err_console.print(f"results: {outcome.results_path}\nreport:  {outcome.report_path}", markup=False)
                if outcome.mlflow_run_id:
                    err_console.print(f"MLflow run: {outcome.mlflow_run_id}  (open the UI with `qbench ui {recipe}`)",
                                      markup=False)
            if outcome.tracking_failure:  # the results are complete on disk, MLflow lacks them: not a clean run
                raise QbenchError(f"{outcome.tracking_failure}; the results are complete in {outcome.run_dir}, not "
                                  f"in MLflow (log them there with `qbench track {recipe} {outcome.run_dir}`)")
            return code


def _measured_everything(results: SweepResults) -> int:
    """A sweep without --gate succeeds when every measurement it planned ran (a backend that cannot serve a
    precision skips it, which is no failure); any failed one is exit 2, named, with the results kept."""
    failed = [v for v in results.variants if v.status == "failed"]
    if failed:
        print_error(f"{len(failed)} of {len(results.variants)} measurements failed ({', '.join(v.key for v in failed)})"
                    f"; {failed[0].key}: {one_line(failed[0].error)}")  # fmt: skip
    return EXIT_ERROR if failed else EXIT_OK


@app.command()
def validate(
    recipe: RecipeArg,
    track: Annotated[bool, typer.Option(
        "--track/--no-track", help="check the tracking store too (--no-track: for a sweep run with it)"
    )] = True,
) -> int:
    """Check a recipe against its model, data and backends: FP32 runs a few rows on each backend; no variant is
    built."""
    from qbench.backends import get_backend
    from qbench.gate.report import plural
    from qbench.preflight.prepare import prepare
    from qbench.recipe.spec import load_recipe
    from qbench.validate.dry_run import dry_run

    loaded = load_recipe(recipe)
    prepared = prepare(loaded, track=track)
    for name in loaded.backends:
        dry_run(prepared, get_backend(name))
    out.print(
        f"{escape(str(recipe))}: OK — {plural(len(loaded.all_variants()), 'variant')} × "
        f"{plural(len(loaded.backends), 'backend')}, "
        f"{len(prepared.evaluation_rows)} evaluation rows, {prepared.calibration.size} calibration rows, "
        f"{len(prepared.slices)} slices ({escape(', '.join(prepared.slices)) or 'none'}); the FP32 reference runs on "
        f"{escape(', '.join(loaded.backends))}"
    )
    return 0


@app.command()
def gate(
    recipe: Annotated[Optional[Path], typer.Argument(help="recipe YAML (uses its latest results)")] = None,
    results: Annotated[Optional[Path], typer.Option("--results", help="a results.json to judge")] = None,
    no_staleness_check: Annotated[
        bool,
        typer.Option("--no-staleness-check", help="judge results whose input files can no longer be read (noted)"),
    ] = False,
    verbose: VerboseOption = False,
    junit: JunitOption = None,
    json_path: JsonOption = None,
    register: RegisterOption = None,
    alias: AliasOption = None,
    no_register: NoRegisterOption = False,
) -> int:
    """Judge results against the recipe's gate: exit 0 pass, 1 breach, 2 missing/partial/stale/broken results.

    Prints the breaches and one summary line (every check with --verbose); with GITHUB_STEP_SUMMARY
    set, also appends a Markdown table to that file. With a registry section in the recipe (or
    --register NAME), a passing gate registers its winners in the MLflow Model Registry; a failing
    one registers nothing and moves no alias.
    """
    output = GateOutput(verbose, junit, json_path, register, alias, no_register)
    output.refuse_overwriting(recipe, results)
    with stdout_kept_for_a_document(output.on_stdout()):  # `--json -`: the report alone there
        with reported_ending(output) as ending:  # the report files say how the command ended, whichever way
            with held():  # a signal during these imports too, once they are done (as in `sweep`)
                from qbench.gate.run import latest_results, run_gate
                from qbench.provenance import recorded_recipe
                from qbench.recipe.spec import load_recipe

            loaded = load_recipe(recipe) if recipe else None
            if loaded is None and results is None:
                raise QbenchError("qbench gate needs a recipe or --results FILE")
            path = results if results is not None else latest_results(loaded)  # type: ignore[arg-type]
            output.refuse_overwriting(path)  # refused: nothing is written (ReportPathRefused)
            ending.promise()  # the report files say the command has not finished until it has
            report, judged = run_gate(loaded, path, check_staleness=not no_staleness_check)
            asked = loaded
            if asked is None:  # the recipe the results embed (when it cannot be read, the report says so and exits 2)
                with contextlib.suppress(QbenchError):
                    asked = recorded_recipe(judged.recipe, path)
            registry = output.registry(asked.registry if asked is not None else None)  # option errors before any output
            try:
                return report_gate(asked, judged, report, path, ending, registry)
            finally:
                tag_tracked_runs(asked, judged, path, report)


@app.command()
def explain(
    recipe: RecipeArg,
    variant: Annotated[str, typer.Option("--variant", help="the INT8 variant to explain", show_default=False)],
    method: Annotated[str, typer.Option(help="leave_one_out | one_at_a_time | sqnr")] = "leave_one_out",
    group: Annotated[
        str, typer.Option(help="rank by node | op_type | layer | pattern (a role in every layer)")
    ] = "node",
    top: Annotated[int, typer.Option(min=1, help="rows shown and plotted")] = 20,
    max_nodes: Annotated[
        Optional[int], typer.Option(min=1, help="measure only the N noisiest groups (by SQNR)")
    ] = None,
    track: TrackOption = True,
) -> int:
    """Rank an INT8 variant's quantized nodes by what each costs the gate metric, overall and on the worst slice."""
    from qbench.explain.sensitivity import explain_table, run_explain
    from qbench.recipe.spec import load_recipe

    outcome = run_explain(
        load_recipe(recipe), variant, method=method, group_by=group, max_nodes=max_nodes, top=top, track=track
    )
    print_wide(explain_table(outcome.result, top), out)
    for note in outcome.result.notes:
        out.print(f"note: {escape(note)}")
    err_console.print(f"explain: {outcome.directory}", markup=False)  # a folder '[wip]' is no style
    if outcome.mlflow_run_id:
        err_console.print(f"MLflow run: {outcome.mlflow_run_id}", markup=False)
    return 0


@app.command()
def ui(
    recipe: RecipeArg,
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 5000,
) -> int:
    """Open the MLflow UI on 127.0.0.1 for the recipe's tracking store (Ctrl+C stops it and all its workers)."""
    from qbench.interrupt import run_process_group
    from qbench.recipe.spec import load_recipe
    from qbench.track.store import resolve_tracking_uri, ui_command

    command = ui_command(resolve_tracking_uri(load_recipe(recipe)), port=port)
    _check_port_free(port)
    err_console.print(f"MLflow UI: http://127.0.0.1:{port}  (Ctrl+C to stop)")
    code = run_process_group(command)
    if code is not None:  # the UI runs until it is stopped: ending by itself, even with status 0, is a failure
        raise QbenchError(f"the MLflow UI stopped by itself with status {code} (its messages are above); "
                          "expected it to run until Ctrl+C")  # fmt: skip
    return 0


@app.command()
def track(
    recipe: RecipeArg,
    run_dir: Annotated[Path, typer.Argument(help="the sweep's run folder (holds results.json)", show_default=False)],
) -> int:
    """Log a saved sweep to the recipe's MLflow store: one run with --no-track, or whose tracking failed while it ran.

    The runs, models and reports are logged as a tracked sweep logs them, so `qbench gate --register` can register
    its winners afterwards.
    """
    from qbench.recipe.spec import load_recipe
    from qbench.track.saved import track_run_folder

    with contextlib.redirect_stdout(sys.stderr):  # MLflow's "View run ..." lines: on stderr, as a sweep's are
        run_id, logged_now = track_run_folder(load_recipe(recipe), run_dir)
    already = "" if logged_now else f"{run_dir} is in MLflow already, nothing logged; "
    err_console.print(f"{already}MLflow run: {run_id}  (open the UI with `qbench ui {recipe}`)", markup=False)
    return 0


def _check_port_free(port: int) -> None:
    """Refuse a port something already listens on (the UI would only log the clash and end)."""
    import socket

    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise QbenchError(f"--port {port}: cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}; "
                              "expected a free port") from None  # fmt: skip


export_app = typer.Typer(no_args_is_help=True, help="Hand a gated variant to a serving system.")
app.add_typer(export_app, name="export")
app.add_typer(cache_app, name="cache")


@export_app.command(name="triton")
def export_triton(
    recipe: RecipeArg,
    variant: Annotated[str, typer.Option("--variant", help="the variant to export", show_default=False)],
    backend: Annotated[str, typer.Option("--backend", help="the backend it was measured on", show_default=False)],
    to: Annotated[Path, typer.Option("--to", help="model repository folder", show_default=False)],
    force: Annotated[bool, typer.Option("--force", help="export even if the variant did not pass the gate")] = False,
    name: Annotated[Optional[str], typer.Option("--name", help="Triton model name; default <recipe>-<variant>")] = None,
    max_queue_delay_us: Annotated[
        Optional[int], typer.Option(help="dynamic batcher's max queue delay (µs); default: the one the sweep's "
                                    "load scenario simulated (slo:), else 100", show_default=False)  # fmt: skip
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace an existing model folder")] = False,
) -> int:
    """Write a Triton model repository (config.pbtxt, 1/model.onnx, README) for a variant that passed the gate."""
    from qbench.export.triton import export_triton as export
    from qbench.recipe.spec import load_recipe

    done = export(load_recipe(recipe), variant, backend, to, force=force, model_name=name,
                  max_queue_delay_us=max_queue_delay_us, overwrite=overwrite)  # fmt: skip
    if done.gate_status != "pass":
        err_console.print(f"[yellow]warning:[/] exported with --force; gate status {escape(done.gate_status)}")
    if done.left_out:
        err_console.print(f"note: config.pbtxt leaves out output(s) {escape(', '.join(done.left_out))}: no batch "
                          "dimension for Triton's batcher to split (see its README)")
    out.print(f"Triton model: {escape(str(done.model_dir))}\nperf_analyzer commands: {escape(str(done.readme_path))}")
    return 0


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="a sweep's run folder (holds results.json)", show_default=False)],
    html: Annotated[bool, typer.Option("--html", help="also write report.html into the run folder")] = False,
) -> int:
    """Show a past sweep's summary and gate verdict (judged with the gate settings recorded in its results).

    The summary is what this command is for, so it goes to stdout (`qbench report DIR | less`), as `list` and
    `plan` print theirs; `sweep` and `gate` print it on stderr beside their progress, their stdout kept for `--json -`.
    """
    from qbench.gate.run import run_gate
    from qbench.report.html import write_html_report
    from qbench.report.tables import print_partial_run, print_summary

    unjudged = print_partial_run(run_dir, out)
    if unjudged is not None:
        raise QbenchError(unjudged)
    # a past sweep: its verdict as recorded, whether or not its inputs still exist (the note says so)
    gate, results = run_gate(
        results_path=run_dir / "results.json", check_staleness=False,
        unchecked_because="`qbench report` shows a past sweep as recorded; `qbench gate` checks its inputs",
    )  # fmt: skip
    print_summary(results, gate, out)
    if html:
        out.print(f"HTML report: {escape(str(write_html_report(results, gate, run_dir / 'report.html')))}")
    return 0


@app.command(name="list")
def list_registered() -> int:
    """What qbench can build and run here: techniques, calibrators, backends, gate metrics."""
    from qbench.backends import BACKENDS
    from qbench.tasks import TASKS
    from qbench.techniques import CALIBRATORS, TECHNIQUES

    techniques = [(n, TECHNIQUES.get(n).config.precisions) for n in TECHNIQUES.names()]
    out.print("techniques:  " + ", ".join(f"{n} ({'/'.join(p)})" for n, p in techniques))
    calibrators = [f"{n} ({'/'.join(CALIBRATORS.get(n).precisions)})" for n in CALIBRATORS.names()]
    out.print("calibrators: " + ", ".join(calibrators))
    out.print(f"backends:    {', '.join(BACKENDS.names())}")
    out.print(f"tasks:       {', '.join(TASKS.names())}")
    for task in TASKS.names():
        for info in TASKS.get(task).metric_infos:
            direction = "higher is better" if info.higher_is_better else "lower is better"
            direction += ", in the data's units" if info.data_units else ""  # default tolerances relative to FP32's
            out.print(f"metric {info.name:<15} {task:<15} {direction}: {info.description}")
    return 0


unwrap_help(app)  # every command is registered above

DEBUG_FLAG = "--debug"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `qbench` script; returns the exit code instead of raising SystemExit.

    The exit code is a contract: 0 success / gate passed, 1 gate breached (only the gate's verdict,
    `BREACH`, returned by `gate` and `sweep --gate`), 2 anything else. A QbenchError prints its one-line
    message; any other exception (SystemExit and other BaseExceptions included: a library's sys.exit, an
    interruption that escaped its handling) prints `qbench: error: <Type>: <message>` on one line, with
    the traceback only when `--debug` is given (anywhere on the command line).
    """
    args = list(argv if argv is not None else sys.argv[1:])
    debug = DEBUG_FLAG in args
    args = [a for a in args if a != DEBUG_FLAG]
    with forgiving_standard_streams():
        try:
            return _run(args, debug=debug)
        except BaseException as exc:  # noqa: BLE001 - saying what went wrong failed too: Python's exit 1 is a breach
            _last_words(exc)
            return EXIT_ERROR


# What the last words add where memory ran short while they were being put together, worked out at import, while
# there is memory: describing the error needs some, and under `ulimit -v 200 MiB` a validate said `MemoryError` or
# `SystemError` alone in two runs of three, where the third named the limit.
_OUT_OF_MEMORY = f" (out of memory{address_space_note()})"


def _last_words(exc: BaseException) -> None:
    """The one error line, written straight to descriptor 2, when printing the error through the console failed too
    (out of memory under `ulimit -v`: rich could not draw the traceback, then not the line): exit 2 with nothing
    said left a CI log with no reason at all."""
    with contextlib.suppress(BaseException):
        try:
            line = f"qbench: error: {describe(exc)}\n"
        except BaseException as failure:  # noqa: BLE001 - describing it needs memory too: its type alone then,
            short = isinstance(exc, MemoryError) or isinstance(failure, MemoryError)  # and memory where it ran short
            line = f"qbench: error: {type(exc).__name__}{_OUT_OF_MEMORY if short else ''}\n"
        os.write(2, line.encode(errors="replace"))


def _run(args: list[str], *, debug: bool) -> int:
    """The command, with SIGINT and SIGTERM raised as Interrupted wherever it is (files it writes are written whole
    or not at all: qbench.files); `qbench sweep` and `qbench ui` handle them their own way inside."""
    from qbench.interrupt import Interrupted, SignalGuard

    try:
        with library_output_on_console(logging.DEBUG if debug else logging.INFO), SignalGuard():
            result = app(args=args, prog_name="qbench", standalone_mode=False)
    except QbenchError as exc:
        print_error(one_line(exc))
        return EXIT_ERROR
    except typer.Exit as exc:  # --help and the like
        return EXIT_OK if exc.exit_code == 0 else EXIT_ERROR
    except (typer.Abort, KeyboardInterrupt, Interrupted):  # Ctrl+C, a signal: not a verdict
        err_console.print("qbench: error: interrupted", markup=False)
        return EXIT_ERROR
    except TyperException as exc:  # usage errors (typer vendors click's exceptions under this base)
        exc.show()
        return EXIT_ERROR
    except BaseException as exc:  # noqa: BLE001 - a bug in qbench or a library, an exit from inside: still exit 2
        if debug:  # drawing the traceback takes memory a MemoryError lacked: its failure leaves the line below
            with contextlib.suppress(Exception):
                err_console.print_exception()
        print_error(describe(exc), prefix="qbench: error: ")
        return EXIT_ERROR
    if result is BREACH:
        return EXIT_BREACH
    result = EXIT_OK if result is None else result
    if type(result) is int and result in (EXIT_OK, EXIT_ERROR):
        return result
    err_console.print(f"qbench: error: the command ended with status {result!r}, not a verdict", markup=False)
    return EXIT_ERROR
