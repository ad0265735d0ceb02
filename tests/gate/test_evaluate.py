"""Gate logic: every violation reported, tolerances applied overall and per slice, fail closed."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from sweep_factory import make_sweep

from qbench.errors import QbenchError
from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, EXIT_UNUSABLE, evaluate_gate, judge
from qbench.gate.run import run_gate
from qbench.recipe.spec import GateSpec
from qbench.results.schema import AccuracyResult, SliceMetrics, SweepResults, VariantResult, to_json
from qbench.validate.accuracy import evaluate_accuracy

NAN = math.nan
SPEC = GateSpec(metric="accuracy", max_drop=0.01, max_slice_drop=0.02, applies_to=["int8-*"])


def variant(name: str, overall: float, slices: dict[str, float], *, status="ok", size=1000):
    accuracy = AccuracyResult(
        rows=size * 2,
        nonfinite_outputs=0,
        overall=SliceMetrics("overall", size * 2, {"accuracy": overall}),
        slices=tuple(SliceMetrics(n, size, {"accuracy": v}) for n, v in slices.items()),
    )
    return VariantResult(
        variant=name, backend="onnxruntime-cpu", precision="fp32" if name == "fp32" else "int8", status=status,
        error=None if status == "ok" else "boom", accuracy=accuracy if status == "ok" else None,
    )  # fmt: skip


def sweep(*variants: VariantResult) -> SweepResults:
    return SweepResults(
        qbench_version="0", created_at="2026-01-01T00:00:00+00:00",
        recipe={"name": "toy", "gate": SPEC.model_dump(mode="json")},
        environment={}, calibration=None, evaluation_rows=200, gate_metric="accuracy", reference="fp32",
        variants=variants,
    )  # fmt: skip


REFERENCE = variant("fp32", 0.95, {"noisy": 0.90, "clean": 0.99})


def test_all_within_tolerance_passes_and_reference_is_not_judged():
    # drops of 0.005 and 0.015 on 2,000 and 1,000 rows: within the tolerances, but their 95 % upper bounds are not
    # (qbench.gate.resolution); these checks are about the comparison, so the unresolved passes count, as a note
    spec = SPEC.model_copy(update={"unresolved": "note"})
    report = evaluate_gate(sweep(REFERENCE, variant("int8-a", 0.945, {"noisy": 0.885, "clean": 0.99})), spec)
    assert report.exit_code == EXIT_PASS
    assert {c.scope for c in report.checks} == {"overall", "noisy", "clean"}
    assert all(c.variant == "int8-a" for c in report.checks)
    assert report.status_of("int8-a", "onnxruntime-cpu") == "pass"
    assert report.status_of("fp32", "onnxruntime-cpu") == "not gated"


def test_a_variant_that_computes_as_the_reference_passes_with_a_note_saying_so():
    """A tree ensemble asked for INT8 comes back as the FP32 graph, a float64 graph with no node quantized: the gate
    passes them (nothing changed) but says their pass is no evidence about INT8. A quantized variant, even one no
    worse than FP32, gets no such note."""
    same = replace(variant("int8-tree", 0.95, {"noisy": 0.90, "clean": 0.99}), params={"identical_to": "fp32"})
    quantized = variant("int8-a", 0.95, {"noisy": 0.90, "clean": 0.99})
    twin_of_other = replace(variant("int8-b", 0.95, {"noisy": 0.90, "clean": 0.99}), params={"identical_to": "int8-a"})
    none_quantized = replace(variant("int8-c", 0.95, {"noisy": 0.90, "clean": 0.99}), params={"quantized_nodes": 0})
    some_quantized = replace(variant("int8-d", 0.95, {"noisy": 0.90, "clean": 0.99}), params={"quantized_nodes": 3})
    no_linear = replace(variant("int8-e", 0.95, {"noisy": 0.90, "clean": 0.99}), params={"quantized_linears": 0})
    variants = (REFERENCE, same, quantized, twin_of_other, none_quantized, some_quantized, no_linear)
    report = evaluate_gate(sweep(*variants), SPEC)
    assert report.exit_code == EXIT_PASS
    assert report.notes == tuple(f"int8-{name}@onnxruntime-cpu computes in fp32 (nothing in the graph was lowered to "
                                 "int8): its pass says nothing about int8" for name in ("tree", "c", "e"))  # fmt: skip


def test_a_reference_deciding_every_row_one_class_is_a_note_when_the_gate_reads_its_decisions():
    """FP32 puts every row in one class at a split its graph does not state (its param one_class_outputs): a pass on
    accuracy, agreement or flip_rate says little; on another metric (a recipe's own, kl_mean) nothing is noted."""
    reference = replace(REFERENCE, params={"one_class_outputs": ["score"]})
    variants = (reference, variant("int8-a", 0.95, {"noisy": 0.90, "clean": 0.99}))
    report = evaluate_gate(sweep(*variants), SPEC)
    assert report.exit_code == EXIT_PASS
    assert report.notes == ("fp32@onnxruntime-cpu decides every evaluation row one class on output 'score' (its notes "
                            "say why): accuracy moves only where a variant carries a score across the split, so a pass "
                            "on it says little about the variant",)  # fmt: skip
    assert evaluate_gate(sweep(REFERENCE, variants[1]), SPEC).notes == ()
    other = SPEC.model_copy(update={"metric": "kl_mean"})
    assert not [n for n in evaluate_gate(sweep(*variants), other).notes if "one class" in n]


def test_variants_the_applies_to_globs_leave_out_are_named_in_a_note():
    """An INT8 build named outside gate.applies_to ('quant-a' beside 'int8-*') breaches nothing because nothing judges
    it: the verdict stands on what was judged, and a note names every variant left out with its precision, and one
    that did not run with its status and why (a failed build was left out of the note: a pass without a word)."""
    outside = variant("quant-a", 0.50, {"noisy": 0.40, "clean": 0.60})
    failed_outside = variant("quant-b", 0.0, {}, status="failed")
    report = evaluate_gate(sweep(REFERENCE, variant("int8-a", 0.95, {"noisy": 0.90, "clean": 0.99}), outside,
                                 failed_outside), SPEC)  # fmt: skip
    assert report.exit_code == EXIT_PASS
    assert report.status_of("quant-a", "onnxruntime-cpu") == "not gated"
    assert report.notes == ("not judged by this gate (gate.applies_to: int8-*): quant-a@onnxruntime-cpu (int8), "
                            "quant-b@onnxruntime-cpu (int8, failed: boom)",)  # fmt: skip
    every = evaluate_gate(sweep(REFERENCE, variant("int8-a", 0.95, {"noisy": 0.90, "clean": 0.99}), outside),
                          SPEC.model_copy(update={"applies_to": ["*"]}))  # fmt: skip
    assert every.exit_code == EXIT_BREACH and every.notes == ()


def test_a_backend_timed_on_machines_of_several_kinds_is_a_note():
    """A cluster timed FP32 on one kind of node and INT8 on another: accuracy is judged as ever, and the note says
    their latencies cannot be compared."""
    results = make_sweep()
    machines = {"fp32": {"cpu": "Intel Xeon", "cpus": 8, "arch": "x86_64"},
                "int8_minmax": {"cpu": "AMD EPYC", "cpus": 8, "arch": "x86_64"}}  # fmt: skip
    variants = tuple(replace(v, latency=replace(v.latency, machine=machines[v.variant]))
                     if v.variant in machines and v.latency else v for v in results.variants)  # fmt: skip
    spec = SPEC.model_copy(update={"applies_to": ["int8_minmax"]})
    report = evaluate_gate(replace(results, variants=variants), spec)
    plain = evaluate_gate(results, spec)
    assert report.checks == plain.checks and report.exit_code == plain.exit_code  # the verdict is unchanged
    assert [n for n in report.notes if "kinds of machine" in n] == [
        "onnxruntime-cpu timed its variants on 2 kinds of machine (fp32 on Intel Xeon x8 x86_64; int8_minmax on AMD "
        "EPYC x8 x86_64): latencies across them compare machines, not precisions, and no speed-up is given between "
        "them; time every variant of a backend on one kind of node"]
    assert not [n for n in plain.notes if "kinds of machine" in n]


def test_a_gated_variant_slower_than_fp32_at_every_batch_size_is_a_note():
    """fp8_e4m3 of the factory sweep runs at 0.17x / 0.15x FP32's speed: its verdict is its accuracy's, and a note
    says FP32 is the faster choice; a variant the gate does not apply to gets no such note."""
    results = make_sweep()  # its 100-row slice cannot resolve a drop of 0.02: passes with a note, not judged out
    spec = SPEC.model_copy(update={"unresolved": "note"})
    slower = [n for n in evaluate_gate(results, spec.model_copy(update={"applies_to": ["fp8_e4m3"]})).notes
              if "runs slower" in n]  # fmt: skip
    assert slower == ["fp8_e4m3@onnxruntime-cpu runs slower than fp32 at every batch size timed (0.17× at batch 1, "
                      "0.15× at batch 32): for speed, fp32 is the better choice on onnxruntime-cpu"]  # fmt: skip
    assert not [n for n in evaluate_gate(results, SPEC.model_copy(update={"applies_to": ["int8_minmax"]})).notes
                if "runs slower" in n]  # fmt: skip


def test_integer_kernels_counted_for_onnx_runtime_say_nothing_of_another_backend():
    """A ModelOpt Q/DQ graph runs no integer kernel on ONNX Runtime's CPU provider, but TensorRT runs it in INT8: the
    count is ONNX Runtime's, so its 'computes in fp32' note belongs to that backend's results only."""
    counted = {"quantized_nodes": 0, "integer_kernels_of": "onnxruntime-cpu"}
    on_ort = replace(variant("int8-q", 0.95, {"noisy": 0.90, "clean": 0.99}), params=counted)
    on_trt = replace(on_ort, backend="tensorrt")
    reference_trt = replace(REFERENCE, backend="tensorrt")
    report = evaluate_gate(sweep(REFERENCE, reference_trt, on_ort, on_trt), SPEC)
    assert [n for n in report.notes if "computes in fp32" in n] == [
        "int8-q@onnxruntime-cpu computes in fp32 (nothing in the graph was lowered to int8): its pass says nothing "
        "about int8"]


def test_a_torch_variant_whose_ops_all_ran_in_float32_gets_the_computes_in_fp32_note():
    """The torch backends count the ops that ran in the variant's type (runtime.lowered_ops): none is a variant
    named FP16 whose figures are float32's, on that backend only."""
    fp16 = replace(variant("int8-h", 0.95, {"noisy": 0.90, "clean": 0.99}), precision="fp16", backend="torch-cpu")
    reference = replace(REFERENCE, backend="torch-cpu")
    ran = replace(fp16, variant="int8-ran", params={"runtime.lowered_ops": 5})
    unlowered = replace(fp16, params={"runtime.lowered_ops": 0})
    report = evaluate_gate(sweep(REFERENCE, reference, unlowered, ran), SPEC)
    assert [n for n in report.notes if "computes in fp32" in n] == [
        "int8-h@torch-cpu computes in fp32 (nothing in the graph was lowered to fp16): its pass says nothing about "
        "fp16"]


def test_a_variant_left_as_a_float64_reference_is_noted_as_computing_in_float64():
    """A float64 graph (computes_in in the reference's params): its FP16 and INT8 variants, left as it is, were noted
    as computing in fp32."""
    reference = replace(REFERENCE, params={"computes_in": "float64"})
    same = replace(variant("int8-d", 0.95, {"noisy": 0.90, "clean": 0.99}), params={"identical_to": "fp32"})
    report = evaluate_gate(sweep(reference, same), SPEC)
    assert report.notes == ("int8-d@onnxruntime-cpu computes in float64 (nothing in the graph was lowered to int8): "
                            "its pass says nothing about int8",)


def test_a_half_precision_variant_lowering_no_contraction_gets_the_computes_in_fp32_note():
    """An FP16 graph whose MatMuls all stay FP32 inside control flow, only the condition lowered (`lowered_contractions`
    0 of `contractions` 4): its pass read as an FP16 pass. A graph with no contraction at all (elementwise) lowers its
    compute whatever it is, and a weakly typed TensorRT engine picks FP16 for the FP32 nodes itself: no note there."""
    half = replace(variant("int8-h", 0.95, {"noisy": 0.90, "clean": 0.99}), precision="fp16",
                   params={"contractions": 4, "lowered_contractions": 0})  # fmt: skip
    elementwise = replace(half, variant="int8-e", params={"contractions": 0, "lowered_contractions": 0})
    partly = replace(half, variant="int8-p", params={"contractions": 4, "lowered_contractions": 1})
    engine = replace(half, backend="tensorrt", params={**half.params, "runtime.network": "weakly typed, +FP16"})
    report = evaluate_gate(sweep(REFERENCE, replace(REFERENCE, backend="tensorrt"), half, elementwise, partly, engine),
                           SPEC)  # fmt: skip
    assert report.exit_code == EXIT_PASS
    assert [n for n in report.notes if "computes in fp32" in n] == [
        "int8-h@onnxruntime-cpu computes in fp32 (none of its 4 contractions (MatMul, Conv...) was lowered): its pass "
        "says nothing about fp16"]  # fmt: skip


def test_a_half_precision_variant_of_an_onnx_ml_predictor_gets_the_computes_in_fp32_note():
    """A LightGBM model's FP16 variant lowers onnxmltools' Mul of the scores by 1 and no contraction, for there is none:
    its trees (`fp32_predictors`) stay FP32. It was gated as an FP16 model that passed; an elementwise graph without
    a predictor still gets no note."""
    trees = replace(variant("int8-t", 0.95, {"noisy": 0.90, "clean": 0.99}), precision="fp16",
                    params={"contractions": 0, "lowered_contractions": 0, "fp32_predictors": 1})  # fmt: skip
    elementwise = replace(trees, variant="int8-e", params={"contractions": 0, "lowered_contractions": 0})
    report = evaluate_gate(sweep(REFERENCE, trees, elementwise), SPEC)
    assert report.exit_code == EXIT_PASS
    assert [n for n in report.notes if "computes in fp32" in n] == [
        "int8-t@onnxruntime-cpu computes in fp32 (no contraction in the graph, and its 1 ONNX-ML predictor(s) stay "
        "FP32): its pass says nothing about fp16"]  # fmt: skip


def test_a_half_precision_variant_rounding_what_its_fp32_predictor_reads_says_its_pass_measures_that_rounding():
    """A MinMaxScaler (Cast, Mul, Add) lowered to BF16 in front of FP32 trees (`fp32_nodes_reading_lowered`): the trees
    compare BF16-rounded features with their thresholds, and a scikit-learn pipeline's probabilities moved by up to
    0.33. The note said the variant computed in fp32 and its pass said nothing about bf16, as for a variant that
    lowers only a Mul of the trees' scores (no FP32 node reads it: that note stays)."""
    scaled = replace(variant("int8-s", 0.95, {"noisy": 0.90, "clean": 0.99}), precision="bf16",
                     params={"contractions": 0, "lowered_contractions": 0, "fp32_predictors": 1,
                             "lowered_op_types": {"Add": 1, "Cast": 1, "Mul": 1},
                             "fp32_nodes_reading_lowered": ["TreeEnsembleClassifier"]})  # fmt: skip
    scores = replace(scaled, variant="int8-m", params={**scaled.params, "lowered_op_types": {"Mul": 1},
                                                        "fp32_nodes_reading_lowered": []})  # fmt: skip
    report = evaluate_gate(sweep(REFERENCE, scaled, scores), SPEC)
    assert report.exit_code == EXIT_PASS
    assert [n for n in report.notes if "computes in fp32" in n] == [
        "int8-s@onnxruntime-cpu computes in fp32 (no contraction in the graph, and its 1 ONNX-ML predictor(s) stay "
        "FP32), but its FP32 node(s) TreeEnsembleClassifier read values it rounds to bf16 (1 Add, 1 Cast, 1 Mul "
        "lowered): its pass measures that rounding of their inputs (a value moved across a threshold), not bf16 "
        "arithmetic",
        "int8-m@onnxruntime-cpu computes in fp32 (no contraction in the graph, and its 1 ONNX-ML predictor(s) stay "
        "FP32): its pass says nothing about bf16"]  # fmt: skip


def test_a_half_precision_variant_computing_on_its_fp32_predictors_outputs_says_its_pass_measures_that_arithmetic():
    """An IsolationForest's score is arithmetic on its trees' path lengths (Sum, Div, Pow, Log...), lowered to BF16
    after the FP32 trees (`lowered_after_predictors`): its scores moved by 0.0026 and precision at FP32's threshold by
    0.0122, but the note said the variant computed in fp32 and its pass said nothing about bf16. A variant that only
    multiplies the trees' scores by 1 (lowered_after_predictors empty) keeps that note."""
    after = {"Add": 3, "Div": 1, "Log": 1, "Pow": 1}
    scored = replace(variant("int8-i", 0.95, {"noisy": 0.90, "clean": 0.99}), precision="bf16",
                     params={"contractions": 0, "lowered_contractions": 0, "fp32_predictors": 2,
                             "lowered_op_types": {**after, "Cast": 2}, "fp32_nodes_reading_lowered": [],
                             "lowered_after_predictors": after})  # fmt: skip
    scaled = replace(scored, variant="int8-m", params={**scored.params, "lowered_op_types": {"Mul": 1},
                                                       "lowered_after_predictors": {}})  # fmt: skip
    report = evaluate_gate(sweep(REFERENCE, scored, scaled), SPEC)
    assert report.exit_code == EXIT_PASS
    assert [n for n in report.notes if "ONNX-ML predictor" in n] == [
        "int8-i@onnxruntime-cpu keeps its 2 ONNX-ML predictor(s) in fp32 (no contraction in the graph), but computes "
        "on what they give in bf16 (3 Add, 1 Div, 1 Log, 1 Pow): its pass measures bf16 in that arithmetic after the "
        "predictors, not in them",
        "int8-m@onnxruntime-cpu computes in fp32 (no contraction in the graph, and its 2 ONNX-ML predictor(s) stay "
        "FP32): its pass says nothing about bf16"]  # fmt: skip


def test_a_failed_variant_gets_no_computes_in_fp32_note():
    """It ran nothing: the note claimed it computed in fp32 beside its failure."""
    failed = replace(variant("int8-f", 0.95, {"noisy": 0.90, "clean": 0.99}), params={"quantized_nodes": 0},
                     status="failed", error="cannot load", accuracy=None)  # fmt: skip
    report = evaluate_gate(sweep(REFERENCE, failed), SPEC)
    assert report.notes == () and report.exit_code == EXIT_UNUSABLE


def test_a_slice_breach_fails_even_when_overall_passes():
    report = evaluate_gate(sweep(REFERENCE, variant("int8-a", 0.945, {"noisy": 0.85, "clean": 0.99})), SPEC)
    assert report.exit_code == EXIT_BREACH
    [breach] = report.breaches
    assert (breach.scope, breach.tolerance) == ("noisy", 0.02)
    assert breach.drop == pytest.approx(0.05)


def test_every_breach_is_reported_not_just_the_first():
    results = sweep(
        REFERENCE,
        variant("int8-a", 0.90, {"noisy": 0.80, "clean": 0.99}),
        variant("int8-b", 0.93, {"noisy": 0.90, "clean": 0.90}),
    )
    report = evaluate_gate(results, SPEC)
    assert {(c.variant, c.scope) for c in report.breaches} == {
        ("int8-a", "overall"), ("int8-a", "noisy"), ("int8-b", "overall"), ("int8-b", "clean"),
    }  # fmt: skip


def test_drop_equal_to_tolerance_passes():
    """A drop equal to the tolerance is within it; no sample resolves such a pass (the drop's upper bound lies past
    it), so it counts under `gate.unresolved: note` and is unresolved (exit 2) by default, never a breach."""
    judged = sweep(REFERENCE, variant("int8-a", 0.94, {"noisy": 0.88, "clean": 0.97}))
    report = evaluate_gate(judged, SPEC.model_copy(update={"unresolved": "note"}))
    assert report.exit_code == EXIT_PASS
    assert evaluate_gate(judged, SPEC).exit_code == EXIT_UNUSABLE


def test_a_drop_equal_to_the_tolerance_passes_whatever_the_metric_scale():
    """The tolerance is the largest allowed drop. An MAE of 100000.0 against 100000.1 is a drop of 0.1 by hand, but
    0.10000000000582077 in float64 (5.8e-12 over), which an absolute slack of 1e-12 called a breach; a drop clearly
    over the tolerance at that scale still breaches."""

    def mae(name, value):
        return VariantResult(
            variant=name, backend="b", precision="int8", status="ok",
            accuracy=AccuracyResult(10, 0, SliceMetrics("overall", 10, {"mae": value})),
        )  # fmt: skip

    spec = GateSpec(metric="mae", max_drop=0.1, max_slice_drop=0.1)
    for reference, observed in ((100000.0, 100000.1), (1e6, 1e6 + 0.1), (0.2, 0.1 + 0.2)):
        report = evaluate_gate(sweep(mae("fp32", reference), mae("int8", observed)), spec)
        assert report.exit_code == EXIT_PASS, (reference, observed, report.checks)
    report = evaluate_gate(sweep(mae("fp32", 100000.0), mae("int8", 100000.1001)), spec)
    assert report.exit_code == EXIT_BREACH and report.breaches[0].drop == pytest.approx(0.1001)


def test_lower_is_better_metric_drop_is_an_increase():
    spec = GateSpec(metric="kl_mean", max_drop=0.1, max_slice_drop=0.1)

    def kl(name, value):
        return VariantResult(
            variant=name, backend="b", precision="int8", status="ok",
            accuracy=AccuracyResult(10, 0, SliceMetrics("overall", 10, {"kl_mean": value})),
        )  # fmt: skip

    assert evaluate_gate(sweep(kl("fp32", 0.0), kl("int8", 0.05)), spec).exit_code == EXIT_PASS
    report = evaluate_gate(sweep(kl("fp32", 0.0), kl("int8", 0.5)), spec)
    assert report.exit_code == EXIT_BREACH and report.breaches[0].drop == pytest.approx(0.5)


def test_small_slices_are_shown_but_skipped():
    spec = SPEC.model_copy(update={"min_slice_size": 1500})
    report = evaluate_gate(sweep(REFERENCE, variant("int8-a", 0.95, {"noisy": 0.5, "clean": 0.99})), spec)
    assert report.exit_code == EXIT_PASS
    assert {c.status for c in report.checks if c.scope != "overall"} == {"skipped"}


def test_min_slice_size_applies_before_the_nan_check():
    """A slice too small to judge may have no metric (NaN): it is skipped, not an unusable result."""
    spec = SPEC.model_copy(update={"min_slice_size": 1500})
    report = evaluate_gate(sweep(REFERENCE, variant("int8-a", 0.95, {"noisy": math.nan, "clean": 0.99})), spec)
    assert report.exit_code == EXIT_PASS and not report.problems
    noisy = next(c for c in report.checks if c.scope == "noisy")
    assert noisy.status == "skipped" and math.isnan(noisy.observed)
    judged = evaluate_gate(sweep(REFERENCE, variant("int8-a", 0.95, {"noisy": math.nan, "clean": 0.99})), SPEC)
    assert judged.exit_code == EXIT_UNUSABLE and "missing or NaN on noisy" in judged.problems[0]


@pytest.mark.parametrize(
    ("results", "problem"),
    [
        (sweep(REFERENCE, variant("int8-a", 0.95, {}, status="failed")), "variant failed: boom"),
        (sweep(REFERENCE, variant("int8-a", math.nan, {"noisy": 0.9, "clean": 0.99})), "missing or NaN on overall"),
        (sweep(REFERENCE, variant("int8-a", 0.95, {"clean": 0.99})), "slice 'noisy' missing"),
        # FP32 lacks a slice the variant has: judging only FP32's slices left the variant's 'noisy' unjudged (exit 0)
        (sweep(variant("fp32", 0.95, {"clean": 0.99}), variant("int8-a", 0.95, {"noisy": 0.5, "clean": 0.99})),
         "slice 'noisy' missing from FP32's results"),
        (sweep(variant("int8-a", 0.95, {})), "no usable FP32 reference"),
        (sweep(REFERENCE, variant("fp16", 0.95, {})), "the gate applies to no variant"),
    ],
)
def test_unusable_results_fail_closed(results, problem):
    report = evaluate_gate(results, SPEC)
    assert report.exit_code == EXIT_UNUSABLE
    assert any(problem in p for p in report.problems), report.problems


def test_expected_variant_missing_from_results_fails_closed():
    expected = [("fp32", "onnxruntime-cpu"), ("int8-a", "onnxruntime-cpu"), ("int8-b", "onnxruntime-cpu")]
    report = evaluate_gate(sweep(REFERENCE, variant("int8-a", 0.95, {"noisy": 0.9, "clean": 0.99})), SPEC,
                           expected=expected)  # fmt: skip
    assert report.exit_code == EXIT_UNUSABLE
    assert report.problems == ("int8-b@onnxruntime-cpu: no results for this variant (partial or interrupted sweep?)",)
    assert report.status_of("int8-b", "onnxruntime-cpu") == "fail"


def test_more_nonfinite_outputs_than_fp32_on_a_slice_breach_that_slice():
    def with_nonfinite(result: VariantResult, per_slice: dict[str, int]) -> VariantResult:
        accuracy = result.accuracy
        slices = tuple(replace(s, nonfinite_outputs=per_slice.get(s.name, 0)) for s in accuracy.slices)
        total = sum(per_slice.values())
        overall = replace(accuracy.overall, nonfinite_outputs=total)
        return replace(result, accuracy=replace(accuracy, nonfinite_outputs=total, overall=overall, slices=slices))

    reference = with_nonfinite(REFERENCE, {"noisy": 2})
    candidate = with_nonfinite(variant("int8-a", 0.95, {"noisy": 0.9, "clean": 0.99}), {"noisy": 2, "clean": 1})
    report = evaluate_gate(sweep(reference, candidate), SPEC)
    assert report.exit_code == EXIT_BREACH
    # 'noisy' has as many NaN/inf rows as FP32 (not a breach); 'clean' and overall have one more
    assert sorted((c.scope, c.metric, c.observed, c.drop) for c in report.breaches) == [
        ("clean", "nonfinite_outputs", 1.0, 1.0), ("overall", "nonfinite_outputs", 3.0, 1.0),
    ]  # fmt: skip


def _nonfinite(result: VariantResult, per_slice: dict[str, tuple[int, int]]) -> VariantResult:
    """`result` with (NaN/inf rows, of them rows where FP32 is finite) per slice, summed overall."""
    accuracy = result.accuracy
    slices = tuple(replace(s, nonfinite_outputs=per_slice.get(s.name, (0, 0))[0],
                           new_nonfinite_outputs=per_slice.get(s.name, (0, 0))[1])
                   for s in accuracy.slices)  # fmt: skip
    total, new = (sum(counts[i] for counts in per_slice.values()) for i in (0, 1))
    overall = replace(accuracy.overall, nonfinite_outputs=total, new_nonfinite_outputs=new)
    return replace(result, accuracy=replace(accuracy, nonfinite_outputs=total, overall=overall, slices=slices))


def test_nan_rows_where_fp32_is_finite_breach_even_when_the_variant_has_fewer_nan_rows_than_fp32():
    """FP32 NaN on 3 'noisy' rows; the variant is finite on those (clamped) but NaN on 2 others where FP32 is finite:
    fewer NaN rows than FP32, two of them its own."""
    reference = _nonfinite(REFERENCE, {"noisy": (3, 0)})
    candidate = _nonfinite(variant("int8-a", 0.95, {"noisy": 0.9, "clean": 0.99}), {"noisy": (2, 2)})
    report = evaluate_gate(sweep(reference, candidate), SPEC)
    assert report.exit_code == EXIT_BREACH
    assert sorted((c.scope, c.metric, c.drop) for c in report.breaches) == [
        ("noisy", "nonfinite_outputs", 2.0), ("overall", "nonfinite_outputs", 2.0),
    ]  # fmt: skip
    assert any("fp32@onnxruntime-cpu gives NaN/inf on 3 of" in note for note in report.notes)


def test_a_scope_where_fp32_is_nan_on_every_row_cannot_be_judged():
    """Both FP32 and the variant NaN on every 'noisy' row: equal metrics there say nothing (a PASS was seen)."""
    size = REFERENCE.accuracy.slice("noisy").size
    reference = _nonfinite(REFERENCE, {"noisy": (size, 0)})
    candidate = _nonfinite(variant("int8-a", 0.95, {"noisy": 0.9, "clean": 0.99}), {"noisy": (size, 0)})
    report = evaluate_gate(sweep(reference, candidate), SPEC)
    assert report.exit_code == EXIT_UNUSABLE
    assert report.problems == (f"int8-a@onnxruntime-cpu: FP32 gives NaN/inf on all {size} rows of noisy: nothing to "
                               "judge the variant against there",)  # fmt: skip


def test_a_nan_metric_explained_by_nonfinite_outputs_is_a_breach_not_unusable():
    candidate = variant("int8-a", 0.95, {"noisy": math.nan, "clean": 0.99})
    noisy = replace(candidate.accuracy.slices[0], nonfinite_outputs=4)
    accuracy = replace(candidate.accuracy, nonfinite_outputs=4, slices=(noisy, candidate.accuracy.slices[1]),
                       overall=replace(candidate.accuracy.overall, nonfinite_outputs=4))  # fmt: skip
    report = evaluate_gate(sweep(REFERENCE, replace(candidate, accuracy=accuracy)), SPEC)
    assert report.exit_code == EXIT_BREACH and not report.problems
    assert {(c.scope, c.metric) for c in report.breaches} == {
        ("noisy", "nonfinite_outputs"), ("noisy", "accuracy"), ("overall", "nonfinite_outputs"),
    }  # fmt: skip


UNJUDGED = ("int8-a@onnxruntime-cpu: not judged on noisy (accuracy is undefined on this scope for FP32 too): no gated "
            "metric can show a drop there, so its pass says nothing of those rows; gate also on a metric that can "
            "(gate.metrics), leave those rows out (data.evaluation.filter), "
            "or set gate.unresolved: note to let the pass count with this note")  # fmt: skip


def test_a_metric_the_data_leaves_undefined_for_fp32_too_is_not_judged_on_that_slice():
    """R² of a constant target is NaN for FP32 and the variant alike, with no NaN/inf output: that slice is a skipped
    check saying why (never a pass), and the variant's pass says nothing of its rows, so it cannot pass by that
    omission: unusable (exit 2; it passed, exit 0), or under gate.unresolved: note a pass with that note; on the
    overall scope nothing can be judged. A NaN FP32 does not share (or FP32's alone) is no such thing."""
    both = sweep(variant("fp32", 0.95, {"noisy": math.nan, "clean": 0.99}),
                 variant("int8-a", 0.95, {"noisy": math.nan, "clean": 0.99}))  # fmt: skip
    both_nan = evaluate_gate(both, SPEC)
    assert both_nan.exit_code == EXIT_UNUSABLE and both_nan.problems == (UNJUDGED,)
    noted = evaluate_gate(both, SPEC.model_copy(update={"unresolved": "note"}))
    assert noted.exit_code == EXIT_PASS and UNJUDGED in noted.notes and not noted.problems
    noisy = next(c for c in noted.checks if c.scope == "noisy")
    assert (noisy.status, noisy.reason) == ("skipped", "not judged: accuracy is undefined on this scope for FP32 too")
    # a breach elsewhere blocks the variant whatever that slice holds: the unjudged slice is then a note
    breaching = evaluate_gate(sweep(variant("fp32", 0.95, {"noisy": math.nan, "clean": 0.99}),
                                    variant("int8-a", 0.95, {"noisy": math.nan, "clean": 0.90})), SPEC)  # fmt: skip
    assert breaching.exit_code == EXIT_BREACH and UNJUDGED in breaching.notes
    overall = evaluate_gate(sweep(variant("fp32", math.nan, {"noisy": 0.9, "clean": 0.99}),
                                  variant("int8-a", math.nan, {"noisy": 0.9, "clean": 0.99})), SPEC)  # fmt: skip
    assert overall.exit_code == EXIT_UNUSABLE
    assert overall.problems[0].startswith("int8-a@onnxruntime-cpu: metric 'accuracy' is undefined on overall for FP32 "
                                          "too (NaN or inf without NaN/inf outputs")  # fmt: skip
    # a custom MAPE over zero labels is inf for FP32 (and NaN for a variant with an exact 0 there): said, not "NaN"
    mape = evaluate_gate(sweep(variant("fp32", math.inf, {"noisy": 0.9, "clean": 0.99}),
                               variant("int8-a", math.nan, {"noisy": 0.9, "clean": 0.99})), SPEC)  # fmt: skip
    assert mape.exit_code == EXIT_UNUSABLE
    assert ("(NaN or inf without NaN/inf outputs: R² of a constant target, a custom metric dividing by zero, such as "
            "a MAPE over zero labels)") in mape.problems[0]
    fp32_only = evaluate_gate(sweep(variant("fp32", 0.95, {"noisy": math.nan, "clean": 0.99}),
                                    variant("int8-a", 0.95, {"noisy": 0.9, "clean": 0.99})), SPEC)  # fmt: skip
    assert fp32_only.exit_code == EXIT_UNUSABLE and "missing or NaN on noisy" in fp32_only.problems[0]


def test_results_without_their_recipe_are_unusable(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(to_json(sweep(REFERENCE, variant("int8-a", 0.90, {"noisy": 0.9, "clean": 0.99}))))
    report, _ = run_gate(results_path=path)
    assert report.exit_code == EXIT_UNUSABLE and not report.checks
    assert report.problems == (f"{path}: recipe.resolved: missing: the results do not say what the recipe asked for",)


@pytest.mark.parametrize(
    "content", ["", "{not json", json.dumps({"schema_version": 99}), json.dumps({"schema_version": 1})]
)
def test_broken_results_files_are_errors_naming_the_file(tmp_path, content):
    path = tmp_path / "results.json"
    path.write_text(content)
    with pytest.raises(QbenchError, match="results.json"):
        run_gate(results_path=path)


def test_missing_results_file(tmp_path):
    with pytest.raises(QbenchError, match="results file not found"):
        run_gate(results_path=tmp_path / "nope.json")


def _nonfinite_fp32_problem(task: str, metric: str) -> str:
    """The gate's problem for `metric` on 4 rows of `task` outputs where FP32 gives NaN on row 3."""
    reference = np.array([[1.0, 0.2, 0.1], [0.1, 1.0, 0.3], [0.2, 0.1, 1.0], [math.nan, 0.5, 0.5]])
    outputs = reference + 0.01

    def result(name: str, values: np.ndarray) -> VariantResult:
        return VariantResult(variant=name, backend="b", precision="fp32" if name == "fp32" else "int8", status="ok",
                             accuracy=evaluate_accuracy(task, values, reference, None, {}))  # fmt: skip

    verdict = judge(result("fp32", reference), result("int8", outputs), GateSpec(metric=metric, max_drop=0.01))
    assert verdict.exit_code == EXIT_UNUSABLE
    (problem,) = verdict.problems
    return problem


@pytest.mark.parametrize(
    ("task", "metric", "suggested"),
    [("embedding", "cosine", "nn_agreement"), ("classification", "kl_mean", "accuracy, agreement, flip_rate"),
     ("multilabel", "max_abs_error", "label_agreement, row_agreement"),
     ("regression", "mae", "agreement")],
)  # fmt: skip
def test_a_metric_fp32_s_nan_rows_leave_undefined_points_to_the_task_s_metrics_that_count_them(
    task: str, metric: str, suggested: str
) -> None:
    """The hint said 'e.g. agreement or accuracy' for every task: an embedding recipe has neither. It names the
    metrics of the results that the catalogue says count such rows (defined there, so the gate can judge them)."""
    problem = _nonfinite_fp32_problem(task, metric)
    assert problem.endswith(f"FP32 itself gives NaN/inf on 1 of its 4 rows: gate on a metric that counts such "
                            f"rows: {suggested})")  # fmt: skip


def _hint_for(metric: str, values: dict[str, float]) -> str:
    """The gate's problem for `metric` where FP32 and the variant both report `values` on 4 rows, 1 of them NaN."""
    scope = SliceMetrics("overall", 4, values, nonfinite_outputs=1)
    results = [VariantResult(variant=name, backend="b", precision=precision, status="ok",
                             accuracy=AccuracyResult(rows=4, nonfinite_outputs=1, overall=scope))
               for name, precision in (("fp32", "fp32"), ("int8", "int8"))]  # fmt: skip
    (problem,) = judge(*results, GateSpec(metric=metric, max_drop=0.01)).problems
    return problem


def test_the_hint_names_metrics_of_the_gated_output_defined_there_and_never_a_custom_one() -> None:
    values = {"probabilities/kl_mean": NAN, "probabilities/agreement": 0.75, "probabilities/flip_rate": NAN,
              "label/accuracy": 0.75, "mine": 0.5}  # fmt: skip
    assert _hint_for("probabilities/kl_mean", values).endswith("counts such rows: probabilities/agreement)")
    problem = _hint_for("cosine", {"cosine": NAN, "mine": 0.5})  # a custom metric: what it counts is not known
    assert "FP32 itself gives NaN/inf on 1 of its 4 rows, and none of its metrics here counts such rows" in problem


def _two_output_model(aux_weights: np.ndarray) -> bytes:
    """x (rows, 4) → logits = x @ W and aux = x @ `aux_weights` (W is the identity): two evaluated outputs."""
    from onnx import TensorProto, helper, numpy_helper

    weights = [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w"),
               numpy_helper.from_array(aux_weights.astype(np.float32), "w_aux")]  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("MatMul", ["x", "w_aux"], ["aux"])],
        "two_outputs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 4])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["rows", 4]) for name in ("logits", "aux")], weights,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _two_output_results(aux_weights: np.ndarray, broken: slice = slice(None)) -> SweepResults:
    """FP32 (aux = logits) and an 'int8' whose aux output is computed with `aux_weights` on the `broken` rows (all by
    default), measured on the same 300 rows, with slices half=a (the first 150 rows) and half=b (the last 150)."""
    import onnxruntime as ort

    rows = np.random.default_rng(0).normal(size=(300, 4)).astype(np.float32)
    labels = rows.argmax(axis=1)
    halves = {"half=a": np.arange(300) < 150, "half=b": np.arange(300) >= 150}

    def run(model: bytes) -> dict[str, np.ndarray]:
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        return dict(zip(("logits", "aux"), session.run(["logits", "aux"], {"x": rows}), strict=True))

    reference = run(_two_output_model(np.eye(4)))
    candidate = {"logits": reference["logits"], "aux": reference["aux"].copy()}
    candidate["aux"][broken] = run(_two_output_model(aux_weights))["aux"][broken]
    accuracy = {name: evaluate_accuracy("classification", outputs, reference, labels, halves)
                for name, outputs in (("fp32", reference), ("int8-a", candidate))}  # fmt: skip
    return sweep(*(VariantResult(variant=name, backend="onnxruntime-cpu",
                                 precision="fp32" if name == "fp32" else "int8", status="ok", accuracy=accuracy[name])
                   for name in ("fp32", "int8-a")))  # fmt: skip


def test_another_evaluated_output_the_variant_broke_is_a_note_not_a_breach():
    """With gate.metric logits/accuracy, a variant that broke only its aux output passed with no word
    said: the gate still judges only the stated metric, and notes each other output's drop past its tolerance."""
    broken = np.eye(4)[[1, 0, 3, 2]]  # aux's classes swapped in pairs: every row's aux label is wrong
    results = _two_output_results(broken)
    overall = results.find("int8-a", "onnxruntime-cpu").accuracy.overall.metrics
    assert (overall["logits/accuracy"], overall["aux/accuracy"]) == (1.0, 0.0)
    spec = GateSpec(metric="logits/accuracy", applies_to=["int8-*"])
    report = evaluate_gate(results, spec)
    assert report.exit_code == EXIT_PASS
    assert [n for n in report.notes if "output aux" in n] == [
        "int8-a@onnxruntime-cpu: output aux's accuracy dropped 1.0000 > 0.01 overall (FP32 1 → 0; 3 of 3 scopes past "
        "the tolerance; not gated: gate.metric is logits/accuracy)",
        "int8-a@onnxruntime-cpu: output aux lost class 0 overall (decisions_kept: FP32 79, the variant 0; not gated: "
        "gate.metric is logits/accuracy)"]  # fmt: skip
    kl = evaluate_gate(results, GateSpec(metric="logits/kl_mean", max_drop=0.05, applies_to=["int8-*"]))
    assert [n.split(" dropped ")[0] for n in kl.notes if "output aux's" in n] == [
        "int8-a@onnxruntime-cpu: output aux's kl_mean"]
    # an aux output within the tolerance gives no note, and nor does the gated output itself
    assert not [n for n in evaluate_gate(_two_output_results(np.eye(4)), spec).notes if "output" in n]


def test_an_unjudged_output_broken_on_one_slice_alone_is_noted_on_that_slice():
    """The note compared overall figures only: a variant breaking aux on the rows of one slice (aux wrong on 10 rows of
    half=b's 150: 6.7 points there, 3.3 overall) past max_slice_drop but within max_drop overall got no note. It is
    held per scope as the gate's own checks are, naming the worst; a slice under min_slice_size is not held."""
    results = _two_output_results(np.eye(4)[[1, 0, 3, 2]], broken=slice(150, 160))
    aux = results.find("int8-a", "onnxruntime-cpu").accuracy
    overall, on_b = aux.overall.metrics["aux/accuracy"], aux.slice("half=b").metrics["aux/accuracy"]
    assert 1 - overall < 0.05 < 1 - on_b  # FP32's aux is its logits: 1 on every scope
    spec = GateSpec(metric="logits/accuracy", max_drop=0.05, max_slice_drop=0.05, applies_to=["int8-*"])
    report = evaluate_gate(results, spec)
    assert report.exit_code == EXIT_PASS
    drop_b = 1 - on_b
    assert [n for n in report.notes if "output aux" in n] == [
        f"int8-a@onnxruntime-cpu: output aux's accuracy dropped {drop_b:.4f} > 0.05 on slice half=b (FP32 1 → "
        f"{1 - drop_b:.4g}; 1 of 3 scopes past the tolerance; not gated: gate.metric is logits/accuracy)"]  # fmt: skip
    too_small = spec.model_copy(update={"min_slice_size": 151})
    assert not [n for n in evaluate_gate(results, too_small).notes if "output aux" in n]


@pytest.mark.parametrize("shared", [0, 64])
def test_a_pass_of_a_variant_calibrated_on_rows_that_judge_it_says_so(shared):
    """`data.calibration.overlap: allow` (or a calibration file copying evaluation rows): the sweep warned, but a
    standalone `qbench gate` passed the static INT8 variant with nothing said, though 64 of its 64 calibration rows
    were among the rows judging it. A dynamic variant, fitted on no row, gets no such note."""
    from qbench.results.schema import CalibrationRecord

    static = replace(variant("int8-a", 0.95, {"noisy": 0.90, "clean": 0.99}), params={"calibration_rows": 64})
    dynamic = replace(variant("int8-d", 0.95, {"noisy": 0.90, "clean": 0.99}), params={"calibration_rows": 0})
    record = CalibrationRecord(size=64, seed=0, stratify_by=None, row_ids_sha256="ab" * 32, per_slice_counts={},
                               overlap="allow", held_out_rows=0, evaluation_overlap_rows=shared)  # fmt: skip
    report = evaluate_gate(replace(sweep(REFERENCE, static, dynamic), calibration=record), SPEC)
    assert report.exit_code == EXIT_PASS
    fitted = [n for n in report.notes if "calibrated on rows that also judge it" in n]
    expected = ["int8-a@onnxruntime-cpu was calibrated on rows that also judge it (64 of its 64 calibration rows feed "
                "the model what evaluation rows feed it; data.calibration.overlap: allow): its pass may be optimistic"]
    assert fitted == (expected if shared else [])
