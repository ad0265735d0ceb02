"""Values beyond a variant's float format: a -inf/+inf that rounds an FP32 class score FP16 cannot hold, the arg-max
unchanged, is read as FP32's value (qbench.validate.float_range); the same overflow of a regression output or an
embedding stays the variant's failure."""

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
from qbench.validate import float_range
from qbench.validate.accuracy import beyond_range_notes, evaluate_accuracy

FP16 = float_range.FLOAT_FORMATS["fp16"]
INF = np.inf


# -- pure functions, against figures computed by hand ---------------------------------------------------------------


def test_the_formats_limits():
    assert FP16.largest == 65504.0 and FP16.smallest == 2.0**-24
    bf16 = float_range.float_format("bf16")
    assert bf16 is not None and bf16.largest == pytest.approx(3.3895e38, rel=1e-4) and bf16.smallest == 2.0**-133
    assert float_range.float_format("fp32") is None and float_range.float_format("int8") is None
    assert float_range.float_format("fp8") is None and float_range.float_format(None) is None


def test_which_infinities_round_a_value_the_format_cannot_hold():
    """Row 0: class 2 at -9e4 (beyond -65504; its probability exp(-9e4) is 0). Row 1: class 0 at 9e4, the only +inf.
    Row 2: class 2 at ln p = -20 (p = 2.06e-09 below 2**-24 = 5.96e-08). Row 3: class 2 at -10 (p = 4.5e-05 > 2**-24):
    the variant rules out a class FP32 gives a probability FP16 holds. Row 4: two classes beyond 65504, both +inf: no
    arg-max. Row 5: NaN. Row 6: row 2's FP32 scores, the variant's others moved below -20: read as FP32's, class 2
    would win where the variant's own arg-max is class 1."""
    reference = np.array([[1.0, 2.0, -9e4], [9e4, 1.0, 2.0], [0.0, 0.0, -20.0], [0.0, 0.0, -10.0],
                          [9e4, 8e4, 1.0], [1.0, 2.0, -9e4], [0.0, 0.0, -20.0]])  # fmt: skip
    outputs = np.array([[1.01, 2.0, -INF], [INF, 1.0, 2.0], [0.0, 0.0, -INF], [0.0, 0.0, -INF],
                        [INF, INF, 1.0], [np.nan, 2.0, -INF], [-30.0, -25.0, -INF]])  # fmt: skip
    rounded = float_range.beyond_format(outputs, reference, FP16)
    assert rounded.any(axis=1).tolist() == [True, True, True, False, False, True, False]
    assert rounded[0].tolist() == [False, False, True] and rounded[1].tolist() == [True, False, False]
    read = float_range.read_as_reference(outputs, reference, FP16)
    assert read[0].tolist() == [1.01, 2.0, -9e4] and read[1].tolist() == [9e4, 1.0, 2.0]
    assert read[2].tolist() == [0.0, 0.0, -20.0] and np.isneginf(read[3, 2]) and np.isposinf(read[4, :2]).all()
    assert np.isnan(read[5, 0]) and read[5, 2] == -9e4  # the NaN stays: the row is still the variant's failure
    assert read[6].tolist() == [-30.0, -25.0, -INF]
    assert float_range.read_as_reference(outputs, reference, None) is outputs  # no format (FP32, INT8): as given
    # per token (rows, tokens, classes): each token's scores along the last axis
    tokens = float_range.beyond_format(outputs[None, :3], reference[None, :3], FP16)
    assert tokens[0].tolist() == rounded[:3].tolist()
    # one score column and other shapes are never read
    assert not float_range.beyond_format(np.array([[-INF]]), np.array([[-9e4]]), FP16).any()


def test_a_class_score_beyond_fp16_is_no_failure_a_regression_value_is():
    """Four rows; the variant is FP32 rounded to float16 (as an FP16 graph hands it out): row 1's class 2 at -70000
    is -inf, its arg-max (class 0) unchanged. Classification: no NaN/inf row, agreement 1, kl_mean and max_abs_error
    those of the finite values (row 0's 0.1 rounded: |0.0999755859375 - 0.1|). Regression on the same values: the
    -inf is a lost value, the variant's NaN/inf row."""
    reference = np.array([[3.0, 0.1, -1.0], [5.0, 1.0, -70000.0], [0.0, 2.0, 1.0], [1.0, -2.0, 4.0]])
    with np.errstate(over="ignore"):
        outputs = reference.astype(np.float16).astype(np.float64)
    assert np.isneginf(outputs[1, 2])
    labels = np.array([0, 0, 1, 1])
    before = evaluate_accuracy("classification", outputs, reference, labels, {})
    assert before.nonfinite_outputs == 1 and before.overall.metrics["agreement"] == 0.75
    after = evaluate_accuracy("classification", outputs, reference, labels, {}, precision="fp16")
    assert after.nonfinite_outputs == 0 and after.overall.new_nonfinite_outputs == 0
    assert after.overall.metrics["agreement"] == 1.0 and after.overall.metrics["accuracy"] == 0.75
    assert after.overall.metrics["max_abs_error"] == pytest.approx(abs(float(np.float16(0.1)) - 0.1), abs=1e-15)
    assert math.isfinite(after.overall.metrics["kl_mean"]) and after.overall.metrics["kl_mean"] < 1e-7
    assert after.overall.spread[""] == pytest.approx(evaluate_accuracy(
        "classification", reference, reference, labels, {}).overall.spread[""], rel=1e-6)  # fmt: skip
    int8 = evaluate_accuracy("classification", outputs, reference, labels, {}, precision="int8")
    assert int8.nonfinite_outputs == 1  # no float format: an INT8 variant's -inf is its failure
    regression = evaluate_accuracy("regression", outputs, reference, None, {}, precision="fp16")
    assert regression.nonfinite_outputs == 1 and regression.overall.metrics["max_abs_error"] == math.inf
    notes = beyond_range_notes("classification", {"y": outputs}, {"y": reference}, "fp16")
    assert len(notes) == 1 and notes[0].startswith("output 'y': 1 row hold -inf/+inf "
                                                   "scores where FP32's score is beyond")
    assert beyond_range_notes("regression", {"y": outputs}, {"y": reference}, "fp16") == []


# -- a model as shipped: logits below -65504 on 15 evaluation rows, none among the calibration rows -------------------

ROWS, CALIBRATION, FEATURES = 200, 60, 4


class Head(torch.nn.Module):
    """A linear head over 3 classes whose class 2 falls by 30 per unit of feature 3 (an amount): 3000 (a value FP16
    holds) gives -90000 (one it does not). `regression`: the first score plus that amount, one value per row."""

    def __init__(self, regression: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(FEATURES, 3)
        with torch.no_grad():
            self.linear.weight[:, 3] = torch.tensor([0.0, 0.0, 30.0 if regression else -30.0])
        self.regression = regression

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.linear(x)
        return scores[:, 2:] if self.regression else scores


def _project(root: Path, regression: bool) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    big = np.zeros(ROWS, dtype=bool)
    big[CALIBRATION::9] = True
    big[CALIBRATION + 15 * 9:] = False  # 15 evaluation rows
    x[big, 3] = 3000.0
    model = Head(regression).eval()
    with torch.no_grad():
        y = model(torch.from_numpy(x)).numpy()
    torch.onnx.export(model, (torch.from_numpy(x[:2]),), str(root / "model.onnx"), input_names=["x"],
                      output_names=["y"], opset_version=17, dynamo=False,
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})  # fmt: skip
    labels = y[:, 0] if regression else y.argmax(axis=1)
    pd.DataFrame({"x": list(x), "y": labels, "big": np.where(big, "big", "small"),
                  "split": ["calib" if i < CALIBRATION else "eval" for i in range(ROWS)]}).to_parquet(root / "rows.parquet")
    recipe = {"name": "beyond", "task": "regression" if regression else "classification",
              "model": {"path": "model.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "y", "slices": [{"by": "big"}],
                       "calibration": {"filter": {"split": "calib"}, "samples": CALIBRATION},
                       "evaluation": {"filter": {"split": "eval"}}},
              "variants": [{"name": "fp16", "precision": "fp16"}],
              "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 3, "threads": 1},
              "analysis": {"ranges": False},
              "gate": {"metric": "mae" if regression else "accuracy", "max_drop": 0.5, "max_slice_drop": 0.5},
              "output_dir": "reports"}  # fmt: skip
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    evaluated = slice(CALIBRATION, ROWS)
    return root / "recipe.yaml", x[evaluated], labels[evaluated]


def _results(root: Path) -> dict:
    [results] = sorted((root / "reports").glob("*/*/results.json"))
    return {v["variant"]: v for v in json.loads(results.read_text())["variants"]}


def test_fp16_logits_beyond_its_range_on_some_rows_pass_the_gate(tmp_path: Path, capsys):
    """FP32's class 2 reaches -90000 on 15 evaluation rows; the FP16 variant (its faithful emulation, run here with
    onnxruntime) gives -inf there and the same arg-max on every row. Before: 15 NaN/inf rows, accuracy 0 on them and
    exit 1. Now: no NaN/inf row, agreement 1.0, the figures numpy gives over the finite values, and exit 0."""
    recipe, x, labels = _project(tmp_path, regression=False)
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 0, capsys.readouterr()
    variants = _results(tmp_path)
    run = lambda path: ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]  # noqa: E731
    fp32, fp16 = run(variants["fp32"]["model_path"]), run(variants["fp16"]["evaluated_model_path"])
    beyond = np.isinf(fp16)
    assert np.isneginf(fp16[beyond]).all() and beyond.any(axis=1).sum() == 15 and (fp32[beyond] < -65504).all()
    assert (fp16.argmax(axis=1) == fp32.argmax(axis=1)).all()
    figures = variants["fp16"]["accuracy"]
    values = figures["overall"]["metrics"]
    assert figures["nonfinite_outputs"] == 0 and values["agreement"] == 1.0
    assert values["accuracy"] == pytest.approx(np.mean(fp16.argmax(axis=1) == labels), abs=1e-12)
    by_hand = np.abs(np.where(beyond, 0.0, fp16.astype(np.float64) - fp32)).max()
    assert values["max_abs_error"] == pytest.approx(by_hand, rel=1e-6) and values["max_abs_error"] < 0.1
    assert any("15 rows hold -inf/+inf scores" in note for note in variants["fp16"]["notes"])


def test_a_regression_output_beyond_fp16_stays_a_failure_and_a_breach(tmp_path: Path, capsys):
    """The same amount as a regression output (+90000 on 15 rows, a slice of their own): FP16 gives +inf there, a
    value lost: 15 NaN/inf rows, a breach. Before, the gate called the results unusable (exit 2: 'the results record
    no fit_kept on slice big=big ... edited'), the slice's every row NaN/inf leaving fit_kept nothing to judge; now
    exit 1, as for any breach on complete results."""
    recipe, _, _ = _project(tmp_path, regression=True)
    assert main(["sweep", str(recipe), "--no-track", "--gate"]) == 1, capsys.readouterr()
    figures = _results(tmp_path)["fp16"]["accuracy"]
    assert figures["nonfinite_outputs"] == 15 and figures["overall"]["new_nonfinite_outputs"] == 15
    out = capsys.readouterr().out
    assert "BREACH fp16@onnxruntime-cpu overall nonfinite_outputs: NaN/inf on 15 rows" in out and "UNUSABLE" not in out
