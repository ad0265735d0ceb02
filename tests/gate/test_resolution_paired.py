"""The resolution rule on a regression metric: a pass on mae, rmse or r2 rests on the paired interval of its drop."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from qbench.gate.evaluate import EXIT_PASS, EXIT_UNUSABLE, evaluate_gate
from qbench.recipe.spec import GateSpec
from qbench.results.schema import AccuracyResult, SweepResults, VariantResult
from qbench.validate.accuracy import evaluate_accuracy, with_drops

ROWS = 300


def _rows(seed: int, worse: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels, FP32's outputs, a variant's): FP32's errors N(0, 1), the variant adding N(0, s) so that its
    population MAE is (1 + worse) x FP32's (bench/gate_calibration.py's regression case)."""
    rng = np.random.default_rng(seed)
    labels = rng.normal(scale=5.0, size=ROWS)
    reference = labels + rng.normal(size=ROWS)
    return labels, reference, reference + rng.normal(scale=math.sqrt((1 + worse) ** 2 - 1), size=ROWS)


def _results(labels: np.ndarray, reference: np.ndarray, outputs: np.ndarray) -> SweepResults:
    fp32 = evaluate_accuracy("regression", reference, reference, labels, {})
    own = with_drops(evaluate_accuracy("regression", outputs, reference, labels, {}), fp32)
    variants = tuple(VariantResult(variant=name, backend="cpu", precision=name, status="ok", accuracy=accuracy)
                     for name, accuracy in (("fp32", fp32), ("int8", own)))  # fmt: skip
    return SweepResults(qbench_version="0", created_at="", recipe={"task": "regression"}, environment={},
                        calibration=None, evaluation_rows=ROWS, gate_metric="mae", reference="fp32",
                        variants=variants)  # fmt: skip


def _edited(results: SweepResults, **overall) -> SweepResults:
    """`results` with the variant's overall scope's fields replaced."""
    fp32, int8 = results.variants
    accuracy: AccuracyResult = int8.accuracy
    edited = dataclasses.replace(accuracy, overall=dataclasses.replace(accuracy.overall, **overall))
    return dataclasses.replace(results, variants=(fp32, dataclasses.replace(int8, accuracy=edited)))


def test_a_variant_past_the_mae_tolerance_whose_drop_fell_within_it_is_unresolved_not_passed():
    """The variant's population MAE is 1.5 x the default tolerance (1 % of FP32's MAE) worse; on these 300 rows its
    MAE drop 0.005846 fell within the tolerance 0.007977, and two rows sufficed: exit 0 (32 % of such 300-row
    sweeps). The paired interval of the drop reaches 0.025406, so the pass is unresolved (exit 2), with the rows it
    would take at this spread: 300 x ((0.0254056 - 0.0058460) / (0.0079772 - 0.0058460))^2 = 25,269."""
    results = _results(*_rows(20, 0.015))
    overall = results.variants[1].accuracy.overall
    drop, (low, high) = overall.drops["mae"], overall.drop_intervals["mae"]
    assert (round(drop, 6), round(low, 6), round(high, 6)) == (0.005846, -0.013714, 0.025406)
    report = evaluate_gate(results, GateSpec(metric="mae"))
    assert report.exit_code == EXIT_UNUSABLE
    tolerance = 0.01 * results.variants[0].accuracy.overall.metrics["mae"]
    needed = math.ceil(ROWS * ((high - drop) / (tolerance - drop)) ** 2)
    assert needed == 25269
    assert report.problems == ("int8@cpu: too few rows to resolve the tolerance: overall mae on 300 rows: the 95% "
                               "interval of the drop reaches 0.02541 > tolerance 0.00797724; about 25269 rows would "
                               "resolve it at this spread",)  # fmt: skip


@pytest.mark.parametrize(("metric", "code"), [("rmse", EXIT_UNUSABLE), ("r2", EXIT_PASS)])
def test_rmse_and_r2_are_judged_on_their_own_paired_interval(metric, code):
    """The same rows: rmse's drop 0.00915 is within its default tolerance 0.0102 but its interval reaches 0.0292
    (unresolved: about 300 x ((0.02918 - 0.00915) / (0.01017 - 0.00915))^2 rows would resolve it); r2's drop 0.00072
    has an interval reaching 0.0023, within the default max_drop 0.01 (resolved)."""
    report = evaluate_gate(_results(*_rows(20, 0.015)), GateSpec(metric=metric))
    assert report.exit_code == code
    assert [p for p in report.problems if "interval of the drop reaches" in p] == (
        ["int8@cpu: too few rows to resolve the tolerance: overall rmse on 300 rows: the 95% interval of the drop "
         "reaches 0.02918 > tolerance 0.0101677; about 115389 rows would resolve it at this spread"]
        if code == EXIT_UNUSABLE else [])  # fmt: skip


def test_an_honest_variant_still_passes_on_the_same_rows():
    """Rounding noise (sd 0.001) on the same 300 rows: a drop interval far inside the tolerance, a resolved pass."""
    labels, reference, _ = _rows(20, 0.015)
    outputs = reference + np.random.default_rng(1).normal(scale=0.001, size=ROWS)
    report = evaluate_gate(_results(labels, reference, outputs), GateSpec(metric="mae"))
    assert (report.exit_code, report.problems) == (EXIT_PASS, ())


@pytest.mark.parametrize(("edit", "problem"), [
    ({"drop_intervals": {}}, "overall: only FP32's results record a drop interval of 'mae'"),
    ({"drop_intervals": {"mae": (-0.01, 0.005)}}, "overall: the variant's drop of mae 0.005846 lies outside the "
     "interval its drop intervals and FP32's make, [-0.01, 0.005]"),
    ({"drop_intervals": {"mae": (math.nan, math.nan)}}, "overall: the variant's drop of mae 0.005846 lies outside "
     "the interval its drop intervals and FP32's make, [nan, nan]"),
], ids=["removed", "below-its-drop", "nan"])  # fmt: skip
def test_a_drop_interval_the_sweep_cannot_have_written_is_unusable(edit, problem):
    """The variant's mae drop interval removed, moved to end below its drop (0.005, within the tolerance 0.008: the
    pass would resolve) or made NaN: results no qbench wrote, exit 2, whatever the resolution rule would say."""
    results = _results(*_rows(20, 0.015))
    intervals = dict(results.variants[1].accuracy.overall.drop_intervals)
    edit = {"drop_intervals": {k: v for k, v in intervals.items() if k != "mae"} | edit["drop_intervals"]}
    report = evaluate_gate(_edited(results, **edit), GateSpec(metric="mae"))
    assert report.exit_code == EXIT_UNUSABLE
    assert f"int8@cpu: {problem}: written by another qbench, or edited" in report.problems


def test_fp32_on_another_backend_takes_its_own_drop_from_the_variant_s():
    """The sweep pairs every result with FP32 on its first backend; on another, FP32 differs from it by its rounding,
    so the variant's drop from that FP32 lies between the two drop intervals, bound against bound. Here FP32 there
    is rounded by sd 0.01: the variant's drop from it, -5.4e-05, lies outside the variant's own interval [-1.4e-05,
    1.95e-04] (read alone, these results would be refused as edited) and within the two's, [-1.3e-03, 1.2e-03]."""
    labels, reference, _ = _rows(20, 0.015)
    rounded = reference + np.random.default_rng(2).normal(scale=0.01, size=ROWS)
    outputs = reference + np.random.default_rng(1).normal(scale=0.001, size=ROWS)
    first = evaluate_accuracy("regression", reference, reference, labels, {})
    fp32 = with_drops(evaluate_accuracy("regression", rounded, reference, labels, {}), first)
    own = with_drops(evaluate_accuracy("regression", outputs, reference, labels, {}), fp32)
    assert fp32.overall.drop_intervals["mae"] != (0.0, 0.0)
    variants = tuple(VariantResult(variant=name, backend="gpu", precision=name, status="ok", accuracy=accuracy)
                     for name, accuracy in (("fp32", fp32), ("int8", own)))  # fmt: skip
    results = SweepResults(qbench_version="0", created_at="", recipe={"task": "regression"}, environment={},
                           calibration=None, evaluation_rows=ROWS, gate_metric="mae", reference="fp32",
                           variants=variants)  # fmt: skip
    report = evaluate_gate(results, GateSpec(metric="mae"))
    assert (report.exit_code, report.problems) == (EXIT_PASS, ())



@pytest.mark.parametrize(("metric", "worse", "seed", "reaches"), [("rmse", 0.015, 24, "0.01887 > tolerance 0.0101064"),
                                                                  ("r2_min", 0.1726, 31, "0.0148 > tolerance 0.01")])
def test_several_targets_judge_rmse_and_r2_min_on_a_paired_interval_not_two_rows(metric, worse, seed, reaches):
    """Two targets, each rows as above (the second drawn with its own seed), the variant past the tolerance on both:
    rmse 1.5x the default (1 % of FP32's), r2_min about 1.5x the max_drop 0.01 (errors' variance 1.375x FP32's
    against labels of variance 25). With several targets neither recorded a drop interval, so each drop within the
    tolerance (rmse 0.00535, r2_min 0.00508) passed on two rows (exit 0). Now rmse's per-row interval and r2_min's
    (0.02024 at both targets' r2 intervals; 0.0148 where FP32's worst target's R² less the other's for the variant
    bounds it too, every interval at 1 - 5 % / 3) reach past it: unresolved, exit 2."""
    first, second = _rows(20, worse), _rows(seed, worse)
    labels, reference, outputs = (np.stack([a, b], axis=1) for a, b in zip(first, second, strict=True))
    report = evaluate_gate(_results(labels, reference, outputs), GateSpec(metric=metric))
    assert report.exit_code == EXIT_UNUSABLE
    assert [p.split(": the 95% interval of the drop reaches ")[-1].split(";")[0] for p in report.problems] == [reaches]
