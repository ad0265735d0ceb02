"""results.json round trip of latency points: the adaptive-timing fields, and files written before them."""

from __future__ import annotations

import dataclasses
import json
import math

from sweep_factory import make_sweep

from qbench.results import from_dict, to_json


def test_window_fields_round_trip_and_nan_spread_reads_back_as_nan() -> None:
    results = make_sweep()
    fp32 = results.variants[0]
    b1, b32 = fp32.latency.points
    points = (dataclasses.replace(b1, window_p50_ms=(1.0, 1.5), window_p99_ms=(2.0,), iqr_ratio=0.25, stable=False),
              dataclasses.replace(b32, window_p50_ms=(20.0, 20.5, 20.2), spread=0.025, iqr_ratio=0.1, stable=True))
    fp32 = dataclasses.replace(fp32, latency=dataclasses.replace(fp32.latency, points=points))  # fmt: skip
    results = dataclasses.replace(results, variants=(fp32, *results.variants[1:]))
    raw = json.loads(to_json(results))
    assert raw["variants"][0]["latency"]["points"][0]["spread"] is None  # NaN is written as null
    back = from_dict(raw).variants[0].latency.points
    assert back[0].window_p50_ms == (1.0, 1.5) and back[0].window_p99_ms == (2.0,) and back[0].stable is False
    assert math.isnan(back[0].spread) and back[0].iqr_ratio == 0.25
    assert back[1] == points[1]


def test_points_written_before_adaptive_timing_read_as_not_judged() -> None:
    raw = json.loads(to_json(make_sweep()))
    for key in ("window_p50_ms", "window_p99_ms", "spread", "iqr_ratio", "stable"):
        del raw["variants"][0]["latency"]["points"][0][key]
    point = from_dict(raw).variants[0].latency.points[0]
    assert point.stable is None and point.window_p50_ms == () and math.isnan(point.spread)
