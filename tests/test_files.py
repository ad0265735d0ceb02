"""qbench's own files are written whole or not at all; a disk that cannot take them is one line naming the file."""

from __future__ import annotations

import errno
import os
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
