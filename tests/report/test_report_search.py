"""The INT8 search's report section, from hand-built search reports."""

from __future__ import annotations

import dataclasses
import json

from sweep_factory import make_sweep, make_variant

from qbench.report.search import search_markdown
from qbench.results.search import CandidateRecord, SearchReport, search_from_dict
from qbench.search import select


def _report(outcome: str, candidates: tuple[CandidateRecord, ...], **more) -> SearchReport:
    return SearchReport(variant="int8-search", metric="cosine", max_drop=1e-5, max_slice_drop=2e-5, time_budget_s=60,
                        seconds=3.2, outcome=outcome, candidates=candidates, **more)  # fmt: skip


def _searched(report: SearchReport, variants=()) -> object:
    return dataclasses.replace(make_sweep([make_variant("fp32", "fp32", p50_by_batch={1: 1.0, 32: 20.0}), *variants]),
                               search=report)  # fmt: skip


def test_a_search_that_built_nothing_is_not_called_unreachable():
    failed = CandidateRecord("ort-static", "ort-static", stage="failed",
                             verdict="build failed: Fail: [ONNXRuntimeError] "
                                     ": 1 :\n  Load model failed\n  at line 3")  # fmt: skip
    markdown = search_markdown(_searched(_report("nothing built", (failed,))))
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
    markdown = search_markdown(_searched(_report("unreachable", (near,), closest=0, needed=needed)))
    assert "| +3.00e-05 | topic=a (+4.00e-05) |" in markdown


def test_the_sweeps_own_timing_of_the_searched_variant_is_shown_beside_the_searchs_estimate():
    """The search said 1.90x from its quick screening timing; the sweep's full measurement afterwards said 1.25x at
    batch 1 and 1.60x at 32 (20 / 12.5): a reader sees both, and which is which."""
    chosen = CandidateRecord("smoothquant-static", "smoothquant", stage="evaluated", speedup=1.9, passed=True,
                             verdict="chosen", metric=0.999, excess=0.2)  # fmt: skip
    searched = make_variant("int8-search", "int8", p50_by_batch={1: 0.8, 32: 12.5})
    markdown = search_markdown(_searched(_report("passed", (chosen,), chosen=0), [searched]))
    assert "Chosen: #0 smoothquant-static (1.90× FP32" in markdown
    assert ("The sweep's own timing of int8-search@onnxruntime-cpu afterwards: b1 1.25×, b32 1.60× FP32 (the speed-ups "
            "above are the search's quick estimates).") in markdown


def test_a_smoothquant_candidate_says_where_its_smoothing_went():
    """On a graph it cannot fold into (a post-LN encoder's residual reads the LayerNorm), SmoothQuant inserts Muls:
    each candidate's row says how many Linear inputs were folded, into what, and how many were not, and the record
    round-trips through results.json."""
    smoothing = {"smoothed_groups": 8, "folded_into": {"LayerNormalization": 4, "Mul": 1}, "inserted_muls": 3,
                 "unsmoothed_groups": 1, "alphas_chosen": {"0.5": 8, "none": 1}}  # fmt: skip
    sq = CandidateRecord("smoothquant-static a=auto", "smoothquant-static", {"alpha": "auto"}, stage="screened",
                         smoothing=smoothing)  # fmt: skip
    plain = CandidateRecord("ort-dynamic", "ort-dynamic", {"reduce_range": False}, stage="screened")
    markdown = search_markdown(_searched(_report("passed", (sq, plain), chosen=1)))
    rows = [line for line in markdown.splitlines() if line.startswith(("| 0 ", "| 1 "))]
    assert ("| alpha=auto, smoothing of 9 Linear inputs: 5 folded (LayerNormalization 4, Mul 1), 3 by an inserted Mul, "
            "1 unsmoothed |") in rows[0]  # fmt: skip
    assert "| reduce_range=False |" in rows[1] and "smoothing" not in rows[1]
    one = CandidateRecord("smoothquant-dynamic a=0.5 +3 float", "smoothquant-dynamic", {"alpha": 0.5}, stage="screened",
                          smoothing={"smoothed_groups": 1, "folded_into": {"Mul": 1}})  # fmt: skip
    assert ("| alpha=0.5, smoothing of 1 Linear input: 1 folded (Mul 1), 0 by an inserted Mul, 0 unsmoothed |"
            in search_markdown(_searched(_report("passed", (one,), chosen=0))))  # fmt: skip
    again = search_from_dict(json.loads(json.dumps(dataclasses.asdict(_report("passed", (sq, plain))))))
    assert again is not None and again.candidates[0].smoothing == smoothing and again.candidates[1].smoothing == {}
