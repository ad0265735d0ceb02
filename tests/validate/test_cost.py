import math

import pytest

from qbench.errors import QbenchError
from qbench.validate.cost import usd_per_million


def test_cost_per_million_by_hand():
    # $0.10 an hour at 1,000 inferences a second: 0.10 / 3600 / 1000 * 1e6 = $0.02778 per million
    assert usd_per_million(0.10, 1000.0) == pytest.approx(0.0277778, rel=1e-5)
    # $3.60 an hour at 50 a second: 3.60 / 3600 / 50 * 1e6 = $20 per million
    assert usd_per_million(3.60, 50.0) == pytest.approx(20.0)


def test_unknown_throughput_is_nan_and_a_bad_price_an_error():
    assert math.isnan(usd_per_million(1.0, 0.0))
    assert math.isnan(usd_per_million(1.0, math.nan))
    with pytest.raises(QbenchError):
        usd_per_million(0.0, 10.0)


def test_cost_per_million_at_the_budgets_rate_pays_for_the_whole_instances_it_takes():
    from qbench.validate.cost import usd_per_million_at_rate

    # 200 req/s on one instance: $0.10 an hour over 200 a second
    assert usd_per_million_at_rate(0.10, 200.0, 1) == pytest.approx(0.10 / 3600 / 200 * 1e6)  # $0.1389
    # 2,500 req/s on three instances: $0.30 an hour over 2,500 a second: $0.03333, not $0.02778 at 1,000 each
    assert usd_per_million_at_rate(0.10, 2500.0, 3) == pytest.approx(0.033333, rel=1e-4)
    for unknown in (None, 0):  # no count of instances known to meet the budget: no cost
        assert math.isnan(usd_per_million_at_rate(0.10, 200.0, unknown))
