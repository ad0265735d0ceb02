"""CLI: exit codes and one-line errors (no traceback) for bad input."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import typer
import yaml

from qbench.cli.app import main
from qbench.errors import QbenchError, RecipeError
from qbench.interrupt import Interrupted


def test_list_shows_registries(capsys):
    assert main(["list"]) == 0
    shown = capsys.readouterr().out
    assert "onnxruntime-cpu" in shown and "entropy" in shown and "fp8" in shown
    assert "tasks:       classification, embedding, multilabel, regression" in shown
    lines = {line.split()[1] + " " + line.split()[2]: line for line in shown.splitlines() if line.startswith("metric ")}
    assert "lower is better, in the data's units:" in lines["mae regression"]  # its default tolerances are relative
    assert "higher is better:" in lines["accuracy classification"]


def test_bad_recipe_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "m.onnx").write_bytes(b"x")
    (tmp_path / "d.csv").write_text("a\n1\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "x", "model": {"path": "m.onnx"}, "data": {"path": "d.csv", "inputs": {"a": "in"}},
        "variants": [{"name": "q", "precision": "int8", "calibrator": "entrpy"}],
    }))  # fmt: skip
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "r.yaml: variants[0].calibrator: got 'entrpy'" in " ".join(err.split())


def test_gate_without_results_exits_2(tmp_path, capsys):
    assert main(["gate", "--results", str(tmp_path / "none.json")]) == 2
    assert "results file not found" in capsys.readouterr().err


def test_usage_error_exits_2():
    assert main(["sweep"]) == 2


def test_console_script_returns_the_exit_code(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "qbench.cli", "gate", "--results", str(tmp_path / "none.json")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_an_unexpected_exception_is_one_line_exit_2(monkeypatch, capsys):
    import qbench.techniques

    def broken() -> list[str]:
        raise RuntimeError("calibrators\nregistry broken")

    monkeypatch.setattr(qbench.techniques.TECHNIQUES, "names", broken)
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["qbench: error: RuntimeError: calibrators registry broken"]


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (lambda text: RuntimeError(text), "qbench: error: RuntimeError: "),
        (lambda text: QbenchError(text), "error: "),
        (lambda text: RecipeError("r.yaml", "model.path", text), "error: r.yaml: model.path: "),
    ],
)
def test_a_long_error_is_printed_whole_on_one_line(monkeypatch, capsys, error, shown):
    """The end of a message is usually the fix (export in eval mode, use --no-track): it is never cut."""
    import qbench.techniques

    text = " ".join(f"/a/long/path/number-{i}/model.onnx" for i in range(60)) + "; export the model in eval mode"

    def broken() -> list[str]:
        raise error(text.replace("number-3/", "number-3/\n"))

    monkeypatch.setattr(qbench.techniques.TECHNIQUES, "names", broken)
    assert main(["list"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [shown + text.replace("number-3/", "number-3/ ")]


def test_debug_shows_the_traceback_of_an_unexpected_exception(monkeypatch, capsys):
    import qbench.techniques

    def broken() -> list[str]:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(qbench.techniques.TECHNIQUES, "names", broken)
    assert main(["list", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "broken" in err and "qbench: error: ZeroDivisionError: boom" in err


@pytest.mark.parametrize("args", [["gate", "--results", "none.json"], ["sweep"]], ids=["error", "usage-error"])
def test_an_error_that_cannot_be_printed_is_still_exit_2(monkeypatch, tmp_path, args):
    """A usage error whose stderr was closed exited 1, a breach's code: printing it raised (rich's SystemExit(1) on a
    broken pipe, here an I/O error of the terminal) from inside main's handler, and Python ended with status 1."""
    from typer._click.exceptions import UsageError  # typer's own copy of click, which raises its usage errors

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("qbench.cli.app.err_console.print", broken)
    monkeypatch.setattr(UsageError, "show", broken)
    assert main(args) == 2


def test_a_command_never_returns_an_exit_code_outside_the_contract(monkeypatch):
    monkeypatch.setattr("qbench.interrupt.run_process_group", lambda command: 1)  # the MLflow UI failed
    monkeypatch.setattr("qbench.recipe.spec.load_recipe", lambda path: None)
    monkeypatch.setattr("qbench.track.store.resolve_tracking_uri", lambda recipe: "sqlite:///x.db")
    assert main(["ui", "recipe.yaml"]) == 2


@pytest.mark.parametrize(
    "escape",
    [typer.Exit(1), SystemExit(1), Interrupted(signal.SIGTERM)],
    ids=["typer-exit-1", "system-exit-1", "interrupted"],
)
def test_only_the_gates_verdict_exits_1(monkeypatch, capsys, escape):
    """1 is the breach code: an exit with status 1 from inside a command (typer hands an Exit's code back as the
    command's result; a library's sys.exit(1), Ray's included) or an interruption that escaped the sweep's
    handling (a BaseException, which Python itself would end with status 1) is an error, 2."""
    import qbench.techniques

    def escaping() -> list[str]:
        raise escape

    monkeypatch.setattr(qbench.techniques.TECHNIQUES, "names", escaping)
    assert main(["list"]) == 2
    assert "qbench: error:" in capsys.readouterr().err


def _double_zipmap_project(tmp_path):
    """skl2onnx's LogisticRegression with a double input: its ZipMap takes tensor(double), which ONNX Runtime
    refuses at load; the recipe and data are valid."""
    import numpy as np
    import pandas as pd
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import DoubleTensorType
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 4)), np.arange(60) % 3
    model = convert_sklearn(LogisticRegression(max_iter=300).fit(x, y),
                            initial_types=[("x", DoubleTensorType([None, 4]))],
                            target_opset=17)  # fmt: skip
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    pd.DataFrame({"x": list(x), "y": y}).to_parquet(tmp_path / "d.parquet")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "double", "task": "classification", "model": {"path": "m.onnx"},
        "data": {"path": "d.parquet", "inputs": {"x": "x"}, "label": "y"},
        "variants": [{"name": "h", "precision": "fp16"}],
        "latency": {"batch_sizes": [1], "iterations": 3, "warmup": 1},
    }))  # fmt: skip
    return recipe


def test_validate_help_says_it_runs_the_reference(capsys):
    """`qbench validate --help` said it ran nothing, where it loads FP32 on every backend and scores a few rows."""
    assert main(["validate", "--help"]) == 0
    said = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "FP32 runs a few rows on each backend; no variant is built" in said


def test_no_paragraph_of_a_commands_help_keeps_the_sources_line_breaks():
    """`qbench gate --help` printed "...; with" / "GITHUB_STEP_SUMMARY" / "set, also ..." on three lines: typer kept the
    docstring's breaks after the first paragraph. Every command's help is now a paragraph per line for the screen to
    wrap."""
    import typer

    from qbench.cli.app import app

    helps: dict[str, str] = {}

    def walk(command, path: str) -> None:
        helps[path] = command.help or ""
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "qbench")
    assert len(helps) >= 12 and all(helps.values()), helps  # the commands and groups, each with a help
    broken = [path for path, text in helps.items() if any("\n" in part for part in text.split("\n\n"))]
    assert not broken, broken


def test_validate_runs_the_reference_so_a_model_the_runtime_refuses_fails_before_the_sweep(tmp_path, capsys):
    recipe = _double_zipmap_project(tmp_path)
    assert main(["validate", str(recipe)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"model.path: {tmp_path / 'm.onnx'}: the FP32 reference does not load on onnxruntime-cpu:" in err
    assert "ZipMap" in err and "Traceback" not in err


def test_a_sweep_without_gate_whose_measurements_failed_exits_2_and_keeps_the_results(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = _double_zipmap_project(tmp_path)
    import qbench.preflight.prepare
    import qbench.sweep.runner

    # a model the preflight loaded that fails once measured (the preflight refuses this one: qbench.preflight.load,
    # and so does the sweep's dry run before any build: tests/sweep/test_reference_batches.py)
    monkeypatch.setattr(qbench.preflight.prepare, "check_reference_loads", lambda *args: None)
    monkeypatch.setattr(qbench.sweep.runner, "_check_reference_runs", lambda prepared: None)
    assert main(["sweep", str(recipe), "--no-track"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error: 2 of 2 measurements failed (fp32@onnxruntime-cpu, h@onnxruntime-cpu); fp32@onnxruntime-cpu:" in err
    assert len(list((tmp_path / "reports" / "double").glob("*/results.json"))) == 1  # nothing written is lost
