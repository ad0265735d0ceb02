"""Which path a gate report may be written to: a new one, an empty file or an earlier gate report, never another
file (the recipe, a model, another run's results). Standard library alone: `qbench gate` and `qbench sweep --gate`
check their --json/--junit paths before anything else, and so before the imports that take seconds on a loaded CI
runner, which a CI timeout's SIGTERM may interrupt (the report files then say so).
"""

from __future__ import annotations

import json
from pathlib import Path

from qbench.errors import QbenchError


def check_report_path(path: Path) -> None:
    """Refuse a report path holding a file that qbench.gate.report.write_report would not replace, or a folder, which
    no report can be written to (checked before a sweep, too: a folder was found only once the sweep had run)."""
    target = path.resolve()
    if target.is_dir():
        raise QbenchError(f"{path}: is a folder; expected the path of a report file (a new one, or an earlier "
                          "report)")  # fmt: skip
    if target.is_file() and not _replaceable(target):
        raise QbenchError(f"{path}: the file exists and is not a qbench gate report; expected a new path (or an "
                          "earlier report) for the report, so that nothing else is overwritten")  # fmt: skip


_REPORT_KEYS = frozenset({"schema_version", "verdict", "exit_code", "checks"})


def _replaceable(path: Path) -> bool:
    """An empty file, or a gate report qbench wrote (the JSON document, the JUnit XML)."""
    if path.stat().st_size == 0:
        return True
    if path.stat().st_size > 64 << 20:  # no gate report is this big
        return False
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        document = json.loads(text)
        return isinstance(document, dict) and _REPORT_KEYS <= document.keys()
    except ValueError:
        pass
    import xml.etree.ElementTree as ET  # only here: a sweep never reads XML

    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return False
    return root.tag == "testsuites" and root.get("name", "").startswith("qbench")
