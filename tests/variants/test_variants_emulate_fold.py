"""A BatchNormalization after a Conv is folded into it in the FP16 emulation and the BF16 simulation, as ONNX Runtime
and TensorRT fold it: checked against a numpy reference of native execution of the folded Conv."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from qbench.backends.onnxruntime_cpu import OnnxRuntimeCPU
from qbench.recipe.spec import VariantSpec
from qbench.validate.fidelity import plan_measurement
from qbench.variants.base import BuildContext
from qbench.variants.emulate_fold import fold_conv_batch_norms
from qbench.variants.fp16 import build_bf16, build_fp16

CHANNELS, OUT = 3, 8


def _conv_bn(rng: np.random.Generator, bias: bool, extra_reader: bool = False) -> onnx.ModelProto:
    """x [N, 3, 12, 12] -> Conv(3x3, pad 1) -> BatchNormalization -> Relu -> y (and, with `extra_reader`, the Conv's
    output as a second graph output through an Identity)."""
    weights = {"W": rng.normal(0, 0.4, (OUT, CHANNELS, 3, 3)), "scale": rng.uniform(0.5, 3, OUT),
               "shift": rng.normal(0, 0.3, OUT), "mean": rng.normal(0, 0.5, OUT),
               "var": rng.uniform(0.05, 2, OUT)}  # fmt: skip
    if bias:
        weights["B"] = rng.normal(0, 0.2, OUT)
    nodes = [helper.make_node("Conv", ["x", "W", *(["B"] if bias else [])], ["c"], name="conv", pads=[1] * 4),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]  # fmt: skip
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", OUT, 12, 12])]
    if extra_reader:
        nodes.append(helper.make_node("Identity", ["c"], ["c_out"], name="tap"))
        outputs.append(helper.make_tensor_value_info("c_out", TensorProto.FLOAT, ["batch", OUT, 12, 12]))
    graph = helper.make_graph(
        nodes, "conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", CHANNELS, 12, 12])],
        outputs, [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _folded_reference(model: onnx.ModelProto, x: np.ndarray, dtype, weights_in) -> np.ndarray:
    """Native execution of the folded Conv in `dtype`: W' = W s / sqrt(var + eps), B' = (B - mean) s / sqrt(...) +
    shift, in float32 from the weights as `weights_in` holds them (the FP16 graph's float16; the FP32 model's own for
    BF16), stored in `dtype`; the Conv accumulates in float32 on the stored input, its output is stored once, then
    the Relu's."""
    def narrow(values: np.ndarray, to=dtype) -> np.ndarray:
        return values.astype(np.float32).astype(to).astype(np.float32)

    w = {t.name: narrow(numpy_helper.to_array(t), weights_in) for t in model.graph.initializer}
    k = w["scale"] / np.sqrt(w["var"] + np.float32(1e-5))
    folded_w = narrow(w["W"] * k[:, None, None, None])
    folded_b = narrow((w.get("B", np.float32(0)) - w["mean"]) * k + w["shift"])
    conv = ReferenceEvaluator(helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4))
    return narrow(np.maximum(narrow(conv.run(None, {"x": narrow(x), "w": folded_w, "b": folded_b})[0]), 0))


def _run(path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _assert_within_one_unit(got: np.ndarray, want: np.ndarray, dtype) -> None:
    """Within one unit in the last place of `dtype`: ONNX Runtime's Conv and numpy's sum the products in different
    orders."""
    unit = np.abs(np.spacing(want.astype(dtype))).astype(np.float32)
    assert np.all(np.abs(got - want) <= unit), float(np.max(np.abs(got - want) / unit))


@pytest.mark.parametrize("bias", [False, True])
def test_fp16_emulation_folds_batch_norm_into_the_conv(bias, tmp_path):
    """Before, the emulation rounded the Conv's output and the BatchNorm's: hundreds of FP16 units from the folded
    reference here (68.3 dB SQNR on a two-conv CNN, where the folded reference is 65.7 dB from FP32)."""
    model = _conv_bn(np.random.default_rng(0), bias)
    onnx.save(model, tmp_path / "cnn.onnx")
    built = build_fp16(VariantSpec(name="half", precision="fp16"), BuildContext(tmp_path / "cnn.onnx", tmp_path))
    plan = plan_measurement(OnnxRuntimeCPU(), built)
    assert "BatchNorm folded" in plan.fidelity.method
    assert "BatchNormalization" not in [node.op_type for node in onnx.load(plan.scored.onnx_path).graph.node]
    x = np.random.default_rng(1).normal(0, 1, (4, CHANNELS, 12, 12)).astype(np.float32)
    _assert_within_one_unit(_run(plan.scored.onnx_path, x), _folded_reference(model, x, np.float16, np.float16),
                            np.float16)  # fmt: skip


def test_bf16_simulation_folds_batch_norm_into_the_conv(tmp_path):
    model = _conv_bn(np.random.default_rng(0), bias=True)
    onnx.save(model, tmp_path / "cnn.onnx")
    built = build_bf16(VariantSpec(name="bf16", precision="bf16"), BuildContext(tmp_path / "cnn.onnx", tmp_path))
    assert built.params["folded_batch_norms"] == 1
    x = np.random.default_rng(1).normal(0, 1, (4, CHANNELS, 12, 12)).astype(np.float32)
    reference = _folded_reference(model, x, ml_dtypes.bfloat16, np.float32)
    _assert_within_one_unit(_run(built.onnx_path, x), reference, ml_dtypes.bfloat16)


def test_a_conv_output_read_elsewhere_is_not_folded():
    """The Conv's own output is needed (here a graph output): folding would remove it."""
    model = _conv_bn(np.random.default_rng(0), bias=True, extra_reader=True)
    assert fold_conv_batch_norms(model, lambda values: values) == 0
    assert [node.op_type for node in model.graph.node] == ["Conv", "BatchNormalization", "Relu", "Identity"]


def test_folding_keeps_the_fp32_function_and_drops_the_unread_weights():
    """With no rounding the folded graph computes what the Conv + BatchNorm did; the BatchNorm's parameters and the
    unfolded weight, read by nothing after, leave the graph."""
    model = _conv_bn(np.random.default_rng(0), bias=True)
    x = np.random.default_rng(1).normal(0, 1, (4, CHANNELS, 12, 12)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert fold_conv_batch_norms(model, lambda values: values) == 1
    assert [node.op_type for node in model.graph.node] == ["Conv", "Relu"]
    assert {t.name for t in model.graph.initializer} == {"W/bn_folded", "bn/bias"}
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-5)
