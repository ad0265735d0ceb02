"""Built variants kept by content: `<store>/<build key>/` holds a build's files and its manifest.

A build job builds in a private folder and publishes every file it wrote, then `manifest.json` last,
so a key with a manifest is a complete build. Any node reads a build back by its key: the store is a
folder (on one machine, or a shared mount) or any fsspec URI (`s3://bucket/prefix`, `gs://...`).
The key (qbench.execute.plan.build_key) hashes everything the build depends on; the manifest also
records the environment it was built in, and a build from another environment is not reused.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

from qbench.variants.base import BuiltVariant

MANIFEST = "manifest.json"
_MANIFEST_FORMAT = 1


class BuildStore:
    """The builds of one store root (a path or an fsspec URI); picklable, so it travels with jobs."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self._fs: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "_fs": None}

    @property
    def local(self) -> Path | None:
        """The store's folder when it is on a local (or mounted) file system."""
        return None if "://" in self.root and not self.root.startswith("file://") else Path(self._path(""))

    def _path(self, *parts: str) -> str:
        base = self.root.removeprefix("file://")
        return "/".join([base, *[p for p in parts if p]])

    def _filesystem(self) -> Any:
        if self._fs is None:
            import fsspec

            self._fs = fsspec.core.url_to_fs(self.root)[0]
        return self._fs

    def manifest(self, key: str) -> dict[str, Any] | None:
        """The manifest of a complete build under `key`; None when there is none (or it is unreadable)."""
        if self.local is not None:
            path = Path(self._path(key, MANIFEST))
            text = path.read_text() if path.is_file() else None
        else:
            fs = self._filesystem()
            target = f"{self.root}/{key}/{MANIFEST}"
            text = fs.cat_file(target).decode() if fs.exists(target) else None
        try:
            content = json.loads(text) if text is not None else None
        except ValueError:
            return None
        return content if isinstance(content, dict) and content.get("format") == _MANIFEST_FORMAT else None

    def publish(self, key: str, folder: Path, manifest: dict[str, Any]) -> None:
        """Copy every file of `folder` under `key`, then write the manifest (which makes the build visible)."""
        text = json.dumps(manifest, indent=2, sort_keys=True)
        local = self.local
        if local is not None:
            target = local / key
            (target / MANIFEST).unlink(missing_ok=True)
            target.mkdir(parents=True, exist_ok=True)
            for name in manifest["files"]:
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(folder / name, target / f"{name}.tmp")
                os.replace(target / f"{name}.tmp", target / name)
            (target / f"{MANIFEST}.tmp").write_text(text)
            os.replace(target / f"{MANIFEST}.tmp", target / MANIFEST)
            return
        fs = self._filesystem()
        if fs.exists(f"{self.root}/{key}/{MANIFEST}"):
            fs.rm(f"{self.root}/{key}/{MANIFEST}")
        for name in manifest["files"]:
            fs.put_file(str(folder / name), f"{self.root}/{key}/{name}")
        fs.pipe_file(f"{self.root}/{key}/{MANIFEST}", text.encode())

    def materialise(self, key: str, manifest: dict[str, Any], folder: Path) -> None:
        """The build's files in `folder` (hard links from a local store when it can, else copies)."""
        folder.mkdir(parents=True, exist_ok=True)
        local = self.local
        for name in manifest["files"]:
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if local is None:
                self._filesystem().get_file(f"{self.root}/{key}/{name}", str(target))
                continue
            target.unlink(missing_ok=True)
            try:
                os.link(local / key / name, target)
            except OSError:  # another file system, or links not allowed
                shutil.copyfile(local / key / name, target)

    def local_copy(self, built: BuiltVariant, key: str) -> BuiltVariant:
        """`built` with its files on this node: as it is when its model is readable here, else fetched from
        the store into this node's cache (`$QBENCH_CACHE_DIR/fetched/<key>/`). A model that is an input
        file (FP32's) is never in the store: every node reads the inputs."""
        if built.onnx_path.is_file():
            return built
        from dataclasses import replace

        from qbench.errors import QbenchError
        from qbench.sources.torch_model import export_cache_dir

        manifest = self.manifest(key)
        if manifest is None:
            raise QbenchError(
                f"build {key} of {built.name!r} is neither at {built.onnx_path} nor in the store {self.root}"
            )
        folder = export_cache_dir() / "fetched" / key
        self.materialise(key, manifest, folder)
        return replace(built, onnx_path=folder / manifest["onnx"])


def build_environment() -> dict[str, str]:
    """What a build's bytes may depend on beyond its inputs: package versions and the CPU's INT8 kind."""
    from qbench.environment import needs_reduce_range

    versions = {}
    for package in (
        "qbench",
        "onnx",
        "onnxruntime",
        "torch",
        "torchao",
        "nvidia-modelopt",
    ):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "absent"
    return {
        **versions,
        "machine": platform.machine(),
        "reduce_range_auto": str(needs_reduce_range()),
    }


def manifest_of(built: BuiltVariant, folder: Path, environment: dict[str, str], *, reusable: bool) -> dict[str, Any]:
    """The manifest of `built`, whose files are in `folder`: everything to rebuild the BuiltVariant from them.

    `reusable` is False when the build's torch form lives only in memory (QAT, ModelOpt): a resumed sweep
    builds such a variant again rather than measure it without that form."""
    from qbench.results import to_jsonable

    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    return {
        "format": _MANIFEST_FORMAT,
        "name": built.name,
        "precision": built.precision,
        "onnx": _onnx_entry(built.onnx_path, folder),
        "files": files,
        "params": to_jsonable(built.params),
        "build_seconds": built.build_seconds,
        "session_hints": to_jsonable(built.session_hints),
        "notes": list(built.notes),
        "simulation": built.simulation,
        "activation_ranges": {name: list(bounds) for name, bounds in built.activation_ranges.items()},
        "environment": environment,
        "reusable": reusable,
    }


def _onnx_entry(onnx_path: Path, folder: Path) -> str:
    """The model's name in the build folder, or its absolute path when the build reuses an input file (FP32)."""
    resolved = onnx_path.resolve()
    return str(resolved.relative_to(folder.resolve())) if resolved.is_relative_to(folder.resolve()) else str(resolved)


def built_from_manifest(manifest: dict[str, Any], folder: Path) -> BuiltVariant:
    """The BuiltVariant a manifest describes, its files in `folder` (no torch form: see jobs.with_torch_form)."""
    return BuiltVariant(
        name=manifest["name"],
        precision=manifest["precision"],
        onnx_path=folder / manifest["onnx"],  # an absolute entry (an input file) stays as it is
        params=dict(manifest["params"]),
        build_seconds=float(manifest["build_seconds"]),
        session_hints=dict(manifest["session_hints"]),
        notes=tuple(manifest["notes"]),
        simulation=bool(manifest["simulation"]),
        activation_ranges={name: (float(lo), float(hi)) for name, (lo, hi) in manifest["activation_ranges"].items()},
    )
