"""The gate's tolerances resolved against FP32's figure: defaults relative for a metric in the data's units."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from qbench.errors import QbenchError
from qbench.frontier.pareto import gate_threshold
from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, EXIT_UNUSABLE, judge
from qbench.gate.tolerance import reference_tolerances, resolve_tolerances
from qbench.recipe.spec import GateSpec
from qbench.results.schema import SweepResults, VariantResult
from qbench.validate.accuracy import evaluate_accuracy
from qbench.validate.catalogue import METRICS

# 8 rows, two slices of 4: every row's prediction misses its target by the same amount, so each scope's MAE is it
HALVES = {"even": np.arange(8) % 2 == 0, "odd": np.arange(8) % 2 == 1}


def _regression(name: str, targets: np.ndarray, miss: float, reference: np.ndarray | None = None) -> VariantResult:
    outputs = (targets + miss).reshape(-1, 1)
    accuracy = evaluate_accuracy("regression", outputs, outputs if reference is None else reference, targets, HALVES)
    return VariantResult(variant=name, backend="onnxruntime-cpu", precision="fp32" if name == "fp32" else "int8",
                         status="ok", accuracy=accuracy)  # fmt: skip


def _pair(targets: np.ndarray, fp32_miss: float, variant_miss: float) -> tuple[VariantResult, VariantResult]:
    fp32 = _regression("fp32", targets, fp32_miss)
    return fp32, _regression("int8", targets, variant_miss, reference=(targets + fp32_miss).reshape(-1, 1))


TINY = np.array([1, 2, 3, 4, 5, 6, 7, 8], dtype=np.float64) * 1e-4  # an outlier score, a probability-like target
LARGE = np.array([38, 39, 40, 41, 42, 43, 44, 45], dtype=np.float64)  # diabetes-like: MAE in the tens


def test_a_tiny_target_whose_mae_doubles_breaches_under_the_default_tolerance():
    """FP32 misses every target by 1e-5 (MAE 1e-5), the variant by 2e-5: its MAE doubles. Read as an absolute 0.01
    the default passed it; as 1 % of FP32's MAE (1e-7) it breaches, overall and on both slices (2 % = 2e-7)."""
    fp32, int8 = _pair(TINY, 1e-5, 2e-5)
    report = judge(fp32, int8, GateSpec(metric="mae"))
    assert report.exit_code == EXIT_BREACH
    by_scope = {c.scope: c for c in report.checks}
    assert by_scope["overall"].tolerance == pytest.approx(1e-7)
    assert by_scope["even"].tolerance == by_scope["odd"].tolerance == pytest.approx(2e-7)
    assert all(c.status == "breach" for c in report.checks) and len(report.checks) == 3
    assert report.notes[0] == ("tolerances on onnxruntime-cpu: max_drop 1e-07 = 1 % of FP32's mae 1e-05, "
                               "max_slice_drop 2 % of FP32's mae on each slice")  # fmt: skip


def test_a_target_in_1e_12_units_whose_mae_doubles_breaches():
    """Targets of 1e-12..8e-12 (a capacitance in farads): FP32 misses each by 1e-13, the variant by 2e-13. The
    relative default allows 1e-15 overall; the gate's rounding slack was floored at 1e-12 and passed the doubling."""
    fp32, int8 = _pair(TINY * 1e-8, 1e-13, 2e-13)
    report = judge(fp32, int8, GateSpec(metric="mae"))
    assert report.exit_code == EXIT_BREACH
    overall = next(c for c in report.checks if c.scope == "overall")
    assert (overall.drop, overall.tolerance) == (pytest.approx(1e-13), pytest.approx(1e-15))
    assert all(c.status == "breach" for c in report.checks) and len(report.checks) == 3


def test_a_large_target_with_a_small_mae_drop_passes_under_the_default_tolerance():
    """FP32 misses every target of ~40 by 4 (MAE 4), the variant by 4.02: a drop of 0.02, which breached an absolute
    0.01 and is within 1 % of 4 (0.04; slices 0.08)."""
    fp32, int8 = _pair(LARGE, 4.0, 4.02)
    report = judge(fp32, int8, GateSpec(metric="mae"))
    assert report.exit_code == EXIT_PASS, report
    overall = next(c for c in report.checks if c.scope == "overall")
    assert (overall.drop, overall.tolerance) == (pytest.approx(0.02), pytest.approx(0.04))
    assert "max_drop 0.04 = 1 % of FP32's mae 4" in report.notes[0]


def test_a_stated_tolerance_stays_absolute_and_relative_can_be_asked_for():
    fp32, int8 = _pair(LARGE, 4.0, 4.02)
    stated = judge(fp32, int8, GateSpec(metric="mae", max_drop=0.01, max_slice_drop=0.02))
    # 0.02 > 0.01 in the metric's own units; the one note: FP32, 4 off targets spread over 7, is worse than their mean
    assert stated.exit_code == EXIT_BREACH and [n for n in stated.notes if "worse than their mean" not in n] == []
    assert {c.tolerance for c in stated.checks} == {0.01, 0.02}
    relative = judge(fp32, int8, GateSpec(metric="mae", max_drop=0.004, max_slice_drop=0.004, tolerance="relative"))
    assert relative.exit_code == EXIT_BREACH  # 0.4 % of 4 = 0.016 < 0.02
    assert [c.tolerance for c in relative.checks] == [pytest.approx(0.016)] * 3
    absolute = judge(*_pair(TINY, 1e-5, 2e-5), GateSpec(metric="mae", tolerance="absolute"))
    assert absolute.exit_code == EXIT_PASS  # the defaults read as absolute drops, as asked


def test_a_rate_keeps_its_absolute_default():
    assert not METRICS["accuracy"].data_units and METRICS["mae"].data_units and METRICS["max_abs_error"].data_units
    assert resolve_tolerances(GateSpec(metric="accuracy"), 0.5) == resolve_tolerances(GateSpec(metric="accuracy"), 0.9)
    assert resolve_tolerances(GateSpec(metric="accuracy"), 0.5).max_drop == 0.01


@pytest.mark.parametrize("reference", [0.0, float("nan"), float("inf")])
def test_a_relative_default_of_nothing_fails_closed_asking_for_a_tolerance(reference):
    with pytest.raises(QbenchError, match="FP32's overall mae is .*: no relative tolerance can be formed; expected "
                                          "gate.max_drop and gate.max_slice_drop set"):  # fmt: skip
        resolve_tolerances(GateSpec(metric="mae"), reference)


def test_a_metric_fp32_scores_zero_on_itself_needs_an_explicit_tolerance():
    """Without labels MAE is against FP32's outputs, so FP32's own is 0 (max_abs_error always is): no default can be
    formed, the gate exits 2 naming the fields, never a pass, while a NaN output still breaches."""
    targets = TINY.reshape(-1, 1)
    fp32 = VariantResult("fp32", "b", "fp32", "ok",
                         accuracy=evaluate_accuracy("regression", targets, targets, None, {}))  # fmt: skip
    worse = targets * 3
    worse[0, 0] = np.nan
    int8 = VariantResult("int8", "b", "int8", "ok", accuracy=evaluate_accuracy("regression", worse, targets, None, {}))
    report = judge(fp32, int8, GateSpec(metric="mae"))
    assert report.exit_code == EXIT_UNUSABLE
    # outputs 3x FP32's keep none of its fit (fit_kept needs no tolerance): a breach beside the unusable figure
    assert [(c.metric, c.status) for c in report.checks] == [("nonfinite_outputs", "breach"), ("fit_kept", "breach")]
    assert report.problems == ("int8@b: gate.max_drop and gate.max_slice_drop are not set and mae is in the data's "
                               "units, so their defaults are shares of FP32's figure, but FP32's overall mae is 0: no "
                               "relative tolerance can be formed; expected gate.max_drop and gate.max_slice_drop set "
                               "to drops in mae's own units (and gate.tolerance not relative)",)  # fmt: skip
    stated = judge(fp32, int8, GateSpec(metric="max_abs_error", max_drop=0.0))
    assert stated.exit_code == EXIT_BREACH


def test_the_frontier_threshold_and_the_search_judge_with_the_resolved_tolerance():
    fp32, int8 = _pair(LARGE, 4.0, 4.02)
    results = SweepResults(qbench_version="0", created_at="", recipe={}, environment={}, calibration=None,
                           evaluation_rows=8, gate_metric="mae", reference="fp32", variants=(fp32, int8))  # fmt: skip
    assert gate_threshold(results, GateSpec(metric="mae")) == pytest.approx(4.04)
    fixed = reference_tolerances(fp32, GateSpec(metric="mae"))
    assert fixed.max_drop == pytest.approx(0.04)
    assert (fixed.on_slice("even"), fixed.on_slice("odd")) == (pytest.approx(0.08),) * 2
    # judged against another FP32 figure (the search's screening rows), the resolved tolerance stays what it was
    assert judge(*_pair(LARGE, 1.0, 1.03), GateSpec(metric="mae"), fixed).exit_code == EXIT_PASS
    assert judge(*_pair(LARGE, 1.0, 1.03), GateSpec(metric="mae")).exit_code == EXIT_BREACH


def test_mlflow_params_record_the_tolerances_as_judged():
    from qbench.track.content import _tolerance_params

    fp32, int8 = _pair(LARGE, 4.0, 4.02)
    results = SweepResults(qbench_version="0", created_at="", recipe={}, environment={}, calibration=None,
                           evaluation_rows=8, gate_metric="mae", reference="fp32", variants=(fp32, int8))  # fmt: skip
    assert _tolerance_params(results, GateSpec(metric="mae")) == {
        "gate.max_drop": "0.04", "gate.max_slice_drop": "2 % of FP32's figure on each slice",
        "gate.tolerance": "max_drop 0.04 = 1 % of FP32's mae 4, max_slice_drop 2 % of FP32's mae on each slice"}
    assert _tolerance_params(results, GateSpec(metric="mae", max_drop=0.5))["gate.tolerance"] == "absolute"
    # logged (`qbench track`) by a recipe gating mae where the sweep gated agreement (the gate section leaves results
    # current): 1 % of FP32's mae 4, not of its agreement 1 (0.01)
    swept_on_agreement = replace(results, gate_metric="agreement")
    assert _tolerance_params(swept_on_agreement, GateSpec(metric="mae"))["gate.max_drop"] == "0.04"


def test_a_sweep_says_at_fp32_that_its_gate_cannot_form_relative_tolerances(caplog):
    """Without labels FP32's MAE against itself is 0: no share of it is a tolerance. The gate exits 2 on the results;
    the sweep says so as soon as FP32 is measured, not after every variant."""
    from types import SimpleNamespace

    from qbench.sweep.runner import _check_reference_accuracy

    fp32 = _regression("fp32", TINY, 0.0)  # its MAE against its own outputs (as without labels): 0
    recipe = SimpleNamespace(gate=GateSpec(metric="mae"), task="regression")
    with caplog.at_level("WARNING", logger="qbench.sweep.runner"):
        _check_reference_accuracy(SimpleNamespace(recipe=recipe, labels=None), fp32)
    [record] = [r for r in caplog.records if "cannot judge" in r.getMessage()]
    assert "FP32's overall mae is 0: no relative tolerance can be formed" in record.getMessage()
    caplog.clear()
    recipe.gate = GateSpec(metric="mae", max_drop=0.001, max_slice_drop=0.002)  # stated: absolute
    with caplog.at_level("WARNING", logger="qbench.sweep.runner"):
        _check_reference_accuracy(SimpleNamespace(recipe=recipe, labels=None), fp32)
    assert not [r for r in caplog.records if "cannot judge" in r.getMessage()]
    # the same MAE as the second of gate.metrics (its defaults relative): said as early as for gate.metric
    recipe.gate = GateSpec.model_validate({"metrics": [{"metric": "agreement", "max_drop": 0.01}, "mae"]})
    with caplog.at_level("WARNING", logger="qbench.sweep.runner"):
        _check_reference_accuracy(SimpleNamespace(recipe=recipe, labels=None), fp32)
    [record] = [r for r in caplog.records if "cannot judge" in r.getMessage()]
    assert "FP32's overall mae is 0: no relative tolerance can be formed" in record.getMessage()


def _misses(name: str, misses: np.ndarray, reference: np.ndarray | None = None) -> VariantResult:
    """A regression result on LARGE whose row i misses its target by misses[i]."""
    outputs = (LARGE + misses).reshape(-1, 1)
    accuracy = evaluate_accuracy("regression", outputs, outputs if reference is None else reference, LARGE, HALVES)
    return VariantResult(variant=name, backend="b", precision="fp32" if name == "fp32" else "int8", status="ok",
                         accuracy=accuracy)  # fmt: skip


def test_a_relative_slice_tolerance_is_a_share_of_fp32s_figure_on_that_slice():
    """FP32 misses the even rows by 0.1 and the odd ones by 1.9 (overall MAE 1.0); the variant by 0.115 and 1.93.
    A share of FP32's overall figure allowed 0.02 on each slice: the even slice, 15 % worse than FP32 there, passed
    and the odd one, 1.6 % worse, breached. 2 % of each slice's own FP32 MAE judges them the other way round."""
    fp32_misses = np.where(HALVES["even"], 0.1, 1.9)
    variant_misses = np.where(HALVES["even"], 0.115, 1.93)
    fp32 = _misses("fp32", fp32_misses)
    int8 = _misses("int8", variant_misses, reference=(LARGE + fp32_misses).reshape(-1, 1))
    gate = GateSpec(metric="mae", max_drop=0.05, max_slice_drop=0.02, tolerance="relative")
    report = judge(fp32, int8, gate)
    by_scope = {c.scope: c for c in report.checks}
    for name, mask in HALVES.items():  # by hand: 2 % of FP32's MAE on the slice's own rows
        tolerance = 0.02 * np.abs(fp32_misses[mask]).mean()
        drop = np.abs(variant_misses[mask]).mean() - np.abs(fp32_misses[mask]).mean()
        assert by_scope[name].tolerance == pytest.approx(tolerance)
        assert by_scope[name].status == ("pass" if drop <= tolerance else "breach")
    assert (by_scope["even"].status, by_scope["odd"].status, by_scope["overall"].status) == ("breach", "pass", "pass")
    assert report.exit_code == EXIT_BREACH


def test_a_relative_slice_tolerance_of_nothing_fails_closed_unless_the_slice_is_not_judged():
    """FP32 hits the even rows exactly (MAE 0 there, 0.5 overall): no share of 0 is a tolerance on that slice, so the
    gate exits 2 naming the slice and the fields, where a tolerance of 0 failed or passed it silently."""
    fp32_misses = np.where(HALVES["even"], 0.0, 1.0)
    fp32 = _misses("fp32", fp32_misses)
    int8 = _misses("int8", fp32_misses, reference=(LARGE + fp32_misses).reshape(-1, 1))
    report = judge(fp32, int8, GateSpec(metric="mae"))
    assert report.exit_code == EXIT_UNUSABLE
    assert "FP32's mae on slice 'even' is 0: no relative tolerance can be formed; expected gate.max_drop and " \
           "gate.max_slice_drop set" in report.problems[0]
    assert judge(fp32, int8, GateSpec(metric="mae", min_slice_size=5)).exit_code == EXIT_PASS  # slices of 4: unjudged


@pytest.mark.parametrize("data_units", [False, True])
def test_a_recipes_own_metric_declares_its_units_and_the_gate_says_which_tolerance_applied(data_units):
    """A recipe's own error metric: FP32 100 overall, 10 on a slice; the variant 100.5 and 10.1. Undeclared, the
    absolute defaults (0.01, 0.02) apply and the gate's note says so; with `data_units: true` the defaults are 1 % of
    100 overall and 2 % of 10 on the slice, as for mae."""
    from qbench.gate.evaluate import evaluate_gate
    from qbench.results.schema import AccuracyResult, SliceMetrics

    def result(name: str, overall: float, on_slice: float) -> VariantResult:
        scopes = [SliceMetrics(scope, 8 if scope == "overall" else 4, {"err": value})
                  for scope, value in (("overall", overall), ("small", on_slice))]  # fmt: skip
        return VariantResult(name, "b", "fp32" if name == "fp32" else "int8", "ok",
                             accuracy=AccuracyResult(8, 0, scopes[0], (scopes[1],)))  # fmt: skip

    metric = {"name": "err", "function": "m:err", "higher_is_better": False, "data_units": data_units}
    results = SweepResults(qbench_version="0", created_at="", recipe={"resolved": {"metrics": [metric]}},
                           environment={}, calibration=None, evaluation_rows=8, gate_metric="err", reference="fp32",
                           variants=(result("fp32", 100.0, 10.0), result("int8", 100.5, 10.1)))  # fmt: skip
    report = evaluate_gate(results, GateSpec(metric="err"))
    tolerances = {c.scope: c.tolerance for c in report.checks}
    if data_units:
        assert tolerances == {"overall": pytest.approx(1.0), "small": pytest.approx(0.2)}
        assert report.exit_code == EXIT_PASS
        assert report.notes == ("tolerances on b: max_drop 1 = 1 % of FP32's err 100, max_slice_drop 2 % of FP32's err "
                                "on each slice",)  # fmt: skip
    else:
        assert tolerances == {"overall": 0.01, "small": 0.02} and report.exit_code == EXIT_BREACH
        assert report.notes[0].startswith("tolerances: the defaults, max_drop 0.01 and max_slice_drop 0.02, as "
                                          "drops in err's own units (a recipe's own metric: set data_units: "
                                          "true")  # fmt: skip


def _classified(name: str, decisions: np.ndarray, reference: np.ndarray, labels: np.ndarray) -> VariantResult:
    scores = np.stack([1.0 - decisions, decisions], axis=1).astype(np.float32)
    ref_scores = np.stack([1.0 - reference, reference], axis=1).astype(np.float32)
    accuracy = evaluate_accuracy("classification", scores, ref_scores, labels.astype(np.int64), {})
    return VariantResult(variant=name, backend="onnxruntime-cpu", precision="fp32" if name == "fp32" else "fp16",
                         status="ok", accuracy=accuracy)  # fmt: skip


def test_a_tolerance_of_the_metrics_whole_range_is_said_to_let_nothing_breach():
    """The probe: `max_drop: 1` written as 1 % passed an FP16 variant whose accuracy fell from 1.0 to 0.776 with no word
    said. A drop of accuracy is at most 1, so such a tolerance can breach nothing: a note says so and suggests the
    fraction (a note, not an error: a recipe may leave the verdict to its SLO on purpose). 0.5 and the relative
    defaults of a metric in the data's units get no such note."""
    labels = np.tile([0, 1], 500)
    variant = labels.copy()
    variant[:224] = 1 - variant[:224]
    fp32, fp16 = _classified("fp32", labels, labels, labels), _classified("fp16", variant, labels, labels)
    report = judge(fp32, fp16, GateSpec(metric="accuracy", max_drop=1, max_slice_drop=2))
    assert report.exit_code == EXIT_PASS and report.checks[0].drop == pytest.approx(0.224)
    assert [n for n in report.notes if "whole range" in n] == [
        "tolerances: gate.max_drop 1 is accuracy's whole range (0..1) or more, so no drop of it can breach overall (a "
        "tolerance in percent? 1 % is 0.01)",
        "tolerances: gate.max_slice_drop 2 is accuracy's whole range (0..1) or more, so no drop of it can breach on a "
        "slice (a tolerance in percent? 2 % is 0.02)"]  # fmt: skip
    assert not [n for n in judge(fp32, fp16, GateSpec(metric="accuracy", max_drop=0.5)).notes if "whole range" in n]
    assert judge(fp32, fp16, GateSpec(metric="accuracy", max_drop=0.5)).exit_code == EXIT_PASS
    relative = GateSpec(metric="accuracy", max_drop=1, tolerance="relative")
    assert not [n for n in judge(fp32, fp16, relative).notes if "whole range" in n]


def test_a_tolerance_of_all_fp32_s_figure_can_lose_is_said_to_let_nothing_breach_there():
    """The probe: `max_drop: 0.5` written as 0.5 % on a model whose FP32 accuracy is 0.45 passed an FP16 variant
    scoring 0.05 with no word said: 0.5 is under accuracy's whole range, but over all FP32's figure can drop. A note
    says so per backend, overall and for max_slice_drop on the slices whose FP32 figure it covers (hard: 0.1 against
    0.2; easy's 0.8 is not); 0.4 overall, below FP32's 0.45, gets none."""
    labels = np.tile([0, 1], 500)
    hard = np.arange(1000) < 500
    reference = labels.copy()
    reference[:450] = 1 - reference[:450]  # hard: 0.1 right; easy: 0.8 (100 of 500 wrong); overall 0.45
    reference[500:600] = 1 - reference[500:600]
    variant = labels.copy()
    variant[:950] = 1 - variant[:950]  # 0.05 overall

    def result(name: str, decisions: np.ndarray) -> VariantResult:
        scores = np.stack([1.0 - decisions, decisions], axis=1).astype(np.float32)
        ref_scores = np.stack([1.0 - reference, reference], axis=1).astype(np.float32)
        accuracy = evaluate_accuracy("classification", scores, ref_scores, labels, {"hard": hard, "easy": ~hard})
        return VariantResult(variant=name, backend="onnxruntime-cpu", precision="fp32" if name == "fp32" else "fp16",
                             status="ok", accuracy=accuracy)  # fmt: skip

    fp32, fp16 = result("fp32", reference), result("fp16", variant)
    report = judge(fp32, fp16, GateSpec(metric="accuracy", max_drop=0.5, max_slice_drop=0.2, unresolved="note"))
    overall = next(c for c in report.checks if c.scope == "overall")
    assert (overall.reference, overall.observed, overall.status) == (pytest.approx(0.45), pytest.approx(0.05), "pass")
    assert [n for n in report.notes if "at worst" in n] == [
        "tolerances on onnxruntime-cpu: gate.max_drop 0.5 is at least the most accuracy can drop from FP32's figure "
        "overall (0.45), to 0 at worst, so no drop of it can breach there",
        "tolerances on onnxruntime-cpu: gate.max_slice_drop 0.2 is at least the most accuracy can drop from FP32's "
        "figure on slice hard (0.1), to 0 at worst, so no drop of it can breach there"]  # fmt: skip
    assert not [n for n in judge(fp32, fp16, GateSpec(metric="accuracy", max_drop=0.4)).notes if "at worst" in n]


def test_labels_fp32_predicts_worse_than_their_mean_are_noted_on_a_label_based_gate():
    """The probe: regression labels in other units (x100 + 1000) left FP32's R² at -55 and a variant's changes, far
    smaller than FP32's own errors, invisible to MAE or R² against them: the gate passed with no word said. A note now
    says so and points at data.label or agreement; the same outputs against labels in their own units get none."""
    rng = np.random.default_rng(0)
    truth = rng.normal(40.0, 3.0, size=200)
    fp32_out = (truth + rng.normal(0, 0.5, size=200)).reshape(-1, 1)
    int8_out = fp32_out + rng.normal(0, 0.2, size=(200, 1))

    def pair(labels: np.ndarray) -> tuple[VariantResult, VariantResult]:
        return tuple(VariantResult(variant=name, backend="onnxruntime-cpu", precision=precision, status="ok",
                                   accuracy=evaluate_accuracy("regression", out, fp32_out, labels, {}))
                     for name, precision, out in (("fp32", "fp32", fp32_out), ("int8", "int8", int8_out)))  # fmt: skip

    shifted = pair(truth * 100 + 1000)
    assert shifted[0].accuracy.overall.metrics["r2"] < 0
    report = judge(*shifted, GateSpec(metric="mae"))
    [note] = [n for n in report.notes if "worse than their mean" in n]
    assert note.startswith(f"fp32@onnxruntime-cpu predicts the labels worse than their mean does (R² "
                           f"{shifted[0].accuracy.overall.metrics['r2']:.4g} over every evaluation row)")
    assert "check data.label, or gate on agreement" in note
    assert not [n for n in judge(*pair(truth), GateSpec(metric="mae")).notes if "worse than their mean" in n]
    assert not [n for n in judge(*shifted, GateSpec(metric="agreement")).notes if "worse than their mean" in n]
