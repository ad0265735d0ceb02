"""The supervised child of the `qbench` script (qbench.supervisor): `python -m qbench.cli.child ARGS` runs `qbench ARGS`
(qbench.cli.app) and ends the process.

A sweep that logs to MLflow starts its logging process here, before the command line's imports (typer, rich, pandas,
ONNX Runtime): importing MLflow and opening its store in that process is the longest thing the sweep waits for before
its first timed run (qbench.track.process.prestart), and the sweep command itself could start it only 0.2 s later.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Sequence

from qbench.errors import QbenchError
from qbench.startup import uncollected_setup
from qbench.supervisor import end_child, start_child

_NOT_TRACKED = {"--plan", "--help"}  # options of `sweep` under which it logs nothing


def tracks_a_sweep(args: Sequence[str]) -> bool:
    """Whether `qbench ARGS` is a sweep that logs to MLflow, read from its words as the command line will: `sweep`
    first (`--debug` may come anywhere), neither --plan nor --help, and --track/--no-track as the last of them says. A
    wrong yes costs a logging process that ends unused; a wrong no, the 0.2 s this module saves."""
    words = [a for a in args if a != "--debug"]
    if not words or words[0] != "sweep" or _NOT_TRACKED.intersection(words):
        return False
    switches = [a for a in words if a in ("--track", "--no-track")]
    return not switches or switches[-1] == "--track"


if __name__ == "__main__":  # pragma: no cover - run by qbench.supervisor
    start_child()
    with uncollected_setup(own_process=True):  # this process ends with the command
        if tracks_a_sweep(sys.argv[1:]):
            from qbench.track.process import prestart

            # at the level the command's console will show (qbench.cli.app), not yet set up here; a process that
            # cannot start is the sweep's own one-line error when it starts one itself (exit 2), not a traceback here
            with contextlib.suppress(QbenchError):
                prestart(logging.DEBUG if "--debug" in sys.argv[1:] else logging.INFO)
        from qbench.cli.app import main

    end_child(main())
