"""What the INT8 search says of how it measured its candidates (the method note), and the pick it keeps under the
search's name: functions of the figures and files qbench.search.run hands them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from qbench.gate.resolution import PASS_UNRESOLVED
from qbench.results.search import CandidateRecord
from qbench.search import select
from qbench.variants import BuiltVariant


def method_note(*, screened: int, rows: int, on_selection: bool, timing_runs: int, noise: float, tie: float,
                retime_count: int, retimed_late: bool) -> str:  # fmt: skip
    """How candidates were screened and timed: `screened` of `rows` rows, `timing_runs` per batch size against an FP32
    whose own timings put an estimate's `noise` at that, `tie` the margin within which slower candidates were still
    evaluated, and how the finalists were re-timed (`retime_count` rounds, 0 where none passed; `retimed_late`: past
    the time budget)."""
    kind = "selection" if on_selection else "evaluation"
    if not retime_count:  # "medians of 3 rounds" was said where none ran
        retimed = "no finalist re-timed: none passed"
    else:
        late = ", run past the time budget" if retimed_late else ""
        retimed = f"finalists: medians of {retime_count} interleaved rounds{late}"
    return (f"screening on {screened} of {rows} {kind} rows; speed-ups "
            f"from {timing_runs} timed runs per batch size, each candidate against FP32 timed right after it "
            f"(FP32's own timings put the noise of an estimate at {noise:.0%}, so candidates screened within "
            f"{tie:.0%} of a faster passing one were still evaluated; {retimed}); full evaluations went fastest first, "
            f"a screen only near the gate after those clearing it within {tie:.0%} of its speed; passing candidates "
            f"within {select.TIE:.0%} of the fastest are a tie, won by the larger accuracy margin (the smaller largest "
            "drop / tolerance), then fewer float nodes, then the one tried first")  # fmt: skip


def kept_pick(built: BuiltVariant, record: CandidateRecord, *, name: str, root: Path, passed: bool, on_selection: bool,
              chosen_on: str, tie: float, seconds: float) -> BuiltVariant:  # fmt: skip
    """The picked candidate `built` (its `record`) with its files moved to <root's parent>/<name>.* and named after the
    search (only files of the search's own folder `root` move: a candidate never measured is never picked, but a file
    of the user's stays put); `passed`: chosen, not only the closest."""
    target = built.onnx_path
    if built.owned_by(root):
        target = root.parent / f"{name}.onnx"
        for path in built.onnx_path.parent.iterdir():
            path.replace(target.parent / path.name.replace(built.onnx_path.stem, name, 1))
    params = {**built.params, "search.technique": record.technique, "search.candidate": record.label,
              "search.outcome": "passed" if passed else PASS_UNRESOLVED if record.passed else "tolerance unreachable",
              "search.chosen_on": "selection" if on_selection else "evaluation"}  # fmt: skip
    none = "no candidate's pass was resolved on the selection rows" if record.passed else "no candidate passed"
    note = f"found by the INT8 search: {record.label}" if passed else f"INT8 search: {none}; closest: {record.label}"
    note = f"{note} ({chosen_on})"
    slower = select.slower_than_reference(record, tie) if passed else None
    note = f"{note}; {slower}" if slower else note
    return dataclasses.replace(built, name=name, onnx_path=target, params=params, notes=(*built.notes, note),
                               build_seconds=seconds)  # fmt: skip
