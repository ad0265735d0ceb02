"""Console tables, the frontier text and report.md, from synthetic sweeps."""

from __future__ import annotations

import dataclasses
import io
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from sweep_factory import make_latency, make_sweep, make_variant

import qbench.console
from qbench.frontier.pareto import compute_frontier
from qbench.gate.evaluate import GateReport
from qbench.gate.metric_check import GateCheck
from qbench.report.tables import (
    SHOWN_PASSING_SLICES,
    SHOWN_SMALL_SLICES,
    frontier_text,
    gate_table,
    print_summary,
    summary_table,
    write_markdown_report,
)

CPU = "onnxruntime-cpu"


def render(table: Table) -> str:
    console = Console(width=300, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def column(table: Table, header: str) -> list:
    found = next(c for c in table.columns if c.header == header)
    return list(found.cells)


@pytest.fixture
def gate() -> GateReport:
    checks = (
        GateCheck("int8_minmax", CPU, "overall", "accuracy", 0.95, 0.94, 0.01, 0.01, 400, "pass"),
        GateCheck("int8_minmax", CPU, "noisy lighting=dark", "accuracy", 0.90, 0.86, 0.04, 0.02, 100, "breach"),
        GateCheck("int8_minmax", CPU, "tiny", "accuracy", 0.90, 0.50, 0.40, 0.02, 3, "skipped"),
    )
    problems = ("int8_dynamic@onnxruntime-cpu: variant failed: RuntimeError: ConvInteger is not implemented",)
    gated = ("int8_minmax@onnxruntime-cpu", "int8_dynamic@onnxruntime-cpu")
    return GateReport("accuracy", checks=checks, problems=problems, gated=gated)


def test_summary_has_a_row_per_variant_with_speedup_drop_and_gate(gate: GateReport) -> None:
    results = make_sweep()
    table = summary_table(results, gate)
    assert table.row_count == len(results.variants)
    int8, fp32 = results.find("int8_minmax", CPU), results.find("fp32", CPU)
    row = [v.variant for v in results.variants].index("int8_minmax")
    expected_speedup = fp32.latency.at(32).p50_ms / int8.latency.at(32).p50_ms
    assert str(column(table, "speed-up\nbatch 32")[row]) == f"{expected_speedup:.2f}×"
    assert str(column(table, "drop")[row]) == f"{int8.accuracy.overall.drops['accuracy']:+.4f}"
    worst = max(int8.accuracy.slices, key=lambda s: s.drops["accuracy"])
    assert str(column(table, "worst slice\n(drop)")[row]) == f"{worst.name}\n{worst.drops['accuracy']:+.4f}"
    assert [str(c) for c in column(table, "gate")] == [gate.status_of(v.variant, v.backend) for v in results.variants]
    assert "nonfinite" not in [c.header for c in table.columns]


def test_summary_footnotes_carry_errors_and_notes() -> None:
    results = make_sweep()
    text = render(summary_table(results, None))
    failed = results.find("int8_dynamic", CPU)
    fp8 = results.find("fp8_e4m3", CPU)
    assert failed.error in text and fp8.notes[0] in text
    statuses = [str(c) for c in column(summary_table(results, None), "status")]
    assert statuses[[v.variant for v in results.variants].index("int8_dynamic")].startswith("failed [")


def test_summary_shows_smallest_and_largest_batch_and_nonfinite_counts() -> None:
    variants = [dataclasses.replace(v, latency=make_latency({1: 1.0, 8: 5.0, 64: 40.0})) for v in make_sweep().variants
                if v.status == "ok"]  # fmt: skip
    variants.append(make_variant("fp16_nan", "fp16", nonfinite_outputs=7))
    table = summary_table(make_sweep(variants), None)
    headers = [c.header for c in table.columns]
    assert any("batch 1" in h for h in headers) and any("batch 64" in h for h in headers)
    assert not any("batch 8" in h for h in headers)
    assert [str(c) for c in column(table, "nonfinite")][-1] == "7"


def test_slice_table_has_overall_and_every_slice_with_interval() -> None:
    from qbench.report.grid import to_rich
    from qbench.report.tables import _slice_grid

    results = make_sweep()
    table = to_rich(_slice_grid(results, "accuracy"))  # report.md's per-slice table, as the console would show it
    int8 = results.find("int8_minmax", CPU)
    assert [str(c) for c in column(table, "slice")] == ["overall"] + [s.name for s in int8.accuracy.slices]
    noisy = int8.accuracy.slices[1]
    low, high = noisy.intervals["accuracy"]
    cell = str(column(table, "int8_minmax")[2])
    assert cell == f"{noisy.metrics['accuracy']:.4f} ({noisy.drops['accuracy']:+.4f})\n[{low:.3f}, {high:.3f}]"
    assert "int8_dynamic" not in [c.header for c in table.columns]  # failed: nothing to show


def test_gate_table_lists_breaches_first_in_red_and_the_problems(gate: GateReport) -> None:
    table = gate_table(gate)
    results = [str(c) for c in column(table, "result")]
    assert results == ["BREACH", "PASS", "skipped"]
    first_row = [list(c.cells)[0] for c in table.columns]
    assert all("red" in str(cell.style) for cell in first_row)
    assert "UNUSABLE" in str(table.title)
    assert gate.problems[0] in str(table.caption)


def test_gate_table_counts_the_small_slices_past_a_few_instead_of_listing_each(gate: GateReport) -> None:
    """A `by` column of many values (one slice per store) printed a line per slice, each 'skipped', to the CI log."""
    small = [GateCheck("int8_minmax", CPU, f"store={i}", "accuracy", 1.0, 0.5, 0.5, 0.02, 2, "skipped",
                       reason="under min_slice_size") for i in range(SHOWN_SMALL_SLICES + 7)]  # fmt: skip
    other = GateCheck("int8_minmax", CPU, "missing:x", "accuracy", 1.0, 1.0, 0.0, 0.02, 50, "skipped",
                      reason="FP32 has NaN outputs there")  # fmt: skip
    table = gate_table(dataclasses.replace(gate, checks=(*gate.checks, *small, other)))
    scopes = [str(c) for c in column(table, "scope")]
    assert scopes[:2] == ["noisy lighting=dark", "overall"]  # breaches and passes are all listed
    assert "missing:x" in scopes  # a check skipped for another reason is never left out
    assert len(scopes) == 3 + SHOWN_SMALL_SLICES  # 'tiny' and the first small slices; the rest counted below
    assert "8 more skipped checks of slices under min_slice_size not listed (report.md lists them)" in str(table.caption)


def test_sweep_gate_table_lists_the_passing_slices_nearest_their_tolerance_and_counts_the_rest(gate: GateReport):
    """300 slices printed 915 lines of PASS after `qbench sweep` (the breach above them, the frontier far above).
    The sweep's table keeps every breach, problem and overall check, and the passing slice checks nearest their
    tolerance; `qbench gate --verbose` (every_pass) still lists them all."""
    extra = SHOWN_PASSING_SLICES + 5
    passes = [GateCheck("int8_minmax", CPU, f"shop={i:03d}", "accuracy", 0.9, 0.9 - i / 10000, i / 10000, 0.02, 80,
                        "pass") for i in range(extra)]  # fmt: skip
    widened = dataclasses.replace(gate, checks=(*gate.checks, *passes))
    scopes = [str(c) for c in column(gate_table(widened, every_pass=False), "scope")]
    listed = [s for s in scopes if s.startswith("shop=")]
    assert sorted(listed) == [f"shop={i:03d}" for i in range(5, extra)]  # the largest drops
    assert {"noisy lighting=dark", "overall", "tiny"} <= set(scopes)  # the breach, the overall pass, the small slice
    caption = str(gate_table(widened, every_pass=False).caption)
    assert "5 more passing slice checks, each further from its tolerance, not listed" in caption
    assert len([s for s in column(gate_table(widened), "scope") if str(s).startswith("shop=")]) == extra


def test_the_gate_s_notes_are_in_report_md_and_the_sweep_s_gate_table(gate: GateReport, tmp_path: Path) -> None:
    """report.md and `qbench sweep`'s gate table left out the gate's notes (an ungated output a variant broke, a
    variant computing in FP32): only `qbench gate` printed them, which prints them above its table instead."""
    from qbench.report.tables import render_markdown

    note = "int8_minmax@onnxruntime-cpu: output aux's accuracy dropped 0.5000 > 0.01 (not gated)"
    noted = dataclasses.replace(gate, notes=(note,))
    assert f"- note: {note}" in render_markdown(make_sweep(), noted, None, tmp_path / "report.md")
    assert f"note: {note}" in str(gate_table(noted).caption)
    assert note not in str(gate_table(noted, notes=False).caption)


def test_frontier_text_lists_each_backend_and_batch_in_latency_order() -> None:
    results = make_sweep()
    lines = [line for line in frontier_text(results).splitlines() if not line.startswith("  =:")]
    frontier = compute_frontier(results.variants, "accuracy")
    assert len(lines) == 1 + len({(p.backend, p.batch_size) for p in frontier})
    batch_1 = next(line for line in lines if "batch 1:" in line)
    order = [p.variant for p in frontier if p.batch_size == 1]
    assert [batch_1.index(name) for name in order] == sorted(batch_1.index(name) for name in order)
    empty = make_sweep([make_variant("fp32", "fp32", error="boom")])
    assert "no variant" in frontier_text(empty)


def test_frontier_text_joins_variants_as_fast_within_the_noise_with_an_equals_sign() -> None:
    """FP32 re-saved (an A/A variant) timed 2 % below FP32 is not listed as the faster of the two."""
    same = {"overall": 0.95, "clean": 0.97, "noisy lighting=dark": 0.90}
    worse = {"overall": 0.94, "clean": 0.96, "noisy lighting=dark": 0.89}
    results = make_sweep([make_variant("fp32", "fp32", p50_by_batch={1: 1.0}, accuracy=same),
                          make_variant("fp32-resaved", "fp32", p50_by_batch={1: 0.98}, accuracy=same),
                          make_variant("int8", "int8", p50_by_batch={1: 0.5}, accuracy=worse)])  # fmt: skip
    lines = frontier_text(results).splitlines()
    assert lines[1] == ("  onnxruntime-cpu, batch 1: int8 (0.500 ms, 0.9400) → "
                        "fp32-resaved (0.980 ms, 0.9500) = fp32 (1.00 ms, 0.9500)")
    assert lines[2] == "  =: the same metric, as fast within the timing noise"
    assert "=" not in frontier_text(make_sweep([results.variants[0], results.variants[2]]))


def _tables(markdown: str) -> list[list[str]]:
    """Groups of consecutive table lines."""
    groups, current = [], []
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            groups.append(current)
            current = []
    return groups


def test_markdown_report_has_every_section_and_well_formed_tables(tmp_path: Path, gate: GateReport) -> None:
    results = make_sweep([*make_sweep().variants, make_variant("odd|name", "fp16", error="a | b\nsecond line")])
    plot = tmp_path / "frontier.svg"
    plot.write_text("<svg/>")
    path = write_markdown_report(results, gate, plot, tmp_path / "report.md")
    text = path.read_text()
    for heading in ("# qbench report: digits", "## Calibration", "## Summary", "## Per slice: accuracy", "## Latency",
                    "## Frontier", "## Gate on accuracy", "## Notes"):  # fmt: skip
        assert heading in text
    assert "![latency vs accuracy](frontier.svg)" in text
    assert results.environment["cpu"] in text and "onnxruntime 1.31.0" in text
    assert results.calibration.row_ids_sha256[:12] in text
    assert not re.search(r"<\s*(br|table|div|img)", text)
    for table in _tables(text):
        widths = {len(re.findall(r"(?<!\\)\|", line)) for line in table}
        assert len(widths) == 1, table
    latency_rows = [line for line in text.splitlines() if line.startswith("| fp32 | onnxruntime-cpu | ")]
    assert len(latency_rows) >= 1 + len(results.find("fp32", CPU).latency.points)


def test_markdown_report_without_gate_or_plot(tmp_path: Path) -> None:
    path = write_markdown_report(make_sweep(), None, None, tmp_path / "out" / "report.md")
    text = path.read_text()
    assert "No gate was evaluated." in text and "![" not in text


def test_plot_link_is_relative_to_the_report(tmp_path: Path) -> None:
    (tmp_path / "plots").mkdir()
    path = write_markdown_report(make_sweep(), None, tmp_path / "plots" / "f.png", tmp_path / "md" / "report.md")
    assert "](../plots/f.png)" in path.read_text()


def test_print_summary_does_not_fold_tables_in_logs(monkeypatch: pytest.MonkeyPatch, gate: GateReport) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(qbench.console, "console", Console(file=stream, width=80))
    results = make_sweep()
    print_summary(results, gate)
    out = stream.getvalue()
    assert all(v.variant in out for v in results.variants)
    assert "Frontier" in out and "BREACH" in out
    assert max(len(line) for line in out.splitlines()) > 80
    for problem in gate.problems:  # a fail-closed message under the gate table stays on one line
        assert any(f"cannot judge (fail closed): {problem}" in line for line in out.splitlines()), problem


def test_a_long_problem_under_the_gate_table_is_not_folded_at_the_table_width(monkeypatch: pytest.MonkeyPatch,
                                                                              gate: GateReport) -> None:  # fmt: skip
    long = "int8-search@onnxruntime-cpu: variant failed: " + " ".join(["a message that runs well past the table"] * 4)
    stream = io.StringIO()
    monkeypatch.setattr(qbench.console, "console", Console(file=stream, width=80))
    print_summary(make_sweep(), replace(gate, problems=(long,)))
    assert any(f"cannot judge (fail closed): {long}" in line for line in stream.getvalue().splitlines())


def test_report_marks_emulated_figures_and_non_default_session_options(tmp_path: Path) -> None:
    from qbench.results.schema import EMULATED, Fidelity

    half = dataclasses.replace(make_variant("fp16", "fp16"), fidelity=Fidelity(EMULATED, EMULATED, "FP16 rounding"),
                               evaluated_model_path="/tmp/fp16.emulated.onnx")  # fmt: skip
    basic = make_variant("fp8", "fp8", params={"runtime.graph_optimization_level": "basic"})
    text = write_markdown_report(make_sweep([make_variant("fp32", "fp32"), half, basic]), None, None,
                                 tmp_path / "report.md").read_text()  # fmt: skip
    rows: dict[str, str] = {}
    for line in text.splitlines():  # the summary table comes first
        if line.startswith("| fp"):
            rows.setdefault(line.split(" | ")[0], line)
    assert "| emulated |" in rows["| fp16"] and "| native |" in rows["| fp32"]
    assert "**fp16@onnxruntime-cpu** figures emulated, not native: FP16 rounding. Scored model: `/tmp/fp16.emulated.onnx`" in text
    assert "**fp8@onnxruntime-cpu** ⚠ measured with non-default ONNX Runtime session options (graph_optimization_level=basic)" in text
    assert "**fp32@onnxruntime-cpu** ⚠" not in text


def test_frontier_marks_emulated_latency() -> None:
    from qbench.results.schema import EMULATED, Fidelity

    worse = {"overall": 0.94, "clean": 0.96, "noisy lighting=dark": 0.89}
    fast = dataclasses.replace(make_variant("fp16", "fp16", p50_by_batch={1: 0.5, 32: 10.0}, accuracy=worse),
                               fidelity=Fidelity(EMULATED, EMULATED, "FP16 rounding"))  # fmt: skip
    results = make_sweep([make_variant("fp32", "fp32"), fast])
    results = dataclasses.replace(results, frontier=compute_frontier(results.variants, "accuracy"))
    text = frontier_text(results)
    assert "fp16* (0.500 ms" in text and "fp32 (" in text
    assert text.endswith("* emulated latency: this runtime does not compute that precision natively")


def test_unstable_latency_is_marked_beside_the_figure_with_a_note(tmp_path: Path) -> None:
    fp32, *others = make_sweep().variants
    b1, b32 = fp32.latency.points
    points = (dataclasses.replace(b1, window_p50_ms=(1.0, 1.01, 0.99), spread=0.02, iqr_ratio=0.125, stable=True),
              dataclasses.replace(b32, window_p50_ms=(20.0, 26.0, 22.0), spread=6 / 22, iqr_ratio=0.5, stable=False))
    unstable = dataclasses.replace(fp32, latency=dataclasses.replace(fp32.latency, points=points))  # fmt: skip
    text = write_markdown_report(make_sweep([unstable, *others]), None, None, tmp_path / "report.md").read_text()
    latency = text[text.index("## Latency") :]
    rows = [line for line in latency.splitlines() if line.startswith("| fp32 | onnxruntime-cpu | ")]
    # batch 1 agreed: no marker; batch 32 did not: "20.0 [1]", spread 6/22 = 27.3%, IQR 50.0%
    assert "| 1 | 1.00 | " in rows[0] and "| 2.0% / 12.5% |" in rows[0]
    assert "| 32 | 20.0 [1] | " in rows[1] and "| 27.3% / 50.0% |" in rows[1]
    assert "- [1] unstable latency:" in latency
    summary = text[text.index("## Summary") : text.index("## Latency")]
    assert "20.0 [" in summary and "unstable latency:" in summary
    assert "| — / — |" in latency  # fixed-count points of the other variants: no spread recorded


def test_latency_says_which_shapes_were_timed_where_they_vary(tmp_path: Path) -> None:
    """Text cut to each timed batch's longest row: the figures describe that mix, and the report says which."""
    fp32, *others = make_sweep().variants
    b1, b32 = fp32.latency.points
    shapes = {"input_ids": {"min": [1, 5], "p50": [1, 48], "max": [1, 490]}}
    points = (dataclasses.replace(b1, batches=33, shapes=shapes), b32)
    ragged = dataclasses.replace(fp32, latency=dataclasses.replace(fp32.latency, points=points))
    text = write_markdown_report(make_sweep([ragged, *others]), None, None, tmp_path / "report.md").read_text()
    latency = text[text.index("## Latency") :]
    assert "batch 1: timed over 33 batches of evaluation rows in rotation, shapes input_ids [1, 5] to [1, 490], " \
           "median [1, 48]" in latency
    assert "batch 32: timed over" not in latency  # one shape timed: nothing to say


def test_gate_table_names_the_metric_of_checks_beside_the_gate_metric(gate: GateReport) -> None:
    """A non-finite output count next to accuracy checks of the same scope: each row says which it is."""
    assert "metric" not in [c.header for c in gate_table(gate).columns]
    nonfinite = GateCheck("int8_minmax", CPU, "overall", "nonfinite_outputs", 0.0, 12.0, 12.0, 0.0, 400, "breach")
    table = gate_table(dataclasses.replace(gate, checks=(*gate.checks, nonfinite)))
    metrics = [str(c) for c in column(table, "metric")]
    assert metrics == ["accuracy", "nonfinite_outputs", "accuracy", "accuracy"]  # breaches first
    assert [str(c) for c in column(table, "observed")][1] == "12.0000"


def test_worst_slice_is_the_one_whose_metric_non_finite_outputs_made_nan(gate: GateReport) -> None:
    """FP16 overflow on one slice: its mae/accuracy is NaN, and that slice, not a finite small drop, is the worst."""
    results = make_sweep()
    row = [v.variant for v in results.variants].index("int8_minmax")
    variant = results.variants[row]
    assert variant.accuracy is not None
    clean, dark = variant.accuracy.slices
    nan_metrics = {"accuracy": math.nan, "agreement": math.nan}
    broken = dataclasses.replace(dark, metrics=nan_metrics, drops=dict(nan_metrics), nonfinite_outputs=7)
    accuracy = dataclasses.replace(variant.accuracy, slices=(clean, broken))
    variants = list(results.variants)
    variants[row] = dataclasses.replace(variant, accuracy=accuracy)
    table = summary_table(dataclasses.replace(results, variants=tuple(variants)), gate)
    assert str(column(table, "worst slice\n(drop)")[row]) == "noisy lighting=dark\n7 non-finite"


def test_the_calibration_section_states_the_rows_held_out_and_the_calibration_rows_also_evaluated(tmp_path: Path) -> None:
    from qbench.report.tables import render_markdown

    results = make_sweep()
    calibration = replace(results.calibration, overlap="hold_out", held_out_rows=64, evaluation_overlap_rows=5)
    text = render_markdown(replace(results, calibration=calibration), None, None, tmp_path / "report.md")
    assert "64 evaluation rows held out as calibration rows (overlap: hold_out)" in text
    assert "**5 calibration rows are also evaluated**" in text
    assert "held out" not in render_markdown(results, None, None, tmp_path / "report.md")


def test_the_calibration_section_states_the_rows_candidates_were_chosen_on(tmp_path: Path) -> None:
    from qbench.report.tables import render_markdown

    results = make_sweep()
    calibration = replace(results.calibration, selection_rows=40, selection_from_sample=12)
    text = render_markdown(replace(results, calibration=calibration), None, None, tmp_path / "report.md")
    assert "candidates chosen on 40 other rows, none fitted on or evaluated (12 of them drawn here" in text
    assert "candidates chosen on" not in render_markdown(results, None, None, tmp_path / "report.md")
    assert "though" not in text
    copied = replace(calibration, selection_overlap_rows=30)  # a calibration file copying evaluation rows
    text = render_markdown(replace(results, calibration=copied), None, None, tmp_path / "report.md")
    assert "kept apart from fitting), **though 30 feed the model what evaluation rows feed it**" in text
    # none readable: evaluation rows chose
    none = replace(results.calibration, selection_rows=0, selection_from_sample=0)
    text = render_markdown(replace(results, calibration=none), None, None, tmp_path / "report.md")
    assert "**candidates chosen on the evaluation rows**" in text and "chosen on 0 other rows" not in text


def test_what_a_torch_backend_saw_its_ops_compute_in_is_in_the_notes(tmp_path: Path) -> None:
    label = "int8 (torchao dynamic, 1 of 1 linear layers); matrix products: 1 of 2 in int8, 1 left in float32 (matmul)"
    ran = {"runtime.kernels": label}
    variants = [make_variant("fp32", "fp32", backend="torch-cpu", params={"runtime.kernels": "fp32"}),
                make_variant("int8", "int8", backend="torch-cpu", params=ran)]  # fmt: skip
    text = write_markdown_report(make_sweep(variants), None, None, tmp_path / "report.md").read_text()
    assert f"- **int8@torch-cpu** ran: {label}" in text
    assert "**fp32@torch-cpu** ran" not in text  # nothing beyond its precision to say
