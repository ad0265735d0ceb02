"""File digests (sha256) of what results depend on: the model, the data, the weights, the user's code."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, or of every file under a folder (names and bytes, in sorted order).

    A file's digest is remembered while its identity, size, modification time and change time stay the same (a sweep
    digests the same model at each measurement), but only for a file last modified well before it was read: file
    times are coarse, so a rewrite moments after a read could keep the old time (git's "racily clean" case). The
    change time (ctime) is what no program sets: a rewrite of the same size whose modification time was put back
    (`touch -r`, `cp -p`, `rsync -t`) keeps the other three.
    """
    if path.is_dir():
        return _tree_sha256(path, sorted(p for p in path.rglob("*") if p.is_file()))
    return _remembered(path, _DIGESTS, _DIGESTS_ENTRIES, lambda file: _tree_sha256(file, [file]))


def bytes_sha256(path: Path) -> str:
    """sha256 of a file's bytes alone (its name not included: two copies of one image are one input), remembered
    as `file_sha256`'s are (while the file's identity, size and time stay the same, for a settled file), for as
    many files as an image folder holds: a second digest of an unchanged folder reads no file's bytes."""

    def of_bytes(file: Path) -> str:
        digest = hashlib.sha256()
        _read_into(digest, file)
        return digest.hexdigest()

    return _remembered(path, _BYTES, _BYTES_ENTRIES, of_bytes)


def _remembered(path: Path, cache: dict[FileKey, str], entries: int, compute: Callable[[Path], str]) -> str:
    """`compute(path)`, remembered in `cache` (at most `entries`) under the file's key while it is settled."""
    key, settled = file_key(path)
    digest = cache.get(key)
    if digest is None:
        digest = compute(path)
        if settled:
            if len(cache) >= entries:
                cache.clear()
            cache[key] = digest
    return digest


FileKey = tuple[str, int, int, int, int, int]
_DIGESTS: dict[FileKey, str] = {}
_DIGESTS_ENTRIES = 256
_BYTES: dict[FileKey, str] = {}
_BYTES_ENTRIES = 1 << 20  # a million files' digests (about 200 MB)
_SETTLED_NS = 2_000_000_000  # coarser than any file system's time stamps (FAT: 2 s)


def file_key(path: Path) -> tuple[FileKey, bool]:
    """A file's identity, size, modification and change times (a key to remember what was read from it), and whether
    it is settled: last modified well before now, so that a rewrite cannot keep the same key (see `file_sha256`). The
    change time is in the key but not in being settled: setting a copy's modification time (`shutil.copy2`) moves it."""
    read_at = time.time_ns()
    stat = os.stat(path)  # the device and inode name the file (a link or `..` reach the same one): no realpath per file
    key = (os.path.abspath(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    return key, stat.st_mtime_ns < read_at - _SETTLED_NS


def _tree_sha256(path: Path, files: list[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        _read_into(digest, file)
    return digest.hexdigest()


def _read_into(digest: Any, file: Path) -> None:
    """Feed `file`'s bytes to `digest`, a block at a time."""
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)


def files_sha256(files: Mapping[str, str]) -> str:
    """sha256 over file names and the digests of their bytes, in name order: a set of files as one digest (a snapshot
    entry's key, an image column's files)."""
    return hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()
