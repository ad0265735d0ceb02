"""A process of its own runs its imports without the garbage collector, then freezes what they made; any other
process is left as it was. Each case runs in a fresh interpreter: a freeze here would hold pytest's objects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _state_around_block(own_process: bool, *, collector_on: bool = True, raising: bool = False) -> dict:
    """The collector's state inside and after `uncollected_setup(own_process)`, in a fresh interpreter."""
    code = f"""
import contextlib, gc, json
from qbench.startup import uncollected_setup
{'' if collector_on else 'gc.disable()'}
state = {{"frozen_before": gc.get_freeze_count()}}
with contextlib.suppress(RuntimeError), uncollected_setup({own_process}):
    state["on_inside"] = gc.isenabled()
    made = [[] for _ in range(1000)]
    if {raising}:
        raise RuntimeError("an import failed")
state["on_after"] = gc.isenabled()
state["frozen_after"] = gc.get_freeze_count()
print(json.dumps(state))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=True)  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.parametrize("raising", [False, True])
def test_its_own_process_imports_uncollected_then_freezes_and_collects_again(raising):
    state = _state_around_block(True, raising=raising)
    assert state["on_inside"] is False
    assert state["on_after"] is True
    assert state["frozen_after"] >= state["frozen_before"] + 1000  # the lists made within, at least


def test_a_process_that_goes_on_is_left_as_it_was():
    state = _state_around_block(False)
    assert (state["on_inside"], state["on_after"]) == (True, True)
    assert state["frozen_after"] == state["frozen_before"] == 0


def test_a_collector_switched_off_before_stays_off_and_nothing_is_frozen():
    state = _state_around_block(True, collector_on=False)
    assert (state["on_inside"], state["on_after"]) == (False, False)
    assert state["frozen_after"] == 0
