"""Files qbench writes (results, reports, exports, job records, run markers): complete or not there at all.

A file is written to a temporary file in its own folder and renamed over the target: a full disk, a signal or a
crash mid-write leaves the earlier file as it was and no half-written one (the temporary file is removed). The
error is a QbenchError of one line naming the file and the system's reason (`No space left on device`).

A rename alone is not durable: after a power loss the file system may hold the new name but not yet its content (an
empty results.json or job record, which --resume and the gate would read as damaged). So the temporary file is
synced before the rename, and on POSIX its folder after (the rename itself). That costs a few milliseconds a file
(docs/cluster.md, "Results"), once per job or per sweep: never call these on a per-iteration path.

A file that need only outlive the process writing it, not the machine (`durable=False`: a job's mark as started,
read after the sweep's process died, whose writes the kernel still holds), is renamed into place without the syncs:
two syncs a job, 28 of the 85 of a `qbench sweep` of the digits demo; a mark took 12-16 ms written durably, 4 ms not,
on a 2-CPU ext4 machine busy with other processes' writes (about half a millisecond less on a quiet one).
"""

from __future__ import annotations

import errno
import os
import secrets
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from qbench.errors import QbenchError, causes

# Faults of the file system rather than of the file: no space, no quota left, mounted read-only.
FULL_OR_READ_ONLY = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def cache_dir() -> Path:
    """$QBENCH_CACHE_DIR, else $XDG_CACHE_HOME/qbench, else ~/.cache/qbench, made absolute here: a relative
    `QBENCH_CACHE_DIR=.cache` would otherwise name another folder inside a build's scratch working directory
    (`scratch_dir`), and a SmoothQuant build there failed to find the FP32 model the store had copied."""
    explicit = os.environ.get("QBENCH_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser().absolute()
    return (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qbench").absolute()


def write_fault(exc: BaseException) -> OSError | None:
    """The fault of a file system (FULL_OR_READ_ONLY) that `exc` is, or was raised from (a QbenchError of
    writing_file's included), or None.

    A step that may fail without failing the sweep (a diagnostic, a search's candidate, a trial that refines a build)
    must re-raise such a fault rather than go on without the step: the result would then depend on the disk (the
    range analysis missing, another candidate picked, a build made without its trial and stored under its key), and a
    sweep that goes on would say so nowhere in its exit code."""
    return next((c for c in causes(exc) if isinstance(c, OSError) and c.errno in FULL_OR_READ_ONLY), None)


@contextmanager
def folder_writes(root: str | Path, error: Callable[[OSError], QbenchError]) -> Iterator[None]:
    """Raise a fault of `root`'s file system met inside as `error(exc)`: no space, no quota or a read-only file
    system, or a permission refused on a path under `root` (a file read elsewhere is not). Any other OSError (a
    source that is gone, say) is raised as it is: it is not the folder's fault."""
    try:
        yield
    except OSError as exc:
        named = [str(name) for name in (exc.filename, exc.filename2) if name is not None]
        refused = exc.errno in (errno.EACCES, errno.EPERM) and any(n.startswith(str(root)) for n in named)
        if exc.errno not in FULL_OR_READ_ONLY and not refused:
            raise
        raise error(exc) from exc


@contextmanager
def writing_file(path: Path, what: str) -> Iterator[None]:
    """An OSError met inside is a QbenchError of one line naming `path` and `what` it is, not a crash."""
    try:
        yield
    except OSError as exc:
        raise QbenchError(f"{path}: cannot write {what}: {exc.strerror or exc}") from exc


def write_atomically(path: Path, text: str, *, what: str, durable: bool = True) -> Path:
    """Write `text` (UTF-8) to `path` in one step, as described above (synced unless not `durable`); `what` names the
    file in an error ("the results", "the HTML report"). The new file is readable as the umask allows."""
    return replace_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"), what=what,
                              durable=durable)  # fmt: skip


def replace_atomically(path: Path, write: Callable[[Path], object], *, what: str, suffix: str = ".tmp",
                       durable: bool = True) -> Path:  # fmt: skip
    """`write` fills a temporary file (named ...`suffix`, for writers that go by it: `np.savez` wants .npz) in
    `path`'s folder, which then replaces `path` in one step, as described above (synced unless not `durable`)."""
    with writing_file(path, what):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
        os.close(handle)
        temporary = Path(name)
        try:
            write(temporary)
            os.chmod(temporary, 0o666 & ~current_umask())
            if durable:
                _sync(temporary)
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
        if durable and os.name == "posix":
            _sync_folder(path.parent)
    return path


def _sync(path: Path, flags: int = os.O_RDONLY) -> None:
    """Flush `path`'s content (or, for a folder, its entries) to the disk."""
    handle = os.open(path, flags)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _sync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable. A file system that cannot sync a folder (EINVAL: some network and FUSE
    ones) has nothing more to give: the file is in place, and that is not an error."""
    try:
        _sync(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise


def new_folder(parent: Path, stem: str, suffix: str) -> Path:
    """A new, empty folder `.<stem>.<random>.<suffix>` in `parent`, of a name no other writer has, made with the
    process's umask (not tempfile's private 0700): renamed into place, it is a folder other users and servers
    read (a shared build store's entry, a Triton model)."""
    while True:
        folder = parent / f".{stem}.{secrets.token_hex(4)}.{suffix}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue


def file_in_the_way(folder: Path) -> Path | None:
    """The first of `folder` and the folders above it that exists but is no folder (nothing can be written under
    it), or None."""
    return next((above for above in (folder, *folder.parents) if above.exists() and not above.is_dir()), None)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
