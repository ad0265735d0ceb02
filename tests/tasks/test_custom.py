"""A recipe's own metric (`metrics:` + `module:function`), written here next to the recipe, through
validate, sweep and gate; and label checks that stop a recipe before anything runs."""

from __future__ import annotations

import dataclasses
import textwrap

import numpy as np
import pytest
from task_projects import argmax_first_model, iris, overall, plain_ort, project, run_all, said, table

from qbench.cli.app import main

METRIC_MODULE = textwrap.dedent(
    """
    import numpy as np

    def top2_hit(outputs, labels):
        top2 = np.argsort(outputs, axis=1)[:, -2:]
        return float(np.mean([label in row for row, label in zip(top2, labels)]))

    def logit_shift(outputs, labels, reference_outputs):
        return float(np.mean(np.abs(outputs - reference_outputs)))
    """
)
CUSTOM = [
    {"name": "top2_hit", "function": "user_metrics:top2_hit", "higher_is_better": True},
    {"name": "logit_shift", "function": "user_metrics:logit_shift", "higher_is_better": False},
]


def _custom_project(tmp_path, **changes):
    features, labels = iris()
    (tmp_path / "user_metrics.py").write_text(METRIC_MODULE)
    recipe = {"model": {"path": "model.onnx", "output": "logits"}, "metrics": CUSTOM, **changes}
    return project(tmp_path, argmax_first_model(), table(features, labels), **recipe), features, labels


@pytest.mark.slow
def test_a_custom_metric_is_reported_per_slice_and_gated(tmp_path, monkeypatch, capsys):
    recipe, features, labels = _custom_project(tmp_path, gate={"metric": "top2_hit", "max_drop": 0.05})
    monkeypatch.chdir(tmp_path)
    results, shown = run_all(recipe, capsys)
    logits = plain_ort(tmp_path / "model.onnx", {"x": features})["logits"]
    top2 = np.argsort(logits, axis=1)[:, -2:]
    hits = np.array([label in row for row, label in zip(top2, labels, strict=True)])
    fp32 = overall(results)
    assert fp32["top2_hit"] == pytest.approx(float(hits.mean()), abs=1e-12)
    assert fp32["logit_shift"] == 0.0
    even = results.find("fp32", "onnxruntime-cpu").accuracy.slice("half=even")
    assert even.metrics["top2_hit"] == pytest.approx(float(hits[::2].mean()), abs=1e-12)
    int8 = results.find("int8", "onnxruntime-cpu").accuracy
    assert int8.overall.drops["logit_shift"] == pytest.approx(int8.overall.metrics["logit_shift"])  # lower is better
    assert results.gate_metric == "top2_hit" and said("Gate on top2_hit", shown)
    # the metric's code decides the figures: editing it makes the results stale, as editing the model would
    (tmp_path / "user_metrics.py").write_text(METRIC_MODULE + "\n# edited\n")
    capsys.readouterr()
    assert main(["gate", str(recipe)]) == 2
    assert "metrics[0] source" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"metrics": [{"name": "top2_hit", "function": "user_metrics:top_two", "higher_is_better": True}]},
            "metrics[0].function: module 'user_metrics' has no function 'top_two' (did you mean 'top2_hit'?)",
        ),
        ({"gate": {"metric": "top3_hit"}}, "gate.metric: got 'top3_hit', expected one of"),
        (
            {"metrics": [{"name": "accuracy", "function": "user_metrics:top2_hit", "higher_is_better": True}]},
            "metrics[0].name: 'accuracy' is taken by a built-in or earlier metric",
        ),
    ],
)
def test_unusable_custom_metrics_are_recipe_errors(tmp_path, capsys, changes, message):
    recipe, _, _ = _custom_project(tmp_path, **changes)
    assert main(["validate", str(recipe)]) == 2
    assert said(message, capsys.readouterr().err)


@pytest.mark.parametrize(
    ("task", "labels", "message"),
    [
        ("classification", 7, "data.label: column 'y': 1 row, e.g. row 5: 7 hold class ids outside 0..2 "
         "(output 'logits' has 3 classes)"),
        ("classification", 1.5, "data.label: column 'y': 1 row, e.g. row 5: 1.5 are not integer class ids"),
        ("regression", float("nan"), "data.label: column 'y': 1 row, e.g. row 5: nan are not finite numbers"),
    ],
)  # fmt: skip
def test_labels_are_checked_before_anything_runs(tmp_path, capsys, task, labels, message):
    features, good = iris()
    values = list(good) if task == "classification" else [float(v) for v in good]
    values[5] = labels
    recipe = project(tmp_path, argmax_first_model(), table(features, None, y=values), task=task,
                     model={"path": "model.onnx", "output": "logits"},
                     gate={"metric": "accuracy" if task == "classification" else "mae"})  # fmt: skip
    assert main(["validate", str(recipe)]) == 2
    assert said(message, capsys.readouterr().err)


def test_a_custom_metric_raising_on_one_variant_fails_that_variant_not_the_sweep(tmp_path, monkeypatch, capsys):
    """The metric raises only on outputs that differ from FP32's (the INT8 variant's): FP32 is measured, the INT8
    variant is recorded failed with the metric, the scope and its rows, the results are complete, the gate exits 2."""
    from qbench.gate.run import latest_results
    from qbench.recipe.spec import load_recipe
    from qbench.results.schema import read_results

    recipe, _, _ = _custom_project(tmp_path, metrics=[{"name": "boom", "function": "fragile_metric:fragile",
                                                       "higher_is_better": True}])  # fmt: skip
    (tmp_path / "fragile_metric.py").write_text("import numpy as np\n\n\ndef fragile(outputs, "
                                                "labels, reference_outputs):\n    if not "
                                                "np.array_equal(outputs, reference_outputs):\n "
                                                "       raise RuntimeError('boom')\n    return 1.0\n")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 2
    results = read_results(latest_results(load_recipe(recipe)))
    assert results.complete and results.find("fp32", "onnxruntime-cpu").status == "ok"
    int8 = results.find("int8", "onnxruntime-cpu")
    assert int8.status == "failed"
    assert int8.error.startswith("scoring failed: custom metric 'boom' failed: RuntimeError: boom (on overall, ")


def test_a_custom_metric_raising_on_fp32_names_the_metric_not_the_model(tmp_path, capsys):
    """A metric that raises on FP32's own outputs (a typo, labels it cannot index) failed the dry run of validate and
    sweep as 'm.onnx: the FP32 reference does not run on onnxruntime-cpu: ...; expected a model that runs every batch
    size the recipe asks for', blaming the model. It is one line naming the recipe's metrics[i].function."""
    metrics = [*CUSTOM, {"name": "typo", "function": "typo_metric:typo", "higher_is_better": True}]
    recipe, _, _ = _custom_project(tmp_path, metrics=metrics)
    (tmp_path / "typo_metric.py").write_text("def typo(outputs, labels):\n    return {'score': 1.0}['scroe']\n")
    for command in (["validate", str(recipe)], ["sweep", str(recipe), "--no-track"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "metrics[2].function: custom metric 'typo' failed: KeyError: 'scroe' (on overall, " in err
        assert "on FP32's outputs (" in err and "expected a function that returns a number" in err
        assert "does not run" not in err and "expected a model" not in err
        assert not list((tmp_path / "reports").glob("*/*/models/*.onnx"))  # stopped before anything was built


def test_two_recipes_with_one_metric_name_and_opposite_directions_judge_each_by_its_own(tmp_path):
    """A notebook loading recipe A, then B (a metric of the same name, the other direction), then sweeping A: A's
    drops, gate and report keep A's direction (the catalogue of loaded metrics holds B's)."""
    from qbench import load_recipe, run_sweep
    from qbench.gate.evaluate import evaluate_gate
    from qbench.validate.catalogue import METRICS

    def shift_metric(higher_is_better: bool) -> dict:
        return {"name": "shift", "function": "user_metrics:logit_shift", "higher_is_better": higher_is_better}

    gate = {"metric": "shift", "max_drop": 1e-9, "max_slice_drop": 1e-9}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    recipe_a, _, _ = _custom_project(tmp_path / "a", metrics=[shift_metric(False)], gate=gate)
    recipe_b, _, _ = _custom_project(tmp_path / "b", metrics=[shift_metric(True)], gate=gate)
    a = load_recipe(recipe_a)
    load_recipe(recipe_b)
    assert METRICS["shift"].higher_is_better  # B's, loaded last

    outcome = run_sweep(a, track=False)
    int8 = outcome.results.find("int8", "onnxruntime-cpu").accuracy.overall
    assert int8.metrics["shift"] > 0 and int8.drops["shift"] == pytest.approx(int8.metrics["shift"])  # worse: positive
    assert outcome.gate.exit_code == 1 and outcome.gate.breaches
    assert evaluate_gate(outcome.results, a.gate).exit_code == 1  # judged after the sweep, B still loaded last


def test_a_custom_metric_raising_on_one_slice_leaves_every_other_figure_and_fails_the_gate_only_there(
    tmp_path, monkeypatch, capsys
):
    """The metric raises on a scope of fewer than 10 rows (the 6-row slice group=few): it is NaN there, with a note
    naming it, the scope and what it raised; its figures elsewhere and every other metric on that slice stand. Gated
    on it, the gate cannot judge that slice (exit 2, never a pass); gated on accuracy, it is unaffected."""
    from qbench.gate.checks import result_problems
    from qbench.gate.evaluate import evaluate_gate
    from qbench.gate.run import latest_results
    from qbench.recipe.spec import load_recipe
    from qbench.results.schema import read_results

    features, labels = iris()
    group = np.where(np.arange(len(labels)) % 25 == 0, "few", "many")  # rows 0, 25, ..., 125: 6 rows
    (tmp_path / "counted_metric.py").write_text(
        "import numpy as np\n\n\ndef counted(outputs, labels):\n"
        "    if len(labels) < 10:\n"
        "        raise ValueError(f'needs 10 rows, got {len(labels)}')\n"
        "    return float(np.mean(np.argmax(outputs, axis=1) == labels))\n"
    )  # fmt: skip
    recipe = project(tmp_path, argmax_first_model(), table(features, labels, group=group),
                     model={"path": "model.onnx", "output": "logits"},
                     data={"slices": [{"by": "half"}, {"by": "group"}]},
                     metrics=[{"name": "counted", "function": "counted_metric:counted", "higher_is_better": True}],
                     gate={"metric": "counted", "max_drop": 0.05, "unresolved": "note"})  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 2
    shown = capsys.readouterr()
    assert said("metric 'counted' cannot be judged on group=few: custom metric 'counted' failed: ValueError: "
                "needs 10 rows, got 6 (on group=few, 6 rows)", shown.out + shown.err)  # fmt: skip
    loaded = load_recipe(recipe)
    results = read_results(latest_results(loaded))
    logits = plain_ort(tmp_path / "model.onnx", {"x": features})["logits"]
    hits = np.argmax(logits, axis=1) == labels
    for name in ("fp32", "int8"):
        found = results.find(name, "onnxruntime-cpu")
        assert found.status == "ok"
        few, many = found.accuracy.slice("group=few"), found.accuracy.slice("group=many")
        assert np.isnan(few.metrics["counted"]) and np.isfinite(few.metrics["accuracy"])
        assert few.raised == {"counted": "custom metric 'counted' failed: ValueError: needs 10 rows, got 6 "
                                         "(on group=few, 6 rows)"}  # fmt: skip
        assert np.isfinite(found.accuracy.overall.metrics["counted"]) and not many.raised
        assert sum("'counted'" in note and "group=few" in note for note in found.notes) == 1
    fp32 = results.find("fp32", "onnxruntime-cpu").accuracy
    assert fp32.overall.metrics["counted"] == pytest.approx(float(hits.mean()), abs=1e-12)
    assert fp32.slice("group=many").metrics["counted"] == pytest.approx(float(hits[group == "many"].mean()), abs=1e-12)
    assert fp32.slice("group=few").metrics["accuracy"] == pytest.approx(float(hits[group == "few"].mean()), abs=1e-12)
    on_counted = evaluate_gate(results, loaded.gate)
    assert on_counted.problems and not any(c.scope == "group=few" and c.status == "pass" for c in on_counted.checks)
    on_accuracy = evaluate_gate(results, loaded.gate.model_copy(update={"metric": "accuracy"}))
    assert not on_accuracy.problems
    assert {c.scope for c in on_accuracy.checks if c.metric == "accuracy"} >= {"overall", "group=few", "group=many"}
    # a figure beside its record of a raise was not computed by qbench: the gate's checks of the file say so
    int8 = results.find("int8", "onnxruntime-cpu")
    few = int8.accuracy.slice("group=few")
    edited_few = dataclasses.replace(few, metrics={**few.metrics, "counted": 0.5})
    edited_accuracy = dataclasses.replace(int8.accuracy, slices=tuple(edited_few if s.name == "group=few" else s
                                                                      for s in int8.accuracy.slices))  # fmt: skip
    edited = dataclasses.replace(results, variants=tuple(dataclasses.replace(v, accuracy=edited_accuracy)
                                                         if v is int8 else v for v in results.variants))  # fmt: skip
    assert not [p for p in result_problems(results, loaded, None) if "raised" in p]
    assert [p for p in result_problems(edited, loaded, None) if "raised" in p] == [
        "int8@onnxruntime-cpu: slice 'group=few': metric 'counted' is recorded as raised (custom metric 'counted' "
        "failed: ValueError: needs 10 rows, got 6 (on group=few, 6 rows)) yet has the figure 0.5"]
