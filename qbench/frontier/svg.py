"""The latency–accuracy frontier drawn as SVG by qbench's own code (no script, no network, no plotting library).

`panel_svg` draws one batch size's panel (inlined in report.html); `frontier_document` the standalone frontier.svg
that a sweep writes beside its reports: every panel, a cost-per-inference panel when the recipe prices the hardware,
a title, a legend of backends and the variants that could not be plotted. MLflow's artifact view and GitHub's markdown
show it as an image. It replaced a matplotlib PNG: importing matplotlib and laying out its first text cost a
`qbench sweep` process about 0.9 s of CPU, the largest cost qbench itself added to a sweep of a small model.

Every measured variant is a point with a `<title>` (the browser's hover tooltip: variant, backend, metric, drop,
p50/p99 latency) and a label naming it (variants on the same spot share one, e.g. 'fp32, fp16'; a label moves to
another side of its point rather than cover another label or point). Points on the frontier are filled and carry
the class `frontier`, each backend's frontier is drawn as steps, and the gate threshold as a dashed line. Better is
up and to the left: the y axis is flipped for lower-is-better metrics, and the x axis is logarithmic when the
latencies span more than 10x.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from html import escape
from pathlib import Path

from qbench.files import write_atomically
from qbench.frontier.pareto import frontier_of, overall_metric, timed_on
from qbench.results.schema import SweepResults, VariantResult
from qbench.validate.catalogue import METRICS

WIDTH, HEIGHT = 440, 320
LEFT, RIGHT, TOP, BOTTOM = 62, 14, 26, 44  # margins around the plotting area
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
THRESHOLD_COLOUR = "#c62828"
CSS = f"""
svg .grid {{ stroke: #e6e6e6; }} svg .frame {{ fill: none; stroke: #999; }}
svg .threshold {{ stroke: {THRESHOLD_COLOUR}; stroke-dasharray: 5 4; stroke-width: 1.5; }}
svg .steps {{ fill: none; stroke-width: 1.5; }}
svg .point {{ stroke-width: 2; cursor: pointer; }} svg .point:hover {{ stroke-width: 4; }}
svg .panel-title {{ font-size: 13px; font-weight: 600; }} svg .point-label {{ font-size: 10px; fill: #333; }}
"""  # the panels' styles, in report.html's stylesheet and in frontier.svg's own


@dataclass(frozen=True)
class PlotPoint:
    variant: VariantResult
    batch_size: int
    p50_ms: float
    p99_ms: float
    metric: float
    on_frontier: bool


def backend_colours(results: SweepResults) -> dict[str, str]:
    return {b: PALETTE[i % len(PALETTE)] for i, b in enumerate(results.backends())}


def plot_points(results: SweepResults, batch_size: int) -> list[PlotPoint]:
    """Every ok variant with a finite metric and a finite p50 at `batch_size`."""
    frontier = {(p.backend, p.variant) for p in frontier_of(results) if p.batch_size == batch_size}
    points = []
    for variant in results.variants:
        value = overall_metric(variant, results.gate_metric)
        timing = variant.latency.at(batch_size) if variant.status == "ok" and variant.latency else None
        if timing is not None and math.isfinite(value) and math.isfinite(timing.p50_ms) and timing.p50_ms > 0:
            on = (variant.backend, variant.variant) in frontier
            points.append(PlotPoint(variant, batch_size, timing.p50_ms, timing.p99_ms, value, on))
    return points


def batch_sizes(results: SweepResults) -> list[int]:
    return sorted({p.batch_size for v in results.variants if v.status == "ok" and v.latency for p in v.latency.points})


# -- scales -----------------------------------------------------------------------------------------


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About `count` round values (1, 2 or 5 x 10^k apart) covering [low, high]."""
    if not high > low:
        return [low]
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step - 1e-9) * step
    return [round(first + i * step, 12) for i in range(int((high - first) / step + 1e-9) + 1)]


def log_ticks(low: float, high: float) -> list[float]:
    """1, 2 and 5 x 10^k within [low, high]."""
    ticks = []
    for exponent in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1):
        ticks += [m * 10.0**exponent for m in (1, 2, 5) if low <= m * 10.0**exponent <= high]
    return ticks


@dataclass(frozen=True)
class _Axis:
    low: float
    high: float
    start: float  # pixel of `low`
    end: float  # pixel of `high`
    log: bool = False

    def _scaled(self, value: float) -> float:
        return math.log10(value) if self.log else value

    def __call__(self, value: float) -> float:
        """The pixel of `value`."""
        span = self._scaled(self.high) - self._scaled(self.low)
        fraction = (self._scaled(value) - self._scaled(self.low)) / span if span else 0.5
        return self.start + fraction * (self.end - self.start)

    def ticks(self) -> list[float]:
        return log_ticks(self.low, self.high) if self.log else nice_ticks(self.low, self.high)


def _padded(low: float, high: float, log: bool) -> tuple[float, float]:
    """The range with 10 % room on each side (multiplicative on a log axis)."""
    if log:
        ratio = (high / low) ** 0.1
        return low / ratio, high * ratio
    pad = (high - low) * 0.1 or abs(high) * 0.05 or 0.05
    return low - pad, high + pad


def _axes(xs: list[float], ys: list[float], higher_is_better: bool) -> tuple[_Axis, _Axis]:
    log = min(xs) > 0 and max(xs) / min(xs) > 10
    x_low, x_high = _padded(min(xs), max(xs), log)
    y_low, y_high = _padded(min(ys), max(ys), False)
    bottom, top = HEIGHT - BOTTOM, TOP
    y_axis = _Axis(y_low, y_high, bottom, top) if higher_is_better else _Axis(y_low, y_high, top, bottom)
    return _Axis(x_low, x_high, LEFT, WIDTH - RIGHT, log), y_axis


# -- drawing ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Mark:
    """A point as drawn on a panel: x is its p50 (ms) or its cost (USD per million inferences)."""

    variant: VariantResult
    x: float
    metric: float
    filled: bool
    tooltip: str


def _fmt(value: float) -> str:
    return f"{value:.1f}"


def tooltip(point: PlotPoint, metric: str) -> str:
    overall = point.variant.accuracy.overall if point.variant.accuracy else None
    drop = overall.drops.get(metric) if overall else None
    drop_text = f" (drop {drop:+.4f})" if drop is not None and math.isfinite(drop) else ""
    frontier = ", on the frontier" if point.on_frontier else ""
    return (f"{point.variant.variant} on {point.variant.backend}{frontier}\n{metric} {point.metric:.4f}{drop_text}\n"
            f"batch {point.batch_size}: p50 {point.p50_ms:.3f} ms, p99 {point.p99_ms:.3f} ms")  # fmt: skip


def _grid(x: _Axis, y: _Axis) -> list[str]:
    parts = []
    for tick in x.ticks():
        px = _fmt(x(tick))
        parts.append(f'<line class="grid" x1="{px}" x2="{px}" y1="{TOP}" y2="{HEIGHT - BOTTOM}"/>')
        parts.append(f'<text class="tick" x="{px}" y="{HEIGHT - BOTTOM + 14}" text-anchor="middle">{tick:g}</text>')
    for tick in y.ticks():
        py = _fmt(y(tick))
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py}" y2="{py}"/>')
        parts.append(f'<text class="tick" x="{LEFT - 6}" y="{py}" dy="4" text-anchor="end">{tick:g}</text>')
    return parts


def _steps(marks: list[_Mark], colour: str, x: _Axis, y: _Axis) -> str:
    """A backend's frontier as a staircase from its fastest to its most accurate point."""
    ordered = sorted(marks, key=lambda m: m.x)
    coordinates = []
    for index, mark in enumerate(ordered):
        if index:
            coordinates.append(f"{_fmt(x(mark.x))},{_fmt(y(ordered[index - 1].metric))}")
        coordinates.append(f"{_fmt(x(mark.x))},{_fmt(y(mark.metric))}")
    return f'<polyline class="steps" stroke="{colour}" points="{" ".join(coordinates)}"/>'


# Where a label may go, in pixels from its point (dx, dy of the baseline, anchor): tried in order.
_LABEL_OFFSETS = ((7, -5, "start"), (7, 13, "start"), (-7, -5, "end"), (-7, 13, "end"), (7, -17, "start"),
                  (7, 25, "start"))  # fmt: skip
_CHAR_PX, _LABEL_PX = 6.0, 10.0  # a 10px label's average character width and its height (no font metrics here)
_SAME_SPOT_PX = 8.0  # points closer than this share one label
_Box = tuple[float, float, float, float]


def _overlap(a: _Box, b: _Box, pad: float = 0.0) -> bool:
    return a[0] - pad < b[2] and b[0] < a[2] + pad and a[1] - pad < b[3] and b[1] < a[3] + pad


def _labels(spots: list[tuple[str, float, float]]) -> list[str]:
    """A `<text>` naming each (name, px, py) point, on the first side of it where the label stays inside the
    plotting area and covers no earlier label and no point; on the first side when none is free."""
    groups: list[tuple[list[str], float, float]] = []
    for name, px, py in sorted(spots, key=lambda s: (s[1], s[2])):
        near = next((g for g in groups if math.dist(g[1:], (px, py)) < _SAME_SPOT_PX), None)
        if near is None:
            groups.append(([name], px, py))
        elif name not in near[0]:
            near[0].append(name)
    taken: list[_Box] = [(px - 5, py - 5, px + 5, py + 5) for _, px, py in spots]
    parts = []
    for names, px, py in groups:
        text = ", ".join(names)
        width = len(text) * _CHAR_PX
        boxes = []
        for dx, dy, anchor in _LABEL_OFFSETS:
            left = px + dx if anchor == "start" else px + dx - width
            boxes.append(((left, py + dy - _LABEL_PX, left + width, py + dy + 2), dx, dy, anchor))
        inside = [b for b in boxes if LEFT <= b[0][0] and b[0][2] <= WIDTH - RIGHT and TOP <= b[0][1]
                  and b[0][3] <= HEIGHT - BOTTOM]  # fmt: skip
        box, dx, dy, anchor = next((b for b in inside if not any(_overlap(b[0], t, 2.0) for t in taken)), boxes[0])
        taken.append(box)
        parts.append(f'<text class="point-label" x="{_fmt(px + dx)}" y="{_fmt(py + dy)}" text-anchor="{anchor}">'
                     f"{escape(text)}</text>")  # fmt: skip
    return parts


def _panel(results: SweepResults, title: str, marks: list[_Mark], threshold: float | None, *,
           x_label: tuple[str, str], steps: bool, data: str = "") -> str:  # fmt: skip
    """A panel of `marks` against the gate metric, its x axis named by `x_label` (what, in what unit); `steps`
    joins each backend's filled marks as a frontier."""
    metric = results.gate_metric
    head = f'<svg class="panel" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img">'
    heading = f'<text class="panel-title" x="{WIDTH / 2}" y="16" text-anchor="middle">{escape(title)}</text>'
    ys = [m.metric for m in marks] + ([threshold] if threshold is not None else [])
    x, y = _axes([m.x for m in marks], ys, METRICS[metric].higher_is_better)
    colours = backend_colours(results)
    parts = [head, heading, *_grid(x, y)]
    frame = f'x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{HEIGHT - TOP - BOTTOM}"'
    parts.append(f'<rect class="frame" {frame}/>')
    if threshold is not None:
        py = _fmt(y(threshold))
        parts.append(f'<line class="threshold" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py}" y2="{py}">'
                     f"<title>gate threshold: {escape(metric)} {threshold:.4f}</title></line>")  # fmt: skip
    lines: dict[tuple[str, str], list[_Mark]] = {}  # one per backend and kind of timing machine
    for mark in marks:
        if steps and mark.filled:
            lines.setdefault((mark.variant.backend, timed_on(mark.variant)), []).append(mark)
    for (backend, _), on in lines.items():
        parts.append(_steps(on, colours[backend], x, y))
    for mark in sorted(marks, key=lambda m: m.filled):  # filled (frontier) points drawn last, on top
        colour = colours[mark.variant.backend]
        css = "point frontier" if steps and mark.filled else "point"
        parts.append(
            f'<circle class="{css}" data-variant="{escape(mark.variant.variant)}" '
            f'data-backend="{escape(mark.variant.backend)}"{data} cx="{_fmt(x(mark.x))}" cy="{_fmt(y(mark.metric))}" '
            f'r="5" fill="{colour if mark.filled else "#ffffff"}" '
            f'stroke="{colour}"><title>{escape(mark.tooltip)}</title>'
            "</circle>"
        )
    parts += _labels([(m.variant.variant, x(m.x), y(m.metric)) for m in marks])
    axis_note = ", log scale" if x.log else ""
    parts.append(f'<text class="label" x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 8}" text-anchor="middle">'
                 f"{escape(x_label[0])} ({escape(x_label[1])}{axis_note})</text>")  # fmt: skip
    parts.append(f'<text class="label" transform="rotate(-90)" x="{-(TOP + HEIGHT - BOTTOM) / 2}" y="14" '
                 f'text-anchor="middle">{escape(metric)}</text>')  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


def panel_svg(results: SweepResults, batch_size: int, threshold: float | None) -> str:
    """One batch size's panel; an empty panel says why when nothing can be plotted."""
    metric = results.gate_metric
    points = plot_points(results, batch_size)
    if not points:
        message = f"no variant has a latency and a finite {escape(metric)} at this batch size"
        return (f'<svg class="panel" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img">'
                f'<text class="panel-title" x="{WIDTH / 2}" y="16" text-anchor="middle">batch size {batch_size}</text>'
                f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">{message}</text></svg>')  # fmt: skip
    marks = [_Mark(p.variant, p.p50_ms, p.metric, p.on_frontier, tooltip(p, metric)) for p in points]
    return _panel(results, f"batch size {batch_size}", marks, threshold, x_label=("p50 latency per batch", "ms"),
                  steps=True, data=f' data-batch="{batch_size}"')  # fmt: skip


def cost_marks(results: SweepResults) -> list[_Mark]:
    """A point per ok variant with a price (`cost:`): its USD per million inferences at its highest measured
    throughput, against its metric."""
    marks = []
    for variant in results.variants:
        value = overall_metric(variant, results.gate_metric)
        costs = variant.serving.usd_per_million if variant.status == "ok" and variant.serving else {}
        batch_costs = [c for key, c in costs.items() if key.startswith("b") and math.isfinite(c)]
        if batch_costs and math.isfinite(value):
            cost = min(batch_costs)
            text = (f"{variant.variant} on {variant.backend}\n{results.gate_metric} {value:.4f}\n"
                    f"USD {cost:.4g} per million inferences")  # fmt: skip
            marks.append(_Mark(variant, cost, value, True, text))
    return marks


def unplotted(results: SweepResults) -> list[str]:
    """Variants that cannot appear on any panel, with the reason."""
    missing = []
    for v in results.variants:
        if v.status != "ok":
            missing.append(f"{v.key} (failed)")
        elif not math.isfinite(overall_metric(v, results.gate_metric)):
            missing.append(f"{v.key} (no {results.gate_metric})")
        elif v.latency is None or not v.latency.points:
            missing.append(f"{v.key} (no latency)")
    return missing


# -- the standalone document ------------------------------------------------------------------------

_PAD, _GAP, _LINE = 12, 16, 16  # the document's margin, the gap between panels, a line of text


def _legend(results: SweepResults, threshold: float | None, width: float) -> tuple[list[str], int]:
    """The legend (each backend's colour, an open point, the gate line) flowed into rows; the rows it took."""
    entries = [(f'<circle cx="5" cy="-4" r="5" fill="{colour}" stroke="{colour}"/>', backend)
               for backend, colour in backend_colours(results).items()]  # fmt: skip
    entries.append(('<circle cx="5" cy="-4" r="4.5" fill="#ffffff" stroke="#888888" stroke-width="1.5"/>',
                    "off the frontier"))  # fmt: skip
    if threshold is not None:
        entries.append(('<line class="threshold" x1="0" x2="14" y1="-4" y2="-4"/>', f"gate ({threshold:.4g})"))
    parts, x, row = [], 0.0, 0
    for symbol, text in entries:
        size = 20 + len(text) * _CHAR_PX + 16
        if x and x + size > width:
            x, row = 0.0, row + 1
        parts.append(f'<g transform="translate({_fmt(_PAD + x)},{_fmt(52 + row * _LINE)})">{symbol}'
                     f'<text x="18" y="0">{escape(text)}</text></g>')  # fmt: skip
        x += size
    return parts, row + 1


def frontier_document(results: SweepResults, threshold: float | None = None) -> str:
    """frontier.svg: a complete SVG document (its own styles and white background, for viewers in dark mode)."""
    metric = results.gate_metric
    panels = [panel_svg(results, size, threshold) for size in batch_sizes(results)]
    if marks := cost_marks(results):
        panels.append(_panel(results, "cost per inference", marks, threshold, steps=False,
                             x_label=("USD per million inferences", "best measured throughput")))  # fmt: skip
    width = 2 * _PAD + max(len(panels), 1) * (WIDTH + _GAP) - _GAP
    legend, rows = _legend(results, threshold, width - 2 * _PAD)
    top = 52 + rows * _LINE
    missing = unplotted(results)
    note = textwrap.wrap("not plotted: " + ", ".join(missing), int((width - 2 * _PAD) / _CHAR_PX)) if missing else []
    height = top + HEIGHT + _PAD + len(note) * _LINE
    direction = "higher is better" if METRICS[metric].higher_is_better else "lower is better"
    title = f"{results.recipe.get('name', 'sweep')}: p50 latency vs {metric}"
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" font-family="sans-serif" font-size="11">', f"<title>{escape(title)}</title>",
             f"<style>{CSS}</style>", '<rect width="100%" height="100%" fill="#ffffff"/>',
             f'<text x="{_PAD}" y="20" font-size="15" font-weight="600">{escape(title)}</text>',
             f'<text x="{_PAD}" y="36" fill="#555555">{escape(metric)}: {direction}; better is up and left; filled: '
             "on the frontier (no other variant is both faster and at least as good)</text>", *legend]  # fmt: skip
    parts += [f'<g transform="translate({_PAD + i * (WIDTH + _GAP)},{top})">{panel}</g>'
              for i, panel in enumerate(panels)]
    if not panels:
        parts.append(f'<text x="{width / 2}" y="{top + HEIGHT / 2}" text-anchor="middle">no variant has both a '
                     f"latency and a finite {escape(metric)}</text>")  # fmt: skip
    parts += [f'<text x="{_PAD}" y="{top + HEIGHT + _PAD + i * _LINE}" fill="#555555">{escape(line)}</text>'
              for i, line in enumerate(note)]  # fmt: skip
    return "\n".join([*parts, "</svg>"]) + "\n"


def write_frontier_svg(results: SweepResults, path: Path, *, threshold: float | None = None) -> Path:
    """Write frontier.svg whole or not at all (a full disk leaves no truncated file, and is one line naming it)."""
    return write_atomically(path, frontier_document(results, threshold), what="the frontier plot")
