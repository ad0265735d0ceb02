"""Log-probabilities with -inf for classes a row may not take (log_softmax after a -inf mask, a classifier head
masking the classes a row's category does not allow) are scored, not refused: -inf is a class ruled out on that row.
The arg-max, agreement and KL are defined over the classes left; a variant whose -inf positions differ from FP32's on
a row fails there (a NaN/inf row of its own, which the gate breaches on); a mask of every class on every row is
still refused by the dry run (tests/validate/test_dry_run_masked_outputs.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pandas as pd
import pytest
import torch
import yaml

from qbench.cli.app import main
from qbench.gate.evaluate import judge
from qbench.recipe.spec import GateSpec
from qbench.results.schema import LatencyPoint, LatencyResult, VariantResult
from qbench.validate import metrics
from qbench.validate.accuracy import evaluate_accuracy, with_drops

NEG = -np.inf


# -- pure functions, against figures computed by hand ---------------------------------------------------------------


def test_minus_inf_is_a_class_ruled_out_where_masked_and_a_failure_otherwise():
    scores = np.array([[0.0, NEG, -1.0], [NEG, NEG, NEG], [np.nan, 0.0, 0.0], [np.inf, 0.0, 0.0], [0.0, 1.0, 2.0]])
    assert metrics.nonfinite_rows(scores).tolist() == [True, True, True, True, False]
    assert metrics.nonfinite_rows(scores, masked=True).tolist() == [False, True, True, True, False]
    # per token: a token all -inf that no metric reads is none
    tokens = np.array([[[0.0, NEG], [NEG, NEG]], [[NEG, 1.0], [0.0, 0.0]]])
    read = np.array([[True, False], [True, True]])
    assert metrics.nonfinite_rows(tokens, read, masked=True).tolist() == [False, False]
    assert metrics.nonfinite_rows(tokens, read).tolist() == [True, True]
    assert metrics.top1(scores, masked=True).tolist() == [0, -1, -1, -1, 2]
    assert metrics.top1(np.array([[NEG, -3.0, -2.0]]), masked=True).tolist() == [2]


def test_kl_max_abs_error_and_spread_are_finite_over_the_classes_left():
    """FP32 [0, -inf, 0] is p = (1/2, 0, 1/2); the variant [0, -inf, ln 3] q = (1/4, 0, 3/4): KL = 1/2 ln 2 +
    1/2 ln(2/3) = 1/2 ln(4/3) = 0.143841; the largest difference ln 3 = 1.098612. A row where the variant rules out
    class 0 too is NaN (its failure) and differs by inf there."""
    reference = np.array([[0.0, NEG, 0.0], [0.0, NEG, 0.0]])
    outputs = np.array([[0.0, NEG, math.log(3.0)], [NEG, NEG, 0.0]])
    kl = metrics.kl_rows(reference, outputs, as_probabilities=False, masked=True)
    assert kl[0] == pytest.approx(0.5 * math.log(4.0 / 3.0), abs=1e-12) and math.isnan(kl[1])
    assert np.isnan(metrics.kl_rows(reference, outputs, as_probabilities=False)).all()  # unmasked: both failures
    assert metrics.kl_rows(reference, reference, as_probabilities=False, masked=True).tolist() == [0.0, 0.0]
    assert metrics.max_abs_error(outputs[:1], reference[:1], masked=True) == pytest.approx(math.log(3.0), abs=1e-12)
    assert metrics.max_abs_error(outputs, reference, masked=True) == math.inf
    assert metrics.mask_changed_rows(outputs, reference).tolist() == [False, True]
    # spread: class 1 -inf on every row moves nothing; classes 0 and 2 vary over rows [0, 0, 2] and [ln 3, 4, 2]
    rows = np.array([[0.0, NEG, math.log(3.0)], [0.0, NEG, 4.0], [2.0, NEG, 2.0]])
    by_hand = math.sqrt(np.var([0.0, 0.0, 2.0]) + np.var([math.log(3.0), 4.0, 2.0]))
    assert metrics.spread(rows, masked=True) == pytest.approx(by_hand, abs=1e-12)
    assert math.isnan(metrics.spread(rows))  # unmasked: no finite row


def test_a_variant_ruling_out_other_classes_is_counted_as_its_failure():
    """Four rows, FP32's masks differ per row; the variant agrees on rows 0-2 and on row 3 scores a class FP32 rules
    out (the same arg-max): a NaN/inf row of its own, new to FP32's, a miss in agreement and accuracy."""
    with np.errstate(divide="ignore"):
        reference = np.log(np.array([[0.7, 0.3, 0.0], [0.0, 0.4, 0.6], [0.6, 0.0, 0.4], [0.9, 0.0, 0.1]]))
        variant = np.log(np.array([[0.6, 0.4, 0.0], [0.0, 0.3, 0.7], [0.7, 0.0, 0.3], [0.89, 0.01, 0.1]]))
    labels = np.array([0, 2, 0, 0])
    result = evaluate_accuracy("classification", variant, reference, labels, {})
    fp32 = evaluate_accuracy("classification", reference, reference, labels, {})
    assert fp32.nonfinite_outputs == 0 and fp32.overall.metrics["accuracy"] == 1.0
    assert fp32.overall.metrics["kl_mean"] == 0.0 and fp32.overall.metrics["max_abs_error"] == 0.0
    assert result.nonfinite_outputs == 1 and result.overall.new_nonfinite_outputs == 1
    assert result.overall.metrics["agreement"] == 0.75 and result.overall.metrics["accuracy"] == 0.75
    assert math.isnan(result.overall.metrics["kl_mean"])  # the variant's failure row leaves its mean undefined
    finite = evaluate_accuracy("classification", variant[:3], reference[:3], labels[:3], {})
    by_hand = np.mean([0.7 * math.log(0.7 / 0.6) + 0.3 * math.log(0.3 / 0.4),
                       0.4 * math.log(0.4 / 0.3) + 0.6 * math.log(0.6 / 0.7),
                       0.6 * math.log(0.6 / 0.7) + 0.4 * math.log(0.4 / 0.3)])
    assert finite.nonfinite_outputs == 0 and finite.overall.metrics["kl_mean"] == pytest.approx(by_hand, abs=1e-9)
    assert finite.overall.metrics["max_abs_error"] == pytest.approx(math.log(0.4 / 0.3), abs=1e-9)  # row 0 class 1


def test_the_gate_breaches_a_variant_ruling_out_a_class_fp32_scores():
    """400 rows, FP32's -inf positions varying by row; the variant is FP32's but for one row where it rules out a class
    FP32 scores (its arg-max unchanged): accuracy drops 0.0025, well within max_drop 0.5, and the gate breaches on
    that row (nonfinite_outputs, exit 1)."""
    with np.errstate(divide="ignore"):
        reference = np.log(np.array([[0.7, 0.3, 0.0], [0.0, 0.4, 0.6], [0.6, 0.0, 0.4], [0.9, 0.1, 0.0]] * 100))
    variant = reference.copy()
    variant[3] = [math.log(0.9), NEG, NEG]
    labels = reference.argmax(axis=1)
    fp32 = evaluate_accuracy("classification", reference, reference, labels, {})
    point = LatencyPoint(32, 1, 5, 1.0, 1.0, 1.0, 1.0, 32.0)
    latency = LatencyResult(threads=1, session_create_ms=1.0, first_run_ms=1.0, points=(point,))
    accuracy = with_drops(evaluate_accuracy("classification", variant, reference, labels, {}), fp32)
    assert accuracy.overall.drops["accuracy"] == pytest.approx(0.0025, abs=1e-12)
    verdict = judge(VariantResult("fp32", "cpu", "fp32", "ok", accuracy=fp32, latency=latency),
                    VariantResult("int8", "cpu", "int8", "ok", accuracy=accuracy, latency=latency),
                    GateSpec(metric="accuracy", max_drop=0.5, max_slice_drop=0.5))  # fmt: skip
    assert verdict.exit_code == 1
    assert [(c.metric, c.status) for c in verdict.checks if c.status != "pass"] == [("nonfinite_outputs", "breach")]


# -- a model as shipped: log_softmax after a per-row mask from an input, swept with FP16 and INT8 --------------------

ROWS, CALIBRATION, FEATURES, CLASSES = 240, 80, 6, 4
ALLOWED = torch.tensor([[True, True, False, True], [False, True, True, True], [True, False, True, False]])


class MaskedHead(torch.nn.Module):
    """x [N, 6]: 6 features, a linear head over 4 classes; `category` [N] (int64) picks the classes allowed."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(FEATURES, CLASSES)
        self.register_buffer("allowed", ALLOWED)

    def forward(self, x: torch.Tensor, category: torch.Tensor) -> torch.Tensor:
        scores = self.linear(x).masked_fill(~self.allowed[category], float("-inf"))
        return torch.log_softmax(scores, dim=-1)


def _project(root: Path) -> tuple[Path, np.ndarray, np.ndarray, np.ndarray]:
    model = MaskedHead().eval()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    category = (np.arange(ROWS) % 3).astype(np.int64)
    with torch.no_grad():
        truth = model(torch.from_numpy(x), torch.from_numpy(category)).numpy()
    labels = truth.argmax(axis=1)
    labels[::10] = np.where(ALLOWED.numpy()[category[::10], 3], 3, 1)  # some wrong answers: accuracy below 1
    torch.onnx.export(model, (torch.from_numpy(x[:2]), torch.from_numpy(category[:2])), str(root / "model.onnx"),
                      input_names=["x", "category"], output_names=["log_p"], opset_version=17, dynamo=False,
                      dynamic_axes={"x": {0: "batch"}, "category": {0: "batch"}, "log_p": {0: "batch"}})  # fmt: skip
    split = ["calib" if i < CALIBRATION else "eval" for i in range(ROWS)]
    pd.DataFrame({"x": list(x), "category": category, "y": labels, "kind": [f"c{c}" for c in category],
                  "split": split}).to_parquet(root / "rows.parquet")  # fmt: skip
    recipe = {"name": "masked", "task": "classification", "model": {"path": "model.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x", "category": "category"}, "label": "y",
                       "slices": [{"by": "kind"}], "calibration": {"filter": {"split": "calib"},
                                                                   "samples": CALIBRATION},
                       "evaluation": {"filter": {"split": "eval"}}},
              "variants": [{"name": "fp16", "precision": "fp16"},
                           {"name": "int8", "precision": "int8", "calibrator": "minmax"}],
              "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 3, "threads": 1},
              "analysis": {"ranges": False}, "gate": {"metric": "accuracy", "max_drop": 0.5, "max_slice_drop": 0.5},
              "output_dir": "reports"}  # fmt: skip
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    evaluated = slice(CALIBRATION, ROWS)
    return root / "recipe.yaml", x[evaluated], category[evaluated], labels[evaluated]


def test_a_log_softmax_after_a_per_row_mask_is_swept_and_passes(tmp_path: Path, capsys):
    """Every FP32 row holds -inf (the classes its category rules out). Before, each was FP32's failure: every metric
    undefined and the gate exit 2 on variants identical in their decisions. Now FP32's accuracy is its arg-max over
    the classes left (checked against onnxruntime's outputs with numpy), FP16 and INT8 keep FP32's -inf positions,
    and the gate passes both (exit 0)."""
    recipe, x, category, labels = _project(tmp_path)
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 0, capsys.readouterr()
    [results] = sorted((tmp_path / "reports").glob("*/*/results.json"))
    variants = {v["variant"]: v for v in json.loads(results.read_text())["variants"]}
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    log_p = session.run(None, {"x": x, "category": category})[0]
    assert np.isneginf(log_p).sum() == len(log_p) * 1 + np.count_nonzero(category == 2)  # 1 or 2 ruled out a row
    fp32 = variants["fp32"]["accuracy"]
    assert fp32["nonfinite_outputs"] == 0
    assert fp32["overall"]["metrics"]["accuracy"] == pytest.approx(np.mean(log_p.argmax(axis=1) == labels), abs=1e-12)
    assert fp32["overall"]["metrics"]["kl_mean"] == 0.0 and fp32["overall"]["metrics"]["max_abs_error"] == 0.0
    for name in ("fp16", "int8"):
        figures = variants[name]["accuracy"]
        assert figures["nonfinite_outputs"] == 0, name
        values = figures["overall"]["metrics"]
        assert all(math.isfinite(values[m]) for m in ("accuracy", "agreement", "kl_mean", "max_abs_error")), name
        assert all(math.isfinite(s) for s in figures["overall"]["spread"].values()), name


def test_a_per_row_mask_passes_the_dry_run_whatever_the_order_of_the_evaluation_rows(tmp_path: Path, capsys):
    """The same model and rows with the evaluation rows sorted by category: the dry run's first 8 rows all rule out
    the same class (class 2, category 0). `qbench validate` refused it (exit 2) as a mask 'written wrong, built from a
    constant, not from the row', while the rows in another order swept and passed; now it passes either way."""
    recipe, *_ = _project(tmp_path)
    table = pd.read_parquet(tmp_path / "rows.parquet")
    evaluated = table[table["split"] == "eval"].sort_values("category", kind="stable")
    pd.concat([table[table["split"] == "calib"], evaluated]).to_parquet(tmp_path / "rows.parquet")
    assert (evaluated["category"].to_numpy()[:8] == 0).all()
    assert main(["validate", str(recipe)]) == 0, capsys.readouterr().err
