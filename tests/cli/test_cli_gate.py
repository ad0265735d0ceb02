"""`qbench gate` options: default and --verbose output, --junit, --json, GITHUB_STEP_SUMMARY, unwritable
paths, and unbroken long paths in a CI log. One real sweep of a user's project is judged by recipes that
differ only in their gate section (the gate is not a result section, so the results stay fresh)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from sweep_factory import make_sweep
from user_model import make_user_project

from qbench.cli.app import main
from qbench.gate.run import latest_results
from qbench.recipe.spec import load_recipe
from qbench.results.schema import content_digest, read_results, to_json

BACKEND = "onnxruntime-cpu"
STRICT = {"metric": "max_abs_error", "max_drop": 0.0, "max_slice_drop": 0.0, "applies_to": ["int8-*"]}
LENIENT = {"metric": "agreement", "max_drop": 0.9, "max_slice_drop": 0.9, "applies_to": ["*"]}


@dataclass(frozen=True)
class Project:
    root: Path
    sweep_output: str  # what `qbench sweep --gate` printed on stdout
    sweep_reports: Path  # the folder holding its --junit gate.xml, --json gate.json and GITHUB_STEP_SUMMARY summary.md

    def recipe(self, gate: dict) -> Path:
        """The swept recipe with another gate section (same name, so it judges the same results)."""
        raw = yaml.safe_load((self.root / "qbench.yaml").read_text())
        raw["gate"] = gate
        path = self.root / f"gate-{gate['metric']}-{gate['max_drop']}.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return path


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """The user project (FP32, FP16, INT8 on ONNX Runtime CPU, 3 band slices) swept once with the strict gate."""
    root = tmp_path_factory.mktemp("cli_gate")
    recipe = make_user_project(root)
    raw = yaml.safe_load(recipe.read_text())
    raw["variants"] = [{"name": "fp16", "precision": "fp16"},
                       {"name": "int8-minmax", "precision": "int8", "calibrator": "minmax"}]  # fmt: skip
    raw["latency"] = {"batch_sizes": [1], "warmup": 1, "iterations": 3, "threads": 1, "stability": None}
    raw["gate"] = STRICT
    del raw["tracking"]
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    stdout = io.StringIO()
    reports = root / "sweep-gate"
    files = ["--junit", str(reports / "gate.xml"), "--json", str(reports / "gate.json")]
    with contextlib.redirect_stdout(stdout), pytest.MonkeyPatch.context() as patch:
        patch.setenv("GITHUB_STEP_SUMMARY", str(root / "summary.md"))
        code = main(["sweep", str(recipe), "--no-track", "--gate", *files])
    if code != 1:
        pytest.fail(f"the strict gate (max_abs_error may not grow at all) should breach, got exit {code}")
    (root / "summary.md").rename(reports / "summary.md")
    return Project(root, stdout.getvalue(), reports)


def strict_breach_scopes(project: Project) -> list[str]:
    """Scopes where INT8's largest output error exceeds FP32's (zero): every one the strict gate must name."""
    results = read_results(latest_results(load_recipe(project.root / "qbench.yaml")))
    int8 = results.find("int8-minmax", BACKEND).accuracy
    return [s.name for s in (int8.overall, *int8.slices) if s.metrics["max_abs_error"] > 0]


def expected_strict_summary(project: Project) -> str:
    scopes = strict_breach_scopes(project)
    return f"gate: FAIL — 1 of 1 variant breaches: int8-minmax@{BACKEND} ({', '.join(scopes)}); 4 checks"


def _without_timing_notes(out: str) -> list[str]:
    """The gate's output lines less a note that a variant ran slower than FP32: that depends on this machine's
    timings of the tiny MLP (INT8 is slower than FP32 there on some CPUs, not on others)."""
    return [line for line in out.strip().splitlines() if not (line.startswith("gate note: ") and "runs slower" in line)]


def test_default_output_is_the_breaches_then_one_summary_line(project, capsys):
    assert main(["gate", str(project.recipe(STRICT))]) == 1
    lines = _without_timing_notes(capsys.readouterr().out)
    scopes = strict_breach_scopes(project)
    assert lines[-1] == expected_strict_summary(project)
    notes = [line for line in lines[1:-1] if line.startswith("gate note: ")]
    assert notes == [f"gate note: not judged by this gate (gate.applies_to: int8-*): fp16@{BACKEND} (fp16)"]
    breaches = [line for line in lines[1:-1] if line not in notes]
    assert len(breaches) == len(scopes) == 4
    assert all(line.startswith(f"BREACH int8-minmax@{BACKEND} ") and "> tolerance 0.0000" in line for line in breaches)
    assert lines[0].startswith("gate on tumour-mlp (")


def test_sweep_gate_prints_the_same_summary_line(project):
    assert project.sweep_output.strip().splitlines()[-1] == expected_strict_summary(project)


def test_sweep_gate_writes_the_same_reports_as_gate(project, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit, report = tmp_path / "gate.xml", tmp_path / "gate.json"
    assert main(["gate", str(project.root / "qbench.yaml"), "--junit", str(junit), "--json", str(report)]) == 1
    assert (project.sweep_reports / "gate.xml").read_text() == junit.read_text()
    assert (project.sweep_reports / "gate.json").read_text() == report.read_text()
    assert (project.sweep_reports / "summary.md").read_text() == summary.read_text()
    assert ET.parse(junit).getroot().get("failures") == "4"


def test_sweep_gate_verbose_prints_every_check(project, tmp_path, capsys):
    # fp16 outside applies_to gives a note on any machine (a "runs slower" note depends on this one's timings)
    recipe = project.recipe({**LENIENT, "applies_to": ["int8-*"]})
    raw = yaml.safe_load(recipe.read_text())
    raw["output_dir"] = str(tmp_path / "reports")  # the module's sweep stays the recipe's latest run
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["sweep", str(recipe), "--no-track", "--gate", "--verbose"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    notes = [line.split("note: ", 1)[1] for line in (captured.out + captured.err).splitlines() if "note: " in line]
    assert f"not judged by this gate (gate.applies_to: int8-*): fp16@{BACKEND} (fp16)" in notes
    assert len(notes) == len(set(notes)), "each gate note once: the verdict's, not the summary's too"
    rows = [line.split() for line in lines if line.split()[:1] == ["int8-minmax"]]
    assert len(rows) == 4 and all(row[1] == BACKEND and row[-1] == "PASS" for row in rows)
    assert lines[-1] == "gate: PASS — 1 variant × 4 scopes, 4 checks"


@pytest.mark.parametrize("flag", [["--verbose"], ["--junit", "gate.xml"], ["--register", "m"]])
def test_gate_options_without_gate_are_refused_before_the_sweep(project, flag, capsys):
    assert main(["sweep", str(project.root / "qbench.yaml"), "--no-track", *flag]) == 2
    assert "apply with --gate" in capsys.readouterr().err


def test_pass_prints_only_the_summary_and_verbose_prints_every_check(project, capsys):
    recipe = project.recipe(LENIENT)
    assert main(["gate", str(recipe)]) == 0
    lines = _without_timing_notes(capsys.readouterr().out)
    assert lines[2:] == ["gate: PASS — 2 variants × 4 scopes, 8 checks"]
    assert "changed since the sweep" in lines[1]  # swept under STRICT (its own test below)
    assert main(["gate", str(recipe), "--verbose"]) == 0
    shown = capsys.readouterr().out
    rows = [line.split() for line in shown.splitlines()
            if line.split()[:2] in (["fp16", BACKEND], ["int8-minmax", BACKEND])]
    assert len(rows) == 8 and all(row[-1] == "PASS" for row in rows)
    assert shown.strip().splitlines()[-1] == "gate: PASS — 2 variants × 4 scopes, 8 checks"


def test_junit_and_json_are_written_on_a_breach_with_matching_counts(project, tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    junit, report = tmp_path / "ci" / "gate.xml", tmp_path / "ci" / "gate.json"
    assert main(["gate", str(project.recipe(STRICT)), "--junit", str(junit), "--json", str(report)]) == 1
    root = ET.parse(junit).getroot()
    assert [root.get(k) for k in ("tests", "failures", "errors", "skipped")] == ["4", "4", "0", "0"]
    [suite] = [s for s in root.findall("testsuite") if s.get("name") != "results"]  # "results": the gate's notes
    assert suite.get("name") == f"int8-minmax@{BACKEND}"
    assert [c.get("name") for c in suite.findall("testcase")] == [f"{s}: max_abs_error"
                                                                  for s in strict_breach_scopes(project)]
    loaded = json.loads(report.read_text())
    assert (loaded["verdict"], loaded["exit_code"], loaded["summary"]) == ("breach", 1,
                                                                           expected_strict_summary(project))
    assert loaded["counts"] == {"checks": 4, "breaches": 4, "skipped": 0, "problems": 0}


def test_files_are_written_when_the_results_are_unusable(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(to_json(make_sweep()))  # no embedded recipe: cannot be judged
    junit, report = tmp_path / "gate.xml", tmp_path / "gate.json"
    assert main(["gate", "--results", str(results), "--junit", str(junit), "--json", str(report)]) == 2
    root = ET.parse(junit).getroot()
    assert [root.get(k) for k in ("tests", "failures", "errors")] == ["1", "0", "1"]
    assert root.find("testsuite").get("name") == "results"
    loaded = json.loads(report.read_text())
    assert (loaded["verdict"], loaded["exit_code"], loaded["checks"]) == ("unusable", 2, [])
    assert "recipe.resolved" in loaded["problems"][0]["message"]


def test_files_are_written_when_there_are_no_results_to_read(tmp_path, monkeypatch):
    """A run that never wrote results (or an incomplete one): CI uploads gate.xml 'if: always()', so it says why."""
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    junit, report = tmp_path / "gate.xml", tmp_path / "gate.json"
    missing = tmp_path / "nowhere" / "results.json"
    assert main(["gate", "--results", str(missing), "--junit", str(junit), "--json", str(report)]) == 2
    root = ET.parse(junit).getroot()
    assert [root.get(k) for k in ("tests", "failures", "errors")] == ["1", "0", "1"]
    loaded = json.loads(report.read_text())
    assert (loaded["verdict"], loaded["exit_code"]) == ("unusable", 2)
    assert loaded["problems"][0]["message"] == f"{missing}: results file not found"
    assert "results file not found" in (tmp_path / "summary.md").read_text()


def test_a_report_path_naming_a_file_the_gate_reads_is_refused_and_the_file_kept(project, tmp_path, capsys):
    recipe = project.recipe(LENIENT)
    results = latest_results(load_recipe(recipe))
    before = (recipe.read_bytes(), results.read_bytes())
    assert main(["gate", str(recipe), "--json", str(results)]) == 2
    assert main(["gate", str(recipe), "--junit", str(recipe)]) == 2
    assert main(["sweep", str(recipe), "--gate", "--junit", str(recipe)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{results}: the file exists and is not a qbench gate report" in err  # refused before it is judged
    assert f"--junit {recipe}: that is a file the gate reads" in err
    assert (recipe.read_bytes(), results.read_bytes()) == before


def test_github_step_summary_is_appended(project, tmp_path, monkeypatch):
    summary = tmp_path / "step_summary.md"
    summary.write_text("## an earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert main(["gate", str(project.recipe(STRICT))]) == 1
    text = summary.read_text()
    assert text.startswith("## an earlier step\n### qbench gate: FAIL\n")
    assert expected_strict_summary(project) in text
    assert sum(line.endswith("| **BREACH** |") for line in text.splitlines()) == 4


@pytest.mark.parametrize(("gate", "code"), [(LENIENT, 0), (STRICT, 1)], ids=["pass", "breach"])
def test_a_step_summary_that_cannot_be_appended_is_a_warning_and_the_verdict_stands(project, tmp_path, monkeypatch,
                                                                                     capsys, gate, code):  # fmt: skip
    """GITHUB_STEP_SUMMARY naming a folder (or a full disk) made a pass or a breach exit 2: the summary is a courtesy
    display, the exit code is the verdict's; the requested report still holds it."""
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path))
    report = tmp_path / "gate.json"
    assert main(["gate", str(project.recipe(gate)), "--json", str(report)]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"warning: GITHUB_STEP_SUMMARY {tmp_path}: cannot append the gate summary: ")
    assert json.loads(report.read_text())["exit_code"] == code


def test_a_report_file_that_cannot_be_written_leaves_the_others_saying_so(project, tmp_path, monkeypatch, capsys):
    """The others held the breach (exit_code 1) while qbench exited 2: they now carry exit code 2 and why, beside
    the verdict's checks."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    summary, report = tmp_path / "summary.md", tmp_path / "gate.json"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert main(["gate", str(project.recipe(STRICT)), "--junit", str(blocker / "gate.xml"), "--json", str(report)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    [line] = [line for line in err if "error" in line]
    assert line.startswith(f"error: {blocker / 'gate.xml'}: cannot write the gate report: ")
    assert [line for line in err if line.startswith("gate report: ")] == [  # not the same line twice
        f"gate report: {report}", f"gate report: {report} (written again: exit code 2, as another report could not be "
                                  "written)"]  # fmt: skip
    loaded = json.loads(report.read_text())
    assert (loaded["exit_code"], loaded["verdict"], loaded["counts"]["breaches"]) == (2, "error", 4)
    assert [p["message"] for p in loaded["problems"]] == [line.removeprefix("error: ")]
    assert summary.read_text().startswith("### qbench gate: FAIL (error after the verdict)\n")


@pytest.mark.parametrize("command", ["gate", "sweep"])
def test_a_report_on_stdout_is_all_that_stdout_holds(project, capsys, command):
    """`qbench gate r.yaml --json - | jq` wrote a file named '-'; `--json /dev/stdout` mixed the report with the
    console lines, no JSON for the reader: the human output goes to stderr while a report takes stdout."""
    args = [command, str(project.recipe(STRICT))] + (["--no-track", "--gate"] if command == "sweep" else [])
    assert main([*args, "--json", "-", "--verbose"]) == 1
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert (report["verdict"], report["exit_code"]) == ("breach", 1)
    assert expected_strict_summary(project) in err
    assert not Path("-").exists()


def test_a_report_on_stdout_is_valid_when_the_results_are_unusable(tmp_path, capsys):
    assert main(["gate", "--results", str(tmp_path / "none.json"), "--junit", "-"]) == 2
    out, err = capsys.readouterr()
    assert ET.fromstring(out).get("errors") == "1"
    assert err.strip() == f"error: {tmp_path / 'none.json'}: results file not found"


def test_a_report_on_a_name_of_stdout_is_written_there_alone(project, tmp_path, capsys):
    for target in ("/dev/stdout", "-"):  # real processes: what reaches file descriptor 1, not only sys.stdout
        done = subprocess.run([sys.executable, "-m", "qbench.cli", "gate", str(project.recipe(STRICT)), "--json",
                               target],
                              capture_output=True, text=True, timeout=120, check=False,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})  # fmt: skip
        assert (done.returncode, json.loads(done.stdout)["verdict"]) == (1, "breach")
    # two reports naming stdout are refused before anything is judged (in process: no third interpreter start-up)
    assert main(["gate", str(project.recipe(STRICT)), "--json", "-", "--junit", "/dev/stdout"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip() == "error: --junit /dev/stdout and --json - both name stdout; expected at most one report there"


def test_an_unwritable_report_path_exits_2_with_one_line(project, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["gate", str(project.recipe(LENIENT)), "--junit", str(blocker / "gate.xml")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {blocker / 'gate.xml'}: cannot write the gate report")


def test_long_paths_stay_on_one_line_in_a_non_terminal(tmp_path):
    deep = tmp_path.joinpath(*[f"folder-{i:02d}-with-a-long-name" for i in range(8)])
    results = deep / "results.json"
    deep.mkdir(parents=True)
    results.write_text(to_json(make_sweep()))
    report = deep / "gate.json"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "GITHUB_STEP_SUMMARY")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-m", "qbench.cli", "gate", "--results", str(results), "--json",
                           str(report)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2
    assert len(str(report)) > 200
    assert f"gate report: {report}" in done.stderr.splitlines()
    assert any(line.startswith("UNUSABLE ") and str(results) in line for line in done.stdout.splitlines())


def test_results_written_before_evidence_was_recorded_are_one_unusable_line(project, tmp_path, capsys):
    """The sweep's results.json as a qbench from before `evidence`, spreads and kept records wrote it (CI re-gating
    an older artifact): the lenient gate passed it (exit 0) on checks it could not apply; now exit 2, one line."""
    recipe = project.recipe(LENIENT)
    raw = json.loads(latest_results(load_recipe(recipe)).read_text())
    raw.pop("evidence", None)  # older results have none to remove
    for variant in raw["variants"]:
        for scope in (variant["accuracy"]["overall"], *variant["accuracy"]["slices"]):
            del scope["spread"], scope["kept"]
    raw["digest"] = content_digest(raw)
    old = tmp_path / "results.json"
    old.write_text(json.dumps(raw))
    capsys.readouterr()
    assert main(["gate", str(recipe), "--results", str(old)]) == 2
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith("gate on tumour-mlp (")
    assert lines[1] == (f"UNUSABLE results written by qbench {raw['qbench_version']!r} record no output_spread, "
                        "spread_of_values_read, kept, stored_weights, random_ops, model_sha256 (this qbench's sweep "
                        "records them), so these checks cannot be applied: output_spread (collapsed outputs); "
                        "output_spread of per-token scores and answer spans; decisions_kept, tail_kept, spread_kept "
                        "(lost classes, tails, dimensions); the note on a reference stored rounded; results of a "
                        "deterministic reference; the measured model file is "
                        "the one measured; re-run `qbench sweep` (fail closed)")
    assert main(["gate", str(recipe)]) == 0  # the same sweep's own results: judged as before, a pass


def test_results_alone_judged_by_their_embedded_recipe_say_when_its_file_now_asks_otherwise(project, capsys):
    """`qbench gate --results FILE` judges by the recipe the results embed. Before, a recipe file edited since the
    sweep (here its gate loosened; as well tightened, where the embedded one passes: exit 0) went unsaid, though
    `qbench gate <that file>` gives another verdict."""
    results = latest_results(load_recipe(project.root / "qbench.yaml"))
    recipe = Path(json.loads(results.read_text())["recipe"]["path"])  # swept from (an earlier test may sweep a copy)
    assert main(["gate", "--results", str(results)]) == 1
    assert "recipe file" not in capsys.readouterr().out  # unchanged: nothing to say
    swept = recipe.read_text()
    try:
        recipe.write_text(yaml.safe_dump({**yaml.safe_load(swept), "gate": LENIENT}, sort_keys=False))
        assert main(["gate", "--results", str(results)]) == 1  # still the embedded (strict) gate's verdict
        said = (f"gate note: judged by the recipe these results embed, but the recipe file {recipe} they were swept "
                "from now differs in section(s) 'gate': `qbench gate "
                f"{recipe} --results {results}` judges by the file's")
        assert said in capsys.readouterr().out.splitlines()
        assert main(["gate", str(recipe), "--results", str(results)]) == 0
        assert "recipe file" not in capsys.readouterr().out
    finally:
        recipe.write_text(swept)


def test_a_gate_changed_since_the_sweep_is_applied_and_a_breach_it_lets_through_is_named(project, capsys):
    """`qbench gate <recipe>` judges by the recipe's gate, not the one the results were swept with: a tightened one
    is applied, and a loosened one passes. Before, the loosened gate turned the sweep's exit 1 into exit 0 and said
    nothing of it: a CI step passes where the sweep blocked."""
    assert main(["gate", str(project.recipe(LENIENT))]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "changed since the sweep" in line]
    assert notes == ["gate note: judged by the recipe's gate.metric "
                     "'max_abs_error' -> 'agreement', gate.max_drop 0.0 -> "
                     "0.9, gate.max_slice_drop 0.0 -> 0.9, gate.applies_to ['int8-*'] -> ['*'], changed since the "
                     "sweep: the gate the results were swept with blocks "
                     f"int8-minmax@{BACKEND}, which this one passes or does not judge"]
    unjudged = {**STRICT, "applies_to": ["fp16"]}  # the breaching variant taken out of the gate: fp16 breaches alone
    assert main(["gate", str(project.recipe(unjudged))]) == 1
    said = ("gate note: judged by the recipe's gate.applies_to "
            "['int8-*'] -> ['fp16'], changed since the sweep: the gate the results were swept with blocks "
            f"int8-minmax@{BACKEND}, which this one passes or does not judge")
    assert said in capsys.readouterr().out.splitlines()
    widened = {**STRICT, "applies_to": ["*"]}  # a stricter gate is applied: fp16 is judged too, and breaches
    assert main(["gate", str(project.recipe(widened))]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "gate note: judged by the recipe's gate.applies_to ['int8-*'] -> ['*'], changed since the sweep" in lines
    assert any(line.startswith(f"BREACH fp16@{BACKEND} overall") for line in lines)
    assert main(["gate", str(project.recipe(STRICT))]) == 1  # the sweep's own gate: nothing changed, nothing said
    assert "changed since the sweep" not in capsys.readouterr().out
