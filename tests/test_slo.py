"""The latency budget as a gate check (fail closed), the cheapest variant meeting both, and MLflow figures;
end to end through `qbench sweep` / `qbench gate` on a small user model."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import yaml
from sweep_factory import make_sweep, make_variant
from user_model import make_user_project

from qbench.cli.app import main
from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, EXIT_UNUSABLE, GateSpec, evaluate_gate
from qbench.gate.report import check_line, failure_reasons
from qbench.recipe.slo import SloSpec
from qbench.report.serving import cheapest, slo_lines
from qbench.results.serving import LoadStats, ServingResult
from qbench.serving import serving_metrics
from qbench.slo import SLO_METRIC, SLO_SCOPE, judge_slo, p99_basis

SLO = SloSpec.model_validate({"p99_ms": 10.0, "rate_rps": 100.0, "load": {"max_queue_delay_ms": 1.0}})
GATE = GateSpec(metric="accuracy", max_drop=0.05, max_slice_drop=0.1)
BUDGET_SIZES = {"latency": {"batch_sizes": [1, 32]}}


def _load(p99_ms: float, rate: float = 100.0) -> LoadStats:
    return LoadStats(rate, 5000, p99_ms / 2, p99_ms * 0.9, p99_ms, p99_ms / 2, 0.1, 1.2, rate)


def _serving(p99_ms: float | None, max_rate: float, cost: float) -> ServingResult:
    return ServingResult(
        preprocess_ms_per_row=0.01, budget_ms=10.0, rate_rps=100.0, max_batch_size=32, max_queue_delay_ms=1.0,
        requests=5000, seed=0, at_rate=_load(p99_ms) if p99_ms is not None else None,
        served_at_rate=_load(p99_ms) if p99_ms is not None else None, max_rate_rps=max_rate,
        price_per_hour=0.36, usd_per_million={"b32": cost / 4, "max_rate": cost},
    )  # fmt: skip


def _timed(variant, runs: int = 200):
    """`variant` with `runs` timed runs at every batch size (a p99 needs at least 100)."""
    points = tuple(replace(p, iterations=runs) for p in variant.latency.points)
    return replace(variant, latency=replace(variant.latency, points=points))


def _results(int8_p99: float | None = 14.5):
    fp32 = replace(_timed(make_variant("fp32", "fp32")), serving=_serving(30.0, 50.0, 2.0))
    fast = replace(_timed(make_variant("int8-fast", "int8")), serving=_serving(int8_p99, 400.0, 0.25))
    ok = replace(_timed(make_variant("int8-ok", "int8")), serving=_serving(6.0, 200.0, 0.5))
    results = make_sweep([fp32, fast, ok])
    return replace(results, recipe={**results.recipe, **BUDGET_SIZES})


def test_accurate_but_too_slow_breaches_with_a_line_naming_it():
    gate = evaluate_gate(_results(), GATE, slo=SLO)
    assert gate.exit_code == EXIT_BREACH
    breach = next(c for c in gate.breaches)
    assert (breach.variant, breach.scope, breach.metric) == ("int8-fast", SLO_SCOPE, SLO_METRIC)
    assert (breach.reference, breach.observed, breach.drop) == (10.0, 14.5, pytest.approx(4.5))
    assert gate.status_of("int8-fast", "onnxruntime-cpu") == "fail"
    assert gate.status_of("int8-ok", "onnxruntime-cpu") == "pass"
    assert not any(c.variant == "fp32" for c in gate.checks)  # the reference is never gated
    lines = slo_lines(_results(), gate)
    assert lines[0] == ("SLO BREACH int8-fast@onnxruntime-cpu: p99 14.5 ms at 100 req/s > budget 10 ms "
                        "(+4.5 ms, +45.0%; from 200 timed runs per batch size)")  # fmt: skip
    assert lines[-1] == ("cheapest meeting accuracy and SLO: int8-ok@onnxruntime-cpu "
                         "(up to 200 req/s within budget, $0.5 per million)")  # fmt: skip


def test_the_p99_basis_names_simulated_requests_only_when_the_timed_runs_were_not_fewer():
    under_load = SimpleNamespace(at_rate=SimpleNamespace(requests=5000))
    assert p99_basis(5000, under_load) == "5,000 simulated requests"  # type: ignore[arg-type]
    assert p99_basis(200, under_load) == "200 timed runs per batch size"  # type: ignore[arg-type]
    assert p99_basis(300, None) == "300 timed runs per batch size"


def test_a_budget_tightened_since_the_sweep_names_no_cheapest_variant_from_the_old_rates():
    """The rates within budget were simulated for 10 ms: under a 0.5 ms budget they answer another question."""
    tight = SloSpec.model_validate({**SLO.model_dump(), "p99_ms": 0.5})
    gate = evaluate_gate(_results(), GATE, slo=tight)
    assert {c.status for c in gate.checks if c.scope == SLO_SCOPE} == {"breach"}
    assert slo_lines(_results(), gate)[-1] == ("cheapest meeting accuracy and SLO: cannot tell: the budget is 0.5 ms "
                                               "now, the sweep simulated 10 ms (re-run `qbench sweep`)")  # fmt: skip


def test_a_budget_the_simulation_meets_but_the_real_server_misses_breaches():
    """Simulated p99 6 ms within the 10 ms budget, but the real server at the same rate took 12 ms, or fell behind:
    a breach on the worse figure, never a pass; a real figure lost (NaN) cannot be judged."""
    results = _results()
    ok = results.find("int8-ok", "onnxruntime-cpu")
    for served in (_load(12.0), replace(_load(5.0), overloaded=True), replace(_load(5.0), p99_ms=math.nan)):
        variant = replace(ok, serving=replace(ok.serving, served_at_rate=served))
        judged = replace(results, variants=tuple(variant if v.variant == "int8-ok" else v for v in results.variants))
        judgements, problems = judge_slo(judged, SLO, [("int8-ok", "onnxruntime-cpu")], [1, 32])
        if math.isnan(served.p99_ms):
            assert not judgements and "NaN" in problems[0]
        else:
            assert [j.status for j in judgements] == ["breach"] and not problems
    for max_rate in (None, 99.0):  # no real run at or above the budget's 100 req/s: nothing real to judge by
        missing = replace(ok, serving=replace(ok.serving, served_at_rate=None, max_rate_rps=max_rate))
        judged = replace(results, variants=tuple(missing if v.variant == "int8-ok" else v for v in results.variants))
        judgements, problems = judge_slo(judged, SLO, [("int8-ok", "onnxruntime-cpu")], [1, 32])
        assert not judgements and "re-run `qbench sweep`" in problems[0]


def test_a_real_run_at_the_budgets_rate_that_cannot_tell_whether_the_server_keeps_up_cannot_be_judged():
    """Simulated and served p99 within the budget, but the real run could not tell whether one instance keeps up
    (the 95 % rule passed such runs 1-3 % short of the rate): no pass, one line saying why (exit 2); a p99 over the
    budget is a breach all the same."""
    results = _results()
    ok = results.find("int8-ok", "onnxruntime-cpu")
    why = "capacity 97 req/s to 104 req/s at 99%, not above the rate"
    for p99, status in ((5.0, None), (12.0, "breach")):
        served = replace(_load(p99), keep_up_undecided=why)
        variant = replace(ok, serving=replace(ok.serving, served_at_rate=served))
        judged = replace(results, variants=tuple(variant if v.variant == "int8-ok" else v for v in results.variants))
        judgements, problems = judge_slo(judged, SLO, [("int8-ok", "onnxruntime-cpu")], [1, 32])
        if status is None:
            assert not judgements and problems == [
                "int8-ok@onnxruntime-cpu: SLO: the real run at the budget's rate (100 req/s) cannot tell whether one "
                f"instance keeps up ({why}): re-run `qbench sweep` on a machine nothing else runs on, or budget a rate "
                "further from the instance's capacity"]
            assert evaluate_gate(judged, GATE, slo=SLO).exit_code == EXIT_UNUSABLE
        else:
            assert [j.status for j in judgements] == [status] and not problems


def test_real_runs_at_a_higher_rate_stand_for_the_budgets_rate():
    """No real run at the budget's 100 req/s, but two at 150 req/s met the budget (max_rate_rps): judged on the
    simulation at 100 req/s, which breaches where it misses the budget."""
    results = _results()
    ok = results.find("int8-ok", "onnxruntime-cpu")
    for simulated, status in ((6.0, "pass"), (12.0, "breach")):
        variant = replace(ok, serving=replace(ok.serving, served_at_rate=None, max_rate_rps=150.0,
                                              at_rate=_load(simulated)))  # fmt: skip
        judged = replace(results, variants=tuple(variant if v.variant == "int8-ok" else v for v in results.variants))
        judgements, problems = judge_slo(judged, SLO, [("int8-ok", "onnxruntime-cpu")], [1, 32])
        assert not problems and [(j.status, j.observed_ms) for j in judgements] == [(status, simulated)]


def test_within_budget_passes_and_is_the_cheapest():
    results = _results(int8_p99=9.0)
    gate = evaluate_gate(results, GATE, slo=SLO)
    assert gate.exit_code == EXIT_PASS
    assert cheapest(results, gate).variant.variant == "int8-fast"  # $0.25 beats $0.50; FP32 is over budget


def test_the_cheapest_is_ranked_by_what_the_budgets_rate_costs_on_the_instances_it_takes():
    """At the budget's 100 req/s one instance of either backend meets the budget: int8-ok on a $0.10/h machine (up to
    200 req/s) costs $0.278 per million, int8-fast on a $0.16/h one (up to 400 req/s) $0.444. At their highest rates
    alone ($0.139 and $0.111) int8-fast was named the cheapest: the headroom it is paid for serves no request."""
    from qbench.validate.cost import usd_per_million, usd_per_million_at_rate

    def priced(variant, price, max_rate):
        costs = {"max_rate": usd_per_million(price, max_rate), "at_rate": usd_per_million_at_rate(price, 100.0, 1)}
        return replace(variant, serving=replace(_serving(6.0, max_rate, 0.0), price_per_hour=price,
                                                usd_per_million=costs))

    fp32 = replace(_timed(make_variant("fp32", "fp32")), serving=_serving(30.0, 50.0, 2.0))
    ok = priced(_timed(make_variant("int8-ok", "int8")), 0.10, 200.0)
    fast = priced(_timed(make_variant("int8-fast", "int8", backend="torch-cpu")), 0.16, 400.0)
    fp32_torch = replace(_timed(make_variant("fp32", "fp32", backend="torch-cpu")), serving=_serving(30.0, 50.0, 2.0))
    results = make_sweep([fp32, ok, fp32_torch, fast])
    results = replace(results, recipe={**results.recipe, **BUDGET_SIZES})
    gate = evaluate_gate(results, GATE, slo=SLO)
    assert gate.exit_code == EXIT_PASS
    assert cheapest(results, gate).variant.key == "int8-ok@onnxruntime-cpu"
    assert slo_lines(results, gate)[-1] == (
        "cheapest meeting accuracy and SLO: int8-ok@onnxruntime-cpu "
        "(up to 200 req/s within budget, $0.1389 per million there; "
        "$0.2778 per million at the budget's 100 req/s on 1 instance)")  # fmt: skip
    no_rate = [replace(v, serving=replace(v.serving,
                                          usd_per_million={"max_rate": v.serving.usd_per_million["max_rate"]}))
               if v.variant != "fp32" else v for v in results.variants]  # fmt: skip
    assert cheapest(replace(results, variants=tuple(no_rate)), gate).variant.key == "int8-fast@torch-cpu"


def test_an_overloaded_budget_rate_breaches_whatever_its_simulated_p99():
    """A p99 within budget over a finite simulation, at a rate the instance cannot sustain: a breach, said so."""
    results = _results(int8_p99=9.0)
    fast = results.find("int8-fast", "onnxruntime-cpu")
    overloaded = replace(fast.serving, at_rate=replace(fast.serving.at_rate, overloaded=True), max_rate_rps=80.0)
    results = replace(results, variants=tuple(replace(v, serving=overloaded) if v is fast else v
                                              for v in results.variants))
    gate = evaluate_gate(results, GATE, slo=SLO)
    assert gate.exit_code == EXIT_BREACH and gate.status_of("int8-fast", "onnxruntime-cpu") == "fail"
    assert gate.status_of("int8-ok", "onnxruntime-cpu") == "pass"
    line = slo_lines(results, gate)[0]
    assert line.startswith("SLO BREACH int8-fast@onnxruntime-cpu: overloaded at 100 req/s") and "max 80.0 req/s" in line
    # no real rate claimed below a simulated one: not said to be no rate within budget at all
    unclaimed = replace(overloaded, max_rate_rps=None, simulated_max_rate_rps=90.0)
    line = slo_lines(replace(results, variants=tuple(replace(v, serving=unclaimed) if v.variant == "int8-fast" else v
                                                     for v in results.variants)), gate)[0]  # fmt: skip
    assert "(simulated up to 90.0 req/s within budget, no real rate claimed)" in line
    assert cheapest(results, gate).variant.variant == "int8-ok"
    fp32 = results.find("fp32", "onnxruntime-cpu")  # the reference is not gated: judged by cheapest() itself
    cheap_fp32 = replace(fp32.serving, at_rate=replace(_load(5.0), overloaded=True), usd_per_million={"max_rate": 0.01})
    results = replace(results, variants=tuple(replace(v, serving=cheap_fp32) if v is fp32 else v
                                              for v in results.variants))
    assert cheapest(results, gate).variant.variant == "int8-ok"


def _loaded(results, variant: str, others_cpus: float, batch_size: int):
    """`results` with `variant` timed at `batch_size` while other processes kept `others_cpus` CPUs busy."""
    def loaded(v):
        points = tuple(replace(p, others_cpus=others_cpus) if p.batch_size == batch_size else p
                       for p in v.latency.points)
        return replace(v, latency=replace(v.latency, points=points))
    return replace(results, variants=tuple(loaded(v) if v.variant == variant else v for v in results.variants))


def test_a_breach_timed_beside_other_load_is_no_verdict_but_a_pass_stands():
    """Other processes' load only slows a run: a breach timed beside it may be theirs (exit 2, naming the load and
    what to do), a pass timed beside it holds; a quiet point at another batch size leaves a fixed-batch breach as is."""
    gate = evaluate_gate(_loaded(_results(), "int8-fast", 1.5, 32), GATE, slo=SLO)
    assert gate.exit_code == EXIT_UNUSABLE
    assert gate.problems == ("int8-fast@onnxruntime-cpu: SLO: a breach timed while other processes kept CPUs busy "
                             "(1.50 at batch 32) is no verdict on the variant: re-run `qbench sweep` on a machine "
                             "nothing else runs on",)  # fmt: skip
    assert not any(c.variant == "int8-fast" and c.scope == SLO_SCOPE for c in gate.checks)
    passing = evaluate_gate(_loaded(_results(), "int8-ok", 1.5, 32), GATE, slo=SLO)
    assert passing.status_of("int8-ok", "onnxruntime-cpu") == "pass" and not passing.problems
    tight = SloSpec.model_validate({"p99_ms": 1.505, "batch_size": 1})
    assert evaluate_gate(_loaded(_results(9.0), "int8-fast", 1.5, 32), GATE, slo=tight).exit_code == EXIT_BREACH
    assert evaluate_gate(_loaded(_results(9.0), "int8-fast", 1.5, 1), GATE, slo=tight).exit_code == EXIT_UNUSABLE


def _crowded(results, variant: str, threads: int, machine: dict):
    """`results` with `variant` timed with `threads` intra-op threads on `machine` (its usable CPUs, `cpus`)."""
    return replace(results, variants=tuple(replace(v, latency=replace(v.latency, threads=threads, machine=machine))
                                           if v.variant == variant else v for v in results.variants))  # fmt: skip


def test_a_breach_timed_with_more_threads_than_usable_cpus_is_no_verdict_but_a_pass_stands():
    """4 threads on 2 usable CPUs take turns: a breach so timed may be the allowance's doing (exit 2, one line naming
    the threads, the CPUs and what to do, the mechanism of a breach timed beside other load); a pass stands (too few
    CPUs only slow a run), and threads within the usable CPUs leave a breach a breach."""
    node = {"cpu": "Intel Xeon", "cpus": 2, "arch": "x86_64", "affinity_cpus": 2, "cpu_quota": None}
    gate = evaluate_gate(_crowded(_results(), "int8-fast", 4, node), GATE, slo=SLO)
    assert gate.exit_code == EXIT_UNUSABLE
    assert gate.problems == ("int8-fast@onnxruntime-cpu: SLO: a breach timed with 4 threads on 2 usable CPUs "
                             "(affinity 2) is no verdict on the variant: re-run `qbench sweep` with latency.threads at "
                             "most 2, or where 4 CPUs are allowed and nothing else runs",)  # fmt: skip
    assert not any(c.variant == "int8-fast" and c.scope == SLO_SCOPE for c in gate.checks)
    passing = evaluate_gate(_crowded(_results(), "int8-ok", 4, node), GATE, slo=SLO)
    assert passing.status_of("int8-ok", "onnxruntime-cpu") == "pass" and not passing.problems
    assert evaluate_gate(_crowded(_results(), "int8-fast", 2, node), GATE, slo=SLO).exit_code == EXIT_BREACH


def test_a_breach_timed_with_more_threads_than_a_fractional_quota_is_no_verdict():
    """2 threads under a 1.5-CPU cgroup quota are throttled each period (their tail is the quota's): a breach so
    timed is no verdict, with the threads that fit (1); 1 thread under that quota leaves a breach a breach."""
    pod = {"cpu": "Intel Xeon", "cpus": 1, "arch": "x86_64", "affinity_cpus": 8, "cpu_quota": 1.5}
    gate = evaluate_gate(_crowded(_results(), "int8-fast", 2, pod), GATE, slo=SLO)
    assert gate.exit_code == EXIT_UNUSABLE
    assert gate.problems == ("int8-fast@onnxruntime-cpu: SLO: a breach timed with 2 threads under a cgroup quota of "
                             "1.50 CPUs (affinity 8) is no verdict on the variant: re-run `qbench sweep` with "
                             "latency.threads at most 1, or where 2 CPUs are allowed and nothing else runs",
                             )  # fmt: skip
    rounded_up = {**pod, "cpus": 2}  # recorded when a 1.5-CPU quota counted as 2 usable CPUs: still no verdict
    assert evaluate_gate(_crowded(_results(), "int8-fast", 2, rounded_up), GATE, slo=SLO).exit_code == EXIT_UNUSABLE
    assert evaluate_gate(_crowded(_results(), "int8-fast", 1, pod), GATE, slo=SLO).exit_code == EXIT_BREACH
    half = {**pod, "cpu_quota": 0.5}  # even 1 thread is throttled, and no thread count fits: where to time it alone
    assert evaluate_gate(_crowded(_results(), "int8-fast", 1, half), GATE, slo=SLO).problems == (
        "int8-fast@onnxruntime-cpu: SLO: a breach timed with 1 thread under a cgroup quota of 0.50 CPUs (affinity 8) "
        "is no verdict on the variant: re-run `qbench sweep` where 1 CPU is allowed and nothing else runs",)


def test_a_missing_load_figure_or_other_settings_fail_closed():
    gate = evaluate_gate(_results(int8_p99=None), GATE, slo=SLO)
    assert gate.exit_code == EXIT_UNUSABLE
    assert any(p.startswith("int8-fast@onnxruntime-cpu: SLO: no load figure") for p in gate.problems)
    other_rate = SloSpec.model_validate({"p99_ms": 10.0, "rate_rps": 150.0, "load": {"max_queue_delay_ms": 1.0}})
    gate = evaluate_gate(_results(int8_p99=9.0), GATE, slo=other_rate)
    assert gate.exit_code == EXIT_UNUSABLE and "other load settings" in gate.problems[0]


def test_a_fixed_batch_budget_adds_the_pre_processing():
    # make_latency: p99 = 1.5 x p50 = 1.5 ms at batch 1; + 0.01 ms pre-processing per row = 1.51 ms
    results = _results(int8_p99=9.0)
    tight = SloSpec.model_validate({"p99_ms": 1.505, "batch_size": 1})
    gate = evaluate_gate(results, GATE, slo=tight)
    checks = [c for c in gate.checks if c.scope == SLO_SCOPE]
    assert [c.observed for c in checks] == [pytest.approx(1.51)] * 2
    assert gate.exit_code == EXIT_BREACH
    loose = SloSpec.model_validate({"p99_ms": 1.515, "batch_size": 1})
    assert evaluate_gate(results, GATE, slo=loose).exit_code == EXIT_PASS


def _with_runs(results, runs: int):
    return replace(results, variants=tuple(_timed(v, runs) for v in results.variants))


def test_a_p99_from_fewer_than_100_samples_cannot_pass():
    """p99 1.5 ms within a 2 ms budget, but from 50 timed runs: their p99 lies between the two slowest, and with
    probability 0.99^50 = 61 % no run at all was among the slowest 1 %. Fail closed (exit 2), naming the count;
    the same figure from 100 runs is judged. Under load the simulated requests draw their service times from the
    timed runs, so 5,000 of them drawn from 50 runs rest on 50."""
    budget = SloSpec.model_validate({"p99_ms": 2.0, "batch_size": 1})
    few = evaluate_gate(_with_runs(_results(int8_p99=9.0), 50), GATE, slo=budget)
    assert few.exit_code == EXIT_UNUSABLE and not any(c.scope == SLO_SCOPE for c in few.checks)
    assert ("int8-fast@onnxruntime-cpu: SLO: the p99 rests on 50 timed runs per batch size, expected at least 100 "
            "(fewer hold no sample beyond their 99th percentile): raise latency.iterations (or slo.load.requests)"
            ) in few.problems  # fmt: skip
    enough = evaluate_gate(_with_runs(_results(int8_p99=9.0), 100), GATE, slo=budget)
    assert enough.exit_code == EXIT_PASS and {c.size for c in enough.checks if c.scope == SLO_SCOPE} == {100}

    under_load = evaluate_gate(_with_runs(_results(int8_p99=9.0), 50), GATE, slo=SLO)
    assert under_load.exit_code == EXIT_UNUSABLE
    assert any("SLO: the p99 rests on 50 timed runs per batch size" in p for p in under_load.problems)
    loaded = evaluate_gate(_results(int8_p99=9.0), GATE, slo=SLO)  # 200 runs, 5,000 requests: 200
    assert {c.size for c in loaded.checks if c.scope == SLO_SCOPE} == {200}


def test_mlflow_figures():
    metrics = serving_metrics(_results().variants[1])
    assert metrics["cost.usd_per_million.max_rate"] == 0.25
    assert metrics["load.p99_ms"] == 14.5 and metrics["load.max_rate_rps"] == 400.0
    assert metrics["time.preprocess_ms_per_row"] == 0.01


def _user_recipe(tmp_path, p99_ms: float):
    recipe = make_user_project(tmp_path) if not (tmp_path / "qbench.yaml").exists() else tmp_path / "qbench.yaml"
    body = yaml.safe_load(recipe.read_text())
    body["gate"] |= {"max_drop": 1.0, "max_slice_drop": 1.0}  # accuracy always passes: the SLO decides
    # 200 req/s: each variant's idle starts are timed after 5.5 ms of idle (idle_ms), not the 20.5 ms of 50 req/s
    body["slo"] = {"p99_ms": p99_ms, "rate_rps": 200.0, "load": {"max_queue_delay_ms": 0.5, "requests": 500}}
    body["latency"]["iterations"] = 100  # the fewest a p99 is judged from
    recipe.write_text(yaml.safe_dump(body, sort_keys=False))
    return recipe


@pytest.mark.slow
def test_sweep_and_gate_exit_1_on_a_tight_budget_and_0_when_loosened(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # timed as on a quiet machine: a breach timed beside other processes' load is no verdict (exit 2, tested above)
    monkeypatch.setattr("qbench.validate.latency.others_cpus", lambda start, end: 0.0)
    recipe = _user_recipe(tmp_path, p99_ms=0.0001)  # 100 ns: no model answers that fast
    assert main(["sweep", str(recipe), "--gate", "--no-track"]) == EXIT_BREACH
    assert main(["gate", str(recipe)]) == EXIT_BREACH
    shown = "".join(capsys.readouterr())  # the sweep's tables on stderr, the gate's on stdout
    assert "SLO BREACH int8-minmax@onnxruntime-cpu: p99 " in shown
    assert "at 200 req/s > budget 0.0001 ms" in shown
    assert "cheapest meeting accuracy and SLO: none" in shown
    recipe = _user_recipe(tmp_path, p99_ms=10_000.0)
    assert main(["sweep", str(recipe), "--gate", "--no-track", "--price", "onnxruntime-cpu=0.36"]) == EXIT_PASS
    shown = "".join(capsys.readouterr())  # the sweep's tables on stderr, the gate's on stdout
    assert "SLO pass int8-pct@onnxruntime-cpu" in shown and "SLO BREACH" not in shown
    assert "cheapest meeting accuracy and SLO: " in shown and "per million" in shown
    from qbench.gate.run import latest_results
    from qbench.recipe.spec import load_recipe
    from qbench.results.schema import read_results

    results = read_results(latest_results(load_recipe(recipe)))
    for variant in results.variants:
        serving = variant.serving
        # the recipe's 500 requests: far below capacity they span the queue's relaxation times many times over, and
        # show the pass alone (judge_rate)
        assert serving.at_rate.requests == 500 and serving.max_rate_rps > 200.0
        point = variant.latency.at(16)
        assert serving.usd_per_million["b16"] == pytest.approx(0.36 / 3600 / point.items_per_s * 1e6)
        assert serving.bound.verdict in ("memory-bound", "compute-bound", "overhead-bound")
        assert math.isfinite(serving.preprocess_ms_per_row) and serving.preprocess_ms_per_row > 0


def test_price_on_the_command_line(tmp_path):
    from qbench.errors import QbenchError
    from qbench.pricing import with_prices
    from qbench.recipe.spec import load_recipe
    from tests.recipe.test_spec import with_changes, write_recipe

    recipe = load_recipe(write_recipe(tmp_path, with_changes(cost={"price_per_hour": {"onnxruntime-cpu": 0.1}})))
    priced = with_prices(recipe, ["onnxruntime-cpu=0.25"])
    assert priced.cost.price_per_hour == {"onnxruntime-cpu": 0.25}
    assert priced.source == recipe.source and priced.fingerprint() == recipe.fingerprint()
    with pytest.raises(QbenchError, match="--price tensorrt=1: backend got 'tensorrt'"):
        with_prices(recipe, ["tensorrt=1"])
    with pytest.raises(QbenchError, match="a positive number"):
        with_prices(recipe, ["onnxruntime-cpu=-2"])
    # no `=`: the backend is missing, not misspelt (it read "backend got '0.10', expected one of onnxruntime-cpu")
    with pytest.raises(QbenchError, match=r"^--price 0.10: expected backend=USD per hour \(e.g. onnxruntime-cpu=0.10\)$"):
        with_prices(recipe, ["0.10"])


def test_cost_figures_of_a_sweep_by_hand(tmp_path):
    """A model taking exactly 1 ms at batch 1 and 2 ms at batch 4, on a $3.60/h machine: 1,000 and 2,000
    inferences/s cost 3.60 / 3600 / 1000 x 1e6 = $1.00 and $0.50 per million; at the highest rate within the
    10 ms budget, 1000 / that rate."""
    import numpy as np

    from qbench.recipe.spec import load_recipe
    from qbench.results.schema import LatencyPoint
    from qbench.serving import serving_figures
    from qbench.validate.load import Batcher, Draws, FixedServiceTime, LoadReplay
    from qbench.validate.load_search import search_max_rate
    from tests.recipe.test_spec import with_changes, write_recipe

    recipe = load_recipe(write_recipe(tmp_path, with_changes(
        latency={"batch_sizes": [1, 4]}, cost={"price_per_hour": {"onnxruntime-cpu": 3.6}},
        slo={"p99_ms": 10.0, "rate_rps": 100.0, "load": {"max_queue_delay_ms": 1.0, "requests": 2000}},
    )))  # fmt: skip
    samples = {1: np.full(200, 1.0), 4: np.full(200, 2.0)}
    points = [LatencyPoint(1, 0, 200, 1.0, 1.0, 1.0, 1.0, 1000.0), LatencyPoint(4, 0, 200, 2.0, 2.0, 2.0, 2.0, 2000.0)]
    # a real server exactly as fast as the timed runs, replaying the draws that showed the simulated rate: the rate
    # served is the simulated one
    replay = LoadReplay(FixedServiceTime(2 / 3, 1 / 3, 4), Batcher(4, 1.0), Draws.make(2000, 0))
    shown = replay.with_requests(search_max_rate(replay, 10.0).requests)

    def server(rate, overhead_ms, budget_ms):
        return shown.at(rate, overhead_ms=overhead_ms)

    serving = serving_figures(recipe, "onnxruntime-cpu", samples, points, model_bytes=4000, runtime={},
                              preprocess_ms_per_row=0.0, server=server)  # fmt: skip
    assert serving.max_rate_rps == serving.simulated_max_rate_rps
    assert serving.price_per_hour == 3.6
    assert serving.usd_per_million["b1"] == pytest.approx(1.0)
    assert serving.usd_per_million["b4"] == pytest.approx(0.5)
    assert 100.0 < serving.max_rate_rps < 2000.0  # the budget holds at 100 req/s; full batches of 4 cap the rate
    assert serving.usd_per_million["max_rate"] == pytest.approx(1000.0 / serving.max_rate_rps)
    # at 100 req/s a request waits the 1 ms queue delay for company, then 1 ms (alone) to 1.33 ms (with one more)
    assert 2.0 <= serving.at_rate.p50_ms <= serving.at_rate.p99_ms <= 1.0 + 2.0


def test_the_frontier_plot_gets_a_cost_panel():
    import re

    from qbench.frontier.svg import frontier_document

    priced = frontier_document(_results())
    plain = frontier_document(make_sweep([make_variant("fp32", "fp32"), make_variant("int8-ok", "int8")]))
    assert (priced.count('<svg class="panel"'), plain.count('<svg class="panel"')) == (3, 2)  # b1, b32 (+ cost)
    cost_panel = priced[priced.index(">cost per inference<"):]
    assert "USD per million inferences" in cost_panel and "cost per inference" not in plain
    x = {name: float(re.search(rf'data-variant="{name}"[^>]* cx="([0-9.]+)"', cost_panel).group(1))
         for name in ("fp32", "int8-fast", "int8-ok")}  # fmt: skip
    assert x["int8-fast"] < x["int8-ok"] < x["fp32"]  # USD 0.0625, 0.125, 0.5 per million at batch 32
    assert "USD 0.125 per million inferences" in cost_panel


def test_the_serving_table_marks_emulated_latency_and_names_the_columns():
    from qbench.report.serving import serving_table
    from qbench.results.schema import EMULATED, NATIVE, Fidelity

    results = _results(int8_p99=9.0)
    emulated = replace(results.variants[2], fidelity=Fidelity(NATIVE, EMULATED))
    results = replace(results, variants=(*results.variants[:2], emulated))
    table = serving_table(results, evaluate_gate(results, GATE, slo=SLO))
    assert table.headers[5] == "p99 ms at 100 req/s" and "$/M b32" in table.headers
    by_name = {row[0]: row for row in table.rows}
    assert by_name["int8-fast"][5] == "9" and by_name["int8-fast"][-2:] == ["pass", "pass"]
    assert by_name["fp32"][-2:] == ["reference", "not budgeted"]
    assert "int8-ok (emulated latency)" in by_name
    assert any(line.startswith("emulated latency:") for line in table.footer)


def test_the_serving_table_shows_no_p99_at_an_overloaded_rate_and_rates_within_budget_rounded_down():
    """At a rate above what one instance sustains the queue grows without bound: the finite simulation's p99 (9 ms
    over 5,000 requests) is no figure of that rate, so the cell says overloaded. A rate within budget of 227,530.6
    req/s is shown 227,530 (3 significant digits showed 2.28e+05, above the rate found), 99.96 req/s as 99.9 (not
    100)."""
    from qbench.report.serving import serving_table

    results = _results(int8_p99=9.0)
    fast, ok = results.find("int8-fast", "onnxruntime-cpu"), results.find("int8-ok", "onnxruntime-cpu")
    overloaded = replace(fast.serving, at_rate=replace(fast.serving.at_rate, overloaded=True), max_rate_rps=227_530.6)
    results = replace(results, variants=tuple(
        replace(v, serving=overloaded) if v is fast else replace(v, serving=replace(ok.serving, max_rate_rps=99.96))
        if v is ok else v for v in results.variants))  # fmt: skip
    gate = evaluate_gate(results, GATE, slo=SLO)
    table = serving_table(results, gate)
    by_name = {row[0]: row for row in table.rows}
    assert by_name["int8-fast"][5] == "overloaded" and by_name["int8-fast"][7] == "227,530"
    assert by_name["int8-ok"][5] == "6" and by_name["int8-ok"][7] == "99.9"
    lines = slo_lines(results, gate)
    assert "(max 227,530 req/s within budget)" in lines[0]
    assert lines[-1].startswith("cheapest meeting accuracy and SLO: int8-ok@onnxruntime-cpu (up to 99.9 req/s within")


def test_batches_served_through_a_batcher_pay_the_gathering_when_busy_and_the_idle_time_when_idle():
    """Timed back to back: 1 ms at batch 1, 2 ms at batch 4; gathering 4 one-row requests takes 1 ms (1 alone: 0);
    from idle: 5 ms and 6 ms. Busy batches of 4 take 2 + 1 = 3 ms, so full batches sustain 4 / 3 ms = 1,333 req/s
    (2,000 from the timed runs alone); an idle batch of 1 takes 5 ms."""
    import numpy as np

    from qbench.serving import served_times
    from qbench.validate.latency import BatcherSamples
    from qbench.validate.load import capacity_rps

    samples = {1: np.full(10, 1.0), 4: np.full(10, 2.0)}
    served = served_times(samples, BatcherSamples({1: 0.0, 4: 1.0}, {1: 5.0, 4: 6.0}))
    assert served.service_ms(4, 0.5) == pytest.approx(3.0)
    assert served.service_ms(1, 0.5, idle=True) == pytest.approx(5.0)
    assert served.service_ms(2, 0.5) == pytest.approx(1.0 + (3.0 - 1.0) / 3)  # a third of the way from 1 to 4
    assert capacity_rps(served, 4) == pytest.approx(4000 / 3)
    assert capacity_rps(served_times(samples, None), 4) == pytest.approx(2000)


def test_idle_batches_are_the_timed_runs_shifted_by_the_idle_starts_median():
    """Timed back to back at batch 1: 1 ms nine times and one 20 ms stall; idle starts' median 3 ms. An idle batch
    is each timed run + (3 - 1) ms: the tail comes from the many timed runs, not from the few idle starts; an idle
    median below the runs' median shifts nothing."""
    import numpy as np

    from qbench.serving import served_times
    from qbench.validate.latency import BatcherSamples

    runs = {1: np.array([1.0] * 9 + [20.0])}
    served = served_times(runs, BatcherSamples({1: 0.0}, {1: 3.0}))
    assert served.service_ms(1, 0.5, idle=True) == pytest.approx(3.0)
    assert served.service_ms(1, 0.95, idle=True) == pytest.approx(22.0)
    assert served.service_ms(1, 0.5) == pytest.approx(1.0)
    assert served_times(runs, BatcherSamples({1: 0.0}, {1: 0.5})).service_ms(1, 0.5, idle=True) == pytest.approx(1.0)


def test_no_cheapest_variant_across_machine_kinds_under_one_price():
    """int8-ok timed on a 96-CPU Xeon node, int8-fast and fp32 on a 2-CPU EPYC one, one $0.36/h price for
    onnxruntime-cpu: int8-fast's $0.25 per million against int8-ok's $0.50 compares the nodes (a 96-CPU node does
    not cost what a 2-CPU one does), so no cheapest variant is named, and the line says why."""
    results = _results(int8_p99=9.0)
    small = {"host": "a", "cpu": "AMD EPYC", "cpus": 2, "arch": "x86_64"}
    large = {"host": "b", "cpu": "Intel Xeon", "cpus": 96, "arch": "x86_64"}
    timed = tuple(replace(v, latency=replace(v.latency, machine=large if v.variant == "int8-ok" else small))
                  for v in results.variants)  # fmt: skip
    gate = evaluate_gate(results, GATE, slo=SLO)
    assert cheapest(replace(results, variants=timed[:2]), gate).variant.variant == "int8-fast"  # one kind: ranked
    mixed = replace(results, variants=timed)
    assert cheapest(mixed, gate) is None
    assert slo_lines(mixed, gate)[-1] == (
        "cheapest meeting accuracy and SLO: cannot tell: onnxruntime-cpu timed its variants on 2 kinds of machine "
        "(AMD EPYC x2 x86_64; Intel Xeon x96 x86_64): its price of $0.36/h is one machine's, and their rates compare "
        "the machines; time every variant of a backend on one kind"
    )  # fmt: skip


def _verdict_lines(results, gate) -> list[str]:
    """Every line the gate prints or writes that states a verdict: the SLO lines, the console lines, the summary, the
    JSON report's checks and the Markdown table's rows (the problems, which may name a variant, left out)."""
    from qbench.gate.report import console_lines, markdown_summary, report_dict, summary_line

    table = [row for row in markdown_summary(gate).splitlines() if row.startswith("| ") and "@" in row]
    checks = [line for line in console_lines(gate) if not line.startswith("UNUSABLE ")]
    return [*slo_lines(results, gate), *checks, summary_line(gate), *map(str, report_dict(gate)["checks"]), *table]


def test_results_refused_as_a_whole_print_the_problems_and_no_check_or_recommendation():
    """A problem with the results as a whole (here a glob of gate.applies_to that picks nothing) is exit 2, yet the
    gate printed `SLO pass` lines, a cheapest variant and every check as a pass beside it."""
    results = _results(int8_p99=9.0)
    gate = evaluate_gate(results, GATE.model_copy(update={"applies_to": ["int8-*", "int4-*"]}), slo=SLO)
    assert gate.exit_code == EXIT_UNUSABLE and gate.checks == () and gate.notes == ()
    assert gate.status_of("int8-ok", "onnxruntime-cpu") == "fail"
    lines = _verdict_lines(results, gate)
    assert not any(word in line.lower() for line in lines for word in ("pass", "breach", "int8-ok", "int8-fast"))
    assert slo_lines(results, gate) == ["cheapest meeting accuracy and SLO: cannot tell: the gate could not judge "
                                        "the results (exit 2, see its problems)"]  # fmt: skip


def test_a_variant_that_cannot_be_judged_withholds_its_own_lines_and_the_recommendation():
    results = _results(int8_p99=9.0)
    failed = make_variant("int8-fast", "int8", error="RuntimeError: no kernel")
    results = replace(results, variants=tuple(failed if v.variant == "int8-fast" else v for v in results.variants))
    gate = evaluate_gate(results, GATE, slo=SLO)
    assert gate.exit_code == EXIT_UNUSABLE
    assert {c.variant for c in gate.checks} == {"int8-ok"}  # judged on results nothing is wrong with
    lines = slo_lines(results, gate)
    assert not any("int8-fast" in line and "SLO" in line and "cannot judge" not in line for line in lines)
    assert lines[-1].startswith("cheapest meeting accuracy and SLO: cannot tell")


def test_a_variant_that_breaches_accuracy_is_never_the_cheapest_of_an_exit_1_gate():
    results = _results(int8_p99=9.0)
    worse = replace(results.find("int8-fast", "onnxruntime-cpu"),
                    accuracy=make_variant("x", "int8", accuracy={"overall": 0.5, "clean": 0.5,
                                                                  "noisy lighting=dark": 0.5}).accuracy)  # fmt: skip
    results = replace(results, variants=tuple(worse if v.variant == "int8-fast" else v for v in results.variants))
    gate = evaluate_gate(results, GATE, slo=SLO)
    assert gate.exit_code == EXIT_BREACH and {c.variant for c in gate.breaches} == {"int8-fast"}
    assert slo_lines(results, gate)[-1].startswith("cheapest meeting accuracy and SLO: int8-ok@onnxruntime-cpu")


def test_a_variant_without_a_price_is_not_named_the_cheapest_beside_priced_ones():
    """int8-ok costs $0.50 per million on onnxruntime-cpu; the same accurate, in-budget INT8 on torch-cpu has no
    price. Ranked as $0 it would be named the cheapest whatever its machine costs: the choice cannot be told."""
    priced = _results(int8_p99=9.0)
    unpriced = replace(_serving(6.0, 300.0, 0.0), price_per_hour=None, usd_per_million={})
    torch_fp32 = replace(_timed(make_variant("fp32", "fp32", backend="torch-cpu")), serving=_serving(30.0, 50.0, 2.0))
    torch_int8 = replace(_timed(make_variant("int8-ok", "int8", backend="torch-cpu")), serving=unpriced)
    results = replace(priced, variants=(*priced.variants, torch_fp32, torch_int8))
    gate = evaluate_gate(results, GATE, slo=SLO)
    assert gate.status_of("int8-ok", "torch-cpu") == "pass"
    assert cheapest(results, gate) is None
    assert slo_lines(results, gate)[-1] == ("cheapest meeting accuracy and SLO: cannot tell: no price for torch-cpu "
                                            "while other backends have one (give every backend cost.price_per_hour, "
                                            "or --price)")  # fmt: skip


def test_a_budget_met_up_to_float_rounding_makes_a_variant_the_cheapest_as_it_passes_the_gate():
    """Budget 1.64 ms at batch 1: p99 1.5 ms + 0.14 ms pre-processing is 1.6400000000000001 in float64, a pass for
    the gate; the cheapest variant meeting accuracy and the SLO is then int8-fast ($0.25), not int8-ok ($0.50)."""
    results = _results(int8_p99=9.0)
    budget = SloSpec.model_validate({"p99_ms": 1.64, "batch_size": 1})
    assert 1.5 + 0.14 > 1.64
    fixed = {"budget_ms": 1.64, "batch_size": 1, "rate_rps": None, "at_rate": None, "preprocess_ms_per_row": 0.14}
    variants = tuple(replace(v, serving=replace(v.serving, **fixed)) for v in results.variants)
    results = replace(results, variants=variants)
    gate = evaluate_gate(results, GATE, slo=budget)
    assert gate.exit_code == EXIT_PASS
    assert cheapest(results, gate).variant.variant == "int8-fast"


def _searched(results, requests: dict[str, tuple[int, bool]]):
    """`results` with each named variant's search having rested on (simulated requests, not settled)."""
    return replace(results, variants=tuple(
        replace(v, serving=replace(v.serving, simulated_requests=requests[v.variant][0],
                                   simulated_undecided=requests[v.variant][1])) if v.variant in requests else v
        for v in results.variants))  # fmt: skip


def test_the_serving_table_shows_the_simulated_requests_and_whether_the_search_settled():
    from qbench.report.serving import serving_table

    results = _searched(_results(int8_p99=9.0), {"int8-fast": (320_000, True), "int8-ok": (20_000, False)})
    table = serving_table(results, evaluate_gate(results, GATE, slo=SLO))
    column = table.headers.index("simulated requests")
    assert column == table.headers.index("max req/s in budget") + 1
    by_name = {row[0]: row[column] for row in table.rows}
    assert by_name == {"fp32": "—", "int8-fast": "320,000 (not settled)", "int8-ok": "20,000"}
    assert any(line.startswith("simulated requests: ") and "up to 320,000" in line for line in table.footer)


def test_mlflow_shows_the_simulated_requests_and_whether_the_search_settled():
    from qbench.track.content import variant_tags

    results = _searched(_results(), {"int8-fast": (320_000, True), "int8-ok": (20_000, False)})
    fast, ok = results.find("int8-fast", "onnxruntime-cpu"), results.find("int8-ok", "onnxruntime-cpu")
    assert serving_metrics(fast)["load.simulated_requests"] == 320_000.0
    assert serving_metrics(fast)["load.simulated_undecided"] == 1.0
    assert (serving_metrics(ok)["load.simulated_requests"], serving_metrics(ok)["load.simulated_undecided"]) == (20_000, 0)
    assert variant_tags(fast)["qbench.load_search"] == ("not settled at 320,000 simulated requests: the highest rate "
                                                        "within the budget is claimed low")  # fmt: skip
    assert variant_tags(ok)["qbench.load_search"] == "settled at 20,000 simulated requests"
    unbudgeted = replace(ok, serving=replace(ok.serving, budget_ms=None))
    assert "qbench.load_search" not in variant_tags(unbudgeted)
    assert "load.simulated_requests" not in serving_metrics(unbudgeted)


class _ColdAfterIdle:
    """A runner whose run takes `slow_s` when more than `idle_s` passed since its last run ended (a cache or an
    allocator gone cold), nothing otherwise."""

    def __init__(self, idle_s: float, slow_s: float) -> None:
        self.idle_s, self.slow_s, self.last = idle_s, slow_s, None

    def run(self, feeds):
        import time

        if self.last is not None and time.perf_counter() - self.last > self.idle_s:
            time.sleep(self.slow_s)
        self.last = time.perf_counter()
        return [feeds["x"]]


def test_idle_starts_are_timed_after_the_idle_the_budgets_rate_gives():
    """An idle batch waits, on average, the mean gap between arrivals at the budget's rate (1000 / rate_rps) plus the
    queue delay: that is how long the model idles before each idle start is timed, within [1, 50] ms (it was the queue
    delay within [1, 5] ms). A model slow (15 ms) after 10 ms of idle, 0.1 ms otherwise, at 40 req/s: every request
    finds it idle for 25 ms on average, and the simulated p99 there is at least the 15 ms the idle starts took (it
    was 0.14 ms, a pass of a 10 ms budget that every cold request breaks)."""
    import numpy as np

    from qbench.serving import IDLE_MAX_MS, idle_ms, served_times
    from qbench.validate.latency import measure_batcher_samples
    from qbench.validate.load import Batcher, Draws, LoadReplay

    def slo(**budget) -> SloSpec:
        return SloSpec.model_validate({"p99_ms": 10.0, **budget, "load": {"max_queue_delay_ms": 0.5}})

    assert idle_ms(slo(rate_rps=40.0), "onnxruntime-cpu") == pytest.approx(25.5)
    assert idle_ms(slo(rate_rps=5000.0), "onnxruntime-cpu") == 1.0  # 0.7 ms: at least 1 ms, as before
    assert idle_ms(slo(rate_rps=1.0), "onnxruntime-cpu") == IDLE_MAX_MS == 50.0
    assert idle_ms(slo(batch_size=1), "onnxruntime-cpu") == 1.0  # a fixed-batch budget: the queue delay

    feeds = {"x": np.zeros((4, 2), dtype=np.float32)}
    runner = _ColdAfterIdle(idle_s=0.010, slow_s=0.015)
    batcher = measure_batcher_samples(runner, feeds, [1], iterations=5, idle_ms=idle_ms(slo(rate_rps=40.0), "cpu"))
    assert batcher.idle_ms[1] >= 15.0  # a sleep never ends early
    replay = LoadReplay(served_times({1: np.full(200, 0.1)}, batcher), Batcher(1, 0.5), Draws.make(2000, 0))
    assert replay.at(40.0).p99_ms >= 15.0


def test_the_reference_is_not_the_cheapest_where_its_real_server_missed_the_budget():
    """FP32 is never gated, so cheapest() judges it itself, and by the gate's own figure: its simulated p99 at the
    budget's rate (5 ms) is within the 10 ms budget, but the real server there took 30 ms (or fell behind), and no
    real run at a rate as high met the budget (max 50 req/s < 100): it is not named the cheapest, however cheap."""
    results = _results(int8_p99=9.0)
    fp32 = results.find("fp32", "onnxruntime-cpu")
    gate = evaluate_gate(results, GATE, slo=SLO)
    for served in (_load(30.0), replace(_load(5.0), overloaded=True), None):
        missed = replace(fp32.serving, at_rate=_load(5.0), served_at_rate=served, usd_per_million={"max_rate": 0.01})
        judged = replace(results, variants=tuple(replace(v, serving=missed) if v is fp32 else v
                                                 for v in results.variants))
        assert cheapest(judged, gate).variant.variant == "int8-fast"
    met = replace(fp32.serving, at_rate=_load(5.0), served_at_rate=_load(6.0), usd_per_million={"max_rate": 0.01})
    judged = replace(results, variants=tuple(replace(v, serving=met) if v is fp32 else v for v in results.variants))
    assert cheapest(judged, gate).variant.variant == "fp32"  # where the real server met it too: the cheapest


def test_a_breach_by_a_real_server_that_fell_behind_says_so_not_that_its_p99_was_over():
    """The real server at the budget's rate fell behind with a p99 of 5 ms over its requests, within the 10 ms
    budget: a breach (its queue grows), and the line says why rather than 'p99 5 ms > budget 10 ms'."""
    results = _results(int8_p99=9.0)
    ok = results.find("int8-ok", "onnxruntime-cpu")
    behind = replace(_load(5.0), overloaded=True, achieved_rps=81.5)
    ok_behind = replace(ok.serving, at_rate=_load(5.0), served_at_rate=behind)
    results = replace(results, variants=tuple(replace(v, serving=ok_behind) if v is ok else v
                                              for v in results.variants))
    gate = evaluate_gate(results, GATE, slo=SLO)
    assert gate.status_of("int8-ok", "onnxruntime-cpu") == "fail"
    line = next(line for line in slo_lines(results, gate) if "int8-ok" in line)
    assert line == ("SLO BREACH int8-ok@onnxruntime-cpu: the real server fell behind at 100 req/s: it completed "
                    "81.5 req/s (p99 5 ms over its 5000 requests only, budget 10 ms)")
    breach = next(c for c in gate.breaches if c.variant == "int8-ok")  # the gate's own line (CLI, JUnit, MLflow)
    assert check_line(breach) == ("BREACH int8-ok@onnxruntime-cpu slo latency.p99_ms: the real server fell behind at "
                                  "the rate (it completed 81.5 req/s); p99 5.0000 ms over a finite run only, budget "
                                  "10.0000 ms")  # fmt: skip
    assert failure_reasons(gate) == ["slo latency.p99_ms: the real server fell behind at the rate (it completed 81.5 "
                                     "req/s)"]  # fmt: skip


def test_the_budgets_rate_met_on_one_instance_costs_one_instance():
    """The served search's two short runs stopped at 40 req/s, while the real run at the budget's 100 req/s met the
    10 ms budget on one instance, as the gate judges it: the cost at that rate counted ceil(100 / 40) = 3 instances
    ($3 per million at $0.36/h, 3x what the traffic that passed costs). A run at the rate over the budget counts the
    instances the sweep showed its share within budget on (`split_instances`, from those 3 up)."""
    from qbench.pricing import priced

    met = replace(_serving(5.0, 40.0, 0.0), usd_per_million={}, split_instances=4)
    assert priced(met, 0.36, ()).usd_per_million["at_rate"] == pytest.approx(1.0)  # 0.36 / 3600 / 100 * 1e6
    missed = replace(met, served_at_rate=_load(12.0), split_instances=3)
    assert priced(missed, 0.36, ()).usd_per_million["at_rate"] == pytest.approx(3.0)
    behind = replace(met, served_at_rate=replace(_load(5.0), overloaded=True))
    assert priced(behind, 0.36, ()).usd_per_million["at_rate"] == pytest.approx(4.0)
