"""A sweep whose process dies inside a job (a native library's segmentation fault): the `qbench` command says so
in one line and exits 2, keeps what finished, and `--resume` records that job failed instead of crashing again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from probe_project import VARIANTS, probe_calls, write_probe_recipe

from qbench.execute.records import JOBS_FOLDER, read_records
from qbench.results import SweepResults, read_results

REPO = Path(__file__).resolve().parents[2]
FP16 = "measure:fp16@onnxruntime-cpu"


def qbench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "qbench.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def results_of(done: subprocess.CompletedProcess[str]) -> SweepResults:
    """The results a sweep wrote, from its `results: <path>` line."""
    line = next(line for line in done.stderr.splitlines() if line.startswith("results: "))
    return read_results(Path(line.removeprefix("results: ").strip()))


def test_a_crash_in_a_job_is_one_line_and_resume_records_that_job_failed(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int]
) -> None:
    _, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    (tmp_path / "segv_at").write_text(str(2 * per_job + 1))  # fp16's measure job's first call (after the dry run and fp32), once

    crashed = qbench("sweep", str(recipe), "--no-track", cwd=tmp_path)
    assert crashed.returncode == 2, crashed.stderr
    (run,) = (tmp_path / "reports" / "tumour-mlp").glob("2*")
    last = crashed.stderr.strip().splitlines()[-1]
    assert last.startswith("qbench: error: the `qbench sweep` process died: segmentation fault (SIGSEGV)"), last
    assert f"results so far stay in {run}" in last and "`qbench sweep --resume` goes on" in last
    assert "Traceback (most recent call last)" not in crashed.stderr
    assert "agreement_probe" in crashed.stderr  # faulthandler: the Python stack where it died
    records = read_records(run)
    assert records["measure:fp32@onnxruntime-cpu"].result.status == "ok"  # what finished is kept
    assert records[FP16].died == "the sweep's process died while running it: segmentation fault (SIGSEGV) inside " \
                                 "a native library"

    plan = qbench("sweep", str(recipe), "--plan", cwd=tmp_path)
    fp16_row = next(line for line in plan.stdout.splitlines() if line.startswith(FP16))
    assert "reuse" in fp16_row and "died while running it" in fp16_row

    before = len(probe_calls(tmp_path))
    resumed = qbench("sweep", str(recipe), "--no-track", "--resume", "--gate", cwd=tmp_path)
    assert len(probe_calls(tmp_path)) - before == 2 * per_job  # the dry run, int8-minmax: fp16 was not run again
    assert resumed.returncode == 2, resumed.stderr  # a failed variant: the gate fails closed
    status = {v.key: (v.status, v.error) for v in results_of(resumed).variants}
    assert status["fp16@onnxruntime-cpu"][0] == "failed"
    assert "died while running it: segmentation fault" in str(status["fp16@onnxruntime-cpu"][1])
    assert status["int8-minmax@onnxruntime-cpu"][0] == "ok"

    rerun = qbench("sweep", str(recipe), "--no-track", "--resume", "--rerun-failed", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr  # the crash happened once: run again, fp16 is measured
    assert {v.key: v.status for v in results_of(rerun).variants}["fp16@onnxruntime-cpu"] == "ok"


def test_an_interrupted_job_is_not_taken_for_one_the_process_died_in(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int]
) -> None:
    _, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    (tmp_path / "interrupt_at").write_text(str(2 * per_job + 1))
    interrupted = qbench("sweep", str(recipe), "--no-track", cwd=tmp_path)
    assert interrupted.returncode == 2 and "interrupted by SIGINT" in interrupted.stderr.strip().splitlines()[-1]
    (run,) = (tmp_path / "reports" / "tumour-mlp").glob("2*")
    assert not list((run / JOBS_FOLDER).glob("*.started")) and FP16 not in read_records(run)
    assert json.loads((run / "INCOMPLETE").read_text())["state"].startswith("interrupted")
