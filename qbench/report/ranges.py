"""The report's activation-range section: tensors over a float format's limit, INT8 clipping, coverage.

Built once as a `RangeView` and rendered as Markdown (report.md) or HTML (report.html).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from qbench.errors import plain_name
from qbench.report.grid import NONE, Cell, Grid, html_inline, markdown_table, md_cell, short, to_html
from qbench.results.ranges import LimitCheck, TensorPeak
from qbench.results.schema import SweepResults

_FORMAT_NAMES = {"fp16": "FP16", "bf16": "BF16", "fp8_e4m3": "FP8 E4M3"}
_PEAKS_SHOWN = 5
TITLE = "Activation ranges"


def _magnitude(value: float) -> str:
    """An activation magnitude: 98,941 or 999.8 or 3.403e+38."""
    return f"{value:,.0f}" if 10_000 <= value < 1e9 else f"{value:.4g}"


@dataclass(frozen=True)
class LimitLines:
    """One format's limit and, per slice with tensors over it, a line naming them (`code` marks names)."""

    heading: str
    slices: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RangeView:
    intro: str
    limits: list[LimitLines]
    unattributed: str | None
    unanalysed: str | None
    clipping: Grid | None
    warnings: list[str]


def _peaks(peaks: Sequence[TensorPeak]) -> str:
    shown = ", ".join(f"`{plain_name(p.tensor)}` from node `{plain_name(p.node)}` ({_magnitude(p.abs_max)} > "
                      f"{_magnitude(p.limit)}"
                      f"{f': {p.handled}' if p.handled else ''})" for p in peaks[:_PEAKS_SHOWN])  # fmt: skip
    return shown + (f", and {len(peaks) - _PEAKS_SHOWN} more" if len(peaks) > _PEAKS_SHOWN else "")


def _limit_lines(check: LimitCheck, scopes: list[str]) -> LimitLines:
    """Per slice, the tensors over the limit; those the sweep's FP16 variants keep in FP32 or clamp harmlessly, or its
    BF16 variants saturate (TensorPeak.handled), are named apart: no variant of the sweep overflows there."""
    scale = f" × {check.scaled_by}'s per-tensor scale" if check.scaled_by else ""
    name, lines = _FORMAT_NAMES.get(check.format, check.format), []
    for scope in scopes:
        over = [p for p in check.over.get(scope, ()) if p.handled is None]
        handled = [p for p in check.over.get(scope, ()) if p.handled is not None]
        parts = [_peaks(over)] if over else []
        parts += [f"no overflow in the sweep's {name} variant(s): {_peaks(handled)}"] if handled else []
        lines += [f"slice `{scope}`: {'; '.join(parts)}"] if parts else []
    return LimitLines(f"{name} limit ({check.limit:g}{scale})", lines)


def range_view(results: SweepResults) -> RangeView | None:
    """Why a slice breaks: tensors over FP16/BF16/FP8 limits and the share each calibrated variant clips."""
    analysis = results.ranges
    if analysis is None:
        return None
    sweep_seconds = results.timings.get("total") or sum(results.timings.values())  # no total yet: phases so far
    share = f" ({analysis.seconds / sweep_seconds:.1%} of the sweep's timed phases)" if sweep_seconds else ""
    intro = (f"One FP32 pass over {analysis.rows} evaluation rows, {len(analysis.nodes)} float tensors: "
             f"{short(analysis.seconds)} s{share}.")  # fmt: skip
    scopes = [s for s in analysis.abs_max if s != "overall"] or ["overall"]
    unattributed = (f"{len(analysis.unattributed)} tensor(s) have no batch-first dimension: counted in overall only"
                    if analysis.unattributed else None)  # fmt: skip
    inside = analysis.subgraph_nodes
    more = ", ..." if len(inside) > _PEAKS_SHOWN else ""
    holders = ", ".join(f"`{name}`" for name in list(inside)[:_PEAKS_SHOWN]) + more
    unanalysed = (f"not analysed: {sum(inside.values())} node(s) inside the control-flow subgraphs (If/Loop/Scan) of "
                  f"{holders}; their tensors are not graph outputs, so an overflow or clipping there is not shown"
                  if inside else None)  # fmt: skip
    counts = results.calibration.per_slice_counts if results.calibration else {}
    if results.calibration:
        counts = {"overall": results.calibration.size, **counts}
    rows: list[list[Cell]] = [
        [r.variant, r.scope, str(counts.get(r.scope, NONE)), f"{r.share * 100:.3g}%",
         f"{plain_name(r.worst_node)} ({plain_name(r.worst_tensor)}, {r.worst_share * 100:.3g}%)" if r.worst_node
         else NONE]  # a converter's name: one holding a newline is quoted with escapes, not shown as another name
        for r in analysis.clipping
    ]  # fmt: skip
    headers = ["variant", "slice", "calibration rows", "clipped", "worst node (tensor, clipped)"]
    title = "Activations outside each variant's calibrated ranges"
    clipping = Grid(title, headers, rows, frozenset({2, 3})) if rows else None
    return RangeView(intro, [_limit_lines(c, scopes) for c in analysis.limits], unattributed, unanalysed, clipping,
                     [w.message for w in analysis.warnings])  # fmt: skip


def ranges_section(results: SweepResults) -> str:
    """The Markdown section of report.md ('' without a range analysis)."""
    view = range_view(results)
    if view is None:
        return ""
    lines = [f"## {TITLE}", "", view.intro, "", "Tensors whose abs max exceeds a format's largest value:", ""]
    for limit in view.limits:
        lines += [f"- {limit.heading}:", *(f"  - {md_cell(line)}" for line in limit.slices)] if limit.slices else [
            f"- {limit.heading}: no tensor over it"]  # fmt: skip
    lines += [f"- {view.unattributed}"] if view.unattributed else []
    lines += [f"- **{md_cell(view.unanalysed)}**"] if view.unanalysed else []
    if view.clipping is not None:
        lines += ["", f"{view.clipping.title}:", ""]
        lines += markdown_table(view.clipping)
    lines += [""] + [f"- **Calibration coverage warning:** {md_cell(w)}" for w in view.warnings]
    return "\n".join(lines) + "\n"


def ranges_html(results: SweepResults) -> str:
    """The same section for report.html ('' without a range analysis)."""
    view = range_view(results)
    if view is None:
        return ""
    items = []
    for limit in view.limits:
        inner = "".join(f"<li>{html_inline(line)}</li>" for line in limit.slices)
        items.append(f"<li>{escape(limit.heading)}: <ul>{inner}</ul></li>" if inner
                     else f"<li>{escape(limit.heading)}: no tensor over it</li>")  # fmt: skip
    items += [f"<li>{escape(view.unattributed)}</li>"] if view.unattributed else []
    items += [f"<li><strong>{html_inline(view.unanalysed)}</strong></li>"] if view.unanalysed else []
    lines = ['<section id="ranges">', f"<h2>{TITLE}</h2>", f'<p class="meta">{escape(view.intro)}</p>',
             "<p>Tensors whose abs max exceeds a format's largest value:</p>",
             f'<ul class="limits">{"".join(items)}</ul>']  # fmt: skip
    if view.clipping is not None:
        lines.append(to_html(view.clipping, "clipping", heading="h3"))
    lines += [f'<p class="warning"><strong>Calibration coverage warning:</strong> {escape(w)}</p>'
              for w in view.warnings]
    return "\n".join([*lines, "</section>"])
