"""A run folder's job records read back for a resume: damaged ones left out (and named), and which
interrupted run a resume takes."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qbench.errors import QbenchError
from qbench.execute.records import (
    JOBS_FOLDER,
    PLAN_FILE,
    RECORD_DIGEST,
    read_records,
    record_build,
    record_measure,
    record_started,
    resumable_run,
)
from qbench.execute.resume import resume_target
from qbench.results.evidence import RECORDED
from qbench.results.schema import VariantResult, canonical_sha256
from qbench.runs import INCOMPLETE_MARKER, RESULTS_FILE, new_run_dir

REFERENCE = "measure:fp32@onnxruntime-cpu"


def _run(root: Path, fingerprint: str = "plan-a") -> Path:
    run = new_run_dir(root)
    (run / PLAN_FILE).write_text(json.dumps({"fingerprint": fingerprint, "jobs": []}))
    return run


def _reference(run: Path) -> Path:
    """Record FP32's measurement with its outputs; returns the outputs file."""
    result = VariantResult("fp32", "onnxruntime-cpu", "fp32", "ok")
    record_measure(run, REFERENCE, 1, result, {"logits": np.arange(12, dtype=np.float32).reshape(4, 3)})
    (outputs,) = (run / JOBS_FOLDER).glob("*.npz")
    return outputs


@pytest.mark.parametrize("damage", ["truncated", "emptied", "deleted"])
def test_a_damaged_reference_outputs_file_leaves_its_record_out_with_a_warning(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    run = _run(tmp_path)
    record_build(run, "build:fp32", 1, {"files": {}}, None)
    outputs = _reference(run)
    assert read_records(run)[REFERENCE].outputs is not None
    if damage == "deleted":
        outputs.unlink()
    else:
        outputs.write_bytes(outputs.read_bytes()[: len(outputs.read_bytes()) // 2 if damage == "truncated" else 0])
    with caplog.at_level(logging.WARNING, logger="qbench"):
        records = read_records(run)
    assert set(records) == {"build:fp32"}  # the reference is measured again; the build is still reused
    assert f"job record {run / JOBS_FOLDER / (REFERENCE.replace(':', '_') + '.json')}" in caplog.text
    assert str(outputs) in caplog.text and "its job runs again" in caplog.text


def test_a_truncated_record_is_named_and_left_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = _run(tmp_path)
    record_build(run, "build:fp32", 1, {"files": {}}, None)
    record = run / JOBS_FOLDER / "build_fp32.json"
    record.write_text(record.read_text()[:20])
    with caplog.at_level(logging.WARNING, logger="qbench"):
        assert read_records(run) == {}
    assert f"job record {record} cannot be read back" in caplog.text


def test_resume_takes_the_newest_run_with_a_finished_job_over_a_newer_empty_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with_results = _run(tmp_path)
    _reference(with_results)
    empty = _run(tmp_path)  # interrupted (again) before any job finished
    _run(tmp_path, fingerprint="plan-b")  # another plan, with a finished job: never taken
    record_build(_run(tmp_path, fingerprint="plan-b"), "build:fp32", 1, {"files": {}}, None)
    with caplog.at_level(logging.INFO, logger="qbench"):
        run = resumable_run(tmp_path, "plan-a")
    assert run is not None and run.path == with_results
    assert f"interrupted run {empty} has the same plan but no finished job" in caplog.text
    newer = _run(tmp_path)
    record_build(newer, "build:fp32", 1, {"files": {}}, None)
    assert resumable_run(tmp_path, "plan-a").path == newer  # type: ignore[union-attr]


def test_no_run_with_a_finished_job_is_nothing_to_resume(tmp_path: Path) -> None:
    _run(tmp_path)
    assert resumable_run(tmp_path, "plan-a") is None


def test_a_record_edited_after_it_was_written_is_left_out_and_its_job_runs_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """--resume carried an edited measurement (a better accuracy typed in) into the resumed results; the same for
    reference outputs swapped for other numbers of the same shape."""
    run = _run(tmp_path)
    outputs = _reference(run)
    record_build(run, "build:fp16", 1, {"files": {}}, None)
    record = run / JOBS_FOLDER / "build_fp16.json"
    edited = json.loads(record.read_text())
    edited["error"] = "a failure nobody saw"
    record.write_text(json.dumps(edited))
    np.savez(outputs, logits=np.zeros((4, 3), dtype=np.float32))
    with caplog.at_level(logging.WARNING, logger="qbench"):
        assert read_records(run) == {}
    assert "does not match its digest" in caplog.text and f"{outputs} changed after it was written" in caplog.text


@pytest.mark.skipif(os.name != "posix", reason="a folder is synced on POSIX only")
def test_a_job_s_mark_as_started_is_not_synced_and_its_record_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mark is read after the sweep's process died, whose writes the kernel keeps: its two syncs (file, folder)
    were a wait before every job. The record a resume reuses must outlive a power loss: synced, file and folder."""
    run = _run(tmp_path)
    synced: list[str] = []

    def record(handle: int) -> None:
        synced.append("folder" if os.path.samestat(os.fstat(handle), os.stat(run / JOBS_FOLDER)) else "file")

    monkeypatch.setattr(os, "fsync", record)
    record_started(run, "build:fp32", 1)
    assert synced == [] and read_records(run)["build:fp32"].died is not None  # read back as the job it died in
    record_build(run, "build:fp32", 1, {"files": {}}, None)
    assert synced == ["file", "folder"]


def test_a_run_whose_sweep_still_runs_on_this_host_is_not_taken_up(tmp_path: Path) -> None:
    """`qbench sweep --resume` started while another sweep of the same plan still ran (a CI retry) took that run up
    and recorded the job it was measuring as failed, `the sweep's process died while running it`: a live run is not
    interrupted. An earlier interrupted run is taken instead; once its sweep is gone the run is taken up."""
    interrupted = _run(tmp_path)
    record_build(interrupted, "build:fp32", 1, {"files": {}}, None)
    running = _run(tmp_path)
    record_build(running, "build:fp32", 1, {"files": {}}, None)
    record_started(running, REFERENCE, 1)  # being measured now
    sweep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        marker = running / INCOMPLETE_MARKER
        marker.write_text(json.dumps({**json.loads(marker.read_text()), "pid": sweep.pid}))
        assert resumable_run(tmp_path, "plan-a").path == interrupted  # type: ignore[union-attr]
    finally:
        sweep.kill()
        sweep.wait()
    assert resumable_run(tmp_path, "plan-a").path == running  # type: ignore[union-attr]
    assert "the sweep's process died while running it" in (read_records(running)[REFERENCE].died or "")



def test_a_resume_after_a_crash_takes_up_the_crashed_run_whatever_newer_runs_of_the_plan_there_are(
    tmp_path: Path,
) -> None:
    """Another sweep of the same recipe (a second CI job on the runner, a second terminal) wrote newer runs of the plan
    while one crashed: the supervising process's `--resume` took up the newest of them, or refused as a finished
    one's 'would change nothing', not the crashed run. Named (`crashed`), the crashed run is taken up; a run of
    another plan is refused, naming it."""
    crashed = _run(tmp_path)
    _reference(crashed)
    record_started(crashed, "measure:fp16@onnxruntime-cpu", 1)  # its process died running it
    newer = _run(tmp_path)
    record_build(newer, "build:fp32", 1, {"files": {}}, None)
    assert resume_target(tmp_path, "plan-a") == newer  # `--resume` alone: the newest
    assert resume_target(tmp_path, "plan-a", crashed=crashed) == crashed
    finished = _run(tmp_path)
    (finished / INCOMPLETE_MARKER).unlink()
    (finished / RESULTS_FILE).write_text(json.dumps({"complete": True}))
    with pytest.raises(QbenchError, match="resuming it would change nothing"):
        resume_target(tmp_path, "plan-a")
    assert resume_target(tmp_path, "plan-a", crashed=crashed) == crashed
    other_plan = _run(tmp_path, fingerprint="plan-b")
    record_build(other_plan, "build:fp32", 1, {"files": {}}, None)
    with pytest.raises(QbenchError, match=f"cannot resume the crashed sweep's run {other_plan}: expected a run folder"):
        resume_target(tmp_path, "plan-a", crashed=other_plan)


def _rewritten(path: Path, drop: tuple[str, ...] = (), **fields: object) -> None:
    """The record without `drop`, with `fields` set, its digest made anew (as a qbench writing so would have)."""
    raw = {key: value for key, value in json.loads(path.read_text()).items() if key not in (RECORD_DIGEST, *drop)}
    raw |= fields
    path.write_text(json.dumps({**raw, RECORD_DIGEST: canonical_sha256(raw)}))


def test_a_measurement_record_names_the_evidence_its_qbench_records_and_an_older_ones_names_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A record kept no trace of which figures its qbench recorded: a resume could not tell an older one's."""
    run = _run(tmp_path)
    _reference(run)
    path = run / JOBS_FOLDER / "measure_fp32@onnxruntime-cpu.json"
    assert json.loads(path.read_text())["evidence"] == list(RECORDED)
    assert read_records(run)[REFERENCE].evidence == RECORDED
    _rewritten(path, drop=("evidence",))  # an older qbench's record
    assert read_records(run)[REFERENCE].evidence == ()
    _rewritten(path, evidence=["output_spread", "spread_by_token"])  # a kind this qbench does not know
    with caplog.at_level(logging.WARNING, logger="qbench"):
        assert read_records(run) == {}
    assert "unknown 'spread_by_token'" in caplog.text and "its job runs again" in caplog.text
