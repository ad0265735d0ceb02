"""CLI: exit codes and one-line errors (no traceback) for bad input."""

from __future__ import annotations

import subprocess
import sys

import yaml

from qbench.cli import main


def test_list_shows_registries(capsys):
    assert main(["list"]) == 0
    shown = capsys.readouterr().out
    assert "onnxruntime-cpu" in shown and "entropy" in shown and "fp8" in shown
    assert "tasks:       classification, embedding, multilabel, regression" in shown


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


def test_debug_shows_the_traceback_of_an_unexpected_exception(monkeypatch, capsys):
    import qbench.techniques

    def broken() -> list[str]:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(qbench.techniques.TECHNIQUES, "names", broken)
    assert main(["list", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "broken" in err and "qbench: error: ZeroDivisionError: boom" in err


def test_a_command_never_returns_an_exit_code_outside_the_contract(monkeypatch):
    monkeypatch.setattr("qbench.interrupt.run_process_group", lambda command: 1)  # the MLflow UI failed
    monkeypatch.setattr("qbench.recipe.load_recipe", lambda path: None)
    monkeypatch.setattr("qbench.track.resolve_tracking_uri", lambda recipe: "sqlite:///x.db")
    assert main(["ui", "recipe.yaml"]) == 2
