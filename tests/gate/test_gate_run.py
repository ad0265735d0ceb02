"""`qbench gate` on a run folder handed over: a CI job sweeps and uploads reports/ as an artifact, a later job on
another machine downloads it into a checkout at another path. The results record each variant's model by the path
it had on the sweeping machine; the gate's check that the run folder's model is still the one measured looked
there (gone: no check, exit 0 on an edited model) and the export refused the model as missing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import numpy_helper
from tiny_linear import make_linear_project

from qbench.cli.app import main
from qbench.export.triton import export_triton
from qbench.recipe.spec import load_recipe
from qbench.runs import new_run_dir


def test_a_run_folder_moved_with_its_checkout_is_judged_and_exported_from_where_it_is_now(
    tmp_path: Path, capsys
) -> None:
    swept_in, gated_in = tmp_path / "runner-a" / "work", tmp_path / "runner-b" / "checkout"
    swept_in.mkdir(parents=True)
    recipe = make_linear_project(swept_in, f"sqlite:///{(swept_in / 'mlflow.db').as_posix()}")
    raw = yaml.safe_load(recipe.read_text())
    raw["output_dir"] = "reports"  # as a checked-in recipe names it: relative, so it follows the checkout
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["sweep", str(recipe), "--no-track"]) == 0
    gated_in.parent.mkdir()
    shutil.move(swept_in, gated_in)  # the sweeping machine's paths are gone
    [results_path] = (gated_in / "reports").glob("linear/*/results.json")
    [recorded] = [v["model_path"] for v in json.loads(results_path.read_text())["variants"] if v["variant"] == "fp16"]
    moved = results_path.parent / "models" / Path(recorded).name
    assert not Path(recorded).exists() and moved.is_file()

    assert main(["gate", str(gated_in / "linear.yaml")]) == 0
    export = export_triton(load_recipe(gated_in / "linear.yaml"), "fp16", "onnxruntime-cpu", tmp_path / "repo")
    assert export.model_path.read_bytes() == moved.read_bytes()

    edited = bytearray(moved.read_bytes())
    edited[-8] ^= 0xFF  # a weight byte: same size, another model
    moved.write_bytes(bytes(edited))
    capsys.readouterr()
    assert main(["gate", str(gated_in / "linear.yaml")]) == 2
    assert f"the model file {moved} is not the model measured" in capsys.readouterr().out


def test_two_checkouts_sharing_an_output_folder_each_judge_their_own_run(tmp_path: Path, capsys) -> None:
    """Two CI jobs at once on one runner, each in its own checkout, their recipe writing to one absolute output_dir:
    each job's `qbench gate` took the newest run in the folder, the other job's. Job A's was refused as stale (its
    own model 'changed since the sweep', exit 2) though its own fresh run lay beside it, and it tagged job B's MLflow
    run with that verdict; a sweep of B still running refused A's gate ('wait for it')."""
    shared = tmp_path / "runner" / "reports"
    checkouts = []
    for job, shift in (("job-a", 0.0), ("job-b", 0.5)):
        root = tmp_path / job
        root.mkdir()
        recipe = make_linear_project(root, f"sqlite:///{(root / 'mlflow.db').as_posix()}")
        raw = yaml.safe_load(recipe.read_text())
        raw["output_dir"] = str(shared)
        recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
        model = onnx.load(str(root / "linear.onnx"))
        model.graph.initializer[1].CopyFrom(numpy_helper.from_array(  # B's model: another bias
            numpy_helper.to_array(model.graph.initializer[1]) + np.float32(shift), "b"))  # fmt: skip
        onnx.save(model, str(root / "linear.onnx"))
        checkouts.append(recipe)
    job_a, job_b = checkouts
    assert main(["sweep", str(job_a), "--no-track"]) == 0
    assert main(["sweep", str(job_b), "--no-track"]) == 0  # the newest run in the shared folder: B's
    capsys.readouterr()
    assert main(["gate", str(job_a)]) == 0
    assert "stale" not in capsys.readouterr().out
    assert main(["gate", str(job_b)]) == 0

    new_run_dir(shared / "linear", job_b)  # B sweeps again: its run is in progress
    assert main(["gate", str(job_a)]) == 0
    assert main(["gate", str(job_b)]) == 2  # B's own newest run is incomplete: never a fall back to an older one

    for results in (shared / "linear").glob("*/results.json"):
        if json.loads(results.read_text())["recipe"]["path"] == str(job_a):
            shutil.rmtree(results.parent)
    capsys.readouterr()
    assert main(["gate", str(job_a)]) == 2  # A has no run of its own there
    shown = " ".join(capsys.readouterr().err.split())
    assert f"no results of {job_a} under {shared / 'linear'}: the runs there were swept by other checkouts" in shown
    assert str(job_b) in shown


def test_one_gate_run_reads_the_models_signature_once(tmp_path: Path, monkeypatch) -> None:
    """The gate asks the model's signature for the batch sizes timed and for the slices' input types; each read runs
    onnx's shape inference on a dynamic-batch model (0.2 s of a 4,000-node graph), and it read it once for each. A
    second gate run reads the file again: no read is kept past the run that made it."""
    from qbench.modelinfo import signature

    recipe = make_linear_project(tmp_path, f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}")
    assert main(["sweep", str(recipe), "--no-track"]) == 0
    reads: list[Path] = []
    read = signature.read_model_info

    def counted(path: Path) -> signature.ModelInfo:
        reads.append(path)
        return read(path)

    monkeypatch.setattr(signature, "read_model_info", counted)
    assert main(["gate", str(recipe)]) == 0
    assert reads == [tmp_path / "linear.onnx"]
    assert main(["gate", str(recipe)]) == 0
    assert reads == [tmp_path / "linear.onnx"] * 2
