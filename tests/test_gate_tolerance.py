"""The gate's tolerances resolved against FP32's figure: defaults relative for a metric in the data's units."""

from __future__ import annotations

import numpy as np
import pytest

from qbench.errors import QbenchError
from qbench.frontier import gate_threshold
from qbench.gate import EXIT_BREACH, EXIT_PASS, EXIT_UNUSABLE, judge
from qbench.gate_tolerance import as_absolute, resolve_tolerances
from qbench.recipe import GateSpec
from qbench.results import SweepResults, VariantResult
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
                               "max_slice_drop 2e-07 = 2 % of it")  # fmt: skip


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
    assert stated.exit_code == EXIT_BREACH and not stated.notes  # 0.02 > 0.01 in the metric's own units
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
    fp32 = VariantResult("fp32", "b", "fp32", "ok", accuracy=evaluate_accuracy("regression", targets, targets, None, {}))
    worse = targets * 3
    worse[0, 0] = np.nan
    int8 = VariantResult("int8", "b", "int8", "ok", accuracy=evaluate_accuracy("regression", worse, targets, None, {}))
    report = judge(fp32, int8, GateSpec(metric="mae"))
    assert report.exit_code == EXIT_UNUSABLE
    assert [c.metric for c in report.checks] == ["nonfinite_outputs"]
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
    fixed = as_absolute(GateSpec(metric="mae"), resolve_tolerances(GateSpec(metric="mae"), 4.0))
    assert (fixed.max_drop, fixed.max_slice_drop, fixed.tolerance) == (pytest.approx(0.04), pytest.approx(0.08), "absolute")
    # judged against another FP32 figure (the search's screening rows), the resolved tolerance stays what it was
    assert judge(*_pair(LARGE, 1.0, 1.03), fixed).exit_code == EXIT_PASS
    assert judge(*_pair(LARGE, 1.0, 1.03), GateSpec(metric="mae")).exit_code == EXIT_BREACH


def test_mlflow_params_record_the_tolerances_as_judged():
    from qbench.track_content import _tolerance_params

    fp32, int8 = _pair(LARGE, 4.0, 4.02)
    results = SweepResults(qbench_version="0", created_at="", recipe={}, environment={}, calibration=None,
                           evaluation_rows=8, gate_metric="mae", reference="fp32", variants=(fp32, int8))  # fmt: skip
    assert _tolerance_params(results, GateSpec(metric="mae")) == {
        "gate.max_drop": "0.04", "gate.max_slice_drop": "0.08",
        "gate.tolerance": "max_drop 0.04 = 1 % of FP32's mae 4, max_slice_drop 0.08 = 2 % of it"}
    assert _tolerance_params(results, GateSpec(metric="mae", max_drop=0.5))["gate.tolerance"] == "absolute"


def test_a_sweep_says_at_fp32_that_its_gate_cannot_form_relative_tolerances(caplog):
    """Without labels FP32's MAE against itself is 0: no share of it is a tolerance. The gate exits 2 on the results;
    the sweep says so as soon as FP32 is measured, not after every variant."""
    from types import SimpleNamespace

    from qbench.sweep import _check_reference_accuracy

    fp32 = _regression("fp32", TINY, 0.0)  # its MAE against its own outputs (as without labels): 0
    recipe = SimpleNamespace(gate=GateSpec(metric="mae"), task="regression")
    with caplog.at_level("WARNING", logger="qbench.sweep"):
        _check_reference_accuracy(SimpleNamespace(recipe=recipe, labels=None), fp32)
    [record] = [r for r in caplog.records if "cannot judge" in r.getMessage()]
    assert "FP32's overall mae is 0: no relative tolerance can be formed" in record.getMessage()
    caplog.clear()
    recipe.gate = GateSpec(metric="mae", max_drop=0.001, max_slice_drop=0.002)  # stated: absolute
    with caplog.at_level("WARNING", logger="qbench.sweep"):
        _check_reference_accuracy(SimpleNamespace(recipe=recipe, labels=None), fp32)
    assert not [r for r in caplog.records if "cannot judge" in r.getMessage()]
