"""Embedding rows: what a row FP32 gives NaN/inf on is worth to cosine and cosine_min, through the gate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qbench.gate.evaluate import EXIT_BREACH, EXIT_UNUSABLE, judge
from qbench.recipe.spec import GateSpec
from qbench.results.schema import VariantResult
from qbench.validate.accuracy import evaluate_accuracy
from qbench.validate.catalogue import METRICS, impossible_value

# FP32 overflows on row 3 (NaN), and so does the variant; on the other rows the variant points elsewhere
REFERENCE = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [np.nan, 1.0]])
VARIANT = np.array([[0.1, 1.0], [1.0, 0.1], [1.0, -0.9], [np.nan, 1.0]])
FINITE_ROWS = {"finite": np.array([True, True, True, False])}


def _verdict(metric: str):
    def result(name: str, values: np.ndarray) -> VariantResult:
        accuracy = evaluate_accuracy("embedding", values, REFERENCE, None, FINITE_ROWS)
        return VariantResult(variant=name, backend="b", precision="fp32" if name == "fp32" else "int8", status="ok",
                             accuracy=accuracy)  # fmt: skip

    return judge(result("fp32", REFERENCE), result("int8", VARIANT), GateSpec(metric=metric, max_drop=0.5,
                                                                               max_slice_drop=0.5))


def test_a_row_fp32_gives_nan_on_is_no_cosine_of_0_that_every_result_shares() -> None:
    """That row counted as cosine 0 for FP32 and the variant alike: cosine_min was 0 for both whatever the variant
    did elsewhere (drop 0, a pass at any tolerance), and the cosine mean was diluted. It leaves both undefined
    where it lies (exit 2, naming FP32's NaN/inf), while a slice of the rows FP32 scores is judged as ever."""
    for metric in ("cosine_min", "cosine"):
        verdict = _verdict(metric)
        assert verdict.exit_code == EXIT_UNUSABLE
        assert "FP32 itself gives NaN/inf on 1 of its 4 rows" in verdict.problems[0]
        (finite,) = [c for c in verdict.checks if c.scope == "finite"]
        assert finite.status == "breach" and finite.reference == pytest.approx(1.0) and finite.drop > 0.5
    fp32 = evaluate_accuracy("embedding", REFERENCE, REFERENCE, None, FINITE_ROWS)
    assert math.isnan(fp32.overall.metrics["cosine"]) and math.isnan(fp32.overall.metrics["cosine_min"])
    assert fp32.slices[0].metrics["cosine"] == pytest.approx(1.0)


def test_the_variants_own_nan_row_still_counts_as_cosine_0_and_breaches() -> None:
    """Where FP32 is finite, the variant's NaN row is its own failure: cosine 0 there, and a breach."""
    reference = np.where(np.isfinite(REFERENCE), REFERENCE, 1.0)
    variant = reference.copy()
    variant[3, 0] = np.nan
    accuracy = evaluate_accuracy("embedding", variant, reference, None, {})
    assert accuracy.overall.metrics["cosine_min"] == 0.0 and accuracy.overall.new_nonfinite_outputs == 1
    fp32 = VariantResult(variant="fp32", backend="b", precision="fp32", status="ok",
                         accuracy=evaluate_accuracy("embedding", reference, reference, None, {}))
    own = VariantResult(variant="int8", backend="b", precision="int8", status="ok", accuracy=accuracy)
    assert judge(fp32, own, GateSpec(metric="cosine", max_drop=0.5)).exit_code == EXIT_BREACH


def test_nn_agreement_is_a_share_of_rows_the_gate_holds_to_whole_rows() -> None:
    """nn_agreement counts rows (FP32's NaN/inf ones as misses) but was not declared a share of rows, so results
    holding 0.5 on a 3-row slice (no whole number of rows: no sweep wrote it) passed the gate's impossible-value
    check. Every value a sweep writes is a whole number of its scope's rows."""
    info = METRICS["nn_agreement"]
    accuracy = evaluate_accuracy("embedding", VARIANT, REFERENCE, None, FINITE_ROWS)
    for scope in (accuracy.overall, *accuracy.slices):
        assert impossible_value(info, scope.metrics["nn_agreement"], scope.size) is None
    assert impossible_value(info, 0.5, 3) == "not a whole number of the scope's 3 rows (1.5000)"
    assert info.counts_nonfinite_rows
