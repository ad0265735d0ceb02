"""The recipe's serving sections: a latency budget (`slo:`) and prices (`cost:`).

    slo:
      p99_ms: 20                 # end-to-end p99 budget
      rate_rps: 200              # judged under Poisson load at this rate (or `batch_size: 1`: at a fixed batch)
      load: {max_batch_size: 32, max_queue_delay_ms: 2, requests: 5000, seed: 0}
      backends: {tensorrt: {p99_ms: 5, rate_rps: 2000}}   # per-backend budgets
      applies_to: null           # variant globs; default: the gate's applies_to
    cost:
      price_per_hour: {onnxruntime-cpu: 0.10}              # USD per hour of the machine a backend runs on

Cross-field checks (a fixed batch size must be a timed one, backends must be the recipe's) are
in `check_serving`, called from the recipe's own checks so every error names its field.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from qbench.errors import expected_one_of
from qbench.techniques.options import Seed


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SloBudget(_Strict):
    """A p99 budget judged at a fixed batch size (`batch_size`) or under load at a request rate (`rate_rps`)."""

    p99_ms: float = Field(gt=0, allow_inf_nan=False, description="end-to-end p99 latency budget, ms")
    batch_size: int | None = Field(None, gt=0,
                                   description="judge the timed p99 at this batch size (a latency batch size)")
    rate_rps: float | None = Field(None, gt=0, allow_inf_nan=False,
                                   description="judge the p99 under Poisson load at this rate")  # fmt: skip

    @model_validator(mode="after")
    def _one_mode(self) -> SloBudget:
        if (self.batch_size is None) == (self.rate_rps is None):
            raise ValueError("give `batch_size` (a fixed batch) or `rate_rps` (a load), not both or neither")
        return self


class LoadSpec(_Strict):
    """The simulated server scenario: Poisson arrivals, a dynamic batcher, one model instance."""

    max_batch_size: int | None = Field(None, gt=0,
                                       description="largest batch the batcher forms; "
                                                   "default: the largest latency batch size")
    max_queue_delay_ms: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="longest a request waits for a batch to fill; default: a tenth of the budget"
    )
    requests: int = Field(5000, ge=100, le=1_000_000, description="simulated requests per rate")
    seed: Seed = 0


class SloSpec(SloBudget):
    load: LoadSpec = LoadSpec()
    backends: dict[str, SloBudget] = Field({}, description="backend -> its own budget (replaces the default)")
    applies_to: list[str] | None = Field(None, description="variant globs the SLO gates; default: gate.applies_to")

    def budget(self, backend: str) -> SloBudget:
        return self.backends.get(backend, self)

    def applies(self, variant: str, gate_globs: Sequence[str]) -> bool:
        globs = self.applies_to if self.applies_to is not None else gate_globs
        return any(fnmatch.fnmatchcase(variant, pattern) for pattern in globs)

    def queue_delay_ms(self, backend: str) -> float:
        delay = self.load.max_queue_delay_ms
        return delay if delay is not None else self.budget(backend).p99_ms / 10


class CostSpec(_Strict):
    price_per_hour: dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        description="backend -> USD per hour of the machine it runs on (a positive number)"
    )


# Fewer samples than this hold none beyond their 99th percentile (qbench.slo judges no p99 resting on fewer).
MIN_P99_SAMPLES = 100


def check_serving(slo: SloSpec | None, cost: CostSpec | None, backends: Sequence[str], batch_sizes: Sequence[int],
                  iterations: int | None = None) -> None:  # fmt: skip
    """Cross-field checks; raises ValueError('field: problem') for the recipe's error formatter. `iterations`: the
    recipe's latency.iterations, the fewest timed runs per batch size, which every p99 the SLO judges rests on."""
    if cost is not None:
        for backend in cost.price_per_hour:
            if backend not in backends:
                raise ValueError(f"cost.price_per_hour: {expected_one_of(backend, backends)} (the recipe's backends)")
    if slo is None:
        return
    if iterations is not None and iterations < MIN_P99_SAMPLES:
        raise ValueError(
            f"latency.iterations: got {iterations}, expected at least {MIN_P99_SAMPLES} with an `slo:` budget: its p99 "
            f"is judged from the timed runs, and fewer than {MIN_P99_SAMPLES} hold none beyond their 99th percentile"
        )
    for backend in slo.backends:
        if backend not in backends:
            raise ValueError(f"slo.backends: {expected_one_of(backend, backends)} (the recipe's backends)")
    budgets = [("slo", slo)] + [(f"slo.backends.{b}", budget) for b, budget in slo.backends.items()]
    for field, budget in budgets:
        if budget.batch_size is not None and budget.batch_size not in batch_sizes:
            raise ValueError(
                f"{field}.batch_size: got {budget.batch_size}, expected one of the latency batch sizes "
                f"{', '.join(map(str, batch_sizes))}"
            )
    largest = max(batch_sizes)
    if slo.load.max_batch_size is not None and slo.load.max_batch_size > largest:
        raise ValueError(
            f"slo.load.max_batch_size: got {slo.load.max_batch_size}, expected at most the largest latency batch "
            f"size ({largest}): service times are measured, not extrapolated"
        )
