"""A sweep resumed with another runtime or on another kind of machine: the measurements made with the old one were
reused beside new ones, in one table and against an FP32 reference measured with something else. Now `--plan` and
`--resume` say what differs, and those measurements run again."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from probe_project import VARIANTS, figures, probe_calls, write_probe_recipe

import qbench.environment as environment
from qbench.cli.app import main
from qbench.errors import QbenchError
from qbench.sweep.runner import run_sweep


def test_a_measurement_made_on_another_kind_of_cpu_is_measured_again_and_the_resume_says_so(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int], capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    expected, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    (tmp_path / "interrupt_at").write_text(str(2 * per_job + 1))  # fp16's first call: fp32's measurement is recorded
    with pytest.raises(QbenchError, match="interrupted by SIGINT"):
        run_sweep(recipe, track=False)
    before = len(probe_calls(tmp_path))
    old_cpu = environment._cpu_model()
    monkeypatch.setattr(environment, "_cpu_model", lambda: "Another CPU model")  # a CI runner of another type
    change = f"CPU {old_cpu} -> Another CPU model"

    capsys.readouterr()
    assert main(["sweep", str(recipe), "--plan"]) == 0
    shown = capsys.readouterr().out
    row = next(" ".join(line.split()) for line in shown.splitlines() if line.startswith("measure:fp32@"))
    assert " re-run measured in " in row and change in row
    assert f"{change}: 1 measurement run again" in shown.splitlines()

    caplog.set_level(logging.INFO, logger="qbench")
    outcome = run_sweep(recipe, track=False, resume=True)
    assert len(probe_calls(tmp_path)) - before == 4 * per_job  # the dry run; fp32 measured again with the others
    assert not any(note.startswith("resumed") for v in outcome.results.variants for note in v.notes)
    assert f"resuming: {change}: 1 measurement run again" in caplog.text
    assert {v.latency.machine["cpu"] for v in outcome.results.variants} == {"Another CPU model"}
    assert figures(outcome.results) == expected
