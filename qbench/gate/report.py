"""How a gate verdict is presented: console lines, a JSON document, a Markdown summary (JUnit XML: qbench.gate.junit).

Everything here except `write_report` and `append_step_summary` is a pure function of a `GateReport`
(qbench.gate decides; this module only says it), so `qbench gate`, `qbench sweep --gate` and
any script that calls the library show the same figures in the same words.

Each check and problem belongs to one variant on one backend (`variant@backend`); a problem
whose text starts with such a key is that variant's, any other is about the results as a whole.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import asdict
from pathlib import Path
from typing import Any

from qbench.errors import QbenchError, named_some
from qbench.files import file_in_the_way, write_atomically
from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, GateReport
from qbench.gate.evaluate import problem_owner as owner_of
from qbench.gate.metric_check import UNDER_MIN_SIZE, GateCheck
from qbench.gate.outputs import COLLAPSED, SPREAD_METRIC
from qbench.gate.report_paths import check_report_path
from qbench.report.grid import compared, figure, md_cell
from qbench.slo import SLO_SCOPE
from qbench.validate.catalogue import OUTPUT_SEPARATOR
from qbench.validate.kept import KEPT, KEPT_RULES

try:  # POSIX; elsewhere two gates appending to one step summary at once are not serialised
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

JSON_SCHEMA_VERSION = 1
_VERDICTS = {EXIT_PASS: "pass", EXIT_BREACH: "breach"}
_HEADLINES = {EXIT_PASS: "PASS", EXIT_BREACH: "FAIL"}


# -- words and numbers ----------------------------------------------------------------------------


def verdict(report: GateReport) -> str:
    """'pass', 'breach', 'interrupted' (a signal ended the command before its verdict stood), 'error' (the verdict
    stood, then the command failed: GateReport.failed_after_verdict) or 'unusable': the exit code in a word (the last
    three are all 2)."""
    return _VERDICTS.get(report.exit_code, _ending(report))


def headline(report: GateReport) -> str:
    """'PASS', 'FAIL', 'FAIL (interrupted)', 'FAIL (error after the verdict)' or 'FAIL (results unusable)'."""
    return _HEADLINES.get(report.exit_code, f"FAIL ({_ENDING_HEADLINES[_ending(report)]})")


_ENDING_HEADLINES = {"interrupted": "interrupted", "error": "error after the verdict", "unusable": "results unusable"}


def _ending(report: GateReport) -> str:
    """How a command without a verdict of 0 or 1 ended: 'interrupted', 'error' or 'unusable'."""
    if report.interrupted:
        return "interrupted"
    return "error" if report.failed_after_verdict else "unusable"


def problem_kind(report: GateReport, problem: str) -> str:
    """A problem's kind in the reports: the signal that ended the command, the error after its verdict, or results
    that cannot be judged."""
    if problem == report.interrupted:
        return "interrupted"
    return "error" if problem == report.failed_after_verdict else "unusable"


def check_key(check: GateCheck) -> str:
    return f"{check.variant}@{check.backend}"


def plural(n: int, noun: str) -> str:
    """'1 variant', '2 variants'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _scope(check: GateCheck) -> str:
    """'overall', 'slo' (the latency budget) or 'slice <name>'."""
    return check.scope if check.scope in ("overall", SLO_SCOPE) else f"slice {check.scope}"


def check_line(check: GateCheck) -> str:
    """One check on one line: who, where, what, reference → observed, drop vs tolerance, result."""
    comparison = ">" if check.status == "breach" else "≤"
    result = {"breach": "BREACH", "pass": "pass"}.get(check.status, check.status)
    if check.metric == "nonfinite_outputs":
        return (f"{result} {check_key(check)} {_scope(check)} nonfinite_outputs: NaN/inf on {check.observed:g} rows "
                f"(FP32: {check.reference:g}), {check.drop:g} of them where FP32 is finite")  # fmt: skip
    if check.metric.rpartition(OUTPUT_SEPARATOR)[2] == SPREAD_METRIC:  # what was measured, not why: a constant
        # answer and a few extreme FP32 rows the variant saturates (FP8's 448) fall below COLLAPSED alike
        share = f" ({check.observed / check.reference:.3g} of it)" if check.reference > 0 else ""
        return (f"{result} {check_key(check)} {_scope(check)} {check.metric}: its outputs vary across the {check.size} "
                f"rows by {check.observed:.4g}, FP32's by {check.reference:.4g} (the rows' RMS distance from their "
                f"mean), under {COLLAPSED:g} of FP32's{share}: the variant's outputs lost most of FP32's variation "
                "across these rows")  # fmt: skip
    if check.scope == SLO_SCOPE and check.reason:  # a breach whatever the p99: the instance fell behind
        return (f"{result} {check_key(check)} {_scope(check)} {check.metric}: {check.reason}; p99 "
                f"{figure(check.observed)} ms over a finite run only, budget {figure(check.reference)} ms")  # fmt: skip
    rule = check.metric.rpartition(OUTPUT_SEPARATOR)[2]
    if rule in KEPT_RULES:
        return (f"{result} {check_key(check)} {_scope(check)} {check.metric}: {check.reason}: "
                f"{KEPT_RULES[rule].format(reference=check.reference, own=check.observed)}: "
                f"{1 - check.drop:.1%} kept, under {KEPT:.0%}{'; ' if check.detail else ''}{check.detail}")  # fmt: skip
    drop, tolerance = compared(check.drop, check.tolerance)
    line = (
        f"{result} {check_key(check)} {_scope(check)} {check.metric}: "
        f"{figure(check.reference)} → {figure(check.observed)}, "
        f"drop {drop} {comparison} tolerance {tolerance}"
    )
    return f"{line} ({check.size} rows, {skip_reason(check)})" if check.status == "skipped" else line


def skip_reason(check: GateCheck) -> str:
    """Why a skipped check was not judged (results written before checks carried a reason: a small slice)."""
    return check.reason or UNDER_MIN_SIZE


def failure_reasons(report: GateReport) -> list[str]:
    """Why a verdict is no pass, in short phrases ('overall drop 0.0312 > 0.01', then each problem): what the INT8
    search and the fallback note against a candidate that failed."""
    ordered = sorted(report.breaches, key=lambda c: c.metric not in report.gated_metrics)  # gated metrics' first
    return [_short_breach(c, report.metric) for c in ordered] + list(report.problems)


def _short_breach(check: GateCheck, metric: str) -> str:
    """A breach in a few words: the gate metric's drop against its tolerance, or what another check found lost
    ('topic=law spread_kept: dimension 12 45% kept < 50%'), never another check's figure read as the metric's drop."""
    if check.scope == SLO_SCOPE and check.reason:  # a breach whatever the p99: the instance fell behind
        return f"{check.scope} {check.metric}: {check.reason}"
    rule = check.metric.rpartition(OUTPUT_SEPARATOR)[2]
    if rule in KEPT_RULES:
        return f"{check.scope} {check.metric}: {check.reason} {1 - check.drop:.0%} kept < {KEPT:.0%}"
    if rule == SPREAD_METRIC:
        return f"{check.scope} {check.metric}: outputs vary {check.observed:.3g} against FP32's {check.reference:.3g}"
    named = "" if check.metric == metric else f" {check.metric}"
    return f"{check.scope}{named} drop {compared(check.drop, check.tolerance)[0]} > {check.tolerance:g}"


def problem_line(problem: str) -> str:
    return f"UNUSABLE {problem} (fail closed)"


def problem_owner(report: GateReport, problem: str) -> str | None:
    """The variant@backend a problem or a note is about, or None when it is about the results as a whole."""
    return owner_of(report.gated, problem)


def _breaching_scopes(report: GateReport) -> dict[str, list[str]]:
    """variant@backend → the scopes it breaches on, in the order the gate checked them; where several metrics are
    gated (gate.metrics), a gated metric's breach names its metric ('overall price_mae'), as one metric's checks
    alone would not say which head the variant broke."""
    scopes: dict[str, list[str]] = {}
    several = len(report.gated_metrics) > 1
    for check in report.breaches:
        own = scopes.setdefault(check_key(check), [])
        scope = f"{check.scope} {check.metric}" if several and check.metric in report.gated_metrics else check.scope
        if scope not in own:
            own.append(scope)
    return scopes


def summary_line(report: GateReport) -> str:
    """The verdict, naming every breaching variant with its scopes and every variant that cannot be judged.

    e.g. `gate: FAIL — 2 of 5 variants breach: int8-minmax@ort (overall, lighting=dark), fp8@ort (faint); 30 checks`

    A variant is one on one backend (`variant@backend`); FP32 on a later backend, judged against the first's, is
    counted apart: `2 variants × 4 scopes and FP32 on 1 later backend (judged against ort's FP32)`."""
    later = _later_fp32(report, report.gated)
    variants = len(report.gated) - len(later)
    parts: list[str] = []
    # a signal or an error after the verdict ended the command: the headline says so, and it is no problem with the
    # results (the JUnit error, the JSON's problems and the step summary carry its reason)
    problems = [p for p in report.problems if problem_kind(report, p) == "unusable"]
    if problems:
        unjudged = list(dict.fromkeys(o for p in problems if (o := problem_owner(report, p)) is not None))
        general = sum(problem_owner(report, p) is None for p in problems)
        parts += _counted(report, unjudged, variants, len(later), "cannot be judged", "cannot be judged")
        if general:
            parts.append(f"{plural(general, 'problem')} with the results")
    breaching = _breaching_scopes(report)
    if breaching:
        named = [f"{key} ({named_some(scopes)})" for key, scopes in breaching.items()]
        parts += _counted(report, named, variants, len(later), "breaches", "breach")
    tail = plural(len(report.checks), "check") + _skipped_tail(report) if report.checks else "nothing judged"
    if not parts and not report.checks:
        return f"gate: {headline(report)} — {tail}"
    if not parts:
        scopes = len({c.scope for c in report.checks})
        also = f" and FP32 on {plural(len(later), 'later backend')} (judged {_against(report)})" if later else ""
        return f"gate: {headline(report)} — {plural(variants, 'variant')} × {plural(scopes, 'scope')}{also}, {tail}"
    return f"gate: {headline(report)} — {'; '.join(parts)}; {tail}"


def _later_fp32(report: GateReport, named: list[str] | tuple[str, ...]) -> list[str]:
    """Of `named` (keys, or keys followed by their scopes), those of FP32 on a later backend."""
    return [n for n in named if report.reference and n.startswith(f"{report.reference}@")]


def _against(report: GateReport) -> str:
    return f"against {report.reference_backend or 'the first backend'}'s FP32"


def _counted(report: GateReport, named: list[str], variants: int, later: int, one: str, many: str) -> list[str]:
    """'1 of 2 variants breaches: int8@ort (overall)', 'FP32 on 1 of 1 later backend breaches (against ort's
    FP32): fp32@ort-b (overall)': each where it names any."""
    fp32 = _later_fp32(report, named)
    own = [n for n in named if n not in fp32]
    return [f"{who}{len(found)} of {plural(total, noun)} {one if len(found) == 1 else many}{how}: {', '.join(found)}"
            for found, who, total, noun, how in ((own, "", variants, "variant", ""),
                                                 (fp32, "FP32 on ", later, "later backend", f" ({_against(report)})"))
            if found]  # fmt: skip


def _skipped_tail(report: GateReport) -> str:
    """' (1 skipped: slices under min_slice_size: tiny)'; a scope skipped for another reason is named with it."""
    scopes: dict[str, list[str]] = {}
    for check in report.checks:
        if check.status == "skipped" and check.scope not in scopes.setdefault(skip_reason(check), []):
            scopes[skip_reason(check)].append(check.scope)
    count = sum(c.status == "skipped" for c in report.checks)
    if not count:
        return ""
    if list(scopes) == [UNDER_MIN_SIZE]:
        return f" ({count} skipped: slices {UNDER_MIN_SIZE}: {named_some(scopes[UNDER_MIN_SIZE])})"
    parts = [f"{UNDER_MIN_SIZE}: {named_some(names)}" if reason == UNDER_MIN_SIZE else f"{named_some(names)} {reason}"
             for reason, names in scopes.items()]  # fmt: skip
    return f" ({count} skipped: {'; '.join(parts)})"


BREACH_LINES = 10
"""Breaches `qbench gate` prints per variant by default: a variant breaching 2,000 slices printed 2,000 lines
(--verbose prints every check, --json writes each)."""


def console_lines(report: GateReport) -> list[str]:
    """What `qbench gate` prints by default above the summary: each variant's breaches (BREACH_LINES of them at most,
    the rest counted), a line per backend whose FP32 breaches against the first backend's, then each problem."""
    lines: list[str] = []
    by_variant: dict[str, list[GateCheck]] = {}
    for check in report.breaches:
        by_variant.setdefault(check_key(check), []).append(check)
    for key, breaches in by_variant.items():
        lines += [check_line(c) for c in breaches[:BREACH_LINES]]
        if len(breaches) > BREACH_LINES:
            lines.append(f"BREACH {key}: {len(breaches) - BREACH_LINES} more breaches (--verbose prints every check, "
                         "--json writes each)")  # fmt: skip
    lines += [f"BREACH {line}" for line in report.fp32_differs().values()]
    return lines + [problem_line(p) for p in report.problems]


# -- JSON -----------------------------------------------------------------------------------------


def _finite_or_text(value: Any) -> Any:
    """JSON has no NaN/inf: such floats become the strings 'nan', 'inf', '-inf'."""
    return value if not isinstance(value, float) or math.isfinite(value) else str(value)


def report_dict(report: GateReport) -> dict[str, Any]:
    """The machine-readable report: verdict, exit code, counts, every check, every problem, the notes."""
    checks = [{k: _finite_or_text(v) for k, v in asdict(c).items()} for c in report.checks]
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "verdict": verdict(report),
        "exit_code": report.exit_code,
        "summary": summary_line(report),
        "metric": report.metric,
        "metrics": list(report.gated_metrics),  # every gated metric (gate.metrics), gate.metric first
        "gated": list(report.gated),
        "counts": {
            "checks": len(report.checks),
            "breaches": len(report.breaches),
            "skipped": sum(c.status == "skipped" for c in report.checks),
            "problems": len(report.problems),
        },
        "checks": checks,
        "problems": [{"variant": problem_owner(report, p), "message": p} for p in report.problems],
        "notes": list(report.notes),
        # every pass too few rows resolve, with its variant (the problems and notes name NAMED_SCOPES of a variant's)
        "unresolved": [{"variant": owner, "message": why} for owner, why in report.unresolved_passes],
    }


def report_json(report: GateReport) -> str:
    return json.dumps(report_dict(report), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


# -- Markdown (GitHub step summary) ---------------------------------------------------------------


def markdown_summary(report: GateReport, title: str = "qbench gate", *, rows: int | None = None) -> str:
    """A Markdown section: the summary line, then a table of every check (breaches first) and the problems; with
    `rows`, the table's first `rows` checks only, and a line saying how many were left out."""
    order = {"breach": 0, "pass": 1}
    lines = [f"### {title}: {headline(report)}", "",
             md_cell(summary_line(report)), ""]  # fmt: skip
    checks = sorted(report.checks, key=lambda c: order.get(c.status, 2))
    shown = checks if rows is None else checks[:rows]
    if shown:
        lines += ["| variant@backend | scope | metric | FP32 | observed | drop | tolerance | result |",
                  "|---|---|---|---:|---:|---:|---:|---|"]  # fmt: skip
        for c in shown:
            result = {"breach": "**BREACH**", "skipped": f"skipped ({skip_reason(c)})"}.get(c.status, c.status)
            cells = [check_key(c), c.scope, c.metric, figure(c.reference), figure(c.observed),
                     *compared(c.drop, c.tolerance), result]  # fmt: skip
            lines.append("| " + " | ".join(md_cell(cell) for cell in cells) + " |")
        lines.append("")
    if len(shown) < len(checks):
        lines += [f"- {len(checks) - len(shown)} more checks left out (the step summary's size is limited); the "
                  "--json and --junit reports hold every check", ""]  # fmt: skip
    lines += [f"- **{'failed after the verdict' if p == report.failed_after_verdict else 'cannot judge (fail closed)'}"
              f":** {md_cell(p)}" for p in report.problems]  # fmt: skip
    lines += [f"- note: {md_cell(n)}" for n in report.notes]
    return "\n".join(lines).rstrip("\n") + "\n\n"


# -- files ----------------------------------------------------------------------------------------


def write_report(path: Path, text: str) -> Path:
    """Write a report file. A new one (or an earlier gate report, or an empty file) is written through a temporary
    file in the same folder and renamed into place, readable as the umask allows: never a half-written report. A
    pipe or device (`/dev/stdout`, a shell's `>(jq .)`) is written through. Any other existing file is refused:
    the path was meant for something else (a model, a data file, another run's results), which must not be lost."""
    try:
        if path.exists() and not path.resolve().is_file():
            with path.open("w", encoding="utf-8") as stream:
                stream.write(text)
            return path
        check_report_path(path)
        target = path.resolve()
        blocking = file_in_the_way(target.parent)
        if blocking is not None:
            raise QbenchError(f"{path}: cannot write the gate report: {blocking} is a file, not a folder")
    except OSError as exc:
        raise QbenchError(f"{path}: cannot write the gate report: {exc.strerror or exc}") from exc
    write_atomically(target, text, what="the gate report")
    return path


STEP_SUMMARY_LIMIT = 1 << 20
"""The most a step summary file may hold: GitHub's runner uploads none of a step's summary beyond it ('upload
aborted, supports content up to a size of 1024k'), which would lose what the other tools of the step wrote too."""


def append_step_summary(path: Path, report: GateReport, limit: int = STEP_SUMMARY_LIMIT) -> Path:
    """Append the verdict's Markdown section to a step summary file, which the other steps and tools of the job
    append to as well and the runner reads after the step: opened for appending only (what is there is never
    truncated or replaced), on a line of its own, written in one write under an exclusive lock (two gates appending
    at once neither interleave their lines nor read each other's half-written size) and cut down to the rows that
    keep the file within `limit` (breaches first)."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            if fcntl is not None:  # another gate's append in progress shows a size (and a last byte) mid-write
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            size = os.fstat(descriptor).st_size if stat.S_ISREG(os.fstat(descriptor).st_mode) else 0
            separator = b"" if size == 0 or _last_byte(path, size) == b"\n" else b"\n"
            section = _fitting_summary(report, limit - size - len(separator))
            if section is None:
                raise QbenchError(f"{path}: cannot append the gate summary: the file holds {size} bytes already, "
                                  f"and the runner uploads no step summary over {limit} bytes")  # fmt: skip
            data = separator + section
            while data:
                data = data[os.write(descriptor, data):]
        finally:
            os.close(descriptor)
    except OSError as exc:
        raise QbenchError(f"{path}: cannot append the gate summary: {exc.strerror or exc}") from exc
    return path


def _last_byte(path: Path, size: int) -> bytes:
    try:
        with path.open("rb") as file:
            file.seek(size - 1)
            return file.read(1)
    except OSError:  # write-only for us: a blank line more costs nothing
        return b""


def _fitting_summary(report: GateReport, budget: int) -> bytes | None:
    """The Markdown section in UTF-8 with as many table rows as fit in `budget` bytes (None when not even the
    summary line and the problems do)."""
    whole = markdown_summary(report).encode("utf-8")
    if len(whole) <= budget:
        return whole
    fewest, most = 0, len(report.checks)  # the most rows that fit lie in [fewest, most)
    if len(markdown_summary(report, rows=0).encode("utf-8")) > budget:
        return None
    while most - fewest > 1:
        middle = (fewest + most) // 2
        if len(markdown_summary(report, rows=middle).encode("utf-8")) <= budget:
            fewest = middle
        else:
            most = middle
    return markdown_summary(report, rows=fewest).encode("utf-8")
