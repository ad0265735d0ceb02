"""Faithful FP16 / BF16 / FP8 emulation on ONNX Runtime's CPU provider: overflow, underflow, precision, saturation."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from qbench.backends.onnxruntime_cpu import OnnxRuntimeCPU
from qbench.errors import QbenchError, environment_cause
from qbench.recipe.spec import VariantSpec
from qbench.results.schema import EMULATED, NATIVE
from qbench.validate.fidelity import plan_measurement
from qbench.variants import onnx_utils
from qbench.variants.base import BuildContext
from qbench.variants.emulate import emulate_float16
from qbench.variants.fp8 import FP8_MAX, build_fp8
from qbench.variants.fp16 import build_bf16, build_fp16, round_to_bf16

SCALE_UP = 300.0  # hidden = 300 x input: rows with an input above 65504 / 300 overflow FP16


def _overflow_model(graph, folder: Path) -> Path:
    """x[4] -> MatMul(300 I) -> Relu -> MatMul(I / 300) -> y[4]: y == relu(x) in FP32, hidden up to 300 |x|."""
    nodes = [helper.make_node("MatMul", ["x", "up"], ["hidden"]), helper.make_node("Relu", ["hidden"], ["r"]),
             helper.make_node("MatMul", ["r", "down"], ["y"])]  # fmt: skip
    weights = {"up": np.eye(4, dtype=np.float32) * SCALE_UP, "down": np.eye(4, dtype=np.float32) / SCALE_UP}
    return graph(folder / "overflow.onnx", nodes, weights, {"x": 4}, {"y": 4})


def _plain(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The first output under default session options, as a user would load the file."""
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _rows(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """32 rows in [0, 1]; rows 3, 17 and 30 hold one value of 1000 (hidden 3e5 > 65504)."""
    x = rng.uniform(0, 1, size=(32, 4)).astype(np.float32)
    big = np.zeros(32, dtype=bool)
    big[[3, 17, 30]] = True
    x[big, 1] = 1000.0
    return x, big


def test_ort_cpu_hides_fp16_overflow_in_the_fp16_graph(graph, tmp_path):
    """Why FP16 is emulated on CPU. If this fails, ORT CPU now overflows like FP16 hardware."""
    built = build_fp16(VariantSpec(name="half", precision="fp16"),
                       BuildContext(_overflow_model(graph, tmp_path), tmp_path))  # fmt: skip
    x, big = _rows(np.random.default_rng(0))
    output = _plain(built.onnx_path, {"x": x})
    assert np.all(np.isfinite(output)) and output[big, 1].min() > 900


def test_fp16_emulation_overflows_exactly_on_the_rows_beyond_65504(graph, tmp_path):
    built = build_fp16(VariantSpec(name="half", precision="fp16"),
                       BuildContext(_overflow_model(graph, tmp_path), tmp_path))  # fmt: skip
    plan = plan_measurement(OnnxRuntimeCPU(), built)
    assert plan.timed is built and plan.separate
    assert plan.scored.onnx_path == tmp_path / "half.emulated.onnx"
    assert (plan.fidelity.accuracy, plan.fidelity.latency) == (EMULATED, EMULATED)
    assert "float16" in plan.fidelity.method
    x, big = _rows(np.random.default_rng(1))
    output = _plain(plan.scored.onnx_path, {"x": x})  # default level (ORT_ENABLE_ALL): the Cast pairs survive
    nonfinite_rows = ~np.all(np.isfinite(output), axis=1)
    np.testing.assert_array_equal(nonfinite_rows, big)
    expected = np.float16(np.float16(x[~big]).astype(np.float32))  # FP16 rounding of relu(x) in FP16 steps
    np.testing.assert_allclose(output[~big], expected.astype(np.float32), rtol=2**-9)


def test_fp16_emulation_underflows_to_zero_and_keeps_subnormals(graph, tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    path = graph(tmp_path / "tiny.onnx", nodes, {"w": np.eye(2, dtype=np.float32) * 1e-4}, {"x": 2}, {"y": 2})
    built = build_fp16(VariantSpec(name="half", precision="fp16"), BuildContext(path, tmp_path))
    x = np.array([[1e-4, 0.01], [0.5, 2e-4]], dtype=np.float32)  # products 1e-8 (underflow), 1e-6 (subnormal)
    output = _plain(plan_measurement(OnnxRuntimeCPU(), built).scored.onnx_path, {"x": x})
    half = np.float16(x).astype(np.float32) @ np.float16(np.eye(2, dtype=np.float32) * 1e-4).astype(np.float32)
    np.testing.assert_array_equal(output, np.float16(half).astype(np.float32))
    assert output[0, 0] == 0.0, "1e-8 is below FP16's smallest subnormal (2**-24): it flushes to 0"
    assert 0 < output[0, 1] < 6.1e-5, "1e-6 is an FP16 subnormal: kept, not flushed"


def test_fp16_emulation_keeps_graph_types_and_refuses_subgraphs(graph, tmp_path):
    built = build_fp16(VariantSpec(name="half", precision="fp16"),
                       BuildContext(_overflow_model(graph, tmp_path), tmp_path))  # fmt: skip
    emulated, rounded = emulate_float16(onnx.load(str(built.onnx_path)))
    assert {t.data_type for t in emulated.graph.initializer} == {TensorProto.FLOAT}
    assert [o.type.tensor_type.elem_type for o in emulated.graph.output] == [TensorProto.FLOAT]
    assert rounded >= 4  # the input cast, both MatMuls and the Relu
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "b", [],
                               [helper.make_tensor_value_info("z", TensorProto.FLOAT16, [1])])  # fmt: skip
    looped = helper.make_graph(
        [helper.make_node("If", ["c"], ["z"], then_branch=branch, else_branch=branch)], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT16, [1])],
    )  # fmt: skip
    with pytest.raises(QbenchError, match="control-flow"):
        emulate_float16(helper.make_model(looped, opset_imports=[helper.make_opsetid("", 17)]))


def test_bf16_keeps_fp32_range_but_rounds_to_8_bits(graph, tmp_path):
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"])]
    path = graph(tmp_path / "mul.onnx", nodes, {"w": np.full((1, 1), 1e30, dtype=np.float32)}, {"x": 1}, {"y": 1})
    built = build_bf16(VariantSpec(name="brain", precision="bf16"), BuildContext(path, tmp_path))
    plan = plan_measurement(OnnxRuntimeCPU(), built)
    assert plan.scored is built and built.simulation
    assert (plan.fidelity.accuracy, plan.fidelity.latency) == (EMULATED, EMULATED)
    x = np.array([[1.0], [1 + 2**-9], [1e8], [1e9]], dtype=np.float32)
    output = _plain(built.onnx_path, {"x": x})[:, 0]
    big = round_to_bf16(np.float32([1e30]))[0]
    assert output[0] == big and output[1] == big, "1 + 2**-9 rounds to 1 in bfloat16"
    assert np.isfinite(output[2]) and output[2] > 9e37, "1e38 is within bfloat16's range, unlike FP16's"
    assert output[3] == np.inf, "1e39 is beyond bfloat16's largest finite value (3.39e38)"


def test_fp8_saturates_at_448_times_the_scale_under_default_options(graph, tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    path = graph(tmp_path / "lin.onnx", nodes, {"w": np.eye(2, dtype=np.float32)}, {"x": 2}, {"y": 2})
    calibration = [{"x": np.array([[2.0, -1.0], [0.5, 0.25]], dtype=np.float32)}]  # amax 2: scale 2 / 448
    ctx = BuildContext(reference_path=path, workdir=tmp_path / "work", calibration=calibration)
    built = build_fp8(VariantSpec(name="fp8", precision="fp8", calibrator="minmax"), ctx)
    assert built.session_hints == {}, "the saved FP8 model needs no special session options"
    plan = plan_measurement(OnnxRuntimeCPU(), built)
    assert plan.scored is built and plan.fidelity.accuracy == EMULATED
    x = np.array([[50.0, -1e6], [np.inf, 1.0]], dtype=np.float32)
    expected = np.array([[2.0, -2.0], [2.0, 1.0]], dtype=np.float32)  # +-448 x (2 / 448); 1.0 is exact in E4M3
    for level in (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        session = ort.InferenceSession(str(built.onnx_path), options, providers=["CPUExecutionProvider"])
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], expected)
    assert built.params["overflow"] == f"saturate to +-{FP8_MAX:g} x scale (E4M3FN has no inf)"


def test_fp32_and_int8_are_native_on_cpu(graph, tmp_path):
    from qbench.variants.fp32 import build_fp32

    built = build_fp32(VariantSpec(name="fp32", precision="fp32"),
                       BuildContext(_overflow_model(graph, tmp_path), tmp_path))  # fmt: skip
    plan = plan_measurement(OnnxRuntimeCPU(), built)
    assert plan.scored is built and not plan.separate
    assert (plan.fidelity.accuracy, plan.fidelity.latency, plan.fidelity.method) == (NATIVE, NATIVE, "")


def test_a_variant_declares_the_session_options_it_needs_in_its_file(mlp, tmp_path, monkeypatch):
    from qbench.techniques import TECHNIQUES, Technique
    from qbench.techniques.fp8 import Fp8
    from qbench.variants import build_variant
    from qbench.variants.base import BuiltVariant

    def declared_session_options(path: Path) -> dict[str, str]:  # as a user reads them from the saved file
        prefix = "onnxruntime.session_options."
        props = onnx.load(str(path), load_external_data=False).metadata_props
        return {p.key.removeprefix(prefix): p.value for p in props if p.key.startswith(prefix)}

    def build_basic(spec, ctx):
        target = ctx.workdir / "basic.onnx"
        target.write_bytes(mlp.path.read_bytes())
        return BuiltVariant(spec.name, "fp8", target, session_hints={"graph_optimization_level": "basic"})

    monkeypatch.setattr(TECHNIQUES, "_entries", {**TECHNIQUES._entries, "fp8": Technique(Fp8, build_basic)})
    built = build_variant(VariantSpec(name="q", precision="fp8", calibrator="minmax"), mlp.context(tmp_path))
    assert declared_session_options(built.onnx_path) == {"graph_optimization_level": "basic"}
    assert declared_session_options(mlp.path) == {}, "the recipe's own model is never rewritten"
    ort.InferenceSession(str(built.onnx_path), providers=["CPUExecutionProvider"])  # still a valid model


def test_fp16_keeps_a_control_flow_node_fp32_and_emulates_the_rest(tmp_path):
    """An If whose branches compute in float stays whole in FP32; the nodes around it are FP16 and emulated."""

    def branch(name: str, factor: float) -> onnx.GraphProto:
        scale = helper.make_tensor(f"{name}_k", TensorProto.FLOAT, [], [factor])
        return helper.make_graph([helper.make_node("Mul", ["h", f"{name}_k"], [f"{name}_out"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [None, 4])],
                                 initializer=[scale])  # fmt: skip

    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("ReduceSum", ["h"], ["total"], name="sum", keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"], name="greater"),
        helper.make_node("If", ["positive"], ["y"], name="choose", then_branch=branch("up", 2.0),
                         else_branch=branch("down", 0.5)),
    ]  # fmt: skip
    model = helper.make_model(
        helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
                          initializer=[helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])]),
        opset_imports=[helper.make_opsetid("", 17)],
    )  # fmt: skip
    path = tmp_path / "branchy.onnx"
    onnx.save(model, str(path))
    built = build_fp16(VariantSpec(name="half", precision="fp16"), BuildContext(path, tmp_path))
    half = onnx.load(str(built.onnx_path))
    (choose,) = [node for node in half.graph.node if node.op_type == "If"]
    bodies = [attribute.g for attribute in choose.attribute]
    assert all(t.data_type == TensorProto.FLOAT for body in bodies for t in body.initializer)
    emulated, rounded = emulate_float16(half)
    assert rounded >= 1
    x = np.array([[1.0, -2.0, 3.0, 0.25]], dtype=np.float32)
    session = ort.InferenceSession(emulated.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], 2.0 * np.maximum(x, 0), rtol=1e-3)


def test_an_fp16_emulation_on_a_full_disk_is_one_line_naming_it_and_leaves_no_truncated_model(graph, tmp_path, monkeypatch):
    """The emulation is saved beside the variant, in the run folder: a disk filling up there failed the measurement
    with `OSError: [Errno 28] No space left on device (at __init__.py:179)` and left half a `.emulated.onnx`. Its
    cause is kept, so the failed job counts as the machine's fault, which `--resume` measures again."""
    built = build_fp16(VariantSpec(name="half", precision="fp16"),
                       BuildContext(_overflow_model(graph, tmp_path), tmp_path))  # fmt: skip

    def fill_up(model: onnx.ModelProto, file: BinaryIO) -> None:
        file.write(model.SerializeToString()[:100])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), file.name)

    monkeypatch.setattr(onnx_utils, "write_serialised", fill_up)
    with pytest.raises(QbenchError) as caught:
        plan_measurement(OnnxRuntimeCPU(), built)
    emulated = tmp_path / "half.emulated.onnx"
    assert str(caught.value) == f"variant 'half': {emulated}: cannot write the model: No space left on device"
    assert environment_cause(caught.value) == "no space left on device"
    assert not emulated.exists() and not list(tmp_path.glob(".half*"))
