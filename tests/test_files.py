"""qbench's own files are written whole or not at all; a disk that cannot take them is one line naming the file."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from qbench.errors import QbenchError
from qbench.files import write_atomically


@pytest.mark.parametrize(("code", "reason"), [(errno.ENOSPC, "No space left on device"),
                                              (errno.EROFS, "Read-only file system")])  # fmt: skip
def test_a_full_or_read_only_disk_leaves_the_file_as_it_was_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, reason: str
) -> None:
    target = tmp_path / "results.json"
    target.write_text('{"complete": false}')
    write_text = Path.write_text

    def cut_short(path: Path, text: str, *args: object, **kwargs: object) -> int:
        write_text(path, text[:5])
        raise OSError(code, reason)

    monkeypatch.setattr(Path, "write_text", cut_short)
    with pytest.raises(QbenchError, match=rf"^cannot write {target}: {reason}; free space there$"):
        write_atomically(target, '{"complete": true}')
    assert target.read_text() == '{"complete": false}'
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_another_os_error_is_not_taken_for_a_full_disk(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomically(tmp_path / "missing" / "results.json", "{}")
    assert not (tmp_path / "missing").exists()
