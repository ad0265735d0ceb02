"""rows_kept (qbench.validate.kept) on a tiny sentence-encoder-like graph: every output shares a dominant direction (a
large constant added before the L2 normalisation, as real encoders' outputs effectively have), so a mean cosine with
FP32 stays high while a few rows are ruined. Hand-edited graphs ruin rows the recipe's slices do not isolate; each
breaches. Honest FP16 and INT8 builds of the same graph, made by the sweep, pass."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from user_model import swept_breaches

from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, evaluate_gate
from qbench.recipe.spec import GateSpec
from qbench.results.schema import SweepResults, VariantResult, from_dict, to_json
from qbench.validate.accuracy import evaluate_accuracy, with_drops

BACKEND = "onnxruntime-cpu"
ROWS, FEATURES, DIM = 1000, 8, 16
COMMON = 1.5  # FP32's rows then share a cosine of 0.87 (|mean unit vector|^2)
SPEC = GateSpec(metric="cosine", max_drop=0.01, max_slice_drop=0.02, unresolved="note")


def _encoder(edit: tuple[int, float, str] | None = None) -> bytes:
    """x (rows, 8) → y (rows, 16) = L2-normalised(relu(x W1) W2 + 1.5); `edit` (column, threshold, kind): rows whose x
    column exceeds the threshold get `point` (FP32's output of one fixed input), `flip` (their own output negated)
    or `common` (the shared direction alone)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = (rng.normal(size=(FEATURES, 32)) / np.sqrt(FEATURES)).astype(np.float32)
    w2 = (rng.normal(size=(32, DIM)) / np.sqrt(32)).astype(np.float32)
    common = np.full((1, DIM), COMMON, np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["s"]), helper.make_node("Add", ["s", "common"], ["e"]),
             helper.make_node("LpNormalization", ["e"], ["y" if edit is None else "fp32"], axis=1, p=2)]  # fmt: skip
    weights = {"w1": w1, "w2": w2, "common": common}
    if edit is not None:
        column, threshold, kind = edit
        nodes += [helper.make_node("Gather", ["x", "column"], ["picked"], axis=1),
                  helper.make_node("Greater", ["picked", "threshold"], ["over"]),
                  helper.make_node("Unsqueeze", ["over", "axis"], ["edited"])]  # fmt: skip
        weights |= {"column": np.array(column, np.int64), "threshold": np.array(threshold, np.float32),
                    "axis": np.array([1], np.int64)}  # fmt: skip
        if kind == "flip":
            nodes += [helper.make_node("Neg", ["fp32"], ["other"])]
        else:
            one = common if kind == "common" else np.maximum(np.ones((1, FEATURES), np.float32) @ w1, 0) @ w2 + common
            nodes += [helper.make_node("LpNormalization", ["one"], ["other"], axis=1, p=2)]
            weights["one"] = one.astype(np.float32)
        nodes += [helper.make_node("Where", ["edited", "other", "fp32"], ["y"])]
    graph = helper.make_graph(nodes, "encoder",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", DIM])],
                              [numpy_helper.from_array(value, name) for name, value in weights.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    """(evaluation rows, calibration rows), drawn alike."""
    rng = np.random.default_rng(1)
    return rng.normal(size=(ROWS, FEATURES)).astype(np.float32), rng.normal(size=(300, FEATURES)).astype(np.float32)


def _run(model: bytes, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _slices(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"part=high": x[:, 1] > 1.0, "part=low": x[:, 1] <= 1.0}


def _report(outputs: np.ndarray, reference: np.ndarray, slices: dict[str, np.ndarray]):
    """The gate's report on FP32 and one variant 'int8-a' measured on the same rows (read back from results.json)."""
    fp32 = evaluate_accuracy("embedding", reference, reference, None, slices)
    own = with_drops(evaluate_accuracy("embedding", outputs, reference, None, slices), fp32)
    variants = tuple(VariantResult(variant=name, backend=BACKEND, precision=name[:4], status="ok", accuracy=accuracy)
                     for name, accuracy in (("fp32", fp32), ("int8-a", own)))  # fmt: skip
    results = SweepResults(qbench_version="0", created_at="", recipe={"name": "toy", "task": "embedding"},
                           environment={}, calibration=None, evaluation_rows=ROWS, gate_metric="cosine",
                           reference="fp32", variants=variants)  # fmt: skip
    return evaluate_gate(from_dict(json.loads(to_json(results))), SPEC)


def test_fp32_s_rows_share_a_dominant_direction():
    x, _ = _inputs()
    fp32 = _run(_encoder(), x)
    mean = np.mean(fp32 / np.linalg.norm(fp32, axis=1, keepdims=True), axis=0)
    assert float(mean @ mean) == pytest.approx(0.875, abs=0.01)  # a typical pair of rows: cosine 0.87


@pytest.mark.parametrize(("edit", "rows", "cosine", "worst"), [
    ((0, 2.0, "point"), 18, 0.9986, "row 482"),  # 18 rows, outside any slice, merged onto one point
    ((0, 3.0, "flip"), 3, 0.9940, "row 176"),  # 3 of 1000 rows flipped
])  # fmt: skip
def test_a_few_ruined_rows_breach_though_the_mean_cosine_is_within_tolerance(edit, rows, cosine, worst):
    """Before rows_kept the gate passed both (exit 0): the mean cosine moves by under 0.01 and the spread of every
    dimension stays; now each breaches overall and on the slices holding such rows, naming the worst row."""
    x, _ = _inputs()
    fp32, broken = _run(_encoder(), x), _run(_encoder(edit), x)
    assert int(np.count_nonzero(np.any(broken != fp32, axis=1))) == rows
    report = _report(broken, fp32, _slices(x))
    [overall] = [c for c in report.checks if c.metric == "cosine" and c.scope == "overall"]
    assert overall.status == "pass" and overall.observed == pytest.approx(cosine, abs=0.001)
    assert {c.metric for c in report.breaches} == {"rows_kept"}
    overall_breaches = [(c.scope, c.reason, c.observed) for c in report.breaches if c.scope == "overall"]
    assert overall_breaches == [("overall", worst, 0.0)]
    assert report.exit_code == EXIT_BREACH


def test_a_slice_left_with_the_shared_direction_alone_breaches():
    """The 149 rows of slice part=high (x1 > 1) give the shared direction alone: the gate breached it before
    rows_kept too (that slice's outputs no longer vary: output_spread, spread_kept; its cosine 0.837, the overall
    0.976), and now rows_kept breaches overall as well."""
    x, _ = _inputs()
    fp32, broken = _run(_encoder(), x), _run(_encoder((1, 1.0, "common")), x)
    report = _report(broken, fp32, _slices(x))
    assert {(c.scope, c.metric) for c in report.breaches} >= {
        ("part=high", "cosine"), ("part=high", "output_spread"), ("part=high", "spread_kept"), ("overall", "cosine"),
        ("overall", "rows_kept")}
    assert report.exit_code == EXIT_BREACH


def test_honest_fp16_and_int8_builds_of_the_encoder_pass(tmp_path, monkeypatch):
    """End to end: the sweep's FP16 and INT8 builds (static minmax, entropy, percentile; dynamic) of the same graph
    keep at least 0.6 of every row (entropy, whose calibrator clips the activations' extremes, the least: 0.67;
    FP16 and dynamic record spread_kept: they kept more of every row than of their worst dimension, 0.99)."""
    x, calibration = _inputs()
    (tmp_path / "encoder.onnx").write_bytes(_encoder())
    parts = np.where(_slices(x)["part=high"], "high", "low")
    pd.concat([pd.DataFrame({"x": list(calibration), "part": "none", "split": "calib"}),
               pd.DataFrame({"x": list(x), "part": parts, "split": "eval"})],
              ignore_index=True).to_parquet(tmp_path / "rows.parquet")  # fmt: skip
    recipe = {"name": "encoder", "task": "embedding", "model": {"path": "encoder.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "slices": [{"by": "part"}],
                       "calibration": {"filter": {"split": "calib"}, "samples": 200, "seed": 0},
                       "evaluation": {"filter": {"split": "eval"}}},
              "variants": [{"name": "fp16", "precision": "fp16"}] + [
                  {"name": f"int8-{c}", "precision": "int8", "calibrator": c}
                  for c in ("minmax", "entropy", "percentile", "dynamic")],
              "backends": [BACKEND], "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 2, "threads": 1},
              "gate": {"metric": "cosine", "max_drop": 0.01, "max_slice_drop": 0.02, "unresolved": "note"}}  # fmt: skip
    (tmp_path / "qbench.yaml").write_text(yaml.safe_dump(recipe))
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    code, breaches = swept_breaches(tmp_path / "qbench.yaml")
    assert (breaches, code) == ([], EXIT_PASS)
    [path] = glob.glob(str(tmp_path / "reports" / "**" / "results.json"), recursive=True)
    kept = {}
    for variant in json.loads(Path(path).read_text())["variants"]:
        for scope in (variant["accuracy"]["overall"], *variant["accuracy"]["slices"]):
            shares = [k["own"] / k["reference"] for k in scope["kept"].values() if k["rule"] == "rows_kept"]
            kept[variant["variant"]] = min([*shares, kept.get(variant["variant"], 1.0)])
    assert min(kept.values()) > 0.6
