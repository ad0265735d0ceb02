"""What CI finds in `--junit`, `--json` and GITHUB_STEP_SUMMARY on every way `qbench gate` and `qbench sweep --gate`
can end: a pass, a breach, results missing, edited or partial, an unexpected exception, SIGTERM or SIGINT (a CI
timeout, a cancelled job) anywhere in the command, before or after the verdict, and a disk that cannot take the
reports. Each command runs as a real process (tests/signalled.py signals it right after one of qbench's functions)."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from signalled import run_raising, run_signalled, run_signalled_importing
from user_model import make_user_project

from qbench.cli.app import main
from qbench.gate.run import latest_results
from qbench.recipe.spec import load_recipe
from qbench.results.schema import content_digest

REPO = Path(__file__).resolve().parents[2]
STRICT = {"metric": "max_abs_error", "max_drop": 0.0, "max_slice_drop": 0.0, "applies_to": ["*"]}  # FP16 breaches
INTERRUPTED = "qbench was interrupted by {} before the gate command finished"


@dataclass(frozen=True)
class Project:
    root: Path
    lenient: Path  # passes
    strict: Path  # breaches
    edited: Path  # results.json edited after the sweep
    partial: Path  # results.json of a sweep that did not complete (its digest matching)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """The user's project with FP16 only, swept once untracked; recipes that pass and breach on the same results."""
    root = tmp_path_factory.mktemp("gate_endings")
    lenient = make_user_project(root)
    raw = yaml.safe_load(lenient.read_text())
    raw["variants"] = [{"name": "fp16", "precision": "fp16"}]
    raw["latency"] = {"batch_sizes": [1], "warmup": 1, "iterations": 3, "threads": 1, "stability": None}
    raw["gate"] = {"metric": "agreement", "max_drop": 1.0, "max_slice_drop": 1.0, "applies_to": ["*"]}
    del raw["tracking"]
    lenient.write_text(yaml.safe_dump(raw, sort_keys=False))
    if main(["sweep", str(lenient), "--no-track"]) != 0:
        pytest.fail("the FP16 sweep of the user's project failed")
    strict = root / "strict.yaml"
    strict.write_text(yaml.safe_dump({**raw, "gate": STRICT}, sort_keys=False))
    results = json.loads(latest_results(load_recipe(lenient)).read_text())
    edited, partial = root / "edited" / "results.json", root / "partial" / "results.json"
    for path, change in ((edited, {"created_at": "2020-01-01T00:00:00"}), (partial, {"complete": False})):
        path.parent.mkdir()
        changed = {**results, **change}
        if path == partial:
            changed["digest"] = content_digest(changed)
        path.write_text(json.dumps(changed))
    return Project(root, lenient, strict, edited, partial)


@dataclass(frozen=True)
class Ending:
    code: int
    stderr: str
    junit: ET.Element
    report: dict
    summary: str


def run_ending(project: Project, tmp_path: Path, *args: str, hook: str | None = None, action: str | None = None,
               limit_bytes: int | None = None) -> tuple[subprocess.CompletedProcess[str], Path]:  # fmt: skip
    """`qbench ARGS --junit gate.xml --json gate.json` with GITHUB_STEP_SUMMARY set, as a real process: signalled or
    raising right after `hook` returns, or with files limited to `limit_bytes` (a full disk)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400", "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    command = [*args, "--junit", str(tmp_path / "gate.xml"), "--json", str(tmp_path / "gate.json")]
    if hook is not None and action == "raise":
        return run_raising(hook, *command, env=env, cwd=project.root), tmp_path
    if hook is not None:
        return run_signalled(hook, signal.Signals[action], *command, env=env, cwd=project.root), tmp_path

    def full_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    done = subprocess.run([sys.executable, "-m", "qbench.cli", *command], capture_output=True, text=True, env=env,
                          cwd=project.root, timeout=120, check=False,
                          preexec_fn=full_disk if limit_bytes is not None else None)  # fmt: skip
    return done, tmp_path


def ended(done: subprocess.CompletedProcess[str], folder: Path) -> Ending:
    """What CI sees: the exit code, stderr and the three files, each parsed (a missing or broken one fails here)."""
    return Ending(done.returncode, done.stderr, ET.parse(folder / "gate.xml").getroot(),
                  json.loads((folder / "gate.json").read_text()), (folder / "summary.md").read_text())  # fmt: skip


def assert_no_verdict(ending: Ending, reason: str, *, checks: int, verdict: str = "unusable") -> None:
    """Exit 2 and all three saying why: a JUnit <error> of type `verdict` with the reason, the JSON's exit code 2,
    its `verdict` and the reason among its problems, the step summary's FAIL headline naming the verdict and the
    reason; the verdict's checks kept where it had one. A signal's ending is 'interrupted', an error after the verdict
    'error' (the results were judged), any other 'unusable'."""
    assert ending.code == 2, ending.stderr
    errors = [(e.get("type"), e.get("message")) for e in ending.junit.iter("error")]
    assert ending.junit.get("errors") == "1" and errors[0][0] == verdict and errors[0][1].startswith(reason), errors
    assert (ending.report["exit_code"], ending.report["verdict"]) == (2, verdict)
    assert ending.report["problems"][-1]["message"].startswith(reason)
    assert ending.report["counts"]["checks"] == checks
    headline = {"interrupted": "interrupted", "error": "error after the verdict"}.get(verdict, "results unusable")
    assert ending.summary.startswith(f"### qbench gate: FAIL ({headline})\n")
    said = "failed after the verdict" if verdict == "error" else "cannot judge (fail closed)"
    assert f"- **{said}:** {reason}" in ending.summary


def test_a_pass_and_a_breach_say_their_verdict(project, tmp_path):
    passed = ended(*run_ending(project, tmp_path / "pass", "gate", str(project.lenient)))
    assert (passed.code, passed.report["exit_code"], passed.junit.get("failures"), passed.junit.get("errors")) == (0, 0, "0", "0")
    assert passed.summary.startswith("### qbench gate: PASS\n")
    breach = ended(*run_ending(project, tmp_path / "breach", "gate", str(project.strict)))
    assert (breach.code, breach.report["exit_code"], breach.junit.get("failures"), breach.junit.get("errors")) == (1, 1, "4", "0")
    assert breach.summary.startswith("### qbench gate: FAIL\n")


def test_results_missing_edited_or_partial_say_why(project, tmp_path):
    cases = {
        "missing": (project.root / "nowhere.json", "results file not found"),
        "edited": (project.edited, "digest: does not match the file's content"),
        "partial": (project.partial, "complete: got False, expected true"),
    }
    for name, (results, why) in cases.items():
        ending = ended(*run_ending(project, tmp_path / name, "gate", "--results", str(results)))
        assert_no_verdict(ending, f"{results}: {why}", checks=0)
        assert ending.stderr.strip().splitlines()[-1] == f"error: {ending.report['problems'][0]['message']}"


@pytest.mark.parametrize(("hook", "action", "checks"), [
    ("qbench.recipe.spec:load_recipe", "SIGINT", 0),  # before any result is read
    ("qbench.gate.run:run_gate", "SIGTERM", 0),  # judged, not yet reported
    ("qbench.cli.gate:tag_tracked_runs", "SIGTERM", 4),  # after the verdict was printed: the files said pass, exit 2
    ("qbench.cli.gate:tag_tracked_runs", "raise", 4),
], ids=["sigint-loading", "sigterm-judged", "sigterm-after-verdict", "exception-after-verdict"])  # fmt: skip
def test_gate_ending_without_its_verdict_says_why(project, tmp_path, hook, action, checks):
    """A signal during `qbench gate` wrote no report at all (CI uploaded nothing: 'no test results'); one after the
    verdict, or an exception then, left files saying pass while qbench exited 2."""
    ending = ended(*run_ending(project, tmp_path, "gate", str(project.lenient), hook=hook, action=action))
    if action == "raise":  # the results were judged: the reports called the error 'unusable' results
        assert_no_verdict(ending, "RuntimeError: an unexpected error right after tag_tracked_runs", checks=checks,
                          verdict="error")  # fmt: skip
        assert ending.stderr.strip().splitlines()[-1].startswith("qbench: error: RuntimeError: ")
    else:
        assert_no_verdict(ending, INTERRUPTED.format(action), checks=checks, verdict="interrupted")
        assert ending.stderr.strip().splitlines()[-1] == "qbench: error: interrupted"


@pytest.mark.parametrize(("hook", "checks"),
                         [("qbench.recipe.spec:load_recipe", 0), ("qbench.cli.gate:report_gate", 4)],
                         ids=["before-the-sweep", "after-the-verdict"])  # fmt: skip
def test_sweep_gate_signalled_outside_the_sweep_says_why(project, tmp_path, hook, checks):
    """`sweep --gate` wrote reports for a signal inside run_sweep only: none for one while the recipe loads, and the
    breach (exit 1 in the files) for one after the verdict, while qbench exited 2."""
    ending = ended(*run_ending(project, tmp_path, "sweep", str(project.strict), "--no-track", "--gate",
                               hook=hook, action="SIGTERM"))  # fmt: skip
    assert_no_verdict(ending, INTERRUPTED.format("SIGTERM"), checks=checks, verdict="interrupted")
    assert ending.report["counts"]["breaches"] == checks  # the verdict's breaches are still shown, with the reason


@pytest.mark.parametrize("command", ["gate", "sweep"])
def test_a_signal_while_the_command_imports_its_libraries_is_reported(project, tmp_path, command):
    """The libraries a command imports (pandas, numpy, ONNX Runtime) take seconds on a loaded CI runner, and were
    imported before the report files were promised: a CI timeout's SIGTERM then (the first 3-5 s of a `sweep --gate`
    on a busy 2-core machine) wrote none, and a gate report an earlier run left said pass. A signal cutting an import
    short would also leave a module that cannot be imported again to write them: it waits for the imports."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400", "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    args = [command, str(project.lenient), *(["--no-track", "--gate"] if command == "sweep" else [])]
    done = run_signalled_importing("pandas", signal.SIGTERM, *args, "--junit", str(tmp_path / "gate.xml"), "--json",
                                   str(tmp_path / "gate.json"), env=env, cwd=project.root)  # fmt: skip
    assert_no_verdict(ended(done, tmp_path), INTERRUPTED.format("SIGTERM"), checks=0, verdict="interrupted")
    assert done.stderr.strip().splitlines()[-1] == "qbench: error: interrupted"


def test_a_disk_that_cannot_take_the_reports_is_one_line_and_no_file(project, tmp_path):
    """Files limited to a little more than gate.xml takes (about 1.4 kB) with the breach: it was written and gate.json
    (larger) was not, so the one report CI found said exit 1 while qbench exited 2. Now neither is there, nothing
    half-written (no temporary left), one error line naming both, and the step summary says it. The limit is read
    from the files a first gate writes in the same folder (their paths are in them: a fixed limit failed where the
    test folder's path was longer)."""
    free, folder = run_ending(project, tmp_path, "gate", str(project.strict))
    assert free.returncode == 1, free.stderr
    sizes = {name: (folder / name).stat().st_size for name in ("gate.xml", "gate.json", "summary.md")}
    assert sizes["gate.json"] > sizes["gate.xml"] + 64
    for name in sizes:
        (folder / name).unlink()
    done, folder = run_ending(project, tmp_path, "gate", str(project.strict), limit_bytes=sizes["gate.xml"] + 64)
    assert done.returncode == 2
    [line] = [line for line in done.stderr.splitlines() if "error" in line]
    assert line.startswith(f"error: {folder / 'gate.json'}: cannot write the gate report: File too large; "
                           f"{folder / 'gate.xml'}: cannot write the gate report: File too large")  # fmt: skip
    assert sorted(p.name for p in folder.iterdir()) == ["summary.md"]
    summary = (folder / "summary.md").read_text()
    assert summary.startswith("### qbench gate: FAIL (error after the verdict)\n")  # the results were judged
    assert f"- **failed after the verdict:** {folder / 'gate.json'}: cannot write the gate report" in summary


@pytest.mark.parametrize(("command", "hook"), [("gate", "qbench.gate.run:run_gate"),
                                               ("sweep", "qbench.sweep.runner:run_sweep")])  # fmt: skip
def test_a_process_killed_before_its_verdict_leaves_no_earlier_pass_in_the_reports(project, tmp_path, command, hook):
    """The out-of-memory killer's SIGKILL (or a native library's crash) ends the process with nothing written: the
    `qbench` command exits 2 (qbench.supervisor), but the report files an earlier run left there still said pass,
    exit code 0. The files now say the command did not finish from the moment its work starts."""
    args = [command, str(project.lenient), *(["--no-track", "--gate"] if command == "sweep" else [])]
    earlier, folder = run_ending(project, tmp_path, *args)
    assert earlier.returncode == 0 and json.loads((folder / "gate.json").read_text())["verdict"] == "pass"
    done, folder = run_ending(project, tmp_path, *args, hook=hook, action="SIGKILL")
    assert done.returncode == -signal.SIGKILL
    report = json.loads((folder / "gate.json").read_text())
    assert (report["exit_code"], report["verdict"]) == (2, "interrupted")
    assert report["problems"][0]["message"].startswith("the gate command did not finish: its process ended before")
    junit = ET.parse(folder / "gate.xml").getroot()
    assert (junit.get("errors"), junit.get("failures")) == ("1", "0")


CRASHING_MEASURE = """\
import os, signal
import qbench.execute.jobs as jobs
measure = jobs.measure
def crashing(backend, built, *args, **kwargs):
    if built.name == os.environ["QBENCH_TEST_CRASHES"]:  # a native library's crash in this variant's measurement
        os.kill(os.getpid(), signal.SIGSEGV)
    return measure(backend, built, *args, **kwargs)
jobs.measure = crashing
"""


def test_a_sweep_gate_going_on_after_a_crash_reports_the_exit_2_it_ends_with(project, tmp_path):
    """The sweep's process died measuring a variant the gate does not judge; the resume that went on recorded it
    failed and its gate passed the others: qbench exited 2 (a crashed job is no pass, qbench.supervisor) while gate.json
    said pass, exit code 0, and the registry could have moved. The resume is told the jobs that died, and its verdict
    says exit 2 and why."""
    raw = yaml.safe_load(project.lenient.read_text())
    raw.update(name="crashing", output_dir=str(tmp_path / "reports"), gate={**raw["gate"], "applies_to": ["fp16"]},
               variants=[*raw["variants"], {"name": "int8", "precision": "int8", "calibrator": "minmax"}])  # fmt: skip
    recipe = project.root / "crashing.yaml"  # its model and data paths are the project's
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CRASHING_MEASURE)
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}", "QBENCH_TEST_CRASHES": "int8"}
    done = subprocess.run([sys.executable, "-m", "qbench.cli", "sweep", str(recipe), "--no-track", "--gate", "--json",
                           str(tmp_path / "gate.json")], capture_output=True, text=True, env=env, cwd=project.root,
                          timeout=600, check=False)  # fmt: skip
    assert done.returncode == 2
    assert "the sweep went on after its process died in measure:int8@" in done.stderr.splitlines()[-1]
    report = json.loads((tmp_path / "gate.json").read_text())
    assert (report["exit_code"], report["verdict"], report["counts"]["breaches"]) == (2, "error", 0)
    assert report["problems"][-1]["message"].startswith("the sweep's process died running measure:int8@")
    assert {check["variant"] for check in report["checks"]} == {"fp16"}  # what was judged is still shown
