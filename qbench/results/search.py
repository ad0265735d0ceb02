"""The INT8 search's report (results.json `search`): every candidate with its figures and verdict.

    SearchReport
      variant, metric, max_drop, max_slice_drop   the searched variant and the gate it was searched against
      tolerance_basis                             how those were formed as shares of FP32's figure ('' when absolute
                                                  as the recipe states: qbench.gate.tolerance)
      time_budget_s, seconds, budget_exhausted    the recipe's budget, the time spent, whether steps were left out
      outcome                                     "passed" | "unresolved" (the pick passed on too few selection rows
                                                  to resolve the tolerance, which `gate.unresolved: fail` counts as no
                                                  pass) | "unreachable" | "nothing built" (no candidate ran)
      chosen                                      index of the candidate the variant is (None: nothing could be built)
      closest, needed                             unresolved or unreachable: the pick and what it would take (the
                                                  rows that would resolve its pass)
      fp32_p50_ms                                 FP32's p50 per batch size under the search's quick timing
      selection_rows                              rows candidates were judged and chosen on, none calibrated on or
                                                  evaluated (qbench.selection_rows); None: chosen on the evaluation rows
                                                  themselves
      candidates                                  CandidateRecord, in the order they were tried
    CandidateRecord
      label, technique, options, keep_float       what was built (keep_float: node names left in floating point)
      stage                                       how far it got: "skipped" | "failed" | "not applicable" | "duplicate"
                                                  (the graph of an earlier candidate) | "screened" | "evaluated"
      speedup, speedups                           FP32 p50 / its p50: geometric mean over batch sizes, and per batch
      screen_*                                    the cheap pass: gate metric, drop and excess on the screening rows
      nsr                                         output noise-to-signal vs FP32 on the screening rows
      metric, drop, worst_slice, worst_slice_drop, excess   the full evaluation on the selection rows (None when
                                                  not evaluated)
      failure_certain                             why the screening rows alone make failing on every row certain
                                                  (search.certain: even perfect other rows cannot reach a check's
                                                  threshold), so it was not evaluated; None otherwise
      passed, verdict                             the gate's verdict there; a one-line verdict (the searched variant's
                                                  own verdict is the gate's, on the evaluation rows)
      unresolved                                  a pass on too few selection rows to resolve the tolerance
                                                  (qbench.gate.resolution): why, with the rows that would; None
                                                  otherwise
      unresolved_on_spread                        that pass falls short on the spread of its own figures, not on the
                                                  rows alone (which no candidate on the same rows could resolve either)
      smoothing                                   a SmoothQuant candidate: what its smoothing did on this graph
                                                  (smoothed_groups, folded_into {producer op: groups}, inserted_muls,
                                                  unsmoothed_groups, alphas_chosen); {} for other techniques

excess = the largest drop / tolerance over the overall and judged slice checks: at most 1 passes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from qbench.gate.resolution import JudgedPass
from qbench.results.fields import known_fields


@dataclass(frozen=True)
class CandidateRecord(JudgedPass):
    label: str
    technique: str
    options: dict[str, Any] = field(default_factory=dict)
    keep_float: tuple[str, ...] = ()
    stage: str = "skipped"
    verdict: str = ""
    build_seconds: float | None = None
    speedup: float | None = None
    speedups: dict[str, float] = field(default_factory=dict)  # "b<batch>" -> FP32 p50 / candidate p50
    screen_metric: float | None = None
    screen_drop: float | None = None
    screen_excess: float | None = None
    nsr: float | None = None
    metric: float | None = None
    drop: float | None = None
    worst_slice: str | None = None
    worst_slice_drop: float | None = None
    excess: float | None = None
    failure_certain: str | None = None
    passed: bool | None = None
    unresolved: str | None = None
    unresolved_on_spread: bool = False
    smoothing: dict[str, Any] = field(default_factory=dict)

    @property
    def evaluated(self) -> bool:
        return self.passed is not None

    def with_(self, **changes: Any) -> CandidateRecord:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class SearchReport:
    variant: str
    metric: str
    max_drop: float
    max_slice_drop: float  # where tolerance_basis is set, a share of FP32's figure on each slice, not a drop
    time_budget_s: float
    seconds: float
    outcome: str
    candidates: tuple[CandidateRecord, ...]
    chosen: int | None = None
    closest: int | None = None
    needed: str | None = None
    budget_exhausted: bool = False
    fp32_p50_ms: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    selection_rows: int | None = None
    tolerance_basis: str = ""


def search_from_dict(raw: dict[str, Any] | None, where: str = "search") -> SearchReport | None:
    if raw is None:
        return None
    raw = known_fields(raw, SearchReport, where)
    candidates = tuple(
        CandidateRecord(**{**known_fields(c, CandidateRecord, f"{where}.candidates[{i}]"),
                           "keep_float": tuple(c.get("keep_float", ()))})
        for i, c in enumerate(raw.get("candidates", []))
    )
    return SearchReport(**{**raw, "candidates": candidates, "notes": tuple(raw.get("notes", ()))})
