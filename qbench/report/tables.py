"""Human-readable views of a sweep: rich tables for the console, and report.md.

Each table is built once as a neutral `Grid` (headers, cells, footnotes) and rendered either as a rich Table or as a
Markdown table, so the console and the report always show the same figures.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from qbench.console import print_wide
from qbench.files import write_atomically
from qbench.frontier.pareto import (
    mixed_timing_machines,
    overall_metric,
    slower_than_reference_notes,
    speedup,
    speedup_contended,
)
from qbench.gate.evaluate import GateReport
from qbench.gate.metric_check import UNDER_MIN_SIZE, GateCheck
from qbench.report.frontier import frontier_text
from qbench.report.grid import (
    NONE,
    Cell,
    Footnotes,
    Grid,
    finite,
    markdown_table,
    md_cell,
    num,
    rate,
    short,
    signed,
    to_markdown,
    to_rich,
)
from qbench.report.ranges import ranges_section
from qbench.report.search import search_markdown
from qbench.report.serving import serving_table
from qbench.results.schema import (
    NATIVE,
    CalibrationRecord,
    LatencyPoint,
    SliceMetrics,
    SweepResults,
    VariantResult,
    non_default_session_options,
)
from qbench.validate.catalogue import custom_metrics, recorded_custom_metrics
from qbench.validate.contention import contention_notes, oversubscription_note

_DROP_NOTE = "drop: how much worse than FP32 (positive = worse)"
_CONTENDED_NOTE = ("timed while other processes kept CPUs busy (the contention note says how many): this speed-up "
                   "compares loads, not variants, and ranks nothing on the frontier")  # fmt: skip
_UNSTABLE_NOTE = ("unstable latency: timing reached its run or time bound (latency.stability) before the last "
                  "windows' p50s agreed within the threshold; the figure may be off by more than that")  # fmt: skip


# -- summary ------------------------------------------------------------------------------------


def _batch_sizes(results: SweepResults) -> list[int]:
    return sorted({p.batch_size for v in results.variants if v.latency for p in v.latency.points})


def _shown_batch_sizes(results: SweepResults) -> list[int]:
    """Every batch size when there are at most two, else the smallest and the largest."""
    sizes = _batch_sizes(results)
    return sizes if len(sizes) <= 2 else [sizes[0], sizes[-1]]


def _worst_slice(variant: VariantResult, metric: str) -> SliceMetrics | None:
    """The slice that lost the most `metric` vs FP32, if any slice lost some; a slice whose metric non-finite
    outputs made NaN (the gate breaches it) is worse than any number."""
    if variant.accuracy is None:
        return None
    slices = variant.accuracy.slices
    broken = [s for s in slices if s.nonfinite_outputs > 0 and not finite(s.drops.get(metric))]
    if broken:
        return max(broken, key=lambda s: s.nonfinite_outputs)
    judged = [s for s in slices if finite(s.drops.get(metric)) and s.drops[metric] > 0]
    return max(judged, key=lambda s: s.drops[metric], default=None)


def _worst_cell(worst: SliceMetrics | None, metric: str) -> str:
    if worst is None:
        return NONE
    drop = worst.drops.get(metric)
    return f"{worst.name}\n{signed(drop) if finite(drop) else f'{worst.nonfinite_outputs} non-finite'}"


_GATE_STYLES = {"pass": "green", "fail": "bold red", "not gated": "dim"}


def _p50(point: LatencyPoint, notes: Footnotes) -> str:
    """The p50, marked when its timing windows never agreed."""
    return short(point.p50_ms) + (f" {notes.mark(_UNSTABLE_NOTE)}" if point.stable is False else "")


def _latency_cells(variant: VariantResult, batch_sizes: Sequence[int], notes: Footnotes) -> list[Cell]:
    cells: list[Cell] = []
    for batch_size in batch_sizes:
        point = variant.latency.at(batch_size) if variant.latency else None
        if point is None:
            cells += [NONE, NONE]
        else:
            cells += [f"{_p50(point, notes)} / {short(point.p99_ms)}", rate(point.items_per_s)]
    return cells


def fidelity_text(variant: VariantResult) -> str:
    """'native', 'emulated' (every figure), or which figures are emulated / unknown."""
    fidelity = variant.fidelity
    if fidelity.accuracy == fidelity.latency:
        return fidelity.accuracy
    return ", ".join(f"{what} {how}" for what, how in (("accuracy", fidelity.accuracy), ("latency", fidelity.latency)))


def _fidelity_cell(variant: VariantResult) -> Cell:
    text = fidelity_text(variant)
    return text if text == NATIVE else (text, "yellow")


def _summary_row(results: SweepResults, variant: VariantResult, gate: GateReport | None, notes: Footnotes,
                 show_nonfinite: bool) -> list[Cell]:  # fmt: skip
    metric = results.gate_metric
    sizes = _batch_sizes(results)
    name = variant.variant + "".join(f" {notes.mark(n)}" for n in variant.notes)
    status: Cell = "ok"
    if variant.status != "ok":
        status = (f"{variant.status} {notes.mark(variant.error or 'no error message')}", "red")
    cold = variant.latency.session_create_ms + variant.latency.first_run_ms if variant.latency else None
    factor = speedup(results, variant, sizes[-1]) if sizes else math.nan
    factor_cell = f"{factor:.2f}×" if finite(factor) else NONE
    if finite(factor) and speedup_contended(results, variant, sizes[-1]):
        factor_cell += f" {notes.mark(_CONTENDED_NOTE)}"
    overall = variant.accuracy.overall if variant.accuracy else None
    worst = _worst_slice(variant, metric)
    row: list[Cell] = [name, variant.backend, variant.precision, _fidelity_cell(variant), status,
                       short(variant.model_bytes / 1e6) if variant.model_bytes else NONE, short(cold)]  # fmt: skip
    row += _latency_cells(variant, _shown_batch_sizes(results), notes)
    row += [factor_cell, num(overall_metric(variant, metric)),
            signed(overall.drops.get(metric) if overall else None),
            _worst_cell(worst, metric)]  # fmt: skip
    if show_nonfinite:
        count = variant.accuracy.nonfinite_outputs if variant.accuracy else 0
        row.append((str(count), "bold red") if count else "")
    gate_status = gate.status_of(variant.variant, variant.backend) if gate else NONE
    row.append((gate_status, _GATE_STYLES.get(gate_status, "")))
    return row


def _summary_columns(results: SweepResults, show_nonfinite: bool) -> list[tuple[str, bool]]:
    """(header, holds numbers) for each summary column, in the order `_summary_row` fills them."""
    sizes = _batch_sizes(results)
    columns = [("variant", False), ("backend", False), ("precision", False), ("figures", False), ("status", False),
               ("model MB", True), ("cold start ms", True)]  # fmt: skip
    for bs in _shown_batch_sizes(results):
        columns += [(f"p50 / p99 ms\nbatch {bs}", True), (f"items/s\nbatch {bs}", True)]
    columns += [(f"speed-up\nbatch {sizes[-1]}" if sizes else "speed-up", True), (results.gate_metric, True),
                ("drop", True), ("worst slice\n(drop)", False)]  # fmt: skip
    columns += [("nonfinite", True)] if show_nonfinite else []
    return columns + [("gate", False)]


def _summary_grid(results: SweepResults, gate: GateReport | None) -> Grid:
    show_nonfinite = any(v.accuracy and v.accuracy.nonfinite_outputs > 0 for v in results.variants)
    columns = _summary_columns(results, show_nonfinite)
    notes = Footnotes()
    rows = [_summary_row(results, v, gate, notes, show_nonfinite) for v in results.variants]
    footer = [f"speed-up: FP32 p50 / variant p50 on the same backend; {_DROP_NOTE}; cold start: session + first run; "
              "figures: native, or emulated where the backend cannot compute the precision (see Notes)"]
    return Grid(f"Summary: {results.recipe.get('name', '')}", [h for h, _ in columns], rows,
                frozenset(i for i, (_, numeric) in enumerate(columns) if numeric),
                footer + mixed_timing_machines(results) + contention_notes(results)
                + slower_than_reference_notes(results) + notes.lines())  # fmt: skip


def summary_table(results: SweepResults, gate: GateReport | None) -> Table:
    """One row per variant x backend: size, cold start, latency, speed-up, gate metric and drop, worst slice, gate."""
    return to_rich(_summary_grid(results, gate))


# -- slices ---------------------------------------------------------------------------------------


def _column_name(results: SweepResults, variant: VariantResult) -> str:
    return variant.variant if len(results.backends()) == 1 else variant.key


def _slice_cell(metrics: SliceMetrics | None, metric: str) -> str:
    if metrics is None or not finite(metrics.metrics.get(metric)):
        return NONE
    cell = f"{num(metrics.metrics[metric])} ({signed(metrics.drops.get(metric))})"
    low, high = metrics.intervals.get(metric, (math.nan, math.nan))
    return cell + (f"\n[{low:.3f}, {high:.3f}]" if finite(low) and finite(high) else "")


def _size_cell(scope: SliceMetrics | None, metric: str) -> str:
    """The scope's rows; '3000 (300 scored)' where `metric` is counted over other units (a sampled nn_agreement)."""
    if scope is None:
        return NONE
    return f"{scope.size} ({scope.denominators[metric]} scored)" if metric in scope.denominators else str(scope.size)


def _slice_grid(results: SweepResults, metric: str) -> Grid:
    measured = [v for v in results.variants if v.status == "ok" and v.accuracy is not None]
    names = list(dict.fromkeys(s.name for v in measured for s in v.accuracy.slices))
    headers = ["slice", "rows"] + [_column_name(results, v) for v in measured]
    rows: list[list[Cell]] = []
    for name in ["overall", *names]:
        per_variant = [v.accuracy.overall if name == "overall" else v.accuracy.slice(name) for v in measured]
        scope = next((s for s in per_variant if s is not None), None)
        rows.append([name, _size_cell(scope, metric)] + [_slice_cell(s, metric) for s in per_variant])
    footer = [f"{metric} ({_DROP_NOTE}), then its 95 % interval"]
    if any(metric in s.denominators for v in measured for s in (v.accuracy.overall, *v.accuracy.slices)):
        footer.append(f"rows: the scope's rows, then how many of them (or other units) {metric} is counted over")
    return Grid(f"Per slice: {metric}", headers, rows, frozenset(range(1, len(headers))), footer)


# -- gate -----------------------------------------------------------------------------------------

_CHECK_ORDER = {"breach": 0, "pass": 1, "skipped": 2}
SHOWN_SMALL_SLICES = 20  # checks of slices under min_slice_size the console's gate table lists
SHOWN_PASSING_SLICES = 40  # passing slice checks `qbench sweep`'s gate table lists (the closest to their tolerance)
_CHECK_CELLS: dict[str, Cell] = {
    "breach": ("BREACH", "bold red"),
    "pass": ("PASS", "green"),
    "skipped": ("skipped", "dim"),
}


def _check_row(check: GateCheck, *, with_metric: bool = False) -> list[Cell]:
    scope = [check.variant, check.backend, check.scope] + ([check.metric] if with_metric else [])
    cells = [*scope, str(check.size), num(check.reference), num(check.observed),
             signed(check.drop), num(check.tolerance), _CHECK_CELLS.get(check.status, check.status)]  # fmt: skip
    if check.status != "breach":
        return cells
    return [c if isinstance(c, tuple) else (c, "red") for c in cells]


def _verdict(gate: GateReport) -> str:
    return {0: "PASS", 1: "BREACH"}.get(gate.exit_code, "UNUSABLE (fail closed)")


def _gate_grid(gate: GateReport, *, small_rows: int | None = None, passing_rows: int | None = None,
               notes: bool = True) -> Grid:
    """Every check; with `small_rows`, only that many of the slices too small to judge (the rest counted); with
    `passing_rows`, only that many passing slice checks of the gate metric, those nearest their tolerance (the rest
    counted); with `notes`, the gate's notes under it (what its checks do not say: an ungated output a variant
    broke)."""
    checks = sorted(gate.checks, key=lambda c: _CHECK_ORDER.get(c.status, 3))
    small = [id(c) for c in checks if c.status == "skipped" and c.reason in ("", UNDER_MIN_SIZE)]
    unlisted = set(small[small_rows:]) if small_rows is not None else set()
    passing = [c for c in checks if c.status == "pass" and c.scope != "overall" and c.metric in gate.gated_metrics]
    passing.sort(key=lambda c: -c.drop / c.tolerance if c.tolerance > 0 and math.isfinite(c.drop) else -math.inf)
    unlisted_passes = {id(c) for c in passing[passing_rows:]} if passing_rows is not None else set()
    checks = [c for c in checks if id(c) not in unlisted | unlisted_passes]
    # checks beside the gate metric (non-finite output counts, the SLO) name their metric in a column
    with_metric = any(c.metric != gate.metric for c in checks)
    headers = ["variant", "backend", "scope", *(["metric"] if with_metric else []), "rows", "FP32", "observed", "drop",
               "tolerance", "result"]  # fmt: skip
    numeric = frozenset(range(4, 9)) if with_metric else frozenset(range(3, 8))
    footer = [f"cannot judge (fail closed): {problem}" for problem in gate.problems]
    footer += [f"skipped {c.variant}@{c.backend} {c.scope}: {c.reason}" for c in checks
               if c.status == "skipped" and c.reason not in ("", UNDER_MIN_SIZE)]  # fmt: skip
    footer += [f"{len(unlisted)} more skipped checks of slices {UNDER_MIN_SIZE} not listed (report.md lists them)"
               ] if unlisted else []  # fmt: skip
    footer += [f"{len(unlisted_passes)} more passing slice checks, each further from its tolerance, not listed "
               "(report.md and `qbench gate --verbose` list them)"] if unlisted_passes else []  # fmt: skip
    footer += [f"note: {note}" for note in gate.notes] if notes else []
    if not gate.checks and not gate.problems:
        footer = ["no variant was gated"]
    rows = [_check_row(c, with_metric=with_metric) for c in checks]
    style = "red" if gate.problems else "dim"
    return Grid(f"Gate on {gate.metric_text}: {_verdict(gate)}", headers, rows, numeric, footer, footer_style=style)


def gate_table(gate: GateReport, *, notes: bool = True, every_pass: bool = True) -> Table:
    """Every gate check, breaches first and in red; fail-closed problems, and with `notes` the gate's notes, listed
    under the table. Slices too small to judge are listed up to SHOWN_SMALL_SLICES and counted past it: a slice
    column of many values made a CI log of a line per slice, every one 'skipped'. Without `every_pass`, passing
    slice checks too, up to SHOWN_PASSING_SLICES (300 slices printed 915 lines of PASS after `qbench sweep`)."""
    passing = None if every_pass else SHOWN_PASSING_SLICES
    return to_rich(_gate_grid(gate, small_rows=SHOWN_SMALL_SLICES, passing_rows=passing, notes=notes))


# -- latency --------------------------------------------------------------------------------------


def _spread(point: LatencyPoint) -> str:
    """Window p50 spread / IQR over median, in percent (— where not measured)."""
    return " / ".join(f"{v:.1%}" if finite(v) else NONE for v in (point.spread, point.iqr_ratio))


def _latency_rows(variant: VariantResult, notes: Footnotes) -> list[list[Cell]]:
    """One row per batch size; the cold start (session, first run, threads) only on the variant's first row."""
    if variant.latency is None:
        return []
    latency = variant.latency
    crowded = oversubscription_note(latency)  # more threads than usable CPUs: the threads cell points to why
    threads = str(latency.threads or "default") + (f" {notes.mark(crowded)}" if crowded else "")
    cold: list[Cell] = [short(latency.session_create_ms), short(latency.first_run_ms), threads]
    rows = []
    for index, p in enumerate(latency.points):
        timing: list[Cell] = [str(p.batch_size), _p50(p, notes), *(short(ms) for ms in (p.p95_ms, p.p99_ms, p.mean_ms)),
                              rate(p.items_per_s), f"{p.warmup}/{p.iterations}", _spread(p)]  # fmt: skip
        rows.append([variant.variant, variant.backend, *timing, *(cold if index == 0 else ["", "", ""])])
    return rows


def _latency_grid(results: SweepResults) -> Grid:
    headers = ["variant", "backend", "batch", "p50 ms", "p95 ms", "p99 ms", "mean ms", "items/s", "warm-up/runs",
               "spread windows / IQR", "session ms", "first run ms", "threads"]  # fmt: skip
    notes = Footnotes()
    rows = [row for v in results.variants for row in _latency_rows(v, notes)]
    footer = ["cold start = session ms + first run ms; spread: (max - min) / median of the last windows' p50s, "
              "then interquartile range / median of all timed runs"]  # fmt: skip
    return Grid("Latency", headers, rows, frozenset(range(2, 12)), footer + _timed_inputs(results) + notes.lines())


def _timed_inputs(results: SweepResults) -> list[str]:
    """What each batch size was timed on, where the timed batches' shapes vary (text cut to each batch's longest
    row): every variant is timed on the same batches, so one line per batch size."""
    lines: dict[int, str] = {}
    for point in (p for v in results.variants if v.latency is not None for p in v.latency.points if p.shapes):
        shapes = "; ".join(f"{name} {s['min']} to {s['max']}, median {s['p50']}" for name, s in point.shapes.items())
        lines.setdefault(point.batch_size, f"batch {point.batch_size}: timed over {point.batches} batches of "
                                           f"evaluation rows in rotation, shapes {shapes}")  # fmt: skip
    return [lines[size] for size in sorted(lines)]


# -- markdown report ------------------------------------------------------------------------------


def _usable_cpus(env: dict[str, Any]) -> str:
    """The CPUs the sweep's process was allowed (qbench.environment.CpuAllowance), in words."""
    if "usable_cpus" not in env:
        return "usable CPUs not recorded"
    quota = env.get("cpu_quota")
    limit = f"cgroup quota {quota:.2f} CPUs" if isinstance(quota, float) else "no cgroup quota"
    return f"**usable CPUs:** {env['usable_cpus']} (affinity {env.get('affinity_cpus', '?')}, {limit})"


def _header(results: SweepResults) -> str:
    recipe, env = results.recipe, results.environment
    packages = env.get("packages", {})
    runtimes = ", ".join(f"{p} {packages[p]}" for p in ("onnxruntime", "onnxruntime-gpu", "torch") if p in packages)
    threads = sorted({str(v.latency.threads or "runtime default") for v in results.variants if v.latency})
    lines = [
        f"# qbench report: {recipe.get('name', '')}",
        "",
        f"- **Recipe:** `{recipe.get('path', '')}` (sha256 `{str(recipe.get('sha256', ''))[:12]}`), "
        f"task {recipe.get('task', '')}",
        f"- **Created:** {results.created_at} with qbench {results.qbench_version}",
        f"- **CPU:** {env.get('cpu', 'unknown')}, {env.get('cpu_count', '?')} logical cores, "
        f"flags {' '.join(env.get('cpu_flags', [])) or 'none recorded'}",
        f"- **Software:** Python {env.get('python', '?')}, {runtimes or 'no runtime recorded'}; "
        f"{env.get('platform', '')}",
        f"- **Threads (intra-op):** {', '.join(threads) or 'not measured'}; {_usable_cpus(env)}",
        f"- **Reference:** {results.reference}; "
        f"**{'gate metrics' if results.gate_metrics else 'gate metric'}:** "
        f"{', '.join(results.gate_metrics or (results.gate_metric,))}; "
        f"**evaluation rows:** {results.evaluation_rows}",
    ]
    for what, counts in results.dropped_nonfinite.items():
        shown = ", ".join(f"{column} {rows}" for column, rows in counts.items())
        lines.append(f"- **{what.capitalize()} rows dropped for NaN/inf "
                     f"inputs:** {shown} (data.nonfinite_inputs: drop)")
    for what, counts in results.kept_nonfinite.items():
        shown = ", ".join(f"{column} {rows}" for column, rows in counts.items())
        where = f"slice {what.removeprefix('slice:')}" if what.startswith("slice:") else what
        lines.append(f"- **Rows with NaN/inf inputs fed ({where}):** {shown} (data.nonfinite_inputs: keep)")
    return "\n".join(lines) + "\n"


def _calibration_section(results: SweepResults) -> str:
    record = results.calibration
    if record is None:
        return "## Calibration\n\nNo variant needed calibration.\n"
    rows: list[list[Cell]] = [[name, str(count)] for name, count in record.per_slice_counts.items()]
    facts = (f"{record.size} rows, seed {record.seed}, stratified by {record.stratify_by or 'nothing'}, "
             f"row ids sha256 `{record.row_ids_sha256[:12]}`{_overlap_facts(record)}")  # fmt: skip
    if not rows:  # no slices, or a separate calibration file (slices are defined on data.path only)
        return "\n".join(["## Calibration", "", facts + "; no per-slice counts"]) + "\n"
    table = markdown_table(Grid("Calibration", ["slice", "rows"], rows, frozenset({1})))
    return "\n".join(["## Calibration", "", facts, "", *table]) + "\n"


def _overlap_facts(record: CalibrationRecord) -> str:
    """What the calibration rows share with the evaluation rows (nothing for results that did not record it)."""
    facts = ""
    if record.held_out_rows:
        facts += f"; {record.held_out_rows} evaluation rows held out as calibration rows (overlap: {record.overlap})"
    if record.evaluation_overlap_rows:
        facts += (f"; **{record.evaluation_overlap_rows} calibration rows are also evaluated** (same inputs): "
                  "variants calibrated on them may look better than on unseen rows")  # fmt: skip
    if record.selection_rows == 0:
        facts += "; **candidates chosen on the evaluation rows**: no other row with readable labels to choose on"
    elif record.selection_rows is not None:
        facts += (f"; candidates chosen on {record.selection_rows} other rows, none fitted on or evaluated "
                  f"({record.selection_from_sample} of them drawn here and kept apart from fitting)")  # fmt: skip
        if record.selection_overlap_rows:
            facts += f", **though {record.selection_overlap_rows} feed the model what evaluation rows feed it**"
    return facts


def _frontier_section(results: SweepResults, gate: GateReport | None, plot_path: Path | None, report_path: Path) -> str:
    lines = ["## Frontier", "", "```", frontier_text(results, gate.fp32_differs() if gate else None), "```", ""]
    if plot_path is not None:
        relative = Path(os.path.relpath(plot_path.resolve(), report_path.resolve().parent)).as_posix()
        lines += [f"![latency vs {results.gate_metric}]({relative})", ""]
    return "\n".join(lines)


def _notes_section(results: SweepResults) -> str:
    lines = ["## Notes", ""]
    for variant in results.variants:
        if variant.fidelity.emulated:
            scored = f" Scored model: `{variant.evaluated_model_path}`." if variant.evaluated_model_path else ""
            lines.append(f"- **{variant.key}** figures {fidelity_text(variant)}, not native: "
                         f"{md_cell(variant.fidelity.method)}.{scored}")  # fmt: skip
        needed = non_default_session_options(variant.params)
        if needed:
            shown = ", ".join(f"{key}={value}" for key, value in needed.items())
            lines.append(f"- **{variant.key}** ⚠ measured with non-default ONNX Runtime session options ({shown}), "
                         "declared in the saved model's metadata_props: load it with the same options, the "
                         "defaults give other outputs")  # fmt: skip
        kernels = variant.params.get("runtime.kernels")  # what a torch backend saw its ops compute in
        if kernels is not None and kernels != variant.precision:
            lines.append(f"- **{variant.key}** ran: {md_cell(str(kernels))}")
        lines += [f"- **{variant.key}**: {md_cell(note)}" for note in variant.notes]
        if variant.status != "ok":
            lines.append(f"- **{variant.key}** {variant.status}: {md_cell(variant.error or 'no error message')}")
    if results.timings:
        timings = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in results.timings.items())
        lines.append(f"- Sweep timings: {timings}")
    return "\n".join(lines if len(lines) > 2 else lines + ["None."]) + "\n"


def render_markdown(results: SweepResults, gate: GateReport | None, plot_path: Path | None, report_path: Path) -> str:
    gate_part = to_markdown(_gate_grid(gate)) if gate else "## Gate\n\nNo gate was evaluated.\n"
    sections = [
        _header(results),
        _calibration_section(results),
        to_markdown(_summary_grid(results, gate)),
        to_markdown(_slice_grid(results, results.gate_metric)),
        to_markdown(_latency_grid(results)),
        *([to_markdown(serving)] if (serving := serving_table(results, gate)) is not None else []),
        _frontier_section(results, gate, plot_path, report_path),
        gate_part,
        search_markdown(results),
        ranges_section(results),
        _notes_section(results),
    ]
    return "\n".join(section for section in sections if section)


def write_markdown_report(results: SweepResults, gate: GateReport | None, plot_path: Path | None, path: Path) -> Path:
    """Write report.md (Markdown only, no HTML); the plot is linked by its path relative to the report."""
    return write_atomically(path, render_markdown(results, gate, plot_path, path), what="the report")


def print_summary(results: SweepResults, gate: GateReport | None, target: Console | None = None, *,
                  gate_notes: bool = True) -> None:  # fmt: skip
    """The summary table, the frontier and the gate table (with its notes unless `gate_notes`), on `target` (stderr)."""
    with custom_metrics(recorded_custom_metrics(results.recipe.get("resolved", {}))):
        serving = serving_table(results, gate)
        tables = [summary_table(results, gate), *([to_rich(serving)] if serving else []),
                  Text(frontier_text(results, gate.fp32_differs() if gate else None))]  # fmt: skip
        tables += [gate_table(gate, notes=gate_notes, every_pass=False)] if gate is not None else []
    for renderable in tables:
        print_wide(renderable, target)


def print_partial_run(run_dir: Path, target: Console | None = None) -> str | None:
    """For an incomplete run (interrupted, crashed, running): print the variant runs it finished, which are never
    judged, and return why in one line; None for a complete run (or no run folder)."""
    from qbench.results.schema import read_results
    from qbench.runs import RESULTS_FILE, describe_run

    run = describe_run(run_dir)
    if run is None or run.complete:
        return None
    partial = read_results(run_dir / RESULTS_FILE, partial=True)
    print_summary(partial, None, target)
    return (f"{run_dir} is an incomplete run ({run.state}): the {len(partial.variants)} variant runs it finished are "
            "shown, not judged; finish it with `qbench sweep <recipe> --resume`")
