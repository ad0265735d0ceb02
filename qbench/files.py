"""Files qbench writes (results, reports, exports, job records, run markers): complete or not there at all.

A file is written to a temporary file in its own folder and renamed over the target: a full disk, a signal or a
crash mid-write leaves the earlier file as it was and no half-written one (the temporary file is removed). The
error is a QbenchError of one line naming the file and the system's reason (`No space left on device`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from qbench.errors import QbenchError


@contextmanager
def writing(path: Path, what: str) -> Iterator[None]:
    """An OSError met inside is a QbenchError of one line naming `path` and `what` it is, not a crash."""
    try:
        yield
    except OSError as exc:
        raise QbenchError(f"{path}: cannot write {what}: {exc.strerror or exc}") from exc


def write_atomically(path: Path, text: str, *, what: str) -> Path:
    """Write `text` (UTF-8) to `path` in one step, as described above; `what` names the file in an error
    ("the results", "the HTML report"). The new file is readable as the umask allows."""
    with writing(path, what):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                file.write(text)
            os.chmod(temporary, 0o666 & ~current_umask())
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
    return path


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
