"""A screen that makes failing on every row certain: only for a bounded row-mean metric, only when even perfect
unseen rows miss the threshold."""

from __future__ import annotations

import math

import pytest

from qbench.gate.metric_check import GateCheck
from qbench.results.schema import AccuracyResult, SliceMetrics
from qbench.search.certain import best_on_every_row, certain_failure


def _accuracy(metric: str, overall: tuple[float, int], slices: dict[str, tuple[float, int]], *, nonfinite: int = 0,
              denominators: dict[str, int] | None = None) -> AccuracyResult:  # fmt: skip
    def scope(name: str, value: float, size: int) -> SliceMetrics:
        return SliceMetrics(name, size, {metric: value}, nonfinite_outputs=nonfinite if name == "short" else 0,
                            denominators=dict(denominators or {}))  # fmt: skip

    return AccuracyResult(overall[1], 0, scope("overall", *overall), tuple(scope(n, *v) for n, v in slices.items()))


def _check(scope: str, metric: str, tolerance: float, status: str = "breach") -> GateCheck:
    return GateCheck("int8", "onnxruntime-cpu", scope, metric, math.nan, math.nan, math.nan, tolerance, 0, status)


def test_the_best_on_every_row_is_the_seen_rows_with_every_other_at_the_bound():
    # 10 rows seen averaging 0.9, 30 more at 1.0: (9 + 30) / 40
    assert best_on_every_row(0.9, 10, 40, 1.0) == pytest.approx(0.975)
    assert best_on_every_row(0.2, 5, 5, 0.0) == pytest.approx(0.2)  # every row seen: the figure itself


def test_a_slice_that_perfect_unseen_rows_cannot_lift_to_its_threshold_is_certain_to_fail():
    """Slice 'short': FP32 0.999 on 20 rows, tolerance 0.01 (threshold 0.989); the screen saw 5 of them at a mean cosine
    of 0.95: at best (0.95 * 5 + 15) / 20 = 0.9875. Overall: 0.97 on 10 of 100 rows, at best 0.997, within 0.005."""
    fp32 = _accuracy("cosine", (1.0, 100), {"short": (0.999, 20)})
    screened = _accuracy("cosine", (0.97, 10), {"short": (0.95, 5)})
    checks = [_check("overall", "cosine", 0.005), _check("short", "cosine", 0.01)]
    why = certain_failure(checks, screened, screened, fp32)
    assert why == "certain to fail after 5 of 20 rows: slice short cosine at most 0.9875 < 0.9890"
    # a screen a shade better (0.96: at best 0.99) may still pass: not certain, whatever its excess on the screen
    better = _accuracy("cosine", (0.97, 10), {"short": (0.96, 5)})
    assert certain_failure(checks, better, better, fp32) is None


def test_only_bounded_row_means_judged_by_the_gate_count():
    fp32 = _accuracy("cosine_min", (1.0, 100), {})
    screened = _accuracy("cosine_min", (0.5, 10), {})  # a minimum is no mean: unseen rows bound nothing
    assert certain_failure([_check("overall", "cosine_min", 0.005)], screened, screened, fp32) is None
    fp32, screened = _accuracy("cosine", (1.0, 100), {}), _accuracy("cosine", (0.5, 90), {})
    assert certain_failure([_check("overall", "cosine", 0.005, "skipped")], screened, screened, fp32) is None
    assert certain_failure([_check("overall", "cosine", 0.005)], screened, screened, fp32) is not None
    # regression's agreement is judged against the rows' own spread: some rows bound nothing
    fp32, screened = _accuracy("agreement", (1.0, 100), {}), _accuracy("agreement", (0.0, 90), {})
    assert certain_failure([_check("overall", "agreement", 0.01)], screened, screened, fp32) is None


def test_a_lower_is_better_share_is_bounded_by_its_low_end_over_its_scored_units():
    """flip_rate over scored tokens: 30 of 100 tokens seen, 0.2 of them flipped; unseen tokens at best flip none:
    0.06 > 0 + 0.05."""
    fp32 = _accuracy("flip_rate", (0.0, 40), {}, denominators={"flip_rate": 100})
    screened = _accuracy("flip_rate", (0.2, 12), {}, denominators={"flip_rate": 30})
    why = certain_failure([_check("overall", "flip_rate", 0.05)], screened, screened, fp32)
    assert why == "certain to fail after 30 of 100 scored units: overall flip_rate at least 0.0600 > 0.0500"


def test_rows_fp32_leaves_out_of_the_mean_are_not_counted_as_seen():
    """Cosine leaves FP32's NaN rows out: 2 of the 5 screened 'short' rows are FP32's NaN ones, so only 3 were seen:
    at best (0.95 * 3 + 17) / 20 = 0.9925, within the tolerance, where 5 seen rows would have said certain."""
    fp32 = _accuracy("cosine", (1.0, 100), {"short": (0.999, 20)})
    screened = _accuracy("cosine", (0.99, 10), {"short": (0.95, 5)})
    fp32_screened = _accuracy("cosine", (1.0, 10), {"short": (1.0, 5)}, nonfinite=2)
    checks = [_check("short", "cosine", 0.01)]
    assert certain_failure(checks, screened, screened, fp32) is not None
    assert certain_failure(checks, screened, fp32_screened, fp32) is None
