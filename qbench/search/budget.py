"""The INT8 search's time budget: what each kind of step cost so far in this search, whether a step predicted from
those figures ends within the budget with room left for what must run after it, and what ran past it.

    budget = Budget(spec.time_budget_s, now, spec.finalists)
    why = budget.refusal("evaluating x", budget.evaluation_cost(False), records)  # None: it started; else why not
    with budget.timing(EVALUATE):                                                # the seconds it took, by kind
        ...

A step already started runs to its end, so the budget bounds the search's end only through the predictions: each step
starts only when its predicted seconds plus the `reserve` (the finalists' re-timing rounds, the pick's evaluation)
fit in what is left. A kind's predicted cost is the longest it took so far in this search (on a loaded machine the
load changes over a search: the longest is the one most likely to hold again), seeded by FP32's measurements at the
search's start. The budget used to stop only new steps, and a step started just before it ran out ran to its end:
the MiniLM demo's search took 68.9 s of its 60 s budget (163.7 s under load). Steps the search's rules force
(`start(..., forced=True)`: until a candidate is measured, the finalists' first re-timing rounds, the pick's
evaluation) run whatever the prediction, and a search past its budget says so (`overrun_note`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from qbench.results.search import CandidateRecord
from qbench.search import select
from qbench.search.retime import RETIME_ROUNDS

EVALUATE = "evaluate"  # a candidate run on every selection row and judged, its rows independent of their batch
EVALUATE_BATCHED = "evaluate, rows following their batch"  # ...its rows also judged as served: more runs
SCREEN = "screen"  # a built candidate measured on the screening rows, then FP32 timed again beside it
UNTIMED_SCREEN = "screen, untimed"  # ...scored only: a reduce_range twin running its timed base's kernels
TIMED_RUN = "timed run"  # one model's timed runs on the screening rows, unscored: a re-timing round holds one per model
RANKING = "ranking"  # the per-layer noise of a static build on the screening rows (keep-float candidates)

logger = logging.getLogger(__name__)


def build_kind(technique: str) -> str:
    """The cost kind of building a candidate of `technique` (calibrated techniques take longer than dynamic ones)."""
    return f"build {technique}"


@dataclass(frozen=True)
class Step:
    at: float  # seconds into the search when it started
    what: str
    predicted: float | None  # the seconds it was predicted to take (None: nothing measured yet to predict it from)


@dataclass
class Budget:
    seconds: float  # the recipe's time_budget_s
    now: Callable[[], float]
    finalists: int  # the recipe's search.finalists: how many passing candidates are re-timed
    started: float = field(init=False)
    costs: dict[str, list[float]] = field(default_factory=dict)  # seconds each step of a kind took
    seeds: dict[str, float] = field(default_factory=dict)  # a kind's prediction until one is measured
    steps: list[Step] = field(default_factory=list)  # in the order they started
    exhausted: bool = False  # some step was not started for want of time
    refused: set[str] = field(default_factory=set)  # steps a warning said were skipped (each is said once)

    def __post_init__(self) -> None:
        self.started = self.now()

    def elapsed(self) -> float:
        return self.now() - self.started

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def spent(self) -> bool:
        return self.left() <= 0

    def add(self, kind: str, seconds: float) -> None:
        self.costs.setdefault(kind, []).append(seconds)

    @contextmanager
    def timing(self, kind: str | Callable[[], str]) -> Iterator[None]:
        """Record the seconds the block took as one step of `kind` (also when it raised: the time was spent); `kind`
        may be a function asked when the block ends, for a step whose kind its outcome tells."""
        began = self.now()
        try:
            yield
        finally:
            self.add(kind if isinstance(kind, str) else kind(), self.now() - began)

    def seed(self, fp32_screen_s: float, fp32_selection_s: float | None, rows_per_screen_row: float) -> None:
        """Predictions until each kind of step is measured, from FP32's measurements at the search's start: a full
        evaluation is FP32's on the selection rows (without them, FP32 scored and timed on the screening rows,
        `fp32_screen_s`, scaled to every row); a screening is a candidate measured as FP32 was there, then FP32 timed
        again; a re-timing round's timed runs are each as long as FP32's there."""
        evaluation = fp32_selection_s if fp32_selection_s is not None else fp32_screen_s * rows_per_screen_row
        self.seeds.update({EVALUATE: evaluation, SCREEN: 2 * fp32_screen_s, TIMED_RUN: fp32_screen_s})

    def cost(self, kind: str) -> float:
        """A step of `kind` predicted: the longest one took so far, else its seed, else 0 (nothing to predict from)."""
        return max(self.costs[kind]) if self.costs.get(kind) else self.seeds.get(kind, 0.0)

    def evaluation_cost(self, follows_batch: bool | None) -> float:
        """A full evaluation predicted from the longest so far of a candidate whose rows, as its screen saw them,
        follow their batch as this one's do (`follows_batch`; None: not known): one whose rows follow their batch is
        run again in the batches a server forms (qbench.validate.batch_mix), which one whose rows do not never is, so
        the longest evaluation of either kind (as a first one: FP32's, the seed) overstated the other's. In the MiniLM
        demo SmoothQuant dynamic's evaluation (rows following their batch) took 20 s; SmoothQuant static (screened
        faster and independent of its batch) was refused for want of 3.5 s though an evaluation like FP32's fits."""
        independent = self.costs.get(EVALUATE, [])
        if follows_batch is False:
            return max(independent) if independent else self.seeds.get(EVALUATE, 0.0)
        return max([*independent, *self.costs.get(EVALUATE_BATCHED, [])], default=self.seeds.get(EVALUATE, 0.0))

    def build_cost(self, technique: str) -> float:
        """Building a candidate of `technique`: the longest such build so far, else the longest build of any
        technique (a technique not built yet), else 0."""
        if self.costs.get(build_kind(technique)):
            return self.cost(build_kind(technique))
        return max((max(seconds) for kind, seconds in self.costs.items() if kind.startswith("build ")), default=0.0)

    def retime_cost(self, finalists: int, rounds: int) -> float:
        """`rounds` interleaved re-timing rounds of `finalists` candidates and FP32, one model's timed runs each."""
        return rounds * (finalists + 1) * self.cost(TIMED_RUN)

    def screening_cost(self, technique: str, *, timed: bool = True) -> float:
        """Building and screening a candidate of `technique`; `timed=False`: one scored but not timed (a reduce_range
        twin running its base's kernels), predicted from such screens, else from a timed one less FP32's timed run."""
        if timed:
            return self.build_cost(technique) + self.cost(SCREEN)
        untimed = self.costs.get(UNTIMED_SCREEN)
        return self.build_cost(technique) + (max(untimed) if untimed
                                             else max(self.cost(SCREEN) - self.cost(TIMED_RUN), 0.0))

    def reserve(self, records: Sequence[CandidateRecord], evaluating: int | None = None) -> float:
        """What must still run after a step: the finalists' first re-timing rounds (one finalist more than pass now:
        the step may add one), and while none passed, the closest's evaluation when it was only screened (the kept
        pick's figures come from every row), unless the step is that evaluation (`evaluating`)."""
        passing = select.passing(records)
        seconds = self.retime_cost(min(self.finalists, len(passing) + 1), RETIME_ROUNDS)
        closest = select.closest(records)
        if not passing and closest != evaluating and (closest is None or not records[closest].evaluated):
            seconds += self.evaluation_cost(None)
        return seconds

    def refusal(self, what: str, predicted: float, records: Sequence[CandidateRecord], *,
                evaluating: int | None = None, forced: bool = False) -> str | None:  # fmt: skip
        """Why step `what` of a search holding `records` may not start now, or None when it started: it must end
        within the budget with the `reserve` left, unless `forced`. Until a candidate that could be kept is measured,
        every step starts (so even a tiny budget yields a variant: with only the first allowed, a first candidate that
        failed to build left every other 'not tried' and the search without a variant)."""
        forced = forced or select.closest(records) is None
        why = self.start(what, predicted, self.reserve(records, evaluating), forced=forced)
        if why is not None:  # a later stage asks again for the same step (each evaluation pass): said once
            level = logging.DEBUG if what in self.refused else logging.WARNING
            logger.log(level, f"  time budget of {self.seconds:g} s: {what} skipped, {why}")
            self.refused.add(what)
        return why

    def start_retiming(self, finalists: int) -> None:
        """The finalists' first RETIME_ROUNDS re-timing rounds start whatever the prediction (a pick's speed-up is never
        its one screening estimate); when predicted to end past the budget, a warning says so."""
        predicted = self.retime_cost(finalists, RETIME_ROUNDS)
        if predicted > self.left():  # no room for more than RETIME_ROUNDS either (`room`)
            self.exhausted = True
            logger.warning(f"  time budget of {self.seconds:g} s: {max(self.left(), 0):.1f} s left, {predicted:.1f} s "
                           f"predicted for re-timing the passing candidates: they are re-timed anyway, {RETIME_ROUNDS} "
                           "rounds beside FP32, so that the pick does not rest on one screening estimate")  # fmt: skip
        self.start("re-timing the finalists beside FP32", predicted, forced=True)

    def room(self, seconds: float) -> bool:
        """Whether `seconds` more (another re-timing round as long as the longest) end within the budget."""
        return seconds <= self.left()

    def start(self, what: str, predicted: float | None, reserve: float = 0.0, *, forced: bool = False) -> str | None:
        """Start a step predicted to take `predicted` seconds (None: nothing to predict it from), then leave `reserve`
        for what must still run: None when it started (recorded for `overrun_note`), else why not (the step is skipped
        and the budget said exhausted). A `forced` step starts whatever the prediction."""
        left, needed = self.left(), (predicted or 0.0) + reserve
        if forced or (left > 0 and needed <= left):
            self.steps.append(Step(self.elapsed(), what, predicted))
            return None
        self.exhausted = True
        if left <= 0:
            return "time budget spent"
        return f"predicted to end past the time budget ({needed:.1f} s of {left:.1f} s left)"

    def overrun_note(self) -> tuple[str, ...]:
        """What ran past the budget when the search took longer: the last step started before it ran out, with the
        seconds it was predicted to take (a prediction the step outran: the machine's load rose, or a kind of step
        measured once took longer the next time), and the steps the search's rules started after it."""
        seconds = self.elapsed()
        if seconds <= self.seconds:
            return ()
        began = [s for s in self.steps if s.at < self.seconds][-1:]
        said = [f"{s.what}, started at {s.at:.1f} s{_predicted(s)}, ran to its end" for s in began]
        late = [s.what for s in self.steps if s.at >= self.seconds]
        past = [*said, *([f"then past it, as the search's rules require: {'; '.join(late)}"] if late else [])]
        return (f"the search took {seconds:.1f} s, {seconds - self.seconds:.1f} s past its {self.seconds:g} s time "
                f"budget (a step starts only when predicted to end within it, but runs to its end once started): "
                f"{'; '.join(past)}",)  # fmt: skip


def _predicted(step: Step) -> str:
    return f" (predicted to take {step.predicted:.1f} s)" if step.predicted is not None else ""
