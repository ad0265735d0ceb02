"""SmoothQuant on ONNX graphs and Linear-only INT8 Q/DQ, on tiny transformer-like blocks built here."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from qbench.recipe.spec import SmoothQuantSpec, VariantSpec
from qbench.variants import build_variant
from qbench.variants.base import BuildContext, Feeds
from qbench.variants.linear_graph import GraphView
from qbench.variants.linear_int8 import smoothquant_int8
from qbench.variants.linear_qdq import LinearQuantSettings, activation_qparams, quantize_linears, quantize_weight
from qbench.variants.smoothquant import (
    SmoothQuantSettings,
    collect_channel_ranges,
    smooth_model,
    smoothing_scales,
)

ORT_IR_VERSION = 8  # onnx 1.23 writes IR 14 by default; ORT reads up to 13

WIDTH, HIDDEN, SEQ = 32, 64, 8
OUTLIER_CHANNEL, OUTLIER_GAIN = 3, 50.0


def _model(nodes: Sequence[onnx.NodeProto], weights: dict[str, np.ndarray], opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes),
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", SEQ, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", SEQ, WIDTH])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ORT_IR_VERSION)
    onnx.checker.check_model(model)
    return model


def _norm_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    gamma = np.ones(WIDTH)
    gamma[OUTLIER_CHANNEL] = OUTLIER_GAIN  # one outlier activation channel, as transformer LayerNorms have
    return {"gamma": gamma, "beta": rng.normal(0, 0.1, WIDTH)}


def ffn_block(rng: np.random.Generator) -> onnx.ModelProto:
    """LayerNorm -> MatMul + bias -> Relu -> MatMul + bias, the LayerNorm output with one channel x50."""
    weights = {
        **_norm_weights(rng),
        "w1": rng.normal(0, WIDTH**-0.5, (WIDTH, HIDDEN)), "b1": rng.normal(0, 0.1, HIDDEN),
        "w2": rng.normal(0, HIDDEN**-0.5, (HIDDEN, WIDTH)), "b2": rng.normal(0, 0.1, WIDTH),
    }  # fmt: skip
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], name="ln", axis=-1),
        helper.make_node("MatMul", ["h", "w1"], ["a1"], name="fc1"),
        helper.make_node("Add", ["a1", "b1"], ["z1"], name="fc1_bias"),
        helper.make_node("Relu", ["z1"], ["r"], name="act"),
        helper.make_node("MatMul", ["r", "w2"], ["a2"], name="fc2"),
        helper.make_node("Add", ["a2", "b2"], ["y"], name="fc2_bias"),
    ]
    # as in trained transformers, the next weights damp the outlier channel: it dominates the
    # activation's range without dominating the result
    weights["w1"][OUTLIER_CHANNEL] /= OUTLIER_GAIN
    return _model(nodes, weights)


def attention_block(rng: np.random.Generator) -> onnx.ModelProto:
    """LayerNorm -> Q/K/V projections -> softmax(Q K^T + mask) V -> output projection (one head)."""
    weights = {**_norm_weights(rng),
               **{w: rng.normal(0, WIDTH**-0.5, (WIDTH, WIDTH)) for w in ("wq", "wk", "wv", "wo")}}  # fmt: skip
    weights["wq"] *= WIDTH**-0.5  # the 1/sqrt(d) of scaled dot-product attention
    weights["mask"] = np.where(np.arange(SEQ) < SEQ - 2, 0.0, np.finfo(np.float32).min).reshape(1, 1, SEQ)
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], name="ln", axis=-1),
        *(helper.make_node("MatMul", ["h", f"w{p}"], [p], name=f"proj_{p}") for p in "qkv"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="attention_scores"),
        helper.make_node("Add", ["scores", "mask"], ["masked"], name="attention_mask"),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["context"], name="attention_context"),
        helper.make_node("MatMul", ["context", "wo"], ["y"], name="proj_out"),
    ]
    return _model(nodes, weights)


def _batches(rng: np.random.Generator, count: int, rows: int = 8) -> list[Feeds]:
    return [{"x": rng.normal(0, 1, (rows, SEQ, WIDTH)).astype(np.float32)} for _ in range(count)]


def _run(
    model: onnx.ModelProto, feeds: Feeds, level: ort.GraphOptimizationLevel, optimized: Path | None = None
) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(["y"], feeds)[0]


def _reference(model: onnx.ModelProto, feeds: Feeds) -> np.ndarray:
    return _run(model, feeds, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)


def _simulated(model: onnx.ModelProto, feeds: Feeds) -> np.ndarray:
    """Q/DQ computed in float (no kernel fusion): the quantization math itself, the same on every CPU."""
    return _run(model, feeds, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)


def sqnr_db(reference: np.ndarray, approximation: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference**2) / np.sum((reference - approximation) ** 2)))


def relative_error(reference: np.ndarray, approximation: np.ndarray) -> float:
    """Largest absolute difference over the largest absolute reference value."""
    return float(np.abs(approximation - reference).max() / np.abs(reference).max())


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _op_counts(model: onnx.ModelProto) -> Counter[str]:
    return Counter(node.op_type for node in model.graph.node)


STATIC = LinearQuantSettings(activations="static", per_channel=True)


def _plain_int8(model: onnx.ModelProto, calibration: list[Feeds], tmp: Path) -> onnx.ModelProto:
    """The same Linear-only INT8 Q/DQ without smoothing: per-tensor static activations straight from calibration."""
    view = GraphView(_copy(model))
    linears = view.linears()
    channels = collect_channel_ranges(view.model, [linear.node.input[0] for linear in linears], calibration, tmp)
    ranges = {name: (float(c.low.min()), float(c.high.max())) for name, c in channels.items()}
    quantize_linears(view, linears, ranges, STATIC)
    return view.commit()


# -- the arithmetic ----------------------------------------------------------------------------


def test_smoothing_scales_follow_the_formula_and_stay_finite() -> None:
    scales = smoothing_scales(np.array([4.0, 1.0, 0.0, 9.0]), np.array([1.0, 4.0, 2.0, 0.0]), alpha=0.5)
    # sqrt(4)/sqrt(1) = 2, sqrt(1)/sqrt(4) = 0.5, dead channels keep 1
    np.testing.assert_allclose(scales, [2.0, 0.5, 1.0, 1.0])
    np.testing.assert_allclose(smoothing_scales(np.array([8.0]), np.array([2.0]), alpha=0.75), [8**0.75 / 2**0.25])
    assert smoothing_scales(np.array([1e30]), np.array([1e-30]), alpha=1.0)[0] == 1e5


def test_activation_and_weight_quantization_parameters() -> None:
    assert activation_qparams(-1.0, 3.0, "uint8", symmetric=False) == pytest.approx((4.0 / 255, 64))
    assert activation_qparams(0.5, 2.54, "int8", symmetric=True) == pytest.approx((0.02, 0))
    assert activation_qparams(-1.27, 0.2, "uint8", symmetric=True) == pytest.approx((0.01, 128))
    weight = np.array([[1.0, -0.5], [-2.54, 0.25]], dtype=np.float32)
    quantized, scale = quantize_weight(weight, output_axis=1, per_channel=True, qmax=127)
    np.testing.assert_allclose(scale, [0.02, 0.5 / 127], rtol=1e-6)
    np.testing.assert_array_equal(quantized, [[50, -127], [-127, 64]])
    _, per_tensor = quantize_weight(weight, output_axis=1, per_channel=False, qmax=63)
    assert float(per_tensor) == pytest.approx(2.54 / 63)


# -- smoothing keeps the function and folds where the graph allows -----------------------------


def test_smoothing_folds_into_layernorm_and_linear_and_keeps_the_function(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    model, calibration, held_out = ffn_block(rng), _batches(rng, 4), _batches(rng, 1, rows=16)[0]
    smoothed = smooth_model(_copy(model), calibration, SmoothQuantSettings(alpha=0.5), tmp_path)

    report = smoothed.report
    assert report.groups == 2 and report.inserted_muls == 0
    # fc1's input folds into the LayerNorm, fc2's through Relu and the bias Add into fc1's weight columns
    assert dict(report.folded_into) == {"LayerNormalization": 1, "MatMul": 1}
    assert _op_counts(smoothed.model) == _op_counts(model)
    error = relative_error(_reference(model, held_out), _reference(smoothed.model, held_out))
    print(f"FFN block: max |smoothed - fp32| / max |fp32| = {error:.1e}")
    assert error < 1e-5
    gamma = numpy_helper.to_array(next(t for t in smoothed.model.graph.initializer if t.name == "gamma"))
    assert gamma[OUTLIER_CHANNEL] < OUTLIER_GAIN / 2  # the outlier moved into fc1's weights


def test_qkv_share_one_smoothing_vector_and_unfoldable_inputs_get_one_mul(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    model, calibration, held_out = attention_block(rng), _batches(rng, 3), _batches(rng, 1)[0]
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    ln_out = collect_channel_ranges(model, ["h"], calibration, tmp_path)["h"]
    smoothed = smooth_model(_copy(model), calibration, SmoothQuantSettings(alpha=0.5), tmp_path)

    shared_max = np.max([np.abs(weights[w]).max(axis=1) for w in ("wq", "wk", "wv")], axis=0)
    expected_scales = smoothing_scales(ln_out.absmax, shared_max, 0.5)
    new = {t.name: numpy_helper.to_array(t) for t in smoothed.model.graph.initializer}
    for w in ("wq", "wk", "wv"):  # every projection's rows were multiplied by the same vector
        np.testing.assert_allclose(new[w] / weights[w], np.repeat(expected_scales[:, None], WIDTH, 1), rtol=1e-5)
    np.testing.assert_allclose(new["gamma"], weights["gamma"] / expected_scales, rtol=1e-6)
    # the context comes from a MatMul of two computed tensors: nothing to fold into, so one Mul
    assert dict(smoothed.report.folded_into) == {"LayerNormalization": 1} and smoothed.report.inserted_muls == 1
    assert _op_counts(smoothed.model)["Mul"] == 1
    error = relative_error(_reference(model, held_out), _reference(smoothed.model, held_out))
    print(f"attention block: max |smoothed - fp32| / max |fp32| = {error:.1e}")
    assert error < 1e-5

    skipped = smooth_model(_copy(model), calibration, SmoothQuantSettings(unfoldable="skip"), tmp_path)
    assert skipped.report.inserted_muls == 0 and skipped.report.skipped_groups == 1
    assert "Mul" not in _op_counts(skipped.model)


def test_a_tensor_with_a_non_linear_reader_is_not_folded(tmp_path: Path) -> None:
    """A residual reads the LayerNorm output too: scaling the LayerNorm would change it, so a Mul is inserted."""
    rng = np.random.default_rng(2)
    model = ffn_block(rng)
    model.graph.node[-1].input[1] = "h"  # y = fc2(...) + h: the residual reads h
    model.graph.node[-1].input[0], model.graph.node[-2].output[0] = "a2", "a2"
    rng_data = np.random.default_rng(3)
    calibration, held_out = _batches(rng_data, 2), _batches(rng_data, 1)[0]
    smoothed = smooth_model(_copy(model), calibration, SmoothQuantSettings(), tmp_path)
    assert smoothed.report.inserted_muls == 1 and dict(smoothed.report.folded_into) == {"MatMul": 1}
    assert relative_error(_reference(model, held_out), _reference(smoothed.model, held_out)) < 1e-5


def test_an_excluded_linear_keeps_its_weight_and_reads_the_unsmoothed_tensor(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    model, calibration, held_out = attention_block(rng), _batches(rng, 2), _batches(rng, 1)[0]
    settings = SmoothQuantSettings(exclude_nodes=("proj_k",))
    smoothed = smooth_model(_copy(model), calibration, settings, tmp_path)
    # proj_k still reads the LayerNorm output, so the LayerNorm cannot fold: Q/V get a Mul
    assert smoothed.report.inserted_muls == 2 and not smoothed.report.folded_into
    nodes = {node.name: node for node in smoothed.model.graph.node}
    assert nodes["proj_k"].input[:] == ["h", "wk"] and nodes["proj_q"].input[0] != "h"
    original = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    new = {t.name: numpy_helper.to_array(t) for t in smoothed.model.graph.initializer}
    np.testing.assert_array_equal(new["wk"], original["wk"])
    np.testing.assert_array_equal(new["gamma"], original["gamma"])
    assert relative_error(_reference(model, held_out), _reference(smoothed.model, held_out)) < 1e-5
    settings = SmoothQuantSettings(quantization=STATIC, exclude_nodes=("proj_k",))
    quantized, params = smoothquant_int8(_copy(model), calibration, settings, tmp_path)
    assert params["quantized_linears"] == 3
    assert [n.op_type for n in quantized.graph.node if n.name == "proj_k"] == ["MatMul"]
    assert next(n for n in quantized.graph.node if n.name == "proj_k").input[:] == ["h", "wk"]


def _tied_loop_block(rng: np.random.Generator) -> onnx.ModelProto:
    """LayerNorm -> fc (w) plus a Loop whose body reads the same `w` and `gamma` by name (tied weights, as a
    scripted recurrence exports them): y = fc(LN(x)) + loop(x), the body s -> tanh((s * gamma) @ w), twice."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["s_in", "gamma"], ["scaled"]), helper.make_node("MatMul", ["scaled", "w"], ["mm"]),
         helper.make_node("Tanh", ["mm"], ["s_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_out", TensorProto.FLOAT, None)],
    )  # fmt: skip
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], name="ln", axis=-1),
        helper.make_node("MatMul", ["h", "w"], ["a"], name="fc"),
        helper.make_node("Constant", [], ["trip"], value=numpy_helper.from_array(np.array(2, np.int64))),
        helper.make_node("Loop", ["trip", "", "x"], ["s"], name="loop", body=body),
        helper.make_node("Add", ["a", "s"], ["y"], name="sum"),
    ]
    weights = {**_norm_weights(rng), "w": rng.normal(0, WIDTH**-0.5, (WIDTH, WIDTH))}
    weights["w"][OUTLIER_CHANNEL] /= OUTLIER_GAIN
    return _model(nodes, weights)


def test_a_weight_and_a_norm_scale_a_subgraph_reads_are_copied_before_smoothing(tmp_path: Path) -> None:
    """Smoothing scales fc's weight rows and folds the inverse into the LayerNorm's gamma: the Loop body reads both
    by name, so changing them in place made the body compute with scaled weights (a wrong model, not rounding)."""
    rng = np.random.default_rng(11)
    model, calibration, held_out = _tied_loop_block(rng), _batches(rng, 2), _batches(rng, 1)[0]
    smoothed = smooth_model(_copy(model), calibration, SmoothQuantSettings(alpha=0.5), tmp_path)
    assert dict(smoothed.report.folded_into) == {"LayerNormalization": 1}
    original = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    new = {t.name: numpy_helper.to_array(t) for t in smoothed.model.graph.initializer}
    np.testing.assert_array_equal(new["w"], original["w"])  # what the body reads is untouched
    np.testing.assert_array_equal(new["gamma"], original["gamma"])
    nodes = {node.name: node for node in smoothed.model.graph.node}
    assert nodes["fc"].input[1] != "w" and nodes["ln"].input[1] != "gamma"  # the main graph reads smoothed copies
    assert relative_error(_reference(model, held_out), _reference(smoothed.model, held_out)) < 1e-5


def test_a_linear_reading_a_graph_input_is_calibrated_from_the_feeds(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    weight = rng.normal(0, 1, (WIDTH, WIDTH))
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], {"w": weight})
    calibration = _batches(rng, 2)
    calibration[0]["x"][0, 0, OUTLIER_CHANNEL] = -40.0
    smoothed = smooth_model(_copy(model), calibration, SmoothQuantSettings(), tmp_path)
    assert smoothed.report.inserted_muls == 1  # no producer to fold into
    factor = next(numpy_helper.to_array(t) for t in smoothed.model.graph.initializer if t.name.endswith("_smoothing"))
    absmax = np.max([np.abs(b["x"]).max(axis=(0, 1)) for b in calibration], axis=0)
    np.testing.assert_allclose(1 / factor, smoothing_scales(absmax, np.abs(weight).max(axis=1), 0.5), rtol=1e-5)
    low, high = smoothed.input_ranges[smoothed.model.graph.node[0].output[0]]
    assert low == pytest.approx(min(float((b["x"] * factor).min()) for b in calibration), rel=1e-5)
    assert high == pytest.approx(max(float((b["x"] * factor).max()) for b in calibration), rel=1e-5)


# -- quantization: accuracy, rules, and what ORT fuses -----------------------------------------


def test_smoothquant_recovers_what_plain_per_tensor_int8_loses(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    model, calibration, held_out = ffn_block(rng), _batches(rng, 4), _batches(rng, 1, rows=32)[0]
    reference = _reference(model, held_out)
    plain = sqnr_db(reference, _simulated(_plain_int8(model, calibration, tmp_path), held_out))
    smoothed_model, _ = smoothquant_int8(_copy(model), calibration, SmoothQuantSettings(0.5, quantization=STATIC),
                                         tmp_path)  # fmt: skip
    smoothed = sqnr_db(reference, _simulated(smoothed_model, held_out))
    print(f"SQNR vs FP32: plain per-tensor static INT8 {plain:.1f} dB, SmoothQuant alpha 0.5 {smoothed:.1f} dB")
    assert plain < 20.0  # the x50 channel sets the per-tensor scale: the other channels round to a few levels
    assert smoothed > plain + 10.0

    auto_model, params = smoothquant_int8(_copy(model), calibration, SmoothQuantSettings("auto", quantization=STATIC),
                                          tmp_path)  # fmt: skip
    auto = sqnr_db(reference, _simulated(auto_model, held_out))
    print(f"SQNR vs FP32 with alpha auto {auto:.1f} dB, alphas chosen per input {params['alphas_chosen']}")
    # auto judges alphas on held-back calibration rows; with 256 token rows it may pick a higher alpha
    # than the best fixed one (MiniLM, 16k rows: auto matched the best fixed alpha, see the bench)
    assert sum(params["alphas_chosen"].values()) == 2 and params["alphas_chosen"].get("none", 0) < 2
    assert auto > plain + 10.0


def test_alpha_auto_leaves_an_input_unsmoothed_when_smoothing_would_hurt(tmp_path: Path) -> None:
    """Even activations and one large weight row: any alpha would shrink that channel's weights by
    enlarging its activations, creating the outlier SmoothQuant exists to remove."""
    rng = np.random.default_rng(8)
    weight = rng.normal(0, 1, (WIDTH, WIDTH))
    weight[OUTLIER_CHANNEL] *= OUTLIER_GAIN
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], {"w": weight})
    calibration = _batches(rng, 4)
    smoothed = smooth_model(_copy(model), calibration, SmoothQuantSettings("auto", quantization=STATIC), tmp_path)
    assert dict(smoothed.report.alphas) == {"none": 1}
    assert smoothed.report.inserted_muls == 0 and _op_counts(smoothed.model) == _op_counts(model)


def _outlier_rows(rng: np.random.Generator, rows: int) -> np.ndarray:
    x = rng.normal(size=(rows, WIDTH))
    x[:, OUTLIER_CHANNEL] *= OUTLIER_GAIN
    return x.astype(np.float32)


def test_alpha_auto_smooths_with_calibration_batches_of_one_row(tmp_path: Path) -> None:
    """A model exported with a fixed batch of 1 is calibrated one row per batch: rows were held back inside each batch,
    so none were, every alpha scored 0 and auto chose no smoothing. Whole batches are held back now: batches of one
    row choose as batches of 16 do."""
    rng = np.random.default_rng(5)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], "fc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])],
        [numpy_helper.from_array(rng.normal(0, WIDTH**-0.5, (WIDTH, WIDTH)).astype(np.float32), "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ORT_IR_VERSION)
    rows = _outlier_rows(rng, 64)
    chosen = {}
    for size in (16, 1):
        batches = [{"x": rows[i : i + size]} for i in range(0, len(rows), size)]
        smoothed = smooth_model(_copy(model), batches, SmoothQuantSettings("auto", quantization=STATIC), tmp_path)
        chosen[size] = dict(smoothed.report.alphas)
        assert smoothed.report.groups == 1 and "alpha_judged_on_fit_rows" not in smoothed.report.params()
    print(chosen)
    assert "none" not in chosen[1] and chosen[1] == chosen[16], chosen
    # one calibration row in all: nothing can be held back; auto judges on that row and says so
    alone = smooth_model(_copy(model), [{"x": rows[:1]}], SmoothQuantSettings("auto", quantization=STATIC), tmp_path)
    assert alone.report.params()["alpha_judged_on_fit_rows"] == 1


@pytest.mark.parametrize("activations", ["static", "dynamic"])
def test_only_linears_are_quantized_and_ort_fuses_them(tmp_path: Path, activations: str) -> None:
    rng = np.random.default_rng(4)
    model, calibration, held_out = attention_block(rng), _batches(rng, 3), _batches(rng, 1)[0]
    settings = SmoothQuantSettings(quantization=LinearQuantSettings(activations=activations, reduce_range=True))
    quantized, params = smoothquant_int8(_copy(model), calibration, settings, tmp_path)
    onnx.checker.check_model(quantized)
    assert params["quantized_linears"] == 4 and params["quantized_inputs"] == 2 and params["float_matmuls"] == 2
    # by rule: the two attention MatMuls, the mask Add and Softmax read no quantized tensor
    produced_by = {out: node.op_type for node in quantized.graph.node for out in node.output}
    for node in quantized.graph.node:
        if node.name in ("attention_scores", "attention_context", "attention_mask") or node.op_type == "Softmax":
            assert all(produced_by.get(i) not in ("DequantizeLinear", "MatMulInteger") for i in node.input), node.name

    optimized_path = tmp_path / "optimized.onnx"
    result = _run(quantized, held_out, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, optimized_path)
    optimized = _op_counts(onnx.load(str(optimized_path)))
    print(f"{activations}: ORT's optimized graph runs {dict(sorted(optimized.items()))}")
    fused = "MatMulIntegerToFloat" if activations == "static" else "DynamicQuantizeMatMul"
    assert optimized[fused] + optimized["MatMulIntegerToFloat"] >= 4 and optimized[fused] >= 1
    # attention stays float (ORT folds the K transpose into a FusedMatMul)
    assert optimized["MatMul"] + optimized["FusedMatMul"] == 2 and optimized["Softmax"] == 1
    assert "DequantizeLinear" not in optimized and "MatMulInteger" not in optimized
    cosine = float(np.sum(result * (expected := _reference(model, held_out))) / np.linalg.norm(result) / np.linalg.norm(expected))
    print(f"{activations}: cosine vs FP32 with ORT's fused kernels {cosine:.5f}")
    assert cosine > 0.99


@pytest.mark.parametrize("activations", ["static", "dynamic"])
@pytest.mark.parametrize("form", ["gemm", "gemm-transB", "matmul+add"])
def test_2d_linears_with_bias_become_fused_integer_kernels(tmp_path: Path, activations: str, form: str) -> None:
    """On 2-D inputs ORT turns MatMul + Add into Gemm, and fuses a dequantized Gemm only with an int32 bias."""
    rng = np.random.default_rng(9)
    weight = rng.normal(0, 1, (HIDDEN, WIDTH) if form == "gemm-transB" else (WIDTH, HIDDEN))
    linear = [helper.make_node("MatMul", ["r", "w"], ["m"]), helper.make_node("Add", ["m", "c"], ["y"])]
    if form != "matmul+add":
        linear = [helper.make_node("Gemm", ["r", "w", "c"], ["y"], transB=int(form == "gemm-transB"), alpha=0.5,
                                   beta=2.0)]  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), *linear], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", HIDDEN])],
        initializer=[numpy_helper.from_array(weight.astype(np.float32), "w"),
                     numpy_helper.from_array(rng.normal(0, 1, HIDDEN).astype(np.float32), "c")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ORT_IR_VERSION)
    calibration = [{"x": rng.normal(0, 1, (64, WIDTH)).astype(np.float32)} for _ in range(2)]
    held_out = {"x": rng.normal(0, 1, (64, WIDTH)).astype(np.float32)}
    settings = SmoothQuantSettings(quantization=LinearQuantSettings(activations=activations))
    quantized, params = smoothquant_int8(_copy(model), calibration, settings, tmp_path)
    assert params["quantized_linears"] == 1
    optimized_path = tmp_path / "optimized.onnx"
    result = _run(quantized, held_out, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, optimized_path)
    optimized = _op_counts(onnx.load(str(optimized_path)))
    fused = "QGemm" if activations == "static" else "DynamicQuantizeMatMul"
    assert optimized[fused] == 1 and "Gemm" not in optimized and "DequantizeLinear" not in optimized, optimized
    quality = sqnr_db(_reference(model, held_out), result)
    print(f"{form} {activations}: {dict(sorted(optimized.items()))}, SQNR {quality:.1f} dB")
    assert quality > 30.0


# -- the recipe field and the registry ---------------------------------------------------------


def test_recipe_smoothquant_section_is_checked_at_load_time() -> None:
    spec = VariantSpec(name="sq", precision="int8", calibrator="minmax", smoothquant={"alpha": 0.7})
    assert spec.smoothquant == SmoothQuantSpec(alpha=0.7, unfoldable="mul")
    with pytest.raises(ValidationError, match="expected one of dynamic, minmax"):
        VariantSpec(name="sq", precision="int8", calibrator="entropy", smoothquant={})
    with pytest.raises(ValidationError, match="op_types: does not apply to SmoothQuant"):
        VariantSpec(name="sq", precision="int8", calibrator="minmax", op_types=["MatMul"], smoothquant={})
    with pytest.raises(ValidationError, match="smoothquant: applies only to int8/fp8"):
        VariantSpec(name="sq", precision="fp16", smoothquant={})
    with pytest.raises(ValidationError, match="smoothquant: does not apply to fp8"):
        VariantSpec(name="sq", precision="fp8", calibrator="minmax", smoothquant={})
    assert VariantSpec(name="sq", precision="int8", calibrator="minmax", smoothquant={"alpha": "auto"}).smoothquant.alpha == "auto"
    for wrong in (1.5, "0.5", "autoo", True):
        with pytest.raises(ValidationError, match="expected a number from 0 to 1, or 'auto'"):
            VariantSpec(name="sq", precision="int8", calibrator="minmax", smoothquant={"alpha": wrong})


def test_built_through_the_registry_with_per_channel_by_default(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    model_path = tmp_path / "ffn.onnx"
    onnx.save(ffn_block(rng), str(model_path))
    ctx = BuildContext(reference_path=model_path, workdir=tmp_path / "out", calibration=_batches(rng, 2))
    spec = VariantSpec(name="int8-sq", precision="int8", calibrator="dynamic", smoothquant={"alpha": 0.6})
    built = build_variant(spec, ctx)
    assert built.onnx_path.is_file() and built.precision == "int8"
    assert built.params["technique"] == "smoothquant" and built.params["alpha"] == 0.6
    assert built.params["per_channel"] is True and built.params["activations"] == "dynamic"
    assert built.params["quantized_linears"] == 2
    assert _op_counts(onnx.load(str(built.onnx_path)))["MatMulInteger"] == 2
