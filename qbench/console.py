"""One console for qbench's human output (stderr), and progress bars on long loops."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

T = TypeVar("T")



def make_console(*, stderr: bool) -> Console:
    """A console that never breaks a line itself (soft wrap): in a CI log (no terminal, 80 columns
    by default) a path or a long message stays one unbroken line; a terminal folds it on screen only."""
    return Console(stderr=stderr, soft_wrap=True)


console = make_console(stderr=True)


def _progress() -> Progress:
    """A transient progress display, drawn only on a terminal."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=console, transient=True, disable=not console.is_terminal)


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate with a transient progress bar (drawn only on a terminal)."""
    with _progress() as progress:
        yield from progress.track(items, total=total, description=description)


@contextlib.contextmanager
def track_rows(total: int, description: str) -> Iterator[Callable[[int], None]]:
    """A progress bar over `total` rows for loops whose steps vary in size; yields `advance(rows)`."""
    with _progress() as progress:
        task = progress.add_task(description, total=total)
        yield lambda rows: progress.advance(task, rows)


def print_wide(renderable: RenderableType, target: Console | None = None) -> None:
    """Print on `target` (default: qbench's console); in logs (no terminal: 80 columns by default)
    wide enough that tables do not fold."""
    target = target or console
    if target.is_terminal:
        target.print(renderable)
        return
    natural = Measurement.get(target, target.options.update_width(10_000), renderable).maximum
    Console(file=target.file, width=max(target.width, natural), color_system=target.color_system).print(renderable)
