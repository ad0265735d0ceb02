"""A search that ends past its time budget says by how much and which steps ran past it (a started step runs to its
end; the search's rules start some steps whatever the budget)."""

from __future__ import annotations

from qbench.search.budget import Budget


class Clock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def _budget(steps: list[tuple[float, str, float | None, bool]], seconds: float, budget_s: float) -> Budget:
    """A budget of `budget_s` whose search started `steps` (at, what, predicted, forced) and ended at `seconds`."""
    clock = Clock()
    budget = Budget(budget_s, clock, finalists=3)
    for at, what, predicted, forced in steps:
        clock.seconds = at
        budget.start(what, predicted, forced=forced)
    clock.seconds = seconds
    return budget


STEPS = [(0.0, "measuring FP32", None, True), (12.5, "screening ort-dynamic", 9.0, False),
         (41.0, "evaluating smoothquant-static a=auto", 10.0, False)]  # fmt: skip


def test_a_search_within_its_budget_says_nothing_of_it() -> None:
    assert _budget(STEPS, 59.9, 60.0).overrun_note() == ()


def test_a_search_past_its_budget_names_the_last_step_started_before_it_ran_out_and_its_prediction() -> None:
    (note,) = _budget(STEPS, 68.9, 60.0).overrun_note()
    assert note == ("the search took 68.9 s, 8.9 s past its 60 s time budget (a step starts only when predicted to end "
                    "within it, but runs to its end once started): evaluating smoothquant-static a=auto, started at "
                    "41.0 s (predicted to take 10.0 s), ran to its end")  # fmt: skip


def test_steps_the_rules_start_after_the_budget_are_named_too() -> None:
    """A budget spent while FP32 was measured: the first candidate still runs (until one is measured), and the
    finalists are re-timed."""
    steps = [(0.0, "measuring FP32", None, True), (3.0, "screening ort-dynamic", 0.0, True),
             (9.0, "re-timing the finalists beside FP32", 1.5, True)]  # fmt: skip
    (note,) = _budget(steps, 14.0, 1.0).overrun_note()
    assert note.endswith("measuring FP32, started at 0.0 s, ran to its end; then past it, as the search's rules "
                         "require: screening ort-dynamic; re-timing the finalists beside FP32")  # fmt: skip
