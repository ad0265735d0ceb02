"""Built variants kept by content: `<store>/<build key>/` holds a build's files and its manifest.

A build job builds in a private folder and publishes every file it wrote with a manifest that records
each file's sha256, so a key with a manifest is a complete build. In a folder store, the files and the
manifest go to a staging folder of a unique name, renamed to `<key>/` in one step: two publishers of one
key (concurrent sweeps, Ray workers) never mix their files, and the later one keeps the entry already
there when it is intact and reusable here (else it replaces it). An fsspec store (`s3://bucket/prefix`,
`gs://...`) gets every file, then the manifest last. Any node reads a build back by its key.
The key (qbench.execute.plan.build_key) hashes everything the build depends on, the versions of the packages
that compute it and the machine facts it reads included (plan.build_facts); the manifest records those facts as
the machine that built it saw them, and a build whose facts are not the reader's is not reused, nor one whose
files no longer have their recorded digests (changed or truncated since: it is built again).
A build is materialised by copying its files: a run folder's model never shares its bytes with the store.
`<store>/sources/` holds the sweeps' copies of their input files (qbench.execute.snapshot).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
from contextlib import AbstractContextManager, suppress
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from qbench.errors import QbenchError
from qbench.files import cache_dir, folder_writes, new_folder
from qbench.variants.base import BuiltVariant

if TYPE_CHECKING:
    from qbench.recipe.spec import Recipe

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
SOURCES = "sources"  # the folder of input copies (never a build key: those are hex digits)
_MANIFEST_FORMAT = 3  # 2: `files` maps each file to its sha256; 3: the manifest records its own (MANIFEST_SHA256)
MANIFEST_SHA256 = "manifest_sha256"  # the sha256 of the rest of the manifest (`_manifest_digest`)
_CHUNK = 1 << 20  # bytes read at a time while hashing
# A staging or discarded folder untouched this long was left by a publisher that was killed (a publish takes
# seconds to minutes): the next publish removes it.
ABANDONED_AFTER_S = 6 * 3600


class StoreUnwritable(QbenchError):
    """The store cannot take a write (full, over quota, read-only, not permitted): every later write there would
    fail the same way, so the sweep stops with one line rather than failing each build in turn."""

    def __init__(self, root: str | Path, exc: OSError) -> None:
        super().__init__(f"cannot write to the build store {root}: {exc.strerror or exc}; free space there or set "
                         "executor.store (or $QBENCH_CACHE_DIR) to a writable folder")  # fmt: skip


def store_writes(root: str | Path) -> AbstractContextManager[None]:
    """Raise a fault of the store's file system met inside as StoreUnwritable naming `root`
    (qbench.files.folder_writes)."""
    return folder_writes(root, lambda exc: StoreUnwritable(root, exc))


class BuildStore:
    """The builds of one store root (a path or an fsspec URI); picklable, so it travels with jobs."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self._fs: Any = None
        self._reported: set[str] = set()  # the paths of damaged entries already warned about

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "_fs": None, "_reported": set()}

    def _damaged(self, path: str, problem: str) -> None:
        """Warn once per process that the entry file `path` `problem` (a sweep that reuses a search checks an entry
        before it builds, and again as it publishes: one line says it)."""
        if path not in self._reported:
            self._reported.add(path)
            logger.warning("build store: %s %s (changed since it was published): that build is not reused", path,
                           problem)  # fmt: skip

    @property
    def local(self) -> Path | None:
        """The store's folder when it is on a local (or mounted) file system."""
        return None if "://" in self.root and not self.root.startswith("file://") else Path(self._path(""))

    @property
    def sources_root(self) -> Path:
        """Where sweeps keep the copies of their input files (qbench.execute.snapshot): the store's `sources/`
        folder, or this node's cache (`$QBENCH_CACHE_DIR/sources/`) for a store behind a URI."""
        local = self.local
        if local is not None:
            return local / SOURCES
        return cache_dir() / SOURCES

    def entry(self, key: str) -> Path:
        """Where the files of the build `key` are, as a path (for a store behind a URI, a path on no machine: read
        its files with `local_copy`)."""
        return Path(self._path(key))

    def _path(self, *parts: str) -> str:
        base = self.root.removeprefix("file://")
        return "/".join([base, *[p for p in parts if p]])

    def _filesystem(self) -> Any:
        if self._fs is None:
            import fsspec

            self._fs = fsspec.core.url_to_fs(self.root)[0]
        return self._fs

    def _open(self, key: str, name: str) -> IO[bytes]:
        """The stored file `name` of build `key`, opened for reading (FileNotFoundError when absent)."""
        if self.local is not None:
            return open(self._path(key, name), "rb")  # noqa: SIM115 - the caller closes it
        return self._filesystem().open(self._path(key, name), "rb")

    def manifest(self, key: str) -> dict[str, Any] | None:
        """The manifest of a complete build under `key`; None when there is none, it is unreadable, or it no longer
        has the sha256 it records of itself: a manifest changed since it was published (a flipped byte that leaves
        valid JSON: another parameter, note or search report) is logged as a warning and its build is not reused."""
        try:
            with self._open(key, MANIFEST) as stream:
                content = json.loads(stream.read())
        except (OSError, ValueError):
            return None
        if not isinstance(content, dict) or content.get("format") != _MANIFEST_FORMAT:
            return None
        recorded = content.pop(MANIFEST_SHA256, None)
        if recorded != _manifest_digest(content):
            self._damaged(self._path(key, MANIFEST), "no longer has the sha256 it records of itself")
            return None
        return content if isinstance(content.get("files"), dict) else None

    def reusable(self, key: str, environment: dict[str, str], reference: str | None = None) -> dict[str, Any] | None:
        """The manifest of the build under `key` when a sweep whose machine gives the build `environment` (its
        facts: qbench.execute.plan.build_facts) may reuse it: complete, built with those facts, its torch form
        (if any) rebuilt from the source, and every file as published.
        A file changed, truncated or gone since is logged as a warning naming it; the build is then not reused.

        Given `reference` (the sha256 of the FP32 ONNX model the sweep builds from), only a build made from that
        model: a PyTorch source's export changes with code the key does not cover (a function in another file
        than the factory's), and a variant built from the old export would be measured against the new one."""
        manifest = self.manifest(key)
        if manifest is None or manifest.get("reusable") is not True or manifest.get("environment") != environment:
            return None
        if reference is not None and manifest.get("reference") != reference:
            return None
        return self._used_if_intact(key, manifest)

    def _used_if_intact(self, key: str, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """`manifest` when every file of the entry of `key` is as published, the entry then recorded as used now
        (its folder's time: what `qbench cache prune` goes by); None otherwise."""
        if not self._intact(key, manifest):
            return None
        if self.local is not None:
            mark_used(Path(self._path(key)))
        return manifest

    def _intact(self, key: str, manifest: dict[str, Any]) -> bool:
        for name, expected in manifest["files"].items():
            try:
                with self._open(key, name) as stream:
                    actual = _sha256(stream)
            except FileNotFoundError:
                actual = None
            if actual != expected:
                problem = "is missing" if actual is None else "no longer has the sha256 its manifest records"
                self._damaged(self._path(key, name), problem)
                return False
        return True

    def publish(self, key: str, folder: Path, manifest: dict[str, Any]) -> dict[str, Any]:
        """Put every file `manifest` lists, from `folder`, under `key` with the manifest (which makes the build
        visible). Returns the manifest of the build now under `key`: this one, or an intact one of the same
        environment and FP32 model that another publisher put there first and that is reusable or holds the same
        bytes.
        A store that cannot take the files raises StoreUnwritable (see store_writes), leaving no part of them."""
        local = self.local
        if local is None:
            fs = self._filesystem()
            with store_writes(self.root):
                if fs.exists(self._path(key, MANIFEST)):
                    fs.rm(self._path(key, MANIFEST))
                for name in manifest["files"]:
                    fs.put_file(str(folder / name), self._path(key, name))
                fs.pipe_file(self._path(key, MANIFEST), _manifest_text(manifest).encode())
            return manifest
        with store_writes(local):
            local.mkdir(parents=True, exist_ok=True)
            remove_abandoned(local)
            staging = new_staging(local, key)
        try:
            with store_writes(local):
                for name in manifest["files"]:
                    (staging / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(folder / name, staging / name)
                (staging / MANIFEST).write_text(_manifest_text(manifest))
                return self._move_in(key, staging, manifest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone already when it was moved in

    def _move_in(self, key: str, staging: Path, manifest: dict[str, Any]) -> dict[str, Any]:
        """Rename `staging` to the entry of `key` in one step; an entry already there is kept (see `publish`)
        or moved aside and deleted first."""
        target = Path(self._path(key))
        while True:
            try:
                os.rename(staging, target)  # refused when `target` holds anything: an entry is never mixed
                return manifest
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                    raise
            kept = self._kept(key, manifest)
            if kept is not None:
                return kept
            discarded = target.with_name(f".{key}.{secrets.token_hex(4)}.discarded")
            try:
                os.rename(target, discarded)
            except FileNotFoundError:  # another publisher moved it aside just now
                continue
            if discarded.is_dir():
                shutil.rmtree(discarded, ignore_errors=True)
            else:
                discarded.unlink()

    def _kept(self, key: str, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """The entry under `key`, when a publisher of `manifest` keeps it instead of its own (see `publish`): never
        one built from another FP32 model (a PyTorch source's export of since-edited code, see `reusable`)."""
        existing = self.manifest(key)
        if existing is None or existing.get("environment") != manifest["environment"]:
            return None
        if existing.get("reference") != manifest.get("reference"):
            return None
        if existing.get("reusable") is not True and existing["files"] != manifest["files"]:
            return None
        return self._used_if_intact(key, existing)

    def materialise(self, key: str, manifest: dict[str, Any], folder: Path) -> None:
        """Copies of the build's files in `folder` (never links: editing one leaves the store's as it is), each
        checked against the sha256 its manifest records: an entry changed since it was found intact (`reusable`), or
        corrupted on its way here, is never measured as the build. A copy that differs is removed and the sweep
        fails closed, naming the file (a run folder never holds a model that is not the build's)."""
        folder.mkdir(parents=True, exist_ok=True)
        for name, expected in manifest["files"].items():
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)  # a link left by an older qbench is not written through
            try:
                if self.local is None:
                    self._filesystem().get_file(self._path(key, name), str(target))
                else:
                    shutil.copyfile(self._path(key, name), target)  # the kernel's copy (sendfile) where it can
                actual = _file_sha256(target)  # read back from the page cache the copy just filled
            except BaseException:  # a full disk or a signal: no truncated model left to be mistaken for the build
                target.unlink(missing_ok=True)
                raise
            if actual != expected:
                target.unlink(missing_ok=True)
                raise QbenchError(f"build store: {self._path(key, name)} no longer has the sha256 its manifest records "
                                  f"({expected[:12]}…, copied {actual[:12]}…): the stored build {key} changed or was "
                                  "corrupted since it was published; remove that entry (or run again without "
                                  "--resume) so the variant is built again")  # fmt: skip

    def local_copy(self, built: BuiltVariant, key: str) -> BuiltVariant:
        """`built` with its files on this node: as it is when its model is readable here, else fetched from
        the store into this node's cache (`$QBENCH_CACHE_DIR/fetched/<key>/`). FP32's model (a borrowed
        build) is never a build's file: each node reads its own snapshot of the inputs."""
        if built.onnx_path.is_file():
            return built
        from dataclasses import replace

        manifest = self.manifest(key)
        if manifest is None:
            raise QbenchError(
                f"build {key} of {built.name!r} is neither at {built.onnx_path} nor in the store {self.root}"
            )
        folder = cache_dir() / "fetched" / key
        self.materialise(key, manifest, folder)
        return replace(built, onnx_path=folder / manifest["onnx"])


def new_staging(folder: Path, key: str) -> Path:
    """A new, empty staging folder in `folder` for the entry `key` (qbench.files.new_folder: renamed into place,
    it is an entry every user of a shared store reads; remove_abandoned knows it by its suffix)."""
    return new_folder(folder, key, "publishing")


def mark_used(entry: Path) -> None:
    """Set the time of the entry folder `entry` to now: the least recently used go first when the store is pruned
    (qbench.execute.cache). A store this process cannot write keeps the time it had."""
    with suppress(OSError):
        os.utime(entry)


def remove_abandoned(local: Path, what: str = "build store") -> None:
    """Remove the staging and discarded folders of publishers killed mid-publish (see ABANDONED_AFTER_S); `what`
    names the folder `local` in the line said for each."""
    cutoff = time.time() - ABANDONED_AFTER_S
    for entry in local.glob(".*"):
        if not entry.name.endswith((".publishing", ".discarded")):
            continue
        try:
            if entry.stat().st_mtime < cutoff:
                logger.info("%s: removing %s, left by a publish that did not finish", what, entry)
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        except OSError:  # another publisher removed it first
            continue


def build_store(recipe: Recipe) -> BuildStore:
    """The recipe's build store: `executor.store` (a folder relative to the recipe, or a URI), else the
    `builds` folder of qbench's cache on this machine (beside the cached exports)."""
    root = recipe.executor.store
    if root is None:
        return BuildStore(str(cache_dir() / "builds"))
    return BuildStore(root if "://" in root else str(recipe.resolve(Path(root))))


def _sha256(stream: IO[bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in iter(lambda: stream.read(_CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    with path.open("rb") as stream:
        return _sha256(stream)


def _manifest_text(manifest: dict[str, Any]) -> str:
    """The manifest file's text: `manifest` with its own sha256 (MANIFEST_SHA256), which `BuildStore.manifest`
    checks: each stored file has its digest in `files`, and the manifest, read back to rebuild the BuiltVariant,
    has its own."""
    return json.dumps({**manifest, MANIFEST_SHA256: _manifest_digest(manifest)}, indent=2, sort_keys=True)


def _manifest_digest(manifest: dict[str, Any]) -> str:
    """sha256 of `manifest` (without MANIFEST_SHA256) as JSON text, the same for the dict a build made and for the
    one read back from its file (a tuple is written as the list it is read back as)."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def manifest_of(built: BuiltVariant, folder: Path, environment: dict[str, str], *, reusable: bool,
                reference: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The manifest of `built`, whose files are in `folder`: everything to rebuild the BuiltVariant from them,
    `files`, each file's name and sha256 (what `BuildStore.reusable` checks the stored files against), and
    `reference`, the sha256 of the FP32 ONNX model it was built from.

    `reusable` is False when the build's torch form lives only in memory (QAT, ModelOpt): a resumed sweep
    builds such a variant again rather than measure it without that form."""
    from qbench.results.schema import to_jsonable

    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    return {
        "format": _MANIFEST_FORMAT,
        "name": built.name,
        "precision": built.precision,
        "onnx": _onnx_entry(built.onnx_path, folder),
        "files": {name: _file_sha256(folder / name) for name in files},
        "params": to_jsonable(built.params),
        "build_seconds": built.build_seconds,
        "session_hints": to_jsonable(built.session_hints),
        "notes": list(built.notes),
        "param_forms": dict(built.param_forms),  # which form each param and note describes (BuiltVariant.as_run_in)
        "note_forms": dict(built.note_forms),
        "simulation": built.simulation,
        "activation_ranges": {name: list(bounds) for name, bounds in built.activation_ranges.items()},
        "environment": environment,
        "reusable": reusable,
        "reference": reference,
    }


# The onnx entry of a build that is the FP32 model itself (FP32, a variant with nothing to change): the recipe's
# model, wherever the sweep reusing the build keeps it (two projects with the same model share the build).
REFERENCE_MODEL = "<the recipe's FP32 model>"


def _onnx_entry(onnx_path: Path, folder: Path) -> str:
    """The model's name in the build folder, or REFERENCE_MODEL when the build is the input model (FP32)."""
    resolved = onnx_path.resolve()
    return str(resolved.relative_to(folder.resolve())) if resolved.is_relative_to(folder.resolve()) else REFERENCE_MODEL


def built_from_manifest(manifest: dict[str, Any], folder: Path, reference: Path) -> BuiltVariant:
    """The BuiltVariant a manifest describes, its files in `folder` (no torch form: see jobs.with_torch_form);
    `reference` is the FP32 model of the sweep that reads it."""
    entry = manifest["onnx"]
    return BuiltVariant(
        name=manifest["name"],
        precision=manifest["precision"],
        onnx_path=reference if entry == REFERENCE_MODEL else folder / entry,
        params=dict(manifest["params"]),
        build_seconds=float(manifest["build_seconds"]),
        session_hints=dict(manifest["session_hints"]),
        notes=tuple(manifest["notes"]),
        param_forms=dict(manifest.get("param_forms", {})),  # manifests written before forms were kept: none
        note_forms=dict(manifest.get("note_forms", {})),
        simulation=bool(manifest["simulation"]),
        activation_ranges={name: (float(lo), float(hi)) for name, (lo, hi) in manifest["activation_ranges"].items()},
        borrowed=entry == REFERENCE_MODEL,
    )
