"""The rules of `--resume` job by job (qbench.execute.resume): `--rerun-failed`, a build failed for its own reason, a
torch backend's result, which records its module's digest, not the file's, and what measured a result."""

from __future__ import annotations

import pytest

from qbench.execute.plan import Job, JobNeeds, SweepPlan
from qbench.execute.records import JobRecord
from qbench.execute.resume import (
    NEW,
    RERUN,
    REUSE,
    Decision,
    decide_build,
    decide_measure,
    measured_with,
    reference_again,
    rerun_summary,
    runs_onnx_file,
)
from qbench.results.evidence import EVIDENCE, RECORDED
from qbench.results.schema import VariantResult

NOW = {"onnxruntime": "1.32.0", "cpu": "Some CPU", "cpus": "8", "machine": "x86_64", "threads": "4"}

FAILED_BUILD = JobRecord("build:fp16", attempts=1, error="ValueError: the converter refused node 'mm'")


def test_a_build_failed_for_its_own_reason_is_reused_as_failed_and_its_measurement_fails_with_it() -> None:
    build = decide_build(FAILED_BUILD, None, "run-1")
    assert (build.action, build.failed) == (REUSE, True)
    measure = decide_measure(None, "run-1", build=build, built_sha256=None, needs_outputs=False, current=NOW)
    assert measure.action == REUSE and measure.why == "its build failed: fails with it"


def test_rerun_failed_builds_a_failed_build_again_and_measures_it() -> None:
    build = decide_build(FAILED_BUILD, None, "run-1", rerun_failed=True)
    assert (build.action, build.failed) == (RERUN, False)
    assert build.why == "failed in run-1, run again (--rerun-failed): ValueError: the converter refused node 'mm'"
    measure = decide_measure(None, "run-1", build=build, built_sha256=None, needs_outputs=False, current=NOW,
                             rerun_failed=True)  # fmt: skip
    assert measure.action == NEW


BUILT = "a" * 64  # the reused build's ONNX file digest


def _record(sha256: str, measured: dict[str, str] | None = NOW, status: str = "ok",
            evidence: tuple[str, ...] = RECORDED) -> JobRecord:  # fmt: skip
    result = VariantResult("bf16", "torch-cpu", "bf16", status, model_sha256=sha256, model_bytes=10)
    return JobRecord("measure:bf16@torch-cpu", attempts=1, result=result, measured_with=measured, evidence=evidence)


def test_a_torch_result_of_a_reused_build_is_reused_though_its_digest_is_the_modules():
    reused = Decision(REUSE, "stored")
    decision = decide_measure(_record("b" * 64), "run", build=reused, built_sha256=BUILT, needs_outputs=False,
                              current=NOW, ran_file=False)  # fmt: skip
    assert decision.action == REUSE


def test_a_result_of_the_file_with_another_digest_is_measured_again():
    reused = Decision(REUSE, "stored")
    decision = decide_measure(_record("b" * 64), "run", build=reused, built_sha256=BUILT, needs_outputs=False,
                              current=NOW)  # fmt: skip
    assert decision.action == RERUN and "another build" in decision.why


def test_the_plan_and_the_resume_tell_a_torch_backends_results_by_the_backend_that_ran_them():
    assert runs_onnx_file("onnxruntime-cpu") and not runs_onnx_file("torch-cpu")


def _decide(record: JobRecord, *, reference_again: bool = False) -> Decision:
    return decide_measure(record, "run-1", build=Decision(REUSE, "stored"), built_sha256=BUILT, needs_outputs=False,
                          current=NOW, reference_again=reference_again)  # fmt: skip


@pytest.mark.parametrize("status", ["ok", "failed", "skipped"])
def test_a_result_measured_with_another_runtime_or_on_another_machine_is_measured_again(status: str) -> None:
    """A result was reused whatever runtime and machine measured it: one table mixed two onnxruntimes (or CPUs)."""
    assert _decide(_record(BUILT, status=status)).action == REUSE
    upgraded = _decide(_record(BUILT, {**NOW, "onnxruntime": "1.31.0"}, status))
    assert (upgraded.action, upgraded.changes) == (RERUN, ("onnxruntime 1.31.0 -> 1.32.0",))
    assert upgraded.why == "measured in run-1 with onnxruntime 1.31.0 -> 1.32.0"
    moved = _decide(_record(BUILT, {**NOW, "cpu": "Other CPU", "cpus": "2"}, status))
    assert moved.action == RERUN and moved.changes == ("CPU Other CPU -> Some CPU", "usable CPUs 2 -> 8")


def test_a_record_of_an_older_qbench_without_what_measured_it_is_measured_again() -> None:
    older = _decide(_record(BUILT, None))
    assert older.action == RERUN and older.changes == ("what measured it not recorded (an older qbench)",)


@pytest.mark.parametrize("status", ["ok", "failed", "skipped"])
def test_a_record_of_a_qbench_that_recorded_fewer_kinds_of_evidence_is_measured_again(status: str) -> None:
    """Its result lacks figures the results it joins claim (qbench.results.evidence): it was reused, and the gate then
    skipped the checks on them or refused the variant as 'written by another qbench'."""
    lacking = _decide(_record(BUILT, status=status, evidence=tuple(n for n in RECORDED if n != "kept")))
    assert lacking.action == RERUN and lacking.why == "measured in run-1 by a qbench that recorded no kept"
    assert lacking.changes == ("evidence kept not recorded (an older qbench)",)
    none = _decide(_record(BUILT, status=status, evidence=()))
    per_job = [n for n in RECORDED if not EVIDENCE[n].code]  # the project's modules: the resuming sweep's own record
    assert none.action == RERUN and none.why.endswith(f"recorded no {', '.join(per_job)}")
    assert len(per_job) < len(RECORDED)


def test_a_result_relative_to_an_fp32_reference_measured_again_is_measured_again() -> None:
    decision = _decide(_record(BUILT), reference_again=True)
    assert decision.action == RERUN and "FP32 reference that is measured again" in decision.why


def _job(variant: str, backend: str) -> Job:
    return Job(f"measure:{variant}@{backend}", "measure", variant, backend, JobNeeds(), (), "key")


def test_the_references_a_measurement_is_relative_to_are_its_backends_and_the_reference_outputs() -> None:
    plan = SweepPlan("f", "fp32", ("onnxruntime-cpu", "torch-cpu"), ())
    again, reused = Decision(RERUN, "moved"), Decision(REUSE, "finished")
    on_torch = {"measure:fp32@onnxruntime-cpu": reused, "measure:fp32@torch-cpu": again}
    assert reference_again(_job("int8", "torch-cpu"), plan, on_torch)
    assert not reference_again(_job("int8", "onnxruntime-cpu"), plan, on_torch)
    outputs = {"measure:fp32@onnxruntime-cpu": again, "measure:fp32@torch-cpu": reused}
    assert reference_again(_job("int8", "torch-cpu"), plan, outputs)  # its outputs are compared with those
    assert reference_again(_job("fp32", "torch-cpu"), plan, outputs)
    assert not reference_again(_job("fp32", "onnxruntime-cpu"), plan, outputs)


def test_the_resume_says_in_one_line_per_kind_of_difference_how_many_run_again() -> None:
    upgrade = Decision(RERUN, "x", changes=("onnxruntime 1.31.0 -> 1.32.0",))
    both = Decision(RERUN, "x", changes=("onnxruntime 1.31.0 -> 1.32.0", "CPU A -> B"))
    assert rerun_summary([upgrade, Decision(REUSE, "y"), both]) == [
        "onnxruntime 1.31.0 -> 1.32.0: 2 measurements run again", "CPU A -> B: 1 measurement run again"]


def test_what_measures_names_the_backends_runtime_and_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    import qbench.environment as environment

    monkeypatch.setattr(environment, "package_version", lambda name: {"onnxruntime": "9.9"}.get(name))
    monkeypatch.setattr(environment, "_cpu_model", lambda: "Test CPU")
    monkeypatch.setattr(environment, "cpu_allowance", lambda root=None: environment.CpuAllowance(1, None))
    facts = measured_with("onnxruntime-cpu", None)
    assert facts["onnxruntime"] == "9.9" and facts["onnxruntime-gpu"] == "absent" and "torch" not in facts
    # unset threads are the usable CPUs' default (qbench.environment.default_threads): 1 here
    assert (facts["cpu"], facts["cpus"], facts["threads"]) == ("Test CPU", "1", "1")
    assert measured_with("torch-cpu", 2)["torch"] == "absent" and measured_with("torch-cpu", 2)["threads"] == "2"


def test_a_result_scored_with_another_numpy_or_timed_under_another_cpu_quota_is_measured_again(monkeypatch) -> None:
    """What measured a result named its backend's runtime alone, and the usable CPUs, which round a quota down: a resume
    after a numpy upgrade (numpy computes every metric), or in a container whose quota went from 1.5 to 1 CPU (1
    usable either way), reused figures made otherwise beside new ones."""
    import qbench.environment as environment

    versions = {"onnxruntime": "1.32.0", "numpy": "1.26.4"}
    monkeypatch.setattr(environment, "package_version", lambda name: versions.get(name))
    monkeypatch.setattr(environment, "cpu_allowance", lambda root=None: environment.CpuAllowance(4, 1.5))
    recorded = measured_with("onnxruntime-cpu", 2)
    assert (recorded["numpy"], recorded["cpus"], recorded["cpu_quota"]) == ("1.26.4", "1", "1.5")
    assert measured_with("torch-cpu", 2)["numpy"] == "1.26.4"

    def decide() -> Decision:
        return decide_measure(_record(BUILT, recorded), "run-1", build=Decision(REUSE, "stored"), built_sha256=BUILT,
                              needs_outputs=False, current=measured_with("onnxruntime-cpu", 2))  # fmt: skip

    assert decide().action == REUSE
    versions["numpy"] = "2.1.0"
    assert (decide().action, decide().changes) == (RERUN, ("numpy 1.26.4 -> 2.1.0",))
    versions["numpy"] = "1.26.4"
    monkeypatch.setattr(environment, "cpu_allowance", lambda root=None: environment.CpuAllowance(4, 1.0))
    assert (decide().action, decide().changes) == (RERUN, ("CPU quota 1.5 -> 1.0",))


def test_a_gpu_backends_result_measured_on_another_gpu_is_measured_again_and_a_cpu_backends_is_not(monkeypatch):
    """measured_with held no GPU model: a resume on a machine with another GPU (same CPU) reused the GPU backend's
    timings made on the first one. A CPU backend's record leaves the GPU out, so another GPU never reruns it."""
    import qbench.environment as environment

    monkeypatch.setattr(environment, "gpu_model", lambda: "NVIDIA H200")
    on_gpu, on_cpu = measured_with("onnxruntime-cuda", None), measured_with("onnxruntime-cpu", None)
    assert on_gpu["gpu"] == "NVIDIA H200" and "gpu" not in on_cpu
    assert measured_with("torch-cuda", None)["gpu"] == "NVIDIA H200"
    monkeypatch.setattr(environment, "gpu_model", lambda: "NVIDIA H100 80GB HBM3")

    def decide(recorded, now):
        return decide_measure(_record(BUILT, recorded), "run-1", build=Decision(REUSE, "stored"), built_sha256=BUILT,
                              needs_outputs=False, current=now)  # fmt: skip

    moved = decide(on_gpu, measured_with("onnxruntime-cuda", None))
    assert moved.action == RERUN and moved.changes == ("GPU NVIDIA H200 -> NVIDIA H100 80GB HBM3",)
    assert decide(on_cpu, measured_with("onnxruntime-cpu", None)).action == REUSE
    monkeypatch.setattr(environment, "gpu_model", lambda: None)  # the resume runs where there is no GPU
    assert decide(on_gpu, measured_with("onnxruntime-cuda", None)).changes == ("GPU NVIDIA H200 -> none",)
