"""The latency–accuracy frontier as inline SVG (no script, no network): one panel per batch size.

Every measured variant is a point with a `<title>` (the browser's hover tooltip: variant, backend,
metric, drop, p50/p99 latency); points on the frontier are filled and carry the class `frontier`,
each backend's frontier is drawn as steps, and the gate threshold as a dashed line. As on
frontier.png, better is up and to the left: the y axis is flipped for lower-is-better metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from qbench.frontier import frontier_of, overall_metric, timed_on
from qbench.results import SweepResults, VariantResult
from qbench.validate.catalogue import METRICS

WIDTH, HEIGHT = 440, 320
LEFT, RIGHT, TOP, BOTTOM = 62, 14, 26, 44  # margins around the plotting area
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


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


def _axes(points: list[PlotPoint], threshold: float | None, higher_is_better: bool) -> tuple[_Axis, _Axis]:
    xs = [p.p50_ms for p in points]
    ys = [p.metric for p in points] + ([threshold] if threshold is not None else [])
    log = max(xs) / min(xs) > 10
    x_low, x_high = _padded(min(xs), max(xs), log)
    y_low, y_high = _padded(min(ys), max(ys), False)
    bottom, top = HEIGHT - BOTTOM, TOP
    y_axis = _Axis(y_low, y_high, bottom, top) if higher_is_better else _Axis(y_low, y_high, top, bottom)
    return _Axis(x_low, x_high, LEFT, WIDTH - RIGHT, log), y_axis


# -- drawing ----------------------------------------------------------------------------------------


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


def _steps(points: list[PlotPoint], colour: str, x: _Axis, y: _Axis) -> str:
    """A backend's frontier as a staircase from its fastest to its most accurate point."""
    ordered = sorted(points, key=lambda p: p.p50_ms)
    coordinates = []
    for index, point in enumerate(ordered):
        if index:
            coordinates.append(f"{_fmt(x(point.p50_ms))},{_fmt(y(ordered[index - 1].metric))}")
        coordinates.append(f"{_fmt(x(point.p50_ms))},{_fmt(y(point.metric))}")
    return f'<polyline class="steps" stroke="{colour}" points="{" ".join(coordinates)}"/>'


def panel_svg(results: SweepResults, batch_size: int, threshold: float | None) -> str:
    """One batch size's panel; an empty panel says why when nothing can be plotted."""
    metric = results.gate_metric
    points = plot_points(results, batch_size)
    head = f'<svg class="panel" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img">'
    title = f'<text class="panel-title" x="{WIDTH / 2}" y="16" text-anchor="middle">batch size {batch_size}</text>'
    if not points:
        message = f"no variant has a latency and a finite {escape(metric)} at this batch size"
        return f'{head}{title}<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">{message}</text></svg>'
    x, y = _axes(points, threshold, METRICS[metric].higher_is_better)
    colours = backend_colours(results)
    parts = [head, title, *_grid(x, y)]
    frame = f'x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{HEIGHT - TOP - BOTTOM}"'
    parts.append(f'<rect class="frame" {frame}/>')
    if threshold is not None:
        py = _fmt(y(threshold))
        parts.append(f'<line class="threshold" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py}" y2="{py}">'
                     f"<title>gate threshold: {metric} {threshold:.4f}</title></line>")  # fmt: skip
    lines: dict[tuple[str, str], list[PlotPoint]] = {}  # one per backend and kind of timing machine
    for point in points:
        if point.on_frontier:
            lines.setdefault((point.variant.backend, timed_on(point.variant)), []).append(point)
    for (backend, _), on in lines.items():
        parts.append(_steps(on, colours[backend], x, y))
    for point in sorted(points, key=lambda p: p.on_frontier):  # frontier points drawn last, on top
        colour = colours[point.variant.backend]
        css = "point frontier" if point.on_frontier else "point"
        fill = colour if point.on_frontier else "#ffffff"
        parts.append(
            f'<circle class="{css}" data-variant="{escape(point.variant.variant)}" '
            f'data-backend="{escape(point.variant.backend)}" '
            f'data-batch="{batch_size}" cx="{_fmt(x(point.p50_ms))}" cy="{_fmt(y(point.metric))}" r="5" '
            f'fill="{fill}" stroke="{colour}"><title>{escape(tooltip(point, metric))}</title></circle>'
        )
    axis_note = ", log scale" if x.log else ""
    parts.append(f'<text class="label" x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 8}" text-anchor="middle">'
                 f"p50 latency per batch (ms{axis_note})</text>")  # fmt: skip
    parts.append(f'<text class="label" transform="rotate(-90)" x="{-(TOP + HEIGHT - BOTTOM) / 2}" y="14" '
                 f'text-anchor="middle">{escape(metric)}</text>')  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)
