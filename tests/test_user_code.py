"""The user's project as a process imported it: which modules a cache key follows, and which files its code read."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from qbench.user_code import files_read, project_modules

NAMES = ("uc_helper", "uc_vendored", "uc_elsewhere", "uc_pkg", "uc_pkg.inner")


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    yield
    for name in NAMES:
        sys.modules.pop(name, None)


def test_project_modules_are_those_under_the_roots_less_installed_packages(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    vendored = project / ".venv" / "lib" / "python3.11" / "site-packages"  # a virtual environment in the project
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    for folder, name in ((project, "uc_helper"), (vendored, "uc_vendored"), (elsewhere, "uc_elsewhere")):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.py").write_text("VALUE = 1\n")
        monkeypatch.syspath_prepend(str(folder))
    (project / "uc_pkg").mkdir()
    (project / "uc_pkg" / "__init__.py").write_text("")
    (project / "uc_pkg" / "inner.py").write_text("VALUE = 2\n")
    for name in NAMES:
        importlib.import_module(name)
    found = project_modules([project])
    assert [(name, path) for name, _, path in found] == [
        ("uc_helper", (project / "uc_helper.py").resolve()),
        ("uc_pkg", (project / "uc_pkg" / "__init__.py").resolve()),
        ("uc_pkg.inner", (project / "uc_pkg" / "inner.py").resolve()),
    ]
    assert [module for _, module, _ in found] == [sys.modules[n] for n in ("uc_helper", "uc_pkg", "uc_pkg.inner")]
    assert [name for name, _, _ in project_modules([project, elsewhere])] == [
        "uc_elsewhere", "uc_helper", "uc_pkg", "uc_pkg.inner"]  # fmt: skip


def test_project_modules_follow_links_into_the_project_and_resolve_each_folder_once(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module imported through a link (a linked file, a linked folder) is the project's file it leads to. Every
    module file was resolved on its own before: os.path.realpath ~5,000 times, 0.25 s of a MiniLM sweep's preparation
    on a 2-core machine; now once per folder (plus each linked file)."""
    import os

    project = tmp_path / "project"
    (project / "uc_pkg").mkdir(parents=True)
    (project / "uc_pkg" / "__init__.py").write_text("")
    (project / "uc_pkg" / "inner.py").write_text("VALUE = 2\n")
    (project / "uc_helper.py").write_text("VALUE = 1\n")
    links = tmp_path_factory.mktemp("links")
    (links / "uc_helper.py").symlink_to(project / "uc_helper.py")  # a linked file
    (links / "uc_pkg").symlink_to(project / "uc_pkg", target_is_directory=True)  # a linked folder
    monkeypatch.syspath_prepend(str(links))
    for name in ("uc_helper", "uc_pkg", "uc_pkg.inner"):
        importlib.import_module(name)
    assert sys.modules["uc_pkg.inner"].__file__ == str(links / "uc_pkg" / "inner.py")
    real = os.path.realpath
    calls: list[str] = []

    def counted(path: str, *args: object, **kwargs: object) -> str:
        calls.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os.path, "realpath", counted)
    found = project_modules([project])
    monkeypatch.undo()
    assert [(name, path) for name, _, path in found] == [
        ("uc_helper", (project / "uc_helper.py").resolve()),
        ("uc_pkg", (project / "uc_pkg" / "__init__.py").resolve()),
        ("uc_pkg.inner", (project / "uc_pkg" / "inner.py").resolve()),
    ]
    files = {m.__file__ for m in list(sys.modules.values()) if isinstance(getattr(m, "__file__", None), str)}
    assert [path for path in calls if path in files] == [str(links / "uc_helper.py")]  # the linked file's alone


def test_files_read_are_those_opened_to_read_inside_the_block_on_this_thread(tmp_path: Path) -> None:
    import os
    import threading

    for name in ("checkpoint.bin", "config.json", "state.json", "before.txt", "other_thread.txt"):
        (tmp_path / name).write_text(name)
    (tmp_path / "before.txt").read_text()
    with files_read() as found:
        (tmp_path / "checkpoint.bin").read_bytes()
        os.close(os.open(tmp_path / "config.json", os.O_RDONLY))
        (tmp_path / "log.txt").write_text("written, not read")
        with open(tmp_path / "state.json", "r+"):  # opened to write too: what the code wrote is no input
            pass
        elsewhere = threading.Thread(target=(tmp_path / "other_thread.txt").read_text)
        elsewhere.start()
        elsewhere.join()
    (tmp_path / "after.txt").write_text("after")
    (tmp_path / "after.txt").read_text()
    assert found == {str(tmp_path / "checkpoint.bin"), str(tmp_path / "config.json")}
