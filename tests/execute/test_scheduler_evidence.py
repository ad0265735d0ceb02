"""A sweep resumed from a run an older qbench (of the same version: a checkout updated between the interrupt and the
resume) interrupted: its records lack figures today's gate checks (each scope's spread and kept). They were reused,
and the results, which claim every kind of evidence (qbench.results.evidence), passed the checks on them unapplied.
Now a record names the kinds its qbench records, and one lacking any is measured again: `--plan` and `--resume` say
which, and the gate judges results whose every variant carries what they claim."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from probe_project import VARIANTS, figures, probe_calls, write_probe_recipe

from qbench.cli.app import main
from qbench.errors import QbenchError
from qbench.execute.records import JOBS_FOLDER, RECORD_DIGEST
from qbench.results.schema import canonical_sha256
from qbench.sweep.runner import run_sweep


def _as_an_older_qbench_wrote_it(record_path: Path) -> None:
    """The record of a qbench that recorded neither each scope's spread nor its kept (nor named them in `evidence`),
    its digest made anew (as that qbench wrote it: it is read back)."""
    record = json.loads(record_path.read_text())
    record.pop(RECORD_DIGEST)
    record["evidence"] = [name for name in record["evidence"] if name not in ("output_spread", "kept")]
    accuracy = record["result"]["accuracy"]
    for scope in [accuracy["overall"], *accuracy["slices"]]:
        assert scope.pop("spread") and "kept" in scope  # the figures today's records hold
        scope.pop("kept")
    record_path.write_text(json.dumps({**record, RECORD_DIGEST: canonical_sha256(record)}))


def test_a_record_of_a_qbench_that_recorded_less_evidence_is_measured_again(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int], capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    expected, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    (tmp_path / "interrupt_at").write_text(str(3 * per_job + 1))  # int8-minmax's first call: fp32, fp16 recorded
    with pytest.raises(QbenchError, match="interrupted by SIGINT"):
        run_sweep(recipe, track=False)
    (interrupted,) = (tmp_path / "reports" / "tumour-mlp").glob("2*")
    _as_an_older_qbench_wrote_it(interrupted / JOBS_FOLDER / "measure_fp16@onnxruntime-cpu.json")
    before = len(probe_calls(tmp_path))

    capsys.readouterr()
    assert main(["sweep", str(recipe), "--plan"]) == 0
    shown = capsys.readouterr().out
    row = next(" ".join(line.split()) for line in shown.splitlines() if line.startswith("measure:fp16@"))
    assert f" re-run measured in {interrupted.name} by a qbench that recorded no output_spread, kept" in row
    summary = "evidence output_spread, kept not recorded (an older qbench): 1 measurement run again"
    assert summary in shown.splitlines()

    caplog.set_level(logging.INFO, logger="qbench")
    outcome = run_sweep(recipe, track=False, resume=True)
    assert len(probe_calls(tmp_path)) - before == 3 * per_job  # the dry run, fp16 measured again, int8-minmax
    assert f"resuming: {summary}" in caplog.text
    fp32, fp16, _ = outcome.results.variants
    assert any(note.startswith("resumed") for note in fp32.notes)  # a record of today's qbench: reused
    assert not any(note.startswith("resumed") for note in fp16.notes)
    assert fp16.accuracy is not None and fp16.accuracy.overall.spread and fp16.accuracy.overall.kept
    assert figures(outcome.results) == expected
    assert main(["gate", str(recipe)]) == 0  # every variant carries the figures its results claim, and passes
