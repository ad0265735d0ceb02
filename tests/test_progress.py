"""Progress reporting: library loops report to the reporter their caller passed in, and to nobody otherwise."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest
from rich.console import Console

from qbench.console import ConsoleLogHandler
from qbench.progress import reporting_progress, track, track_rows


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    @contextlib.contextmanager
    def steps(self, description: str, total: int | None) -> Iterator:
        self.events.append(("start", (description, total)))
        yield lambda done: self.events.append(("advance", done))
        self.events.append(("end", description))


def test_track_reports_each_item_to_the_reporter_passed_in() -> None:
    recorder = Recorder()
    with reporting_progress(recorder):
        assert list(track("abc", "letters", total=3)) == ["a", "b", "c"]
    assert recorder.events == [("start", ("letters", 3)), ("advance", 1), ("advance", 1), ("advance", 1),
                               ("end", "letters")]  # fmt: skip


def test_track_rows_advances_by_the_rows_done_and_nothing_outside_the_block_is_reported() -> None:
    recorder = Recorder()
    with reporting_progress(recorder), track_rows(10, "rows") as advance:
        advance(4)
        advance(6)
    assert list(track([1, 2], "after the block")) == [1, 2]  # the silent default: no reporter, no error
    assert recorder.events == [("start", ("rows", 10)), ("advance", 4), ("advance", 6), ("end", "rows")]


def test_console_handler_prefixes_warnings_and_prints_brackets_literally() -> None:
    target = Console(record=True, width=200, soft_wrap=True)
    logger = logging.getLogger("qbench.test_progress")
    handler = ConsoleLogHandler(target)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)  # the handler, not the logger, decides what is shown
    try:
        logger.warning("slice %s: [bold]not markup[/]", "kind=hot")
        logger.info("plain")
        logger.debug("hidden below INFO")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    assert target.export_text().splitlines() == ["warning: slice kind=hot: [bold]not markup[/]", "plain"]


def test_cli_shows_library_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    from qbench.cli.app import main

    def noisy() -> None:
        logging.getLogger("qbench.anything").warning("seen on the console")

    from qbench.cli import app as cli

    @cli.app.command("noisy-test-command", hidden=True)
    def _noisy() -> None:
        noisy()

    try:
        assert main(["noisy-test-command"]) == 0
    finally:
        cli.app.registered_commands.pop()
    assert "warning: seen on the console" in capsys.readouterr().err


def test_cli_prints_each_library_line_once_when_a_third_party_calls_basic_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An import during the run that calls logging.basicConfig must not make qbench's lines print twice; other
    libraries' warnings still reach stderr, once."""
    from qbench.console import library_output_on_console

    root = logging.getLogger()
    saved = root.handlers[:]  # pytest's own capture handlers would make basicConfig a no-op by themselves
    root.handlers.clear()
    try:
        with library_output_on_console():
            logging.basicConfig(format="ROOT %(name)s: %(message)s")
            logging.getLogger("qbench.search.run").info("screen candidate: cosine 0.998")
            logging.getLogger("thirdparty.kernels").warning("optional kernel missing")
        assert root.handlers == []  # nothing of the CLI's is left behind
    finally:
        root.handlers[:] = saved
    err = capsys.readouterr().err
    assert err.count("screen candidate: cosine 0.998") == 1 and "ROOT qbench" not in err
    assert err.count("optional kernel missing") == 1
    assert "warning from thirdparty.kernels: optional kernel missing" in err.splitlines()  # whose it is, said
