"""A scope where no gated metric can show a drop (FP32's figure already the metric's worst) is not judged, and the
variant's pass cannot rest on it: gate.unresolved holds it as it holds a pass too few rows resolve."""

from __future__ import annotations

import numpy as np

from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, EXIT_UNUSABLE, GateReport, evaluate_gate
from qbench.recipe.spec import GateSpec
from qbench.results.schema import SweepResults, VariantResult
from qbench.validate.accuracy import evaluate_accuracy

ROWS, LABELS = 2000, 3
CLEAN = np.arange(ROWS) >= ROWS // 2  # rows without any positive label


def _multilabel() -> tuple[VariantResult, VariantResult]:
    """FP32 predicts one false positive on the clean rows (its micro_f1 there: 0, tp 0 fp 1), the variant 11 (10 more);
    on the tagged rows both are right on every label."""
    rng = np.random.default_rng(0)
    labels = (rng.random((ROWS, LABELS)) < 0.3).astype(np.int64)
    labels[CLEAN] = 0
    reference = np.where(labels == 1, 3.0, -3.0) + rng.normal(scale=0.5, size=(ROWS, LABELS))
    reference[ROWS // 2, 0] = 2.0
    outputs = reference.copy()
    outputs[ROWS // 2:ROWS // 2 + 10, 1] = 2.0

    def result(name: str, values: np.ndarray) -> VariantResult:
        accuracy = evaluate_accuracy("multilabel", values.astype(np.float32), reference.astype(np.float32), labels,
                                     {"clean": CLEAN, "tagged": ~CLEAN})  # fmt: skip
        return VariantResult(variant=name, backend="onnxruntime-cpu", precision="fp32" if name == "fp32" else "int8",
                             status="ok", accuracy=accuracy)  # fmt: skip

    return result("fp32", reference), result("int8", outputs)


F1 = {"metric": "micro_f1", "max_drop": 0.01, "max_slice_drop": 0.02}


def _gate(spec: GateSpec, *variants: VariantResult) -> GateReport:
    results = SweepResults(qbench_version="0", created_at="", recipe={}, environment={}, calibration=None,
                           evaluation_rows=ROWS, gate_metric=spec.metric, reference="fp32",
                           variants=variants)  # fmt: skip
    return evaluate_gate(results, spec, expected=[(v.variant, v.backend) for v in variants])


def test_f1_at_zero_for_fp32_on_rows_without_a_positive_cannot_pass_the_variant_adding_false_positives():
    """The probe: F1 on the clean rows is 0 for FP32 (one false positive) and for a variant with 11: no variant can
    score below 0, so that check could only pass, and the gate passed it (exit 0). It is now a skipped check saying
    why, and the variant cannot be judged (exit 2) until a metric that can show the drop there is gated beside it:
    label_agreement breaches on the clean rows (exit 1)."""
    fp32, int8 = _multilabel()
    clean = int8.accuracy.slice("clean").metrics
    assert fp32.accuracy.slice("clean").metrics["micro_f1"] == clean["micro_f1"] == 0.0
    alone = _gate(GateSpec(**F1), fp32, int8)
    assert alone.exit_code == EXIT_UNUSABLE
    assert alone.problems == ("int8@onnxruntime-cpu: not judged on clean (FP32's micro_f1 is 0 here, its worst: no "
                              "drop can show): no gated metric can show a "
                              "drop there, so its pass says nothing of those rows; gate also on a metric that can "
                              "(gate.metrics), leave those rows out (data.evaluation.filter), or set gate.unresolved: "
                              "note to let the pass count with this note",)  # fmt: skip
    noted = _gate(GateSpec(**F1, unresolved="note"), fp32, int8)
    assert noted.exit_code == EXIT_PASS
    check = next(c for c in noted.checks if c.scope == "clean")
    assert (check.status, check.reason) == ("skipped",
                                            "not judged: FP32's micro_f1 is 0 here, its worst: no drop can show")
    both = _gate(GateSpec(metrics=[F1, {"metric": "label_agreement", "max_drop": 0.001, "max_slice_drop": 0.002}]),
                 fp32, int8)  # fmt: skip
    assert both.exit_code == EXIT_BREACH and not both.problems
    breach = next(c for c in both.breaches if c.scope == "clean")
    assert (breach.metric, breach.reference, breach.observed) == ("label_agreement", 1.0, 1 - 10 / (1000 * LABELS))


def test_a_later_backend_s_fp32_at_its_worst_is_still_judged_either_way():
    """FP32 on a later backend is judged against the first's both ways (a gain past the tolerance breaches): a figure
    at the worst end there is a comparison of two FP32s, not a check that can only pass, so it is not skipped."""
    fp32, int8 = _multilabel()
    later = VariantResult(variant="fp32", backend="onnxruntime-cpu-2", precision="fp32", status="ok",
                          accuracy=fp32.accuracy)  # fmt: skip
    report = _gate(GateSpec(**F1, unresolved="note"), fp32, int8, later)
    clean = next(c for c in report.checks if c.scope == "clean" and c.backend == "onnxruntime-cpu-2")
    assert clean.status == "pass" and not clean.reason
