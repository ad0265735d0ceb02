"""Costs per million inferences of a variant's serving figures: from the price per hour of its backend and its own
rates, over the whole instances that serve the budget's rate within the budget, priced at sweep time and again when
judged (a price changed since the sweep, `--price`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from qbench.errors import QbenchError, expected_one_of
from qbench.recipe.slo import CostSpec
from qbench.recipe.spec import Recipe
from qbench.results.schema import LatencyPoint, SweepResults
from qbench.results.serving import ServingResult
from qbench.slo import keep_up_undecided, p99_under_load
from qbench.validate.catalogue import within
from qbench.validate.cost import usd_per_million, usd_per_million_at_rate
from qbench.validate.tail import Verdict

if TYPE_CHECKING:  # the simulation's type; its module is imported where the sweep simulates
    from qbench.validate.load import LoadReplay


def priced(serving: ServingResult, price: float | None, points: Sequence[LatencyPoint]) -> ServingResult:
    """`serving` with its costs per million computed from `price` (USD per hour; None: no price, no costs) and its
    own rates: each timed batch size's throughput (`points`), its highest rate within budget and the budget's rate
    on the instances it takes (`instances_at_rate`)."""
    if price is None:
        return replace(serving, price_per_hour=None, usd_per_million={})
    costs = {f"b{p.batch_size}": usd_per_million(price, p.items_per_s) for p in points}
    if serving.max_rate_rps is not None:
        costs["max_rate"] = usd_per_million(price, serving.max_rate_rps)
    if serving.rate_rps and (serving.max_rate_rps is not None or met_at_rate(serving)):
        costs["at_rate"] = usd_per_million_at_rate(price, serving.rate_rps, instances_at_rate(serving))
    return replace(serving, price_per_hour=price, usd_per_million=costs)



def instances_at_rate(serving: ServingResult) -> int | None:
    """The whole instances that serve the budget's rate within the budget (None: no count is known to): one where
    one instance meets it there (`met_at_rate`: the served search can stop below a rate a real run at the budget's
    rate met, 783 req/s claimed beside a pass at 1,873 req/s, priced as 3); else the sweep's `split_instances`,
    from ceil(rate / highest rate within budget) up, not that ceil alone: with a queue delay a lower rate can miss a
    budget a higher one meets (8 rows in 1 ms, 10 ms delay: 4 ms met from about 4,000 to 6,937 req/s; 7,500 req/s
    was priced on 2 instances at 3,750 req/s each, p99 4.3 ms). None where one instance misses the rate it exceeds,
    or no highest rate within budget was claimed. One instance meeting the rate needs no claimed highest rate: a real
    run there met the budget (a slow model's served search can claim none near its capacity)."""
    rate, highest = serving.rate_rps, serving.max_rate_rps
    if not rate:
        return None
    if met_at_rate(serving):
        return 1
    if highest is None or highest >= rate:
        return None
    return serving.split_instances or None



def met_at_rate(serving: ServingResult) -> bool:
    """Whether one instance meets the budget swept at its rate, as the gate judges it: within the budget, keeping up,
    and neither the real run nor the simulation there unable to tell (qbench.report.serving judges the reference,
    which is never gated, by it)."""
    judged = p99_under_load(serving, serving.rate_rps) if serving.rate_rps else None
    budget = serving.budget_ms
    return (judged is not None and budget is not None and within(judged[0], budget) and not judged[1]
            and not keep_up_undecided(serving) and not serving.at_rate_undecided)  # fmt: skip



# instance counts tried from ceil(rate / highest rate within budget) up, for the budget's rate split over instances
SPLITS_TRIED = 4


def split_instances(serving: ServingResult, replay: LoadReplay, overhead_ms: float) -> int | None:
    """Where one instance does not serve the budget's rate within budget but its highest rate within budget is below
    the rate: the fewest of SPLITS_TRIED instance counts from ceil(rate / highest) up at whose share of the rate
    `replay` shows the p99 within the budget (qbench.validate.load.LoadReplay.verdict), 0 when none is; None
    where no split is needed or none can be priced (`instances_at_rate`)."""
    rate, highest, budget = serving.rate_rps, serving.max_rate_rps, serving.budget_ms
    if not rate or highest is None or budget is None or highest >= rate or met_at_rate(serving):
        return None
    first = math.ceil(rate / highest)
    shown = (n for n in range(first, first + SPLITS_TRIED)
             if replay.verdict(rate / n, budget, overhead_ms=overhead_ms)[0] is Verdict.PASS)  # fmt: skip
    return next(shown, 0)



def repriced(results: SweepResults, cost: CostSpec | None) -> SweepResults:
    """`results` with every variant's costs computed again, when judged, from the recipe's price for its backend (the
    one recorded at sweep time, `--price` included, where the recipe names none) and the recorded rates: a price
    changed since the sweep is the one the cheapest variant is ranked by, and a cost figure edited into the results
    (or left from another price) ranks nothing."""
    prices = cost.price_per_hour if cost is not None else {}
    variants = tuple(
        replace(v, serving=priced(v.serving, prices.get(v.backend, v.serving.price_per_hour),
                                  v.latency.points if v.latency is not None else ()))
        if v.serving is not None else v
        for v in results.variants
    )  # fmt: skip
    return replace(results, variants=variants)



def with_prices(recipe: Recipe, prices: Sequence[str]) -> Recipe:
    """The recipe with `--price backend=USD` entries (USD per hour) over its cost.price_per_hour."""
    merged = dict(recipe.cost.price_per_hour) if recipe.cost is not None else {}
    for entry in prices:
        backend, equals, value = entry.partition("=")
        if not equals:  # `--price 0.10`: which backend it prices is missing, not misspelt
            raise QbenchError(f"--price {entry}: expected backend=USD per hour (e.g. {recipe.backends[0]}=0.10)")
        if backend not in recipe.backends:
            raise QbenchError(f"--price {entry}: backend {expected_one_of(backend, recipe.backends)}")
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not (price > 0 and math.isfinite(price)):
            raise QbenchError(f"--price {entry}: expected backend=USD per "
                              f"hour, a positive number (e.g. {backend}=0.10)")
        merged[backend] = price
    return recipe.model_copy(update={"cost": CostSpec(price_per_hour=merged)}) if merged else recipe
