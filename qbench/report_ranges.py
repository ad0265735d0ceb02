"""The report's activation-range section: tensors over a float format's limit, INT8 clipping, coverage."""

from __future__ import annotations

from qbench.report_grid import NONE, Cell, Grid, markdown_table, md_cell, short
from qbench.results import LimitCheck, SweepResults

_FORMAT_NAMES = {"fp16": "FP16", "bf16": "BF16", "fp8_e4m3": "FP8 E4M3"}
_PEAKS_SHOWN = 5


def _magnitude(value: float) -> str:
    """An activation magnitude: 98,941 or 999.8 or 3.403e+38."""
    return f"{value:,.0f}" if 10_000 <= value < 1e9 else f"{value:.4g}"


def _limit_line(check: LimitCheck, scopes: list[str]) -> list[str]:
    """'- FP16 limit (65504):' then one sub-line per scope with tensors over it (tensor, node, abs max)."""
    scale = f" × {check.scaled_by}'s per-tensor scale" if check.scaled_by else ""
    lines = [f"- {_FORMAT_NAMES.get(check.format, check.format)} limit ({check.limit:g}{scale}):"]
    for scope in scopes:
        peaks = check.over.get(scope, ())
        shown = ", ".join(f"`{p.tensor}` from node `{p.node}` ({_magnitude(p.abs_max)} > {_magnitude(p.limit)})"
                          for p in peaks[:_PEAKS_SHOWN])  # fmt: skip
        more = f", and {len(peaks) - _PEAKS_SHOWN} more" if len(peaks) > _PEAKS_SHOWN else ""
        lines += [f"  - slice `{scope}`: {md_cell(shown)}{more}"] if peaks else []
    return lines if len(lines) > 1 else [lines[0] + " no tensor over it"]


def ranges_section(results: SweepResults) -> str:
    """Why a slice breaks: tensors over FP16/BF16/FP8 limits and the share each calibrated variant clips."""
    analysis = results.ranges
    if analysis is None:
        return ""
    sweep_seconds = results.timings.get("total") or sum(results.timings.values())  # no total yet: phases so far
    share = f" ({analysis.seconds / sweep_seconds:.1%} of the sweep's timed phases)" if sweep_seconds else ""
    lines = ["## Activation ranges", "",
             f"One FP32 pass over {analysis.rows} evaluation rows, {len(analysis.nodes)} float tensors: "
             f"{short(analysis.seconds)} s{share}.", "", "Tensors whose abs max exceeds a format's largest value:", ""]  # fmt: skip
    scopes = [s for s in analysis.abs_max if s != "overall"] or ["overall"]
    for check in analysis.limits:
        lines += _limit_line(check, scopes)
    if analysis.unattributed:
        lines.append(f"- {len(analysis.unattributed)} tensor(s) have no batch-first dimension: counted in overall only")
    counts = results.calibration.per_slice_counts if results.calibration else {}
    if results.calibration:
        counts = {"overall": results.calibration.size, **counts}
    rows: list[list[Cell]] = [
        [r.variant, r.scope, str(counts.get(r.scope, NONE)), f"{r.share * 100:.3g}%",
         f"{r.worst_node} ({r.worst_tensor}, {r.worst_share * 100:.3g}%)" if r.worst_node else NONE]
        for r in analysis.clipping
    ]  # fmt: skip
    if rows:
        headers = ["variant", "slice", "calibration rows", "clipped", "worst node (tensor, clipped)"]
        lines += ["", "Activations outside each variant's calibrated ranges:", ""]
        lines += markdown_table(Grid("Clipping", headers, rows, frozenset({2, 3})))
    lines += [""] + [f"- **Calibration coverage warning:** {md_cell(w.message)}" for w in analysis.warnings]
    return "\n".join(lines) + "\n"
