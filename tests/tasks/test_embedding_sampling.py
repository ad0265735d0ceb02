"""nn_agreement past task_options.nn_queries: a seeded, stratified sample of query rows, each searched among all rows;
the sampled figure, its count, and the gate's count-based rules."""

from __future__ import annotations

import numpy as np
import pytest

from qbench.errors import QbenchError
from qbench.gate.evaluate import evaluate_gate
from qbench.recipe.spec import GateSpec
from qbench.report.tables import _slice_grid
from qbench.results.schema import AccuracyResult, SliceMetrics, SweepResults, VariantResult
from qbench.track.content import _scope_metrics
from qbench.validate import neighbours
from qbench.validate.accuracy import evaluate_accuracy

ROWS, DIMS, MOVED = 3000, 64, 0.3


def known_agreement(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Rows in pairs (2k, 2k+1) nearly equal; the variant replaces the second row of 30 % of the pairs by a random
    vector, so both rows of those pairs lose their neighbour: agreement is exactly 0.7 (random 64-d vectors are far
    from every other row)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(ROWS // 2, DIMS))
    reference = np.repeat(base, 2, axis=0) + rng.normal(scale=1e-3, size=(ROWS, DIMS))
    variant = reference.copy()
    moved = rng.choice(ROWS // 2, int(MOVED * ROWS // 2), replace=False)
    variant[2 * moved + 1] = rng.normal(size=(moved.size, DIMS))
    return reference, variant


def slices_of(rows: int) -> dict[str, np.ndarray]:
    """Overlapping slices of unequal shares: a (10 %), b (60 %), and 'even' crossing both."""
    position = np.arange(rows)
    return {"a": position % 10 == 0, "b": position % 10 >= 4, "even": position % 2 == 0}


def test_the_constructed_case_has_the_agreement_it_was_built_with() -> None:
    reference, variant = known_agreement()
    assert neighbours.nearest_neighbour_agreement(reference, variant) == pytest.approx(1 - MOVED, abs=1e-12)


def test_sampled_rows_are_scored_against_every_row_as_in_the_full_search() -> None:
    reference, variant = known_agreement()
    full = neighbours.nearest_neighbour_matches(reference, variant)
    queries = neighbours.query_sample(np.zeros(ROWS, dtype=np.int64), 500)
    sampled = neighbours.nearest_neighbour_matches(reference, variant, queries)
    assert queries.size == 500 and np.array_equal(sampled[queries], full[queries])
    unscored = np.setdiff1d(np.arange(ROWS), queries)
    assert np.isnan(sampled[unscored]).all()


def test_the_sampled_figure_is_unbiased_and_every_stratum_keeps_its_share() -> None:
    reference, variant = known_agreement()
    full = neighbours.nearest_neighbour_matches(reference, variant)
    masks = slices_of(ROWS)
    strata = np.unique(np.stack(list(masks.values()), axis=1), axis=0, return_inverse=True)[1].reshape(-1)
    bound = 300
    estimates = []
    for seed in range(400):
        queries = neighbours.query_sample(strata, bound, seed)
        assert queries.size == bound and np.unique(queries).size == bound
        for stratum in np.unique(strata):
            share = np.count_nonzero(strata == stratum) * bound / ROWS
            assert np.floor(share) <= np.count_nonzero(strata[queries] == stratum) <= np.ceil(share)
        estimates.append(full[queries].mean())
    # one draw's standard error: sqrt(0.21 / 300 x (1 - 300 / 3000)) = 0.025; the mean of 400 draws: 0.00126
    assert np.mean(estimates) == pytest.approx(1 - MOVED, abs=4 * 0.00126)
    assert np.std(estimates) > 0.01  # the draws differ: the seed is used


def test_below_the_bound_every_row_is_queried_and_the_results_are_those_of_the_full_search() -> None:
    reference, variant = known_agreement()
    default = evaluate_accuracy("embedding", variant, reference, None, slices_of(ROWS))
    full = evaluate_accuracy("embedding", variant, reference, None, slices_of(ROWS), task_options={"nn_queries": None})
    assert default == full
    assert all(not s.denominators for s in (default.overall, *default.slices))


def test_past_the_bound_each_scope_records_the_count_its_figure_rests_on() -> None:
    reference, variant = known_agreement()
    masks = slices_of(ROWS)
    result = evaluate_accuracy("embedding", variant, reference, None, masks, task_options={"nn_queries": 300})
    again = evaluate_accuracy("embedding", variant, reference, None, masks, task_options={"nn_queries": 300})
    assert result == again  # seeded: the same rows for every result, sweep after sweep
    assert result.overall.size == ROWS and result.overall.denominators == {"nn_agreement": 300}
    for scope in result.slices:
        share = np.count_nonzero(masks[scope.name]) * 300 / ROWS
        counted = scope.denominators["nn_agreement"]
        assert share - 3 <= counted <= share + 3  # a union of strata, each within one row of its share
        assert scope.metrics["nn_agreement"] * counted == pytest.approx(round(scope.metrics["nn_agreement"] * counted))
    assert result.overall.metrics["nn_agreement"] == pytest.approx(1 - MOVED, abs=0.1)
    assert result.overall.metrics["cosine"] == full_cosine(reference, variant)  # other metrics use every row


def full_cosine(reference: np.ndarray, variant: np.ndarray) -> float:
    every = evaluate_accuracy("embedding", variant, reference, None, {}, task_options={"nn_queries": None})
    return every.overall.metrics["cosine"]


@pytest.mark.parametrize("value", [1, 0, True, 2.5, "10"])
def test_nn_queries_must_be_a_whole_number_of_rows(value) -> None:
    with pytest.raises(QbenchError, match="nn_queries: got"):
        evaluate_accuracy("embedding", np.ones((4, 2)), np.ones((4, 2)), None, {}, task_options={"nn_queries": value})


def _result(name: str, value: float, scored: int) -> VariantResult:
    def scope(scope_name: str, rows: int) -> SliceMetrics:
        return SliceMetrics(scope_name, rows, {"nn_agreement": value}, denominators={"nn_agreement": scored})

    accuracy = AccuracyResult(rows=6000, nonfinite_outputs=0, overall=scope("overall", 6000),
                              slices=(scope("s", 3000),))  # fmt: skip
    return VariantResult(variant=name, backend="onnxruntime-cpu", precision="fp32" if name == "fp32" else "int8",
                         status="ok", error=None, accuracy=accuracy)  # fmt: skip


def test_min_slice_size_counts_the_sampled_rows_not_the_slice_rows() -> None:
    """A slice of 3,000 rows whose nn_agreement rests on 3 sampled rows is too small for min_slice_size 30."""
    results = SweepResults(
        qbench_version="0", created_at="2026-01-01T00:00:00+00:00", recipe={"name": "toy"}, environment={},
        calibration=None, evaluation_rows=6000, gate_metric="nn_agreement", reference="fp32",
        variants=(_result("fp32", 1.0, 3), _result("int8-a", 2 / 3, 3)),
    )  # fmt: skip
    spec = GateSpec(metric="nn_agreement", max_drop=1.0, max_slice_drop=0.01, min_slice_size=30, applies_to=["int8-*"])
    check = next(c for c in evaluate_gate(results, spec).checks if c.scope == "s")
    assert check.status == "skipped" and check.size == 3
    judged = next(c for c in evaluate_gate(results, spec.model_copy(update={"min_slice_size": 3})).checks
                  if c.scope == "s")  # fmt: skip
    assert judged.status == "breach" and judged.size == 3
    assert "3000 (3 scored)" in str(_slice_grid(results, "nn_agreement").rows)
    assert _scope_metrics(results.variants[1].accuracy.slices[0], "slice/s/")["slice/s/count_nn_agreement"] == 3.0
