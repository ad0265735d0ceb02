"""Rendering a gate verdict: the summary line, the console lines, JUnit XML, JSON and Markdown, from hand-built
reports."""

from __future__ import annotations

import html
import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from qbench.errors import QbenchError
from qbench.gate.evaluate import GateReport
from qbench.gate.junit import junit_xml
from qbench.gate.metric_check import GateCheck
from qbench.gate.report import (
    STEP_SUMMARY_LIMIT,
    append_step_summary,
    check_line,
    console_lines,
    failure_reasons,
    markdown_summary,
    report_dict,
    report_json,
    summary_line,
    write_report,
)

BACKEND = "onnxruntime-cpu"
SCOPES = {"overall": 0.01, "condition=noisy": 0.02, "faint": 0.02}  # scope -> tolerance
REFERENCE = {"overall": 0.95, "condition=noisy": 0.90, "faint": 0.93}


def checks_for(variant: str, observed: dict[str, float], skipped: tuple[str, ...] = ()) -> list[GateCheck]:
    """One accuracy check per scope; the status follows from drop vs tolerance, as the gate decides it."""
    checks = []
    for scope, tolerance in SCOPES.items():
        drop = REFERENCE[scope] - observed[scope]
        status = "skipped" if scope in skipped else ("breach" if drop > tolerance else "pass")
        checks.append(GateCheck(variant, BACKEND, scope, "accuracy", REFERENCE[scope], observed[scope], drop,
                                tolerance, 40 if scope in skipped else 200, status))  # fmt: skip
    return checks


GOOD = {"overall": 0.949, "condition=noisy": 0.895, "faint": 0.925}
NAMES = ("fp16", "int8-minmax", "int8-entropy", "fp8", "bf16")


def report_with(observed: dict[str, dict[str, float]], problems: tuple[str, ...] = ()) -> GateReport:
    checks = [c for name in NAMES if name in observed for c in checks_for(name, observed[name])]
    return GateReport("accuracy", tuple(checks), problems, gated=tuple(f"{n}@{BACKEND}" for n in NAMES))


PASSING = report_with({name: GOOD for name in NAMES})
BREACHING = report_with({
    **{name: GOOD for name in NAMES},
    "int8-minmax": {"overall": 0.93, "condition=noisy": 0.85, "faint": 0.93},  # overall and noisy breach
    "fp8": {"overall": 0.945, "condition=noisy": 0.89, "faint": 0.90},  # only faint breaches (0.03 > 0.02)
})  # fmt: skip
UNUSABLE = report_with(
    {name: GOOD for name in NAMES if name != "bf16"}
    | {"fp8": {"overall": 0.90, "condition=noisy": 0.9, "faint": 0.93}},
    problems=(f"bf16@{BACKEND}: variant failed: out of memory", "results were modified after the sweep (digest)"),
)


def test_pass_summary_counts_variants_scopes_and_checks():
    assert summary_line(PASSING) == "gate: PASS — 5 variants × 3 scopes, 15 checks"
    assert console_lines(PASSING) == []


def test_breach_summary_names_exactly_the_breaching_variants_and_their_slices():
    line = summary_line(BREACHING)
    assert line == (
        "gate: FAIL — 2 of 5 variants breach: int8-minmax@onnxruntime-cpu (overall, condition=noisy), "
        "fp8@onnxruntime-cpu (faint); 15 checks"
    )


def test_console_lines_are_the_breaches_with_their_numbers():
    lines = console_lines(BREACHING)
    assert lines == [
        "BREACH int8-minmax@onnxruntime-cpu overall accuracy: 0.9500 → 0.9300, drop 0.0200 > tolerance 0.0100",
        (
            "BREACH int8-minmax@onnxruntime-cpu slice condition=noisy accuracy: 0.9000 → 0.8500, "
            "drop 0.0500 > tolerance 0.0200"
        ),
        "BREACH fp8@onnxruntime-cpu slice faint accuracy: 0.9300 → 0.9000, drop 0.0300 > tolerance 0.0200",
    ]


def test_unusable_summary_names_the_unjudged_variant_counts_other_problems_and_still_names_breaches():
    line = summary_line(UNUSABLE)
    assert line == (
        "gate: FAIL (results unusable) — 1 of 5 variants cannot be judged: bf16@onnxruntime-cpu; "
        "1 problem with the results; 1 of 5 variants breaches: fp8@onnxruntime-cpu (overall); 12 checks"
    )
    assert console_lines(UNUSABLE)[-2:] == [
        "UNUSABLE bf16@onnxruntime-cpu: variant failed: out of memory (fail closed)",
        "UNUSABLE results were modified after the sweep (digest) (fail closed)",
    ]


def test_skipped_slices_are_counted_in_the_summary_and_shown_as_skipped():
    checks = checks_for("int8", {"overall": 0.95, "condition=noisy": 0.5, "faint": 0.93}, skipped=("condition=noisy",))
    report = GateReport("accuracy", tuple(checks), gated=(f"int8@{BACKEND}",))
    assert summary_line(report) == ("gate: PASS — 1 variant × 3 scopes, 3 checks (1 skipped: slices under "
                                    "min_slice_size: condition=noisy)")  # fmt: skip
    assert check_line(checks[1]).endswith("(40 rows, under min_slice_size)")


def test_the_summary_names_up_to_five_small_slices_and_counts_the_rest():
    """It said only '9 skipped: slices under min_slice_size': which slices went unjudged was in report.md alone."""
    names = [f"s{i}" for i in range(7)]
    skipped = tuple(GateCheck(v, BACKEND, n, "accuracy", 0.9, 0.5, 0.4, 0.02, 3, "skipped", "under min_slice_size")
                    for v in ("int8", "fp8") for n in names)  # fmt: skip
    report = GateReport("accuracy", skipped, gated=(f"int8@{BACKEND}", f"fp8@{BACKEND}"))
    assert summary_line(report).endswith("(14 skipped: slices under min_slice_size: s0, s1, s2, s3, s4 and 2 more)")
    undefined = GateCheck("int8", BACKEND, "offline", "accuracy", math.nan, math.nan, math.inf, 0.02, 40, "skipped",
                          "undefined")  # fmt: skip
    assert summary_line(replace(report, checks=(*skipped, undefined))).endswith(
        "(15 skipped: under min_slice_size: s0, s1, s2, s3, s4 and 2 more; offline undefined)")


def test_a_scope_skipped_for_another_reason_is_named_with_it_everywhere():
    undefined = "not judged: r2 is undefined on this scope for FP32 too"
    checks = (GateCheck("int8", BACKEND, "overall", "r2", 0.9, 0.9, 0.0, 0.01, 200, "pass"),
              GateCheck("int8", BACKEND, "tiny", "r2", 0.9, 0.5, 0.4, 0.01, 3, "skipped", "under min_slice_size"),
              GateCheck("int8", BACKEND, "offline", "r2", math.nan, math.nan, math.inf, 0.01, 40, "skipped",
                        undefined))  # fmt: skip
    report = GateReport("r2", checks, gated=(f"int8@{BACKEND}",))
    assert summary_line(report).endswith(f"3 checks (2 skipped: under min_slice_size: tiny; offline {undefined})")
    assert check_line(checks[2]).endswith(f"(40 rows, {undefined})")
    skipped = [e.get("message") for e in ET.fromstring(junit_xml(report).split("?>", 1)[1]).iter("skipped")]
    assert skipped == ["3 rows, under min_slice_size", f"40 rows, {undefined}"]
    assert [c["reason"] for c in report_dict(report)["checks"]] == ["", "under min_slice_size", undefined]
    assert f"skipped ({undefined})" in markdown_summary(report)


def test_nan_observed_value_is_spelled_out():
    check = GateCheck("int8", BACKEND, "faint", "accuracy", 0.93, math.nan, math.inf, 0.02, 200, "breach")
    assert check_line(check) == (
        "BREACH int8@onnxruntime-cpu slice faint accuracy: 0.9300 → nan, drop inf > tolerance 0.0200"
    )


def test_a_tiny_drop_against_a_tiny_tolerance_is_not_printed_as_zeros():
    check = GateCheck("fp16", BACKEND, "overall", "cosine", 1.0, 0.99997, 3e-05, 1e-05, 200, "breach")
    assert check_line(check) == ("BREACH fp16@onnxruntime-cpu overall cosine: 1.0000 → 1.0000, drop 3.00e-05 > "
                                 "tolerance 1.00e-05")  # fmt: skip


def test_an_slo_check_is_named_as_the_slo_not_a_slice():
    check = GateCheck("int8", BACKEND, "slo", "latency.p99_ms", 5.0, 7.5, 2.5, 0.0, 200, "breach")
    report = GateReport("accuracy", (check,), gated=(f"int8@{BACKEND}",))
    assert console_lines(report) == [
        "BREACH int8@onnxruntime-cpu slo latency.p99_ms: 5.0000 → 7.5000, drop 2.5000 > tolerance 0.0000"
    ]
    assert summary_line(report) == "gate: FAIL — 1 of 1 variant breaches: int8@onnxruntime-cpu (slo); 1 check"


def junit(report: GateReport) -> ET.Element:
    return ET.fromstring(junit_xml(report))


def counts(element: ET.Element) -> tuple[int, int, int, int]:
    return tuple(int(element.get(k)) for k in ("tests", "failures", "errors", "skipped"))


def test_junit_has_a_suite_per_variant_and_a_case_per_check_with_correct_counts():
    root = junit(BREACHING)
    assert counts(root) == (15, 3, 0, 0)
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == [f"{n}@{BACKEND}" for n in NAMES]
    minmax = suites[f"int8-minmax@{BACKEND}"]
    assert counts(minmax) == (3, 2, 0, 0)
    assert [c.get("name") for c in minmax.findall("testcase")] == [
        "overall: accuracy", "condition=noisy: accuracy", "faint: accuracy",
    ]  # fmt: skip
    failure = minmax.find("testcase[@name='condition=noisy: accuracy']/failure")
    assert failure.get("message") == "drop 0.0500 > tolerance 0.0200"
    assert "0.9000 → 0.8500" in failure.text
    assert counts(suites[f"fp8@{BACKEND}"]) == (3, 1, 0, 0)


def test_junit_problems_are_error_cases_in_their_variants_suite_or_a_results_suite():
    root = junit(UNUSABLE)
    assert counts(root) == (14, 1, 2, 0)  # 12 checks + 2 problems; fp8 overall breaches
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert counts(suites[f"bf16@{BACKEND}"]) == (1, 0, 1, 0)
    assert suites[f"bf16@{BACKEND}"].find("testcase/error").get("message").endswith("out of memory")
    assert counts(suites["results"]) == (1, 0, 1, 0)


def test_junit_notes_are_the_system_out_of_their_variants_suite_or_the_results_suite():
    own = (f"int8@{BACKEND} computes in fp32 (nothing in the graph was lowered to int8): its pass says nothing "
           "about int8")
    checks = checks_for("int8", {"overall": 0.95, "condition=noisy": 0.9, "faint": 0.93})
    report = GateReport("accuracy", tuple(checks), gated=(f"int8@{BACKEND}",),
                        notes=("inputs not checked for staleness (--no-staleness-check)", own))  # fmt: skip
    root = junit(report)
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert suites[f"int8@{BACKEND}"].find("system-out").text == f"note: {own}"
    assert suites["results"].find("system-out").text == "note: inputs not checked for staleness (--no-staleness-check)"
    assert counts(root) == (3, 0, 0, 0) and counts(suites["results"]) == (0, 0, 0, 0)


def test_junit_skipped_checks_are_skipped_cases():
    checks = checks_for("int8", {"overall": 0.95, "condition=noisy": 0.5, "faint": 0.93}, skipped=("condition=noisy",))
    root = junit(GateReport("accuracy", tuple(checks), gated=(f"int8@{BACKEND}",)))
    assert counts(root) == (3, 0, 0, 1)


def test_json_round_trip_keeps_every_check_problem_and_the_verdict():
    loaded = json.loads(report_json(UNUSABLE))
    assert loaded == report_dict(UNUSABLE)
    assert (loaded["verdict"], loaded["exit_code"]) == ("unusable", 2)
    assert tuple(GateCheck(**c) for c in loaded["checks"]) == UNUSABLE.checks
    assert [p["message"] for p in loaded["problems"]] == list(UNUSABLE.problems)
    assert [p["variant"] for p in loaded["problems"]] == [f"bf16@{BACKEND}", None]
    assert loaded["counts"] == {"checks": 12, "breaches": 1, "skipped": 0, "problems": 2}
    assert loaded["summary"] == summary_line(UNUSABLE)


def test_json_writes_non_finite_numbers_as_strings():
    check = GateCheck("int8", BACKEND, "faint", "accuracy", 0.93, math.nan, math.inf, 0.02, 200, "breach")
    loaded = json.loads(report_json(GateReport("accuracy", (check,), gated=(f"int8@{BACKEND}",))))
    assert (loaded["checks"][0]["observed"], loaded["checks"][0]["drop"]) == ("nan", "inf")
    assert loaded["verdict"] == "breach"


def test_markdown_summary_lists_breaches_first_and_the_problems():
    text = markdown_summary(UNUSABLE)
    lines = text.splitlines()
    assert lines[0] == "### qbench gate: FAIL (results unusable)"
    table = [line for line in lines if line.startswith("| ")]
    assert len(table) == 1 + 12  # header + one row per check
    assert table[1].startswith(
        "| fp8@onnxruntime-cpu | overall | accuracy | 0.9500 | 0.9000 | 0.0500 | 0.0100 | **BREACH** |"
    )
    assert "- **cannot judge (fail closed):** results were modified after the sweep (digest)" in lines


def test_a_report_replaces_an_earlier_report_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out" / "gate.xml"
    write_report(target, junit_xml(GateReport(metric="accuracy")))
    write_report(target, "<testsuites name='qbench gate' tests='1'/>")
    assert target.read_text() == "<testsuites name='qbench gate' tests='1'/>"
    assert [p.name for p in target.parent.iterdir()] == ["gate.xml"]
    assert target.stat().st_mode & 0o777 == 0o666 & ~_current_umask()  # as readable as any file the sweep writes
    json_path = tmp_path / "gate.json"
    json_path.write_text("")  # an empty file (made by `mktemp` in a CI script) is a free slot
    write_report(json_path, report_json(GateReport(metric="accuracy")))
    write_report(json_path, report_json(GateReport(metric="cosine")))
    assert '"metric": "cosine"' in json_path.read_text()


def _current_umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("content", [b"\x08\x07onnx-model-bytes", b'{"variants": []}', b"a,b\n1,2\n"])
def test_a_report_never_overwrites_a_file_that_is_not_a_report(tmp_path, content):
    """--json pointed at the recipe's model, its data or another run's results replaced them with the report."""
    target = tmp_path / "model.onnx"
    target.write_bytes(content)
    with pytest.raises(QbenchError, match="the file exists and is not a qbench gate report"):
        write_report(target, report_json(GateReport(metric="accuracy")))
    assert target.read_bytes() == content
    link = tmp_path / "link.json"
    link.symlink_to(target)  # through a link to it: the same file
    with pytest.raises(QbenchError, match="is not a qbench gate report"):
        write_report(link, "{}")
    assert target.read_bytes() == content and link.is_symlink()


def test_a_report_to_a_pipe_is_written_through_it(tmp_path):
    import os
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    write_report(fifo, "report\n")
    reader.join(timeout=10)
    assert received == ["report\n"] and fifo.exists() and not fifo.is_file()


def test_unwritable_paths_are_one_line_errors(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(QbenchError, match=r"cannot write the gate report: .*file is a file, not a folder"):
        write_report(blocker / "gate.xml", "x")
    with pytest.raises(QbenchError, match="cannot append the gate summary"):
        append_step_summary(tmp_path / "missing-dir" / "summary.md", UNUSABLE)


@pytest.mark.parametrize(
    ("drop", "tolerance", "expected"),
    [
        (0.00012, 0.00005, "drop 0.00012 > tolerance 0.00005"),  # 4 decimals read "0.0001 > 0.0001"
        (0.0025, 0.00015, "drop 0.00250 > tolerance 0.00015"),  # 4 decimals rounded the tolerance set to 0.0002
        (0.0025, 0.002, "drop 0.0025 > tolerance 0.0020"),  # enough as it is
        (0.0025, 2e-05, "drop 0.0025 > tolerance 2.00e-05"),
    ],
)
def test_a_breach_line_shows_the_tolerance_as_set_and_a_drop_distinct_from_it(drop, tolerance, expected):
    """Tight tolerances (a kl_mean or mae gate) used to print rounded to 4 decimals: a slice tolerance of 5e-05 read
    '0.0001', and a drop of 0.00012 above it read 'drop 0.0001 > tolerance 0.0001'."""
    breach = GateCheck("int8", BACKEND, "overall", "kl_mean", 0.0, drop, drop, tolerance, 200, "breach")
    assert check_line(breach).endswith(expected)
    report = GateReport("kl_mean", (breach,), gated=(f"int8@{BACKEND}",))
    assert expected.replace("drop ", "| ").replace(" > tolerance ", " | ") in markdown_summary(report)


# -- the GitHub step summary: a file the job's other steps and tools append to -----------------------


def test_the_step_summary_section_starts_on_a_line_of_its_own(tmp_path):
    """A step that wrote 'tests: 12 passed' without a newline had the gate's heading glued to its line."""
    summary = tmp_path / "summary.md"
    summary.write_bytes(b"tests: 12 passed")
    append_step_summary(summary, UNUSABLE)
    assert summary.read_text().startswith("tests: 12 passed\n### qbench gate: FAIL (results unusable)\n")


def test_two_gates_appending_at_once_write_whole_sections(tmp_path):
    """Each section is one write() on a file opened for appending: sections never interleave nor overwrite."""
    import multiprocessing

    summary = tmp_path / "summary.md"
    summary.write_text("## an earlier step\n")
    report = GateReport("accuracy", tuple(checks_for("int8", GOOD)) * 400, gated=(f"int8@{BACKEND}",))
    section = markdown_summary(report)
    assert len(section.encode()) > 64 << 10  # more than a pipe or a text stream's buffer takes in one write
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=append_step_summary, args=(summary, report)) for _ in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=60)
    assert [writer.exitcode for writer in writers] == [0] * 4
    assert summary.read_text() == "## an earlier step\n" + section * 4


def test_a_step_summary_is_cut_to_the_runners_limit_keeping_the_breaches_and_what_others_wrote(tmp_path):
    """The runner uploads no summary of a step over 1 MiB, other tools' sections included: the table is cut."""
    summary = tmp_path / "summary.md"
    earlier = "x" * (STEP_SUMMARY_LIMIT - 20_000) + "\n"
    summary.write_text(earlier)
    passing = tuple(checks_for("fp16", GOOD)) * 400
    breach = GateCheck("int8", BACKEND, "overall", "accuracy", 0.95, 0.90, 0.05, 0.01, 200, "breach")
    report = GateReport("accuracy", (*passing, breach), gated=(f"int8@{BACKEND}", f"fp16@{BACKEND}"))
    assert len(markdown_summary(report).encode()) > 20_000
    append_step_summary(summary, report)
    text = summary.read_text()
    assert text.startswith(earlier) and len(text.encode()) <= STEP_SUMMARY_LIMIT
    section = text[len(earlier):]
    assert section.startswith("### qbench gate: FAIL\n")
    assert "| int8@onnxruntime-cpu | overall | accuracy | 0.9500 | 0.9000 | 0.0500 | 0.0100 | **BREACH** |" in section
    assert "more checks left out (the step summary's size is limited)" in section


def test_a_full_step_summary_is_left_as_it_was(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("x" * STEP_SUMMARY_LIMIT)
    with pytest.raises(QbenchError, match=r"summary.md: cannot append the gate summary: the file holds 1048576 bytes"):
        append_step_summary(summary, UNUSABLE)
    assert summary.read_text() == "x" * STEP_SUMMARY_LIMIT


def test_failure_reasons_name_each_breach_then_each_problem():
    """The INT8 search and the fallback note these against a failing candidate (one wording for both)."""
    breach = GateCheck("int8", BACKEND, "faint", "accuracy", 0.93, 0.90, 0.03, 0.02, 200, "breach")
    report = GateReport("accuracy", (breach,), problems=("int8@onnxruntime-cpu: no accuracy measured",))
    assert failure_reasons(report) == ["faint drop 0.0300 > 0.02", "int8@onnxruntime-cpu: no accuracy measured"]


def test_failure_reasons_and_the_searchs_worst_slice_read_another_checks_figure_as_no_drop_of_the_metric():
    """A lost dimension on a slice (spread_kept: 45 % kept, a 'drop' of 0.55 against 0.5) was written as 'topic=law
    drop 0.5503 > 0.5' and ranked the search's worst slice at a cosine drop of 0.55, when the slice's cosine dropped
    0.008: the metric's own drops rank slices, and each other check says what it found."""
    from qbench.search.screen import worst_slice

    cosine = GateCheck("int8", BACKEND, "topic=law", "cosine", 1.0, 0.992, 0.008, 0.01, 30, "pass")
    other = GateCheck("int8", BACKEND, "topic=art", "cosine", 1.0, 0.995, 0.005, 0.01, 30, "pass")
    lost = GateCheck("int8", BACKEND, "topic=law", "spread_kept", 0.05, 0.0225, 0.55, 0.5, 30, "breach", "dimension 12")
    report = GateReport("cosine", (cosine, other, lost))
    assert failure_reasons(report) == ["topic=law spread_kept: dimension 12 45% kept < 50%"]
    assert worst_slice(report) == ("topic=law", 0.008)


def test_junit_stays_well_formed_whatever_characters_the_names_and_messages_hold():
    """A control character (a named slice's, or an error message's from a model or metric) was written into the XML
    as it was, and no JUnit reader could open the file."""
    check = GateCheck("int8", BACKEND, "ctl\x01x <&> \"q\" é", "accuracy", 0.9, 0.8, 0.1, 0.02, 200, "breach")
    report = GateReport("accuracy", (check,), ("int8@onnxruntime-cpu: variant failed: bad byte \x00\x1b[31m",),
                        gated=(f"int8@{BACKEND}",))  # fmt: skip
    root = junit(report)
    names = [case.get("name") for case in root.iter("testcase")]
    assert names == ["ctl\\x01x <&> \"q\" é: accuracy", "results: usable"]
    assert root.find(".//error").get("message") == "int8@onnxruntime-cpu: variant failed: bad byte \\x00\\x1b[31m"


MARKDOWN_NAMES = ["band=a\\|b", "band=<b>x</b>", "band=<script>", "[click](https://example.com)", "a&amp;b", "x|y",
                  "São Paulo 🙂 50% x:y", "a\\b", "overall"]  # fmt: skip


@pytest.mark.parametrize("scope", MARKDOWN_NAMES)
def test_the_step_summary_shows_each_slice_name_as_written(scope):
    """Rendered as GitHub renders the job summary (CommonMark with GFM tables, raw HTML allowed), the scope cell is
    the slice's name: `<b>x</b>` rendered bold and `<script>` vanished, a link became a link, `&amp;` read as `&`, and
    the backslash of `a\\|b` was taken as the pipe's escape."""
    markdown_it = pytest.importorskip("markdown_it")
    check = GateCheck("int8", BACKEND, scope, "accuracy", 0.9, 0.8, 0.1, 0.02, 200, "breach")
    summary = markdown_summary(GateReport("accuracy", (check,), (), gated=(f"int8@{BACKEND}",)))
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(summary)
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in re.findall(r"<tr>(.*?)</tr>", rendered, re.S)]
    assert rows[1][:3] == [f"int8@{BACKEND}", html.escape(scope, quote=False), "accuracy"]
    assert len(rows[1]) == 8


def test_an_ending_of_the_command_is_no_problem_with_the_results():
    """A report file that could not be written after a pass read `gate: FAIL (error after the verdict) — 1 problem
    with the results; 15 checks`, though the results were judged and it is not they that failed; a signal before any
    result was read, `gate: FAIL (interrupted) — 1 problem with the results; nothing judged`."""
    after = "gate.xml: cannot write the gate report: /tmp/x is a file, not a folder"
    errored = GateReport("accuracy", PASSING.checks, (after,), gated=PASSING.gated, failed_after_verdict=after)
    assert summary_line(errored) == "gate: FAIL (error after the verdict) — 5 variants × 3 scopes, 15 checks"
    breached = GateReport("accuracy", BREACHING.checks, (after,), gated=BREACHING.gated, failed_after_verdict=after)
    assert summary_line(breached) == summary_line(BREACHING).replace("FAIL", "FAIL (error after the verdict)", 1)
    signal = "interrupted: SIGTERM"
    interrupted = GateReport("accuracy", (), (signal,), gated=PASSING.gated, interrupted=signal)
    assert summary_line(interrupted) == "gate: FAIL (interrupted) — nothing judged"
    # a problem with the results beside the ending is still counted as one
    both = GateReport("accuracy", (), ("results were modified after the sweep (digest)", signal), interrupted=signal)
    assert summary_line(both) == "gate: FAIL (interrupted) — 1 problem with the results; nothing judged"
