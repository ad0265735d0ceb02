"""A sweep whose process dies inside a job (a native library's segmentation fault): the `qbench` command says so
in one line and exits 2, keeps what finished, and `--resume` records that job failed instead of crashing again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from probe_project import VARIANTS, probe_calls, write_probe_recipe

from qbench.errors import QbenchError
from qbench.execute.records import JOBS_FOLDER, PLAN_FILE, RESUMES, read_records
from qbench.results.schema import SweepResults, read_results
from qbench.runs import INCOMPLETE_MARKER, new_run_dir
from qbench.supervisor import DIED_FILE
from qbench.sweep.runner import run_sweep

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


def test_a_crash_in_a_job_goes_on_with_the_other_jobs_and_fails_closed(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int]
) -> None:
    """The sweep's process dying in a job (a native library's segmentation fault) ended the command there: exit 2 and
    a line asking for `qbench sweep --resume`, the variants after it never measured. The `qbench` command now resumes
    the run itself: the job is recorded failed with its signal, every other one measured, and the gate fails closed."""
    _, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    # fp16's measure job's first call (after the dry run and fp32), once
    (tmp_path / "segv_at").write_text(str(2 * per_job + 1))

    swept = qbench("sweep", str(recipe), "--no-track", "--gate", cwd=tmp_path)
    assert swept.returncode == 2, swept.stderr
    crashed, resumed = sorted((tmp_path / "reports" / "tumour-mlp").glob("2*"))
    assert (f"qbench: the `qbench sweep` process died running {FP16}: segmentation fault (SIGSEGV) inside a native "
            f"library (the Python stack at that moment is above); going on with the other jobs: `--resume` of "
            f"{crashed} records it failed (--stop-on-crash stops here instead)") in swept.stderr.splitlines()
    assert "agreement_probe" in swept.stderr  # faulthandler: the Python stack where it died
    assert len(set(probe_calls(tmp_path))) == 2  # the crashed process, then the one that resumed it
    results = results_of(swept)
    assert f"results: {resumed / 'results.json'}" in swept.stderr.splitlines()
    status = {v.key: (v.status, v.error) for v in results.variants}
    assert status["fp32@onnxruntime-cpu"] == ("ok", None) and status["int8-minmax@onnxruntime-cpu"] == ("ok", None)
    assert status["fp16@onnxruntime-cpu"] == ("failed", "the sweep's process died while running it: segmentation "
                                                        "fault (SIGSEGV) inside a native library")  # fmt: skip
    assert "gate: FAIL (results unusable) — 1 of 2 variants cannot be judged: fp16@onnxruntime-cpu" in swept.stdout
    last = swept.stderr.strip().splitlines()[-1]
    assert last.startswith(f"qbench: error: the sweep went on after its process died in {FP16} (segmentation fault"), last

    gate = qbench("gate", str(recipe), cwd=tmp_path)
    assert gate.returncode == 2 and "UNUSABLE fp16@onnxruntime-cpu: variant failed: the sweep's process died" in \
        gate.stdout, gate.stdout + gate.stderr
    again = qbench("sweep", str(recipe), "--no-track", "--resume", cwd=tmp_path)
    assert again.returncode == 2 and "resuming it would change nothing" in again.stderr, again.stderr
    before = len(probe_calls(tmp_path))
    rerun = qbench("sweep", str(recipe), "--no-track", "--resume", "--rerun-failed", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr  # the crash happened once: run again, fp16 is measured
    assert len(probe_calls(tmp_path)) - before == 2 * per_job  # the dry run, fp16: nothing else ran again
    assert {v.key: v.status for v in results_of(rerun).variants}["fp16@onnxruntime-cpu"] == "ok"


def test_the_resume_after_a_crash_takes_up_the_crashed_run_though_another_sweep_of_the_recipe_wrote_a_newer_one(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int]
) -> None:
    """Another sweep of the same recipe ran meanwhile (a second CI job on the runner) and wrote a newer run of the plan,
    interrupted where the crashed one was; the `qbench` command's resume after the crash took up "the newest resumable
    run", that one, not the crashed sweep's, whose death it had recorded. It now takes up the crashed run."""
    _, per_job = local_figures
    assert per_job >= 2  # the crash below is inside fp16's measure job, after its first call
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    first = 2 * per_job + 1  # fp16's measure job's first call (after the dry run and fp32)
    (tmp_path / "hold_after").write_text(str(first - 1))  # held there while the other sweep's run is written
    (tmp_path / "segv_at").write_text(str(first + 1))  # then its next call dies, once
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"}
    swept = subprocess.Popen([sys.executable, "-m", "qbench.cli", "sweep", str(recipe), "--no-track"], cwd=tmp_path,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while len(probe_calls(tmp_path)) < first and swept.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(probe_calls(tmp_path)) == first, swept.communicate(timeout=60)
        (crashed,) = (tmp_path / "reports" / "tumour-mlp").glob("2*")
        # the other sweep's run, as far as it got (the same jobs), started later; its process ends with the crashed one
        other = new_run_dir(crashed.parent, recipe)
        shutil.copy(crashed / PLAN_FILE, other / PLAN_FILE)
        shutil.copytree(crashed / JOBS_FOLDER, other / JOBS_FOLDER)
        marker = json.loads((other / INCOMPLETE_MARKER).read_text())
        marker["pid"] = json.loads((crashed / INCOMPLETE_MARKER).read_text())["pid"]
        (other / INCOMPLETE_MARKER).write_text(json.dumps(marker))
    finally:
        (tmp_path / "hold_after").unlink()
        stdout, stderr = swept.communicate(timeout=300)
    assert swept.returncode == 2, stderr
    resumed = Path(next(line for line in stderr.splitlines() if line.startswith("results: ")).split()[1]).parent
    assert json.loads((resumed / PLAN_FILE).read_text())[RESUMES] == crashed.name
    status = {v.key: (v.status, v.error) for v in read_results(resumed / "results.json").variants}
    assert status["fp16@onnxruntime-cpu"] == ("failed", "the sweep's process died while running it: segmentation "
                                                        "fault (SIGSEGV) inside a native library"), stdout  # fmt: skip
    with pytest.raises(QbenchError, match="--resume-run applies with --resume: it names the run folder"):
        run_sweep(recipe, track=False, resume_run=crashed)


def test_a_crash_in_each_of_two_jobs_goes_on_twice_and_a_rerun_of_failed_jobs_keeps_one_that_died(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int]
) -> None:
    """Each crash is one line and one resume; with --rerun-failed, the resume after a crash runs again the jobs that
    failed before the command, never one that died during it (it would die again, for ever)."""
    _, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    # fp16's first call, then int8-minmax's in the resume (after its dry run), then fp16's in the --rerun-failed below
    (tmp_path / "segv_at").write_text(f"{2 * per_job + 1} {3 * per_job + 2} {5 * per_job + 3}")

    swept = qbench("sweep", str(recipe), "--no-track", cwd=tmp_path)
    assert swept.returncode == 2, swept.stderr
    going_on = [line for line in swept.stderr.splitlines() if "going on with the other jobs" in line]
    assert [line.split(" process died running ")[1].split(":")[0:2] for line in going_on] == [
        ["measure", "fp16@onnxruntime-cpu"], ["measure", "int8-minmax@onnxruntime-cpu"]]
    assert {v.key: v.status for v in results_of(swept).variants} == {
        "fp32@onnxruntime-cpu": "ok", "fp16@onnxruntime-cpu": "failed", "int8-minmax@onnxruntime-cpu": "failed"}

    rerun = qbench("sweep", str(recipe), "--no-track", "--resume", "--rerun-failed", cwd=tmp_path)
    assert rerun.returncode == 2, rerun.stderr
    (going_on,) = [line for line in rerun.stderr.splitlines() if "going on with the other jobs" in line]
    assert f"died running {FP16}: segmentation fault" in going_on
    status = {v.key: (v.status, v.error) for v in results_of(rerun).variants}
    assert status["int8-minmax@onnxruntime-cpu"] == ("ok", None)  # failed before the command: run again
    assert status["fp16@onnxruntime-cpu"][0] == "failed" and "segmentation fault" in str(status["fp16@onnxruntime-cpu"])
    # after that crash, the resume's dry run and int8-minmax's measurement: fp16 did not run a third time
    assert len(probe_calls(tmp_path)) == 7 * per_job + 3


def test_with_stop_on_crash_a_crash_in_a_job_is_one_line_and_resume_records_that_job_failed(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int]
) -> None:
    _, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    # fp16's measure job's first call (after the dry run and fp32), once
    (tmp_path / "segv_at").write_text(str(2 * per_job + 1))

    crashed = qbench("sweep", str(recipe), "--no-track", "--stop-on-crash", cwd=tmp_path)
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
