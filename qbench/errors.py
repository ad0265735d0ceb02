"""Error types.

`QbenchError` is a problem with the user's input or environment: the CLI prints
its message on one line and exits 2, never a traceback. Anything else that
escapes is a bug in qbench and keeps its traceback.
"""

from __future__ import annotations

import difflib
import errno
import re
import reprlib
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

MAX_VALUE_CHARS = 60
"""Longest rendering of a user's value inside a message: a pathological value never floods a log, while the message
around it (what was expected, the fix, which usually comes last) is never cut."""
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist, _SHORT.maxtuple = 3, 4, 6, 6
_SHORT.maxstring, _SHORT.maxother = MAX_VALUE_CHARS, 40


class QbenchError(Exception):
    """A user-facing error: bad recipe, bad data, missing extra, unusable results."""

    exit_code = 2


class RecipeError(QbenchError):
    """A recipe (or a file it names) is not what qbench expected.

    The message always reads ``<file>: <field>: <what was expected>``.
    """

    def __init__(self, file: str | Path, field: str, message: str) -> None:
        self.file = str(file)
        self.field = one_line(field, MAX_VALUE_CHARS * 2)
        self.detail = one_line(message)
        text = f"{self.file}: {self.field}: {self.detail}" if self.field else f"{self.file}: {self.detail}"
        super().__init__(one_line(text))


class MachineSetupError(QbenchError):
    """A runtime cannot run a model on this machine for something the machine lacks (a locale a text node asks for),
    not for what the model asks of the runtime: re-exporting the model at other versions would not help."""


class MissingExtraError(QbenchError):
    """An optional SDK is not installed; the message names the extra that brings it. Raised while an ImportError that
    found the package but could not load it is handled (a shared library that could not be mapped under `ulimit -v`,
    a symbol a wrong build lacks), it says so and why: `onnxruntime is not installed` under a 400 MiB limit sent
    users to reinstall a package that was there."""

    def __init__(self, what: str, extra: str, hint: str = "") -> None:
        failed = sys.exc_info()[1]
        if isinstance(failed, ImportError) and not isinstance(failed, ModuleNotFoundError):
            super().__init__(f"{what} is installed but could not be loaded ({one_line(failed)}); if it is a broken "
                             "install, reinstall it with "
                             f"`pip install --force-reinstall 'qbench[{extra}]'`")  # fmt: skip
            self.extra = extra
            return
        message = f"{what} is not installed: install it with `pip install 'qbench[{extra}]'`"
        super().__init__(f"{message}. {hint}".rstrip(". ") if hint else message)
        self.extra = extra


# A run of whitespace that breaks or tabs a line: spaces around a line break, an indented continuation
_LINE_BREAKS = re.compile(r" *(?:[\n\r\t\v\f\x1c-\x1e\x85\u2028\u2029] *)+")


NAMED_SCOPES = 5
"""Scopes a one-line verdict names (unresolved passes, breaching slices, skipped slices) before counting the rest:
with 1,000 slices of 20 rows each, one variant's unresolved note was a line of 149 KB. The JSON report lists each
scope (its checks, and `unresolved`: every reason)."""


def named_some(items: Sequence[str], separator: str = ", ") -> str:
    """'a, b, c, d, e and 3 more': at most NAMED_SCOPES of `items`, the rest counted, so a line stays a line."""
    return first_named(items, NAMED_SCOPES, separator)


def one_line(text: object, limit: int | None = None) -> str:
    """`text` (a message, an exception) with every run of whitespace that holds a line break or a tab made one space,
    whole. Runs of spaces alone are kept: they are part of a value quoted in the message (a slice value '  ' of two
    spaces was shown as ' ', and the named slice the error wrote to join it, `in: ["", " "]`, missed its rows).

    `limit` cuts it to that many characters, ending in '…': only for a table cell or a tag, or for another library's
    text quoted inside a message of qbench's own, never for a message shown to the user as a whole (its end is
    usually the fix)."""
    flat = _LINE_BREAKS.sub(" ", str(text)).strip()
    return flat if limit is None or len(flat) <= limit else flat[: limit - 1] + "…"


def short_repr(value: object, limit: int = MAX_VALUE_CHARS) -> str:
    """repr(value) for a message: long strings, lists and dicts abbreviated with '...', at most `limit` characters."""
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def did_you_mean(got: str, choices: Iterable[str]) -> str:
    """Return ' (did you mean 'x'?)' when one of `choices` is close to `got`, else ''."""
    got = str(got)
    if len(got) > MAX_VALUE_CHARS:  # difflib is quadratic: a pathological value is not a typo
        return ""
    close = difflib.get_close_matches(got, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def plain_name(name: str) -> str:
    """A name from a model or the data as it is where it prints as itself, else quoted with escapes: ' s' would read
    as s, and a converter's 'a\nb' would split a one-line error in two."""
    return name if name and name == name.strip() and name.isprintable() else repr(name)


def expected_one_of(got: object, choices: Iterable[str], *, hint: str | None = None) -> str:
    """Message for a value outside a closed set: "got 'x', expected one of a, b (did you mean 'a'?)". `hint`, where
    the caller knows what `got` means (another tool's name for one of `choices`), replaces the guess by spelling."""
    options = sorted(str(c) for c in choices)
    guess = did_you_mean(str(got), options) if hint is None else f" ({hint})"
    return f"got {short_repr(got)}, expected one of {names_listed(options)}{guess}"


def names_listed(names: Iterable[str]) -> str:
    """`names` sorted and joined by commas, each as it prints (plain_name), quoted where it holds a comma: a CSV
    header's ' Mean Radius ' listed plainly read as 'Mean Radius', and the did-you-mean beside it differed."""
    return ", ".join(repr(n) if "," in n else plain_name(n) for n in sorted(str(n) for n in names))


def first_named(items: Sequence[str], most: int, separator: str = ", ") -> str:
    """'a, b, c and 3 more': the first `most` of `items`, the rest counted, so a line stays a line."""
    shown = separator.join(items[:most])
    return f"{shown} and {len(items) - most} more" if len(items) > most else shown


OUT_OF_MEMORY = "out of memory"  # environment_cause's word for a failed allocation
_ENVIRONMENT_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "a read-only file system",
    errno.EFBIG: "a file size limit",  # `ulimit -f` in a CI step's shell (or the file system's largest file)
    errno.ENOMEM: OUT_OF_MEMORY,
    errno.EIO: "an I/O error",
    errno.ETIMEDOUT: "a timeout",
}

# How runtimes word an allocation that failed when they raise something other than MemoryError: ONNX Runtime's
# Fail / RuntimeException ("Failed to allocate memory for requested buffer" from its BFCArena, "Available memory of
# ... is smaller than requested bytes", a C++ "std::bad_alloc" / MSVC "bad allocation"), its CUDA provider and
# torch's ("CUDA failure 2: out of memory", "CUBLAS_STATUS_ALLOC_FAILED", cudaErrorMemoryAllocation), and torch's CPU
# allocator (a RuntimeError: "DefaultCPUAllocator: can't allocate memory ... (Cannot allocate memory)"), and the
# dynamic loader's, raised as an ImportError when it cannot map a native library ("failed to map segment from shared
# object": under `ulimit -v`, importing pandas' extensions).
_OUT_OF_MEMORY = re.compile(
    r"out of memory|failed to allocate memory|is smaller than requested bytes|std::bad_alloc|bad allocation"
    r"|failed to map segment from shared object"
    r"|can'?t allocate memory|cannot allocate memory|not enough memory|_ALLOC_FAILED|cudaErrorMemoryAllocation",
    re.IGNORECASE,
)


def environment_cause(exc: BaseException) -> str | None:
    """Why `exc` says nothing about the variant being built or measured: a failure of the machine it ran on (out of
    memory, a full disk or quota, a file system mounted read-only, an I/O error, a timeout or a lost connection),
    which may not happen again; None for any other error, which would (the variant's own: a graph a runtime refuses,
    a bug).

    The chain of causes is followed, so a QbenchError raised from a full disk counts. Runtimes report a failed
    allocation in their own exception types, so an error whose message says so is out of memory too (a message
    that quotes one, where a runtime's error was re-raised `from None`, included). A job failed for such a cause
    is what `qbench sweep --resume` runs again in a finished run (qbench.execute.records)."""
    for current in causes(exc):
        if isinstance(current, MemoryError) or _OUT_OF_MEMORY.search(str(current)):
            return OUT_OF_MEMORY
        if isinstance(current, TimeoutError):
            return "a timeout"
        if isinstance(current, ConnectionError):
            return "a lost connection"
        if isinstance(current, OSError) and current.errno in _ENVIRONMENT_ERRNOS:
            return _ENVIRONMENT_ERRNOS[current.errno]
    return None


def causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what it was raised from, and so on: its explicit `__cause__`, else the exception it was raised while
    handling (unless raised `from None`); each once, a cycle ends the chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
