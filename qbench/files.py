"""Writing qbench's own files (results, job records, run markers): whole or not at all, and a disk that cannot take
them said in one line naming the file."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from qbench.errors import QbenchError

# Faults of the file system rather than of the file: no space, no quota left, mounted read-only.
FULL_OR_READ_ONLY = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """A FULL_OR_READ_ONLY fault met inside is a QbenchError naming `path` (one line, exit 2), not a crash."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in FULL_OR_READ_ONLY:
            raise
        raise QbenchError(f"cannot write {path}: {exc.strerror}; free space there") from exc


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file renamed over it: a crash or a full disk mid-write leaves the
    file as it was (and no temporary file), never half of the new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with writing(path):
        try:
            tmp.write_text(text)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
