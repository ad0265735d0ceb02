"""The rules of `--resume` job by job (qbench.execute.resume): `--rerun-failed` and a build failed for its own reason."""

from __future__ import annotations

from qbench.execute.records import JobRecord
from qbench.execute.resume import NEW, RERUN, REUSE, decide_build, decide_measure

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
