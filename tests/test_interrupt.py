"""SignalGuard: a signal becomes Interrupted at once, at the end of a shielded block, or, when it lands in the
runtime's locking code, 50 ms later (an exception there would leave a lock held and hang the clean-up)."""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import pytest

from qbench.interrupt import Interrupted, SignalGuard


def _frame_in(filename: str) -> SimpleNamespace:
    return SimpleNamespace(f_code=SimpleNamespace(co_filename=filename))


def _wait_for_signal(seconds: float = 1.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.005)


def test_a_signal_raises_interrupted_at_once_and_the_handlers_are_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted, match="interrupted by SIGTERM"), SignalGuard():
        os.kill(os.getpid(), signal.SIGTERM)
        _wait_for_signal()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_shielded_block_finishes_before_the_signal_is_raised() -> None:
    finished = []
    with pytest.raises(Interrupted), SignalGuard() as guard:
        with guard.shielded():
            os.kill(os.getpid(), signal.SIGINT)
            _wait_for_signal(0.1)
            finished.append(True)
    assert finished == [True]


@pytest.mark.parametrize("where", ["<frozen importlib._bootstrap>", f"{os.sep}usr{os.sep}lib{os.sep}threading.py",
                                   os.path.join("lib", "logging", "__init__.py")])  # fmt: skip
def test_a_signal_in_locking_code_is_raised_again_once_outside_it(where: str) -> None:
    with SignalGuard() as guard:
        guard._handle(signal.SIGTERM, _frame_in(where))  # type: ignore[arg-type]  # what the handler would see
        with pytest.raises(Interrupted, match="SIGTERM"):
            # SIGALRM re-raises it here, in this test's own code, 50 ms on; the wait only ends the test when it never
            # comes (a bound on how soon it came would rest on how soon a loaded machine runs this process)
            _wait_for_signal(60.0)


def test_a_held_back_signal_is_dropped_once_the_clean_up_ignores_signals() -> None:
    with SignalGuard() as guard:
        guard._handle(signal.SIGTERM, _frame_in("<frozen importlib._bootstrap>"))  # type: ignore[arg-type]
        guard.ignore()
        _wait_for_signal(0.2)  # no Interrupted: the clean-up runs to its end


def test_a_stopped_process_group_ends_without_a_traceback_from_each_worker(tmp_path, capfd) -> None:
    """Ctrl+C on `qbench ui` passed SIGINT to the UI's process group: each Python worker raised KeyboardInterrupt and
    printed a traceback (eight, from MLflow's job consumers still importing). The group is stopped with SIGTERM."""
    import sys
    import threading

    from qbench.interrupt import run_process_group

    ready = tmp_path / "ready"
    worker = "import time; time.sleep(60)"
    server = (f"import pathlib, subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {worker!r}]); "
              f"time.sleep(0.5); pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")  # fmt: skip

    def interrupt_once_started() -> None:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_started, daemon=True).start()
    assert run_process_group([sys.executable, "-c", server]) is None  # stopped by its user
    said = capfd.readouterr().err
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
