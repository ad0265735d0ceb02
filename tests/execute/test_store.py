"""The build store: digests recorded at publish and checked on reuse, copies (never links) into run folders,
and publishing that two concurrent publishers of one key cannot mix (a tiny ONNX model with external data,
built here)."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qbench.execute.store import BuildStore, built_from_manifest, manifest_of
from qbench.variants.base import BuiltVariant

FACTS = {"onnxruntime": "1.0", "machine": "x86_64"}  # what the builds here were made with (plan.build_facts)

KEY = "k" * 16


def _build(folder: Path, seed: int) -> dict[str, Any]:
    """A linear 4 -> 3 model in `folder` (weights in model.onnx.data beside it) and its manifest."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(seed).normal(size=(4, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"])],
        f"linear{seed}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(weights, "w")],
    )
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph), folder / "model.onnx", save_as_external_data=True,
              location="model.onnx.data", size_threshold=0)  # fmt: skip
    built = BuiltVariant(name="int8", precision="int8", onnx_path=folder / "model.onnx")
    return manifest_of(built, folder, FACTS, reusable=True)


@pytest.fixture
def published(tmp_path: Path) -> tuple[BuildStore, dict[str, Any]]:
    store = BuildStore(str(tmp_path / "store"))
    return store, store.publish(KEY, tmp_path / "build", _build(tmp_path / "build", seed=0))


def test_a_published_build_records_the_sha256_of_every_file(published: tuple[BuildStore, dict[str, Any]]) -> None:
    store, manifest = published
    assert set(manifest["files"]) == {"model.onnx", "model.onnx.data"}
    assert all(len(digest) == 64 for digest in manifest["files"].values())
    assert store.reusable(KEY, FACTS) == manifest


@pytest.mark.parametrize("name", ["model.onnx", "model.onnx.data"])
@pytest.mark.parametrize("damage", ["truncated", "swapped", "deleted"])
def test_a_stored_file_changed_since_publishing_is_never_reused(
    published: tuple[BuildStore, dict[str, Any]], tmp_path: Path, name: str, damage: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    store, _ = published
    path = tmp_path / "store" / KEY / name
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-1])
    elif damage == "swapped":  # another build's file of the same size, in its place
        other = _build(tmp_path / "other", seed=1)
        assert other["files"][name] != store.manifest(KEY)["files"][name]  # type: ignore[index]
        path.write_bytes((tmp_path / "other" / name).read_bytes())
    else:
        path.unlink()
    with caplog.at_level(logging.WARNING, logger="qbench"):
        assert store.reusable(KEY, FACTS) is None
    assert f"build store: {path} " in caplog.text and "that build is not reused" in caplog.text



@pytest.mark.parametrize(("field", "was", "flipped"), [("name", '"int8"', '"int9"'), ("params", "{}", '{"a": 1}')])
def test_a_manifest_changed_since_publishing_is_never_reused(
    published: tuple[BuildStore, dict[str, Any]], tmp_path: Path, field: str, was: str, flipped: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A manifest whose text changed and is still valid JSON (one bit: '8' -> '9'; an edit) was reused as it read:
    the BuiltVariant rebuilt from it carried another name or parameters than its build. Its own sha256 is checked."""
    store, built = published
    path = tmp_path / "store" / KEY / "manifest.json"
    text = path.read_text()
    assert f'"{field}": {was}' in text
    path.write_text(text.replace(f'"{field}": {was}', f'"{field}": {flipped}', 1))
    with caplog.at_level(logging.WARNING, logger="qbench"):
        assert store.reusable(KEY, FACTS) is None
    assert f"build store: {path} no longer has the sha256 it records of itself" in caplog.text
    assert store.publish(KEY, tmp_path / "build", built) == built  # a publish replaces it
    assert store.reusable(KEY, FACTS) == built


@pytest.mark.parametrize("name", ["model.onnx.data", "manifest.json"])
def test_a_damaged_entry_is_reported_in_one_line_by_a_sweep_that_checks_it_and_replaces_it(
    published: tuple[BuildStore, dict[str, Any]], tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A build that searches checks the stored entry before it searches and again as it publishes (BuildStore._kept):
    each check warned, so one damaged file was two identical lines. One line, and the entry is replaced."""
    store, built = published
    path = tmp_path / "store" / KEY / name
    damaged = path.read_bytes().replace(b'"name": "int8"', b'"name": "int9"') if name == "manifest.json" else b"x"
    path.write_bytes(damaged)
    with caplog.at_level(logging.WARNING, logger="qbench"):
        assert store.reusable(KEY, FACTS) is None
        assert store.publish(KEY, tmp_path / "build", built) == built
    assert [r.getMessage() for r in caplog.records] == [
        f"build store: {path} "
        f"{'no longer has the sha256 it records of itself' if name == 'manifest.json' else 'no longer has the sha256 its manifest records'} "
        "(changed since it was published): that build is not reused"
    ]
    assert store.reusable(KEY, FACTS) == built

def test_a_materialised_build_is_a_copy_independent_of_the_store(
    published: tuple[BuildStore, dict[str, Any]], tmp_path: Path
) -> None:
    store, manifest = published
    run_models = tmp_path / "run" / "models"
    store.materialise(KEY, manifest, run_models)
    built = built_from_manifest(manifest, run_models, tmp_path / "fp32.onnx")
    assert not built.borrowed  # the run's own copy
    for name in manifest["files"]:
        copy, stored = run_models / name, tmp_path / "store" / KEY / name
        assert copy.read_bytes() == stored.read_bytes()
        assert copy.stat().st_nlink == 1 and stored.stat().st_nlink == 1  # no hard link either way
    with built.onnx_path.open("r+b") as model:  # a run's model edited in place
        model.truncate(10)
    with (run_models / "model.onnx.data").open("r+b") as data:
        data.write(b"\xff" * 8)
    assert store.reusable(KEY, FACTS) == manifest  # the store's files are as published


@pytest.mark.parametrize("name", ["model.onnx", "model.onnx.data"])
def test_a_store_entry_changed_after_it_was_found_intact_is_never_copied_as_the_build(
    published: tuple[BuildStore, dict[str, Any]], tmp_path: Path, name: str
) -> None:  # fmt: skip
    """The reuse check ran when the sweep planned; the copy into the run folder comes later and copied whatever the
    entry held by then: another build's weights of the same size were measured as the variant. The copy is now
    checked against the manifest's sha256, and a copy that differs is removed and fails closed in one line."""
    from qbench.errors import QbenchError

    store, _ = published
    manifest = store.reusable(KEY, FACTS)
    assert manifest is not None
    _build(tmp_path / "other", seed=1)
    stored = tmp_path / "store" / KEY / name
    stored.write_bytes((tmp_path / "other" / name).read_bytes())
    run_models = tmp_path / "run" / "models"
    with pytest.raises(QbenchError) as raised:
        store.materialise(KEY, manifest, run_models)
    message = str(raised.value)
    assert "\n" not in message and str(stored) in message and "no longer has the sha256 its manifest records" in message
    assert not (run_models / name).exists()


def test_concurrent_publishers_of_one_key_leave_one_complete_entry(tmp_path: Path) -> None:
    """Eight builds of one key with different bytes (a build that is not bit-reproducible), published at once:
    the first entry stays, every publisher gets its manifest back, and no staging folder is left."""
    store = BuildStore(str(tmp_path / "store"))
    builds = [(tmp_path / f"build{i}", _build(tmp_path / f"build{i}", seed=i)) for i in range(8)]
    start = threading.Barrier(len(builds))

    def publish(build: tuple[Path, dict[str, Any]]) -> dict[str, Any]:
        start.wait()
        return store.publish(KEY, *build)

    with ThreadPoolExecutor(len(builds)) as pool:
        returned = list(pool.map(publish, builds))
    kept = store.reusable(KEY, FACTS)
    assert kept is not None and kept in [manifest for _, manifest in builds]
    assert all(manifest == kept for manifest in returned)
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == [KEY]
    assert sorted(p.name for p in (tmp_path / "store" / KEY).iterdir()) == ["manifest.json", "model.onnx",
                                                                          "model.onnx.data"]  # fmt: skip


def test_publishing_replaces_an_entry_that_is_damaged_or_from_another_environment(
    published: tuple[BuildStore, dict[str, Any]], tmp_path: Path
) -> None:
    store, _ = published
    (tmp_path / "store" / KEY / "model.onnx.data").write_bytes(b"")
    fresh = _build(tmp_path / "again", seed=2)
    assert store.publish(KEY, tmp_path / "again", fresh) == fresh
    assert store.reusable(KEY, FACTS) == fresh
    elsewhere = {**fresh, "environment": {**fresh["environment"], "onnxruntime": "0.0.1"}}
    assert store.publish(KEY, tmp_path / "again", elsewhere) == elsewhere  # the other environment's is not kept
    assert store.manifest(KEY) == elsewhere


def test_a_build_that_is_the_fp32_model_names_the_reading_sweeps_own_model(tmp_path: Path) -> None:
    """Two projects with the same model share FP32's build: each must read its own file, not the first one's."""
    from qbench.variants import BuiltVariant

    first, second = tmp_path / "a" / "model.onnx", tmp_path / "b" / "model.onnx"
    for path in (first, second):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"the same model")
    folder = tmp_path / "build"
    folder.mkdir()
    manifest = manifest_of(BuiltVariant("fp32", "fp32", first), folder, FACTS, reusable=True)
    assert manifest["files"] == {} and str(first) not in str(manifest)
    read_back = built_from_manifest(manifest, tmp_path / "run" / "models", second)
    assert read_back.onnx_path == second and read_back.borrowed  # the user's file: no step may move or delete it


def test_a_publish_removes_what_killed_publishers_left_and_keeps_what_running_ones_write(tmp_path: Path) -> None:
    import os
    import time

    from qbench.execute.store import ABANDONED_AFTER_S

    store = BuildStore(str(tmp_path / "store"))
    root = tmp_path / "store"
    old_staging, old_discarded = root / f".{KEY}.ab12.publishing", root / f".{KEY}.cd34.discarded"
    fresh = root / f".{KEY}.ef56.publishing"
    for folder in (old_staging, old_discarded, fresh):
        (folder / "model.onnx").parent.mkdir(parents=True)
        (folder / "model.onnx").write_bytes(b"partial")
    long_ago = time.time() - ABANDONED_AFTER_S - 60
    for folder in (old_staging, old_discarded):
        os.utime(folder, (long_ago, long_ago))
    store.publish("other" + KEY, tmp_path / "build", _build(tmp_path / "build", seed=1))
    assert not old_staging.exists() and not old_discarded.exists()
    assert fresh.is_dir()  # another publisher may be writing it now
    assert store.reusable("other" + KEY, FACTS) is not None


def test_a_store_refusing_writes_is_store_unwritable_and_a_refusal_elsewhere_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import shutil

    from qbench.execute.store import StoreUnwritable

    store = BuildStore(str(tmp_path / "store"))
    manifest = _build(tmp_path / "build", seed=0)
    refused_at: list[Path] = []

    def refuse(source: Path, target: Path, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(refused_at[0]))

    monkeypatch.setattr(shutil, "copyfile", refuse)
    refused_at.append(tmp_path / "store" / "entry")
    with pytest.raises(StoreUnwritable,
                       match=f"^cannot write to the build store {tmp_path / 'store'}: Permission denied;"):  # fmt: skip
        store.publish(KEY, tmp_path / "build", manifest)
    refused_at[0] = tmp_path / "build" / "model.onnx"  # the build's own file: not the store's fault
    with pytest.raises(PermissionError):
        store.publish(KEY, tmp_path / "build", manifest)
    assert list((tmp_path / "store").iterdir()) == []


def test_entries_are_readable_by_every_user_the_umask_allows(tmp_path: Path) -> None:
    """A shared store (one folder for a team's CI runners): an entry made from tempfile's 0700 staging folder could be
    read by its publisher alone; every other user's sweep rebuilt it and tried to replace it."""
    import os

    from qbench.digests import file_sha256
    from qbench.execute.snapshot import take_snapshot
    from qbench.provenance import InputDigest

    previous = os.umask(0o022)
    try:
        store = BuildStore(str(tmp_path / "store"))
        store.publish(KEY, tmp_path / "build", _build(tmp_path / "build", seed=0))
        data = tmp_path / "data.csv"
        data.write_text("x\n1\n")
        copy = take_snapshot({"data": InputDigest(str(data), file_sha256(data))}, store.sources_root).copies["data"]
    finally:
        os.umask(previous)
    assert (tmp_path / "store" / KEY).stat().st_mode & 0o777 == 0o755
    assert copy.parent.stat().st_mode & 0o777 == 0o755


def test_a_build_from_another_fp32_model_is_neither_kept_nor_reused(tmp_path: Path) -> None:
    """A PyTorch source's export changes with code its build key does not cover (a function in another file than the
    factory's): the key stays, the FP32 model differs. The store kept the first publisher's entry, so variants built
    from the old export were measured against the new one (FP16 0.3286 against FP32 0.3643, the gate failing a
    variant that matched FP32 exactly), and `--resume` reused them the same way."""
    store = BuildStore(str(tmp_path / "store"))
    old = _build(tmp_path / "old", seed=0) | {"reference": "a" * 64}
    store.publish(KEY, tmp_path / "old", old)
    assert store.reusable(KEY, FACTS, "a" * 64) == old
    assert store.reusable(KEY, FACTS, "b" * 64) is None
    new = _build(tmp_path / "new", seed=1) | {"reference": "b" * 64}
    assert store.publish(KEY, tmp_path / "new", new) == new  # replaced, not the old entry handed back
    assert store.reusable(KEY, FACTS, "b" * 64) == new
    same = _build(tmp_path / "same", seed=2) | {"reference": "b" * 64}
    assert store.publish(KEY, tmp_path / "same", same) == new  # the same FP32 model: the first entry is kept


def test_which_form_each_param_and_note_describes_survives_the_store(tmp_path: Path) -> None:
    """A builder's own torch module (QAT, ModelOpt) is carried beside a build read back from the store: the build's
    params and notes must still say which form they describe, or every backend would show them all."""
    from qbench.variants import BuiltVariant
    from qbench.variants.base import ONNX, TORCH

    folder = tmp_path / "build"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"a model")
    built = BuiltVariant("qat", "int8", folder / "model.onnx", params={"opset": 17, "fake_quant": True, "qat.lr": 0.1},
                         notes=("graph note", "module note", "both"), param_forms={"opset": ONNX, "fake_quant": TORCH},
                         note_forms={"graph note": ONNX, "module note": TORCH})  # fmt: skip
    read_back = built_from_manifest(manifest_of(built, folder, FACTS, reusable=False), folder, tmp_path)
    on_torch, on_onnx = read_back.as_run_in(TORCH), read_back.as_run_in(ONNX)
    assert on_torch.params == {"fake_quant": True, "qat.lr": 0.1} and on_torch.notes == ("module note", "both")
    assert on_onnx.params == {"opset": 17, "qat.lr": 0.1} and on_onnx.notes == ("graph note", "both")


def test_a_relative_cache_dir_serves_builds_that_run_in_a_scratch_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """QBENCH_CACHE_DIR=cache (relative): the store copies FP32's model there, and a SmoothQuant build, whose working
    directory is its scratch folder, loaded `cache/...` from inside it and failed (found by fuzzing random graphs)."""
    import yaml
    from tiny_linear import make_linear_project

    from qbench.sweep.runner import run_sweep

    recipe = make_linear_project(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")
    spec = yaml.safe_load(recipe.read_text())
    spec["variants"] = [{"name": "int8-sq", "precision": "int8", "calibrator": "minmax", "smoothquant": {"alpha": 0.5}}]
    recipe.write_text(yaml.safe_dump(spec, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QBENCH_CACHE_DIR", "cache")
    outcome = run_sweep(recipe, track=False)
    built = {v.variant: v for v in outcome.results.variants}
    assert built["int8-sq"].status == "ok", built["int8-sq"].error
    assert Path(built["fp32"].model_path).is_absolute()
