"""Costs per million as judged: computed from the prices asked for and the recorded rates (qbench.pricing.repriced),
never read back from results, and a recorded price that is no price refused."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import yaml
from test_slo import GATE, SLO, _load, _results, _user_recipe

from qbench.cli.app import main
from qbench.errors import QbenchError
from qbench.gate.evaluate import EXIT_PASS, evaluate_gate
from qbench.pricing import repriced
from qbench.recipe.slo import CostSpec
from qbench.report.serving import cheapest, slo_lines
from qbench.results.serving import serving_from_dict


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


def test_no_cheapest_and_no_none_while_a_variant_meets_both_without_a_rate_within_budget():
    """int8-ok meets accuracy and the 10 ms budget at 100 req/s (simulated and served 6 ms: the gate passes it), but
    no highest rate within budget was shown (the search's bound is stricter than one run's p99): it has no cost per
    million. The report said 'cheapest meeting accuracy and SLO: none' beside the gate's pass."""
    results = _results(int8_p99=14.5)  # int8-fast over budget, FP32 over budget (30 ms)
    edited = tuple(replace(v, serving=replace(v.serving, max_rate_rps=None, usd_per_million={}))
                   if v.variant == "int8-ok" else v for v in results.variants)  # fmt: skip
    results = replace(results, variants=edited)
    gate = evaluate_gate(results, GATE, slo=SLO)
    assert gate.status_of("int8-ok", "onnxruntime-cpu") == "pass"
    assert cheapest(results, gate) is None
    assert slo_lines(results, gate)[-1] == (
        "cheapest meeting accuracy and SLO: cannot tell: no rate within the budget was shown for "
        "int8-ok@onnxruntime-cpu, which meet both (no cost per million to rank by)")  # fmt: skip


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
