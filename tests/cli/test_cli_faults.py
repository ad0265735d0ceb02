"""The exit-code contract under faults around the commands: streams that cannot encode or were closed, signals,
an unexpected exception in the gate, a UI that cannot start, a full disk, a failing clean-up.

One real sweep of a user's project (in a folder whose name is not ASCII) is judged by recipes that differ only in
their gate section; most commands run as a real `python -m qbench.cli` process, so that the streams, the signals
and the exit status are the operating system's.
"""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import signalled
import yaml
from user_model import make_user_project

from qbench.cli.app import main
from qbench.errors import QbenchError

REPO = Path(__file__).resolve().parents[2]
BACKEND = "onnxruntime-cpu"
LENIENT = {"metric": "agreement", "max_drop": 1.0, "max_slice_drop": 1.0, "applies_to": ["*"]}
STRICT = {"metric": "max_abs_error", "max_drop": 0.0, "max_slice_drop": 0.0, "applies_to": ["*"]}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's project with FP16 only, swept once (not tracked) under the lenient gate; returns its folder."""
    root = tmp_path_factory.mktemp("cli_faults") / "prøve-ß"
    recipe = make_user_project(root)
    raw = yaml.safe_load(recipe.read_text())
    raw["variants"] = [{"name": "fp16", "precision": "fp16"}]
    raw["latency"] = {"batch_sizes": [1], "warmup": 1, "iterations": 3, "threads": 1, "stability": None}
    raw["gate"] = LENIENT
    del raw["tracking"]
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["sweep", str(recipe), "--no-track"]) == 0
    return root


def gated(project: Path, gate: dict[str, Any]) -> Path:
    """The swept recipe under another gate (same name: it judges the same results)."""
    raw = yaml.safe_load((project / "qbench.yaml").read_text())
    raw["gate"] = gate
    path = project / f"gate-{gate['metric']}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def qbench_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "MLFLOW_TRACKING_URI")}
    return {**env, "PYTHONPATH": str(REPO), "COLUMNS": "400", **extra}


def run_qbench(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qbench.cli", *args], capture_output=True, text=True,
                          env=qbench_env(**extra_env), timeout=120, check=False)  # fmt: skip


# -- 1. streams that cannot encode the output -------------------------------------------------------


@pytest.mark.parametrize(("gate", "code"), [(LENIENT, 0), (STRICT, 1)], ids=["pass", "breach"])
def test_a_verdict_is_not_lost_on_an_ascii_stream(project, gate, code):
    """The summary line holds '—' and '×', the breaches '→': an ASCII stdout prints '-', 'x' and '->' for them."""
    done = run_qbench("gate", str(gated(project, gate)), PYTHONIOENCODING="ascii")
    assert (done.returncode, done.stderr) == (code, "")
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith("gate: PASS - " if code == 0 else "gate: FAIL - ")


def test_an_error_naming_a_non_ascii_path_is_one_line_on_an_ascii_stream(project):
    missing = project / "nowhere" / "results.json"
    done = run_qbench("gate", "--results", str(missing), PYTHONIOENCODING="ascii")
    assert done.returncode == 2
    shown = str(missing).encode("ascii", errors="replace").decode()
    assert done.stderr.splitlines() == [f"error: {shown}: results file not found"]


# -- 2. an unexpected exception in the gate ---------------------------------------------------------


@pytest.mark.parametrize("where", ["qbench.gate.run.run_gate", "qbench.gate.report.console_lines"],
                         ids=["judging", "printing"])  # fmt: skip
def test_the_report_files_say_why_when_the_gate_fails_unexpectedly(project, tmp_path, monkeypatch, capsys, where):
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug\nin the gate")

    monkeypatch.setattr(where, broken)
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit, report = tmp_path / "gate.xml", tmp_path / "gate.json"
    assert main(["gate", str(project / "qbench.yaml"), "--junit", str(junit), "--json", str(report)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "qbench: error: RuntimeError: a bug in the gate"
    loaded = json.loads(report.read_text())
    after_verdict = where == "qbench.gate.report.console_lines"  # judged, then failed: the results were usable
    assert (loaded["verdict"], loaded["exit_code"]) == ("error" if after_verdict else "unusable", 2)
    assert [p["message"] for p in loaded["problems"]] == ["RuntimeError: a bug in the gate"]
    root = ET.parse(junit).getroot()
    checks = len(loaded["checks"])
    assert (checks > 0) == (where == "qbench.gate.report.console_lines")  # printing failed: the verdict's checks stay
    assert [root.get(k) for k in ("tests", "failures", "errors")] == [str(checks + 1), "0", "1"]
    assert "RuntimeError: a bug in the gate" in summary.read_text()


# -- 3. a UI that does not start ----------------------------------------------------------------------


def test_ui_on_a_port_in_use_exits_2_with_one_line(project):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_qbench("ui", str(project / "qbench.yaml"), "--port", str(port))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: --port {port}: cannot listen on 127.0.0.1:{port}: Address already "
                                        "in use; expected a free port"]  # fmt: skip


def test_ui_that_ends_by_itself_with_status_0_is_an_error(project, monkeypatch, capsys):
    """MLflow's UI logs a failure to start (a port taken since the check) and exits 0: only Ctrl+C ends it well."""
    monkeypatch.setattr("qbench.interrupt.run_process_group", lambda command: 0)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main(["ui", str(project / "qbench.yaml"), "--port", str(port)]) == 2
    assert "error: the MLflow UI stopped by itself with status 0" in capsys.readouterr().err


# -- 4. signals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_gate_exits_2_interrupted(project, tmp_path, signum):
    """The --json report goes to a pipe nobody reads: once the verdict is printed, the gate waits there for the
    signal."""
    fifo = tmp_path / "gate.json"
    os.mkfifo(fifo)
    process = subprocess.Popen([sys.executable, "-m", "qbench.cli", "gate", str(project / "qbench.yaml"), "--json",
                                str(fifo)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=qbench_env())  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("gate: PASS"):
            break
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert (process.returncode, err) == (2, "qbench: error: interrupted\n")


def run_signalled(hook: str, signum: int, *args: str) -> subprocess.CompletedProcess[str]:
    """`qbench ARGS` that receives `signum` right after `hook` (module:function) returns (tests/signalled.py)."""
    return signalled.run_signalled(hook, signum, *args, env=qbench_env())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_an_export_leaves_no_half_written_model_folder(project, tmp_path, signum):
    repository = tmp_path / "repo"
    done = run_signalled("qbench.export.triton:_copy_model", signum, "export", "triton", str(project / "qbench.yaml"),
                         "--variant", "fp16", "--backend", BACKEND, "--to", str(repository))  # fmt: skip
    assert (done.returncode, done.stderr) == (2, "qbench: error: interrupted\n")
    assert list(repository.iterdir()) == []


def test_a_signal_during_validate_exits_2_interrupted(project):
    done = run_signalled("qbench.validate.dry_run:dry_run", signal.SIGTERM, "validate", str(project / "qbench.yaml"))
    assert (done.returncode, done.stderr.splitlines()[-1]) == (2, "qbench: error: interrupted")
    assert "Traceback" not in done.stderr


# -- 5. a reader that went away ---------------------------------------------------------------------


@pytest.mark.parametrize(("gate", "code"), [(LENIENT, 0), (STRICT, 1)], ids=["pass", "breach"])
def test_a_closed_stdout_keeps_the_verdict_and_writes_the_report(project, tmp_path, gate, code):
    """`qbench gate ... --verbose | head -0`: the reader is gone before the first line."""
    report = tmp_path / "gate.json"
    process = subprocess.Popen([sys.executable, "-m", "qbench.cli", "gate", str(gated(project, gate)), "--verbose",
                                "--json", str(report)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=qbench_env())  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    err = process.stderr.read()
    assert process.wait(timeout=120) == code
    assert err == f"gate report: {report}\n"
    assert json.loads(report.read_text())["exit_code"] == code


def closed_reader(*args: str, merged: bool = False) -> tuple[int, str]:
    """Run qbench with its stdout (and with `merged`, its stderr: `2>&1 | head -0`) read by nobody: the pipe is
    closed before the first line; returns the exit status and what came on stderr."""
    process = subprocess.Popen([sys.executable, "-m", "qbench.cli", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT if merged else subprocess.PIPE, text=True,
                               env=qbench_env())  # fmt: skip
    assert process.stdout is not None
    process.stdout.close()
    err = "" if merged or process.stderr is None else process.stderr.read()
    return process.wait(timeout=120), err


@pytest.mark.parametrize("args", [["--help"], ["sweep", "--help"], ["gate", "--help"], ["cache", "prune", "--help"],
                                  ["list"]], ids=" ".join)  # fmt: skip
def test_help_and_output_cut_by_a_closed_reader_keep_the_commands_status(args):
    """`qbench --help | head -1` exited 2 ('qbench: error: SystemExit: 1': typer's own console ends the program on a
    closed pipe): what the reader keeps is its choice, the command's status is its own, and nothing more is said."""
    assert closed_reader(*args) == (0, "")
    assert closed_reader(*args, merged=True)[0] == 0


@pytest.mark.parametrize(("gate", "code"), [(LENIENT, 0), (STRICT, 1)], ids=["pass", "breach"])
def test_a_verdict_stands_when_stdout_and_stderr_are_read_by_nobody(project, gate, code):
    assert closed_reader("gate", str(gated(project, gate)), "--verbose", merged=True)[0] == code


def test_a_usage_error_is_still_exit_2_when_nobody_reads_it():
    assert closed_reader("gate", "--no-such-option", merged=True)[0] == 2


# -- 6. a clean-up that fails after a first error ---------------------------------------------------


def reporting_to(project: Path, folder: Path) -> Path:
    """The project's recipe in `folder`, writing its runs to folder/reports (its model and data linked there)."""
    raw = yaml.safe_load((project / "qbench.yaml").read_text())
    raw["output_dir"] = str(folder / "reports")
    recipe = folder / "qbench.yaml"
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    recipe.with_name("model").symlink_to(project / "model")
    recipe.with_name("data").symlink_to(project / "data")
    return recipe


def test_a_failing_clean_up_does_not_hide_the_error_that_stopped_the_sweep(project, tmp_path, monkeypatch, capsys):
    recipe = reporting_to(project, tmp_path)

    def disk_full(*args: Any) -> None:
        raise QbenchError("results.json: cannot write the results: No space left on device")

    def unwritable(*args: Any) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("qbench.sweep.runner.write_results", disk_full)
    monkeypatch.setattr("qbench.sweep.runner.mark_incomplete", unwritable)
    assert main(["sweep", str(recipe), "--no-track"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: results.json: cannot write the results: No space left on device"
    assert any("cannot mark the run incomplete: OSError: [Errno 30] Read-only file system" in line for line in err)


def test_removing_the_progress_bars_after_a_write_error_keeps_that_error():
    from rich.console import Console

    from qbench.console import RichProgress

    class FailingStream(io.StringIO):
        """A terminal that takes the bars' first frames; after the disk filled up, every write fails as a closed
        stream."""

        full = False

        def isatty(self) -> bool:
            return True

        def write(self, text: str) -> int:
            if self.full:
                raise ValueError("I/O operation on closed file")
            return super().write(text)

    stream = FailingStream()
    progress = RichProgress(Console(file=stream, force_terminal=True))
    with pytest.raises(OSError, match="No space left on device"), progress.steps("rows", 10):
        stream.full = True
        raise OSError(errno.ENOSPC, "No space left on device")


# -- 7. a write that fails midway ---------------------------------------------------------------------


def test_a_report_that_cannot_be_written_whole_leaves_the_earlier_one(project, tmp_path):
    """Writes beyond 4 KiB fail (RLIMIT_FSIZE: 'File too large', as a full disk would fail them): the earlier
    report.html stays as it was, no temporary file is left, and the error is one line naming the file."""
    [run] = list((project / "reports" / "tumour-mlp").iterdir())
    earlier = run / "report.html"
    before, names = earlier.read_bytes(), sorted(p.name for p in run.iterdir())
    assert len(before) > 4096
    limited = textwrap.dedent("""\
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        from qbench.cli.app import main
        sys.exit(main(sys.argv[1:]))
    """)
    done = subprocess.run([sys.executable, "-c", limited, "report", str(run), "--html"], capture_output=True,
                          text=True, env=qbench_env(), timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == f"error: {earlier}: cannot write the HTML report: File too large"
    assert "Traceback" not in done.stderr
    assert earlier.read_bytes() == before
    assert sorted(p.name for p in run.iterdir()) == names  # no temporary file left


# -- 8. bad input files -------------------------------------------------------------------------------


def recipe_reading(project: Path, folder: Path, *, model: str | None = None, data: str | None = None) -> Path:
    """The project's recipe, written into `folder`, reading `model` / `data` (relative to `folder`) instead."""
    raw = yaml.safe_load((project / "qbench.yaml").read_text())
    raw["model"]["path"] = model or str(project / raw["model"]["path"])
    raw["data"]["path"] = data or str(project / raw["data"]["path"])
    recipe = folder / "qbench.yaml"
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    return recipe


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("error:", "qbench: error:"))]
    return line


def test_a_model_path_in_a_loop_of_symbolic_links_is_one_line(project, tmp_path, capsys):
    (tmp_path / "a.onnx").symlink_to(tmp_path / "b.onnx")
    (tmp_path / "b.onnx").symlink_to(tmp_path / "a.onnx")
    recipe = recipe_reading(project, tmp_path, model="a.onnx")
    assert main(["validate", str(recipe)]) == 2
    assert error_line(capsys) == (f"error: {recipe}: model.path: cannot open (Too many levels of symbolic links): "
                                  f"{tmp_path / 'a.onnx'}")  # fmt: skip


@pytest.mark.parametrize(("content", "problem"), [
    (b"", "is empty (0 bytes); expected the model file"),
    (b"\x08\x07", "is not an ONNX model (its graph has no outputs); expected an ONNX file"),  # ir_version 7, no graph
], ids=["empty", "no-graph"])  # fmt: skip
def test_a_model_file_that_holds_no_model_is_one_line(project, tmp_path, capsys, content, problem):
    (tmp_path / "m.onnx").write_bytes(content)
    recipe = recipe_reading(project, tmp_path, model="m.onnx")
    assert main(["validate", str(recipe)]) == 2
    assert error_line(capsys) == f"error: {recipe}: model.path: {tmp_path / 'm.onnx'} {problem}"


def _table(project: Path) -> Any:
    import pandas as pd

    table = pd.read_parquet(project / "data" / "patients.parquet")
    table["x"] = [json.dumps([float(v) for v in row]) for row in table["x"]]
    return table


def test_a_json_array_in_a_json_lines_file_is_one_line(project, tmp_path, capsys):
    rows = [{**row, "x": json.loads(row["x"])} for row in _table(project).to_dict(orient="records")]
    (tmp_path / "rows.jsonl").write_text(json.dumps(rows))
    recipe = recipe_reading(project, tmp_path, data="rows.jsonl")
    assert main(["validate", str(recipe)]) == 2
    assert error_line(capsys) == (f"error: {recipe}: data.path: cannot read rows.jsonl: line 1 is an array; expected "
                                  'one JSON object per line (JSON lines), '
                                  'such as {"x": [0.1, 0.2], "y": 1}')  # fmt: skip


def test_a_utf16_csv_with_its_byte_order_mark_is_read(project, tmp_path, capsys):
    _table(project).to_csv(tmp_path / "rows.csv", index=False, encoding="utf-16")
    assert (tmp_path / "rows.csv").read_bytes().startswith(b"\xff\xfe")
    assert main(["validate", str(recipe_reading(project, tmp_path, data="rows.csv"))]) == 0
    assert "229 evaluation rows, 64 calibration rows, 3 slices" in capsys.readouterr().out


def test_a_csv_in_another_encoding_is_refused_naming_where_and_the_field_then_read_as_declared(
    project, tmp_path, capsys
) -> None:  # fmt: skip
    table = _table(project)
    table["band"] = table["band"].str.replace("small", "smäll")
    table.to_csv(tmp_path / "rows.csv", index=False, encoding="latin-1")
    raw = (tmp_path / "rows.csv").read_bytes()
    offset = raw.index("ä".encode("latin-1"))
    line = raw[:offset].count(b"\n") + 1
    recipe = recipe_reading(project, tmp_path, data="rows.csv")
    assert main(["validate", str(recipe)]) == 2
    assert error_line(capsys) == (f"error: {recipe}: data.path: cannot read "
                                  f"rows.csv: line {line} (byte {offset}: 0xe4) "
                                  "is not utf-8 text; set data.encoding to the "
                                  "encoding the file was written in (cp1252 for most "
                                  "Windows and Excel exports, latin-1, utf-16, ...)")  # fmt: skip
    raw_recipe = yaml.safe_load(recipe.read_text())
    raw_recipe["data"]["encoding"] = "latin-1"
    recipe.write_text(yaml.safe_dump(raw_recipe, sort_keys=False))
    assert main(["validate", str(recipe)]) == 0
    assert "band=smäll" in capsys.readouterr().out


def test_an_export_to_a_destination_that_is_no_folder_is_one_line(project, capsys):
    args = ["export", "triton", str(project / "qbench.yaml"), "--variant", "fp16", "--backend", BACKEND]
    assert main([*args, "--to", os.devnull]) == 2
    assert error_line(capsys) == (f"error: --to {os.devnull}: {os.devnull} is not a folder; expected a folder for the "
                                  "Triton model repository")  # fmt: skip


class FullDisk:
    """A file opened for writing on a full disk: every write fails with ENOSPC."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def write(self, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self) -> FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self._real.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_results_that_cannot_be_written_on_a_full_disk_leave_the_earlier_file(project, tmp_path, monkeypatch):
    from qbench.results.schema import read_results, write_results

    [run] = list((project / "reports" / "tumour-mlp").iterdir())
    results = read_results(run / "results.json")
    target = tmp_path / "results.json"
    write_results(results, target)
    before = target.read_bytes()
    real_open = io.open

    def full_disk_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        opened = real_open(file, mode, *args, **kwargs)
        return FullDisk(opened) if "w" in mode else opened

    monkeypatch.setattr(io, "open", full_disk_open)
    with pytest.raises(QbenchError) as refused:
        write_results(results, target)
    monkeypatch.undo()
    assert str(refused.value) == f"{target}: cannot write the results: No space left on device"
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_a_signal_once_the_results_are_complete_still_leaves_the_reports(project, tmp_path, monkeypatch, capsys):
    """A signal right after results.json is complete (Ctrl+C while the plot renders) used to leave complete results
    without report.md, report.html and the frontier plot: the reports are written before the signal is acted on."""
    recipe = reporting_to(project, tmp_path)
    from qbench.sweep import runner as sweep

    completed = sweep.mark_complete

    def then_signalled(folder: Path) -> None:
        completed(folder)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr("qbench.sweep.runner.mark_complete", then_signalled)
    assert main(["sweep", str(recipe), "--no-track"]) == 2
    assert "the results are complete in" in capsys.readouterr().err
    [run_dir] = [p.parent for p in (tmp_path / "reports").glob("*/*/results.json")]
    assert {"report.md", "report.html", "frontier.svg"} <= {p.name for p in run_dir.iterdir()}


@pytest.mark.parametrize(("writer", "failing", "what"), [
    ("write_html_report", "report.html", "the HTML report"),
    ("write_results", "results.json", "the sweep's timings into the complete results"),  # its second complete write
])  # fmt: skip
def test_a_full_disk_once_the_results_are_complete_says_where_they_are(
    project, tmp_path, monkeypatch, capsys, writer, failing, what
):
    """A disk filling up after results.json was written complete (a report, the rewrite adding the sweep's timings)
    stopped the sweep with the write's error alone (`... cannot write the results: No space left on device`), which
    reads as results lost, while the gate judged the complete results there: the line now says where they are."""
    recipe = reporting_to(project, tmp_path)
    from qbench.sweep import runner as sweep

    real_writer, real_open, calls = getattr(sweep, writer), io.open, []

    def full_disk_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        opened = real_open(file, mode, *args, **kwargs)
        return FullDisk(opened) if "w" in mode else opened

    def on_a_full_disk(*args: Any, **kwargs: Any) -> Any:
        calls.extend(args[:1] if writer == "write_html_report" or args[0].complete else [])
        if writer == "write_results" and len(calls) < 2:  # the partial results, then the complete ones
            return real_writer(*args, **kwargs)
        with monkeypatch.context() as patched:
            patched.setattr(io, "open", full_disk_open)
            return real_writer(*args, **kwargs)

    monkeypatch.setattr(f"qbench.sweep.runner.{writer}", on_a_full_disk)
    assert main(["sweep", str(recipe), "--no-track"]) == 2
    [run] = [p.parent for p in (tmp_path / "reports").glob("*/*/results.json")]
    assert error_line(capsys) == (f"error: {run / failing}: cannot write {what}: No space left on device; the results "
                                  f"are complete in {run}")  # fmt: skip
    assert json.loads((run / "results.json").read_text())["complete"] is True
    assert main(["gate", str(recipe)]) == 0


@pytest.mark.parametrize("blocked", ["reports", "reports/linear"])
def test_a_gate_whose_output_dir_is_a_file_names_the_field_not_a_sweep_to_run(tmp_path, capsys, blocked):
    """The gate said 'no results ... under <root>: run `qbench sweep` first', a sweep that output_dir's file stops."""
    from tiny_linear import make_linear_project

    recipe = make_linear_project(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")
    (tmp_path / blocked).parent.mkdir(exist_ok=True)
    (tmp_path / blocked).write_text("not a folder")
    assert main(["gate", str(recipe)]) == 2
    line = capsys.readouterr().err.strip()
    assert line == (f"error: {recipe}: output_dir: {tmp_path / blocked} (in the path of {tmp_path / 'reports/linear'})"
                    " is a file; expected the folder the sweep writes its run folders in")
