"""A gate verdict as JUnit XML: what CI systems (GitLab, Jenkins, GitHub test reporters) show as a test run.

A testsuite per variant@backend, a testcase per check, each problem an error testcase, notes as the suite's
system-out; the words are qbench.gate.report's, so the console and the XML say the same.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping

from qbench.gate.evaluate import GateReport
from qbench.gate.report import check_key, check_line, problem_kind, problem_line, problem_owner, skip_reason
from qbench.report.grid import compared

RESULTS_SUITE = "results"  # JUnit suite for problems that belong to no single variant


def _testcase(suite: ET.Element, classname: str, name: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", {"classname": classname, "name": name, "time": "0"})


def _set_counts(element: ET.Element, counts: Mapping[str, int]) -> None:
    for key in ("tests", "failures", "errors", "skipped"):
        element.set(key, str(counts[key]))


def _suite_counts(suite: ET.Element) -> dict[str, int]:
    cases = suite.findall("testcase")
    return {
        "tests": len(cases),
        "failures": sum(c.find("failure") is not None for c in cases),
        "errors": sum(c.find("error") is not None for c in cases),
        "skipped": sum(c.find("skipped") is not None for c in cases),
    }


def junit_xml(report: GateReport, name: str = "qbench gate") -> str:
    """JUnit XML: a testsuite per variant@backend, a testcase `<scope>: <metric>` per check (a breach is a
    <failure> carrying the numbers), each problem an <error> testcase, notes as the suite's <system-out>;
    counts on every suite and the root."""
    root = ET.Element("testsuites", {"name": name})
    suites: dict[str, ET.Element] = {}

    def suite_of(key: str) -> ET.Element:
        if key not in suites:
            suites[key] = ET.SubElement(root, "testsuite", {"name": key})
        return suites[key]

    for key in report.gated:
        suite_of(key)
    for check in report.checks:
        case = _testcase(suite_of(check_key(check)), check_key(check), f"{check.scope}: {check.metric}")
        if check.status == "breach":
            message = "drop {} > tolerance {}".format(*compared(check.drop, check.tolerance))
            failure = ET.SubElement(case, "failure", {"type": "breach", "message": message})
            failure.text = check_line(check)
        elif check.status == "skipped":
            ET.SubElement(case, "skipped", {"message": f"{check.size} rows, {skip_reason(check)}"})
    for problem in report.problems:
        owner = problem_owner(report, problem)
        case = _testcase(suite_of(owner or RESULTS_SUITE), owner or RESULTS_SUITE, "results: usable")
        kind = problem_kind(report, problem)
        error = ET.SubElement(case, "error", {"type": kind, "message": problem})
        error.text = problem_line(problem)
    notes: dict[str, list[str]] = {}
    for note in report.notes:  # what a check cannot say, e.g. a variant that computes in FP32
        notes.setdefault(problem_owner(report, note) or RESULTS_SUITE, []).append(f"note: {note}")
    for key, lines in notes.items():
        ET.SubElement(suite_of(key), "system-out").text = "\n".join(lines)
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites.values():
        counts = _suite_counts(suite)
        _set_counts(suite, counts)
        totals = {k: totals[k] + counts[k] for k in totals}
    _set_counts(root, totals)
    ET.indent(root)
    return _XML_UNREPRESENTABLE.sub(_escaped, ET.tostring(root, encoding="unicode", xml_declaration=True)) + "\n"


# Characters XML 1.0 cannot hold, escaped or not: ElementTree writes them as they are, and a file holding one is
# unreadable to every JUnit consumer (a control character in an error message from the model or a metric, say).
_XML_UNREPRESENTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _escaped(match: re.Match[str]) -> str:
    return repr(match.group())[1:-1]  # \x01, \ud800: the character's Python escape, as slice names write it
