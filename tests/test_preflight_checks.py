"""Checks run by validate and at the start of a sweep: plan, destinations, batch memory (hand-computed bytes)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from qbench.errors import RecipeError
from qbench.modelinfo import TensorMeta
from qbench.preflight_checks import check_batch_memory, check_destinations, check_plan, check_whole_batches, fixed_batch
from qbench.recipe import load_recipe


def _recipe(tmp_path: Path, **changes: object):
    (tmp_path / "model.onnx").write_bytes(b"model")
    (tmp_path / "rows.parquet").write_bytes(b"rows")
    body = {
        "name": "toy",
        "model": {"path": "model.onnx"},
        "data": {"path": "rows.parquet", "inputs": {"x": "input"}},
        "variants": [{"name": "half", "precision": "fp16"}],
        "latency": {"batch_sizes": [1, 32]},
        **changes,
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(body))
    return load_recipe(tmp_path / "recipe.yaml")


def test_batch_memory_compares_bytes_per_row_times_batch_with_what_is_available(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, latency={"batch_sizes": [1, 32]})
    feeds = {"input": np.zeros((10, 4, 4), np.float32), "mask": np.zeros((10, 16), np.int64)}  # 64 + 128 bytes/row
    largest = 192 * 64  # the default evaluation batch size (64) is the largest batch here
    check_batch_memory(recipe, feeds, available=largest)
    with pytest.raises(RecipeError) as caught:
        check_batch_memory(recipe, feeds, available=largest - 1)
    assert "data.evaluation.batch_size: a batch of 64 rows needs" in str(caught.value)
    assert "(192 bytes per row)" in str(caught.value)


def test_destinations_accept_a_folder_still_to_be_made_and_resolve_against_the_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = _recipe(tmp_path, output_dir="out/deeper", tracking={"uri": "sqlite:///mlflow.db"})
    monkeypatch.chdir(tmp_path.parent)
    assert recipe.output_path == (tmp_path / "out" / "deeper").resolve()
    assert recipe.tracking_uri == f"sqlite:///{(tmp_path / 'mlflow.db').resolve().as_posix()}"
    check_destinations(recipe, track=True)
    assert not (tmp_path / "out").exists()  # validate creates nothing


def test_an_unwritable_store_is_ignored_without_tracking(tmp_path: Path) -> None:
    (tmp_path / "db").mkdir()
    recipe = _recipe(tmp_path, tracking={"uri": "sqlite:///db"})
    check_destinations(recipe, track=False)
    with pytest.raises(RecipeError, match=r"tracking\.uri: the sqlite database .*db is a folder"):
        check_destinations(recipe, track=True)


def test_a_glob_matching_one_variant_is_enough(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recipe = _recipe(tmp_path, gate={"applies_to": ["half", "int8-*"]})
    check_plan(recipe)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "gate.applies_to: 'int8-*' matches no variant")
    ]


def _inputs(**shapes: tuple[int | None, ...]) -> dict[str, TensorMeta]:
    return {name: TensorMeta(name, np.dtype(np.float32), shape) for name, shape in shapes.items()}


def test_a_fixed_batch_model_takes_that_batch_size_everywhere(tmp_path: Path) -> None:
    """An export without a dynamic batch axis: every batch-size field of the recipe is named in one message."""
    assert fixed_batch(_recipe(tmp_path), _inputs(input=(None, 4), mask=(None, 16))) is None
    ones = {"batch_size": 1}
    fitting = _recipe(tmp_path, latency={"batch_sizes": [1]},
                      data={"path": "rows.parquet", "inputs": {"x": "input"}, "evaluation": ones, "calibration": ones})  # fmt: skip
    assert fixed_batch(fitting, _inputs(input=(1, 4))) == 1
    with pytest.raises(RecipeError) as caught:
        fixed_batch(_recipe(tmp_path), _inputs(input=(1, 4)))
    message = str(caught.value)
    assert "latency.batch_sizes[1]: model input 'input' has a fixed batch dimension of 1 (shape [1, 4])" in message
    assert "latency.batch_sizes[1] (now 32), data.evaluation.batch_size (now 64), data.calibration.batch_size (now 16)" in message
    assert "latency.batch_sizes[0]" not in message  # 1 already fits
    with pytest.raises(RecipeError, match="fix different batch sizes"):
        fixed_batch(fitting, _inputs(input=(1, 4), mask=(2, 16)))


def test_a_fixed_batch_above_one_needs_whole_batches(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    check_whole_batches(recipe, "data.evaluation.limit", 12, 4)
    check_whole_batches(recipe, "data.evaluation.limit", 13, None)
    with pytest.raises(RecipeError) as caught:
        check_whole_batches(recipe, "data.evaluation.limit", 13, 4)
    assert "data.evaluation.limit: 13 rows do not split into whole batches of 4" in str(caught.value)
    assert "(set data.evaluation.limit to 12)" in str(caught.value)


@pytest.mark.parametrize("store", ["blocked/builds", "blocked"])
def test_a_build_store_that_cannot_be_a_writable_folder_is_a_preflight_error(tmp_path: Path, store: str) -> None:
    recipe = _recipe(tmp_path, executor={"store": store})
    check_destinations(recipe, track=False)  # a folder still to be made is fine
    (tmp_path / "blocked").write_text("a file")
    with pytest.raises(RecipeError) as caught:
        check_destinations(recipe, track=False)
    assert f"executor.store: {tmp_path / 'blocked'}" in str(caught.value)
    assert str(caught.value).endswith("expected a writable folder for built variants")


def test_the_default_build_store_is_checked_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cache").write_text("a file where qbench's cache should be")
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(RecipeError, match=r"executor\.store: .*cache \(in the path of .*builds\) is a file; expected a writable folder for "
                       r"built variants \(the default, in qbench's cache: set executor\.store or \$QBENCH_CACHE_DIR\)"):
        check_destinations(_recipe(tmp_path), track=False)
    check_destinations(_recipe(tmp_path, executor={"store": "s3://bucket/builds"}), track=False)  # checked when used


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="permissions do not bind root")
def test_a_read_only_build_store_is_a_preflight_error(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store").chmod(0o555)
    try:
        with pytest.raises(RecipeError, match=r"executor\.store: folder .*store is not writable; expected a writable"):
            check_destinations(_recipe(tmp_path, executor={"store": "store"}), track=False)
    finally:
        (tmp_path / "store").chmod(0o755)
