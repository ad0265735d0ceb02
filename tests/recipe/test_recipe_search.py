"""The recipe's `search:` section: its alphas are SmoothQuant alphas, checked by the one rule a variant's
`smoothquant: {alpha}` is checked by (a number in [0, 1] or auto), with the same message; its batch sizes are latency
batch sizes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from test_spec import error_of, with_changes, write_recipe

from qbench.recipe.search import SearchSpec
from qbench.recipe.spec import load_recipe
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


def test_the_search_batch_sizes_load_and_leave_a_recipe_without_them_as_it_was(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, with_changes(search={"batch_sizes": [32]})))
    assert recipe.search.batch_sizes == [32]
    # a field added later: a search without it dumps (and fingerprints) as before
    assert "batch_sizes" not in SearchSpec().model_dump() and SearchSpec(batch_sizes=[1]).model_dump()["batch_sizes"]


@pytest.mark.parametrize(
    ("batch_sizes", "expected"),
    [([4], "search.batch_sizes: got 4, expected one of the latency batch sizes 1, 32"),
     ([32, 32], "search.batch_sizes: batch size 32 is listed twice"), ([], "search.batch_sizes: "),
     ([0], "search.batch_sizes[0]: input should be greater than 0")],
)  # fmt: skip
def test_search_batch_sizes_that_are_no_latency_batch_size_are_one_line_errors(tmp_path, batch_sizes, expected):
    message = error_of(tmp_path, with_changes(search={"batch_sizes": batch_sizes}))
    assert expected in message and message.startswith("recipe.yaml") and "\n" not in message
