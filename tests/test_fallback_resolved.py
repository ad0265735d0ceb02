"""`calibrator: auto` and `fallback:` choose among their tries by the INT8 search's resolution rule
(qbench.gate.resolution.passing): a pass on too few selection rows ranks after every resolved pass, is kept only when
no try's pass is resolved (with a note) and under `gate.unresolved: fail` is reported as not passing. The tries'
figures are fake; their verdicts are the real gate's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from qbench import fallback
from qbench.gate.tolerance import reference_tolerances
from qbench.recipe.spec import FallbackSpec, GateSpec
from qbench.results.schema import AccuracyResult, LatencyPoint, LatencyResult, SliceMetrics, VariantResult
from qbench.validate.measure import Rows

ROWS = 72  # selection rows
# cosine against FP32's own outputs (FP32's interval a point). "thin" drops 0.0044 (tolerance 0.005) but its rows
# spread wide: the drop's interval reaches 0.011, unresolved. "clear" drops 0.002, its interval within 0.003.
# "broken" breaches.
FIGURES = {"fp32": (1.0, (1.0, 1.0)), "thin": (0.9956, (0.989, 0.999)), "thin-twin": (0.9957, (0.990, 0.999)),
           "clear": (0.998, (0.997, 0.999)), "broken": (0.97, (0.96, 0.98))}  # fmt: skip


def _result(name: str, p50_ms: float = 1.0) -> VariantResult:
    cosine, interval = FIGURES[name]
    overall = SliceMetrics("overall", ROWS, {"cosine": cosine}, intervals={"cosine": interval})
    point = LatencyPoint(32, 1, 5, p50_ms, p50_ms, p50_ms, p50_ms, 32 / p50_ms)
    variant = "fp32" if name == "fp32" else "int8"
    return VariantResult(variant=variant, backend="cpu", precision=variant, status="ok",
                         accuracy=AccuracyResult(rows=ROWS, nonfinite_outputs=0, overall=overall),
                         latency=LatencyResult(threads=1, session_create_ms=1.0, first_run_ms=1.0,
                                               points=(point,)))  # fmt: skip


def _search(unresolved: str = "fail", calibrator: str = "auto") -> fallback._Search:
    gate = GateSpec(metric="cosine", max_drop=0.005, max_slice_drop=0.01, unresolved=unresolved)
    search = object.__new__(fallback._Search)
    search.reference = _result("fp32")
    search.gate, search.tolerances = gate, reference_tolerances(search.reference, gate)
    search.spec = SimpleNamespace(name="int8", calibrator=calibrator, exclude_nodes=[], fallback=None)
    search.prepared = SimpleNamespace(selection=None, evaluation_rows=range(ROWS))
    search.trials, search.skipped, search.rankings, search.together = [], [], {}, {}
    search.distinct_inputs = {}
    return search


def _trial(search: fallback._Search, calibrator: str, figures: str, p50_ms: float, excluded=()) -> fallback.Trial:
    """A try judged by the real gate on its selection-row figures."""
    result = _result(figures, p50_ms)
    built = SimpleNamespace(lowered_nothing=False)
    trial = fallback.Trial(calibrator, tuple(excluded), built, result, search.judged(result))
    search.trials.append(trial)
    return trial


def test_calibrator_auto_keeps_a_resolved_pass_over_a_faster_unresolved_one():
    """minmax (1 ms) passes on its point estimate only; entropy (2 ms) passes resolved. The old choice took the
    fastest pass, minmax, which the evaluation rows may well breach."""
    search = _search()
    thin, clear = _trial(search, "minmax", "thin", 1.0), _trial(search, "entropy", "clear", 2.0)
    assert thin.passed and clear.passed and search.best() is clear
    assert not thin.resolved_pass and "interval of the drop reaches" in thin.unresolved and clear.resolved_pass
    params, notes = search._path_params(clear), search._notes(clear)
    assert params["search.outcome"] == "passed" and params["search.chosen"] == 1
    assert params["search.steps"][0]["unresolved"] == thin.unresolved and params["search.steps"][1]["unresolved"] is None
    assert "minmax 0.9956✓? → entropy 0.9980✓" in notes[0]
    assert not any("rests on too few" in note for note in notes)


@pytest.mark.parametrize(("unresolved", "outcome"), [("fail", "pass unresolved"), ("note", "passed")])
def test_only_unresolved_passes_keep_the_fastest_with_a_note_and_under_fail_it_is_not_passing(unresolved, outcome):
    """No try's pass is resolved: the fastest unresolved pass is kept, its notes say why its pass is no evidence and
    how many rows would resolve it; as the gate and the search, `fail` counts no such pass."""
    search = _search(unresolved)
    _trial(search, "minmax", "thin", 2.0)
    fastest = _trial(search, "entropy", "thin-twin", 1.0)
    _trial(search, "percentile", "broken", 0.5)
    assert search.best() is fastest
    assert search._path_params(fastest)["search.outcome"] == outcome
    note = next(n for n in search._notes(fastest) if "rests on too few of them" in n)
    assert "entropy" in note and f"gate.unresolved: {unresolved}" in note and "rows would resolve it" in note
    assert ("reported as not passing" in note) == (unresolved == "fail")


def test_an_unresolved_pass_is_no_bar_to_a_slower_fallback_step(monkeypatch):
    """minmax passes thinly at 1 ms; entropy fails at 1.5 ms. Keeping entropy's costliest node float may give a
    resolved pass, so its fallback is still tried, and a step passing thinly does not end the path: the old code
    ruled entropy out as slower than minmax's pass and stopped at the first thin step."""
    search = _search(calibrator="entropy")
    search.spec.exclude_nodes = []
    search.ctx = SimpleNamespace(reference_path="fp32.onnx")
    _trial(search, "minmax", "thin", 1.0)
    base = _trial(search, "entropy", "broken", 1.5)
    assert search.may_beat(base)
    steps = iter([("thin-twin", 1.6), ("clear", 1.7)])

    def attempt(calibrator, excluded):
        figures, p50 = next(steps)
        return _trial(search, calibrator, figures, p50, excluded)

    monkeypatch.setattr(fallback, "load_model", lambda path: None)
    monkeypatch.setattr(fallback, "quantized_nodes", lambda model, built: ["a", "b", "c"])
    monkeypatch.setattr(search, "rank", lambda *args, **kwargs: (["a", "b", "c"], 0.0))
    monkeypatch.setattr(search, "attempt", attempt)
    search.fall_back(base, FallbackSpec(max_excluded=2, step=1))
    assert [t.excluded for t in search.trials[2:]] == [("a",), ("a", "b")]
    assert search.best() is search.trials[-1] and search.best().resolved_pass


def test_a_pass_on_72_rows_of_8_inputs_is_unresolved_as_the_gate_counts_them():
    """72 selection rows that are 9 copies of each of 8 inputs: the gate and the INT8 search count 8 samples, not 72
    (Rows.judged_on's distinct_inputs). The tries' verdicts ignored the copies, so "clear" (drop 0.002, interval
    within 0.003 on 72 rows) was a resolved pass; over 8 inputs its interval widens by sqrt(71 / 7) = 3.18 and
    reaches past the tolerance of 0.005."""
    digests = np.repeat(np.arange(8), ROWS // 8).astype(np.int64)
    rows = Rows({"x": np.zeros((ROWS, 1), np.float32)}, None, {}, 8, digests)
    search = _search()
    assert search.judged(_result("clear")).unresolved == ()  # every row an input of its own: resolved
    search.distinct_inputs = rows.distinct_inputs
    assert search.distinct_inputs == {"overall": 8}
    verdict = search.judged(_result("clear"))
    assert verdict.exit_code == 0 and len(verdict.unresolved) == 1
    assert "cosine on 72 rows (8 distinct inputs: the others repeat them)" in verdict.unresolved[0]
    trial = fallback.Trial("minmax", (), SimpleNamespace(lowered_nothing=False), _result("clear"), verdict)
    assert trial.passed and not trial.resolved_pass


def test_the_fallback_counts_the_inputs_of_the_rows_its_tries_are_judged_on(monkeypatch):
    """_Search takes distinct_inputs from Rows.judged_on (the selection rows, else the evaluation rows): the rows the
    sweep's search evaluator measures each try on."""
    rows = Rows({"x": np.zeros((ROWS, 1), np.float32)}, None, {}, 8, np.repeat(np.arange(8), ROWS // 8))
    monkeypatch.setattr(fallback.Rows, "judged_on", classmethod(lambda cls, prepared: rows))
    reference = _result("fp32")
    gate = GateSpec(metric="cosine", max_drop=0.005, max_slice_drop=0.01)
    prepared = SimpleNamespace(recipe=SimpleNamespace(gate=gate))
    search = fallback._Search(SimpleNamespace(name="int8"), SimpleNamespace(workdir=Path(".")), None, prepared,
                              reference)  # fmt: skip
    assert search.distinct_inputs == {"overall": 8}
    assert search.judged(_result("clear")).unresolved
