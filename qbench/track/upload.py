"""Artifacts uploaded to the MLflow store a few at a time, not one after another.

MLflow's client uploads a folder one file per request, in turn: a variant's model is five files (MLmodel, the ONNX
file, its environment files), the sweep's run its reports. A tracking server that answers each request in half a
second made a 4-variant sweep spend ten of its 45 seconds waiting on uploads (it waits for its logging before it
times anything): the requests of one folder go together, so the wait is about one request's per folder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

UPLOAD_THREADS = 4

Upload = Callable[[str, "str | None"], object]  # (local file, artifact folder or None) -> uploads it


def files_to_upload(paths: Iterable[Path]) -> list[tuple[Path, str | None]]:
    """Each file among `paths` (a folder: each file in it, in a folder of its name) with the artifact folder it goes
    to (None: the top), as MLflow's log_artifact / log_artifacts place them."""
    files: list[tuple[Path, str | None]] = []
    for path in paths:
        if not path.is_dir():
            files.append((path, None))
            continue
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            files.append((file, str(PurePosixPath(path.name, *file.relative_to(path).parent.parts))))
    return files


def upload_all(upload: Upload, files: Sequence[tuple[Path, str | None]]) -> None:
    """`upload` each file, up to UPLOAD_THREADS at once; every upload ends before the first failure is raised."""
    if len(files) <= 1:
        for file, folder in files:
            upload(str(file), folder)
        return
    with ThreadPoolExecutor(min(len(files), UPLOAD_THREADS), thread_name_prefix="qbench-upload") as pool:
        futures = [pool.submit(upload, str(file), folder) for file, folder in files]
    for future in futures:
        future.result()
