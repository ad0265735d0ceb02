"""A resume after an edit to a module of the user's project that the recipe's code imports (a custom metric's
helper): the jobs measured before the edit were reused with the old code's figures beside the new code's, and the
resumed run recorded the new code's digests, so `qbench gate` judged the mix as fresh. Now `--plan` and `--resume`
say which module changed, and every measurement made with the old code runs again."""

from __future__ import annotations

import logging
import secrets
import sys
from pathlib import Path

import pytest
import yaml
from probe_project import probe_calls, write_probe_recipe

from qbench.cli.app import main
from qbench.digests import file_sha256
from qbench.execute.resume import code_changes
from qbench.provenance import PROJECT_MODULE_INPUT
from qbench.recipe.spec import load_recipe
from qbench.results.schema import read_results
from qbench.sweep.runner import run_sweep

HELPER_BEFORE = '''\
import numpy as np


def figure(outputs, labels):
    return float(np.mean(np.argmax(outputs, axis=1) == labels))
'''
HELPER_AFTER = "def figure(outputs, labels):\n    return 0.125\n"


def _with_helper_metric(recipe: Path) -> tuple[str, str]:
    """Add a gated metric whose module calls a helper module of the project, beside `recipe`; (metric, helper)
    module names, fresh for each test (no module cached by another is reused)."""
    token = secrets.token_hex(4)
    metric, helper = f"scored_{token}", f"helper_{token}"
    (recipe.parent / f"{helper}.py").write_text(HELPER_BEFORE)
    (recipe.parent / f"{metric}.py").write_text(f"from {helper} import figure\n\n\ndef scored(outputs, labels):\n"
                                                "    return figure(outputs, labels)\n")  # fmt: skip
    raw = yaml.safe_load(recipe.read_text())
    raw["metrics"].append({"name": "scored", "function": f"{metric}:scored", "higher_is_better": True})
    raw["gate"] = {"metric": "scored", "max_drop": 0.05, "max_slice_drop": 0.05, "applies_to": ["*"]}
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    return metric, helper


def _forget(*modules: str) -> None:
    """Drop `modules` from this process, as a new `qbench` process would not have them: the resume imports them anew."""
    for name in modules:
        sys.modules.pop(name, None)


def test_a_measurement_made_before_a_helper_module_was_edited_is_measured_again_and_the_gate_judges_new_figures(
    user_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    recipe = write_probe_recipe(user_project, tmp_path, variants=["fp16"])
    metric, helper = _with_helper_metric(recipe)
    assert main(["validate", str(recipe)]) == 0
    per_job = len(probe_calls(tmp_path))  # a dry run scores as one measure job does
    # calls so far: validate's dry run; then the sweep's dry run, FP32's measurement and FP16's, which runs out of
    # memory
    (tmp_path / "fail_at").write_text(f"{3 * per_job + 1} MemoryError")
    try:
        failed = run_sweep(recipe, track=False)
        assert failed.results.find("fp16", "onnxruntime-cpu").status == "failed"  # a finished run --resume takes up
        assert failed.results.find("fp32", "onnxruntime-cpu").accuracy.overall.metrics["scored"] != 0.125

        (tmp_path / f"{helper}.py").write_text(HELPER_AFTER)  # the fix made between the run and its resume
        _forget(metric, helper)
        change = f"python module {helper} changed"
        capsys.readouterr()
        assert main(["sweep", str(recipe), "--plan"]) == 0
        shown = capsys.readouterr().out
        rows = {line.split()[0]: " ".join(line.split()) for line in shown.splitlines() if line.startswith("measure:")}
        assert set(rows) == {"measure:fp32@onnxruntime-cpu", "measure:fp16@onnxruntime-cpu"}
        assert all(" re-run measured in " in row and change in row for row in rows.values())
        assert f"{change}: 2 measurements run again" in shown.splitlines()

        caplog.set_level(logging.INFO, logger="qbench")
        outcome = run_sweep(recipe, track=False, resume=True)
        assert f"resuming: {change}: 2 measurements run again" in caplog.text
        assert not any(note.startswith("resumed") for v in outcome.results.variants for note in v.notes)
        results = read_results(outcome.results_path)
        scored = {(v.key, s.name): s.metrics["scored"] for v in results.variants
                  for s in (v.accuracy.overall, *v.accuracy.slices)}  # fmt: skip
        assert len(scored) > 2 and set(scored.values()) == {0.125}  # every figure the new code's
        capsys.readouterr()
        assert main(["gate", str(recipe)]) == 0  # no drop between figures of one code (old fp32 vs new fp16: 1)
    finally:
        _forget(metric, helper)


def test_a_run_whose_project_modules_are_unchanged_is_reused_whole(
    user_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check names no change where there is none: a finished run with a measurement failed for a reason outside
    the variant, its helper untouched, reuses FP32's measurement."""
    recipe = write_probe_recipe(user_project, tmp_path, variants=["fp16"])
    metric, helper = _with_helper_metric(recipe)
    assert main(["validate", str(recipe)]) == 0
    per_job = len(probe_calls(tmp_path))
    (tmp_path / "fail_at").write_text(f"{3 * per_job + 1} MemoryError")  # FP16's measurement, as above
    try:
        run_sweep(recipe, track=False)
        _forget(metric, helper)
        capsys.readouterr()
        assert main(["sweep", str(recipe), "--plan"]) == 0
        rows = {line.split()[0]: " ".join(line.split()) for line in capsys.readouterr().out.splitlines()
                if line.startswith("measure:")}  # fmt: skip
        assert " reuse finished in " in rows["measure:fp32@onnxruntime-cpu"]
        assert " re-run failed in " in rows["measure:fp16@onnxruntime-cpu"]
        assert not any("python module" in row for row in rows.values())
    finally:
        _forget(metric, helper)


def test_code_changes_name_each_recorded_module_edited_or_gone_and_a_run_that_recorded_none(
    user_project: Path, tmp_path: Path
) -> None:
    recipe_file = write_probe_recipe(user_project, tmp_path, variants=["fp16"])
    _, helper = _with_helper_metric(recipe_file)
    recipe = load_recipe(recipe_file)
    name = f"{PROJECT_MODULE_INPUT}{helper}"
    recorded = {name: file_sha256(tmp_path / f"{helper}.py")}
    assert code_changes(recorded, recipe) == ()
    (tmp_path / f"{helper}.py").write_text(HELPER_AFTER)
    assert code_changes(recorded, recipe) == (f"python module {helper} changed",)
    (tmp_path / f"{helper}.py").unlink()
    assert code_changes(recorded, recipe) == (f"python module {helper} no longer found",)
    assert code_changes(None, recipe) == ("the project modules its code imported not recorded (an older qbench)",)
