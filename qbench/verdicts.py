"""Passed checks of a cached export against forward(), kept in the export cache so a repeated sweep need not run them;
also the row-independence check's passes of any ONNX model (qbench.preflight.rows, in `$QBENCH_CACHE_DIR/checks/`).

A verdict is kept only for a check that passed, in `exports/<key>/checks/<kind>-<digest>.json`, where the digest
covers what the check's outcome depends on: the export file's bytes, the check's settings and inputs (the rows or
feeds it compared, the tolerance, CHECK_VERSION) and the versions of ONNX Runtime, numpy and Python; torch's is in
the export key. The check exists because the key leaves out code forward() runs from installed packages, so the
verdict also lists every Python file that ran while the check did (forward() and what it calls, wherever installed;
qbench's own checks too; for code made at run time, as a dataclass's __init__, the file of the module it was made
in) with the module it ran as and its sha256, and is reused only while each file still has that digest and is the
file this process imported that module from; where code made outside any module's file ran (torch.fx's), no verdict
is kept. A verdict that is missing, unreadable, partial, of another version or of another file is not reused: the
check runs again, and a failed check is never kept. Compiled code is covered by the versions alone (torch's, ONNX
Runtime's and Python's).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import numpy as np

from qbench.digests import file_sha256
from qbench.errors import QbenchError
from qbench.files import write_atomically
from qbench.variants.pass_memo import batches_digest

logger = logging.getLogger(__name__)

CHECK_VERSION = 1  # bump when what a check compares changes in a way its settings and code do not show
_FOLDER = "checks"
Outcome = TypeVar("Outcome")


@dataclass
class Agreement:
    """What a passing check measured: the largest |ONNX Runtime - torch| difference over the outputs it compared, and
    how many rows it compared them on."""

    largest: float = 0.0
    rows: int = 0

    def add(self, difference: float, rows: int) -> None:
        self.largest = max(self.largest, difference)
        self.rows += rows


def feeds_digest(feeds: Sequence[Any]) -> str | None:
    """sha256 of numeric arrays (dtype, shape and bytes of each, in order: pass_memo.batches_digest of them as one
    batch); None when one is not numeric (an object array holds no numbers to key a verdict by)."""
    arrays = [np.asarray(feed) for feed in feeds]
    if any(array.dtype.kind not in "biufc" for array in arrays):
        return None
    return batches_digest([{f"{index:08d}": array for index, array in enumerate(arrays)}])


def checked(folder: Path, export: Path, kind: str, settings: Mapping[str, Any], what: str,
            check: Callable[[Agreement], Outcome | None], *, level: int = logging.INFO) -> Outcome | None:  # fmt: skip
    """`check(agreement)`'s outcome on the ONNX model at `export` (None: it passed), or None at once when a verdict in
    `folder/checks` says it passed on the same file, `settings` and code; `what` names the check in the line logged
    at `level` that says so. A pass is kept when every Python file that ran during it could be read."""
    path = folder / _FOLDER / f"{kind}-{_digest(export, kind, settings)}.json"
    stored = _stored(path, what)
    if stored is not None:
        logger.log(level, "%s is reused: it passed on the same model file, inputs, settings and code (largest "
                   "difference %.2e on %d rows; %s)", what, stored.largest, stored.rows, path)  # fmt: skip
        return None
    agreement = Agreement()
    with _code_run() as files:
        outcome = check(agreement)
    if outcome is None and files is not None:
        _keep(path, agreement, files, what)
    return outcome


def _digest(export: Path, kind: str, settings: Mapping[str, Any]) -> str:
    import onnxruntime

    described = {"version": CHECK_VERSION, "kind": kind, "export": file_sha256(export), "settings": settings,
                 "onnxruntime": onnxruntime.__version__, "numpy": np.__version__, "python": sys.version}  # fmt: skip
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()


def _stored(path: Path, what: str) -> Agreement | None:
    """The passed verdict at `path` (of the check `what` names) when it is whole and every file it lists still has its
    digest, else None."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.info("the stored check %s cannot be read (%s): checking again", path, exc)
        return None
    try:
        passed, largest, rows, code = record["passed"], record["largest_difference"], record["rows"], record["code"]
        valid = (record["version"] == CHECK_VERSION and passed is True and isinstance(largest, float)
                 and math.isfinite(largest) and isinstance(rows, int) and isinstance(code, dict) and code
                 and all(isinstance(file, str) and isinstance(ran, dict) and isinstance(ran["module"], str)
                         and isinstance(ran["sha256"], str) for file, ran in code.items()))  # fmt: skip
    except (KeyError, TypeError):
        valid = False
    if not valid:
        logger.info("the stored check %s is incomplete or of another qbench: checking again", path)
        return None
    changed = next((file for file, ran in code.items() if not _same_code(file, ran["module"], ran["sha256"])), None)
    if changed is not None:  # routine (a new checkout, an upgrade) and nothing to act on: not in a CI log's lines
        logger.debug("%s is not the code %s ran (edited, or the module is now imported from another file): checking "
                     "again", changed, what)  # fmt: skip
        return None
    return Agreement(largest, rows)


def _same_code(file: str, module: str, sha256: str) -> bool:
    """Whether `file` still has digest `sha256` and is the file this process imported `module` from: the same module
    name imported from another environment's file (another virtual environment, PYTHONPATH) is other code. A module
    that names no file of its own (torch._VF puts an object in its place in sys.modules), or is not imported yet,
    must lie in the folder of the nearest package above it that names one."""
    name = module
    while name:
        entry = sys.modules.get(name)
        loaded = getattr(entry, "__file__", None) or getattr(getattr(entry, "__spec__", None), "origin", None)
        if isinstance(loaded, str) and os.path.isfile(loaded):
            real = os.path.realpath(loaded)
            place = real == file if name == module else file.startswith(os.path.join(os.path.dirname(real), ""))
            return place and _sha256(Path(file)) == sha256
        name = name.rpartition(".")[0]
    return False


def _keep(path: Path, agreement: Agreement, files: dict[str, str], what: str) -> None:
    code = {file: {"module": module, "sha256": _sha256(Path(file))} for file, module in sorted(files.items())}
    if not code or any(ran["sha256"] is None for ran in code.values()):
        return  # a file that ran and cannot be read: nothing to tell its next edit by
    record = {"version": CHECK_VERSION, "passed": True, "largest_difference": float(agreement.largest),
              "rows": agreement.rows, "code": code}  # fmt: skip
    try:
        write_atomically(path, json.dumps(record, indent=1), what=f"the verdict of {what}")
    except QbenchError as exc:  # not kept: the next sweep checks again
        logger.warning("%s; the next sweep runs %s again", exc, what)


def _sha256(path: Path) -> str | None:
    try:
        return file_sha256(path)
    except OSError:
        return None


@contextlib.contextmanager
def _code_run() -> Iterator[dict[str, str] | None]:
    """The files of the Python code called in this thread while inside, each with the name of the module it ran in
    (filled as it runs, emptied at the end when code without a source file ran); None where another profiler
    (cProfile) holds the hook: then nothing is known, and nothing is kept."""
    if sys.getprofile() is not None:
        logger.debug("a profiler is running: the check is not kept")
        yield None
        return
    files: dict[str, str] = {}
    seen: set[str] = set()
    made: set[str] = set()  # names of code made by exec ('<string>'), whose file is its module's
    generated: list[str] = []

    def record(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or (name := frame.f_code.co_filename) in seen:
            return
        if name not in made and os.path.isfile(name):
            seen.add(name)
            files[os.path.realpath(name)] = str(frame.f_globals.get("__name__"))
        elif name.startswith("<frozen "):  # the interpreter's own (its version is in the digest)
            seen.add(name)
        elif isinstance(module := frame.f_globals.get("__file__"), str) and os.path.isfile(module):
            made.add(name)
            files[os.path.realpath(module)] = str(frame.f_globals.get("__name__"))  # a dataclass's __init__
        else:  # nothing is kept: one name says why
            seen.add(name)
            generated.append(name)

    sys.setprofile(record)
    try:
        yield files
    finally:
        sys.setprofile(None)
    if generated:  # code made at run time outside any module (torch.fx's): no file to tell its next change by
        logger.debug("code without a source file ran during the check (%s): it is not kept", generated[0])
        files.clear()
