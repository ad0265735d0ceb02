"""Costs per million as judged: computed from the prices asked for and the recorded rates (qbench.pricing.repriced),
never read back from results, and a recorded price that is no price refused."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import yaml
from sweep_factory import make_sweep, make_variant
from test_slo import BUDGET_SIZES, GATE, SLO, _load, _results, _serving, _timed, _user_recipe

from qbench.cli.app import main
from qbench.errors import QbenchError
from qbench.gate.evaluate import EXIT_PASS, evaluate_gate
from qbench.pricing import repriced
from qbench.recipe.slo import CostSpec, SloSpec
from qbench.report.serving import cheapest, slo_lines
from qbench.results.serving import LoadStats, serving_from_dict


def test_costs_are_computed_again_from_the_price_and_rates_not_read_back():
    """int8-fast ($0.25 recorded at 400 req/s) and int8-ok ($0.50 at 200 req/s) both meet the 10 ms budget at the
    budget's 100 req/s; the results (edited, or priced at another price) say int8-ok costs $0.001 there. At $0.36/h
    one instance of either serves 100 req/s for 0.36 / 3600 / 100 x 1e6 = $1.00 per million, so the tie goes to the
    higher rate: int8-fast, at 0.36 / 3600 / 400 x 1e6 = $0.25 per million at that rate."""
    results = _results(int8_p99=9.0)
    edited = tuple(replace(v, serving=replace(v.serving, usd_per_million={"max_rate": 0.001, "at_rate": 0.001}))
                   if v.variant == "int8-ok" else v for v in results.variants)  # fmt: skip
    results = replace(results, variants=edited)
    gate = evaluate_gate(results, GATE, slo=SLO)
    assert gate.exit_code == EXIT_PASS
    assert cheapest(results, gate).variant.variant == "int8-ok"  # the edited figure, as it stood
    judged = repriced(results, CostSpec(price_per_hour={"onnxruntime-cpu": 0.36}))
    ok, fast = (judged.find(name, "onnxruntime-cpu").serving for name in ("int8-ok", "int8-fast"))
    assert ok.usd_per_million["at_rate"] == pytest.approx(1.0) == fast.usd_per_million["at_rate"]
    assert ok.usd_per_million["max_rate"] == pytest.approx(0.5) and fast.usd_per_million["max_rate"] == pytest.approx(0.25)
    assert slo_lines(judged, gate)[-1] == (
        "cheapest meeting accuracy and SLO: int8-fast@onnxruntime-cpu (up to 400 req/s within budget, $0.25 per "
        "million there; $1 per million at the budget's 100 req/s on 1 instance)")  # fmt: skip
    # no price in the recipe: the one recorded at sweep time (`--price`), its figures computed again
    kept = repriced(results, None).find("int8-ok", "onnxruntime-cpu").serving
    assert kept.price_per_hour == 0.36 and kept.usd_per_million["at_rate"] == pytest.approx(1.0)


@pytest.mark.parametrize("price", [0.0, -0.5])
def test_a_recorded_price_that_is_no_price_is_refused_naming_its_field(price):
    with pytest.raises(QbenchError, match=rf"variants\[2\].serving.price_per_hour: got {price}, expected a positive"):
        serving_from_dict({"preprocess_ms_per_row": 0.01, "price_per_hour": price}, "variants[2].serving")


@pytest.mark.slow
def test_the_gate_ranks_by_the_recipes_price_changed_since_the_sweep(tmp_path, monkeypatch, capsys):
    """`cost:` is judged, not measured: a price changed after the sweep leaves the results current, and the gate
    named the cheapest by the sweep's costs ($0.36/h) under a recipe pricing the machine at $3.60/h."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("qbench.validate.latency.others_cpus", lambda start, end: 0.0)
    recipe = _user_recipe(tmp_path, p99_ms=10_000.0)
    assert main(["sweep", str(recipe), "--no-track", "--price", "onnxruntime-cpu=0.36"]) == EXIT_PASS
    capsys.readouterr()
    body = yaml.safe_load(recipe.read_text())
    recipe.write_text(yaml.safe_dump({**body, "cost": {"price_per_hour": {"onnxruntime-cpu": 3.6}}}, sort_keys=False))
    assert main(["gate", str(recipe)]) == EXIT_PASS
    shown = "".join(capsys.readouterr()).splitlines()
    line = next(line for line in shown if line.startswith("cheapest meeting"))
    assert line.endswith("$5 per million at the budget's 200 req/s on 1 instance)")  # 3.6 / 3600 / 200 x 1e6 (was $0.5)


def test_the_only_variant_meeting_both_is_the_cheapest_though_its_real_search_claimed_no_rate():
    """int8-ok meets accuracy and the 10 ms budget at 100 req/s (simulated and served 6 ms: the gate passes it), but
    the real search claimed no highest rate within budget. The report said 'none' beside the gate's pass, then
    'cannot tell' with nothing to rank it against: it is the cheapest, its cost per million at most $0.36/h at the
    100 req/s a real run met, 0.36 / 3600 / 100 x 1e6 = $1, and at least nothing known (no simulated rate)."""
    results = _results(int8_p99=14.5)  # int8-fast over budget, FP32 over budget (30 ms)
    edited = tuple(replace(v, serving=replace(v.serving, max_rate_rps=None, usd_per_million={}))
                   if v.variant == "int8-ok" else v for v in results.variants)  # fmt: skip
    results = replace(results, variants=edited)
    gate = evaluate_gate(results, GATE, slo=SLO)
    assert gate.status_of("int8-ok", "onnxruntime-cpu") == "pass"
    assert cheapest(results, gate).variant.variant == "int8-ok"
    assert slo_lines(repriced(results, None), gate)[-1] == (
        "cheapest meeting accuracy and SLO: int8-ok@onnxruntime-cpu (met the budget for real at 100 req/s, no higher "
        "rate claimed, no simulated rate bounding it, at most $1 per million; $1 per million at the budget's 100 req/s "
        "on 1 instance)")  # fmt: skip


# USD per hour: a MiniLM INT8 at $0.27 per million at its 86 req/s (0.0836 / 3600 / 86 x 1e6 = $0.2700)
MINILM_PRICE = 0.0836
MINILM_SLO = SloSpec.model_validate({"p99_ms": 250.0, "rate_rps": 20.0, "load": {"max_queue_delay_ms": 1.0}})


def _minilm(name: str, backend: str, rate: float, p99_ms: float, max_rate: float | None, simulated: float,
            price: float = MINILM_PRICE):  # fmt: skip
    """A variant met at the budget's `rate` (simulated, and served for real where no real run at a rate at least as
    high met the budget), whose real search claimed `max_rate` below the `simulated` highest rate within budget."""
    load = LoadStats(rate, 5000, p99_ms / 2, p99_ms * 0.9, p99_ms, p99_ms / 2, 1.0, 1.0, rate)
    served = replace(load, requests=200) if max_rate is None or max_rate < rate else None
    serving = replace(_serving(6.0, 0.0, 0.0), budget_ms=250.0, rate_rps=rate, at_rate=load, served_at_rate=served,
                      max_rate_rps=max_rate, simulated_max_rate_rps=simulated, price_per_hour=price,
                      usd_per_million={})  # fmt: skip
    precision = "fp32" if name == "fp32" else "int8"
    return replace(_timed(make_variant(name, precision, backend=backend)), serving=serving)


def _minilm_sweep(*variants):
    results = make_sweep(list(variants))
    return repriced(replace(results, recipe={**results.recipe, **BUDGET_SIZES}), None)


def test_a_variant_whose_real_search_claimed_no_rate_is_ranked_by_the_range_its_rate_lies_in():
    """MiniLM at 20 req/s within 250 ms: FP32 served there for real (p99 65.9 ms), simulated up to 39.6 req/s, its
    real search claimed none (one run at 39.6 missed); INT8 met it up to 86 req/s. One instance of either serves 20
    req/s for 0.0836 / 3600 / 20 x 1e6 = $1.161 per million, and the tie goes to the higher rate: INT8's 86 is above
    any FP32 can be claimed at (never above its simulated 39.6). The report said 'cannot tell: no rate within the
    budget was shown for fp32', though one was (20 req/s) and the answer did not depend on it."""
    fp32 = _minilm("fp32", "onnxruntime-cpu", 20.0, 65.9, None, 39.6)
    results = _minilm_sweep(fp32, _minilm("int8", "onnxruntime-cpu", 20.0, 40.0, 86.0, 120.0))
    gate = evaluate_gate(results, GATE, slo=MINILM_SLO)
    assert gate.exit_code == EXIT_PASS
    judged_fp32 = results.find("fp32", "onnxruntime-cpu").serving
    assert "max_rate" not in judged_fp32.usd_per_million  # no rate claimed, so no cost at it
    assert judged_fp32.usd_per_million["at_rate"] == pytest.approx(1.161111, rel=1e-5)  # one instance met 20 req/s
    assert slo_lines(results, gate)[-1] == (
        "cheapest meeting accuracy and SLO: int8@onnxruntime-cpu (up to 86.0 req/s within budget, $0.27 per million "
        "there; $1.161 per million at the budget's 20 req/s on 1 instance)")  # fmt: skip
    # INT8 claimed 30 req/s only: inside FP32's 20 to 39.6, so either may be the higher: no variant is named
    results = _minilm_sweep(fp32, _minilm("int8", "onnxruntime-cpu", 20.0, 40.0, 30.0, 120.0))
    assert cheapest(results, gate) is None
    assert slo_lines(results, gate)[-1] == (
        "cheapest meeting accuracy and SLO: cannot tell: fp32@onnxruntime-cpu, int8@onnxruntime-cpu each cost $1.161 "
        "per million at the budget's 20 req/s, and the tie goes to the higher rate within budget, which their figures "
        "do not order: fp32@onnxruntime-cpu (met the budget for real at 20.0 req/s, no higher rate claimed, at most "
        "the simulated 39.6 req/s, $0.5864 to $1.161 per million); int8@onnxruntime-cpu (up to 30.0 req/s within "
        "budget, $0.7741 per million)")  # fmt: skip


@pytest.mark.parametrize(("int8_price", "int8_rate", "named"), [
    (MINILM_PRICE, 86.0, "int8"),  # $0.2700 below FP32's least, $0.5864 (at its simulated 39.6 req/s)
    (0.5, 86.0, "fp32"),  # $1.615 above FP32's most, $1.161 (at the 20 req/s it met for real)
    (MINILM_PRICE, 30.0, None),  # $0.7741 within FP32's $0.5864 to $1.161: cannot tell
])  # fmt: skip
def test_costs_at_the_highest_rates_are_ranked_by_their_ranges_where_a_rate_was_not_claimed(int8_price, int8_rate,
                                                                                            named):
    """Per-backend budgets at different rates (20 and 30 req/s) are ranked at the highest rates within budget. FP32's
    lies between the 20 req/s a real run met and its simulated 39.6, so its cost per million between
    0.0836 / 3600 / 39.6 x 1e6 = $0.5864 and 0.0836 / 3600 / 20 x 1e6 = $1.161: a variant is named only where its
    cost is below the other's whatever FP32's rate in that range."""
    slo = SloSpec.model_validate({**MINILM_SLO.model_dump(), "backends": {"torch-cpu": {"p99_ms": 250.0,
                                                                                         "rate_rps": 30.0}}})
    results = _minilm_sweep(_minilm("fp32", "onnxruntime-cpu", 20.0, 65.9, None, 39.6),
                            _minilm("fp32", "torch-cpu", 30.0, 400.0, None, 10.0, int8_price),
                            _minilm("int8", "torch-cpu", 30.0, 40.0, int8_rate, 120.0, int8_price))  # fmt: skip
    gate = evaluate_gate(results, GATE, slo=slo)
    choice = cheapest(results, gate)
    line = slo_lines(results, gate)[-1]
    if named is None:
        assert choice is None and line.startswith("cheapest meeting accuracy and SLO: cannot tell: the costs of ")
        assert "$0.5864 to $1.161 per million" in line and "$0.7741 per million" in line and line.endswith("overlap")
    else:
        assert choice.variant.variant == named and line.startswith(f"cheapest meeting accuracy and SLO: {named}@")


def test_the_budgets_rate_is_priced_on_instances_whose_share_of_it_the_simulation_shows_within_budget():
    """A batch of 8 in 1 ms behind a 10 ms queue delay meets a 4 ms budget from about 4,000 req/s (each lower rate
    waits for company) up to 6,937.5 req/s on this seed. 7,500 req/s was priced on ceil(7,500 / 6,937.5) = 2
    instances, each at 3,750 req/s, whose p99 is 4.3 ms: none of 2 to 5 instances meets the budget, so no cost; 9,000
    and 12,000 req/s split over 2 instances (4,500 and 6,000 req/s each) are within it."""
    from qbench.pricing import instances_at_rate, priced, split_instances
    from qbench.results.serving import ServingResult
    from qbench.validate.load import Batcher, Draws, FixedServiceTime, LoadReplay

    replay = LoadReplay(FixedServiceTime(1.0, max_batch_size=8), Batcher(8, 10.0), Draws.make(5000, seed=0))
    assert replay.verdict(7500 / 2, 4.0)[1].p99_ms > 4.0
    for rate, instances in ((7500.0, 0), (9000.0, 2), (12000.0, 2)):
        missed = replace(_load(4.5, rate), overloaded=rate > 8000)  # one instance misses the budget at the rate
        serving = ServingResult(preprocess_ms_per_row=0.0, budget_ms=4.0, rate_rps=rate, at_rate=missed,
                                served_at_rate=missed, max_rate_rps=6937.5)  # fmt: skip
        serving = replace(serving, split_instances=split_instances(serving, replay, 0.0))
        assert serving.split_instances == instances
        cost = priced(serving, 0.36, ()).usd_per_million["at_rate"]
        if instances:
            assert instances_at_rate(serving) == instances
            assert cost == pytest.approx(instances * 0.36 / 3600 / rate * 1e6)
        else:
            assert instances_at_rate(serving) is None and math.isnan(cost)
