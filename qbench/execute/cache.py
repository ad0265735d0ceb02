"""Bounding a build store's growth (`qbench cache prune`): remove the least recently used entries.

Nothing else ever removes an entry: each sweep of a changed model adds its builds (`<store>/<key>/`) and a copy
of its inputs (`<store>/sources/<key>/`, qbench.execute.snapshot). An entry's last use is its folder's
modification time: publishing sets it, and a sweep that reuses an entry touches it (BuildStore.reusable,
take_snapshot). A sweep registers the keys it will read before it reads any (`entries_in_use`: a file in
`<store>/.in-use/` it holds locked while it runs), and pruning never removes a registered entry; a registration
whose sweep is gone (killed) is no longer locked and is removed by the next prune. Staging and discarded
folders left by killed publishers are removed once abandoned (qbench.execute.store.ABANDONED_AFTER_S).
An entry is moved aside in one step before it is deleted, so a reader never sees half of one.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from qbench.errors import QbenchError
from qbench.execute.store import ABANDONED_AFTER_S, SOURCES, store_writes
from qbench.files import folder_writes

logger = logging.getLogger(__name__)

IN_USE = ".in-use"  # the registrations of running sweeps (never a key: keys are hex digits)
_KEY = re.compile(r"[0-9a-f]{16,64}")
_LEFTOVER = re.compile(r"\.([0-9a-f]{16,64})\..+\.(publishing|discarded|pruned)")


@dataclass(frozen=True)
class Entry:
    path: Path
    kind: str  # "build", "input copy", or "leftover" (a killed publisher's staging or discarded folder)
    key: str
    size: int  # bytes
    last_used: float  # epoch seconds


@dataclass(frozen=True)
class Pruned:
    removed: list[Entry]
    kept: list[Entry]
    in_use: list[Entry]  # kept because a running sweep registered them

    @property
    def freed(self) -> int:
        return sum(entry.size for entry in self.removed)


@contextmanager
def entries_in_use(store: Path | None, keys: Iterable[str]) -> Iterator[None]:
    """Register `keys` as read by this process in the folder store `store` until the block ends (nothing for a
    store behind a URI). The file is locked before it gets its name, so a prune never takes it for a dead one."""
    if store is None:
        yield
        return
    folder = store / IN_USE
    with store_writes(store):
        folder.mkdir(parents=True, exist_ok=True)
        staged = folder / f".{os.getpid()}-{secrets.token_hex(4)}.tmp"
        handle = staged.open("w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.write("\n".join(sorted(set(keys))) + "\n")
            handle.flush()
            registration = staged.with_name(staged.name[1:].removesuffix(".tmp"))
            staged.rename(registration)
        except BaseException:
            handle.close()
            staged.unlink(missing_ok=True)
            raise
    try:
        yield
    finally:
        registration.unlink(missing_ok=True)
        handle.close()


def keys_in_use(store: Path) -> set[str]:
    """The keys registered by running sweeps; a registration no process holds any more is removed."""
    keys: set[str] = set()
    folder = store / IN_USE
    for registration in folder.iterdir() if folder.is_dir() else []:
        if registration.name.startswith("."):  # being registered (its entries not read yet), or its sweep was killed
            with suppress(OSError):  # then: it is never renamed
                if registration.stat().st_mtime < time.time() - ABANDONED_AFTER_S:
                    registration.unlink()
            continue
        try:
            with registration.open() as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:  # held: its sweep runs
                    keys.update(handle.read().split())
                    continue
                registration.unlink()
        except OSError:  # its sweep ended just now
            continue
    return keys


def store_entries(store: Path) -> list[Entry]:
    """Every entry of the folder store `store`: builds, input copies and leftovers of killed publishers."""
    entries = []
    for folder, kind in ((store, "build"), (store / SOURCES, "input copy")):
        for path in folder.iterdir() if folder.is_dir() else []:
            leftover = _LEFTOVER.fullmatch(path.name)
            if leftover is not None:
                entries.append(_entry(path, "leftover", leftover.group(1)))
            elif _KEY.fullmatch(path.name) and path.is_dir():
                entries.append(_entry(path, kind, path.name))
    return [entry for entry in entries if entry.size >= 0]


def _entry(path: Path, kind: str, key: str) -> Entry:
    try:
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        last_used = path.stat().st_mtime
    except OSError:  # removed meanwhile
        return Entry(path, kind, key, -1, 0.0)
    return Entry(path, kind, key, size, last_used)


def prune(store: Path, *, older_than_days: float | None = None, max_bytes: int | None = None,
          dry_run: bool = False) -> Pruned:  # fmt: skip
    """Remove the entries of `store` unused for `older_than_days`, then the least recently used ones until the rest
    fit in `max_bytes`; never one a running sweep registered. Leftovers of killed publishers go once abandoned."""
    now = time.time()
    busy = keys_in_use(store)
    entries = sorted(store_entries(store), key=lambda entry: entry.last_used)
    in_use = [entry for entry in entries if entry.key in busy]
    candidates = [entry for entry in entries if entry.key not in busy]
    doomed = [entry for entry in candidates if entry.kind == "leftover" and entry.last_used < now - ABANDONED_AFTER_S]
    if older_than_days is not None:
        cutoff = now - older_than_days * 86400
        doomed += [entry for entry in candidates if entry.kind != "leftover" and entry.last_used < cutoff]
    if max_bytes is not None:
        total = sum(entry.size for entry in entries) - sum(entry.size for entry in doomed)
        for entry in candidates:
            if total <= max_bytes:
                break
            if entry.kind != "leftover" and entry not in doomed:
                doomed.append(entry)
                total -= entry.size
    removed = [entry for entry in doomed if dry_run or _remove(entry, store)]
    kept = [entry for entry in candidates if entry not in removed]
    return Pruned(removed, kept, in_use)


def _remove(entry: Entry, store: Path) -> bool:
    """Move `entry` aside in one step, then delete it; False when a sweep registered it meanwhile (or it is gone).
    A store that refuses the move (read-only, not this user's) is a QbenchError naming it: such a prune removed
    nothing and said `removed 0 entries`, exit 0, so a clean-up job never learnt that the store still grew."""
    if entry.key in keys_in_use(store):
        return False
    aside = entry.path.with_name(f".{entry.key}.{secrets.token_hex(4)}.pruned")
    try:
        with folder_writes(store, lambda exc: QbenchError(
                f"qbench cache prune: cannot remove {entry.path} from the build store {store}: {exc.strerror or exc}; "
                "expected a store this user can write (run it where the store is mounted read-write)")):  # fmt: skip
            entry.path.rename(aside)
    except OSError:  # gone meanwhile (another prune)
        return False
    logger.debug("removing %s (%s, %d bytes)", entry.path, entry.kind, entry.size)
    with suppress(OSError):
        shutil.rmtree(aside) if aside.is_dir() else aside.unlink()
    return True
