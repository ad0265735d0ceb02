"""The SVG frontier: round ticks, log scale for wide latency spans, better always up and left, labels that do not
cover each other, and frontier.svg as a complete document."""

from __future__ import annotations

import dataclasses
import errno
import re
from pathlib import Path
from xml.etree import ElementTree

import pytest
from sweep_factory import make_sweep, make_variant

from qbench.errors import QbenchError
from qbench.frontier.svg import log_ticks, nice_ticks, panel_svg, plot_points, write_frontier_svg


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
    assert "no variant has a latency and a finite kl_mean" in panel_svg(make_sweep([fp32], gate_metric="kl_mean"),
                                                                        1, None)


def test_wide_latency_span_uses_a_log_axis() -> None:
    variants = [make_variant("fp32", "fp32", p50_by_batch={1: 1.0}), make_variant("fp8", "fp8", p50_by_batch={1: 40.0})]
    results = make_sweep(variants)
    assert len(plot_points(results, 1)) == 2
    assert "ms, log scale" in panel_svg(results, 1, None)
    assert "log scale" not in panel_svg(make_sweep(variants[:1]), 1, None)


def _labels(svg: str) -> dict[str, tuple[float, float, float, float]]:
    """Each point label's text -> its box (left, top, right, bottom) in its panel, at the width the drawing assumes."""
    boxes = {}
    for x, y, anchor, text in re.findall(r'<text class="point-label" x="([0-9.-]+)" y="([0-9.-]+)" '
                                         r'text-anchor="(\w+)">([^<]*)</text>', svg):  # fmt: skip
        width = len(text) * 6.0
        left = float(x) if anchor == "start" else float(x) - width
        boxes[text] = (left, float(y) - 10.0, left + width, float(y) + 2.0)
    return boxes


def test_labels_name_every_variant_without_covering_each_other() -> None:
    """Five variants within 2 % of each other's latency and accuracy: each label goes to a free side of its point,
    and variants on one spot (FP16 changing nothing) share a label."""
    accuracy = {"clean": 0.97, "noisy lighting=dark": 0.90}
    variants = [make_variant(name, "int8", p50_by_batch={1: p50}, accuracy={"overall": value, **accuracy})
                for name, p50, value in (("fp32", 1.0, 0.950), ("fp16", 1.0, 0.950), ("int8-minmax", 1.01, 0.949),
                                         ("int8-entropy", 1.05, 0.950), ("int8-p99.9", 1.0, 0.948),
                                         ("int8-dynamic", 2.0, 0.94))]  # fmt: skip
    boxes = _labels(panel_svg(make_sweep(variants), 1, None))
    assert set(boxes) == {"fp32, fp16", "int8-minmax", "int8-entropy", "int8-p99.9", "int8-dynamic"}
    overlapping = [(a, b) for a in boxes for b in boxes
                   if a < b and boxes[a][0] < boxes[b][2] and boxes[b][0] < boxes[a][2]
                   and boxes[a][1] < boxes[b][3] and boxes[b][1] < boxes[a][3]]  # fmt: skip
    assert overlapping == []


def test_frontier_svg_is_a_complete_document_with_every_part_of_the_plot(tmp_path: Path) -> None:
    results = make_sweep([*make_sweep().variants, make_variant("broken", "int8", error="session failed")])
    path = write_frontier_svg(results, tmp_path / "sub" / "frontier.svg", threshold=0.94)
    root = ElementTree.parse(path).getroot()  # well-formed XML
    svg = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{svg}svg" and root.get("viewBox") == f"0 0 {root.get('width')} {root.get('height')}"
    panels = [e for e in root.iter(f"{svg}svg") if e.get("class") == "panel"]
    assert [p.find(f"{svg}text").text for p in panels] == ["batch size 1", "batch size 32"]
    texts = [e.text or "" for e in root.iter(f"{svg}text")]
    assert texts[0] == "digits: p50 latency vs accuracy" and texts[1].startswith("accuracy: higher is better")
    assert {"onnxruntime-cpu", "off the frontier", "gate (0.94)"} <= set(texts)  # the legend
    assert "not plotted: int8_dynamic@onnxruntime-cpu (failed), broken@onnxruntime-cpu (failed)" in texts
    assert sum(1 for e in root.iter(f"{svg}line") if e.get("class") == "threshold") == 3  # each panel + legend
    assert root.find(f"{svg}style") is not None  # its own styles: no stylesheet around it


def test_frontier_svg_without_a_plottable_variant_says_so(tmp_path: Path) -> None:
    path = write_frontier_svg(make_sweep([make_variant("fp32", "fp32", error="no session")]), tmp_path / "f.svg")
    texts = [e.text for e in ElementTree.parse(path).getroot().iter("{http://www.w3.org/2000/svg}text")]
    assert "no variant has both a latency and a finite accuracy" in texts
    assert "not plotted: fp32@onnxruntime-cpu (failed)" in texts


def test_a_frontier_svg_the_disk_cannot_take_is_one_line_and_leaves_the_earlier_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_frontier_svg(make_sweep(), tmp_path / "frontier.svg")
    earlier = path.read_bytes()
    written = Path.write_text

    def full_disk(self: Path, text: str, **kwargs: object) -> int:
        written(self, text[:100], **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(QbenchError) as raised:
        write_frontier_svg(make_sweep(), path, threshold=0.9)
    assert str(raised.value) == f"{path}: cannot write the frontier plot: No space left on device"
    assert path.read_bytes() == earlier and sorted(tmp_path.iterdir()) == [path]
