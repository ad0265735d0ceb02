"""The INT8 search's keep-float stage: failing candidates rebuilt with their noisiest nodes in floating point.

Mixed into the search (qbench.search.run), whose state and steps it uses: its records and builds, its budget, its
screening rows, and its screening and evaluation of one candidate. Its own part is which bases are rebuilt, with how
many float nodes, and on which sensitivity ranking (qbench.search.ranking).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from qbench.backends import Backend
from qbench.backends.base import RunOptions
from qbench.files import write_fault
from qbench.preflight.prepare import Prepared
from qbench.recipe.search import SearchSpec
from qbench.results.search import CandidateRecord
from qbench.search import select
from qbench.search.budget import RANKING, SCREEN, Budget, build_kind
from qbench.search.candidates import Candidate
from qbench.search.ranking import quantized_names, ranked_nodes
from qbench.validate.measure import Rows, describe_error
from qbench.variants import BuildContext, BuiltVariant, build_variant

logger = logging.getLogger(__name__)


class KeepFloatStage:
    """The keep-float stage of a search; the attributes below and the steps `refusal`, `may_win`, `tie`,
    `screen_candidate` and `evaluate` are the search's."""

    records: list[CandidateRecord]
    candidates: list[Candidate]
    built: dict[int, BuiltVariant]
    budget: Budget
    spec: SearchSpec
    ctx: BuildContext
    screen: Rows
    backend: Backend
    prepared: Prepared
    root: Path
    ranking_notes: list[str]  # which keep-float ranking each ranked build got (search.ranking)
    keep_float_exhausted: bool  # every rung failed with max_keep_float nodes float: more were what was left

    def keep_float(self) -> None:
        """Failing candidates faster than any passing one rebuilt with the noisiest nodes in floating point, 1, 2,
        4, ... of them: every such candidate, fastest first, within the time budget. Only the two fastest were, and
        which two followed timing noise: of three sweeps of one recipe, one rebuilt a candidate that then passed, the
        other two rebuilt two others and reported the gate unreachable."""
        bases = select.keep_float_bases(self.records, self.tie())
        ranking = self.budget.cost(RANKING) or self.budget.cost(SCREEN)  # two models run on the screening rows
        predicted = ranking + (0.0 if self._static_build() else self.budget.build_cost("ort-static"))
        if not bases or self.spec.max_keep_float == 0 or self.refusal("keep-float candidates", predicted) is not None:
            return
        ranking, covered = self.sensitivity_ranking()
        for base in bases:
            if not self.may_win(self.records[base]):
                continue  # a keep-float candidate of a faster base passed since
            own, quantized = self.base_ranking(base, ranking, covered)
            most = min(self.spec.max_keep_float, len(own), quantized - 1)  # all of them float: the FP32 model
            if most < 1:
                logger.info(f"  {self.records[base].label}: none of the ranked nodes can be kept float there (it "
                            f"quantizes {quantized}); no keep-float candidate")  # fmt: skip
                continue
            for size in sorted({min(2**k, most) for k in range(16)}):
                index = self.screen_candidate(self.candidates[base].keeping(own[:size]))
                record = self.records[index]
                if record.stage == "skipped":  # the budget is spent, or another base's rungs may be cheaper
                    if self.budget.spent():
                        return
                    break
                if record.stage != "screened":
                    break  # this base cannot be rebuilt that way; the next base may
                if not self.may_win(record):
                    self.records[index] = record.with_(verdict="not evaluated: slower than a passing candidate")
                    break  # more float nodes only make it slower
                promising = record.screen_excess is not None and record.screen_excess <= select.SCREEN_SLACK
                if promising and record.failure_certain is None:
                    self.evaluate(index)
                    if self.records[index].firm_pass:
                        break
            else:  # every rung failed: more float nodes were what was left, if max_keep_float was the cap
                self.keep_float_exhausted |= most == self.spec.max_keep_float

    def base_ranking(self, base: int, ranking: list[str], covered: set[str]) -> tuple[list[str], int]:
        """The ranking restricted to the nodes `base` quantized (keeping float a node it left float anyway would
        rebuild the same graph: a dynamic candidate quantizes MatMul/Gemm only; the ranking comes from a static build),
        and how many nodes `base` quantized. A base quantizing nodes the ranked build did not (beyond `covered`: an
        LSTM model's ORT dynamic candidate, which could keep only its Gemm float) is ranked on its own build."""
        own = quantized_names(self.ctx.reference_path, self.built[base])
        ranked = [name for name in ranking if name in own]
        what = "ranking a keep-float base on its own build"
        if own - covered and self.refusal(what, self.budget.cost(RANKING)) is None:
            ranked = self._ranked(self.built[base], f"ranking-{base}") or ranked
        return ranked, len(own)

    def sensitivity_ranking(self) -> tuple[list[str], set[str]]:
        """Quantized nodes, the noisiest first (of a static Q/DQ build on the screening rows: search.ranking), and the
        nodes that build quantized (none where it could not be ranked)."""
        static = self._static_build()
        if static is None:
            try:
                ctx = dataclasses.replace(self.ctx, workdir=self.root / "ranking")
                with self.budget.timing(build_kind("ort-static")):
                    static = build_variant(Candidate("ort-static").spec(f"{self.spec.name}-ranking"), ctx)
            except Exception as exc:  # noqa: BLE001 - without a ranking there are no keep-float candidates
                if write_fault(exc):
                    raise
                logger.warning(f"  no sensitivity ranking: {describe_error(exc)}")
                return [], set()
        ranked = self._ranked(static, "ranking-work")
        return ranked, quantized_names(self.ctx.reference_path, static) if ranked else set()

    def _static_build(self) -> BuiltVariant | None:  # an ort-static candidate built without float nodes
        return next((self.built[i] for i, c in enumerate(self.candidates) if i in self.built
                     and c.technique == "ort-static" and not c.keep_float), None)  # fmt: skip

    def _ranked(self, built: BuiltVariant, work: str) -> list[str]:
        """The nodes `built` quantized, the noisiest first on the screening rows ([] where that cannot be measured)."""
        with self.budget.timing(RANKING):
            ranking = ranked_nodes(self.ctx.reference_path, built, self.screen.feeds, self.backend,
                                   RunOptions(threads=self.prepared.recipe.latency.threads), self.root / work,
                                   self.prepared.batch, self.budget.left())  # fmt: skip
        self.ranking_notes += [ranking.note] if ranking.note else []
        return ranking.names
