"""The SVG frontier panels: round ticks, log scale for wide latency spans, better always up and left."""

from __future__ import annotations

import dataclasses
import re

import pytest
from sweep_factory import make_sweep, make_variant

from qbench.frontier_svg import log_ticks, nice_ticks, panel_svg, plot_points


def test_nice_ticks_are_round_and_cover_the_range() -> None:
    assert nice_ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0.913, 0.961) == pytest.approx([0.92, 0.93, 0.94, 0.95, 0.96])
    assert nice_ticks(3.0, 3.0) == [3.0]


def test_log_ticks_are_one_two_five_per_decade() -> None:
    assert log_ticks(0.3, 30.0) == pytest.approx([0.5, 1.0, 2.0, 5.0, 10.0, 20.0])


def circle_y(svg: str, variant: str) -> float:
    match = re.search(rf'<circle [^>]*data-variant="{variant}"[^>]*cy="([0-9.]+)"', svg)
    if match is None:
        raise AssertionError(f"no point for {variant}")
    return float(match.group(1))


def with_kl(variant, kl: float):
    """The variant with a kl_mean (lower is better) overall."""
    overall = dataclasses.replace(variant.accuracy.overall, metrics={**variant.accuracy.overall.metrics, "kl_mean": kl})
    return dataclasses.replace(variant, accuracy=dataclasses.replace(variant.accuracy, overall=overall))


def test_better_is_drawn_higher_for_either_direction_of_metric() -> None:
    fp32 = make_variant("fp32", "fp32", p50_by_batch={1: 1.0})
    int8 = make_variant("int8", "int8", p50_by_batch={1: 0.5},
                        accuracy={"overall": 0.90, "clean": 0.97, "noisy lighting=dark": 0.90})  # fmt: skip
    accuracy = panel_svg(make_sweep([fp32, int8]), 1, None)
    assert circle_y(accuracy, "fp32") < circle_y(accuracy, "int8")  # SVG y grows downwards: fp32 is more accurate
    kl = panel_svg(make_sweep([with_kl(fp32, 0.0), with_kl(int8, 0.3)], gate_metric="kl_mean"), 1, None)
    assert circle_y(kl, "fp32") < circle_y(kl, "int8")  # lower kl is better, so still drawn higher
    assert "no variant has a latency and a finite kl_mean" in panel_svg(make_sweep([fp32], gate_metric="kl_mean"), 1, None)


def test_wide_latency_span_uses_a_log_axis() -> None:
    variants = [make_variant("fp32", "fp32", p50_by_batch={1: 1.0}), make_variant("fp8", "fp8", p50_by_batch={1: 40.0})]
    results = make_sweep(variants)
    assert len(plot_points(results, 1)) == 2
    assert "ms, log scale" in panel_svg(results, 1, None)
    assert "log scale" not in panel_svg(make_sweep(variants[:1]), 1, None)
