"""Gemm -> MatMul (+ Add) before dynamic INT8: a torch Linear (exported as Gemm) is quantized, not left FP32."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from qbench.recipe.spec import VariantSpec
from qbench.variants import build_variant
from qbench.variants.base import BuildContext
from qbench.variants.gemm_matmul import gemms_as_matmul

RNG = np.random.default_rng(1)
W1 = RNG.normal(size=(16, 8)).astype(np.float32)  # (out, in): transB=1, as torch exports nn.Linear
B1 = RNG.normal(size=(16,)).astype(np.float32)
W2 = RNG.normal(size=(16, 4)).astype(np.float32)  # (in, out), transB=0
B2 = RNG.normal(size=(1, 4)).astype(np.float32)
X = RNG.normal(size=(32, 8)).astype(np.float32)


def _gemm_mlp(graph, folder):
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2", alpha=0.5, beta=2.0),
    ]
    return graph(folder / "gemm.onnx", nodes, {"w1": W1, "b1": B1, "w2": W2, "b2": B2}, {"x": 8}, {"y": 4})


def _run(path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_gemms_become_matmul_and_add_computing_the_same(graph, tmp_path):
    path = _gemm_mlp(graph, tmp_path)
    model = onnx.load(str(path))
    assert gemms_as_matmul(model) == ["fc1", "fc2"]
    assert [(n.op_type, n.name) for n in model.graph.node if n.op_type in ("MatMul", "Gemm")] == [
        ("MatMul", "fc1"), ("MatMul", "fc2")
    ]  # fmt: skip
    onnx.checker.check_model(model)
    rewritten = tmp_path / "rewritten.onnx"
    onnx.save(model, str(rewritten))
    expected = 0.5 * (np.maximum(X @ W1.T + B1, 0) @ W2) + 2.0 * B2  # Gemm's definition, by hand
    np.testing.assert_allclose(_run(rewritten, X), expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(_run(path, X), expected, rtol=1e-5, atol=1e-4)


def test_a_computed_bias_is_scaled_by_beta_between_the_matmul_and_the_add(graph, tmp_path):
    """beta cannot be folded into a bias the graph computes: a Mul scales it before the Add."""
    nodes = [helper.make_node("Gemm", ["x", "w2", "c"], ["y"], name="fc", alpha=0.5, beta=2.0)]
    path = graph(tmp_path / "c.onnx", nodes, {"w2": W2}, {"x": 16, "c": 4}, {"y": 4})
    model = onnx.load(str(path))
    assert gemms_as_matmul(model) == ["fc"]
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Mul", "Add"]
    rewritten = tmp_path / "rewritten.onnx"
    onnx.save(model, str(rewritten))
    x, c = RNG.normal(size=(5, 16)).astype(np.float32), RNG.normal(size=(5, 4)).astype(np.float32)
    session = ort.InferenceSession(str(rewritten), providers=["CPUExecutionProvider"])
    expected = 0.5 * (x @ W2) + 2.0 * c  # Gemm's definition, by hand
    np.testing.assert_allclose(session.run(None, {"x": x, "c": c})[0], expected, rtol=1e-5, atol=1e-5)


def test_a_gemm_with_a_computed_weight_or_transposed_input_is_left_alone(graph, tmp_path):
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["y"], name="fc", transA=1)]
    path = graph(tmp_path / "t.onnx", nodes, {"w1": RNG.normal(size=(32, 4)).astype(np.float32)}, {"x": 32}, {"y": 4})
    model = onnx.load(str(path))
    assert gemms_as_matmul(model) == [] and model.graph.node[0].op_type == "Gemm"


def test_dynamic_int8_quantizes_a_gemm_mlp(graph, tmp_path):
    path = _gemm_mlp(graph, tmp_path)
    spec = VariantSpec(name="dyn", precision="int8", calibrator="dynamic")
    built = build_variant(spec, BuildContext(reference_path=path, workdir=tmp_path / "work"))
    assert built.params["gemms_as_matmul"] == 2
    assert built.params["quantized_nodes"] == 2, built.params["quantized_op_types"]
    fp32 = _run(path, X)
    int8 = _run(built.onnx_path, X)
    assert not np.array_equal(int8, fp32)  # really quantized, not the FP32 model again
    np.testing.assert_allclose(int8, fp32, atol=0.15 * np.abs(fp32).max())


def test_excluding_a_gemm_by_name_still_keeps_it_float(graph, tmp_path):
    path = _gemm_mlp(graph, tmp_path)
    spec = VariantSpec(name="dyn", precision="int8", calibrator="dynamic", exclude_nodes=["fc2"])
    built = build_variant(spec, BuildContext(reference_path=path, workdir=tmp_path / "work"))
    quantized = onnx.load(str(built.onnx_path))
    assert built.params["quantized_nodes"] == 1
    assert [n.name for n in quantized.graph.node if n.op_type == "MatMul"] == ["fc2"]
