"""The CLI's rendering: one console for human output (stderr), the library's log records and progress on it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from qbench.progress import reporting_progress


def make_console(*, stderr: bool) -> Console:
    """A console that never breaks a line itself (soft wrap): in a CI log (no terminal, 80 columns
    by default) a path or a long message stays one unbroken line; a terminal folds it on screen only."""
    return Console(stderr=stderr, soft_wrap=True)


console = make_console(stderr=True)


class RichProgress:
    """Progress bars on qbench's console for the library's long loops (a qbench.progress reporter).

    Drawn only on a terminal and removed when done: a CI log gets the log lines, not bar frames."""

    def __init__(self, target: Console | None = None) -> None:
        self.console = target or console

    @contextlib.contextmanager
    def steps(self, description: str, total: int | None) -> Iterator[Callable[[int], None]]:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=self.console, transient=True, disable=not self.console.is_terminal) as bars:
            task = bars.add_task(description, total=total)
            yield lambda done: bars.advance(task, done)


class ConsoleLogHandler(logging.Handler):
    """Renders the library's log records on qbench's console: plain messages, warnings and errors
    prefixed as such (no markup is read from a message, so paths and brackets print as they are)."""

    _PREFIX = {logging.WARNING: ("warning: ", "yellow"), logging.ERROR: ("error: ", "red")}

    def __init__(self, target: Console | None = None) -> None:
        super().__init__(level=logging.INFO)
        self.console = target or console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            level = max((lvl for lvl in self._PREFIX if record.levelno >= lvl), default=None)
            text = Text()
            if level is not None:
                prefix, style = self._PREFIX[level]
                text.append(prefix, style=style)
            text.append(message)
            self.console.print(text, soft_wrap=True)
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)


@contextlib.contextmanager
def library_output_on_console(level: int = logging.INFO) -> Iterator[None]:
    """While open: the `qbench` loggers print on the console at `level` and up, and long loops draw bars.
    They stop propagating meanwhile: a third-party import that calls `logging.basicConfig` (some of ONNX
    Runtime's quantization modules do) would otherwise print every line a second time."""
    logger = logging.getLogger("qbench")
    handler = ConsoleLogHandler()
    previous_level, previous_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    try:
        with reporting_progress(RichProgress()):
            yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)
        logger.propagate = previous_propagate


def print_wide(renderable: RenderableType, target: Console | None = None) -> None:
    """Print on `target` (default: qbench's console); in logs (no terminal: 80 columns by default)
    wide enough that tables do not fold."""
    target = target or console
    if target.is_terminal:
        target.print(renderable)
        return
    natural = Measurement.get(target, target.options.update_width(10_000), renderable).maximum
    Console(file=target.file, width=max(target.width, natural), color_system=target.color_system).print(renderable)
