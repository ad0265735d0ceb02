"""The INT8 search's report section, from hand-built search reports."""

from __future__ import annotations

from qbench.report_search import search_markdown
from qbench.results_search import CandidateRecord, SearchReport
from qbench.search import select


def _report(outcome: str, candidates: tuple[CandidateRecord, ...], **more) -> SearchReport:
    return SearchReport(variant="int8-search", metric="cosine", max_drop=1e-5, max_slice_drop=2e-5, time_budget_s=60,
                        seconds=3.2, outcome=outcome, candidates=candidates, **more)  # fmt: skip


def test_a_search_that_built_nothing_is_not_called_unreachable():
    failed = CandidateRecord("ort-static", "ort-static", stage="failed",
                             verdict="build failed: Fail: [ONNXRuntimeError] : 1 :\n  Load model failed\n  at line 3")  # fmt: skip
    markdown = search_markdown(_report("nothing built", (failed,)))
    assert "int8-search: nothing built, 1 candidates" in markdown and "unreachable" not in markdown
    assert "No candidate could be built or measured." in markdown
    row = next(line for line in markdown.splitlines() if line.startswith("| 0 "))
    assert row.endswith("| build failed: Fail: [ONNXRuntimeError] : 1 : Load model failed at line 3 |")  # one line


def test_tiny_drops_and_tolerances_are_printed_with_their_digits():
    near = CandidateRecord("ort-dynamic", "ort-dynamic", stage="evaluated", drop=3e-5, excess=3.0, passed=False,
                           worst_slice="topic=a", worst_slice_drop=4e-5)  # fmt: skip
    needed = select.needed(near, 1e-5, 2e-5, budget_exhausted=False, keep_float_exhausted=False)
    assert needed.startswith("overall drop 3.00e-05 > 1e-05 (cut it by 67%); topic=a drop 4.00e-05 > 2e-05")
    assert "max_drop ≥ 3.00e-05, max_slice_drop ≥ 4.00e-05" in needed
    markdown = search_markdown(_report("unreachable", (near,), closest=0, needed=needed))
    assert "| +3.00e-05 | topic=a (+4.00e-05) |" in markdown
