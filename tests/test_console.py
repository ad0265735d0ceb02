"""The CLI's rich console."""

from __future__ import annotations

import io
import logging
import re

import pytest
from rich.markup import escape
from rich.table import Table

from qbench.console import SHOWN_IN_SUMMARY, CliConsole, ConsoleLogHandler, annotate_error, print_wide


def test_emoji_codes_in_a_message_print_as_written() -> None:
    """`the ONNX export of mypkg.models:loop: ...` printed as `mypkg.models➿ ...`: rich replaced `:loop:`."""
    out = io.StringIO()
    CliConsole(file=out, width=200).print(f"[red]error:[/] {escape('the ONNX export of mypkg.models:loop: follows')}")
    assert out.getvalue() == "error: the ONNX export of mypkg.models:loop: follows\n"


def _table(title: str) -> Table:
    table = Table(title=title, box=None)
    table.add_column("variant")
    table.add_column("result", style="red")
    table.add_row("fp32", "not gated")
    table.add_row("int8-minmax-calibrated", "PASS")
    return table


@pytest.mark.parametrize("colour", [False, True], ids=["plain", "FORCE_COLOR"])
def test_no_line_of_a_table_in_a_log_ends_in_spaces(colour: bool) -> None:
    """Rich pads each cell and the title to the table's width: a sweep's summary in a CI log had 36 lines ending in
    up to 150 spaces. Spaces inside a line, and the columns' alignment, stay."""
    out = io.StringIO()
    print_wide(_table("Summary: digits"), CliConsole(file=out, width=80, force_terminal=colour))
    lines = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue()).splitlines()
    assert lines and not [line for line in lines if line.endswith(" ")]
    rows = [line for line in lines if "fp32" in line or "int8" in line]
    assert len({line.index(cell) for line, cell in zip(rows, ("not gated", "PASS"))}) == 1
    assert ("\x1b[" in out.getvalue()) == colour


def test_a_line_not_ended_yet_keeps_its_spaces() -> None:
    out = io.StringIO()
    console = CliConsole(file=out, width=80)
    console.print("gate:  ", end="")
    console.print("PASS")
    assert out.getvalue() == "gate:  PASS\n"


def test_a_terminal_gets_rich_own_padding() -> None:
    """Only a log is trimmed: on a terminal (a TTY), rich draws as it always does."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    print_wide(_table("Summary"), CliConsole(file=out, width=80, force_terminal=True))
    assert any(line.endswith(" ") for line in re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue()).splitlines())


def test_a_table_title_wider_than_the_log_prints_on_one_line() -> None:
    """`qbench explain`'s title (the variant, its drop, the worst slice) folded mid-sentence at 80 columns."""
    path = "/home/runner/work/project/project/reports/digits-cnn/explain-int8-minmax-20261129-090802-f8608a"
    title = f"int8-minmax (minmax): leave_one_out by node, accuracy, written to {path}"
    out = io.StringIO()
    print_wide(_table(title), CliConsole(file=out, width=80))
    assert title in out.getvalue().splitlines()


def test_a_warning_the_summary_table_shows_is_left_to_it() -> None:
    """The sweep's timing warnings (other processes busy, timings from several machines) are also notes under the
    summary table: the log printed each twice, three lines apart. Other warnings print as before."""
    out = io.StringIO()
    logger = logging.getLogger("qbench.test_console")
    handler = ConsoleLogHandler(CliConsole(file=out, width=80))
    logger.addHandler(handler)
    try:
        logger.warning("onnxruntime-cpu: other processes kept 1.84 CPUs busy", extra={SHOWN_IN_SUMMARY: True})
        logger.warning("the stored check cannot be read")
    finally:
        logger.removeHandler(handler)
    assert out.getvalue().splitlines() == ["warning: the stored check cannot be read"]



def test_an_annotation_is_one_workflow_command_under_github_actions_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A message holding a newline, '%' or (in the title) ':' and ',' would end the command early or be read as
    another: each is percent-encoded, as the runner decodes it."""
    out = io.StringIO()
    target = CliConsole(file=out, width=20)
    annotate_error("qbench gate", "drop 5% > 1%\nof: a, b", target)
    assert out.getvalue() == ""
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    annotate_error("gate: a, b", "drop 5% > 1%\r\nof: a, b", target)
    assert out.getvalue() == "::error title=gate%3A a%2C b::drop 5%25 > 1%25%0D%0Aof: a, b\n"


def test_a_commands_help_is_unwrapped_paragraph_by_paragraph_under_every_group() -> None:
    """Typer keeps the docstring's line breaks after its first paragraph, so the help screen broke lines where the
    source did: each paragraph becomes one line (the screen wraps it), paragraphs stay apart, in added apps too."""
    import typer

    from qbench.console import unwrap_help

    app, group = typer.Typer(), typer.Typer()

    @app.command()
    def top() -> None:
        """Short summary
        of the command.

        A second paragraph the source
        wrapped   at its width."""

    @group.command(help="given\nas an option")
    def inner() -> None:
        pass

    app.add_typer(group, name="group")
    unwrap_help(app)
    assert app.registered_commands[0].help == "Short summary of the command.\n\nA second paragraph the source wrapped at its width."
    assert group.registered_commands[0].help == "given as an option"
