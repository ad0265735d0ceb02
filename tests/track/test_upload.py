"""Artifacts uploaded together: where each file goes, uploads in flight at once, a failure raised after the rest."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from qbench.track.upload import files_to_upload, upload_all

WAIT_S = 30.0  # a loaded machine starts threads slowly; sequential uploads wait this long and fail


def test_files_go_where_mlflows_log_artifact_and_log_artifacts_put_them(tmp_path: Path) -> None:
    (tmp_path / "report.md").write_text("r")
    (tmp_path / "plots" / "deep").mkdir(parents=True)
    (tmp_path / "plots" / "a.svg").write_text("a")
    (tmp_path / "plots" / "deep" / "b.svg").write_text("b")
    paths = [tmp_path / "report.md", tmp_path / "plots"]
    assert files_to_upload(paths) == [(tmp_path / "report.md", None), (tmp_path / "plots" / "a.svg", "plots"),
                                      (tmp_path / "plots" / "deep" / "b.svg", "plots/deep")]  # fmt: skip


def test_uploads_are_in_flight_together() -> None:
    """Each upload waits until another one is in flight: one after another, the first would wait alone."""
    lock, together = threading.Lock(), threading.Event()
    in_flight, uploaded = [0], []

    def upload(file: str, folder: str | None) -> None:
        with lock:
            in_flight[0] += 1
            if in_flight[0] >= 2:
                together.set()
        try:
            if not together.wait(WAIT_S):
                raise AssertionError(f"{file} was uploaded alone")
            uploaded.append((file, folder))
        finally:
            with lock:
                in_flight[0] -= 1

    files = [(Path(f"f{i}"), "model" if i % 2 else None) for i in range(5)]
    upload_all(upload, files)
    assert sorted(uploaded) == sorted((str(f), d) for f, d in files)


def test_a_failed_upload_is_raised_once_the_others_ended() -> None:
    uploaded: list[str] = []

    def upload(file: str, folder: str | None) -> None:
        if file == "f1":
            raise OSError(28, "No space left on device")
        uploaded.append(file)

    with pytest.raises(OSError, match="No space left"):
        upload_all(upload, [(Path(f"f{i}"), None) for i in range(4)])
    assert sorted(uploaded) == ["f0", "f2", "f3"]
