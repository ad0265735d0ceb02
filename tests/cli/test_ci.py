"""`qbench sweep --gate` and `qbench gate` as CI runs them: no terminal, FORCE_COLOR, COLUMNS=0, a job's timeout.

A scikit-learn MLP on iris (skl2onnx), in a folder whose name is not ASCII, swept once; each command then runs as a
real `python -m qbench.cli` process under the environment a CI runner gives it, its stdout and stderr captured apart.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from signalled import run_signalled

from qbench.console import PLAIN_FALLBACK, CliConsole, RichProgress

REPO = Path(__file__).resolve().parents[2]
GATE = {"metric": "agreement", "max_drop": 0.5, "max_slice_drop": 0.5, "applies_to": ["*"]}


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An iris MLP with FP16 and INT8 variants, swept once (not tracked); returns the recipe."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.datasets import load_iris
    from sklearn.neural_network import MLPClassifier

    root = tmp_path_factory.mktemp("cli_ci") / "arbeitsbereich-ü"
    root.mkdir()
    features, labels = load_iris(return_X_y=True)
    features = features.astype(np.float32)
    model = MLPClassifier(hidden_layer_sizes=(16,), max_iter=2000, random_state=0).fit(features, labels)
    onnx_model = convert_sklearn(model, initial_types=[("input", FloatTensorType([None, 4]))],
                                 options={id(model): {"zipmap": False}}, target_opset=17)  # fmt: skip
    (root / "model.onnx").write_bytes(onnx_model.SerializeToString())
    subset = np.where(np.arange(len(labels)) % 3 == 0, "calib", "test")
    kind = np.where(features[:, 0] > 5.8, "long", "short")
    pd.DataFrame({"x": list(features), "y": labels, "subset": subset, "kind": kind}).to_parquet(root / "data.parquet")
    raw = {
        "name": "iris-ci", "task": "classification", "model": {"path": "model.onnx"},
        "data": {"path": "data.parquet", "inputs": {"x": "input"}, "label": "y", "slices": [{"by": "kind"}],
                 "calibration": {"filter": {"subset": "calib"}, "samples": 32},
                 "evaluation": {"filter": {"subset": "test"}}},
        "variants": [{"name": "fp16", "precision": "fp16"},
                     {"name": "int8", "precision": "int8", "calibrator": "minmax"}],
        "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 3, "threads": 1},
        "gate": GATE, "output_dir": str(root / "reports"),
    }  # fmt: skip
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    done = run_qbench("sweep", str(path), "--no-track")
    assert done.returncode == 0, done.stderr
    return path


def ci_env(**extra: str) -> dict[str, str]:
    """A CI runner's environment: no terminal, CI=true; the caller's own settings (COLUMNS, FORCE_COLOR) left out."""
    dropped = ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("MLFLOW_")}
    return {**env, "PYTHONPATH": str(REPO), "CI": "true", "TERM": "dumb", **extra}


def run_qbench(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qbench.cli", *args], capture_output=True, text=True,
                          env=ci_env(**extra_env), timeout=300, check=False)  # fmt: skip


def test_force_color_colours_a_log_but_draws_no_progress_frames_and_folds_no_table(recipe):
    """FORCE_COLOR=1 (set in many CI jobs for coloured logs) made rich take the log for a terminal: progress bars
    redrawn with carriage returns and cursor moves, and `--verbose`'s table folded to 80 columns (`onnxru`,
    `ntime-`, `cpu` on three lines)."""
    done = run_qbench("sweep", str(recipe), "--gate", "--verbose", "--no-track", FORCE_COLOR="1", TERM="xterm")
    assert done.returncode == 0, done.stderr
    assert "\x1b[" in done.stderr  # the colour asked for
    for stream in (done.stdout, done.stderr):
        assert "\r" not in stream and "\x1b[?25l" not in stream and "\x1b[1A" not in stream  # no frames
    rows = [line for line in done.stdout.splitlines() if "onnxruntime-cpu" in line and "kind=" in line]
    assert len(rows) == 4 and all("PASS" in row for row in rows)  # one line per check, each whole


def test_columns_0_still_prints_the_verdict(recipe):
    """COLUMNS=0 (as some CI runners export it) gave rich a width of 0: every line printed as nothing."""
    done = run_qbench("gate", str(recipe), COLUMNS="0")
    assert (done.returncode, done.stdout.splitlines()[-1]) == (0, "gate: PASS — 2 variants × 3 scopes, 6 checks")


def test_columns_0_still_prints_the_error(recipe):
    missing = recipe.parent / "nowhere" / "results.json"
    done = run_qbench("gate", "--results", str(missing), COLUMNS="0")
    assert (done.returncode, done.stderr.splitlines()) == (2, [f"error: {missing}: results file not found"])


def test_a_breach_reads_in_ascii_on_a_stream_that_cannot_encode_its_symbols(recipe):
    """PYTHONIOENCODING=ascii (or a C locale) printed qbench's '—', '×' and '→' as '?': `0.0000 ? 0.0132`, the
    arrow from FP32's figure to the variant's lost. The exit code stays the verdict's."""
    strict = recipe.with_name("strict.yaml")  # the same name and output folder: it judges the same results
    strict.write_text(yaml.safe_dump({**yaml.safe_load(recipe.read_text()), "gate": {**GATE, "metric": "max_abs_error",
                                      "max_drop": 0.0, "max_slice_drop": 0.0}}))  # fmt: skip
    done = run_qbench("gate", str(strict), PYTHONIOENCODING="ascii")
    assert (done.returncode, done.stderr) == (1, "")
    lines = done.stdout.splitlines()
    breaches = [line for line in lines if line.startswith("BREACH int8@onnxruntime-cpu overall max_abs_error: ")]
    assert len(breaches) == 1 and " -> " in breaches[0] and "?" not in breaches[0]
    assert lines[-1].startswith("gate: FAIL - 2 of 2 variants breach: ")


def test_only_what_an_encoding_lacks_is_replaced():
    """Latin-1 has '×' and 'é' but not '—', '→' or '€': qbench's symbols in ASCII, anything else as '?'."""
    assert "0.9 → 0.8 — 1.00× é €".encode("latin-1", errors=PLAIN_FALLBACK) == b"0.9 -> 0.8 - 1.00\xd7 \xe9 ?"


def test_a_sweep_stopped_by_the_jobs_timeout_leaves_gate_reports_saying_so(recipe, tmp_path):
    """`qbench sweep --gate --junit --json` stopped by SIGTERM (a CI job's timeout) wrote no report: the steps that
    upload them `if: always()` found nothing. Now each holds one error naming the incomplete run, and the step
    summary says so too."""
    junit, report, summary = tmp_path / "gate.xml", tmp_path / "gate.json", tmp_path / "summary.md"
    summary.write_text("# an earlier step\n")
    stopped = recipe.with_name("stopped.yaml")  # its incomplete run in a folder of its own
    stopped.write_text(yaml.safe_dump({**yaml.safe_load(recipe.read_text()), "output_dir": str(tmp_path / "reports")}))
    done = run_signalled("qbench.execute.executors:run_build", signal.SIGTERM, "sweep", str(stopped), "--gate",
                         "--no-track", "--junit", str(junit), "--json", str(report),
                         env=ci_env(GITHUB_STEP_SUMMARY=str(summary)))  # fmt: skip
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: sweep interrupted by SIGTERM: ") and "is marked incomplete" in last
    suite = ET.parse(junit).getroot()
    assert (suite.get("tests"), suite.get("errors"), suite.get("failures")) == ("1", "1", "0")
    error = suite.find("testsuite/testcase/error")
    assert error is not None and error.get("message") == last[len("error: "):]
    assert error.get("type") == "interrupted"  # a signal ended it: not results found unusable
    written = json.loads(report.read_text())
    assert (written["exit_code"], written["problems"]) == (2, [{"variant": None, "message": last[len("error: "):]}])
    assert written["verdict"] == "interrupted"
    assert summary.read_text().startswith("# an earlier step\n### qbench gate: FAIL (interrupted)\n")


def test_long_work_in_a_log_prints_one_line_a_minute_at_most():
    """In a log (no terminal, though rich is told it is one, as FORCE_COLOR tells it) a unit of work shows it is
    alive in plain lines, bounded by the clock, not by its steps: 5 steps over 130 s print 2 lines."""
    clock = iter([0.0, 10.0, 61.0, 70.0, 121.0, 130.0])
    stream = io.StringIO()
    progress = RichProgress(CliConsole(file=stream, force_terminal=True, width=20), every_s=60.0,
                            clock=lambda: next(clock))  # fmt: skip
    with progress.steps("fp32@onnxruntime-cpu evaluate", 5) as advance:
        for _ in range(5):
            advance(1)
    assert stream.getvalue().splitlines() == ["fp32@onnxruntime-cpu evaluate: 2/5 after 1m01s",
                                              "fp32@onnxruntime-cpu evaluate: 4/5 after 2m01s"]  # fmt: skip


@pytest.mark.parametrize("closed", [0, 1, 2], ids=["stdin", "stdout", "stderr"])
def test_a_closed_standard_stream_drops_its_output_and_keeps_the_verdict(recipe, tmp_path, closed):
    """A step running `qbench gate ... >&-` (or `2>&-`, `0<&-`) started qbench with that descriptor closed: the pipe to
    the supervised child took its number and became the child's stdout or stderr, and a gate that passed ended
    with exit 2 (`AttributeError: 'NoneType' object has no attribute 'write'`; with stderr closed, a status 1 that
    is no verdict) and no report. Now the closed stream's output is dropped; the exit code and report are the
    verdict's."""
    report = tmp_path / "gate.json"
    done = subprocess.run([sys.executable, "-m", "qbench.cli", "gate", str(recipe), "--json", str(report)],
                          capture_output=True, text=True, env=ci_env(), timeout=300, check=False,
                          preexec_fn=lambda: os.close(closed))  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    if closed == 1:
        assert done.stderr == f"gate report: {report}\n"  # the verdict and notes went to the closed stdout
    else:
        assert done.stdout.splitlines()[-1] == "gate: PASS — 2 variants × 3 scopes, 6 checks"
    assert json.loads(report.read_text())["verdict"] == "pass"


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_an_address_space_limit_too_small_is_named_in_one_line(recipe, debug):
    """Under `ulimit -v` too small for the command, the gate printed `qbench: error: MemoryError: ` (no message),
    and with --debug nothing at all (drawing the traceback ran out of memory too), exit 2 either way. Whether the
    interpreter, a native library or qbench's own code meets the limit first, the last line now names it."""
    import resource

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (200 * 2**20, resource.getrlimit(resource.RLIMIT_AS)[1]))

    args = [sys.executable, "-m", "qbench.cli", "gate", str(recipe), *(["--debug"] if debug else [])]
    done = subprocess.run(args, capture_output=True, text=True, env=ci_env(), timeout=300, check=False,
                          preexec_fn=limited)  # fmt: skip
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    # a MemoryError met in Python ends on the limit; a native library's crash names it, then what to do next
    assert last.startswith("qbench: error: ") and "ulimit -v lets this process map at most 200 MiB)" in last


def test_a_default_tracking_store_that_cannot_be_written_stops_the_sweep_before_it_builds(recipe, tmp_path):
    """A CI job without `--no-track` whose recipe names no tracking.uri logs to $MLFLOW_TRACKING_URI, else mlflow.db
    in a working directory that may be read-only: the sweep built and measured until MLflow failed on that store.
    Now it stops at the start with one line naming the store, and makes no run folder."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    runs = sorted((recipe.parent / "reports" / "iris-ci").iterdir())
    done = run_qbench("sweep", str(recipe), MLFLOW_TRACKING_URI=f"sqlite:///{blocker}/mlflow.db")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: {recipe}: tracking.uri: {blocker} is a file; expected a writable "
                                        "folder (tracking.uri is not set, so runs go to "
                                        f"sqlite:///{blocker}/mlflow.db: set tracking.uri "
                                        "or $MLFLOW_TRACKING_URI, or run with --no-track)"]  # fmt: skip
    assert sorted((recipe.parent / "reports" / "iris-ci").iterdir()) == runs


def test_a_plain_log_has_no_escapes_no_trailing_spaces_whole_paths_and_a_line_per_job(recipe):
    """A CI log at COLUMNS=80 under NO_COLOR: the summary and gate tables' lines ended in up to 150 spaces (rich pads
    each cell to the table's width). Now no line ends in a space, nothing is coloured, the results path (longer than
    80 columns here) is whole on its line, and the jobs' progress is one line per job done, not bar frames."""
    done = run_qbench("sweep", str(recipe), "--gate", "--verbose", "--no-track", COLUMNS="80", NO_COLOR="1")
    assert done.returncode == 0, done.stderr
    log = done.stdout + done.stderr
    lines = log.splitlines()
    assert "\x1b" not in log and "\r" not in log
    assert [line for line in lines if line.endswith(" ")] == []
    results = [line.removeprefix("results: ") for line in lines if line.startswith("results: ")]
    assert len(results) == 1 and len(results[0]) > 80 and Path(results[0]).is_file()
    planned = next(int(line.split()[0]) for line in lines if " jobs (" in line)
    assert len([line for line in lines if " jobs done " in line]) == planned


def test_a_timing_warning_the_summary_shows_prints_once(recipe, tmp_path, monkeypatch, capsys):
    """The sweep logged its contention warning and the summary table's notes carried it too: the same long line
    twice, three lines apart, in every sweep's log timed on a busy runner."""
    from qbench.cli.app import main
    from qbench.report import tables as report
    from qbench.sweep import runner as sweep

    note = "onnxruntime-cpu: other processes kept 1.84 CPUs busy while int8 was timed at batch 1"
    for module in (report, sweep):
        monkeypatch.setattr(module, "contention_notes", lambda results: [note])
    own = recipe.with_name("contended.yaml")  # its run in a folder of its own
    own.write_text(yaml.safe_dump({**yaml.safe_load(recipe.read_text()), "output_dir": str(tmp_path / "reports")}))
    assert main(["sweep", str(own), "--no-track"]) == 0
    assert [line for line in capsys.readouterr().err.splitlines() if note in line] == [note]


def test_under_github_actions_a_breach_and_an_error_are_annotated_once(recipe):
    """On GitHub Actions the run's page said only `Process completed with exit code 1` (or 2) until someone opened the
    log. Now the gate's summary line, or the error, is also one `::error` workflow command on stderr (never on
    stdout, which `--json -` keeps for its document), the message encoded so that it stays one command."""
    strict = recipe.with_name("strict-annotated.yaml")
    strict.write_text(yaml.safe_dump({**yaml.safe_load(recipe.read_text()), "gate": {**GATE, "metric": "max_abs_error",
                                      "max_drop": 0.0, "max_slice_drop": 0.0}}))  # fmt: skip
    breach = run_qbench("gate", str(strict), "--json", "-", GITHUB_ACTIONS="true")
    assert breach.returncode == 1 and json.loads(breach.stdout)["verdict"] == "breach"
    annotations = [line for line in breach.stderr.splitlines() if line.startswith("::")]
    assert len(annotations) == 1 and annotations[0].startswith("::error title=qbench gate::gate: FAIL — 2 of 2 ")
    missing = recipe.parent / "nowhere" / "results.json"
    error = run_qbench("gate", "--results", str(missing), GITHUB_ACTIONS="true")
    assert (error.returncode, error.stderr.splitlines()) == (2, [f"error: {missing}: results file not found",
                                                                 f"::error title=qbench::{missing}: "
                                                                 "results file not found"])  # fmt: skip
    unmatched = recipe.with_name("unmatched-annotated.yaml")  # unusable: the annotation names the problem itself
    unmatched.write_text(yaml.safe_dump({**yaml.safe_load(recipe.read_text()),
                                         "gate": {**GATE, "applies_to": ["bf16*"]}}))  # fmt: skip
    unusable = run_qbench("gate", str(unmatched), GITHUB_ACTIONS="true")
    (annotation,) = [line for line in unusable.stderr.splitlines() if line.startswith("::")]
    assert unusable.returncode == 2 and "gate: FAIL (results unusable)" in annotation and "'bf16*'" in annotation
    passed = run_qbench("gate", str(recipe), GITHUB_ACTIONS="true")
    assert passed.returncode == 0 and "::" not in passed.stdout + passed.stderr


def test_a_sweep_logs_last_the_verdict_and_where_the_report_is(recipe, tmp_path):
    """`sweep --gate` printed where its results and report are above the gate's notes and breaches: with many
    breaches, far above the log's last lines. Now the verdict comes, then the paths, whatever the breaches."""
    strict = tmp_path / "strict.yaml"
    strict.write_text(yaml.safe_dump({**yaml.safe_load(recipe.read_text()), "output_dir": str(tmp_path / "reports"),
                                      "model": {"path": str(recipe.parent / "model.onnx")},
                                      "data": {**yaml.safe_load(recipe.read_text())["data"],
                                               "path": str(recipe.parent / "data.parquet")},
                                      "gate": {**GATE, "metric": "max_abs_error", "max_drop": 0.0,
                                               "max_slice_drop": 0.0}}))  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "qbench.cli", "sweep", str(strict), "--gate", "--no-track"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ci_env(), timeout=300,
                          check=False)  # fmt: skip
    assert done.returncode == 1, done.stdout
    last = done.stdout.splitlines()[-3:]
    assert last[0].startswith("gate: FAIL — 2 of 2 variants breach: ")
    assert last[1].startswith("results: ") and Path(last[1].removeprefix("results: ")).is_file()
    assert last[2].startswith("report:  ") and Path(last[2].removeprefix("report:  ")).is_file()
