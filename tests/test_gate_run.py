"""`qbench gate` on a run folder handed over: a CI job sweeps and uploads reports/ as an artifact, a later job on
another machine downloads it into a checkout at another path. The results record each variant's model by the path
it had on the sweeping machine; the gate's check that the run folder's model is still the one measured looked
there (gone: no check, exit 0 on an edited model) and the export refused the model as missing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from tiny_linear import make_linear_project

from qbench.cli_app import main
from qbench.export.triton import export_triton
from qbench.recipe import load_recipe


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
