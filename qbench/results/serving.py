"""Serving figures of one variant on one backend (results.json `variants[].serving`), and their JSON form.

    ServingResult
      preprocess_ms_per_row   qbench's own pre-processing (feed building, tokenisation) per evaluation row
      transfer_ms_b1          GPU backends that time the device apart: host p50 - device p50 at batch 1 (copies)
      budget_ms, rate_rps, batch_size, max_batch_size, max_queue_delay_ms, requests, seed
                              the SLO and load settings the figures were simulated with (null without `slo:`)
      at_rate LoadStats       the load scenario at the SLO's rate_rps (rate budgets only), over independent replays
                              pooled, more of them while its p99 was neither shown within nor over the budget
                              (qbench.validate.load_verdict.judge_rate)
      at_rate_undecided       the most requests allowed still could not tell (no verdict on the rate rests on it)
      served_at_rate LoadStats
                              a real in-process server's figures at the SLO's rate_rps (rate budgets only)
      simulated_max_rate_rps, simulations, simulated_requests, simulated_undecided
                              the highest Poisson rate whose simulated p99 was shown within the budget (an upper
                              confidence bound; null: none was), the simulations tried, the requests of those that
                              showed it, and whether the search did not settle within the most requests it may draw
                              (the rate is then claimed lower than more requests could place it)
      max_rate_rps, at_max_rate LoadStats, served_runs
                              the highest rate, from the simulated one down, at which a real in-process server met
                              the budget in two runs (null: none tried within the search's runs and seconds did),
                              its real figures, the real runs tried
      split_instances         where one instance does not serve the budget's rate within budget: the fewest whole
                              instances, from ceil(rate / max_rate) up, at whose share of the rate the simulation
                              showed the p99 within budget (0: none of those tried; null: not needed or not swept)
      price_per_hour, usd_per_million {"b<batch>": ..., "max_rate": ..., "at_rate": ...} (at_rate: the budget's rate
                              on the instances it takes (qbench.pricing.instances_at_rate); with a rate budget only)
      bound BoundEstimate     compute-, memory- or overhead-bound, an estimate with its basis
    LoadStats: rate_rps, requests, p50_ms, p95_ms, p99_ms, mean_ms, mean_wait_ms, mean_batch_size, achieved_rps,
              overloaded, keep_up_undecided
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from qbench.errors import QbenchError
from qbench.results.fields import known_fields


@dataclass(frozen=True)
class LoadStats:
    """End-to-end latency (pre-processing + queueing + service) of the simulated requests at one rate."""

    rate_rps: float
    requests: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    mean_wait_ms: float  # time in the queue before the request's batch starts
    mean_batch_size: float
    achieved_rps: float  # requests / (last completion - first arrival)
    # the rate is at or above what one instance sustains (full batches at the mean service time): under sustained
    # traffic its queue grows without bound, however short the finite simulation's tail looks
    overloaded: bool = False
    # a real run only: why it could not tell whether the server keeps up at the rate ('' when it could; the
    # simulation's never): neither within nor beyond the capacity its batches bound (qbench.validate.keep_up)
    keep_up_undecided: str = ""


@dataclass(frozen=True)
class BoundEstimate:
    verdict: str  # "memory-bound" | "compute-bound" | "overhead-bound" | "unknown"
    basis: str  # the arithmetic behind the verdict, in words
    weight_bytes_per_s: float | None = None  # bytes a run reads (lookup tables left out) x runs/s at batch 1
    bandwidth_bytes_per_s: float | None = None  # the machine's copy bandwidth (numpy, measured once)
    bandwidth_fraction: float | None = None
    gpu_util_pct: float | None = None


@dataclass(frozen=True)
class ServingResult:
    preprocess_ms_per_row: float
    transfer_ms_b1: float | None = None
    budget_ms: float | None = None
    rate_rps: float | None = None
    batch_size: int | None = None
    max_batch_size: int | None = None
    max_queue_delay_ms: float | None = None
    requests: int | None = None
    seed: int | None = None
    at_rate: LoadStats | None = None
    at_rate_undecided: bool = False
    served_at_rate: LoadStats | None = None
    max_rate_rps: float | None = None
    at_max_rate: LoadStats | None = None
    simulations: int = 0
    simulated_max_rate_rps: float | None = None
    simulated_requests: int = 0
    simulated_undecided: bool = False
    served_runs: int = 0
    split_instances: int | None = None
    price_per_hour: float | None = None
    usd_per_million: dict[str, float] = field(default_factory=dict)
    bound: BoundEstimate | None = None


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _price(value: Any, where: str) -> float | None:
    """A recorded price per hour: null (none given) or a positive number, as a recipe's `cost:` takes; the costs are
    computed from it when judged (qbench.pricing.repriced), where 0 or a negative price would name a variant the
    cheapest."""
    price = _float(value)
    if price is not None and not (price > 0 and math.isfinite(price)):
        raise QbenchError(f"{where}: got {value!r}, expected a positive number (USD per hour) or null")
    return price


def _load(raw: dict[str, Any] | None, where: str) -> LoadStats | None:
    if raw is None:
        return None
    raw = known_fields(raw, LoadStats, where)
    return LoadStats(**{k: (math.nan if v is None else v) for k, v in raw.items()})


def serving_from_dict(raw: dict[str, Any] | None, where: str = "serving") -> ServingResult | None:
    """Rebuild from parsed JSON (NaN was written as null)."""
    if raw is None:
        return None
    raw = known_fields(raw, ServingResult, where)
    bound = raw.get("bound")
    return ServingResult(
        preprocess_ms_per_row=math.nan if raw.get("preprocess_ms_per_row") is None else raw["preprocess_ms_per_row"],
        transfer_ms_b1=_float(raw.get("transfer_ms_b1")),
        budget_ms=_float(raw.get("budget_ms")),
        rate_rps=_float(raw.get("rate_rps")),
        batch_size=raw.get("batch_size"),
        max_batch_size=raw.get("max_batch_size"),
        max_queue_delay_ms=_float(raw.get("max_queue_delay_ms")),
        requests=raw.get("requests"),
        seed=raw.get("seed"),
        at_rate=_load(raw.get("at_rate"), f"{where}.at_rate"),
        at_rate_undecided=bool(raw.get("at_rate_undecided", False)),
        served_at_rate=_load(raw.get("served_at_rate"), f"{where}.served_at_rate"),
        max_rate_rps=_float(raw.get("max_rate_rps")),
        at_max_rate=_load(raw.get("at_max_rate"), f"{where}.at_max_rate"),
        simulations=int(raw.get("simulations", 0)),
        simulated_max_rate_rps=_float(raw.get("simulated_max_rate_rps")),
        simulated_requests=int(raw.get("simulated_requests", 0)),
        simulated_undecided=bool(raw.get("simulated_undecided", False)),
        served_runs=int(raw.get("served_runs", 0)),
        split_instances=None if raw.get("split_instances") is None else int(raw["split_instances"]),
        price_per_hour=_price(raw.get("price_per_hour"), f"{where}.price_per_hour"),
        usd_per_million={k: (math.nan if v is None else float(v)) for k, v in raw.get("usd_per_million", {}).items()},
        bound=BoundEstimate(**known_fields(bound, BoundEstimate, f"{where}.bound")) if bound is not None else None,
    )
