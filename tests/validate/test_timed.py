"""Timed regions and background steps take turns (qbench.validate.timed)."""

from __future__ import annotations

import threading
import time

import pytest

from qbench.validate.timed import TimedRegions

SETTLE_S = 0.2  # long enough for a thread that could go on to have done so


def _in_thread(target: object) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)  # type: ignore[arg-type]
    thread.start()
    return thread


def test_a_timed_region_waits_for_the_background_step_under_way_and_counts_the_wait() -> None:
    regions = TimedRegions()
    inside, release, order = threading.Event(), threading.Event(), []

    def background() -> None:
        with regions.background():
            inside.set()
            release.wait(5)
            order.append("background ended")

    def timed() -> None:
        with regions.timed():
            order.append("timed")

    writer = _in_thread(background)
    assert inside.wait(5)
    timer = _in_thread(timed)
    time.sleep(SETTLE_S)
    assert order == []  # the timed region has not started while the step runs
    release.set()
    writer.join(5), timer.join(5)
    assert order == ["background ended", "timed"]
    assert SETTLE_S * 0.9 <= regions.waited_s < 5


def test_no_background_step_starts_while_a_timed_region_is_open() -> None:
    regions = TimedRegions()
    ran = threading.Event()

    def background() -> None:
        with regions.background():
            ran.set()

    with regions.timed():
        writer = _in_thread(background)
        time.sleep(SETTLE_S)
        assert not ran.is_set()
    assert ran.wait(5)
    writer.join(5)
    assert regions.waited_s == 0.0  # nothing was under way when timing started


def test_timed_regions_do_not_wait_for_each_other() -> None:
    regions = TimedRegions()
    with regions.timed():
        done = threading.Event()

        def nested_elsewhere() -> None:
            with regions.timed():
                done.set()

        _in_thread(nested_elsewhere).join(5)
        assert done.is_set()


def test_a_timed_region_interrupted_while_waiting_does_not_hold_background_work_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl+C while timing waits for a step: the sweep's clean-up then drains the writer, which must still run."""
    regions = TimedRegions()
    release, ran_after = threading.Event(), threading.Event()

    def background() -> None:
        with regions.background():
            release.wait(5)

    writer = _in_thread(background)
    time.sleep(SETTLE_S)
    waiting = regions._condition.wait_for

    def interrupted(*args: object, **kwargs: object) -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr(regions._condition, "wait_for", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with regions.timed():
            pass
    monkeypatch.setattr(regions._condition, "wait_for", waiting)
    release.set()
    writer.join(5)

    def later_step() -> None:
        with regions.background():
            ran_after.set()

    _in_thread(later_step)
    assert ran_after.wait(5)
