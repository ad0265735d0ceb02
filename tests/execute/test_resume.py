"""What --resume reuses of a measurement: a torch backend's result records its module's digest, not the file's."""

from __future__ import annotations

from qbench.execute.records import JobRecord
from qbench.execute.resume import RERUN, REUSE, Decision, decide_measure
from qbench.results import VariantResult

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
