"""Image inputs in a sweep's snapshot: the files the rows name are hashed (each file's digest remembered by its stat),
copied by content and decoded from the copies; the gate hashes exactly those files again."""

from __future__ import annotations

import builtins
import os
import time
from pathlib import Path

import numpy as np
import pytest
from image_project import SIDE, png, write_image_project

import qbench.digests as digests
from qbench.cli.app import main
from qbench.execute.snapshot import take_snapshot
from qbench.preflight.prepare import prepare
from qbench.provenance import image_files_input, input_digests
from qbench.recipe.spec import load_recipe

pytest.importorskip("PIL.Image")

NAME = image_files_input("file")


def _project(root: Path, count: int = 16, cells: list[str] | None = None) -> Path:
    rng = np.random.default_rng(4)
    for index in range(count):
        png(root / "images" / f"{index}.png", rng.integers(0, 256, (SIDE, SIDE, 3)))
    cells = cells if cells is not None else [f"{index}.png" for index in range(count)]
    return write_image_project(root, cells, [index % 3 for index in range(len(cells))],
                               executor={"store": str(root / "store")})  # fmt: skip


def _settle(folder: Path) -> None:
    """Every file under `folder` last modified an hour ago: settled (qbench.digests.file_key), its digest remembered."""
    past = time.time() - 3600
    for path in folder.rglob("*"):
        os.utime(path, (past, past))


def test_an_image_rewritten_after_hashing_stops_the_sweep_with_one_line(tmp_path, monkeypatch, capsys) -> None:
    import qbench.sweep.runner as sweep

    recipe = _project(tmp_path)
    image = tmp_path / "images" / "3.png"
    snapshot_of = sweep.take_snapshot

    def rewrite_then_snapshot(inputs, root):  # another process rewrites an image as the sweep starts reading
        png(image, np.zeros((SIDE, SIDE, 3)))
        return snapshot_of(inputs, root)

    monkeypatch.setattr(sweep, "take_snapshot", rewrite_then_snapshot)
    assert main(["sweep", str(recipe), "--no-track"]) == 2
    assert f"{image} changed while the sweep read it; run again" in " ".join(capsys.readouterr().err.split())


def test_the_images_are_decoded_from_the_snapshot_not_the_users_files(tmp_path) -> None:
    recipe = load_recipe(_project(tmp_path))
    inputs = input_digests(recipe)
    taken = take_snapshot(inputs, tmp_path / "sources")
    before = prepare(recipe, track=False, destinations=False, backends=False, snapshot=lambda: taken)
    for index in range(16):  # every image rewritten once the snapshot is taken
        png(tmp_path / "images" / f"{index}.png", np.full((SIDE, SIDE, 3), 7))
    after = prepare(recipe, track=False, destinations=False, backends=False, snapshot=lambda: taken)
    np.testing.assert_array_equal(after.evaluation_feeds["pixels"], before.evaluation_feeds["pixels"])
    assert len(np.unique(after.evaluation_feeds["pixels"].reshape(16, -1), axis=0)) == 16  # not the rewritten ones
    copied = sorted(p.name for p in taken.copies[NAME].rglob("*") if p.is_file())
    assert copied == sorted(f"{index}.png" for index in range(16))


def test_an_unreferenced_file_added_to_the_root_is_not_copied_and_leaves_the_gate_fresh(tmp_path, capsys) -> None:
    recipe = _project(tmp_path, count=6, cells=[f"{index}.png" for index in range(5)])  # 5.png named by no row
    assert main(["sweep", str(recipe), "--no-track"]) == 0
    copied = [p.name for p in (tmp_path / "store").rglob("*.png")]
    assert sorted(copied) == [f"{index}.png" for index in range(5)]
    png(tmp_path / "images" / "new.png", np.ones((SIDE, SIDE, 3)))
    (tmp_path / "images" / "5.png").unlink()
    capsys.readouterr()
    assert main(["gate", str(recipe)]) == 0, capsys.readouterr().err


def test_an_image_read_by_absolute_path_changed_makes_the_gate_say_stale(tmp_path, capsys) -> None:
    outside = png(tmp_path / "elsewhere" / "far.png", np.full((SIDE, SIDE, 3), 200))
    recipe = _project(tmp_path, count=4, cells=["0.png", "1.png", str(outside), "2.png", "3.png"])
    assert main(["sweep", str(recipe), "--no-track"]) == 0
    assert main(["gate", str(recipe)]) == 0
    png(outside, np.full((SIDE, SIDE, 3), 10))
    capsys.readouterr()
    assert main(["gate", str(recipe)]) == 2
    captured = capsys.readouterr()
    err = " ".join((captured.out + captured.err).split())
    assert f"stale results: {NAME} ({tmp_path / 'images'}) changed since the sweep" in err


def test_a_second_digest_of_an_unchanged_folder_of_200_images_reads_no_image(tmp_path, monkeypatch) -> None:
    recipe = load_recipe(_project(tmp_path, count=200))
    _settle(tmp_path / "images")
    monkeypatch.setattr(digests, "_BYTES", {})  # nothing remembered from other tests
    opened: list[str] = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if str(file).startswith(str(tmp_path / "images")):
            opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    first = input_digests(recipe)[NAME]
    assert len(opened) == 200
    opened.clear()
    assert input_digests(recipe)[NAME] == first and opened == []
    png(tmp_path / "images" / "7.png", np.zeros((SIDE, SIDE, 3)))  # one file rewritten: only it is read again
    opened.clear()
    assert input_digests(recipe)[NAME].sha256 != first.sha256 and opened == [str(tmp_path / "images" / "7.png")]
