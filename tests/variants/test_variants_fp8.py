"""FP8 E4M3 as standard Q/DQ: accuracy on a trained CNN, graph shape, scales, exclusions."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

from qbench.recipe.spec import VariantSpec
from qbench.variants.base import BuildContext
from qbench.variants.fp8 import FP8_MAX, NOTE, build_fp8, fp8_weight
from qbench.variants.onnx_utils import custom_domains


def _top1(path, images: np.ndarray, basic: bool = False) -> np.ndarray:
    options = ort.SessionOptions()
    if basic:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"image": images})[0].argmax(axis=1)


@pytest.mark.parametrize("per_channel", [False, True])
def test_fp8_agrees_with_fp32_on_the_digits_cnn(digits_cnn, tmp_path, per_channel):
    spec = VariantSpec(name="fp8", precision="fp8", calibrator="minmax", per_channel=per_channel)
    built = build_fp8(spec, digits_cnn.context(tmp_path))
    assert built.session_hints == {}
    reference = _top1(digits_cnn.path, digits_cnn.held_out)
    at_default = _top1(built.onnx_path, digits_cnn.held_out)
    agreement = float(np.mean(at_default == reference))
    print(f"fp8 per_channel={per_channel}: top-1 agreement with FP32 {agreement:.4f} on {len(reference)} held-out rows")
    assert agreement >= 0.99
    # ORT's default level once removed Relus before float8 QuantizeLinear nodes: the saved model must not depend on it
    np.testing.assert_array_equal(at_default, _top1(built.onnx_path, digits_cnn.held_out, basic=True))
    assert built.params["quantized_op_types"] == {"Conv": 3, "Gemm": 1}


def test_fp8_model_is_standard_onnx_with_float8_weights(digits_cnn, tmp_path):
    built = build_fp8(VariantSpec(name="fp8", precision="fp8", calibrator="percentile"), digits_cnn.context(tmp_path))
    model = onnx.load(str(built.onnx_path))
    onnx.checker.check_model(model, full_check=True)
    assert custom_domains(model) == set()
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 19
    assert built.params["opset"] >= 19
    float8 = [t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT8E4M3FN and t.dims]
    assert len(float8) == 4  # three conv kernels and the linear layer
    float_weights = [t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT and len(t.dims) >= 2]
    assert float_weights == [], "weights of quantized nodes are stored as float8 only"
    conv_biases = [n.input[2] for n in model.graph.node if n.op_type == "Conv"]
    initializers = {t.name: t for t in model.graph.initializer}
    assert all(initializers[b].data_type == TensorProto.FLOAT for b in conv_biases), "biases stay float"
    assert built.params["quantized_activations"] == 4 and built.params["quantized_weights"] == 4
    assert NOTE in built.notes
    assert (built.params["percentile"], built.params["num_bins"]) == (99.999, 2048)


def test_fp8_weight_scales_are_amax_over_448_per_channel():
    rng = np.random.default_rng(0)
    channel_scales = np.array([1, 10, 0.1, 0], dtype=np.float32)[:, None, None, None]
    weight = rng.normal(size=(4, 3, 3, 3)).astype(np.float32) * channel_scales
    values, scale = fp8_weight(weight, axis=0)
    assert values.dtype == ml_dtypes.float8_e4m3fn and scale.shape == (4,)
    amax = np.abs(weight).reshape(4, -1).max(axis=1)
    np.testing.assert_allclose(scale[:3], amax[:3] / FP8_MAX, rtol=1e-6)
    assert scale[3] > 0, "an all-zero channel still gets a valid scale"
    restored = values.astype(np.float32) * scale[:, None, None, None]
    assert np.all(restored[3] == 0)
    # E4M3 keeps 3 mantissa bits: relative error of a normal number is at most 2**-4.
    big = np.abs(weight) > amax[:, None, None, None] * 2**-6
    assert np.all(np.abs(restored - weight)[big] <= np.abs(weight)[big] * 2**-4 + 1e-7)
    _, per_tensor = fp8_weight(weight, axis=None)
    assert per_tensor.shape == () and per_tensor == pytest.approx(np.abs(weight).max() / FP8_MAX)


def test_fp8_per_channel_dequantize_uses_the_output_channel_axis(mlp, tmp_path):
    spec = VariantSpec(name="fp8", precision="fp8", calibrator="minmax", per_channel=True)
    built = build_fp8(spec, mlp.context(tmp_path))
    model = onnx.load(str(built.onnx_path))
    assert (built.params["opset_original"], built.params["opset"]) == (17, 21), "the opset-17 graph was upgraded"
    (node,) = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "w1_fp8"]
    assert [a.i for a in node.attribute if a.name == "axis"] == [1]
    scale = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == node.input[1]))
    assert scale.shape == (16,)  # w1 is [8, 16]: one scale per output column


def test_fp8_excluded_nodes_are_untouched(mlp, run, tmp_path):
    spec = VariantSpec(name="fp8", precision="fp8", calibrator="minmax", exclude_nodes=["mm2"])
    built = build_fp8(spec, mlp.context(tmp_path))
    model = onnx.load(str(built.onnx_path))
    mm2 = next(n for n in model.graph.node if n.name == "mm2")
    assert list(mm2.input) == ["r", "w2"]
    assert next(t for t in model.graph.initializer if t.name == "w2").data_type == TensorProto.FLOAT
    assert built.params["quantized_op_types"] == {"MatMul": 1}
    assert run(built, mlp.held_out).shape == (64, 4)


def test_fp8_leaves_the_cwd_clean(mlp, tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    spec = VariantSpec(name="fp8", precision="fp8", calibrator="entropy", op_types=["MatMul"])
    built = build_fp8(spec, mlp.context(tmp_path / "work"))
    assert built.params["num_quantized_bins"] == 128
    assert os.listdir(cwd) == []
    assert sorted(os.listdir(tmp_path / "work")) == ["fp8.calibration.json", "fp8.onnx"]


def test_fp8_exposes_symmetric_ranges_at_448_times_its_scales(mlp, tmp_path):
    built = build_fp8(VariantSpec(name="fp8-ranges", precision="fp8", calibrator="minmax"), mlp.context(tmp_path))
    x = np.concatenate([batch["x"] for batch in mlp.calibration])
    amax = float(np.abs(x).max())
    assert built.activation_ranges["x"] == pytest.approx((-amax, amax), rel=1e-6)
    model = onnx.load(str(built.onnx_path))
    scale = next(t for t in model.graph.initializer if t.name == "x_fp8_scale")
    assert 448.0 * float(onnx.numpy_helper.to_array(scale)) == pytest.approx(amax, rel=1e-6)


def _fp8(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Independent reference: E4M3FN quantize (saturating, round to nearest even) and dequantize with `scale`."""
    return np.clip(values / scale, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale


@pytest.mark.parametrize("calibrator", ["entropy", "percentile"])
def test_fp8_weights_behind_constant_ops_are_quantized_as_weights(graph, tmp_path, calibrator):
    """A weight reached through a Transpose of an initializer, or held by a Constant node, was quantized as an
    activation: per tensor despite per_channel, stored in float32, with the calibrator's clipping range (entropy cut
    the heavy-tailed weight: max error 23 vs 1.3 for its true FP8 form)."""
    rng = np.random.default_rng(3)
    w1 = rng.standard_t(3, size=(16, 8)).astype(np.float32)  # [N, K]: read through a Transpose
    w2 = rng.standard_t(3, size=(16, 4)).astype(np.float32)
    nodes = [
        onnx.helper.make_node("Transpose", ["w1t"], ["w1"], perm=[1, 0], name="transpose"),
        onnx.helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        onnx.helper.make_node("Constant", [], ["w2"], value=numpy_helper.from_array(w2), name="const"),
        onnx.helper.make_node("MatMul", ["h", "w2"], ["y"], name="mm2"),
    ]
    path = graph(tmp_path / "m.onnx", nodes, {"w1t": w1}, {"x": 8}, {"y": 4})
    calibration = [{"x": rng.normal(size=(32, 8)).astype(np.float32)} for _ in range(4)]
    ctx = BuildContext(reference_path=path, workdir=tmp_path, calibration=calibration)
    spec = VariantSpec(name="fp8", precision="fp8", calibrator=calibrator, per_channel=True)
    built = build_fp8(spec, ctx)
    model = onnx.load(str(built.onnx_path))
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    x = rng.normal(size=(64, 8)).astype(np.float32)
    x_scale, h_scale = stored["x_fp8_scale"], stored["h_fp8_scale"]  # the calibrator's (activation) ranges
    w1_ref = _fp8(w1.T, (np.abs(w1.T).max(axis=0) / FP8_MAX).astype(np.float32))
    w2_ref = _fp8(w2, (np.abs(w2).max(axis=0) / FP8_MAX).astype(np.float32))
    h = (_fp8(x, x_scale).astype(np.float64) @ w1_ref).astype(np.float32)
    expected = (_fp8(h, h_scale).astype(np.float64) @ w2_ref).astype(np.float32)
    got = ort.InferenceSession(str(built.onnx_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * float(np.abs(expected).max()))
    assert built.params["folded_weights"] == ["w1", "w2"]
    assert built.params["quantized_weights"] == 2 and built.params["quantized_activations"] == 2
    assert not [n for n in model.graph.node if n.op_type in ("Transpose", "Constant")]
    assert stored["w1_fp8"].dtype == ml_dtypes.float8_e4m3fn and stored["w1_fp8_scale"].shape == (16,)


def test_fp8_scales_never_underflow_to_zero():
    """A channel whose amax / 448 is below float32's normal range got scale 0, so its zeros became 0 / 0 = NaN and
    every output NaN; a real engine gives that channel ~0. It now rounds to zeros, and the other channels are
    untouched."""
    weight = np.array([[0.0, 1e-44, 3e-39], [1.0, -2.0, 0.5]], dtype=np.float32).T  # [K=3, N=2]
    values, scale = fp8_weight(weight, axis=1)
    restored = values.astype(np.float32) * scale
    assert np.all(np.isfinite(scale)) and np.all(scale > 0)
    np.testing.assert_array_equal(restored[:, 0], 0.0)
    np.testing.assert_array_equal(restored[:, 1], _fp8(weight[:, 1], np.float32(2.0 / FP8_MAX)))


def _attention_graph(graph, path):
    """x[n, 8] -> q, k, v (MatMul by weights) -> scores = q @ k^T -> Softmax -> context = p @ v -> y = context @ wo."""
    rng = np.random.default_rng(5)
    helper = onnx.helper
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v_proj"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0], name="k_t"),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "v"], ["c"], name="context"),
        helper.make_node("MatMul", ["c", "wo"], ["y"], name="out_proj"),
    ]
    weights = {name: rng.normal(scale=0.3, size=(8, 8)).astype(np.float32) for name in ("wq", "wk", "wv")}
    weights["wo"] = rng.normal(scale=0.3, size=(8, 4)).astype(np.float32)
    return graph(path, nodes, weights, {"x": 8}, {"y": 4}), [{"x": rng.normal(size=(6, 8)).astype(np.float32)}] * 2


@pytest.mark.parametrize("keep_float", [None, ["attention_matmuls"]])
def test_fp8_says_when_attention_products_read_e4m3_on_both_sides(graph, tmp_path, keep_float):
    """The FP8 build quantized Q x K^T and probabilities x V (both inputs computed) with no word of it, where an FP8
    Linear recipe (qbench's own torch form, torchao float8 on nn.Linear) keeps them in higher precision: the params
    name them and a note says so; with keep_float: [attention_matmuls] they are float and nothing is said."""
    path, calibration = _attention_graph(graph, tmp_path / "attention.onnx")
    options = {} if keep_float is None else {"keep_float": keep_float}
    spec = VariantSpec(name="fp8", precision="fp8", calibrator="minmax", **options)
    built = build_fp8(spec, BuildContext(reference_path=path, workdir=tmp_path, calibration=calibration))
    model = onnx.load(str(built.onnx_path))
    dequantized = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    reads = {n.name: [name in dequantized for name in n.input] for n in model.graph.node if n.op_type == "MatMul"}
    notes = [note for note in built.notes if "Q x K^T" in note]
    if keep_float is None:
        assert reads["scores"] == reads["context"] == [True, True]
        assert built.params["quantized_attention_matmuls"] == ["scores", "context"]
        assert len(notes) == 1 and notes[0].startswith("2 MatMul/Gemm") and "keep_float: [masks, attention_matmuls]" in notes[0]
    else:
        assert reads["scores"] == reads["context"] == [False, False]
        assert built.params["quantized_attention_matmuls"] == [] and notes == []
    assert reads["q_proj"] == reads["out_proj"] == [True, True]  # the Linear layers are quantized either way


def test_fp8_graph_computes_what_fp8_hardware_computes(graph, tmp_path):
    """An ml_dtypes reference of an FP8 GEMM (E4M3 inputs and weights, round to nearest even, saturating at 448,
    E4M3 subnormals kept, products summed in float32) against the built graph on ONNX Runtime at its default level.
    Scales are powers of two and the first layer's sums exact in float32 (checked), so its quantized output must match
    code for code whatever order ONNX Runtime sums in: rows on every rounding midpoint (ties go to the even code), rows
    in E4M3's subnormal range (ties there too), rows past the calibrated range and +-inf (saturation)."""
    grid = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    grid = np.unique(grid[np.isfinite(grid)])
    choices = grid[((np.abs(grid) >= 0.25) & (np.abs(grid) <= 2)) | (grid == 0)]
    w1 = np.random.default_rng(7).choice(choices, size=(8, 16)).astype(np.float32) / 32
    w1[0, 0] = 14.0  # weight amax 448 / 32: weight scale 1 / 32
    w2 = np.random.default_rng(8).normal(size=(16, 4)).astype(np.float32)
    nodes = [
        onnx.helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        onnx.helper.make_node("Relu", ["h"], ["r"], name="relu"),
        onnx.helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    path = graph(tmp_path / "m.onnx", nodes, {"w1": w1, "w2": w2}, {"x": 8}, {"y": 4})
    x_scale = np.float32(1 / 16)  # calibration amax 28 = 448 / 16
    calibration = np.random.default_rng(9).uniform(-27, 27, size=(32, 8)).astype(np.float32)
    calibration[0, 0] = 28.0
    built = build_fp8(VariantSpec(name="fp8", precision="fp8", calibrator="minmax"),
                      BuildContext(reference_path=path, workdir=tmp_path,
                                   calibration=[{"x": calibration}]))  # fmt: skip
    stored = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(built.onnx_path)).graph.initializer}
    assert (stored["x_fp8_scale"], stored["w1_fp8_scale"]) == (x_scale, np.float32(1 / 32))
    midpoints = ((grid[:-1] + grid[1:]) / 2)[(grid[:-1] >= 2**-6) & (grid[1:] <= FP8_MAX)]  # normal codes, ascending
    subnormal = np.concatenate([np.linspace(-2e-2, 2e-2, 28),
                                (grid[:-1] + grid[1:])[(grid[:-1] >= 0) & (grid[1:] <= 2**-6)] / 2])  # fmt: skip
    rows = [
        np.resize(midpoints, (len(midpoints) // 8, 8)) * x_scale,  # each row 8 neighbouring ties
        np.resize(subnormal, (5, 8)).astype(np.float32) * x_scale,  # E4M3 subnormals (below 2^-6) and their ties
        np.random.default_rng(10).uniform(-4000, 4000, size=(8, 8)).astype(np.float32),  # past 448 x scale
        np.array([[np.inf, -np.inf, 1e30, -1e30, 0.0, -0.0, 500.0, -1000.0]], np.float32) * x_scale,
    ]
    x = np.concatenate(rows).astype(np.float32)

    def e4m3(values, scale):  # hardware's conversion, then the value the tensor core multiplies
        return np.clip(values / scale, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale

    w2_scale = stored["w2_fp8_scale"]
    h64 = np.maximum(e4m3(x, x_scale).astype(np.float64) @ e4m3(w1, np.float32(1 / 32)), 0)
    h = h64.astype(np.float32)
    np.testing.assert_array_equal(h, h64)  # the premise: float32 holds every sum exactly, in any order
    r = e4m3(h, stored["r_fp8_scale"])
    expected = r @ e4m3(w2, w2_scale)
    m = onnx.load(str(built.onnx_path))
    m.graph.output.append(onnx.helper.make_tensor_value_info("r_fp8_dequantized", TensorProto.FLOAT, None))
    got_y, got_r = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(got_r, r)  # every E4M3 code of the second layer's input, bit for bit
    np.testing.assert_allclose(got_y, expected, rtol=1e-6, atol=1e-6 * float(np.abs(expected).max()))
