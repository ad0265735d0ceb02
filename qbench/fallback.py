"""Accuracy-aware search for an INT8 variant: `calibrator: auto` and `fallback: {until: gate, ...}`.

    built = build_with_search(spec, ctx, evaluate=evaluate, prepared=prepared)   # called by the sweep

Every candidate is measured with `evaluate` (accuracy per slice and latency on the sweep's first
backend, against FP32) and judged by `qbench.gate.evaluate.evaluate_gate`, so a candidate passes here
exactly when the gate would pass it on those rows: the selection rows (qbench.selection_rows), which the
gate's own verdict on the chosen variant (measured on the evaluation rows) never uses.

- calibrator auto: minmax, entropy, percentile and dynamic are each built and measured.
- fallback: for each try that fails the gate, the closest to passing first, the quantized nodes
  are ranked with `qbench.explain`'s leave-one-out (on calibration rows, by how much closer to
  FP32 the outputs get), and those recovering the
  most per weight (the latency a node in FP32 adds grows with its weights) are kept in FP32,
  `step` more at a time, up to `max_excluded` and never all of them (a try with every node in FP32
  is the FP32 model). A try whose ranking shows that max_excluded nodes cannot remove enough of the
  error is not stepped through, and a path stops once a step is slower than the fastest passing candidate.

A try in which no node computes in INT8 (BuiltVariant.lowered_nothing) is not applicable: it never
passes, whatever it measures. The result is the fastest passing candidate (p50 at the largest batch
size), chosen by the INT8 search's rule (qbench.gate.resolution.passing): a pass the selection rows resolve
before any that rests on too few of them or says nothing of a scope no gated metric judges, which is kept only
when no try's pass is resolved, with a note (and under `gate.unresolved: fail` reported as not passing, as the gate
would hold it: `search.outcome` "pass unresolved", the note saying why); when none passes, the most accurate one that
quantizes something, with a note saying the tolerance was unreachable (the gate then fails it); when no try
quantizes anything (the model has nothing to quantize), the first try, which is the FP32 model itself.

Only files of the search's own folder are ever moved or deleted (onnx_utils.discard_built): a try with
nothing to quantize is the user's FP32 model.

Every try is recorded in `params["search.steps"]` and summarised in `notes`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import shutil
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from qbench.backends import get_backend
from qbench.backends.base import RunOptions
from qbench.errors import QbenchError
from qbench.explain.graph import QuantizedNode, float_keeper, quantized_nodes, sqnr_costs
from qbench.explain.rank import Score, group_nodes, rank_groups
from qbench.files import write_fault
from qbench.gate.evaluate import GateReport, judge
from qbench.gate.report import failure_reasons
from qbench.gate.resolution import PASS_UNRESOLVED, JudgedTry, passing, unresolved_pick
from qbench.gate.tolerance import reference_tolerances
from qbench.preflight.prepare import Prepared
from qbench.recipe.spec import FallbackSpec, VariantSpec
from qbench.report.grid import figure, percent
from qbench.results.schema import VariantResult
from qbench.selection_rows import chosen_on
from qbench.techniques.calibrators import AUTO_CALIBRATORS
from qbench.validate.measure import Rows, measure
from qbench.variants import BuildContext, BuiltVariant, build_variant
from qbench.variants.onnx_utils import discard_built, load_model

logger = logging.getLogger(__name__)

RANKING_ROWS = 64  # calibration rows the fallback ranking runs on
RANKING_BACKEND = "onnxruntime-cpu"
PAIR_CANDIDATES = 6  # nodes the pair search draws from when singles stall: 15 pairs a round
Evaluate = Callable[[BuiltVariant], VariantResult]
NOT_APPLICABLE = "not applicable: no node computes in INT8 (the graph is FP32's)"


@dataclass(frozen=True)
class Trial(JudgedTry):
    """One candidate (None when it failed to build), its measurement and the gate's verdict on it."""

    calibrator: str
    excluded: tuple[str, ...]
    built: BuiltVariant | None
    result: VariantResult
    verdict: GateReport

    @property
    def lowered(self) -> bool:
        """Whether some node of this try computes in INT8 (a try with every node in FP32 is the FP32 model)."""
        return self.built is not None and not self.built.lowered_nothing

    @property
    def p50_ms(self) -> float:
        return p50_at_largest_batch(self.result)

    @property
    def metric(self) -> float:
        accuracy = self.result.accuracy
        return accuracy.overall.metrics.get(self.verdict.metric, math.nan) if accuracy else math.nan

    @property
    def drop(self) -> float:
        """The overall drop the gate measured (inf when it could not judge)."""
        return next((c.drop for c in self.verdict.checks if c.scope == "overall" and c.metric == self.verdict.metric),
                    math.inf)  # fmt: skip

    def worst_slice(self) -> tuple[str | None, float]:
        judged = [c for c in self.verdict.checks if c.scope not in ("overall", "outputs") and c.status != "skipped"
                  and c.metric == self.verdict.metric]  # the gate metric's drops: another check's figure is none
        worst = max(judged, key=lambda c: c.drop, default=None)
        return (worst.scope, worst.drop) if worst else (None, math.nan)

    def label(self, base_excluded: int) -> str:
        extra = len(self.excluded) - base_excluded
        return f"{self.calibrator}+{extra}" if extra else self.calibrator

    def record(self) -> dict[str, Any]:
        worst, worst_drop = self.worst_slice()
        return {
            "calibrator": self.calibrator, "excluded": list(self.excluded), "metric": _finite(self.metric),
            "drop": _finite(self.drop), "worst_slice": worst, "worst_slice_drop": _finite(worst_drop),
            "p50_ms": _finite(self.p50_ms), "passed": self.passed, "unresolved": self.unresolved,
            "lowered": self.lowered,
        }  # fmt: skip

    def breaches(self) -> list[str]:
        unlowered = [NOT_APPLICABLE] if self.built is not None and not self.lowered else []
        return unlowered + failure_reasons(self.verdict)


def p50_at_largest_batch(result: VariantResult) -> float:
    """The p50 latency at the largest batch size measured (inf when not measured)."""
    points = result.latency.points if result.latency else ()
    return max(points, key=lambda p: p.batch_size).p50_ms if points else math.inf


def build_with_search(spec: VariantSpec, ctx: BuildContext, *, evaluate: Evaluate, prepared: Prepared) -> BuiltVariant:
    """The fastest candidate of `spec` that passes the recipe's gate (see the module docstring); built into
    ctx.workdir. Candidates are ranked with `qbench.validate.measure.measure` on calibration rows."""
    gate = prepared.recipe.gate
    if spec.technique_name not in ("ort-static", "ort-dynamic"):
        raise QbenchError(f"variant {spec.name!r}: fallback and calibrator auto apply to ONNX Runtime INT8 variants")
    started = time.perf_counter()
    reference = evaluate(BuiltVariant("fp32", "fp32", ctx.reference_path, borrowed=True))
    if reference.status != "ok" or reference.accuracy is None:
        raise QbenchError(f"variant {spec.name!r}: the search needs FP32 measured first: {reference.error}")
    logger.info("  search against FP32 (p50 %.2f ms), gate on %s", p50_at_largest_batch(reference), gate.metric)
    search = _Search(spec, ctx, evaluate, prepared, reference)
    try:
        calibrators = AUTO_CALIBRATORS if spec.calibrator == "auto" else (spec.calibrator,)
        tries = [search.attempt(calibrator, tuple(spec.exclude_nodes)) for calibrator in calibrators]
        if spec.fallback is not None:
            for base in sorted(tries, key=lambda t: (t.drop, t.p50_ms)):  # the closest to passing first
                if base.lowered and not base.firm_pass and search.may_beat(base):
                    search.fall_back(base, spec.fallback)
        return search.finish(time.perf_counter() - started)
    finally:
        shutil.rmtree(search.root, ignore_errors=True)


class _Search:
    def __init__(
        self, spec: VariantSpec, ctx: BuildContext, evaluate: Evaluate, prepared: Prepared, reference: VariantResult
    ) -> None:
        self.spec, self.ctx, self.evaluate, self.reference = spec, ctx, evaluate, reference
        self.tolerances = reference_tolerances(reference, prepared.recipe.gate)
        self.prepared, self.gate = prepared, prepared.recipe.gate
        # copies of an input among the rows tries are judged on are one input, as the gate and the INT8 search count
        self.distinct_inputs = Rows.judged_on(prepared).distinct_inputs
        self.root = ctx.workdir.resolve() / f"{spec.name}.search"
        self.trials: list[Trial] = []
        self.rankings: dict[str, list[str]] = {}
        self.skipped: list[str] = []  # fallback paths the ranking ruled out, and why
        self.together: dict[str, list[str]] = {}  # calibrator -> nodes ranked first as pairs (`_pairs_first`)

    def attempt(self, calibrator: str, excluded: tuple[str, ...]) -> Trial:
        """Build, measure and judge one candidate (in a folder of its own, removed once it cannot win)."""
        spec = self.spec.model_copy(update={"calibrator": calibrator, "exclude_nodes": list(excluded),
                                            "fallback": None})  # fmt: skip
        workdir = self.root / str(len(self.trials))
        try:
            built: BuiltVariant | None = build_variant(spec, dataclasses.replace(self.ctx, workdir=workdir))
            result = self.evaluate(built)
        except Exception as exc:  # noqa: BLE001 - one calibrator failing (entropy on a BERT graph) is one failed try
            if write_fault(exc):  # the disk's fault: another candidate would be picked for it
                raise
            error = f"{type(exc).__name__}: {exc}"
            built, result = None, VariantResult(spec.name, self.reference.backend, "int8", "failed", error=error)
        trial = Trial(calibrator, excluded, built, result, self.judged(result))
        self.trials.append(trial)
        verdict = "pass" if trial.passed else f"fail {'; '.join(trial.breaches())[:200]}"
        logger.info("  try %s: %s %s, p50 %.2f ms, %s", trial.label(len(self.spec.exclude_nodes)), self.gate.metric,
                    figure(trial.metric), trial.p50_ms, verdict)  # fmt: skip
        self._discard_losers()
        return trial

    def judged(self, result: VariantResult) -> GateReport:
        """The gate's verdict on one try's `result` (qbench.gate.evaluate.judge), its rows rule counting the distinct
        inputs of the rows it was measured on (Rows.judged_on), as `qbench gate` and the INT8 search count them."""
        return judge(self.reference, result, self.gate, self.tolerances, self.distinct_inputs)

    def _discard_losers(self) -> None:
        """Remove the models of fallback steps that can no longer be chosen (tries without extra exclusions
        stay: a later fallback ranks their nodes)."""
        best = self.best()
        for trial in self.trials:
            if trial is not best and trial.built is not None and len(trial.excluded) > len(self.spec.exclude_nodes):
                discard_built(trial.built, self.root, with_folder=True)

    def best(self) -> Trial:
        """Fastest of the `passing` trials (a resolved pass before any unresolved one); without one, the INT8 try with
        the smallest overall drop; without any try that quantizes something, the first (nothing to quantize)."""
        among = [self.trials[i] for i in passing(self.trials)]
        if among:
            return min(among, key=lambda t: (t.p50_ms, t.drop))
        lowered = [t for t in self.trials if t.lowered]
        return min(lowered or self.trials[:1], key=lambda t: (t.drop, t.p50_ms))

    def may_beat(self, trial: Trial) -> bool:
        """Keeping more nodes in FP32 only adds latency: a trial slower than the fastest firm pass cannot win. A pass
        that another try on the same rows may resolve better (`firm_pass`) is no such bar."""
        firm = [t for t in self.trials if t.firm_pass]
        return not firm or trial.p50_ms < min(t.p50_ms for t in firm)

    def fall_back(self, base: Trial, fallback: FallbackSpec) -> None:
        """Keep the costliest nodes of `base` in FP32, `step` more at a time, until one passes or cannot win.

        Skipped when the ranking says it cannot work: if the outputs' noise (on calibration rows) left
        after keeping the top max_excluded nodes in FP32 is more than twice what would bring the gate
        metric's drop down to max_drop (taking the drop as proportional to that noise), the error is
        spread over too many nodes for a fallback (e.g. static activation ranges on a transformer).

        A step keeps at most all but one of the nodes `base` quantized in FP32: with every one of them in FP32 the
        step is the FP32 model, which is no INT8 candidate."""
        quantized = quantized_nodes(load_model(self.ctx.reference_path), base.built)
        most = min(fallback.max_excluded, len(quantized) - 1)
        if most < 1:
            self.skipped.append(f"{base.calibrator}: it quantizes {len(quantized)} node(s); keeping any in FP32 "
                                "would leave nothing in INT8")  # fmt: skip
            logger.info("  no fallback from %s", self.skipped[-1])
            return
        needed = self.tolerances.max_drop / base.drop if base.drop > 0 else 1.0
        ranking, residual = self.rank(base, quantized, pool=3 * fallback.max_excluded, keep=most, needed=needed)
        self.rankings[base.calibrator] = ranking
        if residual > 2 * needed:
            nodes = "node" if most == 1 else "nodes"
            self.skipped.append(f"{base.calibrator}: {percent(residual)} of its output noise would stay with "
                                f"{most} {nodes} in FP32 (≤{percent(needed)} needed)")  # fmt: skip
            logger.info("  no fallback from %s", self.skipped[-1])
            return
        limit = min(most, len(ranking))
        for count in sorted({min(k, limit) for k in range(fallback.step, limit + fallback.step, fallback.step)}):
            trial = self.attempt(base.calibrator, base.excluded + tuple(ranking[:count]))
            if trial.firm_pass or not self.may_beat(trial):
                return

    def rank(
        self, base: Trial, nodes: list[QuantizedNode], pool: int, keep: int, needed: float
    ) -> tuple[list[str], float]:
        """`nodes` (those `base` quantized) in the order to keep them in FP32: those whose float version alone brings
        the outputs closer to FP32, the most recovered per weight first (a node kept in FP32 costs time in proportion
        to its weights), then the rest of the pool; and the share of the output noise that remains with the first `keep`
        of them in FP32, measured on that candidate (recoveries one node at a time do not add up: nodes may matter
        only together). Only the `pool` nodes adding the most noise (by SQNR) are considered. When the first `keep`
        leave more than `needed` of the noise, pairs are tried too (`_pairs_first`)."""
        rows = Rows.from_batches(self.ctx.calibration, RANKING_ROWS)
        backend, options = get_backend(RANKING_BACKEND), RunOptions()
        scratch = dataclasses.replace(self.ctx, workdir=self.root / "ranking")
        scratch.workdir.mkdir(parents=True, exist_ok=True)
        noise: dict[str, float] = {}

        def by_noise() -> list[str]:  # noisiest first (SQNR: the noise each node adds where it computes)
            if not noise:
                noise.update(sqnr_costs(self.ctx.reference_path, base.built, nodes, [rows.feeds], backend, options,
                                        scratch.workdir, self.prepared.batch))  # fmt: skip
            return [n.name for n in sorted(nodes, key=lambda n: -np.nan_to_num(noise[n.name], nan=-1.0))]

        if len(nodes) > pool:
            kept_names = set(by_noise()[:pool])
            nodes = [n for n in nodes if n.name in kept_names]
        fp32 = BuiltVariant("fp32", "fp32", self.ctx.reference_path, borrowed=True)
        reference = measure(backend, fp32, self.prepared, rows=rows, quiet=True).reference

        def score(candidate: BuiltVariant) -> Score:
            nsr = measure(backend, candidate, self.prepared, rows=rows, reference=reference, quiet=True).nsr
            return Score(nsr, {}, nsr)

        spec = self.spec.model_copy(update={"calibrator": base.calibrator, "exclude_nodes": list(base.excluded)})
        baseline = score(base.built)
        keeper = float_keeper(spec, scratch, base.built)
        costs = rank_groups(keeper, group_nodes(nodes, "node"), score, baseline, "leave_one_out")
        weights = _weight_sizes(load_model(self.ctx.reference_path))
        typical = float(np.median(list(weights.values()))) if weights else 1.0
        # fastest passing is the goal: what a node recovers per weight kept in FP32 (its compute) orders them
        useful = sorted((c for c in costs if c.overall > 0),
                        key=lambda c: -c.overall / weights.get(c.nodes[0], typical))  # fmt: skip
        first = [cost.nodes[0] for cost in useful]
        ordered = first + [n.name for n in nodes if n.name not in first]
        if baseline.overall <= 0 or not ordered:
            return ordered, 0.0

        def remaining(names: Collection[str], label: str) -> float:
            """The share of the base's output noise left with `names` in FP32."""
            kept = keeper.keep_float(set(names), label)
            try:
                left = score(kept).overall
            finally:
                discard_built(kept, self.root)
            return min(max(left / baseline.overall, 0.0), 1.0) if math.isfinite(left) else 1.0

        residual = remaining(ordered[:keep], "kept-float")
        if residual > needed and keep >= 2 and len(ordered) > 2:
            candidates = list(dict.fromkeys([*ordered[:PAIR_CANDIDATES // 2], *by_noise()]))[:PAIR_CANDIDATES]
            together = self._pairs_first(candidates, keep, residual, remaining)
            if together:
                paired = together + [name for name in ordered if name not in together]
                paired_residual = remaining(paired[:keep], "kept-float")
                if paired_residual < residual:
                    self.together[base.calibrator] = together
                    logger.info("  %s: nodes that matter together first: %s (%s of the noise left with %d in FP32, "
                                "%s by single recoveries)", base.calibrator, ", ".join(together),
                                percent(paired_residual), keep, percent(residual))  # fmt: skip
                    ordered, residual = paired, paired_residual
        return ordered, residual

    @staticmethod
    def _pairs_first(
        candidates: list[str], keep: int, residual: float, remaining: Callable[[Collection[str], str], float]
    ) -> list[str]:  # fmt: skip
        """Greedy over pairs, for nodes that matter only together (the two inputs of an Add or a Max, a residual
        branch and its skip: keeping either alone in FP32 recovers nothing, so one-node recoveries never rank them):
        with the pairs chosen so far in FP32, the pair of `candidates` leaving the least noise is added, while it
        leaves less than the previous round and at most `keep` nodes are chosen. At most C(len(candidates), 2)
        candidates a round and keep // 2 rounds. The chosen nodes, in order (empty when no pair helps)."""
        chosen: list[str] = []
        best = residual
        while len(chosen) + 2 <= keep:
            free = [name for name in candidates if name not in chosen]
            tried = {pair: remaining([*chosen, *pair], f"pair-{index}")
                     for index, pair in enumerate(itertools.combinations(free, 2))}  # fmt: skip
            if not tried:
                break
            pair, left = min(tried.items(), key=lambda item: item[1])
            if left >= best:
                break
            chosen, best = [*chosen, *pair], left
        return chosen

    def finish(self, seconds: float) -> BuiltVariant:
        """Move the chosen candidate to <workdir>/<name>.onnx and record the path that led to it."""
        chosen = self.best()
        if chosen.built is None:
            raise QbenchError(f"variant {self.spec.name!r}: no candidate could be built: {chosen.result.error}")
        target = chosen.built.onnx_path
        if chosen.built.owned_by(self.root):
            target = self.ctx.workdir.resolve() / chosen.built.onnx_path.name
            for path in chosen.built.onnx_path.parent.iterdir():
                path.replace(target.parent / path.name)
        params = {**chosen.built.params, **self._path_params(chosen)}
        notes = (*chosen.built.notes, *self._notes(chosen))
        return dataclasses.replace(chosen.built, onnx_path=target, params=params, notes=notes, build_seconds=seconds)

    def _path_params(self, chosen: Trial) -> dict[str, Any]:
        params: dict[str, Any] = {
            "search.steps": [t.record() for t in self.trials],
            "search.chosen": self.trials.index(chosen),
            "search.outcome": _outcome(chosen, self.gate.unresolved),
            "search.chosen_on": "selection" if self.prepared.selection is not None else "evaluation",
            "search.selection_rows": self.prepared.selection.count if self.prepared.selection is not None else None,
        }
        if self.spec.calibrator == "auto":
            params["calibrator_requested"] = "auto"
        if self.spec.fallback is not None:
            params |= {"fallback.max_excluded": self.spec.fallback.max_excluded,
                       "fallback.step": self.spec.fallback.step, "fallback.ranking": self.rankings,
                       "fallback.skipped": self.skipped}  # fmt: skip
            if self.together:
                params["fallback.together"] = self.together
        return params

    def _notes(self, chosen: Trial) -> list[str]:
        base = len(self.spec.exclude_nodes)
        steps = " → ".join(f"{t.label(base)} {figure(t.metric)}{t.mark}" for t in self.trials)
        speed = p50_at_largest_batch(self.reference) / chosen.p50_ms
        shown = f" ({speed:.2f}× FP32 p50)" if math.isfinite(speed) else ""
        notes = [f"search on {self.gate.metric}: {steps}; chosen {chosen.label(base)}{shown}",
                 chosen_on(self.prepared.selection, len(self.prepared.evaluation_rows))]
        notes += [f"tolerances: {self.tolerances.basis}"] if self.tolerances.basis else []
        extra = chosen.excluded[base:]
        if extra:
            notes.append(f"kept in FP32 by the search: {', '.join(extra)}")
        notes += [f"no fallback from {reason}" for reason in self.skipped]
        if not chosen.lowered:
            notes.append("no try computes any node in INT8: the variant computes in FP32")
        elif not chosen.passed:
            notes.append(f"tolerance unreachable; best: {self.gate.metric} {figure(chosen.metric)} "
                         f"({chosen.label(base)}), breaches: {'; '.join(chosen.breaches())}")  # fmt: skip
        elif not chosen.resolved_pass:
            notes.append(unresolved_pick(chosen.label(base), chosen.unresolved, self.gate.unresolved))
        return notes


def _outcome(chosen: Trial, unresolved: str) -> str:
    """'passed', PASS_UNRESOLVED (a pass too few rows resolve, or beside a scope no gated metric judges, under
    `gate.unresolved: fail`, which the gate would not count: the notes say why), 'tolerance unreachable' or 'nothing
    to quantize'."""
    if chosen.counted(unresolved):
        return "passed"
    if chosen.passed:
        return PASS_UNRESOLVED
    return "tolerance unreachable" if chosen.lowered else "nothing to quantize"


def _weight_sizes(model: onnx.ModelProto) -> dict[str, int]:
    """Node name -> elements of its constant (initializer) inputs, for nodes that have some."""
    sizes = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    found = {n.name: sum(sizes.get(i, 0) for i in n.input) for n in model.graph.node}
    return {name: size for name, size in found.items() if size > 0}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
