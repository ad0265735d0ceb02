"""gate.metrics: several gated metrics (a classifier's head and a regression head), each with its own tolerances,
judged overall and on every slice by the same rules. Before, the gate judged gate.metric alone: a variant that broke
the other head passed (exit 0) with a note."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from qbench.errors import RecipeError
from qbench.export.triton import gate_verdict
from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, EXIT_UNUSABLE, evaluate_gate, judge
from qbench.gate.junit import junit_xml
from qbench.gate.report import failure_reasons, markdown_summary, report_dict, summary_line
from qbench.gate.tolerance import tolerances_by_metric
from qbench.recipe.spec import GateSpec, Recipe
from qbench.results.schema import AccuracyResult, SliceMetrics, SweepResults, VariantResult, from_dict, to_json
from qbench.search.screen import gate_excess
from qbench.validate.catalogue import custom_metrics, recorded_custom_metrics

BACKEND = "onnxruntime-cpu"
# FP32's figures on each scope; int8-a keeps the class head and doubles the price head's MAE on slice grp=b alone
FP32 = {"overall": {"acc": 0.9, "price_mae": 0.1}, "grp=a": {"acc": 0.9, "price_mae": 0.1},
        "grp=b": {"acc": 0.9, "price_mae": 0.1}}  # fmt: skip
INT8 = {"overall": {"acc": 0.9, "price_mae": 0.1005}, "grp=a": {"acc": 0.9, "price_mae": 0.1},
        "grp=b": {"acc": 0.9, "price_mae": 0.2}}  # fmt: skip


def _result(name: str, figures: dict[str, dict[str, float]]) -> VariantResult:
    scopes = {scope: SliceMetrics(scope, 200 if scope == "overall" else 100, metrics)
              for scope, metrics in figures.items()}  # fmt: skip
    accuracy = AccuracyResult(rows=200, nonfinite_outputs=0, overall=scopes.pop("overall"),
                              slices=tuple(scopes.values()))  # fmt: skip
    return VariantResult(variant=name, backend=BACKEND, precision="fp32" if name == "fp32" else "int8", status="ok",
                         accuracy=accuracy)  # fmt: skip


def _results() -> SweepResults:
    metrics = [{"name": "acc", "function": "m:acc", "higher_is_better": True, "outputs": ["logits"]},
               {"name": "price_mae", "function": "m:mae", "higher_is_better": False, "outputs": ["price"],
                "data_units": True}]  # fmt: skip
    return SweepResults(qbench_version="0", created_at="2026-01-01T00:00:00+00:00",
                        recipe={"name": "toy", "task": "structured", "resolved": {"metrics": metrics}}, environment={},
                        calibration=None, evaluation_rows=200, gate_metric="acc", reference="fp32",
                        variants=(_result("fp32", FP32), _result("int8-a", INT8)))  # fmt: skip


BOTH = GateSpec.model_validate({"metrics": [{"metric": "acc", "max_drop": 0.05, "max_slice_drop": 0.05}, "price_mae"],
                                "applies_to": ["int8-*"]})  # fmt: skip


def test_a_variant_breaking_the_second_gated_metric_on_one_slice_breaches_naming_it():
    """price_mae held to its own defaults (1 % of FP32's 0.1 overall, 2 % of FP32's 0.1 on each slice): overall
    0.1 -> 0.1005 passes (0.0005 <= 0.001), grp=b 0.1 -> 0.2 breaches (0.1 > 0.002); acc passes everywhere."""
    report = evaluate_gate(_results(), BOTH)
    assert report.exit_code == EXIT_BREACH
    assert report.gated_metrics == ("acc", "price_mae")
    assert [(c.scope, c.metric) for c in report.breaches] == [("grp=b", "price_mae")]
    breach = report.breaches[0]
    assert breach.drop == pytest.approx(0.1) and breach.tolerance == pytest.approx(0.002)
    judged = {(c.scope, c.metric): c.status for c in report.checks}
    assert judged == {("overall", "acc"): "pass", ("grp=a", "acc"): "pass", ("grp=b", "acc"): "pass",
                      ("overall", "price_mae"): "pass", ("grp=a", "price_mae"): "pass",
                      ("grp=b", "price_mae"): "breach"}  # fmt: skip
    assert not [n for n in report.notes if "dropped" in n]  # gated: a breach, not a note
    assert "int8-a@onnxruntime-cpu (grp=b price_mae)" in summary_line(report)
    assert failure_reasons(report) == ["grp=b price_mae drop 0.1000 > 0.002"]
    # `qbench export triton`'s refusal names the metric too: 'worst grp=b' alone did not say which head broke
    assert gate_verdict(report, "int8-a", BACKEND, reference="fp32").reason == (
        "1 breach(es), worst grp=b price_mae: drop 0.1000 > 0.0020")


def test_gated_on_the_class_metric_alone_the_same_variant_passes_with_the_note_as_before():
    spec = GateSpec(metric="acc", max_drop=0.05, max_slice_drop=0.05, applies_to=["int8-*"])
    report = evaluate_gate(_results(), spec)
    assert report.exit_code == EXIT_PASS
    assert report.gated_metrics == ("acc",) and {c.metric for c in report.checks} == {"acc"}
    assert [n for n in report.notes if "price_mae" in n] == [
        "int8-a@onnxruntime-cpu: price_mae (over price) dropped 0.1000 > 0.002 on slice grp=b (FP32 0.1 → 0.2; 1 "
        "of 3 scopes past the tolerance; not gated: gate.metric is acc)"]  # fmt: skip


def test_each_gated_metric_keeps_its_own_stated_tolerances():
    loose = GateSpec.model_validate({"metrics": ["acc", {"metric": "price_mae", "max_drop": 0.5,
                                                         "max_slice_drop": 0.5}],
                                     "applies_to": ["int8-*"]})  # fmt: skip
    report = evaluate_gate(_results(), loose)
    assert report.exit_code == EXIT_PASS
    assert {c.tolerance for c in report.checks if c.metric == "price_mae"} == {0.5}
    assert {(c.scope, c.tolerance) for c in report.checks if c.metric == "acc"} == {
        ("overall", 0.01), ("grp=a", 0.02), ("grp=b", 0.02)}  # acc's defaults, not price_mae's 0.5


def test_the_reports_show_each_gated_metrics_checks():
    report = evaluate_gate(_results(), BOTH)
    as_json = report_dict(report)
    assert as_json["metric"] == "acc" and as_json["metrics"] == ["acc", "price_mae"]
    assert {(c["scope"], c["metric"], c["status"]) for c in as_json["checks"] if c["status"] == "breach"} == {
        ("grp=b", "price_mae", "breach")}
    cases = ET.fromstring(junit_xml(report)).iter("testcase")
    failed = [case.get("name") for case in cases if case.find("failure") is not None]
    assert failed == ["grp=b: price_mae"]
    row = "| int8-a@onnxruntime-cpu | grp=b | price_mae | 0.1000 | 0.2000 | 0.1000 | 0.0020 | **BREACH** |"
    assert row in markdown_summary(report)


def test_the_search_judges_a_candidate_on_every_gated_metric():
    """The INT8 search's verdict (judge, with tolerances resolved once per gated metric) and its one-number excess:
    the worst over the gated metrics, 0.1 / 0.002 = 50 on grp=b's price_mae, where acc alone gave 0."""
    results = _results()
    fp32, int8 = results.variants
    alone = GateSpec(metric="acc", max_drop=0.05, max_slice_drop=0.05)
    with custom_metrics(recorded_custom_metrics(results.recipe["resolved"])):  # as the recipe's check registers them
        verdict = judge(fp32, int8, BOTH, tolerances_by_metric(fp32, BOTH))
        one = judge(fp32, int8, alone, tolerances_by_metric(fp32, alone))
    assert verdict.exit_code == EXIT_BREACH
    assert gate_excess(verdict) == pytest.approx(50.0)
    assert one.exit_code == EXIT_PASS and gate_excess(one) == 0.0


def test_results_without_a_gated_metrics_figure_cannot_be_judged():
    """Results recording no price_mae (written before the recipe gated it): exit 2 naming it, never a pass."""
    results = _results()
    fp32, int8 = results.variants
    assert int8.accuracy is not None
    bare = SliceMetrics("overall", 200, {"acc": 0.9})
    lacking = replace(int8, accuracy=replace(int8.accuracy, overall=bare))
    report = evaluate_gate(replace(results, variants=(fp32, lacking)), BOTH)
    assert report.exit_code == EXIT_UNUSABLE
    assert "int8-a@onnxruntime-cpu: metric 'price_mae' is missing or NaN on overall" in report.problems


def test_results_record_the_gated_metrics_and_old_results_without_them_read_as_one():
    raw = json.loads(to_json(_results()))
    assert raw["gate_metrics"] == []
    old = {k: v for k, v in raw.items() if k not in ("gate_metrics", "digest")}
    assert from_dict(old).gate_metrics == () and from_dict(old).gate_metric == "acc"
    assert from_dict({**old, "gate_metrics": ["acc", "price_mae"]}).gate_metrics == ("acc", "price_mae")


def test_gate_metrics_in_a_recipe(tmp_path):
    """The first entry is gate.metric (and its tolerances); an entry may be a name alone; gate.metric stated beside
    gate.metrics otherwise than its first entry, a metric gated twice, or one results will not carry is one line
    naming the field."""
    import yaml

    from qbench.recipe.spec import load_recipe

    (tmp_path / "m.onnx").write_bytes(b"onnx")
    (tmp_path / "d.csv").write_text("x,y\n1,0\n")
    body = {"name": "r", "task": "regression", "model": {"path": "m.onnx"},
            "data": {"path": "d.csv", "inputs": {"x": "x"}, "label": "y"},
            "gate": {"metrics": [{"metric": "mae", "max_drop": 0.5}, "rmse"]}}  # fmt: skip

    def load(gate: dict) -> Recipe:
        (tmp_path / "r.yaml").write_text(yaml.safe_dump({**body, "gate": gate}))
        return load_recipe(tmp_path / "r.yaml")

    recipe = load(body["gate"])
    assert recipe.gate.metric == "mae" and recipe.gate.max_drop == 0.5
    assert recipe.gate.gated_metrics == ("mae", "rmse")
    assert [(s.metric, s.max_drop) for s in recipe.gate.per_metric()] == [("mae", 0.5), ("rmse", None)]
    assert GateSpec.model_validate(recipe.gate.model_dump()) == recipe.gate  # results record the resolved gate
    assert load({"metric": "mae"}).gate.gated_metrics == ("mae",)  # gate.metric alone: as before
    for gate, field, words in [({"metric": "rmse", "metrics": ["mae"]}, "gate.metric", "first entry"),
                               ({"metrics": ["mae", "mae"]}, "gate.metrics", "gated twice"),
                               ({"metrics": ["mae", "accuracy"]}, "gate.metrics[1].metric", "'accuracy'"),
                               ({"metrics": []}, "gate.metrics", "non-empty")]:  # fmt: skip
        with pytest.raises(RecipeError) as caught:
            load(gate)
        message = str(caught.value)
        assert "\n" not in message and field in message and words in message, message
