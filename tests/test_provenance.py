"""Input digests: every file a sweep reads, external ONNX data included; what changed, what is gone."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.digests import file_sha256
from qbench.errors import QbenchError
from qbench.modelinfo.signature import external_data_files
from qbench.provenance import (
    PROJECT_MODULE_INPUT,
    changed_inputs,
    input_digests,
    input_files,
    project_module_digests,
    recorded_module_files,
)
from qbench.recipe.spec import load_recipe


def write_model_with_external_data(folder: Path) -> Path:
    """y = x @ W with W (64 x 4) stored in weights.bin beside model.onnx."""
    weight = numpy_helper.from_array(np.arange(256, dtype=np.float32).reshape(64, 4), name="W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[weight],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_model_with_external_data(tmp_path)
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    (tmp_path / "calib.csv").write_text("a,b\n3,4\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "x", "model": {"path": "model.onnx"},
        "data": {"path": "data.csv", "inputs": {"a": "x"}, "calibration": {"path": "calib.csv"}},
    }))  # fmt: skip
    return recipe


def test_external_data_files_are_inputs_of_their_own(project: Path):
    assert external_data_files(project.parent / "model.onnx") == ["weights.bin"]
    files = input_files(load_recipe(project))
    assert files == {
        "model": project.parent / "model.onnx",
        "model external data weights.bin": project.parent / "weights.bin",
        "data": project.parent / "data.csv",
        "data.calibration": project.parent / "calib.csv",
    }
    digests = input_digests(load_recipe(project))
    assert digests["model external data weights.bin"].sha256 == file_sha256(project.parent / "weights.bin")


def test_a_change_to_external_weights_alone_is_named(project: Path):
    recorded = {name: {"path": d.path, "sha256": d.sha256} for name, d in input_digests(load_recipe(project)).items()}
    weights = project.parent / "weights.bin"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\x00\x00\x80\x7f")  # the last weight becomes inf
    assert changed_inputs(recorded).changed == ("model external data weights.bin",)
    current = input_files(load_recipe(project))
    assert changed_inputs(recorded, current).changed == ("model external data weights.bin",)
    before = load_recipe(project).fingerprint()
    (project.parent / "calib.csv").write_text("a,b\n5,6\n")
    assert load_recipe(project).fingerprint() != before


def test_gone_inputs_are_reported_missing_not_changed(project: Path):
    recorded = {name: {"path": d.path, "sha256": d.sha256} for name, d in input_digests(load_recipe(project)).items()}
    (project.parent / "calib.csv").unlink()
    check = changed_inputs(recorded)
    assert check.changed == () and check.missing == (f"data.calibration ({project.parent / 'calib.csv'})",)


def test_an_unparsable_model_is_an_input_without_external_data(tmp_path: Path):
    (tmp_path / "m.onnx").write_bytes(b"not onnx")
    (tmp_path / "d.csv").write_text("a\n1\n")
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"name": "x", "model": {"path": "m.onnx"},
                                                     "data": {"path": "d.csv", "inputs": {"a": "x"}}}))  # fmt: skip
    assert set(input_files(load_recipe(tmp_path / "r.yaml"))) == {"model", "data"}


def test_gone_external_data_is_missing_against_the_current_recipe(project: Path):
    """`qbench gate recipe.yaml` after the weights file moved: reported as gone, not a FileNotFoundError."""
    recipe = load_recipe(project)
    recorded = {name: {"path": d.path, "sha256": d.sha256} for name, d in input_digests(recipe).items()}
    (project.parent / "weights.bin").rename(project.parent / "moved.bin")
    check = changed_inputs(recorded, input_files(recipe))
    assert check.changed == ()
    assert check.missing == (f"model external data weights.bin ({project.parent / 'weights.bin'})",)
    with pytest.raises(QbenchError,
                       match=r"model\.path: ONNX model .*model\.onnx keeps its weights in 'weights\.bin', not found"):
        input_digests(recipe)


def test_a_settled_file_is_digested_once_and_a_fresh_one_every_time(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A file last modified long before it is read is digested once while its size and time stay the same; a file
    written moments ago is read again each time (its time stamp may not move on a same-size rewrite)."""
    import os

    import qbench.digests as digests_module

    reads: list[Path] = []
    real = digests_module._tree_sha256
    monkeypatch.setattr(digests_module, "_tree_sha256", lambda path, files: reads.append(path) or real(path, files))
    settled, fresh = tmp_path / "settled.bin", tmp_path / "fresh.bin"
    settled.write_bytes(b"a" * 64)
    old = settled.stat().st_mtime_ns - 60_000_000_000
    os.utime(settled, ns=(old, old))
    first = file_sha256(settled)
    assert file_sha256(settled) == first and reads.count(settled) == 1
    settled.write_bytes(b"b" * 64)  # a rewrite moves the time: digested again
    assert file_sha256(settled) != first and reads.count(settled) == 2

    fresh.write_bytes(b"a" * 64)
    before = fresh.stat().st_mtime_ns
    digest = file_sha256(fresh)
    fresh.write_bytes(b"b" * 64)
    os.utime(fresh, ns=(before, before))  # the same size and time stamp, as a coarse clock would leave them
    assert file_sha256(fresh) != digest and reads.count(fresh) == 2



def test_a_same_size_rewrite_whose_time_was_put_back_is_digested_again(tmp_path: Path) -> None:
    """A settled file rewritten in place with other bytes of the same size, its modification time then put back
    (`touch -r`, `cp -p`, `rsync -t`), kept its remembered digest: a second sweep in the same process (a notebook's
    run_sweep, a Ray worker) took a damaged input copy or store file for the one it had checked. The change time,
    which nothing sets back, is part of what the digest is remembered by."""
    import hashlib
    import os

    from qbench.digests import bytes_sha256

    path = tmp_path / "model.onnx"
    path.write_bytes(b"a" * 64)
    old = path.stat().st_mtime_ns - 60_000_000_000
    os.utime(path, ns=(old, old))  # settled: its digest is remembered
    first, first_bytes = file_sha256(path), bytes_sha256(path)
    with path.open("r+b") as handle:  # in place: the same inode and size
        handle.write(b"b")
    os.utime(path, ns=(old, old))  # the modification time put back
    assert path.stat().st_size == 64 and path.stat().st_mtime_ns == old
    assert file_sha256(path) != first
    assert bytes_sha256(path) != first_bytes
    assert bytes_sha256(path) == hashlib.sha256(b"b" + b"a" * 63).hexdigest()

def test_a_models_size_counts_its_external_data_files(tmp_path: Path) -> None:
    """The FP32 MiniLM-sized case in small: model.onnx holds a few hundred bytes, weights.bin the 1 KB of weights."""
    import os

    from qbench.provenance import model_bytes

    path = write_model_with_external_data(tmp_path)
    weights = tmp_path / "weights.bin"
    assert weights.stat().st_size == 64 * 4 * 4
    assert model_bytes(path) == path.stat().st_size + weights.stat().st_size
    old = path.stat().st_mtime_ns - 60_000_000_000
    os.utime(path, ns=(old, old))  # settled: its external-data files are remembered
    assert model_bytes(path) == path.stat().st_size + weights.stat().st_size
    onnx.save_model(onnx.load(str(path)), str(path))  # the weights inside the model file now: found again
    assert model_bytes(path) == path.stat().st_size > 64 * 4 * 4


def _with_metric(project: Path) -> Path:
    """`project` with a custom metric whose module imports a helper module beside it."""
    (project.parent / "pv_metric.py").write_text("from pv_helper import score\n\n\ndef f(outputs, labels):\n"
                                                 "    return score(outputs, labels)\n")  # fmt: skip
    (project.parent / "pv_helper.py").write_text("def score(outputs, labels):\n    return 0.0\n")
    recipe = yaml.safe_load(project.read_text())
    recipe["metrics"] = [{"name": "mine", "function": "pv_metric:f", "higher_is_better": True}]
    project.write_text(yaml.safe_dump(recipe))
    return project


@pytest.fixture
def metric_project(project: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(project.parent))
    monkeypatch.delitem(sys.modules, "pv_metric", raising=False)
    monkeypatch.delitem(sys.modules, "pv_helper", raising=False)
    return _with_metric(project)


def test_the_modules_a_recipes_code_imported_are_digested_and_none_for_a_recipe_naming_no_code(metric_project: Path) -> None:
    import importlib

    recipe = load_recipe(metric_project)
    importlib.import_module("pv_metric")
    digests = project_module_digests(recipe)
    assert {name: entry.sha256 for name, entry in digests.items()} == {  # the metric's module is `metrics[0] source`
        f"{PROJECT_MODULE_INPUT}pv_helper": file_sha256(metric_project.parent / "pv_helper.py"),
    }
    assert recorded_module_files(digests, recipe) == {name: Path(entry.path) for name, entry in digests.items()}
    without_code = yaml.safe_load(metric_project.read_text())
    del without_code["metrics"]
    metric_project.write_text(yaml.safe_dump(without_code))
    assert project_module_digests(load_recipe(metric_project)) == {}


def test_a_module_edited_after_the_sweep_imported_it_is_refused_naming_its_file(metric_project: Path) -> None:
    """Its digest would name code the sweep does not run."""
    import importlib

    recipe = load_recipe(metric_project)
    importlib.import_module("pv_metric")
    project_module_digests(recipe)  # seen as imported
    helper = metric_project.parent / "pv_helper.py"
    helper.write_text(helper.read_text() + "EDITED = True\n")
    with pytest.raises(QbenchError, match=f"{helper.resolve()} changed after this process imported it"):
        project_module_digests(recipe)
