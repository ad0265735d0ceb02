"""The driver with the local executor: job records, an interrupted sweep resumed without measuring twice,
nothing stale reused, and `qbench sweep --plan`."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from probe_project import VARIANTS, figures, probe_calls, write_probe_recipe

import qbench.sweep.runner as sweep_module
from qbench.cli.app import main
from qbench.errors import QbenchError
from qbench.execute.executors import JobDone, LocalExecutor
from qbench.execute.records import JOBS_FOLDER, PLAN_FILE
from qbench.results.schema import read_results
from qbench.runs import INCOMPLETE_MARKER
from qbench.sweep.runner import run_sweep


def test_a_sweep_records_its_plan_and_every_finished_job(user_project: Path, tmp_path: Path) -> None:
    outcome = run_sweep(write_probe_recipe(user_project, tmp_path, variants=["fp16"]), track=False)
    plan = json.loads((outcome.run_dir / PLAN_FILE).read_text())
    ids = [job["id"] for job in plan["jobs"]]
    assert ids == ["build:fp32", "measure:fp32@onnxruntime-cpu", "build:fp16", "measure:fp16@onnxruntime-cpu"]
    records = {p.name for p in (outcome.run_dir / JOBS_FOLDER).iterdir()}
    assert records == {f"{i.replace(':', '_')}.json" for i in ids} | {"measure_fp32@onnxruntime-cpu.outputs.npz"}
    fp16 = json.loads((outcome.run_dir / JOBS_FOLDER / "measure_fp16@onnxruntime-cpu.json").read_text())
    assert fp16["attempts"] == 1 and fp16["result"]["status"] == "ok"
    times = fp16["times"]  # when it was handed to the executor, ran, and was recorded
    assert times["submitted"] <= times["started"] < times["ended"] <= times["recorded"]
    assert fp16["result"]["accuracy"] == json.loads(outcome.results_path.read_text())["variants"][1]["accuracy"]
    # the build is kept by content; the run folder holds a copy of its files, not links into the store
    assert (outcome.run_dir / "models" / "fp16.onnx").stat().st_nlink == 1
    key = plan["jobs"][2]["build_key"]
    assert (tmp_path / "store" / key / "manifest.json").is_file()


def test_an_interrupted_sweep_resumes_without_measuring_a_finished_job_twice(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int], caplog: pytest.LogCaptureFixture
) -> None:
    expected, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    (tmp_path / "interrupt_at").write_text(str(2 * per_job + 1))  # after the dry run and fp32: fp16's first call
    with pytest.raises(QbenchError, match="interrupted by SIGINT"):
        run_sweep(recipe, track=False)
    (interrupted,) = (tmp_path / "reports" / "tumour-mlp").glob("2*")
    assert (interrupted / INCOMPLETE_MARKER).is_file()
    before = len(probe_calls(tmp_path))
    caplog.clear()
    caplog.set_level(logging.INFO, logger="qbench")

    outcome = run_sweep(recipe, track=False, resume=True)
    shown = caplog.text
    resumed_calls = len(probe_calls(tmp_path)) - before
    print(f"fresh: {4 * per_job} probe calls; interrupted: {before}; resumed: {resumed_calls}")
    assert resumed_calls == 3 * per_job  # the dry run, fp16 and int8-minmax: fp32's measurement was reused
    assert "resuming: 3 of 6 jobs reused" in " ".join(shown.split())  # fp32's and fp16's builds, fp32's measurement
    assert figures(outcome.results) == expected  # the same figures as one uninterrupted sweep
    fp32, fp16, _ = outcome.results.variants
    assert any(note.startswith(f"resumed: measured by the interrupted run {interrupted.name}") for note in fp32.notes)
    assert not any(note.startswith("resumed") for note in fp16.notes)
    assert read_results(outcome.results_path).complete
    assert main(["gate", str(recipe)]) == 0  # the resumed run is complete and judged


def test_a_resumed_runs_results_name_its_own_model_files_not_the_interrupted_runs(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int]
) -> None:
    """The interrupted run may be deleted once resumed: the results (and a Triton export) must not need it."""
    _, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    (tmp_path / "interrupt_at").write_text(str(3 * per_job + 1))  # the dry run, fp32 and fp16 measured, int8-minmax not
    with pytest.raises(QbenchError, match="interrupted by SIGINT"):
        run_sweep(recipe, track=False)
    (interrupted,) = (tmp_path / "reports" / "tumour-mlp").glob("2*")
    outcome = run_sweep(recipe, track=False, resume=True)
    fp16 = outcome.results.find("fp16", "onnxruntime-cpu")
    assert any(note.startswith("resumed") for note in fp16.notes)
    named = [p for v in outcome.results.variants for p in (v.model_path, v.evaluated_model_path) if p is not None]
    assert fp16.evaluated_model_path is not None and Path(fp16.evaluated_model_path).parent == outcome.run_dir / "models"
    assert not [p for p in named if Path(p).is_relative_to(interrupted)], named
    assert all(Path(p).is_file() for p in named)


def test_resume_reuses_nothing_stale(user_project: Path, tmp_path: Path, local_figures: tuple[dict, int]) -> None:
    """A build whose store entry was changed since is built again, and its measurements run again."""
    _, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=["fp16"])
    (tmp_path / "interrupt_at").write_text(str(2 * per_job + 1))
    with pytest.raises(QbenchError, match="interrupted"):
        run_sweep(recipe, track=False)
    store = tmp_path / "store"
    for manifest in store.glob("*/manifest.json"):  # built by another qbench: not reusable here
        content = json.loads(manifest.read_text())
        content["environment"]["onnxruntime"] = "0.0.1"
        manifest.write_text(json.dumps(content))
    before = len(probe_calls(tmp_path))
    outcome = run_sweep(recipe, track=False, resume=True)
    # the dry run; fp32 measured again: its build was not reused
    assert len(probe_calls(tmp_path)) - before == 3 * per_job
    assert all(not any(n.startswith("resumed") for n in v.notes) for v in outcome.results.variants)


def _interrupted_at_fp16(user_project: Path, target: Path, per_job: int) -> tuple[Path, Path]:
    """The recipe of VARIANTS, interrupted at the first call of fp16's measure job, and its run folder."""
    recipe = write_probe_recipe(user_project, target, variants=VARIANTS)
    (target / "interrupt_at").write_text(str(2 * per_job + 1))
    with pytest.raises(QbenchError, match="interrupted by SIGINT"):
        run_sweep(recipe, track=False)
    (interrupted,) = (target / "reports" / "tumour-mlp").glob("2*")
    return recipe, interrupted


def test_resume_builds_again_a_stored_build_whose_model_changed_since(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int], caplog: pytest.LogCaptureFixture
) -> None:
    expected, per_job = local_figures
    recipe, _ = _interrupted_at_fp16(user_project, tmp_path, per_job)
    (fp16,) = [m.parent for m in (tmp_path / "store").glob("*/manifest.json")
               if json.loads(m.read_text())["name"] == "fp16"]
    model = fp16 / "fp16.onnx"
    model.write_bytes(model.read_bytes()[:-100])  # truncated after it was published
    caplog.set_level(logging.INFO, logger="qbench")
    outcome = run_sweep(recipe, track=False, resume=True)
    shown = " ".join(caplog.text.split())
    assert f"build store: {model} no longer has the sha256 its manifest records" in shown
    assert "resuming: 2 of 6 jobs reused" in shown  # fp32's build and measurement; fp16 is built again
    assert figures(outcome.results) == expected


def test_resume_measures_the_reference_again_when_its_outputs_file_is_truncated(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int], caplog: pytest.LogCaptureFixture
) -> None:
    expected, per_job = local_figures
    recipe, interrupted = _interrupted_at_fp16(user_project, tmp_path, per_job)
    (outputs,) = (interrupted / JOBS_FOLDER).glob("*.outputs.npz")
    outputs.write_bytes(outputs.read_bytes()[:100])
    before = len(probe_calls(tmp_path))
    with caplog.at_level(logging.WARNING, logger="qbench"):
        outcome = run_sweep(recipe, track=False, resume=True)
    assert str(outputs) in caplog.text and "its job runs again" in caplog.text
    assert len(probe_calls(tmp_path)) - before == 4 * per_job  # the dry run, FP32 measured again, fp16, int8-minmax
    assert figures(outcome.results) == expected


def test_a_build_store_that_cannot_be_written_stops_the_sweep_before_anything_runs(
    user_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = write_probe_recipe(user_project, tmp_path, variants=["fp16"])
    (tmp_path / "store").write_text("not a folder")
    assert main(["sweep", str(recipe), "--no-track"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"executor.store: {tmp_path / 'store'} is a file; expected a writable folder for built variants" in err
    assert probe_calls(tmp_path) == [] and not (tmp_path / "reports").exists()


def test_resume_with_a_changed_recipe_starts_afresh(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int]
) -> None:
    _, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=["fp16"])
    (tmp_path / "interrupt_at").write_text(str(2 * per_job + 1))
    with pytest.raises(QbenchError, match="interrupted"):
        run_sweep(recipe, track=False)
    text = recipe.read_text().replace("iterations: 5", "iterations: 6")  # other latency settings: another plan
    recipe.write_text(text)
    before = len(probe_calls(tmp_path))
    run_sweep(recipe, track=False, resume=True)
    assert len(probe_calls(tmp_path)) - before == 3 * per_job  # the dry run, fp32, fp16


def test_plan_prints_jobs_needs_and_what_is_cached(
    user_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = write_probe_recipe(user_project, tmp_path, variants=["fp16"])
    assert main(["sweep", str(recipe), "--plan"]) == 0
    shown = capsys.readouterr().out
    assert "4 jobs on executor local" in shown and "of 4 jobs, 0 reuse, 0 re-run, 4 new" in shown
    assert "measure:fp16@onnxruntime-cpu  CPU + timing slot" in " ".join(shown.split("\n"))
    assert not (tmp_path / "reports" / "tumour-mlp").exists() or not any((tmp_path / "reports" / "tumour-mlp").glob("2*"))
    run_sweep(recipe, track=False)
    assert main(["sweep", str(recipe), "--plan", "--executor", "ray"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "on executor ray" in shown and "build:fp16 CPU — reuse in store" in shown  # the builds, in the store
    assert "--resume: the newest run of this plan" in shown and "resuming it would change nothing" in shown


def _plan_then_resume(recipe: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, tuple[str, str]], object]:
    """What `--plan` says of each job (action, why), then what `--resume` did."""
    capsys.readouterr()
    assert main(["sweep", str(recipe), "--plan"]) == 0
    shown = capsys.readouterr().out
    plan = {}
    for line in shown.splitlines():
        cells = line.split()
        for action in ("reuse", "re-run", "new"):
            if cells and cells[0].split(":")[0] in ("build", "measure") and action in cells:
                plan[cells[0]] = (action, " ".join(cells[cells.index(action) + 1 :]))
                break
    return plan, run_sweep(recipe, track=False, resume=True)


@pytest.mark.parametrize("failure", ["OnnxRuntimeMemory", "ValueError"])
def test_plan_says_per_job_what_resume_then_does_failed_jobs_included(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int], capsys: pytest.CaptureFixture[str],
    failure: str,
) -> None:
    """fp16's measurement fails (ONNX Runtime's own out-of-memory error, or the variant's own ValueError), then the
    sweep is interrupted in int8-minmax's: the plan showed no failed record (it was run again or reused with no word),
    and ONNX Runtime's allocation failure was reused as the variant's own. Now the plan names each job's fate and why,
    and the resume does exactly that."""
    _, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    (tmp_path / "fail_at").write_text(f"{2 * per_job + 1} {failure}" + (f" {per_job}" if failure == "ValueError"
                                                                        else ""))
    # int8-minmax's first call, after fp16's failed job (the variant's own failure: the metric raised on every scope)
    (tmp_path / "interrupt_at").write_text(str(3 * per_job + 1 if failure == "ValueError" else 2 * per_job + 2))
    with pytest.raises(QbenchError, match="interrupted"):
        run_sweep(recipe, track=False)
    before = len(probe_calls(tmp_path))
    plan, outcome = _plan_then_resume(recipe, capsys)
    own = failure == "ValueError"
    fp16 = plan["measure:fp16@onnxruntime-cpu"]
    assert fp16[0] == ("reuse" if own else "re-run")
    assert ("for the variant's own reason" in fp16[1]) is own and ("(out of memory)" in fp16[1]) is not own
    assert plan["measure:int8-minmax@onnxruntime-cpu"][0] == "new"
    assert plan["measure:fp32@onnxruntime-cpu"][0] == "reuse"
    assert all(plan[f"build:{v}"][0] == "reuse" for v in ["fp32", *VARIANTS])
    ran = {v.key for v in outcome.results.variants if not any(n.startswith("resumed") for n in v.notes)}
    planned = {job.split(":")[1] for job, (action, _) in plan.items() if job.startswith("measure")
               and action != "reuse"}
    assert ran == planned
    assert len(probe_calls(tmp_path)) - before == per_job * (1 + len(planned))  # the dry run, then those
    assert (outcome.results.find("fp16", "onnxruntime-cpu").status == "failed") is own


def test_an_unknown_executor_is_one_clear_line(user_project: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    recipe = write_probe_recipe(user_project, tmp_path, variants=["fp16"])
    assert main(["sweep", str(recipe), "--executor", "dask"]) == 2
    assert "--executor: got 'dask', expected one of local, ray" in capsys.readouterr().err


def test_a_build_store_that_fills_up_mid_sweep_stops_it_with_one_line_keeping_what_was_measured(
    user_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk under the store is full from fp16's publish on: one line naming the store, exit 2, the run folder
    marked incomplete with FP32's measurement in it, the stored FP32 build and the input copies intact."""
    import errno
    import shutil

    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    store, copy = tmp_path / "store", shutil.copyfile

    def full_disk(source: Path, target: Path, **kwargs: object) -> object:
        if str(target).startswith(str(store)) and "fp16" in str(source):
            raise OSError(errno.ENOSPC, "No space left on device", str(source), None, str(target))
        return copy(source, target, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", full_disk)
    assert main(["sweep", str(recipe), "--no-track"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("error") == 1 and err.splitlines()[-1] == (f"error: cannot write to the build store {store}: No "
                                                                "space left on device; free space there or "
                   "set executor.store (or $QBENCH_CACHE_DIR) to a writable folder")  # fmt: skip
    (run,) = (tmp_path / "reports" / "tumour-mlp").glob("2*")
    assert "No space left on device" in json.loads((run / INCOMPLETE_MARKER).read_text())["state"]
    assert [v.variant for v in read_results(run / "results.json", partial=True).variants] == ["fp32"]
    assert list(store.glob(".*.publishing")) == []  # no staging folder left
    names = [json.loads(m.read_text())["name"] for m in store.glob("*/manifest.json")]
    assert names == ["fp32"]


def test_a_run_folder_whose_disk_fills_up_mid_sweep_is_one_line_naming_the_file_keeping_what_was_written(
    user_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """From fp16's build record on, every write under output_dir fails with ENOSPC (its INCOMPLETE marker too): one
    line naming the file, exit 2, FP32's results and records as they were, no temporary file, and the gate refuses
    the run (its marker still says running)."""
    import errno

    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    reports, replace = tmp_path / "reports", os.replace
    full: list[bool] = []

    def full_disk(source: str, target: str) -> None:  # the temporary file is written; moving it in fails
        if Path(target).is_relative_to(reports) and (full or "build_fp16" in Path(target).name):
            full.append(True)
            raise OSError(errno.ENOSPC, "No space left on device")
        replace(source, target)

    monkeypatch.setattr(os, "replace", full_disk)
    assert main(["sweep", str(recipe), "--no-track"]) == 2
    (run,) = (reports / "tumour-mlp").glob("2*")
    last = capsys.readouterr().err.strip().splitlines()[-1]
    # the first write of fp16's build: its mark as started, before it runs
    assert last == f"error: {run / JOBS_FOLDER / 'build_fp16.started'}: cannot write the job's mark as started: No " \
                   "space left on device"
    monkeypatch.undo()
    assert [v.variant for v in read_results(run / "results.json", partial=True).variants] == ["fp32"]
    assert sorted(p.name for p in (run / JOBS_FOLDER).iterdir()) == [
        "build_fp32.json", "measure_fp32@onnxruntime-cpu.json", "measure_fp32@onnxruntime-cpu.outputs.npz"]  # fmt: skip
    assert not [p for p in run.rglob(".*")]  # no temporary file left
    assert json.loads((run / INCOMPLETE_MARKER).read_text())["state"] == "running"
    assert main(["gate", str(recipe)]) == 2
    assert f"{run}, is incomplete (running)" in capsys.readouterr().err  # this process ran it: killed, once it is gone


def test_a_run_folder_that_fills_up_while_a_build_is_copied_in_is_one_line_naming_it(
    user_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk under output_dir fills up while fp16's model is copied from the store into the run folder: before, a
    crash (`qbench: error: OSError: ...`) that left a truncated model there; now one line naming the run folder, exit
    2, FP32's measurement kept, no part of fp16's model left, and the gate refuses the run."""
    import errno
    import shutil

    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    reports, copy = tmp_path / "reports", shutil.copyfile

    def full_disk(source: Path, target: Path, **kwargs: object) -> object:
        if Path(target).is_relative_to(reports) and "fp16" in Path(target).name:
            Path(target).write_bytes(b"half a model")
            raise OSError(errno.ENOSPC, "No space left on device", str(source), None, str(target))
        return copy(source, target, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", full_disk)
    assert main(["sweep", str(recipe), "--no-track"]) == 2
    (run,) = (reports / "tumour-mlp").glob("2*")
    err = capsys.readouterr().err.strip()
    assert err.count("error") == 1 and err.splitlines()[-1] == (
        f"error: cannot write to the run folder {run}: No space left on device; free space there or set output_dir "
        "to a writable folder")  # fmt: skip
    monkeypatch.undo()
    assert [v.variant for v in read_results(run / "results.json", partial=True).variants] == ["fp32"]
    assert not list((run / "models").glob("*fp16*"))
    assert main(["gate", str(recipe)]) == 2
    assert f"{run}, is incomplete (failed: cannot write to the run folder" in capsys.readouterr().err


@pytest.mark.parametrize("failure", ["ENOSPC", "MemoryError"])
def test_a_finished_run_with_a_job_failed_for_an_environment_reason_resumes_only_that_job(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int], failure: str
) -> None:
    """A finished run counted as complete, so --resume measured every job again (only builds were reused)."""
    expected, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    # fp16's measurement meets a full disk, once
    (tmp_path / "fail_at").write_text(f"{2 * per_job + 1} {failure}" + (f" {per_job}" if failure == "ValueError"
                                                                        else ""))
    failed = run_sweep(recipe, track=False)
    fp16 = failed.results.find("fp16", "onnxruntime-cpu")
    assert fp16.status == "failed" and failed.results.complete
    record = json.loads((failed.run_dir / JOBS_FOLDER / "measure_fp16@onnxruntime-cpu.json").read_text())
    assert record["environment"] == {"ENOSPC": "no space left on device", "MemoryError": "out of memory"}[failure]
    assert main(["gate", str(recipe)]) == 2  # the finished run fails closed on the failed measurement

    before = len(probe_calls(tmp_path))
    outcome = run_sweep(recipe, track=False, resume=True)
    assert len(probe_calls(tmp_path)) - before == 2 * per_job  # the dry run, then fp16's job only
    assert figures(outcome.results) == expected
    resumed = [v.key for v in outcome.results.variants if any(n.startswith("resumed") for n in v.notes)]
    assert resumed == ["fp32@onnxruntime-cpu", "int8-minmax@onnxruntime-cpu"]
    assert f"resumed: measured by the run {failed.run_dir.name}" in outcome.results.variants[0].notes
    assert outcome.run_dir != failed.run_dir
    assert main(["gate", str(recipe)]) == 0  # the resumed run is judged as one complete run


@pytest.mark.parametrize("own", [True, False])
def test_resume_refuses_a_finished_run_with_nothing_it_would_change(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int], capsys: pytest.CaptureFixture[str], own: bool
) -> None:
    """A variant's own failure would fail again, and a run with every job done has nothing to resume: one line."""
    _, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=["fp16"])
    if own:
        (tmp_path / "fail_at").write_text(f"{2 * per_job + 1} ValueError {per_job}")
    finished = run_sweep(recipe, track=False)
    assert (finished.results.find("fp16", "onnxruntime-cpu").status == "failed") is own
    before = len(probe_calls(tmp_path))
    capsys.readouterr()
    assert main(["sweep", str(recipe), "--no-track", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"--resume: the newest run of this plan, {finished.run_dir}, finished" in err
    assert "resuming it would change nothing" in err
    assert ("measure:fp16@onnxruntime-cpu" in err) is own
    assert len(probe_calls(tmp_path)) == before
    assert list((tmp_path / "reports" / "tumour-mlp").glob("2*")) == [finished.run_dir]


def test_a_job_whose_worker_is_lost_past_its_retries_is_run_again_by_resume(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker lost (node gone, OOM-killed) after the retries ran out fails the job for a reason outside it."""
    expected, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS, executor={"retries": 0})
    lose = {"measure:int8-minmax@onnxruntime-cpu"}

    class Losing(LocalExecutor):
        def next_done(self) -> JobDone:
            job, _ = self._queue[0]
            if job.id in lose:
                lose.discard(job.id)
                self._queue.popleft()
                return JobDone(job.id, None, lost="NodeDiedError: node 10.0.0.7 died")
            return super().next_done()

    monkeypatch.setattr(sweep_module, "make_executor", lambda recipe, prepared, store: Losing(prepared, store))
    failed = run_sweep(recipe, track=False)
    assert failed.results.find("int8-minmax", "onnxruntime-cpu").error.startswith("worker lost 1 times")
    before = len(probe_calls(tmp_path))
    outcome = run_sweep(recipe, track=False, resume=True)
    assert len(probe_calls(tmp_path)) - before == 2 * per_job  # the dry run, then int8-minmax
    assert figures(outcome.results) == expected


def test_resume_keeps_a_variants_own_failure_rather_than_measuring_it_again(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int]
) -> None:
    _, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    # fp16 cannot be scored: its own failure
    (tmp_path / "fail_at").write_text(f"{2 * per_job + 1} ValueError {per_job}")
    (tmp_path / "interrupt_at").write_text(str(3 * per_job + 1))  # then int8-minmax's measurement is interrupted
    with pytest.raises(QbenchError, match="interrupted by SIGINT"):
        run_sweep(recipe, track=False)
    before = len(probe_calls(tmp_path))
    outcome = run_sweep(recipe, track=False, resume=True)
    assert len(probe_calls(tmp_path)) - before == 2 * per_job  # the dry run, then int8-minmax only
    fp16 = outcome.results.find("fp16", "onnxruntime-cpu")
    assert fp16.status == "failed" and "cannot be scored" in fp16.error
    assert outcome.results.find("int8-minmax", "onnxruntime-cpu").status == "ok"


def test_rerun_failed_runs_again_only_the_jobs_that_failed_for_their_variants_own_reason(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int], capsys: pytest.CaptureFixture[str]
) -> None:
    """fp16's measurement failed for its own reason, then the user fixed the cause outside the recipe and its inputs
    (here the probe fails once): `--resume` refused (nothing would change) and only a full sweep measured fp16 again.
    `--resume --rerun-failed` runs that job alone, reusing the others, and `--plan --rerun-failed` says so first."""
    expected, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    (tmp_path / "fail_at").write_text(f"{2 * per_job + 1} ValueError {per_job}")
    failed = run_sweep(recipe, track=False)
    assert failed.results.find("fp16", "onnxruntime-cpu").status == "failed"
    capsys.readouterr()
    assert main(["sweep", str(recipe), "--no-track", "--rerun-failed"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --rerun-failed applies with --resume (or --plan): it says which "
                                               "jobs a resume runs again")  # fmt: skip
    assert main(["sweep", str(recipe), "--plan", "--rerun-failed"]) == 0
    shown = capsys.readouterr().out
    rows = {line.split()[0]: " ".join(line.split()) for line in shown.splitlines() if line.startswith("measure:")}
    fp16 = rows["measure:fp16@onnxruntime-cpu"]
    assert f"re-run failed in {failed.run_dir.name}, run again (--rerun-failed): scoring failed" in fp16
    assert "this variant's outputs cannot be scored" in fp16
    assert all(f" reuse finished in {failed.run_dir.name}" in rows[f"measure:{v}@onnxruntime-cpu"]
               for v in ("fp32", "int8-minmax"))  # fmt: skip
    assert "`qbench sweep --resume --rerun-failed` takes up" in shown and "5 reuse, 1 re-run, 0 new" in shown

    before = len(probe_calls(tmp_path))
    outcome = run_sweep(recipe, track=False, resume=True, rerun_failed=True)
    assert len(probe_calls(tmp_path)) - before == 2 * per_job  # the dry run, then fp16's measurement only
    assert figures(outcome.results) == expected
    resumed = [v.key for v in outcome.results.variants if any(n.startswith("resumed") for n in v.notes)]
    assert resumed == ["fp32@onnxruntime-cpu", "int8-minmax@onnxruntime-cpu"]
    assert main(["gate", str(recipe)]) == 0
    assert main(["sweep", str(recipe), "--no-track", "--resume", "--rerun-failed"]) == 2  # nothing failed now
    assert "--resume --rerun-failed: the newest run of this plan" in capsys.readouterr().err


def test_a_result_reused_by_two_resumes_names_only_the_run_that_measured_it(
    user_project: Path, tmp_path: Path, local_figures: tuple[dict, int]
) -> None:
    """Each resume added its own note: FP32, measured once by the first run, said it was measured by all three."""
    expected, per_job = local_figures
    recipe = write_probe_recipe(user_project, tmp_path, variants=VARIANTS)
    (tmp_path / "interrupt_at").write_text(str(2 * per_job + 1))  # fp16's measure job, in the first run
    with pytest.raises(QbenchError, match="interrupted by SIGINT"):
        run_sweep(recipe, track=False)
    (first,) = (tmp_path / "reports" / "tumour-mlp").glob("2*")
    (tmp_path / "interrupt_at").write_text(str(len(probe_calls(tmp_path)) + 2 * per_job + 1))  # int8-minmax's, resumed
    with pytest.raises(QbenchError, match="interrupted by SIGINT"):
        run_sweep(recipe, track=False, resume=True)
    (second,) = set((tmp_path / "reports" / "tumour-mlp").glob("2*")) - {first}
    outcome = run_sweep(recipe, track=False, resume=True)
    assert figures(outcome.results) == expected
    fp32, fp16, int8 = ([note for note in variant.notes if note.startswith("resumed")]
                        for variant in outcome.results.variants)  # fmt: skip
    assert fp32 == [f"resumed: measured by the interrupted run {first.name}"]
    assert fp16 == [f"resumed: measured by the interrupted run {second.name}"]
    assert int8 == []
