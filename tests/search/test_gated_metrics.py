"""The INT8 search with several gated metrics (gate.metrics): a candidate passes only on every one. Before, it judged
gate.metric alone and kept the fastest candidate that ruined the other head."""

from __future__ import annotations

from test_resolved_pass import evaluating_search

from qbench.recipe.spec import GateSpec
from qbench.results.schema import AccuracyResult, SliceMetrics, VariantResult
from qbench.search import run, select

ROWS = 400
# accuracy of the class head and the regression head's MAE: "fast" keeps the classes and ruins the MAE (0.1 -> 0.5)
FIGURES = {"fp32": {"accuracy": 0.9, "mae": 0.1}, "fast": {"accuracy": 0.9, "mae": 0.5},
           "slow": {"accuracy": 0.9, "mae": 0.1001}}  # fmt: skip


def _result(name: str) -> VariantResult:
    overall = SliceMetrics("overall", ROWS, FIGURES[name])
    return VariantResult(variant=name, backend="cpu", precision=name, status="ok",
                         accuracy=AccuracyResult(rows=ROWS, nonfinite_outputs=0, overall=overall))  # fmt: skip


def _search(monkeypatch, gate: GateSpec) -> run._Search:
    """Screened candidates "fast" (2.0x) and "slow" (1.5x), each evaluated in full by the real gate."""
    return evaluating_search(monkeypatch, gate, _result, ["fast", "slow"], [2.0, 1.5])


def test_the_search_keeps_the_fastest_candidate_passing_every_gated_metric(monkeypatch):
    both = GateSpec.model_validate({"metrics": ["accuracy", {"metric": "mae", "max_drop": 0.01}], "unresolved": "note"})
    search = _search(monkeypatch, both)
    search.evaluate_promising()
    fast, slow = search.records
    assert not fast.passed and "mae" in fast.verdict and fast.excess == 40.0  # (0.5 - 0.1) / 0.01
    assert slow.passed and select.choose(search.records) == 1


def test_gated_on_accuracy_alone_the_fastest_is_kept_as_before(monkeypatch):
    search = _search(monkeypatch, GateSpec(metric="accuracy", unresolved="note"))
    search.evaluate_promising()
    assert search.records[0].passed and select.choose(search.records) == 0


def test_the_closest_candidate_failing_another_gated_metric_says_which_not_no_measured_gap(monkeypatch):
    """Both fail: "slow" passes accuracy and breaches mae (0.1 -> 0.1001 against 0.00001). What it would need read
    "no measured gap", as it measured gate.metric's drops alone, though its verdict names the mae breach."""
    strict = GateSpec.model_validate({"metrics": ["accuracy", {"metric": "mae", "max_drop": 0.00001}],
                                      "unresolved": "note"})  # fmt: skip
    search = _search(monkeypatch, strict)
    search.evaluate_promising()
    closest = search.records[select.closest(search.records)]
    assert closest.label == "slow" and closest.drop == 0.0 and not closest.passed
    text = select.needed(closest, search.tolerances.max_drop, search.tolerances.max_slice_drop,
                         budget_exhausted=False, keep_float_exhausted=False)  # fmt: skip
    assert text.startswith("overall mae drop 0.0001 > 1e-05;") and "no measured gap" not in text, text
