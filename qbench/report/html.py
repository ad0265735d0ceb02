"""report.html: one self-contained page per sweep (inline CSS and SVG; no script, no link to the network).

It shows the gate verdict, the latency–accuracy frontier (qbench.frontier.svg: hover a point for
its variant, metric and latency), the per-slice table, each cell coloured by the gate's
judgement of its drop: green within tolerance, amber near it (more than NEAR_FRACTION of the
tolerance used), red a breach, grey not judged (slice below gate.min_slice_size) or not gated;
then the serving table (where the time goes, load, cost, bound, SLO) and the activation-range
analysis (FP16/BF16/FP8 limits per slice, INT8 clipping, calibration coverage), as report.md has them.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

from pydantic import ValidationError

from qbench.files import write_atomically
from qbench.frontier.pareto import gate_threshold
from qbench.frontier.svg import CSS as PANEL_CSS
from qbench.frontier.svg import backend_colours, batch_sizes, panel_svg
from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, GateReport
from qbench.gate.metric_check import GateCheck
from qbench.gate.report import check_line
from qbench.recipe.spec import GateSpec
from qbench.report.grid import compared, figure, to_html
from qbench.report.ranges import ranges_html
from qbench.report.search import search_html
from qbench.report.serving import serving_table
from qbench.results.schema import SliceMetrics, SweepResults, VariantResult
from qbench.slo import SLO_SCOPE
from qbench.validate.catalogue import custom_metrics, recorded_custom_metrics

NEAR_FRACTION = 0.5

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
.meta { color: #555; }
.verdict { padding: 0.6em 1em; border-radius: 6px; border-left: 6px solid; }
.verdict.pass { background: #e8f5e9; border-color: #2e7d32; }
.verdict.breach { background: #fdecea; border-color: #c62828; }
.verdict.unusable { background: #fff4e5; border-color: #b26a00; }
.verdict.none { background: #f2f2f2; border-color: #888; }
.panels { display: flex; flex-wrap: wrap; gap: 1em; }
svg.panel { background: #fff; border: 1px solid #ddd; font-size: 11px; }
.legend span { margin-right: 1.2em; }
.swatch { display: inline-block; width: 0.8em; height: 0.8em; border-radius: 50%; }
table { border-collapse: collapse; margin-top: 0.5em; } th, td { border: 1px solid #ddd; padding: 0.3em 0.6em; }
th { background: #f5f5f5; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.ok { background: #c8e6c9; } td.near { background: #ffe0b2; } td.breach { background: #ffcdd2; font-weight: 600; }
td.unjudged, td.not-gated { background: #f2f2f2; color: #666; } td.missing { color: #999; }
.warning { background: #fff4e5; padding: 0.4em 0.8em; border-left: 4px solid #b26a00; }
""" + PANEL_CSS


# -- verdict ----------------------------------------------------------------------------------------


def verdict_word(gate: GateReport) -> str:
    """PASS, BREACH or UNUSABLE, from the gate's exit code (the CI contract)."""
    return {EXIT_PASS: "PASS", EXIT_BREACH: "BREACH"}.get(gate.exit_code, "UNUSABLE")


def _verdict_section(gate: GateReport | None) -> str:
    if gate is None:
        return '<section id="verdict" class="verdict none"><h2>Gate</h2><p>No gate was evaluated.</p></section>'
    word = verdict_word(gate)
    judged = [c for c in gate.checks if c.status != "skipped"]
    lines = [f'<section id="verdict" class="verdict {word.lower()}" data-verdict="{word}">',
             f"<h2>Gate on {escape(gate.metric_text)}: {word}</h2>",
             f"<p>{len(gate.gated)} variant × backend pairs gated, {len(judged)} checks judged, "
             f"{len(gate.breaches)} breaches, {len(gate.problems)} "
             "problems that make results unusable.</p>"]  # fmt: skip
    if gate.breaches:
        lines.append("<ul class=\"breaches\">")
        lines += [f"<li>{escape(check_line(c))}{'' if c.scope == SLO_SCOPE else f' ({c.size} rows)'}</li>"
                  for c in gate.breaches]  # fmt: skip
        lines.append("</ul>")
    if gate.problems:
        lines.append('<ul class="problems">')
        lines += [f"<li>cannot judge (fail closed): {escape(p)}</li>" for p in gate.problems]
        lines.append("</ul>")
    return "\n".join(lines + ["</section>"])


# -- frontier -----------------------------------------------------------------------------------------


def _recorded_gate(results: SweepResults) -> GateSpec | None:
    """The gate the results' recipe states (None when it is not a valid one: the gate says what is wrong)."""
    try:
        return GateSpec.model_validate(results.recipe.get("gate"))
    except ValidationError:
        return None


def _frontier_section(results: SweepResults) -> str:
    threshold = gate_threshold(results, gate) if (gate := _recorded_gate(results)) is not None else None
    legend = "".join(f'<span><span class="swatch" style="background:{colour}"></span> {escape(backend)}</span>'
                     for backend, colour in backend_colours(results).items())  # fmt: skip
    note = "filled: on the frontier (no other variant is both faster and more accurate); hover a point for its figures"
    if threshold is not None:
        note += f"; dashed: the gate threshold ({escape(results.gate_metric)} {figure(threshold)})"
    panels = [panel_svg(results, size, threshold) for size in batch_sizes(results)]
    unmeasured = [f"{escape(v.key)} ({escape(v.status)})" for v in results.variants if v.status != "ok"]
    lines = ["<section id=\"frontier\">", f"<h2>Frontier: p50 latency vs {escape(results.gate_metric)}</h2>",
             f'<p class="legend">{legend}</p>', f'<p class="meta">{note}</p>',
             '<div class="panels">', *(panels or ["<p>No variant has a latency to plot.</p>"]), "</div>"]  # fmt: skip
    if unmeasured:
        lines.append(f'<p class="meta">not plotted: {", ".join(unmeasured)}</p>')
    return "\n".join(lines + ["</section>"])


# -- slices -------------------------------------------------------------------------------------------


def drop_class(check: GateCheck | None) -> str:
    """ok / near / breach / unjudged from the gate's check of one cell; not-gated without a check."""
    if check is None:
        return "not-gated"
    if check.status == "breach":
        return "breach"
    if check.status == "skipped":
        return "unjudged"
    return "near" if check.drop > NEAR_FRACTION * check.tolerance else "ok"


def _cell(scope: SliceMetrics | None, metric: str, check: GateCheck | None, key: str) -> str:
    value = scope.metrics.get(metric, math.nan) if scope else math.nan
    if scope is None or not math.isfinite(value):
        return f'<td class="num missing" data-variant="{escape(key)}">—</td>'
    drop = scope.drops.get(metric, math.nan)
    css = drop_class(check)
    drop_text = f" ({figure(drop, sign='+')})" if math.isfinite(drop) else ""
    title = f"drop {figure(drop, sign='+')}" if math.isfinite(drop) else "no drop"
    if check is not None:  # the drop and its tolerance with the decimals that tell them apart (report_grid.compared)
        shown_drop, shown_tolerance = compared(check.drop, check.tolerance)
        title = f"drop {shown_drop}, tolerance {shown_tolerance}: {css}"
    return f'<td class="num {css}" data-variant="{escape(key)}" title="{escape(title)}">{figure(value)}{drop_text}</td>'


def _slice_section(results: SweepResults, gate: GateReport | None) -> str:
    metric = results.gate_metric
    measured: list[VariantResult] = [v for v in results.variants if v.status == "ok" and v.accuracy is not None]
    names = list(dict.fromkeys(s.name for v in measured for s in v.accuracy.slices))
    checks = {(c.variant, c.backend, c.scope): c for c in (gate.checks if gate else ())}
    multi_backend = len(results.backends()) > 1
    header = "".join(f"<th>{escape(v.key if multi_backend else v.variant)}</th>" for v in measured)
    rows = []
    for name in ["overall", *names]:
        scopes = [v.accuracy.overall if name == "overall" else v.accuracy.slice(name) for v in measured]
        size = next((s.size for s in scopes if s is not None), None)
        cells = "".join(_cell(s, metric, checks.get((v.variant, v.backend, name)), v.key)
                        for v, s in zip(measured, scopes))
        rows.append(f'<tr class="slice" data-slice="{escape(name)}"><th>{escape(name)}</th>'
                    f'<td class="num">{size if size is not None else "—"}</td>{cells}</tr>')  # fmt: skip
    legend = (f"{escape(metric)} (drop vs FP32, positive = worse). Green: within the gate's tolerance; amber: "
              f"more than {NEAR_FRACTION:.0%} of it used; red: breach; grey: not judged (slice too small) "
              "or not gated.")  # fmt: skip
    return "\n".join(['<section id="slices">', f"<h2>Per slice: {escape(metric)}</h2>", f'<p class="meta">{legend}</p>',
                      f"<table><thead><tr><th>slice</th><th>rows</th>{header}</tr></thead>",
                      "<tbody>", *rows, "</tbody></table>", "</section>"])  # fmt: skip


# -- page ---------------------------------------------------------------------------------------------


def _header(results: SweepResults) -> str:
    recipe = results.recipe
    name = escape(str(recipe.get("name", "")))
    facts = (f"created {escape(results.created_at)} with qbench {escape(results.qbench_version)}; "
             f"reference {escape(results.reference)}; "
             f"{'gate metrics' if results.gate_metrics else 'gate metric'} "
             f"{escape(', '.join(results.gate_metrics or (results.gate_metric,)))}; "
             f"{results.evaluation_rows} evaluation rows; recipe {escape(str(recipe.get('path', '')))}")  # fmt: skip
    return f"<h1>qbench report: {name}</h1>\n<p class=\"meta\">{facts}</p>"


def render_html(results: SweepResults, gate: GateReport | None) -> str:
    title = escape(f"qbench report: {results.recipe.get('name', '')}")
    serving = serving_table(results, gate)
    body = [_header(results), _verdict_section(gate), _frontier_section(results), _slice_section(results, gate),
            to_html(serving, "serving") if serving is not None else "", ranges_html(results),
            search_html(results)]  # fmt: skip
    return "\n".join(["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
                      f"<title>{title}</title>", f"<style>{_CSS}</style>", "</head>", "<body>", *body,
                      "</body>", "</html>"]) + "\n"  # fmt: skip


def write_html_report(results: SweepResults, gate: GateReport | None, path: Path) -> Path:
    """Write report.html (one file, viewable offline)."""
    with custom_metrics(recorded_custom_metrics(results.recipe.get("resolved", {}))):  # `qbench report --html`
        text = render_html(results, gate)
    return write_atomically(path, text, what="the HTML report")
