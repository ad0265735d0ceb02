"""The rules of `--resume` job by job (qbench.execute.resume): `--rerun-failed`, a build failed for its own reason, and
a torch backend's result, which records its module's digest, not the file's."""

from __future__ import annotations

from qbench.execute.records import JobRecord
from qbench.execute.resume import NEW, RERUN, REUSE, Decision, decide_build, decide_measure, runs_onnx_file
from qbench.results import VariantResult

FAILED_BUILD = JobRecord("build:fp16", attempts=1, error="ValueError: the converter refused node 'mm'")


def test_a_build_failed_for_its_own_reason_is_reused_as_failed_and_its_measurement_fails_with_it() -> None:
    build = decide_build(FAILED_BUILD, None, "run-1")
    assert (build.action, build.failed) == (REUSE, True)
    measure = decide_measure(None, "run-1", build=build, built_sha256=None, needs_outputs=False)
    assert measure.action == REUSE and measure.why == "its build failed: fails with it"


def test_rerun_failed_builds_a_failed_build_again_and_measures_it() -> None:
    build = decide_build(FAILED_BUILD, None, "run-1", rerun_failed=True)
    assert (build.action, build.failed) == (RERUN, False)
    assert build.why == "failed in run-1, run again (--rerun-failed): ValueError: the converter refused node 'mm'"
    measure = decide_measure(None, "run-1", build=build, built_sha256=None, needs_outputs=False, rerun_failed=True)
    assert measure.action == NEW


BUILT = "a" * 64  # the reused build's ONNX file digest


def _record(sha256: str) -> JobRecord:
    result = VariantResult("bf16", "torch-cpu", "bf16", "ok", model_sha256=sha256, model_bytes=10)
    return JobRecord("measure:bf16@torch-cpu", attempts=1, result=result)


def test_a_torch_result_of_a_reused_build_is_reused_though_its_digest_is_the_modules():
    reused = Decision(REUSE, "stored")
    decision = decide_measure(_record("b" * 64), "run", build=reused, built_sha256=BUILT, needs_outputs=False,
                              ran_file=False)  # fmt: skip
    assert decision.action == REUSE


def test_a_result_of_the_file_with_another_digest_is_measured_again():
    reused = Decision(REUSE, "stored")
    decision = decide_measure(_record("b" * 64), "run", build=reused, built_sha256=BUILT, needs_outputs=False)
    assert decision.action == RERUN and "another build" in decision.why


def test_the_plan_and_the_resume_tell_a_torch_backends_results_by_the_backend_that_ran_them():
    assert runs_onnx_file("onnxruntime-cpu") and not runs_onnx_file("torch-cpu")
