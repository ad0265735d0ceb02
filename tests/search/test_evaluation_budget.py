"""Which screened candidates the search's budget evaluates in full, and in which order: the likeliest answer first,
a candidate certain to fail never."""

from __future__ import annotations

from types import SimpleNamespace

from qbench.gate.evaluate import GateReport
from qbench.gate.metric_check import GateCheck
from qbench.results.schema import AccuracyResult, SliceMetrics
from qbench.results.search import CandidateRecord
from qbench.search import run, select
from qbench.search.budget import Budget

# label -> (screened speed-up, screening excess, passes in full)
SCREENED = {
    "risky-fast": (2.12, 1.3, False),  # a shade faster, its screen only near the gate: fails in full
    "clear": (2.05, 0.4, True),  # within the tie of it, its screen clear of the gate
    "slower": (1.76, 0.3, True),
}


def _search(evaluations_allowed: int) -> tuple[run._Search, list[str]]:
    """The three SCREENED candidates, the budget room for `evaluations_allowed` full evaluations; the labels
    evaluated, in order."""
    search = object.__new__(run._Search)
    search.records = [CandidateRecord(label, "ort-dynamic", stage="screened", speedup=speed, screen_excess=excess,
                                      verdict="screened: promising")
                                      for label, (speed, excess, _) in SCREENED.items()]  # fmt: skip
    search.fp32_timings, search.budget, search.follows_batch = [], Budget(60, lambda: 0.0, 3), {}
    evaluated: list[str] = []

    def refusal(what: str, seconds: float, **_) -> str | None:
        return None if len(evaluated) < evaluations_allowed else "time budget spent"

    def evaluate(index: int) -> None:
        record = search.records[index]
        evaluated.append(record.label)
        passes = SCREENED[record.label][2]
        search.records[index] = record.with_(stage="evaluated", passed=passes, excess=0.5 if passes else 1.4,
                                             verdict="pass (resolved)" if passes else "fail: overall")  # fmt: skip

    search.refusal, search.evaluate = refusal, evaluate
    return search, evaluated


def test_the_budget_goes_to_the_clear_candidate_before_a_risky_one_a_shade_faster():
    """Room for one evaluation: the clear candidate is evaluated and chosen. Before, the risky one, 3 % faster on its
    screen, took the one evaluation, failed, and the search kept none of the passing ones."""
    search, evaluated = _search(evaluations_allowed=1)
    search.evaluate_promising()
    assert evaluated == ["clear"]
    assert select.choose(search.records) == 1
    risky = search.records[0]
    assert risky.verdict == "screened: promising; not evaluated: time budget spent"  # the report says why not


def test_with_room_the_risky_candidate_is_still_evaluated_after_and_the_slower_one_is_outpaced():
    search, evaluated = _search(evaluations_allowed=3)
    search.evaluate_promising()
    assert evaluated == ["clear", "risky-fast"]  # risky-fast may still win: within the tie of the passing one
    assert search.records[2].verdict == run.OUTPACED and select.choose(search.records) == 1


def _cosine(value: float, rows: int) -> AccuracyResult:
    return AccuracyResult(rows, 0, SliceMetrics("overall", rows, {"cosine": value}))


def test_a_screen_certain_to_fail_is_said_only_where_its_outputs_are_the_full_evaluations():
    """The screen's 10 rows of 100 at a mean cosine of 0.9 cap the mean on every row at 0.99 < 1 - 0.005. Where the
    rows depend on their batch, the full evaluation runs them in other batches: nothing is certain."""
    search = object.__new__(run._Search)
    search.fp32 = SimpleNamespace(result=SimpleNamespace(accuracy=_cosine(1.0, 100)))
    search.fp32_screen = SimpleNamespace(result=SimpleNamespace(accuracy=_cosine(1.0, 10)))
    check = GateCheck("int8", "onnxruntime-cpu", "overall", "cosine", 1.0, 0.9, 0.1, 0.005, 10, "breach")
    verdict = GateReport(metric="cosine", checks=(check,))
    screened = SimpleNamespace(result=SimpleNamespace(accuracy=_cosine(0.9, 10)), rows_independent=True)
    why = search._certain_failure(verdict, screened)
    assert why is not None and why.startswith("certain to fail after 10 of 100 rows: overall cosine at most 0.9900")
    screened.rows_independent = False
    assert search._certain_failure(verdict, screened) is None
