"""The CLI's rendering: one console for human output (stderr), the library's log records and progress on it."""

from __future__ import annotations

import codecs
import contextlib
import copy
import inspect
import io
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from rich.console import Console, ConsoleDimensions, RenderableType
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from qbench.progress import reporting_progress


class CliConsole(Console):
    """A rich console whose reader may go away (`qbench gate --verbose | head -1`): the rest of its output is
    dropped and the command goes on to its end (its report files, its exit code). Rich's default ends the
    program there (SystemExit(1)), which would turn any verdict into an error.

    Emoji codes are off: a message quoting a factory `mypkg.models:loop:` or a path must print as it is, not
    with `:loop:` drawn as an emoji (markup is escaped; emoji codes are not markup)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("emoji", False)
        super().__init__(*args, **kwargs)

    @property
    def size(self) -> ConsoleDimensions:
        """Rich's size, save that a width under one column (`COLUMNS=0`, which some CI runners set) is taken as
        80: rich would print every line as nothing there, the verdict and the errors included."""
        width, height = super().size
        return ConsoleDimensions(width if width > 0 else FALLBACK_WIDTH, height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size

    def on_broken_pipe(self) -> None:
        if not discard_output(self.file):
            self.quiet = True

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        """Rich's rendering, save that in a log (not a person's terminal) no line ends in spaces: rich pads every
        table cell and title to the table's width, which left 36 lines of a sweep's summary ending in up to 150
        spaces (noise in a CI log, and in a diff of two logs)."""
        return super()._render_buffer(buffer if interactive(self) else without_trailing_spaces(buffer))


def without_trailing_spaces(segments: Iterable[Segment]) -> Iterator[Segment]:
    """`segments` with the spaces at the end of each line left out, whatever style each piece of them has (a padded
    cell, the table's own padding); control segments are kept, in order. A line not ended yet keeps its spaces: the
    next print may go on with it."""
    held: list[Segment] = []  # since the last visible character on the current line: spaces and controls
    for segment in segments:
        if segment.control:
            held.append(segment)
            continue
        lines = segment.text.split("\n")
        for index, line in enumerate(lines):
            if index > 0:  # a newline ended the line: its held spaces go, its controls stay
                yield from (kept for kept in held if kept.control)
                held.clear()
                yield Segment.line()
            visible = line.rstrip(" ")
            if visible:
                yield from held
                held.clear()
                yield Segment(visible, segment.style)
            if len(visible) < len(line):
                held.append(Segment(line[len(visible):], segment.style))
    yield from held


FALLBACK_WIDTH = 80


def interactive(target: Console) -> bool:
    """Whether `target` writes to a person's terminal: the stream itself is a TTY. FORCE_COLOR (or TTY_COMPATIBLE)
    makes rich treat any stream as a terminal, to colour a CI log; it colours the log and nothing more: a log gets
    no progress frames (carriage returns, cursor moves) and no table folded to the terminal's width."""
    isatty = getattr(target.file, "isatty", None)
    try:
        return target.is_terminal and isatty is not None and bool(isatty())
    except (OSError, ValueError):  # a closed stream
        return False


def discard_output(stream: IO[str]) -> bool:
    """Point `stream`'s file descriptor at the null device, as Python's documentation advises on a BrokenPipeError
    (what is still buffered, and every later write, goes nowhere instead of raising again); False when the stream
    has no file descriptor."""
    try:
        descriptor = stream.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        return False
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, descriptor)
    finally:
        os.close(devnull)
    return True


def make_console(*, stderr: bool) -> Console:
    """A console that never breaks a line itself (soft wrap): in a CI log (no terminal, 80 columns
    by default) a path or a long message stays one unbroken line; a terminal folds it on screen only."""
    return CliConsole(stderr=stderr, soft_wrap=True)


console = make_console(stderr=True)
stdout_console = make_console(stderr=False)


class ForgivingStream:
    """A standard stream whose reader may go away (`qbench --help | head -1`, `qbench gate ... | head`): from the
    first write that finds the pipe closed (BrokenPipeError), the stream is pointed at the null device and the rest
    of the output is dropped quietly, wherever it is written from (rich, typer's help, click, print, logging). What
    the reader does with the output is its own choice, not an error of the command: the command goes on to its own
    end and exit code (a gate's verdict, its report files), as `git log | head` ends quietly."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                self._drop_the_rest()
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._drop_the_rest()

    def _drop_the_rest(self) -> None:
        self.reader_gone = True
        if discard_output(self.stream):  # what is still buffered goes to the null device now, not at exit
            with contextlib.suppress(OSError, ValueError):
                self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno, buffer...: the stream's own
        return getattr(self.stream, name)


PLAIN_FALLBACK = "qbench-plain"
# qbench's own symbols, as a stream that cannot encode them prints them (any other character: '?')
_PLAIN = {"—": "-", "–": "-", "×": "x", "→": "->", "±": "+/-", "…": "...", "·": ".", "≥": ">=", "≤": "<=",
          "²": "^2", "µ": "u", "σ": "sigma", "√": "sqrt", "✓": "ok", "✗": "no", "⚠": "!"}  # fmt: skip


def _plain_fallback(error: UnicodeError) -> tuple[str, int]:
    """The codec error handler PLAIN_FALLBACK: qbench's symbols as ASCII (`0.9000 -> 0.8500`), others as '?'."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    unencodable = error.object[error.start : error.end]
    return "".join(_PLAIN.get(character, "?") for character in unencodable), error.end


codecs.register_error(PLAIN_FALLBACK, _plain_fallback)


@contextlib.contextmanager
def forgiving_standard_streams() -> Iterator[None]:
    """While a command runs, printing never decides its exit code: a character that stdout or stderr cannot encode
    (PYTHONIOENCODING=ascii, a latin-1 terminal, LANG=C) is printed in ASCII (`—` as `-`, `×` as `x`, `→` as `->`)
    or as '?' (PLAIN_FALLBACK), and a stream whose reader went away is dropped from then on (ForgivingStream); when
    the command ends, such a stream is pointed at the null device, so that the final flush cannot fail."""
    streams = [stream for stream in (sys.stdout, sys.stderr) if isinstance(stream, io.TextIOWrapper)]
    previous = [stream.errors for stream in streams]
    for stream in streams:
        stream.reconfigure(errors=PLAIN_FALLBACK)
    standard = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (ForgivingStream(stream) for stream in standard)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = standard
        for stream, errors in zip(streams, previous):
            try:
                stream.flush()
            except BrokenPipeError:
                discard_output(stream)
            with contextlib.suppress(OSError, ValueError):  # a stream closed or broken for good: nothing to restore
                stream.reconfigure(errors=errors)


STDOUT_PATH = "-"
_documents: list[IO[str]] = []


def names_stdout(path: os.PathLike[str] | str) -> bool:
    """Whether an output path is this process's stdout: `-`, or a name of the same file (`/dev/stdout`, the file
    the shell redirected stdout to)."""
    if os.fspath(path) == STDOUT_PATH:
        return True
    try:
        return os.path.samestat(os.stat(path), os.fstat(1))
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def stdout_kept_for_a_document(keep: bool = True) -> Iterator[None]:
    """While open (with `keep`), stdout is kept for one machine-readable document (`qbench gate --json - | jq`):
    whatever else is printed to stdout goes to stderr, so that the reader gets the document alone, valid."""
    if not keep:
        yield
        return
    _documents.append(sys.stdout)
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout = _documents.pop()


def write_document(text: str) -> None:
    """Write a document to stdout (the one kept by stdout_kept_for_a_document, when open)."""
    stream = _documents[-1] if _documents else sys.stdout
    stream.write(text)
    stream.flush()


def print_error(message: str, *, prefix: str = "error: ") -> None:
    """The command's error line on qbench's console: `prefix` in red, then `message` as written (no markup read
    from it), on one line that is never folded, as a CI log keeps it; under GitHub Actions, its annotation too."""
    console.print(Text.assemble((prefix, "red"), message), soft_wrap=True)
    annotate_error("qbench", message)


def annotate_error(title: str, message: str, target: Console | None = None) -> None:
    """Under GitHub Actions (GITHUB_ACTIONS=true), also say `message` as an `::error` workflow command on `target`
    (default: qbench's console, on stderr, which a `--json -` document never shares): the runner shows it as an
    annotation on the run's page and the pull request's checks, where the reason a step failed was otherwise only
    `Process completed with exit code 1` until someone opened the log. Elsewhere, nothing."""
    if os.environ.get("GITHUB_ACTIONS") != "true":
        return
    line = f"::error title={_command_escaped(title, ':,')}::{_command_escaped(message)}"
    (target or console).print(line, markup=False, highlight=False, soft_wrap=True)


def _command_escaped(text: str, also: str = "") -> str:
    """`text` as a workflow command's value: '%', CR and LF (and in a property `also`: ':' and ',') percent-encoded,
    as the runner decodes them, so that a message stays one command and is shown as written."""
    return "".join(f"%{ord(c):02X}" if c in "%\r\n" + also else c for c in text)


class RichProgress:
    """Progress on qbench's console for the library's long loops (a qbench.progress reporter).

    On a terminal, bars removed when done. Elsewhere (a CI log, a file), a unit of work that runs long prints one
    plain line at most every `every_s` seconds (`fp32@onnxruntime-cpu evaluate: 40/100 after 1m00s`): a job that
    works for an hour shows it is alive (some CI services stop a job silent for 10 minutes) in a bounded number of
    lines, never bar frames."""

    def __init__(self, target: Console | None = None, every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.console = target or console
        self.every_s = every_s
        self.clock = clock

    def steps(self, description: str, total: int | None) -> contextlib.AbstractContextManager[Callable[[int], None]]:
        if interactive(self.console):
            return self._bars(description, total)
        return self._lines(description, total)

    @contextlib.contextmanager
    def _lines(self, description: str, total: int | None) -> Iterator[Callable[[int], None]]:
        start = self.clock()
        shown = start
        done = 0

        def advance(steps: int) -> None:
            nonlocal done, shown
            done += steps
            now = self.clock()
            if now - shown >= self.every_s:
                shown = now
                minutes, seconds = divmod(int(now - start), 60)
                count = f"{done}/{total}" if total is not None else str(done)
                self.console.print(f"{description}: {count} after {minutes}m{seconds:02d}s", markup=False,
                                   highlight=False, soft_wrap=True)  # fmt: skip

        yield advance

    @contextlib.contextmanager
    def _bars(self, description: str, total: int | None) -> Iterator[Callable[[int], None]]:
        """The bars are removed when the block ends. Removing them writes too: after an error in the block (a
        stream that could not be written), an error of that clean-up is dropped, so the first error is the one
        reported."""
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        bars = Progress(*columns, console=self.console, transient=True)
        bars.start()
        try:
            task = bars.add_task(description, total=total)
            yield lambda done: bars.advance(task, done)
        except BaseException:
            with contextlib.suppress(Exception):
                bars.stop()
            raise
        bars.stop()


SHOWN_IN_SUMMARY = "qbench_shown_in_summary"
"""The attribute (`logger.warning(note, extra={SHOWN_IN_SUMMARY: True})`) of a log record whose message is also one of
the notes under the summary table that the command prints next (qbench.report.tables.print_summary): the console leaves
the note to the table. Both printed it: the same 250-character warning twice, three lines apart, in every sweep's
log."""


class ConsoleLogHandler(logging.Handler):
    """Renders the library's log records on qbench's console: plain messages, warnings and errors
    prefixed as such (no markup is read from a message, so paths and brackets print as they are); a record
    the summary table will show (SHOWN_IN_SUMMARY) is left to it."""

    _PREFIX = {logging.WARNING: ("warning: ", "yellow"), logging.ERROR: ("error: ", "red")}

    def __init__(self, target: Console | None = None) -> None:
        super().__init__(level=logging.INFO)
        self.console = target or console

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, SHOWN_IN_SUMMARY, False):
            return
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


class OtherLibrariesWarnings(logging.StreamHandler):
    """The root logger's handler while the CLI runs: other libraries' warnings and errors on stderr, each on a line
    naming its level and logger (`warning from mlflow.tracking: ...`: Python's own fallback printed the bare message,
    which read as qbench's in a CI log); qbench's own records are left to the console handler. Being there, it also
    turns a third-party `logging.basicConfig` (some ONNX Runtime quantization modules call it on import) into a
    no-op, which would otherwise print every qbench line a second time."""

    def __init__(self) -> None:
        super().__init__()
        self.setLevel(logging.WARNING)
        self.addFilter(lambda record: not record.name.startswith("qbench"))
        self.setFormatter(_FromLibrary())


class _FromLibrary(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return f"{record.levelname.lower()} from {record.name}: {record.message}"


@contextlib.contextmanager
def library_output_on_console(level: int = logging.INFO) -> Iterator[None]:
    """While open: the `qbench` loggers print on the console at `level` and up, and long loops draw bars."""
    logger = logging.getLogger("qbench")
    handler = ConsoleLogHandler()
    previous_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    root = logging.getLogger()
    others = OtherLibrariesWarnings() if not root.handlers else None
    if others is not None:
        root.addHandler(others)
    try:
        with reporting_progress(RichProgress()):
            yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)
        if others is not None:
            root.removeHandler(others)


def print_wide(renderable: RenderableType, target: Console | None = None) -> None:
    """Print on `target` (default: qbench's console); in logs (no terminal, whatever FORCE_COLOR says: 80 columns
    by default) wide enough that tables do not fold, and a table's title and caption each on lines of their own,
    whole: rich folds them to the table's width however wide the console is (`qbench explain`'s title, naming the
    variant, its drop and its worst slice, was folded mid-sentence at the width of its columns)."""
    target = target or console
    if interactive(target):
        target.print(renderable)
        return
    above, table, below = _apart(target, renderable)
    natural = Measurement.get(target, target.options.update_width(10_000), table).maximum
    wide = CliConsole(file=target.file, width=max(target.width, natural), color_system=target.color_system)
    for part in (above, table, below):
        if part is not None:
            wide.print(part, soft_wrap=part is not table)


def _apart(target: Console, renderable: RenderableType) -> tuple[Text | None, RenderableType, Text | None]:
    """A table's title, the table without its title and caption, and its caption (each title or caption in its
    table's style for it; a str one read as rich reads it, markup and all); other renderables as they are."""
    if not isinstance(renderable, Table) or (renderable.title is None and renderable.caption is None):
        return None, renderable, None

    def line(text: str | Text | None, style: str | Style) -> Text | None:
        if text is None:
            return None
        if isinstance(text, str):
            return target.render_str(text, style=style, highlight=False)
        return Text.assemble(text, style=style)

    bare = copy.copy(renderable)
    bare.title = bare.caption = None
    return (line(renderable.title, renderable.title_style or "table.title"), bare,
            line(renderable.caption, renderable.caption_style or "table.caption"))  # fmt: skip


def unwrap_help(typer_app: Any) -> None:
    """Give every command of a typer app (and of the apps added under it) the help its docstring writes, each
    paragraph on one line, for the help screen to wrap at its own width. Typer joins the lines of a docstring's
    first paragraph but keeps the source's line breaks in the others, so `qbench gate --help` broke mid-sentence
    ("with\\n GITHUB_STEP_SUMMARY\\n set") wherever the source wrapped at 120 columns, in a terminal and a CI log
    alike."""
    for command in typer_app.registered_commands:
        written = command.help if command.help is not None else inspect.getdoc(command.callback)
        if written:
            command.help = "\n\n".join(" ".join(paragraph.split()) for paragraph in written.split("\n\n"))
    for group in typer_app.registered_groups:
        unwrap_help(group.typer_instance)
