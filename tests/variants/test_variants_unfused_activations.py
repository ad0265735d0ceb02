"""A Linear + ReLU (or Clip) feeding a node kept float keeps its integer kernel in a static INT8 build.

ONNX Runtime fuses such an activation into the float Gemm before it (FusedGemm), which then runs in float on weights
dequantized every call: the INT8 search's keep-float candidates of an MLP ran slower than FP32 that way. Each test
builds a tiny 3-Linear MLP and counts, in the graph ONNX Runtime itself optimises, the layers that run as integer
kernels."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from qbench.recipe.spec import VariantSpec
from qbench.variants import BuildContext, build_variant
from qbench.variants.unfused_activations import keep_integer_kernels
from tests.variants.conftest import ort_integer_kernels, run_variant

WIDTH, HIDDEN = 8, 32


def _mlp(graph, path, activation: str):
    """x -> Gemm fc1 -> act1 -> Gemm fc2 -> act2 -> Gemm head -> y; act is Relu or Clip(0, 6) (opset 13 inputs)."""
    rng = np.random.default_rng(0)

    def act(index: int, source: str) -> onnx.NodeProto:
        if activation == "Relu":
            return helper.make_node("Relu", [source], [f"a{index}"], name=f"act{index}")
        return helper.make_node("Clip", [source, "low", "high"], [f"a{index}"], name=f"act{index}")

    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], name="fc1", transB=1), act(1, "h1"),
             helper.make_node("Gemm", ["a1", "w2", "b2"], ["h2"], name="fc2", transB=1), act(2, "h2"),
             helper.make_node("Gemm", ["a2", "w3", "b3"], ["y"], name="head", transB=1)]  # fmt: skip
    weights = {"w1": rng.normal(size=(HIDDEN, WIDTH)), "b1": rng.normal(size=HIDDEN) / 4,
               "w2": rng.normal(size=(HIDDEN, HIDDEN)) / 4, "b2": rng.normal(size=HIDDEN) / 4,
               "w3": rng.normal(size=(4, HIDDEN)) / 4, "b3": np.zeros(4), "low": np.array(0.0), "high": np.array(6.0)}
    weights = {k: np.asarray(v, np.float32) for k, v in weights.items() if activation == "Clip"
               or k not in ("low", "high")}
    graph(path, nodes, weights, {"x": WIDTH}, {"y": 4}, opset=13)
    calibration = [{"x": rng.normal(size=(16, WIDTH)).astype(np.float32)} for _ in range(4)]
    return BuildContext(reference_path=path, workdir=path.parent / "built", calibration=calibration), rng


# qbench's own Q/DQ writers, which leave every Linear's output float (ONNX Runtime's static quantizer re-quantizes it)
SPECS = {
    "smoothquant-static": {"calibrator": "minmax", "smoothquant": {"alpha": 0.5}},
    "linear-static": {"technique": "linear", "calibrator": "minmax"},
}


@pytest.mark.parametrize("activation", ["Relu", "Clip"])
@pytest.mark.parametrize("technique", list(SPECS))
def test_a_kept_head_leaves_the_linear_before_its_activation_an_integer_kernel(technique, activation, graph, tmp_path):
    """Keeping `head` float leaves fc2 -> act2 -> head (float): fc2 must still run as an integer kernel (before, ONNX
    Runtime fused act2 into a float FusedGemm: 1 integer kernel of the 2 quantized Linears with ReLU, none with
    ReLU6), and the build computes what the same Q/DQ graph with the activations as written computes."""
    ctx, rng = _mlp(graph, tmp_path / "mlp.onnx", activation)
    built = build_variant(VariantSpec(name="kept", precision="int8", exclude_nodes=["head"], **SPECS[technique]), ctx)
    assert ort_integer_kernels(built.onnx_path, tmp_path) == 2  # fc1 and fc2
    assert built.params["quantized_op_types"] == {"Gemm": 2}
    producers = {output: node for node in onnx.load(str(built.onnx_path)).graph.node for output in node.output}
    assert producers["a2"].op_type == ("Max" if activation == "Relu" else "Min")
    feeds = {"x": (rng.normal(size=(64, WIDTH)) * 3).astype(np.float32)}
    as_written = _run(_with_activation(built.onnx_path, activation, tmp_path / "as_written.onnx"), feeds)
    np.testing.assert_allclose(run_variant(built, feeds), as_written, rtol=1e-4, atol=1e-4 * np.abs(as_written).max())


@pytest.mark.parametrize(("activation", "rewritten"), [("Relu", 0), ("Clip", 2)])
def test_every_linear_quantized_runs_as_integer_kernels(activation, rewritten, graph, tmp_path):
    """Every Linear quantized. A ReLU before its reader's QuantizeLinear is folded into it by ONNX Runtime and left
    as it is; a ReLU6 (Clip) is not, and kept fc1 and fc2 from their integer kernels (1 of 3 before)."""
    ctx, _ = _mlp(graph, tmp_path / "mlp.onnx", activation)
    built = build_variant(VariantSpec(name="all", precision="int8", **SPECS["smoothquant-static"]), ctx)
    assert built.params.get("activations_unfused", 0) == rewritten
    assert ort_integer_kernels(built.onnx_path, tmp_path) == 3
    assert keep_integer_kernels(onnx.load(str(built.onnx_path))) == 0  # nothing left to rewrite


def _with_activation(path, activation, target):
    """The built graph with each Max/Min the rewrite wrote turned back into the activation it replaced."""
    model = onnx.load(str(path))
    nodes = []
    for node in model.graph.node:
        if node.op_type == "Max" and activation == "Relu":
            node = helper.make_node("Relu", [node.input[0]], list(node.output), name=node.name)
        elif node.op_type == "Max":
            continue  # Clip: Max then Min, the Min carrying the Clip's name and output
        elif node.op_type == "Min":
            source = next(n.input[0] for n in model.graph.node if n.op_type == "Max" and n.output[0] == node.input[0])
            node = helper.make_node("Clip", [source, "low", "high"], list(node.output), name=node.name)
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(target))
    return target


def _run(path, feeds):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
