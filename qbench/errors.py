"""Error types.

`QbenchError` is a problem with the user's input or environment: the CLI prints
its message on one line and exits 2, never a traceback. Anything else that
escapes is a bug in qbench and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path


class QbenchError(Exception):
    """A user-facing error: bad recipe, bad data, missing extra, unusable results."""

    exit_code = 2


class RecipeError(QbenchError):
    """A recipe (or a file it names) is not what qbench expected.

    The message always reads ``<file>: <field>: <what was expected>``.
    """

    def __init__(self, file: str | Path, field: str, message: str) -> None:
        self.file = str(file)
        self.field = field
        self.detail = message
        super().__init__(f"{self.file}: {field}: {message}" if field else f"{self.file}: {message}")


class MissingExtraError(QbenchError):
    """An optional SDK is not installed; the message names the extra that brings it."""

    def __init__(self, what: str, extra: str, hint: str = "") -> None:
        message = f"{what} is not installed: install it with `pip install 'qbench[{extra}]'`"
        super().__init__(f"{message}. {hint}".rstrip(". ") if hint else message)
        self.extra = extra


def did_you_mean(got: str, choices: Iterable[str]) -> str:
    """Return ' (did you mean 'x'?)' when one of `choices` is close to `got`, else ''."""
    close = difflib.get_close_matches(str(got), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def expected_one_of(got: object, choices: Iterable[str]) -> str:
    """Message for a value outside a closed set: "got 'x', expected one of a, b (did you mean 'a'?)"."""
    options = sorted(str(c) for c in choices)
    return f"got {got!r}, expected one of {', '.join(options)}{did_you_mean(str(got), options)}"
