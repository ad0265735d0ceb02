"""The latency budget (`slo:`) judged as its own kind of gate check, from the serving figures a sweep recorded
(qbench.serving measures them, qbench.pricing prices them).

`judge_slo` is pure and fails closed (a budgeted variant without a latency figure is a problem, never a pass), and
`qbench.gate` turns its judgements into gate checks with scope "slo" and metric "latency.p99_ms".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qbench.recipe.slo import MIN_P99_SAMPLES, SloSpec
from qbench.results.schema import SweepResults, VariantResult
from qbench.results.serving import ServingResult
from qbench.validate.catalogue import within
from qbench.validate.contention import contended, cpus_allowed, oversubscribed, threads_that_fit

SLO_SCOPE = "slo"
SLO_METRIC = "latency.p99_ms"
# MIN_P99_SAMPLES: fewer samples hold none beyond their 99th percentile, so their "p99" is an interpolation between
# the largest one or two, and with n iid samples none at all lands in the slowest 1 % with probability 0.99^n (82 %
# for 20, 61 % for 50): such a figure cannot show that a budget holds.


def load_settings(slo: SloSpec, backend: str, batch_sizes: Sequence[int]) -> dict[str, Any]:
    """What the load figures depend on; results simulated with other settings cannot be judged."""
    budget = slo.budget(backend)
    return {
        "rate_rps": budget.rate_rps,
        "max_batch_size": slo.load.max_batch_size or max(batch_sizes),
        "max_queue_delay_ms": slo.queue_delay_ms(backend),
        "requests": slo.load.requests,
        "seed": slo.load.seed,
    }



def served_above(max_rate_rps: float | None, rate_rps: float) -> bool:
    """Whether real runs at a rate at least `rate_rps` met the budget (`max_rate_rps`: the highest rate they did)."""
    return max_rate_rps is not None and rate_rps <= max_rate_rps



@dataclass(frozen=True)
class SloJudgement:
    variant: str
    backend: str
    budget_ms: float
    observed_ms: float
    samples: int  # requests simulated, or timed runs
    status: str  # "pass" | "breach"
    reason: str = ""  # why a breach with a p99 within the budget: the instance fell behind at the rate

    @property
    def over_ms(self) -> float:
        return self.observed_ms - self.budget_ms


def judge_slo(
    results: SweepResults, slo: SloSpec, pairs: Sequence[tuple[str, str]], batch_sizes: Sequence[int]
) -> tuple[list[SloJudgement], list[str]]:
    """Judge every (variant, backend) in `pairs` against its budget; problems name what could not be judged."""
    judgements: list[SloJudgement] = []
    problems: list[str] = []
    for variant, backend in pairs:
        result = results.find(variant, backend)
        judgement, problem = _judge_one(result, slo, backend, batch_sizes)
        if problem is not None:
            problems.append(f"{variant}@{backend}: SLO: {problem}")
        if judgement is not None:
            judgements.append(judgement)
    return judgements, problems


def _judge_one(
    result: VariantResult | None, slo: SloSpec, backend: str, batch_sizes: Sequence[int]
) -> tuple[SloJudgement | None, str | None]:
    budget = slo.budget(backend)
    if result is None or result.status != "ok":
        return None, "no latency figure (the variant is missing or failed)"
    serving = result.serving
    if budget.rate_rps is not None:
        if serving is None or serving.at_rate is None:
            return None, "no load figure at the budget rate: re-run `qbench sweep` with this slo section"
        judged = p99_under_load(serving, budget.rate_rps, budget.p99_ms)
        if judged is None:
            return None, ("no real run at or above the budget rate met or missed it (served_at_rate, max_rate_rps"
                          f"{_met_looser(serving, budget.rate_rps, budget.p99_ms)}): "
                          "re-run `qbench sweep` with this slo section")  # fmt: skip
        recorded = {k: getattr(serving, k)
                    for k in ("rate_rps", "max_batch_size", "max_queue_delay_ms", "requests", "seed")}
        if recorded != load_settings(slo, backend, batch_sizes):
            return None, f"results were simulated with other load settings ({recorded}): re-run `qbench sweep`"
        observed, behind = judged
        swept = serving.budget_ms if serving.budget_ms is not None else math.nan  # its share over it was bounded
        shown = within(swept, budget.p99_ms) and within(serving.at_rate.p99_ms, swept)
        if within(observed, budget.p99_ms) and not behind and not shown:
            return None, (f"the sweep judged the simulated p99 at the budget's rate against {swept:g} ms, the budget "
                          f"it was swept with, not {budget.p99_ms:g} ms: re-run `qbench sweep` with this slo section")
        served = serving.served_at_rate
        if serving.at_rate_undecided and not behind and (served is None or within(served.p99_ms, budget.p99_ms)):
            return None, (f"the simulation at the budget's rate ({budget.rate_rps:,.4g} req/s) cannot tell whether its "
                          f"p99 is within the budget ({serving.at_rate.requests:,} simulated requests, near 1 % of "
                          "them over it): budget a rate further from "
                          "the instance's capacity, or a looser p99")  # fmt: skip
        if within(observed, budget.p99_ms) and not behind and keep_up_undecided(serving):
            return None, (f"the real run at the budget's rate ({budget.rate_rps:,.4g} req/s) cannot tell whether one "
                          f"instance keeps up ({keep_up_undecided(serving)}): re-run `qbench sweep` on a machine "
                          "nothing else runs on, or budget a rate further from the instance's capacity")  # fmt: skip
        samples = min(_load_samples(result, serving), served.requests if served else math.inf)
    else:
        point = result.latency.at(budget.batch_size) if result.latency else None
        if point is None:
            return None, f"no latency measured at batch size {budget.batch_size}"
        preprocess = serving.preprocess_ms_per_row if serving is not None else math.nan
        observed = point.p99_ms + preprocess * budget.batch_size
        samples, behind = point.iterations, ""
    if not math.isfinite(observed):
        return None, "the p99 latency is missing or NaN"
    if samples < MIN_P99_SAMPLES:
        basis = p99_basis(samples, serving if budget.rate_rps is not None else None)
        return None, (f"the p99 rests on {basis}, expected at least {MIN_P99_SAMPLES} (fewer hold no sample "
                      "beyond their 99th percentile): raise latency.iterations (or slo.load.requests)")  # fmt: skip
    status = "pass" if within(observed, budget.p99_ms) and not behind else "breach"
    reason = behind if within(observed, budget.p99_ms) else ""  # a p99 over the budget says why itself
    crowded = _crowded_timing(result, None if budget.rate_rps is not None else budget.batch_size)
    if status == "breach" and crowded:
        return None, f"a breach timed {crowded} is no verdict on the variant: re-run `qbench sweep` {_remedy(result)}"
    return SloJudgement(result.variant, result.backend, budget.p99_ms, observed, samples, status, reason), None


def _crowded_timing(result: VariantResult, batch_size: int | None) -> str:
    """How the timed points a p99 rests on (`batch_size`'s, or every one for a simulated load) competed for CPUs, in
    words ('' when they did not): beside other processes' load, or with more threads than usable CPUs
    (qbench.validate.contention). Either only slows a run, so a pass measured so stands, while a breach may be the
    load's or the CPU allowance's doing rather than the variant's."""
    points = [p for p in (result.latency.points if result.latency else ())
              if contended(p) and batch_size in (None, p.batch_size)]  # fmt: skip
    loaded = ", ".join(f"{p.others_cpus:.2f} at batch {p.batch_size}" for p in points)
    causes = [f"while other processes kept CPUs busy ({loaded})" if loaded else "",
              f"with {oversubscribed(result.latency)}" if oversubscribed(result.latency) else ""]  # fmt: skip
    return " and ".join(cause for cause in causes if cause)


def _remedy(result: VariantResult) -> str:
    """Where to time again for a verdict: with no more threads than usable CPUs, on a machine nothing else runs on."""
    latency = result.latency
    if latency is None or not oversubscribed(latency):
        return "on a machine nothing else runs on"
    fit = threads_that_fit(latency.machine)
    return f"with latency.threads at most {fit}, or " * (fit >= 1) + (f"where {cpus_allowed(latency.threads)} "
                                                                      "and nothing else runs")


def p99_under_load(serving: ServingResult, rate_rps: float, budget_ms: float | None = None) -> tuple[float, str] | None:
    """The p99 judged at `rate_rps` (the budget's, with `serving.at_rate` simulated there) and, when the instance
    fell behind there (a breach whatever that p99: its queue grows), why ('' when it kept up): the worse of the
    simulation and the real server's run at the rate (the simulation models no server's own work per request), or the
    simulation alone where real runs at a rate at least as high met the budget (`budget_ms`, the one judged now; None:
    the one swept): runs that met a looser budget at the sweep stand for none (a budget tightened from 10 to 6 ms since
    was judged on the simulated 5.5 ms alone, a pass); None when neither real figure is recorded (nothing real to judge
    by). The gate judges every budgeted variant by it, and the report the reference, which is never gated
    (qbench.report.serving.cheapest)."""
    served = serving.served_at_rate
    if serving.at_rate is None or (served is None and not _met_above(serving, rate_rps, budget_ms)):
        return None
    observed = float(np.max([serving.at_rate.p99_ms, served.p99_ms if served else -math.inf]))  # NaN: NaN
    if serving.at_rate.overloaded:
        return observed, "overloaded: the rate is above what one instance sustains, so its queue grows without bound"
    if served is not None and served.overloaded:
        return observed, f"the real server fell behind at the rate (it completed {served.achieved_rps:.4g} req/s)"
    return observed, ""


def _met_above(serving: ServingResult, rate_rps: float, budget_ms: float | None) -> bool:
    """Whether the real runs at the highest rate within budget show `budget_ms` met at `rate_rps`: at a rate at least
    as high, under a budget at most as long (what met 10 ms meets 20 ms, not 6 ms)."""
    swept = serving.budget_ms
    tight_enough = budget_ms is None or (swept is not None and within(swept, budget_ms))
    return tight_enough and served_above(serving.max_rate_rps, rate_rps)


def _met_looser(serving: ServingResult, rate_rps: float, budget_ms: float) -> str:
    """Where the sweep's real runs at a rate at least `rate_rps` met a looser budget than `budget_ms`, saying so ('':
    none did)."""
    swept = serving.budget_ms
    if swept is None or within(swept, budget_ms) or not served_above(serving.max_rate_rps, rate_rps):
        return ""
    return f"; the runs above it met the {swept:g} ms budget swept, not {budget_ms:g} ms"


def keep_up_undecided(serving: ServingResult) -> str:
    """Why the real run at the budget's rate could not tell whether the instance keeps up ('' when it could, or none
    was served)."""
    return serving.served_at_rate.keep_up_undecided if serving.served_at_rate is not None else ""


def p99_basis(samples: int, serving: ServingResult | None) -> str:
    """What a judged p99 rests on, in words: `samples` simulated requests when `serving` (a p99 under load) simulated
    no more than that, else timed runs (a fixed-batch p99, or a simulation that drew from fewer timed runs)."""
    simulated = serving is not None and serving.at_rate is not None and samples >= serving.at_rate.requests
    return f"{samples:,} simulated requests" if simulated else f"{samples:,} timed runs per batch size"


def _load_samples(result: VariantResult, serving: ServingResult) -> int:
    """What a simulated p99 rests on: the simulated requests, but no more than the timed runs of any batch size the
    simulation drew service times from (each simulated batch takes one of them, so the simulated tail is no finer
    than theirs): the sizes up to its largest batch, and the next timed one that sizes between interpolate with."""
    requests = serving.at_rate.requests if serving.at_rate is not None else 0
    points = sorted(result.latency.points, key=lambda p: p.batch_size) if result.latency is not None else []
    largest = serving.max_batch_size or 0
    drawn = [p for p in points if p.batch_size <= largest] + [p for p in points if p.batch_size >= largest][:1]
    return min([requests, *(p.iterations for p in drawn)])
