"""qbench's own files are written whole or not at all; a disk that cannot take them is one line naming the file."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from qbench.errors import QbenchError
from qbench.files import write_atomically, write_fault


@pytest.mark.parametrize(("code", "reason"), [(errno.ENOSPC, "No space left on device"),
                                              (errno.EROFS, "Read-only file system")])  # fmt: skip
def test_a_full_or_read_only_disk_leaves_the_file_as_it_was_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, reason: str
) -> None:
    target = tmp_path / "results.json"
    target.write_text('{"complete": false}')
    replace = os.replace

    def cut_short(source: str, destination: str) -> None:
        raise OSError(code, reason)

    monkeypatch.setattr(os, "replace", cut_short)
    with pytest.raises(QbenchError, match=rf"^{target}: cannot write the results: {reason}$"):
        write_atomically(target, '{"complete": true}', what="the results")
    monkeypatch.setattr(os, "replace", replace)
    assert target.read_text() == '{"complete": false}'
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_a_missing_folder_is_made(tmp_path: Path) -> None:
    assert write_atomically(tmp_path / "new" / "results.json", "{}", what="the results").read_text() == "{}"


@pytest.mark.skipif(os.name != "posix", reason="a folder is synced on POSIX only")
def test_the_content_is_synced_before_the_rename_and_the_folder_after(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A rename without fsync may leave an empty file after a power loss: the temporary file is synced whole before
    it replaces the target, and the folder once it has."""
    target = tmp_path / "results.json"
    target.write_text('{"complete": false}')
    text = '{"complete": true, "variants": ["fp16"]}'
    synced: list[tuple[str, str, str]] = []
    fsync = os.fsync

    def record(handle: int) -> None:
        if os.path.samestat(os.fstat(handle), os.stat(tmp_path)):
            synced.append(("folder", "", target.read_text()))
        else:
            synced.append(("file", os.pread(handle, 1 << 16, 0).decode(), target.read_text()))
        fsync(handle)

    monkeypatch.setattr(os, "fsync", record)
    write_atomically(target, text, what="the results")
    assert synced == [("file", text, '{"complete": false}'), ("folder", "", text)]


def test_a_file_that_need_not_outlive_the_machine_is_replaced_whole_without_a_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`durable=False` (a mark read only after the writing process died): no sync of the file nor of its folder, and
    still the new content in place of the old, with no temporary file left."""
    target = tmp_path / "job.started"
    target.write_text('{"attempts": 1}')
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    write_atomically(target, '{"attempts": 2}', what="the mark", durable=False)
    assert synced == []
    assert target.read_text() == '{"attempts": 2}'
    assert [p.name for p in tmp_path.iterdir()] == ["job.started"]


def test_a_folder_that_cannot_be_synced_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Some file systems refuse to sync a folder (EINVAL): the file is in place all the same."""
    fsync = os.fsync

    def refuse_folders(handle: int) -> None:
        if os.path.samestat(os.fstat(handle), os.stat(tmp_path)):
            raise OSError(errno.EINVAL, "Invalid argument")
        fsync(handle)

    monkeypatch.setattr(os, "fsync", refuse_folders)
    assert write_atomically(tmp_path / "results.json", "{}", what="the results").read_text() == "{}"


def test_a_failed_sync_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The content could not be made durable (EIO): the target is left as it was, and the line names it."""
    target = tmp_path / "results.json"
    target.write_text('{"complete": false}')

    def fail(handle: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(QbenchError, match=rf"^{target}: cannot write the results: Input/output error$"):
        write_atomically(target, '{"complete": true}', what="the results")
    assert target.read_text() == '{"complete": false}'
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


@pytest.mark.parametrize(("code", "fault"), [(errno.ENOSPC, True), (errno.EDQUOT, True), (errno.EROFS, True),
                                             (errno.ENOENT, False), (errno.EACCES, False)])  # fmt: skip
def test_a_write_fault_is_found_through_the_error_writing_it_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, fault: bool
) -> None:
    """What a best-effort step (the range analysis, a search's candidate, an FP16 trial) must not swallow: the file
    system's fault, under the QbenchError writing the file raised."""

    def refused(source: str, destination: str) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(QbenchError) as raised:
        write_atomically(tmp_path / "model.onnx", "x", what="the model")
    found = write_fault(raised.value)
    assert (found is not None and found.errno == code) if fault else found is None
    try:
        try:
            raise raised.value
        except QbenchError:
            raise RuntimeError("the analysis failed") from None
    except RuntimeError as hidden:  # raised `from None` while handling it: not its cause
        assert hidden.__context__ is raised.value and write_fault(hidden) is None
