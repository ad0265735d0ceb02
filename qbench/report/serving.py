"""The serving view of a sweep: where the time goes, latency under load, cost, bound, and the SLO verdicts.

Built as a Grid (report/tables.py renders it in the console and report.md, report_html in report.html), plus
the SLO lines (`slo_lines`) and the cheapest variant that meets both accuracy and the SLO (`cheapest`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from qbench.frontier.pareto import timing_kinds
from qbench.gate.evaluate import EXIT_UNUSABLE, GateReport, problem_owner
from qbench.gate.metric_check import GateCheck
from qbench.pricing import instances_at_rate, met_at_rate
from qbench.report.grid import Grid, rate_within
from qbench.results.schema import EMULATED, SweepResults, VariantResult
from qbench.results.serving import ServingResult
from qbench.slo import SLO_SCOPE, p99_basis
from qbench.validate.catalogue import within
from qbench.validate.cost import usd_per_million
from qbench.validate.load_search import MAX_BATCHES, MAX_REQUESTS

_NONE = "—"
_OVERLOADED = "overloaded"


@dataclass(frozen=True)
class Choice:
    variant: VariantResult
    # at max_rate_rps (None: no price); where no rate was claimed, the most serving within the budget can cost
    usd_per_million: float | None
    # the highest rate within the budget real runs showed: the served search's claim, else the budget's own rate a
    # real run met (0: none shown)
    max_rate_rps: float
    # at the budget's rate on the whole instances it takes (None: no price, or a budget without a rate)
    usd_per_million_at_rate: float | None = None
    # where the served search claimed no rate: the simulated highest rate within budget, which it never claims above
    # (qbench.validate.serve.served_max_rate; inf: none simulated); None: max_rate_rps was claimed
    rate_bound_rps: float | None = None

    @property
    def rates(self) -> tuple[float, float]:
        """The least and the most its highest rate within budget can be."""
        return self.max_rate_rps, self.max_rate_rps if self.rate_bound_rps is None else self.rate_bound_rps

    def costs(self, at_rate: bool) -> tuple[float, float]:
        """The least and the most it costs per million: at the budget's rate (`at_rate`, known for each candidate
        then), else at its highest rate within budget, the most at the rate shown and the least at the simulated
        bound; (0, 0) without a price (ranked by rate alone)."""
        if at_rate and self.usd_per_million_at_rate is not None:
            return self.usd_per_million_at_rate, self.usd_per_million_at_rate
        price = self.variant.serving.price_per_hour if self.variant.serving is not None else None
        if self.usd_per_million is None or price is None:
            return 0.0, 0.0
        bound = self.rate_bound_rps
        least = self.usd_per_million if bound is None else 0.0 if math.isinf(bound) else usd_per_million(price, bound)
        return least, self.usd_per_million


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None or not math.isfinite(value):
        return _NONE
    digits = 4 if abs(value) < 0.01 else 3
    return f"{value:.{digits}g}{unit}"


def _slo_checks(gate: GateReport | None, variant: VariantResult) -> list[GateCheck]:
    if gate is None:
        return []
    return [c for c in gate.checks if c.scope == SLO_SCOPE
            and (c.variant, c.backend) == (variant.variant, variant.backend)]


def accuracy_verdict(results: SweepResults, gate: GateReport | None, variant: VariantResult) -> str:
    """'reference', 'pass', 'fail', 'not gated' on accuracy alone (the SLO checks left out). FP32 on a later backend
    is judged against the first backend's (qbench.gate): where that breaches, it and every variant of its backend
    fail."""
    if variant.variant == results.reference and (gate is None or variant.key not in gate.gated):
        return "reference" if variant.status == "ok" else "fail"
    if gate is None or f"{variant.key}" not in gate.gated:
        return "not gated"
    owners = gate.judged_with(variant.variant, variant.backend)
    judged = [c for c in gate.checks if c.scope != SLO_SCOPE and f"{c.variant}@{c.backend}" in owners]
    unjudged = any((owner := problem_owner(gate.gated, p)) in (*owners, None) and not p.startswith(f"{owner}: SLO:")
                   for p in gate.problems)  # fmt: skip
    own = [c for c in judged if f"{c.variant}@{c.backend}" == variant.key]
    if unjudged or any(c.status == "breach" for c in judged) or not own:
        return "fail"
    return "pass"


def slo_verdict(gate: GateReport | None, variant: VariantResult) -> str:
    checks = _slo_checks(gate, variant)
    if gate is not None and any(p.startswith(f"{variant.key}: SLO:") for p in gate.problems):
        return "unjudged"
    if not checks:
        return "not budgeted"
    return "breach" if any(c.status == "breach" for c in checks) else "pass"


def _within_budget(variant: VariantResult) -> bool:
    """The variant's own figure at the SLO is within budget (the reference is not gated, so judged here)."""
    serving = variant.serving
    if serving is None or serving.budget_ms is None:
        return False
    if serving.at_rate is not None:  # as the gate judges it: the worse of the simulation and the real server
        return met_at_rate(serving)
    point = variant.latency.at(serving.batch_size) if variant.latency and serving.batch_size else None
    return point is not None and within(point.p99_ms + serving.preprocess_ms_per_row * point.batch_size,
                                        serving.budget_ms)  # fmt: skip


def mixed_machine_costs(results: SweepResults) -> str | None:
    """Why costs and rates within budget cannot be ranked across variants: a backend's variants were timed on
    machines of more than one kind (a cluster's nodes), while its price per hour, and its throughput, are one
    machine's. None when every backend timed its variants on one kind."""
    for backend in results.backends():
        kinds = timing_kinds(results, backend)
        if len(kinds) > 1:
            price = next((v.serving.price_per_hour for v in results.variants
                          if v.backend == backend and v.serving and v.serving.price_per_hour), None)  # fmt: skip
            priced = f"its price of ${price:g}/h is one machine's, " if price is not None else ""
            return (f"{backend} timed its variants on {len(kinds)} kinds of machine ({'; '.join(kinds)}): {priced}"
                    "and their rates compare the machines; time every variant of a backend on one kind")  # fmt: skip
    return None


def _meeting(results: SweepResults, gate: GateReport | None) -> list[VariantResult]:
    """The variants accurate enough (the reference, or passing the accuracy gate) and within the latency budget."""
    return [v for v in results.variants if v.status == "ok" and v.serving is not None
            and accuracy_verdict(results, gate, v) in ("reference", "pass")
            and slo_verdict(gate, v) not in ("breach", "unjudged") and _within_budget(v)]  # fmt: skip


def _candidates(results: SweepResults, gate: GateReport | None) -> list[Choice]:
    """The variants meeting accuracy and the SLO (`_meeting`), with their highest rate within budget and its cost per
    million: the served search's claim, or where it claimed none, the range from the budget's own rate a real run met
    (for a rate budget) up to the simulated highest rate."""
    candidates = []
    for variant in _meeting(results, gate):
        serving = variant.serving
        if serving is None:
            continue
        at_rate = _finite(serving.usd_per_million.get("at_rate"))
        if serving.max_rate_rps is not None:
            candidates.append(Choice(variant, _finite(serving.usd_per_million.get("max_rate")), serving.max_rate_rps,
                                     at_rate))  # fmt: skip
            continue
        shown = serving.rate_rps if serving.rate_rps and met_at_rate(serving) else 0.0
        simulated = serving.simulated_max_rate_rps
        bound = max(simulated, shown) if simulated is not None else math.inf
        price = serving.price_per_hour
        most = None if price is None else math.inf if not shown else usd_per_million(price, shown)
        candidates.append(Choice(variant, most, shown, at_rate, bound))
    return candidates


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def unpriced_backends(results: SweepResults, gate: GateReport | None) -> list[str]:
    """The backends of candidates without a price when another candidate has one: a variant without a price has
    no cost to rank, and ranking it as free would name it the cheapest whatever its machine costs."""
    candidates = _candidates(results, gate)
    if all(c.usd_per_million is None for c in candidates):
        return []
    return sorted({c.variant.backend for c in candidates if c.usd_per_million is None})


def _by_rate_cost(candidates: list[Choice]) -> bool:
    """Whether the candidates are ranked by what the budget's rate costs on the instances it takes: every candidate's
    budget has the same rate and each such cost is known."""
    rates = {c.variant.serving.rate_rps for c in candidates if c.variant.serving is not None}
    return len(rates) == 1 and all(c.usd_per_million_at_rate is not None for c in candidates)


def _surely_cheaper(first: Choice, other: Choice, at_rate: bool) -> bool:
    """Whether `first` ranks before `other` wherever in their ranges their highest rates within budget lie: its most
    cost below the other's least, or one cost for both and its least rate above the other's most (ties go to the
    higher rate), or both fully known and equal (then by name)."""
    (low, high), (other_low, other_high) = first.costs(at_rate), other.costs(at_rate)
    if high < other_low:
        return True
    if not low == high == other_low == other_high:
        return False
    (slow, fast), (other_slow, other_fast) = first.rates, other.rates
    if slow > other_fast:
        return True
    return slow == fast == other_slow == other_fast and first.variant.key < other.variant.key


class Ranking(NamedTuple):
    """The cheapest candidate, or None and the candidates it may be (those no other is surely cheaper than: two or
    more whose costs overlap; none when no variant meets both), and whether costs at the budget's rate ranked them."""

    choice: Choice | None
    contenders: list[Choice]
    by_rate_cost: bool


def ranked(results: SweepResults, gate: GateReport | None) -> Ranking:
    """The candidates ranked by cost (`Ranking`). See `cheapest`."""
    candidates = _candidates(results, gate)
    at_rate = _by_rate_cost(candidates)
    contenders = [c for c in candidates if not any(_surely_cheaper(o, c, at_rate) for o in candidates if o is not c)]
    return Ranking(contenders[0], [], at_rate) if len(contenders) == 1 else Ranking(None, contenders, at_rate)


def cheapest(results: SweepResults, gate: GateReport | None) -> Choice | None:
    """Among variants accurate enough and within the latency budget (`_candidates`), the one with the lowest cost
    per million serving the budget's rate on the whole instances it takes, where every candidate's budget has the same
    rate, else at its highest rate within budget (by that rate when no price is given); ties go to the higher rate.
    Per-backend budgets at different rates price different traffic: one instance of a $1/h machine at its 2,000 req/s
    ($0.139 per million) was named cheaper than one of a $0.10/h machine at its 100 req/s ($0.278), which serves
    either traffic for less (up to 400 req/s within budget: $0.0694 per million at 100 req/s and at 2,000). At the
    highest rate alone, a dearer machine with more headroom ranked cheaper even where the budget's traffic fits one
    instance of either. A variant whose served search claimed no rate is ranked by the range its rate lies in (from
    the budget's rate a real run met up to the simulated highest rate, which no real one is claimed above): it, or
    another, is the cheapest wherever in that range the rate lies, else none is named (`ranked`). A MiniLM FP32 met
    20 req/s for real, simulated up to 39.6, no rate claimed: the report said 'cannot tell' beside an INT8 at $0.27
    per million, while FP32's cost is at least $0.59 (at 39.6 req/s). None also when the costs cannot be ranked
    (`mixed_machine_costs`, `unpriced_backends`)."""
    if mixed_machine_costs(results) is not None or unpriced_backends(results, gate):
        return None
    return ranked(results, gate).choice


def _range_text(choice: Choice, at_rate: str = "") -> str:
    """A candidate's figures in words: its highest rate within budget and its cost per million there, or the ranges
    they lie in where no rate was claimed, then `at_rate` (its cost at the budget's rate, in words) if given."""
    if choice.rate_bound_rps is None:
        cost = (f"${choice.usd_per_million:.4g} per million" + " there" * bool(at_rate)
                if choice.usd_per_million is not None else "no price given")  # fmt: skip
        rate = f"up to {rate_within(choice.max_rate_rps)} req/s within budget"
    else:
        low, high = choice.costs(at_rate=False)
        cost = ("no price given" if choice.usd_per_million is None
                else f"at least ${low:.4g} per million" if math.isinf(high)
                else f"at most ${high:.4g} per million" if low == 0
                else f"${low:.4g} to ${high:.4g} per million")  # fmt: skip
        shown = (f"met the budget for real at {rate_within(choice.max_rate_rps)} req/s" if choice.max_rate_rps
                 else "met it at no real rate")  # fmt: skip
        bound = (f"at most the simulated {rate_within(choice.rate_bound_rps)} req/s"
                 if math.isfinite(choice.rate_bound_rps) else "no simulated rate bounding it")  # fmt: skip
        rate = f"{shown}, no higher rate claimed, {bound}"
    return f"{choice.variant.key} ({rate}, {cost}{'; ' + at_rate if at_rate else ''})"


def _undecided_text(contenders: list[Choice], at_rate: bool) -> str:
    """Why no variant is named among `contenders`: their costs, or the rates their equal costs are ranked by,
    overlap."""
    if at_rate:
        cost = contenders[0].usd_per_million_at_rate or 0.0
        rate = contenders[0].variant.serving.rate_rps if contenders[0].variant.serving is not None else 0.0
        return (f"{', '.join(c.variant.key for c in contenders)} each cost ${cost:.4g} per million at the budget's "
                f"{rate:g} req/s, and the tie goes to the higher rate within budget, which their figures do not "
                f"order: {'; '.join(_range_text(c) for c in contenders)}")  # fmt: skip
    return f"the costs of {' and '.join(_range_text(c) for c in contenders)} overlap"


def slo_lines(results: SweepResults, gate: GateReport | None) -> list[str]:
    """One line per SLO check, breaches first, then the cheapest variant meeting accuracy and the SLO."""
    if gate is None:
        return []
    lines = []
    checks = sorted((c for c in gate.checks if c.scope == SLO_SCOPE), key=lambda c: c.status != "breach")
    for check in checks:
        variant = results.find(check.variant, check.backend)
        serving = variant.serving if variant else None
        where = f"at {serving.rate_rps:g} req/s" if serving and serving.rate_rps else "at its budget batch size"
        if serving is not None and serving.at_rate is not None and serving.at_rate.overloaded:
            lines.append(f"SLO BREACH {check.variant}@{check.backend}: overloaded {where}: above what one instance "
                         f"sustains ({_rate_within_text(serving)}), so its queue grows "
                         f"without bound (p99 {check.observed:.4g} ms over the {serving.at_rate.requests} simulated "
                         "requests only)")  # fmt: skip
            continue
        served = serving.served_at_rate if serving is not None else None
        if check.reason and served is not None and served.overloaded:  # a p99 within budget, yet a breach
            lines.append(f"SLO BREACH {check.variant}@{check.backend}: the real server fell behind {where}: it "
                         f"completed {served.achieved_rps:.4g} req/s (p99 {served.p99_ms:.4g} ms over its "
                         f"{served.requests} requests only, budget {check.reference:g} ms)")  # fmt: skip
            continue
        sign, verdict = (">", "BREACH") if check.status == "breach" else ("<=", "pass")
        basis = p99_basis(check.size, serving if serving is not None and serving.rate_rps else None)
        lines.append(f"SLO {verdict} {check.variant}@{check.backend}: p99 {check.observed:.4g} ms {where} {sign} "
                     f"budget {check.reference:g} ms ({check.drop:+.3g} ms, {check.drop / check.reference:+.1%}; "
                     f"from {basis})")  # fmt: skip
    lines += [f"SLO cannot judge (fail closed): {p}" for p in gate.problems if ": SLO:" in p]
    if checks or any(v.serving and v.serving.budget_ms is not None for v in results.variants):
        budgets = {c.reference for c in checks}
        recorded = {v.serving.budget_ms for v in results.variants if v.serving and v.serving.budget_ms is not None}
        if gate.exit_code == EXIT_UNUSABLE:  # some results were refused: no choice among them is judged
            lines.append("cheapest meeting accuracy and SLO: cannot tell: the gate could not judge the results "
                         "(exit 2, see its problems)")  # fmt: skip
        elif budgets and recorded and budgets != recorded:  # the sweep's rates within budget answer another budget
            lines.append(f"cheapest meeting accuracy and SLO: cannot tell: the budget is {_ms(budgets)} now, the sweep "
                         f"simulated {_ms(recorded)} (re-run `qbench sweep`)")  # fmt: skip
        elif (mixed := mixed_machine_costs(results)) is not None:
            lines.append(f"cheapest meeting accuracy and SLO: cannot tell: {mixed}")
        elif unpriced := unpriced_backends(results, gate):
            lines.append(f"cheapest meeting accuracy and SLO: cannot tell: no price for {', '.join(unpriced)} while "
                         "other backends have one (give every backend cost.price_per_hour, or --price)")  # fmt: skip
        elif (ranking := ranked(results, gate)).choice is not None:
            lines.append(f"cheapest meeting accuracy and SLO: {_choice_text(ranking.choice)}")
        elif len(ranking.contenders) > 1:
            lines.append("cheapest meeting accuracy and SLO: cannot tell: "
                         f"{_undecided_text(ranking.contenders, ranking.by_rate_cost)}")
        else:
            lines.append("cheapest meeting accuracy and SLO: none")
    return lines


def _choice_text(choice: Choice) -> str:
    """The cheapest variant, its highest rate within budget (or the range it lies in) and its costs, in words."""
    serving = choice.variant.serving
    rate = serving.rate_rps if serving is not None else None
    instances = instances_at_rate(serving) if serving is not None else None
    if choice.usd_per_million_at_rate is None or not rate or not instances:
        return _range_text(choice)
    return _range_text(choice, f"${choice.usd_per_million_at_rate:.4g} per million at the budget's {rate:g} req/s on "
                               f"{instances} instance{'s' * (instances > 1)}")  # fmt: skip


def _rate_within_text(serving: ServingResult) -> str:
    """The highest rate within budget in words: the one real runs claimed, else the simulated one they claimed none
    at or below (the search's runs can end first), else none."""
    if serving.max_rate_rps:
        return f"max {rate_within(serving.max_rate_rps)} req/s within budget"
    if serving.simulated_max_rate_rps:
        return (f"simulated up to {rate_within(serving.simulated_max_rate_rps)} "
                "req/s within budget, no real rate claimed")
    return "no rate within budget"


def _ms(values: set[float]) -> str:
    return ", ".join(f"{v:g} ms" for v in sorted(values))


def simulated_requests(serving: ServingResult | None) -> str:
    """The requests the simulated highest rate within the budget rests on, and whether the search settled there."""
    if serving is None or serving.budget_ms is None or not serving.simulated_requests:
        return _NONE
    return f"{serving.simulated_requests:,}" + (" (not settled)" if serving.simulated_undecided else "")


def _row(results: SweepResults, gate: GateReport | None, variant: VariantResult, sizes: list[int]) -> list[str]:
    serving = variant.serving
    b1 = variant.latency.at(1) if variant.latency else None
    name = variant.variant + (" (emulated latency)" if variant.fidelity.latency == EMULATED else "")
    cells = [name, variant.backend, _fmt(serving.preprocess_ms_per_row if serving else None),
             _fmt(b1.p50_ms if b1 else None), _fmt(serving.transfer_ms_b1 if serving else None)]  # fmt: skip
    load = serving.at_rate if serving else None
    # an overloaded rate's queue grows without bound: its p99 is the finite simulation's, no figure of the rate
    cells += [(_OVERLOADED if load.overloaded else _fmt(load.p99_ms)) if load else _NONE,
              _fmt(load.mean_batch_size) if load else _NONE]
    cells.append(rate_within(serving.max_rate_rps) if serving and serving.budget_ms is not None else _NONE)
    cells.append(simulated_requests(serving))
    costs = serving.usd_per_million if serving else {}
    cells += [_fmt(costs.get(f"b{bs}")) for bs in sizes] + [_fmt(costs.get("max_rate"))]
    bound = serving.bound.verdict if serving and serving.bound else _NONE
    return cells + [bound, accuracy_verdict(results, gate, variant), slo_verdict(gate, variant)]


def serving_table(results: SweepResults, gate: GateReport | None) -> Grid | None:
    """One row per variant x backend with serving figures; None when no variant has any."""
    measured = [v for v in results.variants if v.serving is not None]
    if not measured:
        return None
    sizes = sorted({p.batch_size for v in measured if v.latency for p in v.latency.points})
    rate = next((v.serving.rate_rps for v in measured if v.serving and v.serving.rate_rps), None)
    headers = ["variant", "backend", "pre-proc ms/row", "model p50 ms b1", "copies ms b1",
               f"p99 ms at {rate:g} req/s" if rate else "p99 ms under load", "mean batch",
               "max req/s in budget", "simulated requests"]  # fmt: skip
    headers += [f"$/M b{bs}" for bs in sizes] + ["$/M at max req/s", "bound (estimate)", "accuracy", "SLO"]
    rows = [_row(results, gate, v, sizes) for v in measured]
    footer = [
        "pre-proc: qbench's feed building (tokenisation included) "
        "per row; copies: host minus device time (GPU backends)",
        "under load: Poisson arrivals, dynamic batcher, one model instance, simulated from the measured service times; "
        "overloaded: above what the instance sustains, its queue grows without bound (no p99)",
        f"simulated requests: those of the search for the highest rate within the budget (up to {MAX_REQUESTS:,}, "
        f"within {MAX_BATCHES:,} simulated batches); not settled: "
        "that many did not place it, so the rate is claimed low",
        "$/M: USD per million inferences = price per hour / 3600 / throughput x 1e6",
        "bound: model bytes x runs/s at batch 1 vs measured copy bandwidth; an estimate",
    ]
    if any(v.fidelity.latency == EMULATED for v in measured):
        footer.append("emulated latency: the timed model does not run the format's own kernels; its load, cost "
                      "and bound figures are not those of native hardware")
    footer += [f"{v.key}: {v.serving.bound.basis}" for v in measured if v.serving and v.serving.bound]
    lines = slo_lines(results, gate)
    breached = any(line.startswith("SLO BREACH") for line in lines)
    return Grid("Serving: where the time goes, load, cost", headers, [list(row) for row in rows],
                frozenset(range(2, len(headers) - 3)), footer + lines,
                footer_style="red" if breached else "dim")  # fmt: skip
