"""The documentation's CI example runs as written: both snippets (GitHub Actions, GitLab CI) are read from the
documentation (README.md and docs/, `docs_text`) between their markers, must run the same qbench commands, and those
commands are run through `qbench.cli.main` on a small project; the JUnit file's counts and the job summary are then
checked. A snippet written on several pages (the front page's GitHub Actions job and docs/ci.md's) is the same on
each."""

from __future__ import annotations

import json
import re
import shlex
import xml.etree.ElementTree as ET
from typing import Any

import pytest
import yaml
from docs_text import documentation_files, located
from user_model import make_user_project

from qbench.cli.app import main


def snippet_copies(name: str) -> dict[str, str]:
    """Each YAML code block between `<!-- ci-example:NAME -->` and `<!-- /ci-example:NAME -->`, by where it is."""
    pattern = re.compile(rf"<!-- ci-example:{name} -->\s*```yaml\n(.*?)```\s*<!-- /ci-example:{name} -->", re.DOTALL)
    copies = {}
    for page in documentation_files():
        text = page.read_text()
        copies.update({located(page, text, found.start()): found.group(1) for found in pattern.finditer(text)})
    return copies


def snippet(name: str) -> dict[str, Any]:
    """The snippet NAME, which every page that writes it writes alike."""
    copies = snippet_copies(name)
    if not copies:
        pytest.fail(f"the documentation has no ci-example:{name} YAML block between its markers")
    if len(set(copies.values())) > 1:
        pytest.fail(f"the ci-example:{name} blocks differ: {sorted(copies)}")
    return yaml.safe_load(next(iter(copies.values())))


def test_the_front_page_and_the_ci_page_write_the_github_job():
    assert {where.split(":")[0] for where in snippet_copies("github")} == {"README.md", "docs/ci.md"}


def qbench_commands(shell_lines: list[str]) -> list[list[str]]:
    """The qbench commands among shell lines (each line may chain commands with &&), as argument lists."""
    commands = []
    for line in shell_lines:
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if words[:1] == ["qbench"]:
                commands.append(words[1:])
    return commands


def github_steps() -> list[dict[str, Any]]:
    [job] = snippet("github")["jobs"].values()
    return job["steps"]


def gitlab_job() -> dict[str, Any]:
    [job] = snippet("gitlab").values()
    return job


def test_both_snippets_run_the_same_commands_and_publish_the_junit_file():
    github = qbench_commands([step["run"] for step in github_steps() if "run" in step])
    gitlab = qbench_commands(gitlab_job()["script"])
    assert github == gitlab
    assert [c[0] for c in github] == ["sweep", "gate"]
    junit = github[1][github[1].index("--junit") + 1]
    assert gitlab_job()["artifacts"]["reports"]["junit"] == junit
    assert gitlab_job()["artifacts"]["when"] == "always"
    reporter = next(s for s in github_steps() if s.get("uses", "").startswith("mikepenz/action-junit-report"))
    assert reporter["with"]["report_paths"] == junit and reporter["if"] == "always()"


@pytest.mark.slow
def test_the_readme_commands_gate_a_project_and_write_the_ci_reports(tmp_path, monkeypatch):
    recipe = make_user_project(tmp_path)
    raw = yaml.safe_load(recipe.read_text())
    raw["latency"] = {"batch_sizes": [1], "warmup": 1, "iterations": 3, "threads": 1, "stability": None}
    commands = qbench_commands(gitlab_job()["script"])
    recipe_name = commands[0][1]
    (tmp_path / recipe_name).write_text(yaml.safe_dump(raw, sort_keys=False))
    recipe.unlink()
    monkeypatch.chdir(tmp_path)
    summary = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))

    sweep, gate = commands
    assert main(sweep) == 0
    gate_code = main(gate)
    junit_path = tmp_path / gate[gate.index("--junit") + 1]
    report = json.loads((tmp_path / gate[gate.index("--json") + 1]).read_text())

    # the recipe gates int8-minmax and int8-pct, overall and on 3 bands: 8 checks, all judged
    assert report["problems"] == [] and gate_code == report["exit_code"] in (0, 1)
    root = ET.parse(junit_path).getroot()
    counts = {k: int(root.get(k)) for k in ("tests", "failures", "errors", "skipped")}
    breaches = [c for c in report["checks"] if c["status"] == "breach"]
    assert counts == {"tests": 8, "failures": len(breaches), "errors": 0, "skipped": 0}
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert sorted(suites) == ["int8-minmax@onnxruntime-cpu", "int8-pct@onnxruntime-cpu", "results"]
    # the gate's notes on the results as a whole: the recipe's fp16 variant ran, and no applies_to glob picks it
    assert "not judged by this gate" in suites["results"].find("system-out").text and not suites["results"].findall("testcase")
    failed = {f"{c.get('classname')} {c.get('name')}" for c in root.iter("testcase") if c.find("failure") is not None}
    assert failed == {f"{c['variant']}@{c['backend']} {c['scope']}: {c['metric']}" for c in breaches}

    text = summary.read_text()
    assert text.startswith(f"### qbench gate: {'PASS' if gate_code == 0 else 'FAIL'}\n")
    assert report["summary"] in text
    assert sum(line.startswith("| int8-") for line in text.splitlines()) == 8
    assert len(list((tmp_path / "reports").glob("*/*/results.json"))) == 1  # the sweep's folder CI uploads
