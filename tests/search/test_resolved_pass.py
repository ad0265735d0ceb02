"""The search holds a pass on its selection rows to the gate's resolution rule (qbench.gate.resolution): a thin pass on
few heavy-tailed rows ranks after a resolved one, and is picked only when no candidate's pass is resolved."""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest

from qbench.gate.tolerance import reference_tolerances
from qbench.recipe.spec import GateSpec
from qbench.report.search import search_rows, search_summary
from qbench.results.schema import AccuracyResult, SliceMetrics, VariantResult
from qbench.results.search import CandidateRecord
from qbench.search import run, select
from qbench.search.budget import Budget
from qbench.search.screen import ScreenOutputs
from qbench.validate.measure import Rows
from qbench.variants import BuiltVariant

ROWS = 72  # selection rows, as in the probe that found a thin pass breaching on the evaluation rows


def _result(name: str, cosine: float, interval: tuple[float, float]) -> VariantResult:
    overall = SliceMetrics("overall", ROWS, {"cosine": cosine}, intervals={"cosine": interval})
    return VariantResult(variant=name, backend="cpu", precision=name, status="ok",
                         accuracy=AccuracyResult(rows=ROWS, nonfinite_outputs=0, overall=overall))  # fmt: skip


# cosine against FP32's own outputs: FP32's is 1 on every row, its interval a point. "thin" drops 0.0044 (tolerance
# 0.005) but its rows spread wide: the drop's interval reaches 0.011. "clear" drops 0.002, its interval within 0.003.
FIGURES = {"fp32": (1.0, (1.0, 1.0)), "thin": (0.9956, (0.989, 0.9990)), "clear": (0.998, (0.997, 0.999)),
           "thin-twin": (0.9957, (0.990, 0.9990))}  # fmt: skip


def _search(monkeypatch, labels: list[str], speeds: list[float], unresolved: str = "fail",
            digests: np.ndarray | None = None) -> run._Search:  # fmt: skip
    """A search of screened candidates `labels` timed at `speeds`, whose full evaluation is judged by the real gate
    on the selection-row figures of FIGURES (`digests`: what each selection row feeds the model; None: unknown)."""
    gate = GateSpec(metric="cosine", max_drop=0.005, max_slice_drop=0.01, unresolved=unresolved)
    return evaluating_search(monkeypatch, gate, lambda label: _result(label, *FIGURES[label]), labels, speeds, digests)


def evaluating_search(monkeypatch, gate: GateSpec, result_of: Callable[[str], VariantResult], labels: list[str],
                      speeds: list[float], digests: np.ndarray | None = None) -> run._Search:  # fmt: skip
    """A search of candidates `labels` screened at `speeds` (and FP32, `result_of("fp32")`), ready to evaluate in full:
    `measure` gives `result_of(label)`, judged by the real gate `gate` (`digests`: what each selection row feeds)."""
    fp32 = result_of("fp32")
    monkeypatch.setattr(run, "measure", lambda backend, built, prepared, **kw: SimpleNamespace(result=result_of(built),
                                                                                          rows_independent=False))
    search = object.__new__(run._Search)
    search.budget = Budget(60, lambda: 0.0, 3)  # its __init__, which sets it, is not run
    search.follows_batch = {}
    search.ranking_notes = []
    search.records = [CandidateRecord(label, "ort-dynamic", stage="screened", speedup=speed, screen_excess=0.5)
                      for label, speed in zip(labels, speeds)]  # fmt: skip
    search.built = dict(enumerate(labels))
    search.gate, search.fp32 = gate, SimpleNamespace(result=fp32, reference="fp32 outputs")
    search.tolerances = reference_tolerances(fp32, gate)
    search.fp32_timings, search.refusal = [], lambda what, seconds, **_: None
    search.backend = search.prepared = search.clock = None
    search.rows = Rows({}, None, {}, 1, digests)
    search.screened = ScreenOutputs(np.zeros(0, dtype=int))  # nothing screened to take
    return search


def test_a_thin_pass_on_few_rows_does_not_stop_a_slower_resolved_candidate_from_being_chosen(monkeypatch):
    """"thin" (2.0x) passes on a point estimate but not resolved; "clear" (1.5x, beyond the tie) passes resolved. The
    old search took thin's pass as the bar, never evaluated clear and picked thin."""
    search = _search(monkeypatch, ["thin", "clear"], [2.0, 1.5])
    search.evaluate_promising()
    assert select.choose(search.records) == 1
    thin, clear = search.records
    assert thin.passed and not thin.resolved_pass and clear.resolved_pass
    assert "interval of the drop reaches" in thin.unresolved and "rows would resolve it" in thin.unresolved
    assert thin.verdict.startswith("pass, unresolved: ") and clear.verdict == "pass (resolved)"
    assert select.fastest_passing(search.records) == 1


def test_copies_of_an_input_among_the_selection_rows_count_as_one_input_as_the_gate_counts_them(monkeypatch):
    """The 72 selection rows feed 8 inputs, 9 copies each: "clear"'s drop interval (0.002, reaching 0.003), computed
    as if each row were its own sample, is widened by sqrt(71 / 7) = 3.185 to reach 0.005185 > 0.005, as the gate widens
    it on evaluation rows (0.002 + 0.001 x 3.185). The search counted the copies as evidence: a resolved pass."""
    copies = np.repeat(np.array([bytes([i]) * 32 for i in range(8)], dtype="S32"), 9)
    search = _search(monkeypatch, ["clear"], [1.5], digests=copies)
    search.evaluate_promising()
    (clear,) = search.records
    assert clear.passed and not clear.resolved_pass
    assert "overall cosine on 72 rows (8 distinct inputs: the others repeat them)" in clear.unresolved
    assert "the 95% interval of the drop reaches 0.005185 > tolerance 0.005" in clear.unresolved
    distinct = _search(monkeypatch, ["clear"], [1.5],
                       digests=np.array([bytes([i]) * 32 for i in range(72)], dtype="S32"))  # fmt: skip
    distinct.evaluate_promising()
    assert distinct.records[0].resolved_pass


def test_the_rows_that_would_resolve_a_thin_pass_follow_its_spread():
    """Drop 0.0044, the interval's far end at 0.011 on 72 rows: the half-width 0.0066 must shrink to the margin
    0.0006, (0.0066 / 0.0006)² = 121 times the rows."""
    import re

    from qbench.gate.resolution import unresolved

    thin = _result("thin", 0.9956, (0.989, 1.0022)).accuracy.overall
    why = unresolved("cosine", 0.005, _result("fp32", *FIGURES["fp32"]).accuracy.overall, thin)
    rows = re.search(r"about (\d+) rows would resolve it at this spread", why)
    assert rows is not None and int(rows.group(1)) == pytest.approx(121 * ROWS, rel=1e-3)


def _finished(search: run._Search, tmp_path):
    search.spec = SimpleNamespace(name="int8-search", time_budget_s=60, finalists=2)
    search.budget, search.root = Budget(60, lambda: 1.0, 2), tmp_path / "search"
    search.follows_batch = {}
    search.ranking_notes = []
    search.keep_float_exhausted = False
    search.fp32_p50, search.chosen_on = {}, "chosen on the selection rows"
    search.prepared, search.rows = SimpleNamespace(selection=None), SimpleNamespace(count=ROWS)
    search._method_note = lambda: "method"
    search.built = {i: BuiltVariant(r.label, "int8", tmp_path / f"{r.label}.onnx")
                    for i, r in enumerate(search.records)}
    return search.finish()  # the builds lie outside the search's folder: nothing moves


@pytest.mark.parametrize(("unresolved", "outcome"), [("fail", "unresolved"), ("note", "passed")])
def test_only_unresolved_passes_are_picked_with_a_note_and_under_fail_are_unresolved(monkeypatch, tmp_path, caplog,
                                                                                       unresolved, outcome):  # fmt: skip
    """No candidate's pass is resolved: the fastest unresolved pass is the pick, the report says its pass rests on
    too few selection rows and how many would resolve it; as the gate, `fail` counts no such pass, and says it is
    unresolved for lack of rows, not that the tolerance is unreachable (it said "unreachable" everywhere)."""
    caplog.set_level(logging.INFO)
    search = _search(monkeypatch, ["thin", "thin-twin"], [1.5, 2.0], unresolved)
    search.evaluate_promising()
    assert not any(r.resolved_pass for r in search.records) and all(r.passed for r in search.records)
    finished = _finished(search, tmp_path)
    report = finished.report
    assert report.outcome == outcome
    pick = report.closest if outcome == "unresolved" else report.chosen
    assert pick == 1 and (report.chosen is None) == (outcome == "unresolved")  # the faster of the two
    note = next(n for n in report.notes if "rests on too few of them" in n)
    assert "thin-twin" in note and "rows would resolve it" in note
    if outcome == "unresolved":
        assert report.needed == note and report.candidates[1].verdict.startswith("closest (unresolved): pass, unresolved")
        summary = search_summary(report, SimpleNamespace(variants=()))[0]
        assert summary.startswith("Pass unresolved: thin-twin (#1); ") and "rows would resolve it" in summary
    else:
        assert report.candidates[1].verdict == "chosen (pass unresolved)"
    assert finished.built.params["search.outcome"] == ("pass unresolved" if outcome == "unresolved" else "passed")
    assert any("unresolved" in row[-1] for row in search_rows(report))


def test_a_pass_short_of_rows_alone_stops_the_search_as_a_pass_does(monkeypatch):
    """On 72 rows an agreement tolerance of 0.005 needs 598: every candidate's pass there is as unresolved, so a
    slower one cannot do better; the fastest pass is the bar and the slower candidate is not evaluated."""
    search = _search(monkeypatch, ["thin", "clear"], [2.0, 1.5])
    search.gate = search.gate.model_copy(update={"metric": "agreement"})
    agreement = {"fp32": 1.0, "thin": 0.996, "clear": 0.998}
    monkeypatch.setattr(run, "measure", lambda backend, built, prepared, **kw: SimpleNamespace(result=VariantResult(
        variant=built, backend="cpu", precision=built, status="ok", accuracy=AccuracyResult(
            rows=ROWS, nonfinite_outputs=0, overall=SliceMetrics("overall", ROWS, {"agreement": agreement[built]}))),
            rows_independent=False))
    search.fp32 = SimpleNamespace(result=run.measure(None, "fp32", None).result, reference="fp32 outputs")
    search.tolerances = reference_tolerances(search.fp32.result, search.gate)
    search.evaluate_promising()
    thin, clear = search.records
    assert thin.passed and "< 598 needed" in thin.unresolved and not thin.unresolved_on_spread and thin.firm_pass
    assert not clear.evaluated and select.choose(search.records) == 0
