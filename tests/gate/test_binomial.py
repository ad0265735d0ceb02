"""qbench.gate.binomial: sums of binomial probabilities, against hand-computed values."""

from __future__ import annotations

import pytest

from qbench.gate.binomial import at_most, binomial_tail


def test_binomial_tail_against_hand_computed_values():
    # P(X >= 3), X ~ Binomial(5, 0.1): 10 * 0.1^3 * 0.9^2 + 5 * 0.1^4 * 0.9 + 0.1^5 = 0.0081 + 0.00045 + 0.00001
    assert binomial_tail(3, 5, 0.1) == pytest.approx(0.00856)
    assert (binomial_tail(0, 5, 0.1), binomial_tail(1, 5, 0.0), binomial_tail(5, 5, 1.0)) == (1.0, 0.0, 1.0)
    assert binomial_tail(5, 5, 0.5) == pytest.approx(1 / 32)


def test_at_most_against_hand_computed_values():
    # P(X <= 1), X ~ Binomial(4, 0.5): (1 + 4) / 16
    assert at_most(1, 4, 0.5) == pytest.approx(5 / 16)
    assert (at_most(0, 3, 0.0), at_most(2, 3, 1.0), at_most(3, 3, 1.0)) == (1.0, 0.0, 1.0)
