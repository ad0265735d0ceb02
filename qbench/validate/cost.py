"""Cost per inference from a price per hour and a throughput: USD per million inferences.

    usd_per_million = price_per_hour / 3600 / items_per_second * 1e6

At the measured throughput (back-to-back batches) this is the floor a saturated machine reaches;
at the highest rate meeting the latency budget it is what serving within the SLO costs on instances each loaded to
that rate; at the budget's own rate (`usd_per_million_at_rate`) it is what that traffic costs on the whole instances
it needs, each paid for by the hour whether busy or not (how many: qbench.pricing.instances_at_rate).
"""

from __future__ import annotations

import math

from qbench.errors import QbenchError

SECONDS_PER_HOUR = 3600.0


def usd_per_million(price_per_hour: float, items_per_s: float) -> float:
    """USD per million inferences at `items_per_s`; NaN when the throughput is unknown or zero."""
    if not (price_per_hour > 0 and math.isfinite(price_per_hour)):
        raise QbenchError(f"price_per_hour must be a positive number, got {price_per_hour}")
    if not (items_per_s > 0 and math.isfinite(items_per_s)):
        return math.nan
    return price_per_hour / SECONDS_PER_HOUR / items_per_s * 1e6


def usd_per_million_at_rate(price_per_hour: float, rate_rps: float, instances: int | None) -> float:
    """USD per million inferences serving `rate_rps` on `instances` whole instances, each paid for the hour, over the
    requests they serve (a Poisson stream split at random over them is Poisson at rate / instances on each); NaN when
    no count of instances is known to meet the budget (None or 0)."""
    if not instances:
        return math.nan
    return instances * usd_per_million(price_per_hour, rate_rps)
