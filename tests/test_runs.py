"""Run folders: the marker a sweep leaves while it runs, and what the gate makes of an unfinished run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from qbench.runs import (
    INCOMPLETE_MARKER,
    RUN_FOLDER_NAME,
    describe_run,
    new_run_dir,
    of_another_checkout,
    where_now,
)


def _ended_pid() -> int:
    """The pid of a process that has already ended (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_a_running_marker_of_this_process_is_running_and_one_whose_process_is_gone_says_killed(tmp_path: Path) -> None:
    folder = new_run_dir(tmp_path)
    marker = json.loads((folder / INCOMPLETE_MARKER).read_text())
    assert (marker["pid"], marker["host"], marker["state"]) == (os.getpid(), socket.gethostname(), "running")
    assert describe_run(folder).state == "running"
    pid = _ended_pid()
    (folder / INCOMPLETE_MARKER).write_text(json.dumps({**marker, "pid": pid}))
    assert describe_run(folder).state == f"killed: its sweep (pid {pid}) ended without finishing"
    # another host's sweep cannot be checked from here: its marker is believed
    (folder / INCOMPLETE_MARKER).write_text(json.dumps({**marker, "pid": pid, "host": "elsewhere.invalid"}))
    assert describe_run(folder).state == "running"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
def test_a_sweep_whose_process_ended_unreaped_says_killed(tmp_path: Path) -> None:
    """A killed sweep's process stays a zombie where nothing reaps it (its parent killed too, in a container whose
    first process reaps nothing): its pid still answered signals, so the gate said 'running: wait for it to finish'
    for a run that never would."""
    folder = new_run_dir(tmp_path)
    marker = json.loads((folder / INCOMPLETE_MARKER).read_text())
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while Path(f"/proc/{ended.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            pass  # ended, not reaped: a zombie
        (folder / INCOMPLETE_MARKER).write_text(json.dumps({**marker, "pid": ended.pid}))
        assert describe_run(folder).state == f"killed: its sweep (pid {ended.pid}) ended without finishing"
    finally:
        ended.wait()


def test_a_run_folder_that_cannot_be_made_is_one_clear_error(tmp_path: Path) -> None:
    from qbench.errors import QbenchError

    blocker = tmp_path / "reports"
    blocker.write_text("a file where the recipe's output_dir should be")
    with pytest.raises(QbenchError, match=r"cannot create the run folder .*reports/digits/.*; expected output_dir"):
        new_run_dir(blocker / "digits")


def test_a_file_of_a_run_folder_is_found_where_the_run_folder_is_now(tmp_path: Path) -> None:
    run = tmp_path / "checkout" / "reports" / "demo" / "20261129-060441-5ae27d"
    recorded = "/home/runner/work/reports/demo/20261129-060441-5ae27d/models/int8.onnx"
    assert where_now(recorded, run) == str(run / "models" / "int8.onnx")
    cached = "/root/.cache/qbench/builds/sources/ab12/model.onnx"  # a build store's copy: no run folder's file
    assert where_now(cached, run) == cached
    assert where_now(recorded, tmp_path / "reports") == recorded  # results.json copied out of its run folder alone
    assert RUN_FOLDER_NAME.fullmatch(new_run_dir(tmp_path / "demo").name)  # the names the rule recognises are a sweep's


def test_a_run_written_in_place_by_another_checkout_still_here_is_that_checkouts(tmp_path: Path) -> None:
    mine, theirs = tmp_path / "a" / "recipe.yaml", tmp_path / "b" / "recipe.yaml"
    for recipe in (mine, theirs):
        recipe.parent.mkdir()
        recipe.write_text("name: demo\n")
    run = describe_run(new_run_dir(tmp_path / "shared" / "demo", theirs))
    assert run is not None and run.written_by == theirs
    assert of_another_checkout(run, mine) and not of_another_checkout(run, theirs)
    link = tmp_path / "link.yaml"
    link.symlink_to(theirs)
    assert not of_another_checkout(run, link)  # the same file, named through a link
    beside = theirs.with_name("strict.yaml")  # another recipe file of that project: the gate compares its sections
    beside.write_text("name: demo\n")
    assert not of_another_checkout(run, beside)

    moved = tmp_path / "downloaded" / run.path.name  # a CI artifact: the folder is not where its sweep wrote it
    moved.parent.mkdir()
    run.path.rename(moved)
    assert describe_run(moved).written_by is None
    theirs.unlink()  # the other checkout is gone: its runs may be this recipe's (the gate checks their inputs)
    assert not of_another_checkout(run, mine)
