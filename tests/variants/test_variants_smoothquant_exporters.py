"""SmoothQuant on graph patterns other exporters write: shared weights and scales, decomposed norms.

Smoothing alone must leave the FP32 function unchanged, whatever it folded into or inserted.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.variants.linear_int8 import smoothquant_int8
from qbench.variants.linear_qdq import LinearQuantSettings
from qbench.variants.smoothquant import SmoothQuantSettings, smooth_model

WIDTH, SEQ = 16, 6


def _model(
    nodes: list[onnx.NodeProto], weights: dict[str, np.ndarray], outputs: list[str], opset: int = 17
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", SEQ, WIDTH])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        initializer=[numpy_helper.from_array(value.astype(np.float32), name) for name, value in weights.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _decomposed_layer_norm(x: str, out: str, gamma: str, beta: str) -> list[onnx.NodeProto]:
    """LayerNorm as opset-13 exporters write it: ReduceMean/Sub/Pow/Sqrt/Div, then Mul by gamma and Add of beta."""
    return [
        helper.make_node("ReduceMean", [x], ["mean"], axes=[-1]), helper.make_node("Sub", [x, "mean"], ["centred"]),
        helper.make_node("Pow", ["centred", "two"], ["squared"]),
        helper.make_node("ReduceMean", ["squared"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["var_eps"]), helper.make_node("Sqrt", ["var_eps"], ["std"]),
        helper.make_node("Div", ["centred", "std"], ["normed"]), helper.make_node("Mul", ["normed", gamma], ["scaled"]),
        helper.make_node("Add", ["scaled", beta], [out]),
    ]  # fmt: skip


def shared_weight(rng: np.random.Generator) -> onnx.ModelProto:
    """One initializer read by two MatMuls whose inputs (two LayerNorms, outliers on different channels) need
    different smoothing vectors: each MatMul must end up with its own copy."""
    gamma_b = rng.normal(1, 0.2, WIDTH)
    gamma_b[5] = 30.0
    weights = {"gamma_a": rng.normal(1, 0.2, WIDTH), "beta_a": rng.normal(0, 0.1, WIDTH), "gamma_b": gamma_b,
               "beta_b": rng.normal(0, 0.1, WIDTH), "w": rng.normal(0, 0.3, (WIDTH, WIDTH))}  # fmt: skip
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma_a", "beta_a"], ["h_a"], axis=-1),
        helper.make_node("LayerNormalization", ["x", "gamma_b", "beta_b"], ["h_b"], axis=-1),
        helper.make_node("MatMul", ["h_a", "w"], ["y_a"]), helper.make_node("MatMul", ["h_b", "w"], ["y_b"]),
    ]
    return _model(nodes, weights, ["y_a", "y_b"])


def shared_norm_scale(rng: np.random.Generator) -> onnx.ModelProto:
    """Two LayerNorms reading one gamma and beta, each before its own Linear."""
    weights = {"gamma": rng.normal(1, 0.2, WIDTH), "beta": rng.normal(0, 0.1, WIDTH),
               "w1": rng.normal(0, 0.3, (WIDTH, WIDTH)), "w2": rng.normal(0, 0.3, (WIDTH, 8))}  # fmt: skip
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h1"], axis=-1),
        helper.make_node("MatMul", ["h1", "w1"], ["a"]),
        helper.make_node("LayerNormalization", ["a", "gamma", "beta"], ["h2"], axis=-1),
        helper.make_node("MatMul", ["h2", "w2"], ["y"]),
    ]
    return _model(nodes, weights, ["y"])


def decomposed_layer_norm(rng: np.random.Generator) -> onnx.ModelProto:
    weights = {"gamma": rng.normal(1, 0.2, WIDTH), "beta": rng.normal(0, 0.1, WIDTH), "two": np.array(2.0),
               "eps": np.array(1e-5), "w": rng.normal(0, 0.3, (WIDTH, 8))}  # fmt: skip
    return _model([*_decomposed_layer_norm("x", "h", "gamma", "beta"), helper.make_node("MatMul", ["h", "w"], ["y"])],
                  weights, ["y"], opset=13)  # fmt: skip


def rms_norm(rng: np.random.Generator) -> onnx.ModelProto:
    """Llama-style RMSNorm (no bias, the weight as the Mul's FIRST input) before Q and K projections."""
    weights = {"weight": rng.normal(1, 0.2, WIDTH), "two": np.array(2.0), "eps": np.array(1e-6),
               "wq": rng.normal(0, 0.3, (WIDTH, 8)), "wk": rng.normal(0, 0.3, (WIDTH, 8))}  # fmt: skip
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["squared"]),
        helper.make_node("ReduceMean", ["squared"], ["ms"], axes=[-1]),
        helper.make_node("Add", ["ms", "eps"], ["ms_eps"]), helper.make_node("Sqrt", ["ms_eps"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["normed"]), helper.make_node("Mul", ["weight", "normed"], ["h"]),
        helper.make_node("MatMul", ["h", "wq"], ["q"]), helper.make_node("MatMul", ["h", "wk"], ["k"]),
    ]  # fmt: skip
    return _model(nodes, weights, ["q", "k"], opset=13)


def pre_ln_heads(rng: np.random.Generator) -> onnx.ModelProto:
    """A pre-LN block as the TorchScript exporter writes it: the normalised input also feeds Shape nodes (the head
    split reads its shape), which read no values and must not stop the fold into the LayerNorm."""
    weights = {"gamma": rng.normal(1, 0.2, WIDTH), "beta": rng.normal(0, 0.1, WIDTH),
               "wq": rng.normal(0, 0.3, (WIDTH, 8)), "wk": rng.normal(0, 0.3, (WIDTH, 8))}  # fmt: skip
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], axis=-1),
        helper.make_node("Shape", ["h"], ["shape"]), helper.make_node("Size", ["h"], ["size"]),
        helper.make_node("Cast", ["shape"], ["shape_f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["size"], ["size_f"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["h", "wq"], ["q"]), helper.make_node("MatMul", ["h", "wk"], ["k"]),
    ]  # fmt: skip
    return _model(nodes, weights, ["q", "k", "shape_f", "size_f"])


def conv1d_reshape(rng: np.random.Generator) -> onnx.ModelProto:
    """GPT-2's Conv1D: `x.view(-1, x.size(-1))` (a shape computed from the input's) before an addmm Gemm; the
    Reshape keeps the last axis, so the smoothing folds through it into the LayerNorm."""
    weights = {"gamma": rng.normal(1, 0.2, WIDTH), "beta": rng.normal(0, 0.1, WIDTH),
               "w": rng.normal(0, 0.3, (WIDTH, 8)), "b": rng.normal(0, 0.1, 8)}  # fmt: skip
    minus_one = numpy_helper.from_array(np.array([-1], np.int64))
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], axis=-1),
        helper.make_node("Shape", ["h"], ["last"], start=-1),
        helper.make_node("Constant", [], ["minus_one"], value=minus_one),
        helper.make_node("Concat", ["minus_one", "last"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["h", "flat_shape"], ["flat"]), helper.make_node("Gemm", ["flat", "w", "b"], ["y"]),
    ]  # fmt: skip
    return _model(nodes, weights, ["y"])


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
    outliers = np.where(np.arange(WIDTH) == 3, 20.0, 1.0)  # one outlier input channel
    return {"x": (rng.normal(0, 1, (4, SEQ, WIDTH)) * outliers).astype(np.float32)}


@pytest.mark.parametrize(
    ("build", "folded_into"),
    [(shared_weight, {"LayerNormalization": 2}), (shared_norm_scale, {"LayerNormalization": 2}),
     (decomposed_layer_norm, {"Mul": 1}), (rms_norm, {"Mul": 1}), (pre_ln_heads, {"LayerNormalization": 1}),
     (conv1d_reshape, {"LayerNormalization": 1})],  # fmt: skip
)
def test_smoothing_folds_into_exporter_patterns_and_keeps_the_function(
    build: Callable[[np.random.Generator], onnx.ModelProto], folded_into: dict[str, int], tmp_path: Path
) -> None:
    rng = np.random.default_rng(0)
    model, calibration, held_out = build(rng), [_feeds(rng) for _ in range(2)], _feeds(rng)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    smoothed = smooth_model(copy, calibration, SmoothQuantSettings(alpha=0.5), tmp_path)
    assert dict(smoothed.report.folded_into) == folded_into and smoothed.report.inserted_muls == 0
    for expected, got in zip(_run(model, held_out), _run(smoothed.model, held_out), strict=True):
        assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    # smoothing changed the weights (a fold that did nothing would pass the check above)
    before = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    after = {t.name: numpy_helper.to_array(t) for t in smoothed.model.graph.initializer}
    assert any(name not in after or not np.array_equal(after[name], value) for name, value in before.items())


def test_a_reshape_that_regroups_the_last_axis_is_not_folded_through(tmp_path: Path) -> None:
    """`h.view(-1, 8)` of a 16-wide LayerNorm output puts channels 8..15 on 0..7: dividing the LayerNorm's channel j
    would not divide the Linear's input channel j, so one Mul is inserted instead, and the function is kept."""
    rng = np.random.default_rng(0)
    weights = {"gamma": rng.normal(1, 0.2, WIDTH), "beta": rng.normal(0, 0.1, WIDTH), "w": rng.normal(0, 0.3, (8, 4)),
               "halves": np.array([-1, 8])}  # fmt: skip
    model = _model([helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], axis=-1),
                    helper.make_node("Cast", ["halves"], ["halves_i"], to=TensorProto.INT64),
                    helper.make_node("Reshape", ["h", "halves_i"], ["flat"]),
                    helper.make_node("MatMul", ["flat", "w"], ["y"])],
                   weights, ["y"])  # fmt: skip
    calibration, held_out = [_feeds(rng) for _ in range(2)], _feeds(rng)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    smoothed = smooth_model(copy, calibration, SmoothQuantSettings(alpha=0.5), tmp_path)
    assert dict(smoothed.report.folded_into) == {} and smoothed.report.inserted_muls == 1
    expected, got = _run(model, held_out)[0], _run(smoothed.model, held_out)[0]
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def _gelu_ffn(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """LayerNorm -> Linear + bias -> GELU as exporters decompose it, (x * (1 + erf(x / sqrt 2))) * 0.5 -> Linear; the
    hidden activation has one outlier channel (the first Linear's column 2 x20)."""
    hidden = 2 * WIDTH
    w1 = rng.normal(0, 0.3, (WIDTH, hidden))
    w1[:, 2] *= 20.0
    weights = {"gamma": rng.normal(1, 0.2, WIDTH), "beta": rng.normal(0, 0.1, WIDTH), "w1": w1,
               "b1": rng.normal(0, 0.1, hidden), "root2": np.array(np.sqrt(2.0)), "one": np.array(1.0),
               "half": np.array(0.5), "w2": rng.normal(0, 0.3, (hidden, WIDTH))}  # fmt: skip
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], axis=-1),
        helper.make_node("MatMul", ["h", "w1"], ["m"]), helper.make_node("Add", ["m", "b1"], ["a"]),
        helper.make_node("Div", ["a", "root2"], ["scaled"]), helper.make_node("Erf", ["scaled"], ["erf"]),
        helper.make_node("Add", ["erf", "one"], ["erf_1"]), helper.make_node("Mul", ["a", "erf_1"], ["gated"]),
        helper.make_node("Mul", ["gated", "half"], ["g"]), helper.make_node("MatMul", ["g", "w2"], ["y"]),
    ]  # fmt: skip
    return _model(nodes, weights, ["y"]), weights


def _numpy_gelu_ffn(x: np.ndarray, weights: dict[str, np.ndarray]) -> np.ndarray:
    centred = x - x.mean(-1, keepdims=True)
    h = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5) * weights["gamma"] + weights["beta"]
    a = h @ weights["w1"] + weights["b1"]
    return (a * 0.5 * (1.0 + np.vectorize(math.erf)(a / math.sqrt(2.0)))) @ weights["w2"]


@pytest.mark.parametrize("activations", ["static", "dynamic"])
def test_a_gelus_scalar_half_is_not_widened_so_onnx_runtime_still_fuses_it(activations: str, tmp_path: Path) -> None:
    """Folding the second Linear's smoothing into the GELU's `* 0.5` turned the scalar into a per-channel vector, and
    ONNX Runtime no longer recognised the GELU: it ran as 5 unfused ops (MiniLM at batch 16: about 5 % more CPU time).
    The smoothing is now a Mul of its own before that Linear, and the GELU fuses."""
    rng = np.random.default_rng(0)
    model, weights = _gelu_ffn(rng)
    calibration, held_out = [_feeds(rng) for _ in range(2)], _feeds(rng)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    smoothed = smooth_model(copy, calibration, SmoothQuantSettings(alpha=0.5), tmp_path)
    assert dict(smoothed.report.folded_into) == {"LayerNormalization": 1} and smoothed.report.inserted_muls == 1
    half = next(t for t in smoothed.model.graph.initializer if t.name == "half")
    assert numpy_helper.to_array(half).size == 1
    expected = _numpy_gelu_ffn(held_out["x"].astype(np.float64), weights)
    assert np.abs(_run(smoothed.model, held_out)[0] - expected).max() <= 1e-4 * np.abs(expected).max()

    copy.CopyFrom(model)
    settings = SmoothQuantSettings(alpha=0.5, quantization=LinearQuantSettings(activations=activations))
    quantized, _ = smoothquant_int8(copy, calibration, settings, tmp_path)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    result = ort.InferenceSession(quantized.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, held_out)[0]  # fmt: skip
    optimized = Counter(node.op_type for node in onnx.load(str(tmp_path / "optimized.onnx")).graph.node)
    assert "Erf" not in optimized and optimized["BiasGelu"] + optimized["Gelu"] == 1, dict(optimized)
    assert np.abs(result - expected).max() <= 0.05 * np.abs(expected).max()
