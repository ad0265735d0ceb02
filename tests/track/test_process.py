"""A sweep's MLflow logging in its own process (qbench.track.process, qbench.track.worker): MLflow is never imported
by the sweep's process, no MLflow work runs while anything is timed, and the tracking process failing, or the
sweep's process dying, never loses a measurement or leaves a run RUNNING."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from signalled import run_signalled
from tracking_hooks import in_tracking_process, tracking_process_hook, tracking_processes, wait_until_gone
from user_model import make_fp16_project

import qbench.supervisor as supervisor
import qbench.track.process as process_module
from qbench.cli.app import main
from qbench.results.schema import read_results
from qbench.sweep.runner import _Progress
from qbench.track.process import RemoteTracker, TrackingProcess

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the tracking process via /proc")


OPEN_TO_CLOSE = ("open", "variant_started", "variant_finished", "close")


def recording(owner: str, names: tuple[str, ...], out: Path) -> str:
    """Python code that wraps each of `owner`'s (a module or class, by its dotted path) functions `names` so that every
    call appends [name, start, end] (epoch seconds) to `out` as a JSON line."""
    return textwrap.dedent(f"""
        import json as _json, time as _time
        def _recorded(name, call):
            def run(*args, **kwargs):
                started = _time.time()
                try:
                    return call(*args, **kwargs)
                finally:
                    with open({str(out)!r}, "a") as record:
                        record.write(_json.dumps([name, started, _time.time()]) + "\\n")
            return run
        for _name in {names!r}:
            setattr({owner}, _name, _recorded(_name, getattr({owner}, _name)))
    """)


def runs_by_name(recipe: Path) -> dict[str, str]:
    client = MlflowClient(f"sqlite:///{recipe.parent / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tumour-mlp")
    return {run.info.run_name: run.info.status for run in client.search_runs([experiment.experiment_id])}


TIMED = {"qbench.validate.measure": ("measure_cold_start", "measure_samples", "measure_batcher_samples"),
         "qbench.validate.serve": ("serve",)}  # the cold start, the latency samples, the idle starts, the real server


def swept_with_records(tmp_path: Path, recipe: Path) -> tuple[list[list], list[list]]:
    """`recipe` swept in a process of its own, whose tracking process writes when each call it runs starts and ends,
    and which writes when each timed part of a measurement (TIMED) starts and ends: (calls, timed parts), each
    [name, start, end] in the order they ended. The sweep's process must not have imported MLflow."""
    calls, timed = tmp_path / "calls.jsonl", tmp_path / "timed.jsonl"
    hook = tracking_process_hook(tmp_path / "hook", "import qbench.track.tracker\n"
                                 + recording("qbench.track.tracker.SweepTracker", OPEN_TO_CLOSE, calls))  # fmt: skip
    sweep = "import json, sys\nimport qbench.validate.measure, qbench.validate.serve\n" + "".join(
        recording(module, names, timed) for module, names in TIMED.items()) + f"""
from qbench.sweep.runner import run_sweep
outcome = run_sweep({str(recipe)!r})
print(json.dumps([outcome.mlflow_run_id, outcome.tracking_failure, "mlflow" in sys.modules]))
"""
    env = {"PYTHONPATH": f"{hook}:{REPO}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", sweep], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run_id, failure, imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert run_id and failure is None and imported is False
    return ([json.loads(line) for line in calls.read_text().splitlines()],
            [json.loads(line) for line in timed.read_text().splitlines()])  # fmt: skip


def overlapping(calls: list[list], windows: list[list]) -> list[tuple[list, list]]:
    return [(call, window) for call in calls for window in windows if call[1] < window[2] and window[1] < call[2]]


def test_the_sweeps_process_never_imports_mlflow_and_no_logging_runs_while_anything_is_timed(tmp_path: Path) -> None:
    """No call of the tracking process overlaps a timed part of a measurement."""
    recipe = make_fp16_project(tmp_path)
    logged, windows = swept_with_records(tmp_path, recipe)
    assert [name for name, *_ in logged].count("variant_finished") == 2  # fp32 and fp16
    assert [name for name, *_ in windows].count("measure_samples") == 2  # each variant's, after its cold start
    assert not overlapping(logged, windows)
    assert runs_by_name(recipe) == {f"tumour-mlp sweep {p.name}": "FINISHED" for p in (tmp_path / "reports" /
                                    "tumour-mlp").iterdir()} | {"fp32 · ort-cpu": "FINISHED",
                                                                "fp16 · ort-cpu": "FINISHED"}  # fmt: skip


def test_a_variants_logging_runs_beside_the_next_ones_load_simulation_never_beside_a_timed_run(tmp_path: Path) -> None:
    """With `slo:`, FP32's logging is held past FP16's timed runs, which it no longer delays, and runs while FP16's
    load simulation is computed: it starts after FP16's idle starts were timed and ends before its real server runs."""
    recipe = make_fp16_project(tmp_path)
    raw = yaml.safe_load(recipe.read_text())
    raw["latency"]["iterations"] = 100  # the fewest an `slo:` budget is judged from
    # 200 req/s: each variant's idle starts are timed after 6 ms of idle (qbench.serving.idle_ms), at 20 req/s after 50
    # ms
    raw["slo"] = {"p99_ms": 1000, "rate_rps": 200, "load": {"max_queue_delay_ms": 1, "requests": 200, "seed": 0}}
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    logged, windows = swept_with_records(tmp_path, recipe)
    assert not overlapping(logged, windows)
    first_logged = next(call for call in logged if call[0] == "variant_finished")
    idle_starts = [window for window in windows if window[0] == "measure_batcher_samples"]
    served = [window for window in windows if window[0] == "serve"]
    assert len(idle_starts) == 2 and served[-1][1] > idle_starts[1][2]  # FP32's and FP16's; FP16 served after
    fp16_served = next(window for window in served if window[1] > idle_starts[1][2])
    assert idle_starts[1][2] <= first_logged[1] and first_logged[2] <= fp16_served[1]


def test_a_call_larger_than_a_pipe_holds_is_sent_while_the_tracking_process_still_imports_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The opening of the runs carries the sweep's rows (220 KiB for the digits demo) and is sent while the tracking
    process is still importing MLflow. A pipe holds 64 KiB: the send waited for that import to end, and so did the
    sweep's builds. Here the import waits until the send has returned (a hang before: 60 s is only its guard)."""
    released = tmp_path / "released"
    in_tracking_process(tmp_path / "hook", monkeypatch, f"""
        import os, sys, time
        class _HeldImport:
            def find_spec(self, name, path=None, target=None):
                if name == "qbench.track.tracker":
                    sys.meta_path.remove(self)
                    while not os.path.exists({str(released)!r}):
                        time.sleep(0.01)
                return None
        sys.meta_path.insert(0, _HeldImport())
    """)
    process = TrackingProcess(logging.INFO)
    sent: list[int] = []
    try:
        sender = threading.Thread(target=lambda: sent.append(process.send("settle", bytes(4 << 20))), daemon=True)
        sender.start()
        sender.join(timeout=60)
        assert sent, "the send waited for the tracking process to read it"
        released.touch()
        assert process.wait(sent[0]) is None and not process.busy and process.gone is None
    finally:
        released.touch()
        process.close()


def test_a_call_cut_short_by_the_sweeps_process_dying_ends_the_tracking_process_as_its_pipe_closing_does(
    tmp_path: Path,
) -> None:
    """The sweep's process killed while it writes a call (the opening's 220 KiB, a variant's results) leaves the bytes
    of part of it: the tracking process treats it as the pipe closing (ends the runs it has KILLED, exits 0). Before,
    it died of the read's error (OSError, exit 1) and left its runs RUNNING."""
    process = TrackingProcess(logging.INFO)
    header = (1 << 20).to_bytes(4, "big")  # a call of 1 MiB (multiprocessing's length prefix), of which 10 bytes come
    os.write(process._calls.fileno(), header + bytes(10))
    process._calls.close()
    assert process._process.wait(timeout=120) == 0


def test_the_supervised_commands_tracking_process_is_let_go_as_its_sweep_ends_and_waited_for_as_it_exits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The `qbench` command's process runs one sweep: its tracking process, kept idle for a next one, began its exit
    (MLflow's exit handlers) only once the command had printed its summary and exited, which waited for it."""
    parent = os.open(os.devnull, os.O_WRONLY)  # the channel to the supervising process (qbench.supervisor)
    monkeypatch.setattr(supervisor, "_channel", parent)
    try:
        process = TrackingProcess(logging.INFO)
        RemoteTracker(process).end()
        assert process not in process_module._idle and process.gone == "was let go"
        process_module._close_idle()  # as the command's process exits
        assert process._process.returncode == 0
    finally:
        os.close(parent)


def signal_after_the_first_variant(cwd: Path, monkeypatch: pytest.MonkeyPatch, signum: int) -> list[int]:
    """From `cwd`, a sweep's tracking process gets `signum` once it has logged the first finished variant; returns
    the list that then holds its pid."""
    monkeypatch.chdir(cwd)
    finished = _Progress.finished
    signalled: list[int] = []

    def then_signalled(self: _Progress, *args: object, **kwargs: bool) -> None:
        finished(self, *args, **kwargs)
        if not signalled:
            assert self.tracker is not None
            self.tracker.settle()
            [process] = tracking_processes(cwd)
            process.send_signal(signum)
            signalled.append(process.pid)

    monkeypatch.setattr(_Progress, "finished", then_signalled)
    return signalled


@pytest.mark.parametrize(
    ("signum", "how"),
    [(signal.SIGKILL, "killed (SIGKILL), often the out-of-memory killer"),
     (signal.SIGRTMIN + 1, f"killed by signal {signal.SIGRTMIN + 1}")],  # a signal Python's Signals does not name
)
def test_the_tracking_process_dying_costs_mlflow_not_the_measurements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], signum: int, how: str
) -> None:
    recipe = make_fp16_project(tmp_path)
    signal_after_the_first_variant(tmp_path, monkeypatch, signum)
    code = main(["sweep", str(recipe)])
    err = capsys.readouterr().err
    [run_dir] = (tmp_path / "reports" / "tumour-mlp").iterdir()
    assert code == 2
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert line == (f"error: MLflow tracking failed: its logging process died: {how}; the results are "
                    f"complete in {run_dir}, not in MLflow (log them there with `qbench track {recipe} {run_dir}`)")
    results = read_results(run_dir / "results.json")
    assert results.complete and [(v.variant, v.status) for v in results.variants] == [("fp32", "ok"), ("fp16", "ok")]
    assert main(["track", str(recipe), str(run_dir)]) == 0


def test_a_sigterm_reaching_the_tracking_process_leaves_the_runs_to_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM to the sweep's process group (a CI job's timeout) reaches the tracking process too: it ended there and
    then, the sweep's own handling could not end the runs (left RUNNING). It ignores SIGTERM, as it does SIGINT: the
    sweep decides, and here, signalled alone, the sweep goes on and every run ends FINISHED."""
    recipe = make_fp16_project(tmp_path)
    signalled = signal_after_the_first_variant(tmp_path, monkeypatch, signal.SIGTERM)
    assert main(["sweep", str(recipe)]) == 0
    [run_dir] = (tmp_path / "reports" / "tumour-mlp").iterdir()
    assert signalled and [p.pid for p in tracking_processes(tmp_path)] == signalled  # alive, idle for the next sweep
    assert runs_by_name(recipe) == {f"tumour-mlp sweep {run_dir.name}": "FINISHED", "fp32 · ort-cpu": "FINISHED",
                                    "fp16 · ort-cpu": "FINISHED"}  # fmt: skip


def test_an_unexpected_error_in_the_logging_ends_the_runs_failed_and_the_sweep_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, an error other than MLflow's or the OS's (a bug in what qbench logs) stopped the sweep itself."""
    recipe = make_fp16_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    in_tracking_process(tmp_path / "hook", monkeypatch, """
        import qbench.track.tracker
        logged = qbench.track.tracker.variant_params
        def broken(results, variant):
            if variant.variant == "fp16":
                raise TypeError("a value MLflow cannot take")
            return logged(results, variant)
        qbench.track.tracker.variant_params = broken
    """)
    code = main(["sweep", str(recipe)])
    err = capsys.readouterr().err
    [run_dir] = (tmp_path / "reports" / "tumour-mlp").iterdir()
    assert code == 2
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith("error: MLflow tracking failed: TypeError: a value MLflow cannot take; the results are "
                           f"complete in {run_dir}, not in MLflow")  # fmt: skip
    assert read_results(run_dir / "results.json").complete
    assert runs_by_name(recipe) == {f"tumour-mlp sweep {run_dir.name}": "FAILED", "fp32 · ort-cpu": "FINISHED",
                                    "fp16 · ort-cpu": "FAILED"}  # fmt: skip


def test_the_runs_of_a_sweep_whose_process_is_killed_are_ended_killed(tmp_path: Path) -> None:
    """SIGKILL (the out-of-memory killer) right after the first variant's result: nothing in the sweep's process
    can end its runs; the tracking process sees its pipe close and ends them KILLED. Before, they stayed RUNNING
    until a later sweep of the experiment found them."""
    recipe = make_fp16_project(tmp_path)
    raw = yaml.safe_load(recipe.read_text())
    raw["variants"].append({"name": "int8", "precision": "int8", "calibrator": "minmax"})
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "COLUMNS": "400"}
    done = run_signalled("qbench.sweep.runner:_Progress.finished", signal.SIGKILL, "sweep", str(recipe), env=env,
                         cwd=tmp_path)  # fmt: skip
    assert done.returncode == -signal.SIGKILL
    wait_until_gone(tmp_path)
    [run_dir] = (tmp_path / "reports" / "tumour-mlp").iterdir()
    assert runs_by_name(recipe) == {f"tumour-mlp sweep {run_dir.name}": "KILLED", "fp32 · ort-cpu": "FINISHED"}


def test_a_processs_sweeps_share_one_tracking_process_each_in_the_environment_it_has_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook's second sweep imports MLflow no more: the first one's tracking process, left idle, runs it, in
    the folder and environment the notebook has by then (MLFLOW_TRACKING_URI pointed at another store)."""
    from qbench.sweep.runner import run_sweep

    recipe = make_fp16_project(tmp_path)
    raw = yaml.safe_load(recipe.read_text())
    raw["tracking"] = {"uri": None, "experiment": "tumour-mlp"}  # the store $MLFLOW_TRACKING_URI names
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    stores = [f"sqlite:///{tmp_path / name}" for name in ("first.db", "second.db")]
    outcomes = []
    for store in stores:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
        outcomes.append(run_sweep(recipe))
        assert len(tracking_processes(tmp_path)) == 1  # the same one: its pid is checked below
    [process] = tracking_processes(tmp_path)
    assert process.create_time() < outcomes[0].results_path.stat().st_mtime
    for store, outcome in zip(stores, outcomes, strict=True):
        assert outcome.mlflow_run_id and outcome.tracking_failure is None
        client = MlflowClient(store)
        run = client.get_run(outcome.mlflow_run_id)
        assert run.info.status == "FINISHED" and len(client.search_runs([run.info.experiment_id])) == 3


def test_the_tracking_process_runs_its_exit_handlers_as_it_ends(tmp_path: Path) -> None:
    """It ends without the interpreter's teardown (which the sweep's process would wait for), but runs the exit
    handlers first, as an exit does: MLflow's (its telemetry, its temporary folders) and any other; here one the
    hook registers after MLflow's import, which writes the tracker's state as it runs."""
    recipe = make_fp16_project(tmp_path)
    marker = tmp_path / "exit_handler.json"
    hook = tracking_process_hook(tmp_path / "hook", f"""
        import atexit, json
        import qbench.track.tracker
        import qbench.track.worker as worker
        opened = worker._Session._open
        def remember(self, *args, **kwargs):
            opened(self, *args, **kwargs)
            atexit.register(lambda: open({str(marker)!r}, "w").write(json.dumps([self.ended,
                                                                                 self.tracker.parent_id])))
        worker._Session._open = remember
    """)
    env = {"PYTHONPATH": f"{hook}:{REPO}", "PATH": "/usr/bin:/bin", "COLUMNS": "400"}
    done = subprocess.run([sys.executable, "-m", "qbench.cli", "sweep", str(recipe)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    wait_until_gone(tmp_path)
    ended, parent = json.loads(marker.read_text())
    assert ended is True and f"MLflow run: {parent}" in done.stdout + done.stderr


def test_the_tracking_process_opens_its_store_uncollected_then_freezes_it(tmp_path: Path) -> None:
    """MLflow's import and the opening of its store make objects that live as long as the process: they are made
    without the garbage collector and then frozen out of its sight (qbench.startup), which collects again after."""
    recipe = make_fp16_project(tmp_path)
    marker = tmp_path / "collector.json"
    hook = tracking_process_hook(tmp_path / "hook", f"""
        import atexit, gc, json
        import qbench.track.tracker
        opened = qbench.track.tracker.SweepTracker.open.__func__
        during = []
        def observed(cls, *args, **kwargs):
            during.append(gc.isenabled())
            return opened(cls, *args, **kwargs)
        qbench.track.tracker.SweepTracker.open = classmethod(observed)
        atexit.register(lambda: open({str(marker)!r}, "w").write(json.dumps([during, gc.isenabled(),
                                                                             gc.get_freeze_count() > 0])))
    """)
    env = {"PYTHONPATH": f"{hook}:{REPO}", "PATH": "/usr/bin:/bin", "COLUMNS": "400"}
    done = subprocess.run([sys.executable, "-m", "qbench.cli", "sweep", str(recipe)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    wait_until_gone(tmp_path)
    during, after, frozen = json.loads(marker.read_text())
    assert (during, after, frozen) == ([False], True, True)
