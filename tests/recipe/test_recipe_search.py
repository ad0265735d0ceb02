"""The recipe's `search:` section: its alphas are SmoothQuant alphas, checked by the one rule a variant's
`smoothquant: {alpha}` is checked by (a number in [0, 1] or auto), with the same message."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from qbench.recipe.search import SearchSpec
from qbench.techniques.options import SmoothQuantSpec


@pytest.mark.parametrize("alpha", [0, 0.5, 1, "auto"])
def test_an_alpha_a_variant_takes_the_search_takes(alpha):
    assert SmoothQuantSpec(alpha=alpha).alpha == alpha
    assert SearchSpec(alphas=[alpha]).alphas == [alpha]


@pytest.mark.parametrize("alpha", [-0.1, 1.5, "half", True, None])
def test_an_alpha_a_variant_refuses_the_search_refuses_alike(alpha):
    with pytest.raises(ValidationError) as variant:
        SmoothQuantSpec(alpha=alpha)
    with pytest.raises(ValidationError) as search:
        SearchSpec(alphas=[alpha])
    [variant_error], [search_error] = variant.value.errors(), search.value.errors()
    assert "expected a number from 0 to 1, or 'auto'" in variant_error["msg"]
    assert search_error["msg"] == variant_error["msg"]
