"""The recipe's `slo:` and `cost:` sections: defaults and load-time checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_spec import error_of, with_changes, write_recipe

from qbench.recipe.spec import Recipe, load_recipe


def test_slo_and_cost_load_with_their_defaults(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, with_changes(
        slo={"p99_ms": 20, "rate_rps": 200, "backends": {"onnxruntime-cpu": {"p99_ms": 5, "batch_size": 1}}},
        cost={"price_per_hour": {"onnxruntime-cpu": 0.1}},
    )))  # fmt: skip
    assert recipe.slo.p99_ms == 20 and recipe.slo.rate_rps == 200
    assert recipe.slo.budget("onnxruntime-cpu").p99_ms == 5
    assert recipe.slo.budget("tensorrt").rate_rps == 200
    assert recipe.slo.queue_delay_ms("tensorrt") == pytest.approx(2.0)  # a tenth of the 20 ms budget
    assert recipe.slo.applies("int8", ["int8*"]) and not recipe.slo.applies("fp16", ["int8*"])
    assert recipe.cost.price_per_hour == {"onnxruntime-cpu": 0.1}


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"slo": {"p99_ms": 20}}, "give `batch_size` (a fixed batch) or `rate_rps`"),
        ({"slo": {"p99_ms": 20, "batch_size": 1, "rate_rps": 5}}, "not both or neither"),
        ({"slo": {"p99_ms": -1, "batch_size": 1}}, "slo.p99_ms"),
        ({"slo": {"p99_ms": 20, "batch_size": 4}},
         "slo.batch_size: got 4, expected one of the latency batch sizes 1, 32"),
        ({"slo": {"p99_ms": 20, "rate_rps": 5, "backends": {"tensorrt": {"p99_ms": 1, "rate_rps": 9}}}},
         "slo.backends: got 'tensorrt'"),
        ({"slo": {"p99_ms": 20, "rate_rps": 5, "load": {"max_batch_size": 64}}}, "slo.load.max_batch_size: got 64"),
        ({"cost": {"price_per_hour": {"onnxruntime-cpu": 0}}},
         "cost.price_per_hour.onnxruntime-cpu: input should be greater than 0"),
        ({"cost": {"price_per_hour": {"onnxruntime-cpu": float("inf")}}},
         "cost.price_per_hour.onnxruntime-cpu: input should be a finite"),
        # numpy's generator refuses a negative seed: found at the sweep's first draw, after building every variant
        ({"slo": {"p99_ms": 20, "rate_rps": 5, "load": {"seed": -1}}},
         "slo.load.seed: input should be greater than or equal to 0"),
        # a p99 from 50 timed runs is an interpolation between the two slowest: no run stands for the slowest 1 %
        ({"latency": {"batch_sizes": [1, 32], "iterations": 50}, "slo": {"p99_ms": 20, "batch_size": 1}},
         "latency.iterations: got 50, expected at least 100 with an `slo:` budget"),
        ({"cost": {"price_per_hour": {"onnxruntime-gpu": 1.0}}}, "cost.price_per_hour: got 'onnxruntime-gpu'"),
    ],
)  # fmt: skip
def test_bad_serving_sections_are_one_line_errors(tmp_path, changes, expected):
    message = error_of(tmp_path, with_changes(**changes))
    assert expected in message and message.startswith("recipe.yaml")


SHIPPED = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_recipe_is_valid(path):
    """The schema and cross-field checks of each recipe in recipes/ (its files are built by the demos)."""
    recipe = Recipe.model_validate(yaml.safe_load(path.read_text()))
    if path.name in ("digits.yaml", "minilm.yaml"):  # the demos answer the serving questions too
        assert recipe.slo is not None and recipe.slo.rate_rps is not None and recipe.slo.p99_ms > 0
        assert set(recipe.cost.price_per_hour) == set(recipe.backends)
