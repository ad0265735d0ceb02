"""Finding and importing code a recipe names ('package.module:function'): a torch factory, a custom metric.

Trust model: such code is what the user chose to run, imported like any Python import with the
recipe's folder first on `sys.path`. Finding its source file (for digests) imports nothing.

`project_modules` lists the modules of the user's own project a process has imported (whatever forward() may
call), for a cache key that follows every edit to them; `edited_since_seen` tells when the code in memory is
no longer the file on disk, which such a key would then misdescribe. `files_read` lists the files such code opened
for reading while it ran (a checkpoint a factory loads itself), through Python's `open` audit events.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
import threading
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

from qbench.errors import QbenchError

# module -> sha256 of its file when qbench first hashed it in this process
_SOURCE_AT_FIRST_SIGHT: weakref.WeakKeyDictionary[ModuleType, str] = weakref.WeakKeyDictionary()
_INSTALLED = frozenset({"site-packages", "dist-packages"})
_READING = threading.local()  # .files: the set files_read() fills on this thread, while one is open
_HOOKED: list[bool] = []  # whether the audit hook is in place (once per process: a hook cannot be removed)


def module_source(module_name: str, search_dir: Path) -> Path | None:
    """The file `import module_name` would load, looking in `search_dir` first; parents are not imported."""
    top, *rest = module_name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(top, [str(search_dir)])
    if spec is None:
        with first_on_sys_path(search_dir), contextlib.suppress(ValueError):  # ValueError: no __spec__
            spec = importlib.util.find_spec(top)  # installed, editable installs, already imported
    for depth in range(1, len(rest) + 1):
        if spec is None or spec.submodule_search_locations is None:
            return None
        name = ".".join([top, *rest[:depth]])
        spec = importlib.machinery.PathFinder.find_spec(name, list(spec.submodule_search_locations))
    if spec is None or not spec.has_location or spec.origin is None:
        return None
    return Path(spec.origin).resolve()


def not_found(module_name: str, search_dir: Path) -> str:
    return f"cannot find module {module_name!r} (with a source file) in {search_dir} or on sys.path"


@contextlib.contextmanager
def first_on_sys_path(folder: Path) -> Iterator[None]:
    entry = str(folder)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        sys.path.remove(entry)


def project_modules(roots: Sequence[Path]) -> list[tuple[str, ModuleType, Path]]:
    """(name, module, file) of every module in sys.modules loaded from a file under one of `roots` (the user's
    project: the recipe's folder, the factory's), by name; installed packages (a `site-packages` or
    `dist-packages` folder, a virtual environment inside the project included) and the standard library are left
    out, which keeps hashing them cheap. A module of the project imported for another reason is listed too."""
    under = tuple(os.path.join(os.path.realpath(root), "") for root in roots)  # with a trailing separator
    found = []
    resolved: dict[str, str] = {}  # folder -> its real path: thousands of modules share a few hundred folders
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not isinstance(module, ModuleType) or not isinstance(file, str):
            continue  # built-in, frozen, a namespace package, or an object a library put in sys.modules
        real = _real_path(file, resolved)
        if real.startswith(under) and not installed(path := Path(real)) and path.is_file():
            found.append((name, module, path))
    return sorted(found, key=lambda entry: entry[0])


def project_sources_sha256(roots: Sequence[Path]) -> dict[str, tuple[Path, str]]:
    """Module name -> (its file, the file's sha256) for every module of the project under `roots`
    (`project_modules`). A file edited after this process imported it is not the code running, which a digest of it
    would misdescribe: EditedAfterImport naming it."""
    from qbench.digests import file_sha256

    sources: dict[str, tuple[Path, str]] = {}
    for name, module, path in project_modules(roots):
        sha = file_sha256(path)
        if edited_since_seen(module, sha):
            raise EditedAfterImport(path)
        sources[name] = (path, sha)
    return sources


class EditedAfterImport(QbenchError):
    """A module of the user's project whose file changed after this process imported it."""

    def __init__(self, path: Path) -> None:
        super().__init__(changed_after_import(path))
        self.path = path


def changed_after_import(path: Path) -> str:
    return f"{path} changed after this process imported it; run qbench in a new process to use the new code"


def _real_path(file: str, folders: dict[str, str]) -> str:
    """os.path.realpath(file), each folder resolved once (in `folders`): a file that is no link is its folder's real
    path joined with its name. realpath on each of a sweep's ~5,000 module files took 0.2-0.6 s of its preparation."""
    if os.path.islink(file):
        return os.path.realpath(file)
    folder, name = os.path.split(os.path.abspath(file))
    if folder not in folders:
        folders[folder] = os.path.realpath(folder)
    return os.path.join(folders[folder], name)


def installed(path: Path) -> bool:
    """Whether `path` (resolved) is a file of an installed package (under a `site-packages` or `dist-packages`
    folder) or of the standard library, rather than the user's own code."""
    system = [Path(os.path.realpath(p)) for key, p in sysconfig.get_paths().items() if key.endswith(("stdlib", "lib"))]
    return bool(_INSTALLED & set(path.parts)) or any(path.is_relative_to(folder) for folder in system)


def edited_since_seen(module: ModuleType, sha256: str) -> bool:
    """Whether `module`'s file, whose digest is now `sha256`, had another when qbench first hashed it in this
    process: the code running is then not the code on disk. A file edited after its import but before qbench
    first hashed it cannot be told apart."""
    return _SOURCE_AT_FIRST_SIGHT.setdefault(module, sha256) != sha256


@contextlib.contextmanager
def files_read() -> Iterator[set[str]]:
    """The absolute paths of the files this thread opens only to read, inside the block (Python's `open` audit event:
    builtins.open, io.open, os.open; a reader in native code that opens its file itself is not seen)."""
    if not _HOOKED:
        sys.addaudithook(_opened)
        _HOOKED.append(True)
    outer, found = getattr(_READING, "files", None), set()
    _READING.files = found
    try:
        yield found
    finally:
        _READING.files = outer


def _opened(event: str, args: tuple) -> None:
    if event != "open" or getattr(_READING, "files", None) is None:
        return
    path, mode, flags = args
    if isinstance(path, int) or path is None:  # an open file descriptor: its path was seen when it was opened
        return
    reads = not set("wax+") & set(mode) if isinstance(mode, str) else (flags & os.O_ACCMODE) == os.O_RDONLY
    if reads:
        _READING.files.add(os.path.abspath(os.fsdecode(path)))
