"""Bounding the build store (`qbench cache prune`): least recently used entries go first, an entry a running sweep
registered never goes, a reused entry counts as used, leftovers of killed publishers go once abandoned."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from probe_project import write_probe_recipe
from tiny_linear import make_linear_project

import qbench.sweep.runner as sweep
from qbench.cli.app import main
from qbench.execute.cache import IN_USE, entries_in_use, keys_in_use, prune
from qbench.execute.snapshot import snapshot_keys, take_snapshot
from qbench.execute.store import ABANDONED_AFTER_S, SOURCES, BuildStore, manifest_of
from qbench.provenance import input_digests
from qbench.recipe.spec import load_recipe
from qbench.variants.base import BuiltVariant

FACTS = {"onnxruntime": "1.0", "machine": "x86_64"}  # what the builds here were made with (plan.build_facts)

DAY = 86400.0


def _entry(folder: Path, size: int, age_days: float) -> Path:
    """An entry folder holding `size` bytes, last used `age_days` ago."""
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"\0" * size)
    used = time.time() - age_days * DAY
    os.utime(folder, (used, used))
    return folder


def _key(n: int) -> str:
    return f"{n:032x}"


def _names(entries) -> set[str]:
    return {entry.path.name for entry in entries}


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    for n, age in enumerate([30, 10, 2, 1]):
        _entry(root / _key(n), 1000, age)
    _entry(root / SOURCES / _key(9), 5000, 20)  # an input copy
    return root


def test_entries_unused_for_longer_than_asked_are_removed_and_the_rest_kept(store: Path) -> None:
    done = prune(store, older_than_days=5)
    assert _names(done.removed) == {_key(0), _key(1), _key(9)}
    assert done.freed == 7000
    assert sorted(p.name for p in store.iterdir()) == [_key(2), _key(3), SOURCES]
    assert list((store / SOURCES).iterdir()) == []


def test_a_size_bound_removes_the_least_recently_used_first(store: Path) -> None:
    done = prune(store, max_bytes=2500)  # 9000 bytes stored
    assert [entry.path.name for entry in done.removed] == [_key(0), _key(9), _key(1)]  # oldest first
    assert _names(done.kept) == {_key(2), _key(3)}


def test_a_dry_run_removes_nothing(store: Path) -> None:
    done = prune(store, max_bytes=0, dry_run=True)
    assert len(done.removed) == 5 and done.freed == 9000
    assert (store / _key(0)).is_dir() and (store / SOURCES / _key(9)).is_dir()


def test_entries_a_running_sweep_registered_are_never_removed(store: Path) -> None:
    with entries_in_use(store, [_key(0), _key(9)]):
        done = prune(store, max_bytes=0)
        assert _names(done.in_use) == {_key(0), _key(9)}
        assert (store / _key(0)).is_dir() and (store / SOURCES / _key(9)).is_dir()
        assert _names(done.removed) == {_key(1), _key(2), _key(3)}
    assert list((store / IN_USE).iterdir()) == []  # released when the block ends
    assert _names(prune(store, max_bytes=0).removed) == {_key(0), _key(9)}


def test_the_registration_of_a_killed_sweep_protects_nothing_and_is_removed(store: Path) -> None:
    (store / IN_USE).mkdir()
    (store / IN_USE / "4242-deadbeef").write_text(f"{_key(0)}\n")  # no process holds it locked
    assert keys_in_use(store) == set()
    assert list((store / IN_USE).iterdir()) == []
    assert _key(0) in _names(prune(store, max_bytes=0).removed)


def test_leftovers_of_killed_publishers_go_once_abandoned_whatever_the_bounds(store: Path) -> None:
    old, young = store / f".{_key(5)}.ab12cd34.publishing", store / SOURCES / f".{_key(6)}.ef56ab78.publishing"
    _entry(old, 10, (ABANDONED_AFTER_S + 60) / DAY)
    _entry(young, 10, 0)  # a publish under way
    done = prune(store, older_than_days=365)
    assert _names(done.removed) == {old.name}
    assert young.is_dir()


def test_reusing_a_build_or_an_input_copy_makes_it_the_most_recently_used(tmp_path: Path) -> None:
    store = BuildStore(str(tmp_path / "store"))
    folder = tmp_path / "build"
    folder.mkdir()
    (folder / "m.onnx").write_bytes(b"model")
    built = BuiltVariant(name="int8", precision="int8", onnx_path=folder / "m.onnx")
    store.publish(_key(1), folder, manifest_of(built, folder, FACTS, reusable=True))
    root = tmp_path / "store"
    ancient = time.time() - 100 * DAY
    os.utime(root / _key(1), (ancient, ancient))
    (tmp_path / "project").mkdir()
    recipe = load_recipe(make_linear_project(tmp_path / "project", f"sqlite:///{tmp_path / 'mlflow.db'}"))
    inputs = input_digests(recipe)
    take_snapshot(inputs, store.sources_root)
    for key in snapshot_keys(inputs):
        os.utime(store.sources_root / key, (ancient, ancient))
    _entry(root / _key(2), 10, 50)  # newer than both, never reused

    assert store.reusable(_key(1), FACTS) is not None
    take_snapshot(inputs, store.sources_root)
    assert _names(prune(root, older_than_days=30).removed) == {_key(2)}


def test_a_sweep_registers_every_entry_it_reads_while_it_runs(user_project: Path, tmp_path: Path, monkeypatch) -> None:
    recipe = write_probe_recipe(user_project, tmp_path, variants=["fp16"])
    registered: list[set[str]] = []

    def snapshot(inputs, root):
        registered.append(keys_in_use(tmp_path / "store"))
        return take_snapshot(inputs, root)

    monkeypatch.setattr(sweep, "take_snapshot", snapshot)
    outcome = sweep.run_sweep(recipe, track=False)
    plan = (outcome.run_dir / "plan.json").read_text()
    inputs = input_digests(load_recipe(recipe))
    (keys,) = registered
    assert snapshot_keys(inputs) <= keys and len(keys) == len(snapshot_keys(inputs)) + 2  # FP32's and fp16's builds
    assert all(key in plan for key in keys - snapshot_keys(inputs))
    assert keys_in_use(tmp_path / "store") == set()  # released when the sweep ended


def test_cache_prune_prints_what_it_removed_and_the_space_freed(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cache", "prune", "--store", str(store), "--max-size", "3K"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert f"removed build {store / _key(0)} (1000 B)" in shown
    assert f"{store}: removed 2 entries, freed 5.9 KiB; kept 3 (2.9 KiB)" in shown  # 30-day-old build, input copy


def test_cache_prune_on_a_store_it_cannot_write_is_one_line_and_exit_2(
    store: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only store (a mount, another user's folder) said `removed 0 entries, freed 0 B` and exit 0: the CI
    clean-up step passed and the store kept growing."""
    import errno

    def refused(path: Path, target: Path) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(path), None, str(target))

    monkeypatch.setattr(Path, "rename", refused)
    assert main(["cache", "prune", "--store", str(store), "--older-than", "5"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: qbench cache prune: cannot remove {store / _key(0)} from the build store {store}: Read-only file "
        "system; expected a store this user can write (run it where the store is mounted read-write)"
    )
    assert len(list(store.iterdir())) == 5  # nothing removed

@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-size", "lots"], "error: --max-size: got 'lots', expected a size such as 500M or 20G"),
        ([], "error: qbench cache prune: expected --older-than DAYS, --max-size SIZE or both"),
    ],
)
def test_cache_prune_with_bad_options_is_one_line(store: Path, capsys, args: list[str], message: str) -> None:
    assert main(["cache", "prune", "--store", str(store), *args]) == 2
    assert capsys.readouterr().err.strip() == message
    assert len(list(store.iterdir())) == 5  # nothing removed
