"""PhaseClock's accounting, on a clock that reads set times."""

from __future__ import annotations

import itertools

import pytest

from qbench.validate import clock as clock_module
from qbench.validate.clock import PhaseClock


def test_time_within_a_nested_phase_is_that_phases_and_the_enclosing_phase_leaves_it_out(monkeypatch):
    # perf_counter reads: inference starts at 0, the simulation runs from 2 to 5, inference ends at 10
    reads = iter([2.0, 5.0, 10.0])
    monkeypatch.setattr(clock_module.time, "perf_counter", lambda: next(reads))
    clock = PhaseClock()
    carved = clock.carved
    with clock.within("simulation"):
        pass
    clock.add("inference", 0.0, less=clock.carved - carved)
    assert clock.seconds == {"simulation": 3.0, "inference": 7.0}
    assert clock.carved == 3.0


def test_phases_add_up_over_calls_and_merge_adds_another_clocks(monkeypatch):
    ticks = itertools.count(start=1.0, step=1.0)
    monkeypatch.setattr(clock_module.time, "perf_counter", lambda: next(ticks))
    clock = PhaseClock()
    clock.add("build", 0.0)  # read 1: 1 s
    clock.add("build", 0.5)  # read 2: 1.5 s
    clock.merge({"build": 0.25, "report": 2.0})
    assert clock.seconds == pytest.approx({"build": 2.75, "report": 2.0})
