"""A sweep whose process dies inside a job (a native library's segmentation fault): the `qbench` command says so
in one line and exits 2, keeps what finished, and `--resume` records that job failed instead of crashing again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from probe_project import VARIANTS, probe_calls, write_probe_recipe

from qbench.execute.records import JOBS_FOLDER, read_records
from qbench.results.schema import SweepResults, read_results
from qbench.supervisor import DIED_FILE

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


def test_a_job_killed_with_the_whole_process_tree_runs_again_on_resume(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int]
) -> None:
    """A cancelled CI job (or a runner gone) kills the `qbench` process and the sweep's process together (SIGKILL):
    nothing records how, and the job then running is no cause. It was recorded failed, `how is not known`, so the
    resumed sweep measured nothing of it and exited 2; now `--resume` runs it again and the gate judges complete
    results."""
    _, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    (tmp_path / "kill_tree_at").write_text(str(2 * per_job + 1))  # fp16's measure job's first call

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with (tmp_path / "sweep.log").open("w") as log:
        parent = subprocess.Popen([sys.executable, "-m", "qbench.cli", "sweep", str(recipe), "--no-track"],
                                  cwd=tmp_path, env=env, stdout=log, stderr=log)  # fmt: skip
        try:
            deadline = time.monotonic() + 240
            while not (tmp_path / "tree_stopped").exists() and parent.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert (tmp_path / "tree_stopped").exists(), (tmp_path / "sweep.log").read_text()
            while _running_child(parent.pid) and time.monotonic() < deadline:  # the sweep's process kills itself
                time.sleep(0.05)
        finally:
            parent.kill()  # stopped: it recorded nothing of its child's end
            parent.wait(timeout=60)
    (run,) = (tmp_path / "reports" / "tumour-mlp").glob("2*")
    assert [p.name for p in (run / JOBS_FOLDER).glob("*.started")] == [f"{FP16.replace(':', '_')}.started"]
    assert not (run / DIED_FILE).exists()
    records = read_records(run)
    assert records["measure:fp32@onnxruntime-cpu"].result.status == "ok" and FP16 not in records

    gate = qbench("gate", str(recipe), cwd=tmp_path)
    assert gate.returncode == 2 and "is incomplete (killed: its sweep" in gate.stderr, gate.stderr

    before = len(probe_calls(tmp_path))
    resumed = qbench("sweep", str(recipe), "--no-track", "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{FP16} was running in {run} when the sweep's process was ended from outside" in resumed.stderr
    assert len(probe_calls(tmp_path)) - before == 3 * per_job  # the dry run, fp16 again, int8-minmax
    assert {v.key: v.status for v in results_of(resumed).variants} == {
        "fp32@onnxruntime-cpu": "ok", "fp16@onnxruntime-cpu": "ok", "int8-minmax@onnxruntime-cpu": "ok"}
    assert qbench("gate", str(recipe), cwd=tmp_path).returncode == 0


def _running_child(parent: int) -> bool:
    """Whether `parent` has a child that is still running (a zombie left unreaped by a stopped parent has ended)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            return True
    return False
