"""The search's time budget: predictions from what each kind of step cost so far, the room kept for what must follow,
and which steps may start."""

from __future__ import annotations

import pytest

from qbench.results.search import CandidateRecord
from qbench.search.budget import EVALUATE, EVALUATE_BATCHED, SCREEN, TIMED_RUN, UNTIMED_SCREEN, Budget, build_kind
from qbench.search.retime import RETIME_ROUNDS


class Clock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def _budget(seconds: float = 100.0, finalists: int = 3) -> tuple[Budget, Clock]:
    clock = Clock()
    budget = Budget(seconds, clock, finalists)
    budget.seed(fp32_screen_s=2.0, fp32_selection_s=5.0, rows_per_screen_row=4.0)
    return budget, clock


def test_a_kind_is_predicted_by_its_longest_step_else_by_fp32s_measurements():
    budget, clock = _budget()
    assert budget.cost(EVALUATE) == 5.0 and budget.cost(SCREEN) == 4.0 and budget.cost(TIMED_RUN) == 2.0  # seeds
    for seconds in (3.0, 7.0, 4.0):
        with budget.timing(EVALUATE):
            clock.seconds += seconds
    assert budget.cost(EVALUATE) == 7.0  # measured: the seed no longer counts
    assert budget.cost("never measured") == 0.0


def test_an_untimed_screen_is_predicted_without_fp32s_timed_run_then_from_its_own_kind():
    """A reduce_range twin running its base's kernels is scored, not timed, and FP32 is not timed beside it: predicted
    as a timed screen it was refused for want of time it would not have taken."""
    budget, clock = _budget()
    for kind, seconds in ((build_kind("ort-dynamic"), 5.0), (SCREEN, 20.0), (TIMED_RUN, 6.0)):
        with budget.timing(kind):
            clock.seconds += seconds
    assert budget.screening_cost("ort-dynamic") == 25.0
    assert budget.screening_cost("ort-dynamic", timed=False) == 5.0 + 20.0 - 6.0
    with budget.timing(UNTIMED_SCREEN):
        clock.seconds += 9.0
    assert budget.screening_cost("ort-dynamic", timed=False) == 14.0 and budget.screening_cost("ort-dynamic") == 25.0


def test_an_evaluation_is_predicted_from_those_whose_rows_follow_their_batch_as_its_do():
    """A candidate whose rows follow their batch is run again as served: its 20 s evaluation predicted nothing of one
    whose rows do not (the seed, FP32's 5 s, until one such ran), which was refused for want of time."""
    budget, clock = _budget()
    with budget.timing(EVALUATE_BATCHED):
        clock.seconds += 20.0
    assert budget.evaluation_cost(False) == 5.0  # the seed: no independent candidate evaluated yet
    assert budget.evaluation_cost(True) == 20.0 and budget.evaluation_cost(None) == 20.0
    with budget.timing(EVALUATE):
        clock.seconds += 6.0
    assert budget.evaluation_cost(False) == 6.0
    assert budget.evaluation_cost(True) == 20.0  # the longest of either kind: never below what an independent took
    fresh, _ = _budget()
    assert fresh.evaluation_cost(True) == fresh.evaluation_cost(False) == 5.0  # nothing measured: FP32's


def test_without_selection_rows_an_evaluation_is_fp32s_screening_scaled_to_every_row():
    budget = Budget(100.0, Clock(), 3)
    budget.seed(fp32_screen_s=2.0, fp32_selection_s=None, rows_per_screen_row=4.0)
    assert budget.cost(EVALUATE) == 8.0


def test_a_technique_never_built_is_predicted_by_the_longest_build_so_far():
    budget, _ = _budget()
    assert budget.build_cost("ort-static") == 0.0
    budget.add(build_kind("ort-dynamic"), 3.0)
    budget.add(build_kind("smoothquant-static"), 12.0)
    budget.add(build_kind("ort-dynamic"), 4.0)
    assert budget.build_cost("ort-dynamic") == 4.0 and budget.build_cost("ort-static") == 12.0
    assert budget.screening_cost("ort-static") == 12.0 + 4.0  # and the screening (seeded: twice FP32's)


def test_the_reserve_holds_the_finalists_retiming_and_the_closests_evaluation():
    """Nothing passed and the closest was only screened: 3 rounds of FP32 and one finalist (2 s a timed run), and the
    closest's evaluation (5 s), unless the step is that evaluation. Two passed: 3 rounds of FP32 and three finalists."""
    budget, _ = _budget()
    screened = [CandidateRecord("a", "ort-dynamic", stage="screened", screen_excess=2.0, screen_drop=0.1),
                CandidateRecord("b", "ort-static", stage="screened", screen_excess=0.5, screen_drop=0.01)]  # fmt: skip
    assert budget.reserve(screened) == RETIME_ROUNDS * 2 * 2.0 + 5.0
    assert budget.reserve(screened, evaluating=1) == RETIME_ROUNDS * 2 * 2.0  # b is the closest
    assert budget.reserve(screened, evaluating=0) == RETIME_ROUNDS * 2 * 2.0 + 5.0
    passed = [CandidateRecord(label, "ort-dynamic", stage="evaluated", excess=0.5, passed=True) for label in "ab"]
    assert budget.reserve(passed) == RETIME_ROUNDS * 4 * 2.0


@pytest.mark.parametrize(("elapsed", "started"), [(80.0, True), (81.0, False)])
def test_a_step_starts_only_when_it_and_the_reserve_end_within_the_budget(elapsed, started):
    budget, clock = _budget()
    clock.seconds = elapsed
    why = budget.start("screening x", 15.0, 5.0)
    assert (why is None) is started and budget.exhausted is not started
    if not started:
        assert why == "predicted to end past the time budget (20.0 s of 19.0 s left)"
    assert [s.what for s in budget.steps] == (["screening x"] if started else [])


def test_a_forced_step_starts_past_the_budget_and_a_spent_budget_says_so():
    budget, clock = _budget(10.0)
    clock.seconds = 12.0
    assert budget.start("screening x", 3.0) == "time budget spent"
    assert budget.start("re-timing", 3.0, forced=True) is None
    assert budget.steps[-1].what == "re-timing" and budget.steps[-1].at == 12.0


def test_until_a_candidate_is_measured_every_step_starts():
    budget, clock = _budget(10.0)
    clock.seconds = 12.0
    unmeasured = [CandidateRecord("a", "ort-dynamic", stage="failed", verdict="build failed")]
    assert budget.refusal("screening b", 3.0, unmeasured) is None
    measured = [CandidateRecord("a", "ort-dynamic", stage="screened", screen_excess=2.0, screen_drop=0.1)]
    assert budget.refusal("screening b", 3.0, measured) == "time budget spent"


def test_a_step_refused_again_is_warned_about_once(caplog):
    """Each evaluation pass asks again for a candidate the budget refused: the warning names it once, and another
    step's refusal is still said."""
    budget, clock = _budget(10.0)
    clock.seconds = 12.0
    measured = [CandidateRecord("a", "ort-dynamic", stage="screened", screen_excess=2.0, screen_drop=0.1)]
    with caplog.at_level("WARNING", logger="qbench.search.budget"):
        for _ in range(3):
            assert budget.refusal("evaluating b", 3.0, measured) == "time budget spent"
        assert budget.refusal("evaluating c", 3.0, measured) == "time budget spent"
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [m for m in warned if "evaluating b skipped" in m] == [warned[0]]
    assert len(warned) == 2 and "evaluating c skipped" in warned[1]
