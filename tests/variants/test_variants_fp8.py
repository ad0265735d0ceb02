"""FP8 E4M3 as standard Q/DQ: accuracy on a trained CNN, graph shape, scales, exclusions."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

from qbench.errors import QbenchError
from qbench.recipe import VariantSpec
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


def test_fp8_rejects_op_types_it_cannot_quantize(mlp, tmp_path):
    spec = VariantSpec(name="fp8", precision="fp8", calibrator="minmax", op_types=["MatMul", "Add"])
    with pytest.raises(QbenchError, match=r"variant 'fp8': op_types: fp8 cannot quantize Add"):
        build_fp8(spec, mlp.context(tmp_path))


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
