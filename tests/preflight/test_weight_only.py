"""A reference whose weights are quantized to 8 bits or fewer is refused, whichever form holds them: ONNX Runtime's
fused weight-only kernels (MatMulNBits, GatherBlockQuantized) and a DequantizeLinear (a Cast: float8) of the stored
weight alike. The fused kernels are built as ONNX Runtime's weight-only quantizer builds them (its own packing
kernels) and run, so the graphs checked are graphs the runtime executes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.cli.app import main
from qbench.preflight.precision import reduced_precision, rounded_activations, stored_weights

K, N, BLOCK = 32, 3, 16
WEIGHT = np.random.default_rng(0).normal(size=(K, N)).astype(np.float32)
ROWS = np.random.default_rng(1).normal(size=(64, K)).astype(np.float32)


def _model(nodes: list, weights: list, inputs: list | None = None) -> onnx.ModelProto:
    inputs = inputs or [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", K])]
    graph = helper.make_graph(nodes, "weight-only", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              weights)  # fmt: skip
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    """The model's output, unoptimised: ONNX Runtime fuses an int4 DequantizeLinear + MatMul into its own kernel,
    which may round the activations too."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _matmul_nbits(bits: int) -> onnx.ModelProto:
    """x @ WEIGHT as MatMulNBitsQuantizer writes it (symmetric blocks of BLOCK rows, packed by ONNX Runtime's kernel),
    checked against the weight it dequantizes to."""
    from onnxruntime.capi import _pybind_state as kernels

    blocks = K // BLOCK
    packed = np.zeros((N, blocks, BLOCK * bits // 8), np.uint8)
    scales, zero_points = np.zeros((N, blocks), np.float32), np.zeros((N, blocks), np.uint8)
    getattr(kernels, f"quantize_matmul_{bits}bits")(packed, WEIGHT, scales, zero_points, BLOCK, N, K, True)
    node = helper.make_node("MatMulNBits", ["x", "w_packed", "w_scales"], ["y"], domain="com.microsoft", K=K, N=N,
                            bits=bits, block_size=BLOCK)  # fmt: skip
    model = _model([node],
                   [numpy_helper.from_array(packed, "w_packed"), numpy_helper.from_array(scales.ravel(), "w_scales")])
    if bits == 4:  # two values a byte, low nibble first, around the zero point 8
        values = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(N, blocks, BLOCK).astype(np.float32) - 8
    else:
        values = packed.astype(np.float32) - 128
    dequantized = (values * scales[:, :, None]).reshape(N, K).T
    np.testing.assert_allclose(_run(model, {"x": ROWS}), ROWS @ dequantized, rtol=1e-4, atol=1e-4)
    return model


def _dequantized(elem: int) -> onnx.ModelProto:
    """x @ DequantizeLinear(w stored in `elem`, per block of BLOCK rows): the Q/DQ form of weight-only quantization."""
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    scales = np.abs(WEIGHT).reshape(K // BLOCK, BLOCK, N).max(axis=1) / 7
    stored = np.round(WEIGHT / np.repeat(scales, BLOCK, axis=0)).astype(dtype)
    nodes = [helper.make_node("DequantizeLinear", ["w_stored", "w_scales"], ["w"], axis=0, block_size=BLOCK),
             helper.make_node("MatMul", ["x", "w"], ["y"])]  # fmt: skip
    model = _model(nodes, [numpy_helper.from_array(stored, "w_stored"), numpy_helper.from_array(scales, "w_scales")])
    expected = ROWS @ (stored.astype(np.float32) * np.repeat(scales, BLOCK, axis=0))
    np.testing.assert_allclose(_run(model, {"x": ROWS}), expected, rtol=1e-4, atol=1e-4)
    return model


def _gather_block_quantized() -> onnx.ModelProto:
    """Rows of an int4 embedding table (GatherBlockQuantized, as ONNX Runtime GenAI's builder writes embeddings)."""
    table = np.round(WEIGHT.T * 2).clip(-8, 7).astype(np.int8)  # [N rows, K values]
    packed = helper.make_tensor("table", TensorProto.INT4, [N, K], table.ravel().tolist())
    scales = numpy_helper.from_array(np.full((N, K // BLOCK), 0.5, np.float32), "scales")
    node = helper.make_node("GatherBlockQuantized", ["table", "ids", "scales"], ["y"], domain="com.microsoft",
                            gather_axis=0, quantize_axis=1, block_size=BLOCK)  # fmt: skip
    model = _model([node], [packed, scales], [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])])
    np.testing.assert_allclose(_run(model, {"ids": np.array([2, 0])}), table[[2, 0]] * 0.5)
    return model


def _widen(stored: str, widened: str, cast_like: bool) -> onnx.NodeProto:
    """The node widening the stored weight to float: a Cast, or the CastLike(w, x) a dynamo export of `w.type_as(x)`
    writes."""
    if cast_like:
        return helper.make_node("CastLike", [stored, "x"], [widened])
    return helper.make_node("Cast", [stored], [widened], to=TensorProto.FLOAT)


def _float8_cast(cast_like: bool = False) -> onnx.ModelProto:
    stored = helper.make_tensor("w_stored", TensorProto.FLOAT8E4M3FN, [K, N], WEIGHT.ravel().tolist())
    nodes = [_widen("w_stored", "w", cast_like), helper.make_node("MatMul", ["x", "w"], ["y"])]
    return _model(nodes, [stored])


def _cast_integers(elem: int, scaled: bool = True, cast_like: bool = False) -> onnx.ModelProto:
    """x @ Transpose(Cast(w stored in `elem`) * per-row scales), as a PyTorch export of `x @ (q.float() * s).t()`
    leaves a weight-only quantized linear layer (no DequantizeLinear); `scaled=False`: the scale applied after;
    `cast_like`: widened by CastLike(w, x) (`q.type_as(x)`)."""
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    scales = np.abs(WEIGHT.T).max(axis=1, keepdims=True) / 127
    stored = np.round(WEIGHT.T / scales).astype(dtype)
    cast = _widen("w_stored", "w_float", cast_like)
    if scaled:
        nodes = [cast, helper.make_node("Mul", ["w_float", "w_scales"], ["w_scaled"]),
                 helper.make_node("Transpose", ["w_scaled"], ["w"]),
                 helper.make_node("MatMul", ["x", "w"], ["y"])]  # fmt: skip
    else:
        nodes = [cast, helper.make_node("Transpose", ["w_float"], ["w"]),
                 helper.make_node("MatMul", ["x", "w"], ["xw"]),
                 helper.make_node("Mul", ["xw", "w_scales_row"], ["y"])]  # fmt: skip
    model = _model(nodes, [numpy_helper.from_array(stored, "w_stored"), numpy_helper.from_array(scales, "w_scales"),
                           numpy_helper.from_array(scales.T.copy(), "w_scales_row")])  # fmt: skip
    np.testing.assert_allclose(_run(model, {"x": ROWS}), ROWS @ (stored.astype(np.float32) * scales).T, rtol=1e-4,
                               atol=1e-4)  # fmt: skip
    return model


def _fake_quantized(levels: int, per_channel: bool, w: np.ndarray = WEIGHT.T) -> onnx.ModelProto:
    """x @ Transpose(w), w [channels, K] rounded to `levels` symmetric levels (per output channel or per tensor) and
    stored as float32: a fake-quantized model folded for export, as QAT and ModelOpt leave their weights (with 4
    values a channel, as a small PyTorch Linear exports, the gaps between them span several levels)."""
    scales = np.abs(w).max(axis=1, keepdims=True) if per_channel else np.abs(w).max()
    step = scales / (levels // 2)
    nodes = [helper.make_node("Transpose", ["w"], ["wt"]), helper.make_node("MatMul", ["x", "wt"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", w.shape[1]])]
    return _model(nodes, [numpy_helper.from_array((np.round(w / step) * step).astype(np.float32), "w")], inputs)


@pytest.mark.parametrize(
    ("build", "found"),
    [
        pytest.param(lambda: _fake_quantized(255, per_channel=True),
                     "8-bit values stored as float32 (weight-only, activations in float: 1 MatMul node)",
                     id="int8-folded-per-channel"),
        pytest.param(lambda: _fake_quantized(255, per_channel=False),
                     "8-bit values stored as float32 (weight-only, activations in float: 1 MatMul node)",
                     id="int8-folded-per-tensor"),
        pytest.param(lambda: _fake_quantized(255, per_channel=True, w=WEIGHT.reshape(24, 4)[:8]),
                     "8-bit values stored as float32 (weight-only, activations in float: 1 MatMul node)",
                     id="int8-folded-4-values-per-channel"),
        pytest.param(lambda: _fake_quantized(15, per_channel=True),
                     "4-bit values stored as float32 (weight-only, activations in float: 1 MatMul node)",
                     id="int4-folded-per-channel"),
        pytest.param(lambda: _cast_integers(TensorProto.INT8),
                     "int8 (weight-only, activations in float: 1 MatMul node)",
                     id="int8-cast-scaled"),
        pytest.param(lambda: _cast_integers(TensorProto.INT8, scaled=False),
                     "int8 (weight-only, activations in float: 1 MatMul node)", id="int8-cast-scaled-after"),
        pytest.param(lambda: _matmul_nbits(4), "4-bit (weight-only, activations in float: 1 MatMulNBits node)",
                     id="nbits4"),
        pytest.param(lambda: _matmul_nbits(8), "8-bit (weight-only, activations in float: 1 MatMulNBits node)",
                     id="nbits8"),
        pytest.param(_gather_block_quantized, "4-bit (weight-only, activations in float: 1 GatherBlockQuantized node)",
                     id="gather-block-quantized"),
        pytest.param(lambda: _dequantized(TensorProto.INT4),
                     "int4 (weight-only, activations in float: 1 DequantizeLinear node)",
                     id="int4-dequantized"),
        pytest.param(lambda: _dequantized(TensorProto.UINT8),
                     "uint8 (weight-only, activations in float: 1 DequantizeLinear node)",
                     id="uint8-dequantized"),
        pytest.param(lambda: _dequantized(TensorProto.INT8),
                     "int8 (weight-only, activations in float: 1 DequantizeLinear node)",
                     id="int8-dequantized"),
        pytest.param(_float8_cast, "float8 (weight-only, activations in float: 1 Cast node)", id="float8-cast"),
        pytest.param(lambda: _float8_cast(cast_like=True),
                     "float8 (weight-only, activations in float: 1 CastLike node)", id="float8-cast-like"),
        pytest.param(lambda: _cast_integers(TensorProto.INT8, cast_like=True),
                     "int8 (weight-only, activations in float: 1 MatMul node)", id="int8-cast-like-scaled"),
    ],
)  # fmt: skip
def test_every_weight_only_low_bit_form_is_refused_alike(build, found: str) -> None:
    """MatMulNBits was refused as 'already quantized' while the same int4 weights behind a DequantizeLinear were
    accepted as an FP32 reference (int8 and float8 too): every drop then measured from a quantized baseline. An int8
    weight cast to float (and scaled) was taken for a mask, so such a reference passed as FP32 with no note at all, and
    so was one widened by CastLike(w, x) (a dynamo export of `q.type_as(x)`), int8 or float8, until 2026-11-29."""
    problem = reduced_precision(build())
    assert problem == (f"the model's weights are already quantized to {found}, so every drop would be measured from "
                       "that rounding; give the float model the weights were quantized from (before "
                       "MatMulNBitsQuantizer or the like)")  # fmt: skip


@pytest.mark.parametrize(("held", "widen"), [("initializer", "Cast"), ("initializer", "CastLike"), ("Constant", "Cast"),
                                            ("narrowed when run", "Cast"),
                                            ("transposed, narrowed when run", "Cast")])  # fmt: skip
def test_a_weight_stored_in_16_bits_is_still_accepted_with_its_note(held: str, widen: str) -> None:
    """A float16 weight widened by CastLike(w, x), held in a Constant node, or a float32 one the model narrows to
    float16 and back when it runs, computes as one an initializer's Cast widens: it went without the note, and the
    reference's figures were called those of an FP32 model. A float32 weight transposed before it is narrowed (an
    exporter's `w.T`) is the same weight: it went without the note too."""
    stored = numpy_helper.from_array(WEIGHT.astype(np.float16), "w_stored")
    nodes = [_widen("w_stored", "w", widen == "CastLike"), helper.make_node("MatMul", ["x", "w"], ["y"])]
    weights = [stored] if held == "initializer" else []
    if held == "Constant":
        nodes.insert(0, helper.make_node("Constant", [], ["w_stored"], value=stored))
    elif held == "narrowed when run":
        nodes.insert(0, helper.make_node("Cast", ["w_float"], ["w_stored"], to=TensorProto.FLOAT16))
        weights = [numpy_helper.from_array(WEIGHT, "w_float")]
    elif held == "transposed, narrowed when run":
        nodes[:0] = [helper.make_node("Transpose", ["w_float_t"], ["w_float"], perm=[1, 0]),
                     helper.make_node("Cast", ["w_float"], ["w_stored"], to=TensorProto.FLOAT16)]
        weights = [numpy_helper.from_array(np.ascontiguousarray(WEIGHT.T), "w_float_t")]
    model = _model(nodes, weights)
    expected = ROWS @ WEIGHT.astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(_run(model, {"x": ROWS}), expected, rtol=1e-5)
    assert reduced_precision(model) is None
    assert stored_weights(model).startswith(f"stores 1 weight in float16 ({widen}) and widens them to float")


def test_an_int16_weight_cast_to_float_is_accepted_with_its_note_and_a_cast_mask_or_range_is_no_weight() -> None:
    model = _cast_integers(TensorProto.INT16)
    assert reduced_precision(model) is None
    assert stored_weights(model).startswith("stores 1 weight in int16 (Cast) and widens them to float")
    mask = numpy_helper.from_array(np.ones((1, K), np.int8), "mask")
    positions = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.int32)))
                 for name, v in (("start", 0), ("limit", K), ("delta", 1))]  # fmt: skip
    nodes = [*positions, helper.make_node("Range", ["start", "limit", "delta"], ["ints"]),
             helper.make_node("Cast", ["ints"], ["floats"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["floats", "axis"], ["column"]),
             helper.make_node("MatMul", ["x", "column"], ["xp"]),
             helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "m"], ["xm"]),
             helper.make_node("MatMul", ["xm", "column"], ["xq"]),
             helper.make_node("Add", ["xp", "xq"], ["y"])]  # fmt: skip
    model = _model(nodes, [mask, numpy_helper.from_array(np.array([1], np.int64), "axis")])
    _run(model, {"x": ROWS})
    assert reduced_precision(model) is None
    assert stored_weights(model) is None


@pytest.mark.parametrize(
    "w", [WEIGHT, np.linspace(-1, 1, K * N, dtype=np.float32).reshape(K, N), np.full((K, N), 0.25, np.float32),
          np.arange(K * N, dtype=np.float32).reshape(K, N)], ids=["float", "ramp", "constant", "integers"],
)  # fmt: skip
def test_float_weights_on_no_rounding_grid_are_not_taken_for_quantized_ones(w: np.ndarray) -> None:
    """A ramp (a linspace: evenly spaced by construction, each value once), a constant or an integer table is on an
    even grid without having been rounded to one."""
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [numpy_helper.from_array(w, "w")])
    assert reduced_precision(model) is None


def test_validate_refuses_a_matmul_nbits_reference_in_one_line(tmp_path: Path, capsys) -> None:
    onnx.save(_matmul_nbits(4), str(tmp_path / "model.onnx"))
    pd.DataFrame({"x": list(ROWS)}).to_parquet(tmp_path / "rows.parquet")
    recipe = {"name": "nbits", "task": "embedding", "model": {"path": "model.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}},
              "variants": [{"name": "fp16", "precision": "fp16"}], "gate": {"metric": "cosine"}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["validate", str(tmp_path / "recipe.yaml")]) == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert line.startswith(f"error: {tmp_path / 'recipe.yaml'}: model.path: {tmp_path / 'model.onnx'}: the model's "
                           "weights are already quantized to 4-bit "
                           "(weight-only, activations in float: 1 MatMulNBits")  # fmt: skip
    assert "give the float model the weights were quantized from" in line


@pytest.mark.parametrize("shape", [(K, N), (K,)], ids=["matrix", "vector"])
def test_float_weights_with_one_enormous_value_are_not_taken_for_quantized_ones(shape: tuple[int, ...]) -> None:
    """One value a thousand times the others (an outlier weight, or the channel an activation outlier is scaled by):
    the grid of that magnitude over 7 put every other value within 1 % of level 0, so the float model was refused as
    '3-bit values stored as float32'. A quantized tensor holds one value per level; these hold 32 or more on 8."""
    w = np.random.default_rng(2).uniform(-0.25, 0.25, size=shape).astype(np.float32)
    w.flat[0] = -250.0
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [numpy_helper.from_array(w, "w")])
    _run(model, {"x": ROWS})
    assert reduced_precision(model) is None


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_weight_with_a_subnormal_value_is_judged_without_numpy_warnings() -> None:
    """A trained weight holding a subnormal float (1e-45 beside 0) leaves a grid step so small that the levels overflow
    float32: the check printed numpy's `RuntimeWarning: overflow encountered in divide` into a sweep's output (a
    scikit-learn MLP regressor's weights did). Such a step is no grid, and says so silently."""
    w = np.resize(np.concatenate([[0.0, 1e-45], WEIGHT.ravel()[:30]]).astype(np.float32), (K, N))  # 32 values
    assert w[0, 1] > 0  # the subnormal survives float32
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [numpy_helper.from_array(w, "w")])
    assert reduced_precision(model) is None


def test_embedding_rows_gathered_then_rounded_are_an_activation_not_a_stored_weight() -> None:
    """A float32 table's rows gathered by the fed ids and rounded to float16 and back: the rounding is of an
    activation (rounded_activations says so), not of a weight stored in 16 bits, though the table is a weight."""
    table = numpy_helper.from_array(WEIGHT, "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"]),
             helper.make_node("Cast", ["rows"], ["rows_half"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["rows_half"], ["y"], to=TensorProto.FLOAT)]  # fmt: skip
    model = _model(nodes, [table], [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])])

    assert stored_weights(model) is None
    assert rounded_activations(model).startswith("rounds 1 activation to float16 (Cast)")
