"""What a user comparing variants in the MLflow UI reads about serving cost and repeated inputs, from a real
`mlflow server`: the cheapest variant the report names (ranked by the cost at the budget's rate) and each scope's
distinct inputs, on the sweep's run, kept in step with a later `qbench gate`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from sweep_factory import make_sweep, make_variant

from qbench.gate.evaluate import EXIT_PASS, GateSpec, evaluate_gate
from qbench.recipe.slo import SloSpec
from qbench.recipe.spec import load_recipe
from qbench.results.serving import LoadStats, ServingResult
from qbench.track.content import CHEAPEST_TAG
from qbench.track.saved import log_sweep, tag_gate_verdict
from qbench.validate.cost import usd_per_million, usd_per_million_at_rate

SLO = SloSpec.model_validate({"p99_ms": 10.0, "rate_rps": 100.0})
GATE = GateSpec(metric="accuracy", max_drop=0.05, max_slice_drop=0.1)


def _priced(name: str, precision: str, p99_ms: float, price: float, max_rate: float, backend: str = "onnxruntime-cpu"):
    """A variant timed 200 runs per batch size, serving the budget's 100 req/s at `p99_ms`, up to `max_rate`."""
    variant = make_variant(name, precision, backend=backend)
    points = tuple(replace(p, iterations=200) for p in variant.latency.points)
    load = LoadStats(100.0, 5000, p99_ms / 2, p99_ms * 0.9, p99_ms, p99_ms / 2, 0.1, 1.2, 100.0)
    costs = {"max_rate": usd_per_million(price, max_rate), "at_rate": usd_per_million_at_rate(price, 100.0, 1)}
    serving = ServingResult(preprocess_ms_per_row=0.01, budget_ms=10.0, rate_rps=100.0, max_batch_size=32,
                            max_queue_delay_ms=1.0, requests=5000, seed=0, at_rate=load, served_at_rate=load,
                            max_rate_rps=max_rate, price_per_hour=price, usd_per_million=costs)  # fmt: skip
    return replace(variant, latency=replace(variant.latency, points=points), serving=serving)


def test_the_sweep_run_names_the_cheapest_variant_and_counts_distinct_inputs(mlflow_server: str, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """int8-ok ($0.10/h, up to 200 req/s) and int8-fast ($0.16/h, up to 400 req/s) both meet the budget at 100 req/s
    on one instance: $0.2778 and $0.4444 per million there (0.10 / 3600 / 100 x 1e6). results.json and report.md
    named int8-ok the cheapest and counted 150 distinct inputs among the evaluation rows; MLflow held the costs on
    the variants' runs but neither the pick nor the counts anywhere. A later gate with a budget of 5 ms, not the
    10 ms the sweep simulated, cannot tell the cheapest: the tag follows, as the verdict's tags do."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.onnx").write_bytes(b"model")
    (tmp_path / "rows.parquet").write_bytes(b"rows")
    body = {"name": "priced", "model": {"path": "model.onnx"},
            "data": {"path": "rows.parquet", "inputs": {"x": "input"}, "label": "y"},
            "gate": {"metric": "accuracy", "max_drop": 0.05},
            "tracking": {"uri": mlflow_server, "experiment": "priced"}}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(body))
    recipe = load_recipe(tmp_path / "recipe.yaml")
    fp32 = _priced("fp32", "fp32", 30.0, 0.10, 50.0)
    ok, fast = _priced("int8-ok", "int8", 6.0, 0.10, 200.0), _priced("int8-fast", "int8", 4.0, 0.16, 400.0)
    results = make_sweep([fp32, ok, fast])
    results = replace(results, recipe={**results.recipe, "latency": {"batch_sizes": [1, 32]}},
                      distinct_inputs={"overall": 150, "lighting=dark/blur": 40})  # fmt: skip
    gate = evaluate_gate(results, GATE, slo=SLO)
    assert gate.exit_code == EXIT_PASS
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    artifacts = [run_dir / name for name in ("results.json", "report.md")]
    for path in artifacts:
        path.write_text(path.name)
    parent_id = log_sweep(results, recipe, gate=gate, artifacts=artifacts)

    client = MlflowClient(mlflow_server)
    parent = client.get_run(parent_id)
    assert parent.data.tags[CHEAPEST_TAG] == ("int8-ok@onnxruntime-cpu (up to 200 req/s within budget, $0.1389 per "
                                              "million there; $0.2778 per million at the budget's 100 req/s on 1 "
                                              "instance)")  # fmt: skip
    assert parent.data.metrics["distinct_inputs/overall"] == 150.0
    assert parent.data.metrics["distinct_inputs/lighting_dark_blur"] == 40.0  # '=' and '/' cleaned to one segment
    found = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    child = {run.data.tags["qbench.variant"]: run for run in found}
    assert child["int8-ok"].data.metrics["cost.usd_per_million.at_rate"] == pytest.approx(0.10 / 3600 / 100 * 1e6)
    assert CHEAPEST_TAG not in child["int8-ok"].data.tags  # the pick is the sweep's, not a variant's

    tighter = evaluate_gate(results, GATE, slo=SloSpec.model_validate({"p99_ms": 5.0, "rate_rps": 100.0}))
    assert tag_gate_verdict(recipe, run_dir, tighter, results) == parent_id
    retagged = client.get_run(parent_id).data.tags
    assert retagged["qbench.gate"] == "unusable"
    assert retagged[CHEAPEST_TAG] == "cannot tell: the gate could not judge the results (exit 2, see its problems)"


def test_results_without_a_budget_get_no_cheapest_tag() -> None:
    from qbench.track.content import sweep_gate_tags

    results = make_sweep([make_variant("fp32", "fp32"), make_variant("int8", "int8")])
    assert CHEAPEST_TAG not in sweep_gate_tags(results, evaluate_gate(results, GATE))
