"""The sweep's own copy of the files it reads its model and data from, kept by content.

A sweep hashes its inputs once, when it starts (qbench.provenance); its results, its build keys and a
resume all stand on those digests. Reading the user's files again by path afterwards (each build, each
measurement, the range pass, a Ray worker preparing its data) would read whatever they hold by then: a
model overwritten during the sweep would be measured, and its builds stored, under the digest of the
one it replaced. So the sweep first copies each file it reads (the ONNX model with its external data at
their relative locations, the PyTorch weights, the data, the calibration data, each text input's
tokenizer folder, and each image column's files: those its rows name, qbench.data.image_files, under
`<key>/<root's name>/` and an absolute path's under `<key>/<root's name>.absolute/`) to `<root>/<key>/`,
key a digest of the files' names and recorded sha256s, checks that the copies have those digests, and
from then on reads only the copies (an image column's decoding and its content digests too). A copy that does not (the
file changed between being hashed and being copied) stops the sweep: "<file> changed while the sweep read it;
run again".

Python code the recipe names (the PyTorch factory's module, custom metric modules) is imported from the
user's file instead: a copy elsewhere would change what its own imports find. Once imported, its digest
must still be the recorded one (`Snapshot.check_read`), else the sweep stops the same way.

An entry appears by renaming a complete staging folder, and every sweep checks the entry it uses (one
edited by hand, or left broken, is copied again), so concurrent sweeps and Ray workers share entries.
The root is the build store's `sources/` folder (qbench.execute.store.BuildStore.sources_root). The
gate still compares the user's files with the recorded digests (qbench.provenance.changed_inputs).
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from qbench.digests import bytes_sha256, file_sha256, files_sha256
from qbench.errors import QbenchError
from qbench.provenance import (
    EXTERNAL_DATA_INPUT,
    TOKENIZER_INPUT_SUFFIX,
    InputDigest,
    image_files_input,
    tokenizer_input,
)
from qbench.recipe.data import DataSpec, ImageInputSpec, TextInputSpec

logger = logging.getLogger(__name__)

SNAPSHOT_INPUTS = ("model", "model.weights", "data", "data.calibration")  # the inputs read by path, and tokenizers


def _copied(name: str, entry: InputDigest) -> bool:
    return name in SNAPSHOT_INPUTS or name.endswith(TOKENIZER_INPUT_SUFFIX) or entry.files is not None


def changed_while_read(path: Path | str) -> QbenchError:
    """The error that stops a sweep whose input `path` is no longer what the sweep hashed."""
    return QbenchError(f"{path} changed while the sweep read it; run again")


@dataclass(frozen=True)
class Snapshot:
    """Input name -> the copy this process reads it from; `inputs` are the digests the copies were checked
    against (what a Ray worker takes its own snapshot from)."""

    copies: Mapping[str, Path]
    inputs: Mapping[str, InputDigest] = field(default_factory=dict)

    def path(self, name: str, default: Path) -> Path:
        """The copy of input `name`, or `default` (the user's file) when it was not copied."""
        return self.copies.get(name, default)

    def data(self, data: DataSpec) -> DataSpec:
        """`data` with each text input's tokenizer read from its copy, and each image column's files."""
        inputs = {}
        for column, spec in data.inputs.items():
            copy = self.copies.get(tokenizer_input(column)) if isinstance(spec, TextInputSpec) else None
            if copy is not None:
                spec = spec.model_copy(update={"tokenizer": spec.tokenizer.model_copy(update={"path": str(copy)})})
            images = self.copies.get(image_files_input(column)) if isinstance(spec, ImageInputSpec) else None
            if images is not None:
                files = self.inputs[image_files_input(column)].files or {}
                copies = {name: (images.parent / _image_target(images.name, name), sha256)
                          for name, sha256 in files.items()}  # fmt: skip
                spec = spec.model_copy(update={"image": spec.image.read_from(copies)})
            inputs[column] = spec
        return data.model_copy(update={"inputs": inputs})

    def check_read(self, name: str, sha256: str | None = None) -> None:
        """Input `name`, read in place rather than from a copy (code imported from the user's file), must still be
        what the sweep hashed now that it is read: its digest then (`sha256`, else its file hashed now) against
        the recorded one; else the sweep stops (changed_while_read). An input not recorded is not checked."""
        recorded = self.inputs.get(name)
        if recorded is not None and (sha256 or file_sha256(Path(recorded.path))) != recorded.sha256:
            raise changed_while_read(recorded.path)

    def shown(self, text: str) -> str:
        """`text` naming the user's files where it names a copy (a message about the model names the user's)."""
        for name, copy in self.copies.items():
            text = text.replace(str(copy.parent), str(Path(self.inputs[name].path).parent))
        return text


@dataclass(frozen=True)
class _Group:
    """One input's files: the user's folder, the input's own name in it, and every file to copy (names
    relative to that folder -> recorded sha256; the model's external data beside the model). An image column's
    files are named as their copies are (`_image_target`), read from `sources`, and hashed by their bytes."""

    folder: Path
    main: str
    files: dict[str, str]
    sources: dict[str, Path] = field(default_factory=dict)
    images: bool = False

    @property
    def key(self) -> str:
        return files_sha256(self.files)

    def source(self, name: str) -> Path:
        return self.sources.get(name, self.folder / name)

    def sha256(self, copy: Path) -> str:
        return bytes_sha256(copy) if self.images else file_sha256(copy)


def take_snapshot(inputs: Mapping[str, InputDigest], root: Path) -> Snapshot:
    """Copies of the inputs read by path (SNAPSHOT_INPUTS) under `root`, each checked against its recorded digest;
    an entry already there and intact is used as it is."""
    from qbench.execute.store import mark_used

    copies = {}
    for name, group in _groups(inputs).items():
        entry = root / group.key
        damaged = _mismatch(entry, group)
        if damaged is None:
            mark_used(entry)
            copies[name] = entry / group.main
            continue
        if entry.exists():  # not a first copy: an entry changed, truncated or emptied since it was copied
            logger.info("input copy %s is missing or changed since it was copied: copying %s again", entry / damaged,
                        group.source(damaged))  # fmt: skip
        _publish(entry, group)
        copies[name] = entry / group.main
    return Snapshot(copies, dict(inputs))


def snapshot_keys(inputs: Mapping[str, InputDigest]) -> set[str]:
    """The entries under the snapshot root that `take_snapshot(inputs, ...)` reads or writes."""
    return {group.key for group in _groups(inputs).values()}


def _image_target(main: str, name: str) -> str:
    """Where image file `name` (qbench.data.images.image_file) is copied in its entry: under the root's name, an
    absolute path under `<root's name>.absolute/`."""
    path = Path(name)
    return f"{main}.absolute/{path.relative_to(path.anchor).as_posix()}" if path.is_absolute() else f"{main}/{name}"


def _image_group(entry: InputDigest) -> _Group:
    from qbench.data.image_files import source_path

    root = Path(entry.path)
    main = root.name or "root"
    files = {_image_target(main, name): sha256 for name, sha256 in (entry.files or {}).items()}
    sources = {_image_target(main, name): source_path(root, name) for name in entry.files or {}}
    return _Group(root.parent, main, files, sources, images=True)


def _groups(inputs: Mapping[str, InputDigest]) -> dict[str, _Group]:
    groups = {}
    for name in (name for name, entry in inputs.items() if _copied(name, entry)):
        if inputs[name].files is not None:
            groups[name] = _image_group(inputs[name])
            continue
        path = Path(inputs[name].path)
        files = {path.name: inputs[name].sha256}
        if name == "model":
            for input_name, entry in inputs.items():
                if input_name.startswith(EXTERNAL_DATA_INPUT):
                    files[input_name.removeprefix(EXTERNAL_DATA_INPUT)] = entry.sha256
        groups[name] = _Group(path.parent, path.name, files)
    return groups


def _mismatch(entry: Path, group: _Group) -> str | None:
    """The first file of `group` that `entry` lacks or holds with another digest; None when it is intact."""
    for name, sha256 in group.files.items():
        try:
            if group.sha256(entry / name) != sha256:
                return name
        except OSError:
            return name
    return None


def _publish(entry: Path, group: _Group) -> None:
    """Copy `group` from the user's folder to `entry` (a staging folder renamed into place), then check it.
    A root that cannot take the copies (full, read-only) raises StoreUnwritable naming it."""
    from qbench.execute.store import new_staging, remove_abandoned, store_writes

    with store_writes(entry.parent):
        entry.parent.mkdir(parents=True, exist_ok=True)
        remove_abandoned(entry.parent)
        staging = new_staging(entry.parent, entry.name)
    try:
        with store_writes(entry.parent):
            for name in group.files:
                source, target = group.source(name), staging / name
                target.parent.mkdir(parents=True, exist_ok=True)
                if source.is_dir():  # a data folder (Parquet parts, `datasets` save_to_disk)
                    shutil.copytree(source, target)
                else:
                    shutil.copy2(source, target)  # its time kept: a settled copy's digest is remembered
            if group.images:  # a root no row reads from is still a folder
                (staging / group.main).mkdir(exist_ok=True)
            _move_in(staging, entry, group)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when it was moved in
    changed = _mismatch(entry, group)  # checked where it is read from: the digests remembered are the copy's
    if changed is not None:
        _discard(entry)
        raise changed_while_read(group.source(changed))


def _move_in(staging: Path, entry: Path, group: _Group) -> None:
    """Rename `staging` to `entry`; an intact entry put there meanwhile (another sweep) is kept, a broken one
    replaced."""
    while True:
        try:
            os.rename(staging, entry)  # refused when `entry` holds anything: an entry is never mixed
            return
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                raise
        if _mismatch(entry, group) is None:
            return
        _discard(entry)


def _discard(entry: Path) -> None:
    """Move `entry` aside in one step (no reader sees it half deleted), then delete it."""
    discarded = entry.with_name(f".{entry.name}.{secrets.token_hex(4)}.discarded")
    try:
        os.rename(entry, discarded)
    except FileNotFoundError:  # another sweep moved it aside just now
        return
    shutil.rmtree(discarded, ignore_errors=True) if discarded.is_dir() else discarded.unlink()
