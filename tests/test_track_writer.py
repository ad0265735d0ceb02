"""The sweep's MLflow writes run in order on their own thread, never inside a timed region (qbench.track_writer)."""

from __future__ import annotations

import threading
import time

import pytest

from qbench.track_writer import BackgroundWriter
from qbench.validate.timed import timed_region


def test_calls_run_in_order_on_another_thread_and_drain_waits_for_them() -> None:
    writer = BackgroundWriter()
    seen: list[tuple[int, str]] = []
    for i in range(5):
        writer.submit(lambda i=i: (time.sleep(0.01), seen.append((i, threading.current_thread().name))))
    writer.drain()
    assert [i for i, _ in seen] == [0, 1, 2, 3, 4]
    assert {name for _, name in seen} == {"qbench-mlflow"}
    writer.close()


def test_an_exception_is_raised_by_drain_and_the_calls_after_it_are_skipped() -> None:
    writer = BackgroundWriter()
    ran: list[str] = []
    writer.submit(lambda: ran.append("first"))
    writer.submit(lambda: 1 / 0)
    writer.submit(lambda: ran.append("after the error"))
    with pytest.raises(ZeroDivisionError):
        writer.drain()
    assert ran == ["first"]
    writer.submit(lambda: ran.append("once drained"))  # the owner saw the error: later calls run again
    writer.close()
    assert ran == ["first", "once drained"]
    writer.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit(lambda: None)


def test_no_call_runs_inside_a_timed_region() -> None:
    writer = BackgroundWriter()
    ran = threading.Event()
    with timed_region():
        writer.submit(ran.set)
        time.sleep(0.2)
        assert not ran.is_set()
    writer.close()
    assert ran.is_set()


def test_an_inline_writer_runs_each_call_at_once_in_the_callers_thread_and_raises_there() -> None:
    writer = BackgroundWriter(inline=True)
    seen: list[str] = []
    writer.submit(lambda: seen.append(threading.current_thread().name))
    assert seen == [threading.current_thread().name]
    with pytest.raises(ZeroDivisionError):
        writer.submit(lambda: 1 / 0)
    writer.close()
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit(lambda: None)
