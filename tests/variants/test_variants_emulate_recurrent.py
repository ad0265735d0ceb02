"""Recurrent layers in the FP16 emulation and the BF16 simulation: their state is rounded at every step, as
narrow-float hardware stores it, checked against a numpy reference of native FP16/BF16 execution."""

from __future__ import annotations

import itertools
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.backends.onnxruntime_cpu import OnnxRuntimeCPU
from qbench.recipe.spec import VariantSpec
from qbench.validate.fidelity import plan_measurement
from qbench.variants.base import BuildContext
from qbench.variants.emulate_recurrent import step_recurrent
from qbench.variants.fp16 import build_bf16, build_fp16

STEPS, BATCH, INPUT, HIDDEN = 20, 6, 8, 16
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _recurrent_model(kind: str, direction: str = "forward", layout: int = 0, initial: bool = False,
                     seed: int = 0, opset: int = 17) -> onnx.ModelProto:  # fmt: skip
    """x -> `kind` (every output named) -> graph outputs Y, Y_h (, Y_c); weights drawn from `seed`."""
    rng = np.random.default_rng(seed)
    d, g = (2 if direction == "bidirectional" else 1), GATES[kind]
    weights = {"W": rng.normal(0, 0.5, (d, g * HIDDEN, INPUT)), "R": rng.normal(0, 0.5, (d, g * HIDDEN, HIDDEN)),
               "B": rng.normal(0, 0.2, (d, 2 * g * HIDDEN))}  # fmt: skip
    state_shape = [BATCH, d, HIDDEN] if layout else [d, BATCH, HIDDEN]
    inputs = ["x", "W", "R", "B", ""]
    if initial:
        weights["h0"] = rng.normal(0, 0.5, state_shape)
        inputs.append("h0")
        if kind == "LSTM":
            weights["c0"] = rng.normal(0, 0.5, state_shape)
            inputs.append("c0")
    outputs = ["Y", "Y_h", "Y_c"][: 3 if kind == "LSTM" else 2]
    layout_attribute = {"layout": layout} if opset >= 14 else {}  # the attribute came with opset 14
    node = helper.make_node(kind, inputs, outputs, name="rnn", hidden_size=HIDDEN, direction=direction,
                            **layout_attribute)  # fmt: skip
    x_shape = [BATCH, STEPS, INPUT] if layout else [STEPS, BATCH, INPUT]
    graph = helper.make_graph(
        [node], "recurrent", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None] * (4 if name == "Y" else 3))
         for name in outputs],
        [numpy_helper.from_array(value.astype(np.float32), name) for name, value in weights.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _run(model: onnx.ModelProto | Path, x: np.ndarray) -> list[np.ndarray]:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _assert_within_one_unit(got: np.ndarray, want: np.ndarray, dtype) -> None:
    """Every value within one unit in the last place of `dtype` of the reference: ONNX Runtime's kernel and numpy sum
    a step's float32 gates in different orders, which can move a value across a rounding boundary (1 bfloat16 of
    1920 on the GRU below)."""
    unit = np.abs(np.spacing(want.astype(dtype))).astype(np.float32)
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= unit), float(np.max(np.abs(got - want) / unit))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _native_reference(model: onnx.ModelProto, x: np.ndarray, dtype) -> list[np.ndarray]:
    """Native narrow-float execution of a forward LSTM/GRU (ONNX gate order, default activations), in numpy: x and
    the weights stored in `dtype`; each step's gates accumulated in float32 from narrow h (and c); the new h and c
    stored in `dtype`. A GPU's fused cell (cuDNN, PyTorch's CUDA LSTM cell) computes h from the float32 c of the
    same step, in one kernel, and stores both: so does this reference."""
    def narrow(values: np.ndarray) -> np.ndarray:
        return values.astype(np.float32).astype(dtype).astype(np.float32)

    weights = {t.name: narrow(numpy_helper.to_array(t)) for t in model.graph.initializer}
    kind = model.graph.node[0].op_type
    w, r, b = weights["W"][0], weights["R"][0], weights["B"][0]
    g = GATES[kind] * HIDDEN
    h = np.zeros((x.shape[1], HIDDEN), np.float32)
    c = np.zeros_like(h)
    ys = []
    for step in narrow(x):
        projected = step @ w.T + b[:g]
        if kind == "LSTM":
            i, o, f, cell = np.split(projected + h @ r.T + b[g:], 4, axis=1)
            c_wide = _sigmoid(f) * c + _sigmoid(i) * np.tanh(cell)
            h, c = narrow(_sigmoid(o) * np.tanh(c_wide)), narrow(c_wide)
        else:
            xz, xr, xh = np.split(projected, 3, axis=1)
            (rz, rr, rh), (bz, br, bh) = np.split(r, 3, axis=0), np.split(b[g:], 3)
            z, reset = _sigmoid(xz + h @ rz.T + bz), _sigmoid(xr + h @ rr.T + br)
            h = narrow((1 - z) * np.tanh(xh + (reset * h) @ rh.T + bh) + z * h)
        ys.append(h)
    return [np.stack(ys)[:, None], h[None], c[None]][: 3 if kind == "LSTM" else 2]


@pytest.mark.parametrize(
    ("kind", "direction", "layout", "initial"),
    [*itertools.product(["LSTM", "GRU", "RNN"], ["forward", "reverse", "bidirectional"], [0, 1], [False, True])],
)
def test_stepped_recurrent_computes_what_the_operator_computes(kind, direction, layout, initial):
    """With nothing to round (a Cast to FLOAT), the step-wise Scan gives the operator's own outputs, every one.
    ONNX Runtime's CPU kernels refuse layout 1 (batch first): that expectation is the layout-0 operator's, transposed
    (initial states transposed too)."""
    model = _recurrent_model(kind, direction, layout, initial)
    x = np.random.default_rng(1).normal(0, 1.5, [STEPS, BATCH, INPUT]).astype(np.float32)
    time_first = _recurrent_model(kind, direction, 0, initial)
    expected = _run(time_first, x)
    if layout:
        states = {t.name: numpy_helper.to_array(t) for t in time_first.graph.initializer if t.name in ("h0", "c0")}
        for tensor in model.graph.initializer:
            if tensor.name in states:  # the layout-0 model's states, batch first
                tensor.CopyFrom(numpy_helper.from_array(states[tensor.name].transpose(1, 0, 2).copy(), tensor.name))
        x = x.transpose(1, 0, 2).copy()
        expected = [y.transpose(2, 0, 1, 3) if y.ndim == 4 else y.transpose(1, 0, 2) for y in expected]
    stepped = onnx.ModelProto()
    stepped.CopyFrom(model)
    assert step_recurrent(stepped, TensorProto.FLOAT) == 1
    assert [node.op_type for node in stepped.graph.node].count("Scan") == (2 if direction == "bidirectional" else 1)
    onnx.checker.check_model(stepped)
    for got, want in zip(_run(stepped, x), expected, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [9, 11])
def test_stepped_recurrent_in_opsets_before_13(opset):
    """Opsets 9-12: Unsqueeze takes its axes as an attribute, and the direction slices are Gathers (Slice takes
    inputs from opset 10 only)."""
    model = _recurrent_model("LSTM", "bidirectional", initial=True, opset=opset)
    x = np.random.default_rng(1).normal(0, 1.5, [STEPS, BATCH, INPUT]).astype(np.float32)
    expected = _run(model, x)
    assert step_recurrent(model, TensorProto.FLOAT) == 1
    onnx.checker.check_model(model)
    for got, want in zip(_run(model, x), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_recurrent_node_with_sequence_lens_is_left_whole():
    model = _recurrent_model("GRU")
    model.graph.node[0].input[4] = "lengths"
    model.graph.initializer.append(numpy_helper.from_array(np.full(BATCH, STEPS, np.int32), "lengths"))
    assert step_recurrent(model, TensorProto.FLOAT16) == 0
    assert [node.op_type for node in model.graph.node] == ["GRU"]


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_fp16_emulation_rounds_the_recurrent_state_at_every_step(kind, tmp_path):
    """The emulation's outputs are the native FP16 reference's to one unit in the last place (it rounded only the
    node's outputs before, its state staying float32 between steps: hundreds of FP16 units off)."""
    model = _recurrent_model(kind)
    onnx.save(model, tmp_path / "rnn.onnx")
    built = build_fp16(VariantSpec(name="half", precision="fp16"), BuildContext(tmp_path / "rnn.onnx", tmp_path))
    plan = plan_measurement(OnnxRuntimeCPU(), built)
    assert "state rounded at every step" in plan.fidelity.method
    x = np.random.default_rng(1).normal(0, 1.5, (STEPS, BATCH, INPUT)).astype(np.float32)
    for got, want in zip(_run(plan.scored.onnx_path, x), _native_reference(model, x, np.float16), strict=True):
        _assert_within_one_unit(got, want, np.float16)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_bf16_simulation_rounds_the_recurrent_state_at_every_step(kind, tmp_path):
    model = _recurrent_model(kind)
    onnx.save(model, tmp_path / "rnn.onnx")
    built = build_bf16(VariantSpec(name="bf16", precision="bf16"), BuildContext(tmp_path / "rnn.onnx", tmp_path))
    assert built.params["stepped_recurrent"] == 1
    x = np.random.default_rng(1).normal(0, 1.5, (STEPS, BATCH, INPUT)).astype(np.float32)
    for got, want in zip(_run(built.onnx_path, x), _native_reference(model, x, ml_dtypes.bfloat16), strict=True):
        _assert_within_one_unit(got, want, ml_dtypes.bfloat16)
