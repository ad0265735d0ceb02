"""The INT8 search: the fastest candidate that passes the gate, overall and on every slice, within a time budget.

    outcome = run_search(prepared, backend, fp32, recipe.search, models_dir)   # called by the sweep

1. Screen: each base candidate (qbench.search.candidates) is built and measured once on a few screening rows (every
   slice represented), timed quickly at the recipe's batch sizes (`search.batch_sizes` where set: production's): its
   gate excess there and speed-up over FP32.
2. Evaluate: candidates whose screening excess (`screen_excess`: one row's change on the screen is not counted) is
   within `SCREEN_SLACK` are run on every selection row and judged by the gate, fastest first, one whose screen only
   came near the gate after those clearing it at a similar speed (select.evaluation_order); once one passes, only
   candidates that could still be faster are evaluated. One whose screening rows already make failing on every row
   certain (qbench.search.certain) is not evaluated. Then the reduce_range twins of the bases that did not pass (a
   twin running its base's kernels is scored on the screen but not timed: it takes the base's speed-up).
3. Keep float: when a failing candidate may still beat every passing one (or none passes), the quantized nodes are
   ranked by the noise each causes at the outputs on the screening rows (qbench.search.ranking) and the fastest such
   failing candidates are rebuilt with the top 1, 2, 4, ... nodes in floating point (up to `max_keep_float`, never
   every node the candidate quantized: that would be the FP32 model), until one passes or could no longer be fastest.
4. Choose: the passing candidates are re-timed side by side with FP32 (interleaved rounds, more of them while the
   budget has room and they disagree: qbench.search.retime) and the fastest is kept (candidates dismissed against a
   screening estimate the re-timing lowered are evaluated then, and the finalists re-timed again); when none passes,
   the closest is evaluated in full if it was only screened (it may pass after all), then kept (the gate then fails
   it) and the report says what it would need.

A candidate in which no node computes in INT8 (BuiltVariant.lowered_nothing: nothing to quantize, or every quantized
node kept float) is "not applicable": never measured, it can neither pass nor be kept. Only files of the search's own
folder are moved or removed.

`time_budget_s` bounds when the search ends: a step starts only when predicted from this search's own measurements to
end within it, leaving room for what must follow (qbench.search.budget). Every candidate's figures and verdict are in
the returned `SearchReport` (results.json `search`, the report and MLflow).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from qbench.backends import Backend
from qbench.errors import QbenchError, one_line
from qbench.files import write_fault
from qbench.gate.evaluate import GateReport, judge
from qbench.gate.metric_check import too_small
from qbench.gate.resolution import unresolved_pick
from qbench.gate.tolerance import Tolerances, reference_tolerances, tolerances_by_metric
from qbench.preflight.prepare import Prepared
from qbench.recipe.search import SearchSpec
from qbench.recipe.spec import LatencySpec
from qbench.results.search import CandidateRecord, SearchReport
from qbench.search import select
from qbench.search.budget import EVALUATE, EVALUATE_BATCHED, SCREEN, TIMED_RUN, UNTIMED_SCREEN, Budget, build_kind
from qbench.search.candidates import Candidate, catalogue
from qbench.search.certain import certain_failure
from qbench.search.keep_float import KeepFloatStage
from qbench.search.outcome import kept_pick, method_note
from qbench.search.retime import retime_rounds
from qbench.search.screen import (
    VERDICT_CHARS,
    ScreenOutputs,
    evaluated_record,
    overall_drop,
    overall_metric,
    p50s,
    progress_line,
    screen_excess,
    screening_indices,
)
from qbench.selection_rows import chosen_on
from qbench.validate.clock import PhaseClock
from qbench.validate.measure import Measured, Rows, describe_error, measure
from qbench.variants import BuildContext, BuiltVariant, build_variant
from qbench.variants.base import unranged_reason
from qbench.variants.onnx_utils import graph_digest, kernels_digest
from qbench.variants.smoothquant import REPORT_KEYS as SMOOTHING_KEYS

CLOSEST_EVALUATIONS = 3  # unevaluated closest candidates evaluated in full when none passed
OUTPACED = "not evaluated: a candidate screened faster passed"  # dismissed on a passing candidate's speed-up

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchOutcome:
    built: BuiltVariant | None  # the chosen candidate (the closest when none passed), as <workdir>/<name>.onnx
    report: SearchReport


class _Search(KeepFloatStage):
    def __init__(self, prepared: Prepared, backend: Backend, fp32: Measured, spec: SearchSpec, workdir: Path,
                 clock: PhaseClock | None, now: Callable[[], float]) -> None:  # fmt: skip
        self.prepared, self.backend, self.fp32, self.spec = prepared, backend, fp32, spec
        self.clock, self.now = clock, now
        self.budget = Budget(spec.time_budget_s, now, spec.finalists)
        self.budget.start("measuring FP32 on the rows candidates are judged on", None, forced=True)
        self.root = workdir.resolve() / f"{spec.name}.search"
        self.ctx = BuildContext(prepared.source.onnx_path, self.root, prepared.calibration_batches,
                                fixed_batch=prepared.batch)
        selection = Rows.selection(prepared)
        self.rows = Rows.judged_on(prepared)  # what candidates are judged and chosen on
        self.screened = ScreenOutputs(screening_indices(self.rows.slices, self.rows.count, spec.screen_rows))
        self.screen = self.rows.subset(self.screened.indices)
        latency = prepared.recipe.latency
        # the batch sizes every speed-up is estimated and ranked at (search.batch_sizes: the one production serves at)
        self.timing = LatencySpec(batch_sizes=spec.batch_sizes or latency.batch_sizes, warmup=1,
                                  iterations=spec.timing_runs, threads=latency.threads, stability=None)  # fmt: skip
        self.records: list[CandidateRecord] = []
        self.candidates: list[Candidate] = []
        self.built: dict[int, BuiltVariant] = {}
        self.follows_batch: dict[int, bool] = {}  # candidate -> whether its screen saw its rows follow their batch
        self.reference_digest = graph_digest(prepared.source.onnx_path)
        self.digests: dict[str, int] = {}  # built graph → the first candidate that built it
        self.keep_float_exhausted = False
        self.retime_count = 0  # interleaved rounds the finalists were last re-timed in (0: none passed)
        self.retimed_late = False  # re-timing ended past the time budget
        self.ranking_notes: list[str] = []  # which keep-float ranking each ranked build got (search.ranking)
        self.fp32_built = BuiltVariant("fp32", "fp32", prepared.source.onnx_path, borrowed=True)
        fp32_selection_s, began = None, now()
        if selection is not None:  # FP32 on the selection rows: what candidates are compared with there
            self.fp32 = measure(backend, self.fp32_built, prepared, rows=selection, quiet=True, clock=clock)
            fp32_selection_s = now() - began
            if self.fp32.reference is None or self.fp32.result.accuracy is None:
                raise QbenchError(f"FP32 did not run on the selection rows: {self.fp32.result.error}")
        # slices the selection rows hold too few of for the gate's rule: judged on the evaluation rows only, and said
        small = ([s.name for s in self.fp32.result.accuracy.slices if too_small(s, prepared.recipe.gate)]
                 if selection else [])  # fmt: skip
        self.chosen_on = chosen_on(prepared.selection, len(prepared.evaluation_rows), small)
        self.tolerances = reference_tolerances(self.fp32.result, prepared.recipe.gate)  # on the rows chosen on
        self.gate = prepared.recipe.gate
        began = now()
        self.fp32_screen = measure(backend, self.fp32_built, prepared, rows=self.screen, timing=self.timing, quiet=True,
                                   clock=clock, known=self.screened.of_fp32(self.fp32))  # fmt: skip
        self.budget.seed(now() - began, fp32_selection_s, self.rows.count / max(self.screen.count, 1))
        self.fp32_p50 = p50s(self.fp32_screen.result)
        self.fp32_timings = [self.fp32_p50]  # FP32's screening timings, the first and one beside each candidate

    def refusal(self, what: str, seconds: float, *, evaluating: int | None = None, forced: bool = False) -> str | None:
        """Why step `what`, predicted to take `seconds`, may not start now (None: it started); Budget.refusal."""
        return self.budget.refusal(what, seconds, self.records, evaluating=evaluating, forced=forced)

    # -- one candidate: build, screen, evaluate -----------------------------------------------------

    def screen_candidate(self, candidate: Candidate) -> int:
        """Build `candidate` and measure it on the screening rows; returns its index. A reduce_range twin whose build
        runs its base's kernels (`kernels_digest`) takes the base's speed-up instead of being timed, with FP32 again
        beside it: the same kernels run at the same speed (the two timings were a third of a twin's screen)."""
        index = len(self.records)
        self.candidates.append(candidate)
        record = CandidateRecord(candidate.label, candidate.technique, dict(candidate.options), candidate.keep_float)
        self.records.append(record)
        twin_of = self._timed_base(candidate)
        predicted = self.budget.screening_cost(candidate.technique, timed=twin_of is None)
        if (why := self.refusal(f"screening {candidate.label}", predicted)) is not None:
            self.records[index] = record.with_(stage="skipped", verdict=f"not tried: {why}")
            return index
        t = time.perf_counter()
        try:
            ctx = dataclasses.replace(self.ctx, workdir=self.root / str(index))
            with self.budget.timing(build_kind(candidate.technique)):
                built = build_variant(candidate.spec(f"{self.spec.name}-{index}"), ctx)
        except Exception as exc:  # noqa: BLE001 - one candidate failing to build is one failed candidate
            if write_fault(exc):  # the disk's fault: another candidate would be picked for it
                raise
            verdict = one_line(f"build failed: {describe_error(exc)}", VERDICT_CHARS)
            self.records[index] = record.with_(stage="failed", verdict=verdict)
            logger.warning(f"  {candidate.label}: build failed: {exc}")
            return index
        finally:
            if self.clock is not None:
                self.clock.add("build", t)
        smoothing = {key: built.params[key] for key in SMOOTHING_KEYS if key in built.params}
        record = record.with_(build_seconds=round(built.build_seconds, 3), smoothing=smoothing)
        digest = graph_digest(built.onnx_path)
        if built.lowered_nothing or digest == self.reference_digest:
            what = ("every quantized node kept float" if candidate.keep_float
                    else unranged_reason(built.params) or "nothing to quantize")  # fmt: skip
            self.records[index] = record.with_(stage="not applicable", verdict=f"{what}: no node computes in INT8")
            logger.info(f"  {candidate.label}: not applicable ({what})")
            return index
        if digest in self.digests:
            twin = self.records[self.digests[digest]].label
            self.records[index] = record.with_(stage="duplicate", verdict=f"same graph as {twin}: not measured again")
            logger.info(f"  {candidate.label}: the same graph as {twin}")
            return index
        self.digests[digest] = index
        self.built[index] = built
        same = twin_of is not None and kernels_digest(built.onnx_path) == kernels_digest(self.built[twin_of].onnx_path)
        timed_as = twin_of if same else None
        with self.budget.timing(SCREEN if timed_as is None else UNTIMED_SCREEN):
            measured = measure(self.backend, built, self.prepared, rows=self.screen,
                               reference=self.fp32_screen.reference,
                               timing=self.timing if timed_as is None else None, quiet=True,
                               clock=self.clock)  # fmt: skip
            if measured.result.status != "ok":
                self.records[index] = record
                self._failed_to_run(index, measured.result.error)
                return index
            self.screened.keep(index, measured)
            self.follows_batch[index] = not measured.rows_independent
            speed = self._speed_of(timed_as) if timed_as is not None else self._speed(p50s(measured.result))
        verdict = judge(self.fp32_screen.result, measured.result, self.gate, self.gated_tolerances(),
                        self.screen.distinct_inputs)  # fmt: skip
        promise = screen_excess(verdict, measured.result, self.fp32.result.accuracy)
        certain = self._certain_failure(verdict, measured)
        said = "promising" if promise <= select.SCREEN_SLACK else "not promising"
        said += f"; timed as {self.records[timed_as].label} (the same kernels)" if timed_as is not None else ""
        self.records[index] = record.with_(
            stage="screened", speedup=speed[0], speedups=speed[1], nsr=measured.nsr,
            screen_metric=overall_metric(measured.result, self.gate.metric), screen_drop=overall_drop(verdict),
            screen_excess=promise, failure_certain=certain,
            verdict=one_line(f"screened: not evaluated, {certain}", VERDICT_CHARS) if certain else f"screened: {said}",
        )  # fmt: skip
        logger.info(progress_line(self.records[index], self.gate.metric, screened_rows=self.screen.count))
        return index

    def _timed_base(self, candidate: Candidate) -> int | None:
        """The built and timed candidate `candidate` is the reduce_range twin of (None: none)."""
        if not candidate.options.get("reduce_range"):
            return None
        base = Candidate(candidate.technique, {**candidate.options, "reduce_range": False}, candidate.keep_float)
        index = next((i for i, c in enumerate(self.candidates) if c == base and i in self.built), None)
        return index if index is not None and self.records[index].speedup is not None else None

    def _speed(self, p50: dict[int, float]) -> tuple[float, dict[str, float]]:
        """A candidate timed at `p50`: its speed-up over FP32 timed again now, and by batch size."""
        fp32_p50 = self._fp32_p50_now()
        return select.speedup(fp32_p50, p50), select.per_batch(fp32_p50, p50)

    def _speed_of(self, index: int) -> tuple[float, dict[str, float]]:
        record = self.records[index]
        return record.speedup if record.speedup is not None else math.nan, dict(record.speedups)

    def _certain_failure(self, verdict: GateReport, screened: Measured) -> str | None:
        """Why the screen makes failing on every row certain (search.certain), where its outputs are those the full
        evaluation would take (its rows did not depend on their batch); None otherwise."""
        fp32_screened, fp32 = self.fp32_screen.result.accuracy, self.fp32.result.accuracy
        accuracy = screened.result.accuracy
        if not screened.rows_independent or accuracy is None or fp32_screened is None or fp32 is None:
            return None
        return certain_failure(verdict.checks, accuracy, fp32_screened, fp32)

    def _fp32_p50_now(self) -> dict[int, float]:
        """FP32 timed again right after a candidate, so that each speed-up pairs timings taken under the same machine
        load (on a shared machine, load drifts over a search: one FP32 timing at the start misranked candidates 2×)."""
        p50 = self._timed(None)
        if p50:
            self.fp32_timings.append(p50)
        return p50 or self.fp32_p50

    def _timed(self, index: int | None) -> dict[int, float]:
        """FP32 (None) or candidate `index` timed on the screening rows, unscored: its p50s by batch size."""
        built = self.fp32_built if index is None else self.built[index]
        with self.budget.timing(TIMED_RUN):
            return p50s(measure(self.backend, built, self.prepared, rows=self.screen, timing=self.timing, score=False,
                                quiet=True, clock=self.clock).result)  # fmt: skip

    def gated_tolerances(self) -> dict[str, Tolerances]:  # each gated metric's (gate.metrics) on the rows chosen on
        return tolerances_by_metric(self.fp32.result, self.gate, self.tolerances)

    def tie(self) -> float:
        """The margin within which screening estimates cannot rank two candidates: TIE, or the noise FP32's own
        timings showed over the search when that is more (select.timing_noise)."""
        return max(select.TIE, select.timing_noise(self.fp32_timings))

    def may_win(self, record: CandidateRecord) -> bool:
        """Whether `record` may still beat the fastest passing candidate, within the search's measured noise."""
        best = select.fastest_passing(self.records)
        return select.may_win(record, self.records[best] if best is not None else None, tie=self.tie())

    def evaluate(self, index: int) -> None:
        """Run candidate `index` on every selection row (the evaluation rows when there are none) and judge it as
        the gate would."""
        record = self.records[index]
        measured = None  # its seconds are filed by whether its rows followed their batch (the runs that asks for)
        with self.budget.timing(lambda: EVALUATE if measured is not None and measured.rows_independent
                                else EVALUATE_BATCHED):  # fmt: skip
            measured = measure(self.backend, self.built[index], self.prepared, rows=self.rows,
                               reference=self.fp32.reference, quiet=True, clock=self.clock,
                               known=self.screened.take(index))  # fmt: skip
        if measured.result.status != "ok":
            self._failed_to_run(index, measured.result.error)
            return
        verdict = judge(self.fp32.result, measured.result, self.gate, self.gated_tolerances(),
                        self.rows.distinct_inputs)
        self.records[index] = evaluated_record(record, verdict, measured.result)
        logger.info(progress_line(self.records[index], self.gate.metric))

    def _failed_to_run(self, index: int, error: str | None) -> None:
        verdict = one_line(f"failed to run: {error}", VERDICT_CHARS)
        self.records[index] = self.records[index].with_(stage="failed", verdict=verdict)
        logger.warning(f"  {self.records[index].label}: {verdict}")

    # -- the stages -------------------------------------------------------------------------------

    def evaluate_promising(self) -> None:
        """Full evaluation of the promising screened candidates in select.evaluation_order, while they may still win."""
        for index in select.evaluation_order(self.records, tie=self.tie()):
            if not self.may_win(self.records[index]):
                self.records[index] = self.records[index].with_(verdict=OUTPACED)
                continue
            self.evaluate_within_budget(index)

    def evaluate_within_budget(self, index: int) -> None:
        """Evaluate candidate `index` if predicted to end within the budget, else say in its verdict why not."""
        record = self.records[index]
        predicted = self.budget.evaluation_cost(self.follows_batch.get(index))
        if (why := self.refusal(f"evaluating {record.label}", predicted, evaluating=index)) is None:
            return self.evaluate(index)
        self.records[index] = record.with_(verdict=f"{record.verdict.split(';')[0]}; not evaluated: {why}")

    def reduced_range_twins(self) -> None:
        """The 7-bit-weight twin of each base candidate that ran and did not pass, or not firmly (a base with a firm
        pass is as fast), the twins of the bases nearest to passing first, then the cheapest to screen (the base's
        measured build): the budget goes to the likeliest to pass, not to catalogue order."""
        bases = [i for i, r in enumerate(self.records) if r.stage in ("screened", "evaluated") and not r.firm_pass]
        cost = self.budget.screening_cost
        bases.sort(key=lambda i: (select.nearness(self.records[i]), cost(self.candidates[i].technique)))
        for base in bases:
            if self.may_win(self.records[base]):
                self.screen_candidate(self.candidates[base].reduced_range())
        self.evaluate_promising()

    def judge_the_closest(self) -> None:
        """When nothing passed, the candidate kept is the closest, and what the report says it lacks must come from
        every selection row, not the screening rows: an unevaluated closest is evaluated (the first past the budget
        too: it becomes the variant, and the budget kept room for it), which may show it passes, or move the closest to
        another, evaluated while predicted to end within the budget, at most CLOSEST_EVALUATIONS times."""
        for attempt in range(CLOSEST_EVALUATIONS):
            pick = select.closest(self.records) if select.choose(self.records) is None else None
            if pick is None or self.records[pick].evaluated or pick not in self.built:
                return
            what = f"evaluating {self.records[pick].label} (the closest)"
            predicted = self.budget.evaluation_cost(self.follows_batch.get(pick))
            if self.refusal(what, predicted, evaluating=pick, forced=attempt == 0) is not None:
                return
            self.evaluate(pick)

    def retime_finalists(self) -> None:
        """Re-time the fastest passing candidates and FP32 in interleaved rounds; medians replace the estimates
        (qbench.search.retime: more rounds while the budget has room and the rounds disagree).

        A lone finalist is re-timed too: the speed-up the report and the variant carry must not be the one lucky
        estimate that put it first."""
        passing = sorted(select.passing(self.records), key=lambda i: -(self.records[i].speedup or 0))
        finalists = passing[: self.spec.finalists]
        if not finalists:
            return
        self.budget.start_retiming(len(finalists))
        # to the tie `choose` ranks by, not the search's wider noise margin: rounds are what narrows that noise
        median, self.retime_count = retime_rounds(self._timed, finalists, tie=select.TIE, room=self.budget.room,
                                                  clock=self.now)  # fmt: skip
        self.retimed_late = self.budget.spent()  # a second re-timing starts only while the budget lasts
        for index in finalists:
            p50 = median[index]
            self.records[index] = self.records[index].with_(
                speedup=select.speedup(median[None], p50),
                speedups=select.per_batch(median[None], p50),
            )  # fmt: skip

    def reconsider_outpaced(self) -> None:
        """Evaluate the candidates dismissed because a faster-screened one passed, when the re-timing brought that one's
        speed-up down to where they may win after all (its few screening runs were lucky: on a 2-core machine a
        GRU model's pick screened fast, was re-timed at 0.95x, and three candidates screened at 0.89-0.93x had
        been dismissed against the lucky figure), then re-time the finalists again."""
        outpaced = [i for i, r in enumerate(self.records) if r.verdict == OUTPACED and r.stage == "screened"]
        revived = [i for i in sorted(outpaced, key=lambda i: -(self.records[i].speedup or 0))
                   if self.may_win(self.records[i])]  # fmt: skip
        for index in revived:
            if self.may_win(self.records[index]):
                self.evaluate_within_budget(index)
        if any(self.records[i].passed for i in revived):
            self.retime_finalists()

    def finish(self) -> SearchOutcome:
        chosen, pick, thin = select.picked(self.records, self.gate.unresolved)
        thin_pick = self.records[pick] if pick is not None and thin else None  # why its pass is weak evidence:
        notes = (unresolved_pick(thin_pick.label, thin_pick.unresolved, self.gate.unresolved),) if thin_pick else ()
        needed = notes[0] if notes and chosen is None else None
        if chosen is None and pick is not None and needed is None:
            needed = select.needed(self.records[pick], self.tolerances.max_drop,
                                   self.tolerances.on_slice(self.records[pick].worst_slice or ""),
                                   budget_exhausted=self.budget.exhausted,
                                   keep_float_exhausted=self.keep_float_exhausted)  # fmt: skip
        seconds = self.budget.elapsed()
        logger.info(f"  search: {self.screened.reused_rows} rows' outputs handed over from earlier runs, not run again")
        for index, record in enumerate(self.records):
            if index == pick:
                closest = f"closest ({select.outcome(chosen, pick, thin)}): {record.verdict}"
                verdict = closest if chosen is None else "chosen" + (" (pass unresolved)" if thin else "")
                self.records[index] = record.with_(verdict=verdict)
        slower = select.slower_than_reference(self.records[chosen], self.tie()) if chosen is not None else None
        tied = select.tie_note(self.records, chosen) if chosen is not None else None
        if slower:
            logger.warning(f"INT8 search: {slower}")
        report = SearchReport(
            variant=self.spec.name, metric=self.gate.metric, max_drop=self.tolerances.max_drop,
            max_slice_drop=self.tolerances.max_slice_drop, time_budget_s=self.spec.time_budget_s,
            seconds=round(seconds, 3), outcome=select.outcome(chosen, pick, thin),
            candidates=tuple(self.records), chosen=chosen, closest=pick if chosen is None else None, needed=needed,
            budget_exhausted=self.budget.exhausted, fp32_p50_ms={f"b{b}": p for b, p in self.fp32_p50.items()},
            notes=(self.chosen_on, self._method_note(), *self.ranking_notes, *notes, *([tied] if tied else []),
                   *([slower] if slower else []),
                   *self.budget.overrun_note()),
            selection_rows=self.rows.count if self.prepared.selection is not None else None,
            tolerance_basis=self.tolerances.basis,
        )  # fmt: skip
        built = self._keep(pick, chosen is not None) if pick is not None and pick in self.built else None
        shutil.rmtree(self.root, ignore_errors=True)
        return SearchOutcome(built, report)

    def _method_note(self) -> str:
        return method_note(screened=self.screen.count, rows=self.rows.count,
                           on_selection=self.prepared.selection is not None, timing_runs=self.spec.timing_runs,
                           noise=select.timing_noise(self.fp32_timings), tie=self.tie(),
                           retime_count=self.retime_count, retimed_late=self.retimed_late)  # fmt: skip

    def _keep(self, index: int, passed: bool) -> BuiltVariant:
        return kept_pick(self.built[index], self.records[index], name=self.spec.name, root=self.root, passed=passed,
                         on_selection=self.prepared.selection is not None, chosen_on=self.chosen_on, tie=self.tie(),
                         seconds=self.budget.elapsed())  # fmt: skip


def run_search(
    prepared: Prepared, backend: Backend, fp32: Measured, spec: SearchSpec, workdir: Path, *,
    clock: PhaseClock | None = None, now: Callable[[], float] = time.perf_counter,
) -> SearchOutcome:  # fmt: skip
    """Search the fastest INT8 candidate passing the recipe's gate (see the module docstring).

    Candidates are screened, evaluated and chosen on the selection rows (qbench.selection_rows; the evaluation rows when
    there are none, and the report says so): the sweep then measures the pick on the evaluation rows, which judge it.
    fp32: FP32 measured on every evaluation row (the sweep's reference). Candidates are built under
    `workdir`; the pick is kept as <workdir>/<spec.name>.onnx, everything else is removed."""
    if fp32.reference is None:
        raise ValueError("the INT8 search needs FP32 measured on the evaluation rows first")
    logger.info(f"  search: budget {spec.time_budget_s:g} s, gate on {prepared.recipe.gate.metric}, "
                  f"techniques {', '.join(spec.families)}")  # fmt: skip
    search = _Search(prepared, backend, fp32, spec, workdir, clock, now)
    try:
        for candidate in catalogue(spec):
            search.screen_candidate(candidate)
        search.evaluate_promising()
        search.reduced_range_twins()
        search.keep_float()
        search.judge_the_closest()
        search.retime_finalists()
        search.reconsider_outpaced()
        return search.finish()
    except BaseException:
        shutil.rmtree(search.root, ignore_errors=True)
        raise
