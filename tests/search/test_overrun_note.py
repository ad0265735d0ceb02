"""A search that ends past its time budget says by how much and which steps ran past it (the budget stops new steps,
not one already started)."""

from __future__ import annotations

from qbench.search.outcome import overrun_note

STEPS = [(0.0, "measuring FP32"), (12.5, "screening ort-dynamic"), (41.0, "evaluating smoothquant-static a=auto")]


def test_a_search_within_its_budget_says_nothing_of_it() -> None:
    assert overrun_note(STEPS, 59.9, 60.0) == ()


def test_a_search_past_its_budget_names_the_last_step_started_before_it_ran_out() -> None:
    (note,) = overrun_note(STEPS, 68.9, 60.0)
    assert note == ("the search took 68.9 s, 8.9 s past its 60 s time budget (it stops new steps, not one already "
                    "started): evaluating smoothquant-static a=auto, started at 41.0 s, ran to its end")  # fmt: skip


def test_steps_the_rules_start_after_the_budget_are_named_too() -> None:
    """A budget spent while FP32 was measured: the first candidate still runs (until one is measured), and the
    finalists are re-timed."""
    steps = [(0.0, "measuring FP32"), (3.0, "screening ort-dynamic"), (9.0, "re-timing the finalists beside FP32")]
    (note,) = overrun_note(steps, 14.0, 1.0)
    assert note.endswith("measuring FP32, started at 0.0 s, ran to its end; then past it: screening ort-dynamic; "
                         "re-timing the finalists beside FP32")  # fmt: skip
