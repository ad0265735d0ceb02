"""The INT8 search's section of report.md and report.html (the same rows): every candidate, its technique,
options, kept-float nodes, speed, accuracy and verdict, then the outcome in words."""

from __future__ import annotations

import math
from html import escape
from typing import Any

from qbench.errors import one_line
from qbench.frontier.pareto import speedup
from qbench.report.grid import Grid, signed, to_markdown
from qbench.results.schema import SweepResults
from qbench.results.search import CandidateRecord, SearchReport

HEADERS = ["#", "candidate", "technique", "options", "kept float", "speed-up", "screen drop", "drop",
           "worst slice (drop)", "verdict"]  # fmt: skip
NUMERIC = frozenset({0, 5, 6, 7})
_NONE = "—"


def _num(value: float | None, fmt: str) -> str:
    return format(value, fmt) if value is not None and math.isfinite(value) else _NONE


def _options(record: CandidateRecord) -> str:
    return ", ".join([*(f"{k}={v}" for k, v in record.options.items()), *_smoothing(record.smoothing)]) or _NONE


def _smoothing(done: dict[str, Any]) -> list[str]:
    """What a SmoothQuant candidate's smoothing did on this graph: of its Linear inputs, how many were folded into
    which producers, how many got an inserted Mul, how many were left unsmoothed (alpha auto, or unfoldable: skip)."""
    if not done:
        return []
    folded, unsmoothed = done.get("folded_into", {}), done.get("unsmoothed_groups", 0)
    into = " (" + ", ".join(f"{op} {count}" for op, count in folded.items()) + ")" if folded else ""
    total = done.get("smoothed_groups", 0) + unsmoothed
    return [f"smoothing of {total} Linear input{'s' if total != 1 else ''}: {sum(folded.values())} folded{into}, "
            f"{done.get('inserted_muls', 0)} by an inserted Mul, {unsmoothed} unsmoothed"]


def _kept(record: CandidateRecord) -> str:
    if not record.keep_float:
        return _NONE
    shown = ", ".join(record.keep_float[:3])
    return shown + (f" (+{len(record.keep_float) - 3})" if len(record.keep_float) > 3 else "")


def search_rows(report: SearchReport) -> list[list[str]]:
    rows = []
    for index, r in enumerate(report.candidates):
        speed = _num(r.speedup, ".2f") + ("×" if r.speedup is not None and math.isfinite(r.speedup) else "")
        per_batch = " (" + ", ".join(f"{b} {v:.2f}" for b, v in r.speedups.items()) + ")" if r.speedups else ""
        known_worst = r.worst_slice and r.worst_slice_drop is not None
        worst = f"{r.worst_slice} ({signed(r.worst_slice_drop)})" if known_worst else _NONE
        rows.append([str(index), r.label, r.technique, _options(r), _kept(r), speed + per_batch,
                     signed(r.screen_drop), signed(r.drop), worst, one_line(r.verdict)])  # fmt: skip
    return rows


def search_title(report: SearchReport) -> str:
    return (f"INT8 search → {report.variant}: {report.outcome}, {len(report.candidates)} candidates in "
            f"{report.seconds:.0f} s (budget {report.time_budget_s:g} s), gate on {report.metric} "
            f"({report.tolerance_basis or f'max drop {report.max_drop:.4g}, per slice {report.max_slice_drop:.4g}'})")


def sweep_timing(results: SweepResults, report: SearchReport) -> list[str]:
    """The searched variant's speed-ups as the sweep measured them afterwards (its full latency measurement), one
    line per backend: the search's own figures are quick estimates, and the two can differ on a loaded machine."""
    lines = []
    for variant in results.variants:
        if variant.variant != report.variant or variant.status != "ok" or variant.latency is None:
            continue
        figures = [f"b{p.batch_size} {speedup(results, variant, p.batch_size):.2f}×" for p in variant.latency.points]
        lines.append(f"The sweep's own timing of {variant.key} afterwards: {', '.join(figures)} FP32 (the speed-ups "
                     "above are the search's quick estimates).")  # fmt: skip
    return lines


def search_summary(report: SearchReport, results: SweepResults) -> list[str]:
    """The outcome in words: the chosen candidate, or the closest and what it would need; the sweep's own timing of
    it; then the method."""
    lines = []
    if report.chosen is not None:
        chosen = report.candidates[report.chosen]
        lines.append(f"Chosen: #{report.chosen} {chosen.label} ({_num(chosen.speedup, '.2f')}× FP32, "
                     f"{report.metric} {_num(chosen.metric, '.4f')}).")  # fmt: skip
    elif report.closest is not None:
        closest = report.candidates[report.closest]
        head = "Pass unresolved" if report.outcome == "unresolved" else "Tolerance unreachable: closest"
        lines.append(f"{head}: {closest.label} (#{report.closest}); {report.needed}.")
    else:
        lines.append("No candidate could be built or measured.")
    if report.budget_exhausted:
        lines.append("The time budget left steps out (see the candidates not tried or not evaluated).")
    lines += sweep_timing(results, report)
    fp32 = ", ".join(f"{b} {v:.2f} ms" for b, v in report.fp32_p50_ms.items())
    lines += [f"FP32 p50 under the same quick timing: {fp32}." if fp32 else "", *report.notes]
    return [line for line in lines if line]


def search_markdown(results: SweepResults) -> str:
    """The search section of report.md ('' without a search)."""
    report = results.search
    if report is None:
        return ""
    return to_markdown(Grid(search_title(report), HEADERS, list(search_rows(report)), NUMERIC,
                            search_summary(report, results)))  # fmt: skip


def search_html(results: SweepResults) -> str:
    """The search section of report.html ('' without a search)."""
    report = results.search
    if report is None:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in HEADERS)
    body = []
    for index, row in enumerate(search_rows(report)):
        mark = ' class="chosen"' if index in (report.chosen, report.closest) else ""
        cells = "".join(f'<td class="num">{escape(c)}</td>' if i in NUMERIC else f"<td>{escape(c)}</td>"
                        for i, c in enumerate(row))  # fmt: skip
        body.append(f"<tr{mark}>{cells}</tr>")
    notes = "".join(f'<p class="meta">{escape(line)}</p>' for line in search_summary(report, results))
    return "\n".join(['<section id="search">', f"<h2>{escape(search_title(report))}</h2>", notes,
                      f"<table><thead><tr>{head}</tr></thead><tbody>", *body, "</tbody></table>",
                      "</section>"])  # fmt: skip
