"""The gate's output_spread check: a variant whose outputs no longer depend on its inputs (the same output on every
row) breaches, whatever the gate metric a constant answer can score well on says; honest variants still pass."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from user_model import swept_breaches

from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, EXIT_UNUSABLE, evaluate_gate
from qbench.gate.report import check_line
from qbench.recipe.spec import GateSpec
from qbench.results.schema import SweepResults, VariantResult, from_dict, to_json
from qbench.validate.accuracy import evaluate_accuracy

BACKEND = "onnxruntime-cpu"
ROWS = 1000


def _results(task: str, reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray | None,
             slices: dict[str, np.ndarray] | None = None) -> SweepResults:
    """FP32 and one variant 'int8-a' measured on the same rows, as a sweep records them."""
    accuracy = {name: evaluate_accuracy(task, {"out": values}, {"out": reference}, labels, slices or {})
                for name, values in (("fp32", reference), ("int8-a", outputs))}  # fmt: skip
    variants = tuple(VariantResult(variant=name, backend=BACKEND, precision="fp32" if name == "fp32" else "int8",
                                   status="ok", accuracy=accuracy[name]) for name in ("fp32", "int8-a"))  # fmt: skip
    return SweepResults(qbench_version="0", created_at="2026-01-01T00:00:00+00:00", recipe={"name": "toy"},
                        environment={}, calibration=None, evaluation_rows=ROWS, gate_metric="x", reference="fp32",
                        variants=variants)  # fmt: skip


def _verdict(task: str, reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray | None, spec: GateSpec):
    """The gate's report, and the gate metric's own check overall (what the gate judged before output_spread)."""
    report = evaluate_gate(_results(task, reference, outputs, labels), spec)
    metric = next(c for c in report.checks if c.metric == spec.metric and c.scope == "overall")
    return report, metric


def _imbalanced() -> tuple[np.ndarray, np.ndarray]:
    """(logits, labels): 95 % of rows in class 0; FP32 finds 8 of the 50 class-1 rows and errs on 2 others (0.956)."""
    rng = np.random.default_rng(0)
    labels = np.zeros(ROWS, dtype=np.int64)
    labels[:50] = 1
    score = rng.normal(size=ROWS).clip(-2, 2)
    score[:8] = score[50:52] = 3.0
    return np.stack([np.zeros(ROWS), score - 2.5], axis=1).astype(np.float32), labels


ACCURACY = GateSpec(metric="accuracy", max_drop=0.01, applies_to=["int8-*"])


@pytest.mark.parametrize("dead", [np.zeros((ROWS, 2)), np.tile([1.0, -3.0], (ROWS, 1))],
                         ids=["all-equal-scores", "one-constant-vector"])  # fmt: skip
def test_a_dead_classifier_on_imbalanced_classes_breaches_though_its_accuracy_is_within_tolerance(dead):
    """Ties go to the first class: a variant giving every row the same scores answers class 0 everywhere, scores the
    majority's share (0.95 against FP32's 0.956) and passed an accuracy gate with max_drop 0.01 (exit 0)."""
    logits, labels = _imbalanced()
    report, accuracy = _verdict("classification", logits, dead.astype(np.float32), labels, ACCURACY)
    assert (accuracy.reference, accuracy.observed, accuracy.status) == (0.956, 0.95, "pass")
    assert report.exit_code == EXIT_BREACH
    # the one answer is class 0: FP32's class-1 rows (10) all lost as well (qbench.validate.kept)
    assert sorted((c.metric, c.reason) for c in report.breaches) == [
        ("decisions_kept", "class 1"), ("output_spread", "")]  # fmt: skip
    [spread] = [c for c in report.breaches if c.metric == "output_spread"]
    assert (spread.variant, spread.scope, spread.metric, spread.observed) == ("int8-a", "overall", "output_spread", 0.0)
    assert spread.reference == pytest.approx(_spread(logits))
    assert check_line(spread).startswith("BREACH int8-a@onnxruntime-cpu overall output_spread: its outputs vary "
                                         f"across the {ROWS} rows by 0, FP32's by ")  # fmt: skip


def test_an_honest_classifier_whose_scores_carry_rounding_noise_passes():
    logits, labels = _imbalanced()
    noisy = logits + np.random.default_rng(1).normal(scale=0.02, size=logits.shape).astype(np.float32)
    report, _ = _verdict("classification", logits, noisy, labels, ACCURACY)
    assert report.exit_code == EXIT_PASS
    assert not [c for c in report.checks if c.metric == "output_spread"]


def test_a_constant_regression_near_the_mean_of_low_variance_targets_breaches():
    """A constant prediction at the targets' mean has an MAE (0.04) within 0.05 of FP32's (0.008): the MAE gate
    passed."""
    rng = np.random.default_rng(2)
    targets = 10.0 + 0.05 * rng.normal(size=ROWS)
    fp32 = (targets + 0.01 * rng.normal(size=ROWS)).astype(np.float32)
    spec = GateSpec(metric="mae", max_drop=0.05, applies_to=["int8-*"])
    dead = np.full(ROWS, targets.mean(), dtype=np.float32)
    report, mae = _verdict("regression", fp32, dead, targets, spec)
    assert mae.status == "pass"
    # a constant has no tail either (qbench.validate.kept)
    assert report.exit_code == EXIT_BREACH and [c.metric for c in report.breaches] == ["output_spread", "tail_kept"]
    honest = fp32 + (0.001 * rng.normal(size=ROWS)).astype(np.float32)
    assert _verdict("regression", fp32, honest, targets, spec)[0].exit_code == EXIT_PASS


def test_a_spread_lost_to_a_few_saturated_rows_is_reported_as_measured_not_as_a_constant_answer():
    """FP32 regression outputs within ±50 on 995 rows and 2e5 on 5 (the rows FP32's spread rests on); the variant
    saturates at FP8 E4M3's largest value, 448, and keeps every other row. Its spread falls under a tenth of FP32's
    and breaches, but the line called it 'a constant answer' that 'no longer depends on the inputs', which 995
    rows it keeps exactly deny; it now says what was measured: both spreads (hand: numpy's std of each column) and
    their ratio."""
    rng = np.random.default_rng(3)
    fp32 = rng.uniform(-50, 50, size=ROWS).astype(np.float32)
    fp32[:5] = 2e5
    saturated = np.clip(fp32, -448, 448)
    spec = GateSpec(metric="mae", max_drop=1e6, applies_to=["int8-*"])
    report, _ = _verdict("regression", fp32, saturated, fp32.astype(np.float64), spec)
    [spread] = [c for c in report.breaches if c.metric == "output_spread"]
    own, reference = float(np.std(saturated.astype(np.float64))), float(np.std(fp32.astype(np.float64)))
    assert (spread.observed, spread.reference) == (pytest.approx(own), pytest.approx(reference))
    assert own / reference < 0.1 and (saturated == fp32)[5:].all()
    assert check_line(spread) == (
        f"BREACH int8-a@onnxruntime-cpu overall output_spread: its outputs vary across the {ROWS} rows by {own:.4g}, "
        f"FP32's by {reference:.4g} (the rows' RMS distance from their mean), under 0.1 of FP32's "
        f"({own / reference:.3g} of it): the variant's outputs lost most of FP32's variation across these rows")


def test_a_constant_embedding_breaches_though_its_cosine_with_embeddings_sharing_a_direction_is_high():
    rng = np.random.default_rng(3)
    direction = rng.normal(size=16)
    fp32 = direction + 0.1 * rng.normal(size=(ROWS, 16))
    fp32 = (fp32 / np.linalg.norm(fp32, axis=1, keepdims=True)).astype(np.float32)
    dead = np.tile(direction / np.linalg.norm(direction), (ROWS, 1)).astype(np.float32)
    spec = GateSpec(metric="cosine", max_drop=0.05, applies_to=["int8-*"])
    report, cosine = _verdict("embedding", fp32, dead, None, spec)
    assert cosine.status == "pass" and cosine.observed > 0.95
    # nor any dimension's variation (qbench.validate.kept)
    assert report.exit_code == EXIT_BREACH and [c.metric for c in report.breaches] == ["output_spread", "spread_kept"]
    honest = fp32 + (0.002 * rng.normal(size=fp32.shape)).astype(np.float32)
    assert _verdict("embedding", fp32, honest, None, spec)[0].exit_code == EXIT_PASS


def test_all_negative_multilabel_answers_on_sparse_labels_breach():
    rng = np.random.default_rng(4)
    labels = (rng.random(size=(ROWS, 5)) < 0.01).astype(np.int64)
    fp32 = np.where(labels == 1, 1.0, -4.0) + rng.normal(scale=0.5, size=labels.shape)
    spec = GateSpec(metric="label_agreement", max_drop=0.05, applies_to=["int8-*"])
    dead = np.full(labels.shape, -4.0, dtype=np.float32)
    report, _ = _verdict("multilabel", fp32.astype(np.float32), dead, labels, spec)
    assert report.exit_code == EXIT_BREACH and "output_spread" in [c.metric for c in report.breaches]


def test_an_output_fp32_itself_gives_one_value_for_has_nothing_to_collapse():
    logits = np.tile([0.5, -0.5], (ROWS, 1)).astype(np.float32)
    labels = np.zeros(ROWS, dtype=np.int64)
    report, _ = _verdict("classification", logits, logits.copy(), labels, ACCURACY)
    assert report.exit_code == EXIT_PASS


def test_results_recording_fp32_s_spread_and_not_the_variant_s_are_unusable():
    logits, labels = _imbalanced()
    results = _results("classification", logits, logits.copy(), labels)
    variant = results.find("int8-a", BACKEND)
    edited = replace(variant, accuracy=replace(variant.accuracy, overall=replace(variant.accuracy.overall, spread={})))
    report = evaluate_gate(replace(results, variants=(results.find("fp32", BACKEND), edited)), ACCURACY)
    assert report.exit_code == EXIT_UNUSABLE
    assert report.problems == ("int8-a@onnxruntime-cpu: the results record no output_spread for this variant "
                               f"(FP32's is {logits.std(axis=0, ddof=0).dot([0, 1]):.4g}): written by another "
                               "qbench, or edited",)  # fmt: skip


@pytest.mark.parametrize(("who", "spread"), [("int8-a", math.nan), ("int8-a", -1.0), ("int8-a", math.inf),
                                           ("fp32", math.nan), ("fp32", -1.0)])  # fmt: skip
def test_a_spread_metrics_spread_cannot_give_is_unusable_never_a_pass_or_a_breach(who, spread):
    """A collapsed variant (every row the same scores) whose recorded spread is NaN, or whose FP32 spread is NaN or
    negative, skipped the output_spread check and its collapse passed (exit 0 where the accuracy gate passes); a
    negative variant spread breached (exit 1) on figures a sweep cannot write. A spread is 0 or more, finite, and NaN
    only where no row of the scope is finite: the results are unusable (exit 2)."""
    # FP32 decides class 1 on 3 rows (too few to judge as a class kept), class 0 on the others; the variant answers
    # class 0 everywhere: accuracy 0.997 against 1.0, within max_drop 0.01
    score = np.random.default_rng(5).uniform(-4.0, -1.0, size=ROWS)
    score[:3] = 2.0
    logits = np.stack([np.zeros(ROWS), score], axis=1).astype(np.float32)
    labels = (score > 0).astype(np.int64)
    results = _results("classification", logits, np.tile([1.0, 0.0], (ROWS, 1)).astype(np.float32), labels)
    assert evaluate_gate(results, ACCURACY).exit_code == EXIT_BREACH  # as recorded: output_spread alone breaches
    assert [c.metric for c in evaluate_gate(results, ACCURACY).breaches] == ["output_spread"]
    edited = results.find(who, BACKEND)
    overall = replace(edited.accuracy.overall, spread={"out": spread})
    results = replace(results, variants=tuple(replace(v, accuracy=replace(v.accuracy, overall=overall))
                                              if v.variant == who else v for v in results.variants))  # fmt: skip
    report = evaluate_gate(results, ACCURACY)
    assert report.exit_code == EXIT_UNUSABLE
    owner = "FP32" if who == "fp32" else "the variant"
    [problem] = [p for p in report.problems if "output_spread" in p]
    assert problem.startswith(f"int8-a@onnxruntime-cpu: {owner}'s output_spread is {spread:g}, ")
    assert problem.endswith(": written by another qbench, or edited")


def test_a_variant_with_nan_on_every_row_has_no_spread_and_breaches_on_its_outputs():
    logits, labels = _imbalanced()
    report, _ = _verdict("classification", logits, np.full_like(logits, np.nan), labels, ACCURACY)
    assert report.exit_code == EXIT_BREACH and not report.problems
    assert "nonfinite_outputs" in [c.metric for c in report.breaches]


def _linear_classifier(path: Path, weights: np.ndarray, bias: np.ndarray) -> None:
    """x (rows, features) → logits (rows, 2) = x @ weights + bias, saved at `path`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["logits"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", weights.shape[0]])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["rows", 2])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def _tiny_classifier(path: Path) -> None:
    """x (rows, 4) → logits (rows, 2) = [0.01 * (x1 + x2 + x3), x0 - 2.5]."""
    weights = np.zeros((4, 2), np.float32)
    weights[0, 1], weights[1:, 0] = 1.0, 0.01
    _linear_classifier(path, weights, np.array([0.0, -2.5], np.float32))


def test_sweep_gate_fails_an_int8_build_whose_quantized_weights_collapsed(tmp_path, monkeypatch):
    """End to end: an INT8 build whose integer weights are all zero (its scales collapsed) gives one output for every
    row; on a table with 95 % of rows in class 0 `qbench sweep --gate` passed it on accuracy (0.95 vs 0.956, exit 0)."""
    import onnx
    from onnx import numpy_helper

    import qbench.variants.int8 as int8
    from qbench.gate.run import latest_results
    from qbench.recipe.spec import load_recipe
    from qbench.results.schema import read_results

    _tiny_classifier(tmp_path / "tiny.onnx")
    logits, labels = _imbalanced()
    features = np.random.default_rng(5).normal(size=(ROWS, 4)).clip(-2, 2).astype(np.float32)
    features[:, 0] = logits[:, 1] + 2.5
    table = pd.DataFrame({"x": list(features), "y": labels, "split": "eval"})
    calibration = np.random.default_rng(6).normal(size=(300, 4)).clip(-2, 2).astype(np.float32)
    table = pd.concat([pd.DataFrame({"x": list(calibration), "y": 0, "split": "calib"}), table], ignore_index=True)
    table.to_parquet(tmp_path / "rows.parquet")
    recipe = {"name": "collapsed", "task": "classification", "model": {"path": "tiny.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "y",
                       "calibration": {"filter": {"split": "calib"}, "samples": 64, "seed": 0},
                       "evaluation": {"filter": {"split": "eval"}}},
              "variants": [{"name": "int8", "precision": "int8", "calibrator": "minmax"}], "backends": [BACKEND],
              "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 2, "threads": 1},
              "gate": {"metric": "accuracy", "max_drop": 0.01}}  # fmt: skip
    (tmp_path / "qbench.yaml").write_text(yaml.safe_dump(recipe))
    built_int8 = int8.build_int8

    def collapsed(spec, ctx):
        built = built_int8(spec, ctx)
        model = onnx.load(built.onnx_path)
        for tensor in model.graph.initializer:
            values = numpy_helper.to_array(tensor)
            if values.dtype == np.int8 and values.size > 1:
                tensor.CopyFrom(numpy_helper.from_array(np.zeros_like(values), tensor.name))
        onnx.save(model, built.onnx_path)
        return built

    monkeypatch.setattr(int8, "build_int8", collapsed)
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))  # this build is no other test's INT8
    code, breaches = swept_breaches(tmp_path / "qbench.yaml")
    results = read_results(latest_results(load_recipe(tmp_path / "qbench.yaml")))
    accuracy = {name: results.find(name, BACKEND).accuracy.overall.metrics["accuracy"] for name in ("fp32", "int8")}
    assert accuracy == {"fp32": 0.956, "int8": 0.95}  # within max_drop: the accuracy check alone passes
    assert any(line.startswith("BREACH int8@onnxruntime-cpu overall output_spread: its outputs vary across the 1000 "
                               "rows by 0, ") for line in breaches)  # fmt: skip
    assert code == EXIT_BREACH


# -- per slice: a variant can collapse on one slice alone ------------------------------------------

SLICE_B = {"half=a": np.arange(ROWS) < ROWS // 2, "half=b": np.arange(ROWS) >= ROWS // 2}


def _collapsed_on_b() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(FP32 logits, a variant's, labels): the variant gives FP32's logits on half a, and one vector on every row of
    half b, where every label is class 0 and so is its answer: its accuracy there is FP32's, its overall spread
    about 0.7 of FP32's."""
    logits, labels = _imbalanced()
    dead = logits.copy()
    dead[SLICE_B["half=b"]] = [0.0, -2.5]
    return logits, dead, labels


def test_a_variant_collapsed_on_one_slice_alone_breaches_on_that_slice():
    logits, dead, labels = _collapsed_on_b()
    report = evaluate_gate(_results("classification", logits, dead, labels, SLICE_B), ACCURACY)
    accuracy = {c.scope: (c.reference, c.observed, c.status) for c in report.checks if c.metric == "accuracy"}
    assert accuracy["half=b"] == (1.0, 1.0, "pass")  # the metric sees nothing
    assert report.exit_code == EXIT_BREACH
    [spread] = report.breaches
    assert (spread.scope, spread.metric, spread.observed, spread.size) == ("half=b", "output_spread", 0.0, ROWS // 2)
    assert spread.reference == pytest.approx(_spread(logits[ROWS // 2:]))
    assert check_line(spread).startswith("BREACH int8-a@onnxruntime-cpu slice half=b output_spread: its outputs "
                                         f"vary across the {ROWS // 2} rows by 0, FP32's by ")  # fmt: skip


def test_a_slice_under_min_slice_size_is_not_judged_on_its_spread():
    logits, dead, labels = _collapsed_on_b()
    spec = ACCURACY.model_copy(update={"min_slice_size": ROWS // 2 + 1})
    report = evaluate_gate(_results("classification", logits, dead, labels, SLICE_B), spec)
    assert report.exit_code == EXIT_PASS and not [c for c in report.checks if c.metric == "output_spread"]


def test_a_slice_fp32_itself_gives_one_value_on_is_not_judged():
    logits, dead, labels = _collapsed_on_b()  # FP32 as constant on half b as the variant
    report = evaluate_gate(_results("classification", dead, dead.copy(), labels, SLICE_B), ACCURACY)
    assert report.exit_code == EXIT_PASS and not [c for c in report.checks if c.metric == "output_spread"]


def test_a_slice_spread_recorded_for_fp32_and_not_for_the_variant_is_a_problem_naming_the_slice():
    logits, dead, labels = _collapsed_on_b()
    results = _results("classification", logits, dead, labels, SLICE_B)
    variant = results.find("int8-a", BACKEND)
    slices = tuple(replace(s, spread={}) for s in variant.accuracy.slices)
    edited = replace(variant, accuracy=replace(variant.accuracy, slices=slices))
    report = evaluate_gate(replace(results, variants=(results.find("fp32", BACKEND), edited)), ACCURACY)
    assert report.exit_code == EXIT_UNUSABLE
    expected = [f"int8-a@onnxruntime-cpu: the results record no output_spread on slice {name} for this variant "
                f"(FP32's is {_spread(logits[mask]):.4g}): written by another qbench, or edited"
                for name, mask in SLICE_B.items()]  # fmt: skip
    assert list(report.problems) == expected


def test_results_without_spreads_are_judged_on_the_gate_metric_alone():
    """Results recording no spread for FP32 nor the variant (written before spreads were): read, and no scope judged
    on its spread (nothing to judge it on); the gate metric's checks as before."""
    logits, labels = _imbalanced()
    raw = json.loads(to_json(_results("classification", logits, np.zeros_like(logits), labels, SLICE_B)))
    for variant in raw["variants"]:
        for scope in [variant["accuracy"]["overall"], *variant["accuracy"]["slices"]]:
            del scope["spread"], scope["kept"]  # nor what each kept (qbench.validate.kept), recorded later still
    # its accuracy drop is within the tolerance but not resolved on these rows (qbench.gate.resolution): counted here
    report = evaluate_gate(from_dict(raw), ACCURACY.model_copy(update={"unresolved": "note"}))
    assert report.exit_code == EXIT_PASS and not [c for c in report.checks if c.metric == "output_spread"]


def _spread(values: np.ndarray) -> float:
    """The rows' RMS distance from their mean row, by hand."""
    return float(np.sqrt(values.var(axis=0).sum()))


def _difference_classifier(path: Path) -> None:
    """x (rows, 2) → logits (rows, 2) = [0, x0 - x1 - 0.5]."""
    _linear_classifier(path, np.array([[0.0, 1.0], [0.0, -1.0]], np.float32), np.array([0.0, -0.5], np.float32))


@pytest.mark.parametrize("calibrated_on", ["a", "a and b"])
def test_sweep_gate_fails_an_int8_build_that_saturates_on_one_input_regime_alone(tmp_path, monkeypatch, calibrated_on):
    """End to end: INT8 calibrated on regime a's inputs (within [-2, 2]) clamps every input of regime b (10 to 26) to
    one value, so it gives one answer on all of b's rows, class 0, right on 97 % of them: `qbench sweep --gate`
    passed it (drop 0.03 within 0.05 on regime=b, its overall spread about 0.6 of FP32's). Calibrated on both
    regimes, INT8 and FP16 vary as FP32 does on each slice, and pass."""

    _difference_classifier(tmp_path / "diff.onnx")
    rng = np.random.default_rng(0)
    regime_b = rng.uniform(10, 20, size=(300, 2))
    regime_b[:, 1] = regime_b[:, 0] + rng.uniform(0.6, 6, 300)  # x1 > x0: class 0 ...
    regime_b[:9, 1] = regime_b[:9, 0] - 2  # ... but for 9 rows of class 1
    features = np.concatenate([rng.uniform(-2, 2, size=(700, 2)), regime_b]).astype(np.float32)
    regimes = ["a"] * 700 + ["b"] * 300
    calibration = np.concatenate([rng.uniform(-2, 2, size=(200, 2)), rng.uniform(10, 26, size=(100, 2))])
    table = pd.concat([
        pd.DataFrame({"x": list(calibration.astype(np.float32)), "y": 0, "split": "calib",
                      "regime": ["a"] * 200 + ["b"] * 100}),
        pd.DataFrame({"x": list(features), "y": (features[:, 0] - features[:, 1] > 0.5).astype(np.int64),
                      "split": "eval", "regime": regimes}),
    ], ignore_index=True)  # fmt: skip
    table.to_parquet(tmp_path / "rows.parquet")
    calibration_filter = {"split": "calib", "regime": "a"} if calibrated_on == "a" else {"split": "calib"}
    recipe = {"name": "regimes", "task": "classification", "model": {"path": "diff.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "y", "slices": [{"by": "regime"}],
                       "calibration": {"filter": calibration_filter, "samples": 300, "seed": 0},
                       "evaluation": {"filter": {"split": "eval"}}},
              "variants": [{"name": "fp16", "precision": "fp16"},
                           {"name": "int8", "precision": "int8", "calibrator": "minmax"}], "backends": [BACKEND],
              "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 2, "threads": 1},
              "gate": {"metric": "accuracy", "max_drop": 0.05, "max_slice_drop": 0.05,
                       "applies_to": ["fp16", "int8"]}}  # fmt: skip
    (tmp_path / "qbench.yaml").write_text(yaml.safe_dump(recipe))
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))  # this build is no other test's INT8
    code, breaches = swept_breaches(tmp_path / "qbench.yaml")
    if calibrated_on == "a":
        assert breaches == [f"BREACH int8@{BACKEND} slice regime=b output_spread: its outputs vary across the 300 rows "
                            f"by 0, FP32's by {np.sqrt(np.var(regime_b[:, 0] - regime_b[:, 1])):.4g} (the rows' RMS "
                            "distance from their mean), under 0.1 of FP32's (0 of it): the variant's outputs lost "
                            "most of FP32's variation across these rows",
                            f"BREACH int8@{BACKEND} slice regime=b decisions_kept: class 1: FP32 decides it on 9 rows, "
                            "the variant on 0 of them: 0.0% kept, under 50%; by chance at its change rate on the "
                            "classes it keeps (0.00%): probability 0"]  # fmt: skip
        assert code == EXIT_BREACH
    else:
        assert (breaches, code) == ([], EXIT_PASS)


def _tagged(rows: int = 400, tokens: int = 12, classes: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """(scores, token labels): 3 to 7 scored tokens a row, the rest labelled -100 (padding), whose FP32 scores are
    large and vary from row to row (an export leaves them as the model computes them)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, classes, (rows, tokens))
    labels[np.arange(tokens)[None, :] >= rng.integers(3, 8, rows)[:, None]] = -100
    scores = rng.normal(size=(rows, tokens, classes))
    scores[labels == -100] = rng.normal(scale=30, size=(int(np.count_nonzero(labels == -100)), classes))
    return scores.astype(np.float32), labels


def test_token_scores_spread_over_the_scored_tokens_alone():
    """A variant equal to FP32 on every scored token that zeroes the padding: its spread over every value fell from
    159.3 to 4.44 (under a tenth), and the gate breached an output_spread no metric reads (exit 1); over the scored
    tokens both spread 5.32 and it passes. The reverse, every scored token one constant vector and the padding kept,
    kept 99.96 % of FP32's spread over every value; over the scored tokens it spreads 0: a breach."""
    scores, labels = _tagged()
    spec = GateSpec(metric="accuracy", max_drop=0.01, applies_to=["int8-*"], unresolved="note")
    padding = labels == -100
    zeroed = np.where(padding[..., None], np.float32(0), scores)
    report = evaluate_gate(_results("classification", scores, zeroed, labels), spec)
    assert report.exit_code == EXIT_PASS and not report.breaches
    constant = np.where(padding[..., None], scores, scores[~padding].mean(axis=0))
    report = evaluate_gate(_results("classification", scores, constant, labels), spec)
    spread = [c for c in report.breaches if c.metric == "output_spread"]
    assert [(c.scope, c.observed) for c in spread] == [("overall", 0.0)]
    # by hand: each token position's scores vary over the rows that score it
    by_hand = np.sqrt(sum(np.var(scores[~padding[:, t], t].astype(np.float64), axis=0).sum() for t in range(12)
                      if (~padding[:, t]).any()))  # tokens 7 and on are never scored
    assert spread[0].reference == pytest.approx(by_hand, rel=1e-9)


def test_a_slice_whose_fp32_variation_lies_below_an_8_bit_step_is_not_judged_collapsed_by_int8_rounding():
    """A detector's scores on images without an object: FP32's probabilities there all lie within 5e-4 of 0 (spread
    about 1e-4, under 1/256 of the 0.5 the scores vary by over every row), and an INT8 output grid of 1/255 rounds
    every one of them to 0. That is rounding, not a collapse: the variant decides every row as FP32 does. Before,
    the gate breached it on that slice ('its outputs vary ... by 0 ... a constant answer'), exit 1."""
    rng = np.random.default_rng(3)
    positive = np.where(SLICE_B["half=a"], rng.uniform(0.0, 1.0, ROWS), rng.uniform(1e-5, 5e-4, ROWS))
    probabilities = np.stack([1 - positive, positive], axis=1).astype(np.float32)
    labels = (positive > 0.5).astype(np.int64)
    rounded = (np.round(probabilities * 255) / 255).astype(np.float32)  # a static INT8 output's grid over [0, 1]
    results = _results("classification", probabilities, rounded, labels, SLICE_B)
    b = results.find("fp32", BACKEND).accuracy.slice("half=b").spread["out"]
    assert 0 < b < results.find("fp32", BACKEND).accuracy.overall.spread["out"] / 256
    assert results.find("int8-a", BACKEND).accuracy.slice("half=b").spread["out"] == 0.0
    report = evaluate_gate(results, ACCURACY)
    assert [c.metric for c in report.breaches] == [] and report.exit_code == EXIT_PASS
    spreads = {c.scope for c in report.checks if c.metric == "output_spread"}
    assert spreads == set()  # judged overall and on half=a (kept, no check row), not on half=b


def test_a_float_variant_losing_a_slices_variation_below_an_8_bit_step_is_still_judged():
    """FP16 keeps its relative precision near 0: scores of 1e-5 to 5e-4 stay apart in it, so an FP16 variant giving
    one value on that slice broke it, however little FP32's scores vary there next to their overall spread."""
    import dataclasses

    rng = np.random.default_rng(3)
    positive = np.where(SLICE_B["half=a"], rng.uniform(0.0, 1.0, ROWS), rng.uniform(1e-5, 5e-4, ROWS))
    probabilities = np.stack([1 - positive, positive], axis=1).astype(np.float32)
    labels = (positive > 0.5).astype(np.int64)
    flat = probabilities.copy()
    flat[SLICE_B["half=b"]] = [1 - 2.5e-4, 2.5e-4]
    results = _results("classification", probabilities, flat, labels, SLICE_B)
    as_fp16 = dataclasses.replace(results, variants=tuple(
        dataclasses.replace(v, precision="fp16") if v.variant == "int8-a" else v for v in results.variants))
    assert [(c.scope, c.metric) for c in evaluate_gate(as_fp16, ACCURACY).breaches] == [("half=b", "output_spread")]
    assert evaluate_gate(results, ACCURACY).breaches == ()  # the same outputs from an INT8 variant: its grid's rounding


def test_a_slice_varying_by_more_than_an_8_bit_step_is_still_judged_on_its_spread():
    """The same rows, with half b's scores spread over [0.01, 0.05] (above one step of 1/255 over the output's
    values): a variant giving one vector there breaches on that slice."""
    rng = np.random.default_rng(3)
    positive = np.where(SLICE_B["half=a"], rng.uniform(0.0, 1.0, ROWS), rng.uniform(0.01, 0.05, ROWS))
    probabilities = np.stack([1 - positive, positive], axis=1).astype(np.float32)
    labels = (positive > 0.5).astype(np.int64)
    dead = probabilities.copy()
    dead[SLICE_B["half=b"]] = [0.97, 0.03]
    report = evaluate_gate(_results("classification", probabilities, dead, labels, SLICE_B), ACCURACY)
    assert [(c.scope, c.metric) for c in report.breaches] == [("half=b", "output_spread")]
    assert report.exit_code == EXIT_BREACH
