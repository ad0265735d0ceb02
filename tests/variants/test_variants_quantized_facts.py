"""What an INT8 variant's params say its quantized layers hold is what the built graph stores, read back here from the
built initializers directly, not the recipe's options (which a quantizer's rule for an op type may override)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.recipe.spec import VariantSpec
from qbench.variants import build_variant
from qbench.variants.base import BuildContext, BuiltVariant
from qbench.variants.quantized_facts import with_quantized_facts
from tests.variants.conftest import ORT_IR_VERSION
from tests.variants.test_variants_int8 import _fused_attention_model
from tests.variants.test_variants_integer_kernels import _rnn_classifier


def _initializers(path: Path) -> dict[str, np.ndarray]:
    return {tensor.name: numpy_helper.to_array(tensor) for tensor in onnx.load(str(path)).graph.initializer}


def _expected(values: np.ndarray, zeros: np.ndarray, axis: int) -> str:
    """The description of a stored weight, from its values and zero points (per channel along `axis` when there is
    more than one zero point; ONNX Runtime writes one zero point per scale). 7 bits: a centred range (zero point 0,
    or 64 / 128 for uint8) within 64 steps of its zero point, an asymmetric one within 127 steps, its zero points
    included."""
    middles = {0} if values.dtype.kind == "i" else {64, 128}
    centred = len(set(zeros.ravel().tolist())) == 1 and int(zeros.ravel()[0]) in middles
    if centred:
        seven = np.abs(values.astype(int) - int(zeros.ravel()[0])).max() <= 64
    else:
        seven = max(int(values.max()), int(zeros.max())) - min(int(values.min()), int(zeros.min())) <= 127
    granularity = f"per-channel (axis {axis})" if zeros.size > 1 else "per-tensor"
    return f"{values.dtype.name}, {7 if seven else 8}-bit, {granularity}, {'centred' if centred else 'asymmetric'}"


@pytest.mark.parametrize("weight_type", ["int8", "uint8"])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("reduce_range", [False, True])
def test_a_dynamic_lstm_records_the_weights_its_quantizer_wrote(weight_type, per_channel, reduce_range, tmp_path):
    """ONNX Runtime's LSTM handler (DynamicQuantizeLSTM) writes int8 weights whatever weight_type says: the params said
    weight_type: uint8 of an LSTM holding int8; now the LSTM's and the head's weights are recorded as stored, and the
    override is noted. A per-channel LSTM was also noted as 'left in float' (its [1, 32] float scale read as a
    weight)."""
    rng = np.random.default_rng(3)
    path = _rnn_classifier(tmp_path / "lstm.onnx", "LSTM", rng)
    spec = VariantSpec(name="q", precision="int8", calibrator="dynamic", weight_type=weight_type,
                       per_channel=per_channel, reduce_range=reduce_range)  # fmt: skip
    built = build_variant(spec, BuildContext(reference_path=path, workdir=tmp_path / "w", calibration=[]))
    stored = _initializers(built.onnx_path)
    nodes = {node.op_type: node for node in onnx.load(str(built.onnx_path)).graph.node}
    lstm, head = nodes["DynamicQuantizeLSTM"], nodes["MatMulInteger"]
    assert built.params["weights_as_built"] == {
        "LSTM": {_expected(stored[lstm.input[1]], stored[lstm.input[9]], 2): 1},
        "MatMul": {_expected(stored[head.input[1]], stored[head.input[3]], 1): 1},
    }
    assert built.params["activations_as_built"] == {"LSTM": {"dynamic (quantized per batch at run time)": 1},
                                                    "MatMul": {"dynamic (quantized per batch at run time)": 1}}  # fmt: skip
    assert stored[head.input[1]].dtype.name == weight_type
    lstm_notes = [note for note in built.notes if note.startswith("LSTM: ")]
    if stored[lstm.input[1]].dtype.name != weight_type:
        assert lstm_notes == ["LSTM: 1 of 1 node(s) hold int8 weights, though the "
                              f"variant's options say weight_type: {weight_type} "
                              "(the quantizer's own rule for LSTM decided)"]  # fmt: skip
    else:
        assert lstm_notes == []
    assert "float_contrib" not in built.params and not [note for note in built.notes if "left in float" in note]


def _conv_matmul(path: Path, rng: np.random.Generator) -> Path:
    """x [batch, 2, 6, 6] -> Conv (3 filters) -> Flatten -> MatMul [48, 5] -> y [batch, 5]."""
    weights = {"filters": rng.normal(size=(3, 2, 3, 3)), "head": rng.normal(size=(48, 5))}
    nodes = [helper.make_node("Conv", ["x", "filters"], ["c"], name="conv"),
             helper.make_node("Flatten", ["c"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "head"], ["y"], name="head")]  # fmt: skip
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
                              [numpy_helper.from_array(v.astype(np.float32), k)
                               for k, v in weights.items()])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ORT_IR_VERSION),
              str(path))  # fmt: skip
    return path


def _stored_weight(path: Path, op: str) -> tuple[np.ndarray, np.ndarray]:
    """The quantized values and zero points of `op`'s weight as the built graph stores them: read by the integer kernel
    (ConvInteger, MatMulInteger) or by the DequantizeLinear in front of the op."""
    stored = _initializers(path)
    nodes = onnx.load(str(path)).graph.node
    kernel = next((node for node in nodes if node.op_type == f"{op}Integer"), None)
    if kernel is not None:
        return stored[kernel.input[1]], stored[kernel.input[3]]
    reader = next(node for node in nodes if node.op_type == op)
    dequantize = next(node for node in nodes if node.op_type == "DequantizeLinear" and reader.input[1] in node.output)
    return stored[dequantize.input[0]], stored[dequantize.input[2]]


@pytest.mark.parametrize(("calibrator", "weight_type", "per_channel", "reduce_range"), [
    ("dynamic", "int8", True, False), ("dynamic", "uint8", False, True), ("dynamic", "int8", False, False),
    ("minmax", "int8", True, False), ("minmax", "uint8", False, True), ("minmax", "int8", True, True),
])  # fmt: skip
def test_conv_and_matmul_weights_are_recorded_as_stored(calibrator, weight_type, per_channel, reduce_range, tmp_path):
    """Static and dynamic INT8 of a Conv + MatMul graph: each layer's weights as the built initializers hold them.
    Dynamic INT8's ConvInteger is per tensor even with per_channel: true (ONNX Runtime's dynamic Conv handler), which
    the params said was per channel; now recorded and noted."""
    rng = np.random.default_rng(5)
    path = _conv_matmul(tmp_path / "cnn.onnx", rng)
    calibration = [{"x": rng.normal(size=(8, 2, 6, 6)).astype(np.float32)} for _ in range(2)]
    spec = VariantSpec(name="q", precision="int8", calibrator=calibrator, weight_type=weight_type,
                       per_channel=per_channel, reduce_range=reduce_range)  # fmt: skip
    built = build_variant(spec, BuildContext(reference_path=path, workdir=tmp_path / "w", calibration=calibration))
    expected = {op: {_expected(*_stored_weight(built.onnx_path, op), axis): 1}
                for op, axis in (("Conv", 0), ("MatMul", 1))}
    assert built.params["weights_as_built"] == expected
    mode = "dynamic (quantized per batch at run time)" if calibrator == "dynamic" else "static uint8, asymmetric"
    assert set(built.params["activations_as_built"]["Conv"]) <= {mode, "static uint8, centred"}
    conv_values, conv_zeros = _stored_weight(built.onnx_path, "Conv")
    assert conv_values.dtype.name == weight_type
    overridden = per_channel and conv_zeros.size == 1
    assert overridden == (calibrator == "dynamic" and per_channel)  # what ONNX Runtime 1.32 does
    noted = [note for note in built.notes if note.startswith("Conv: ")]
    assert noted == (["Conv: 1 of 1 node(s) hold per-tensor weights, "
                      "though the variant's options say per_channel: true (the quantizer's own rule for Conv decided)"]
                      if overridden else [])  # fmt: skip


def _qdq_conv(path: Path, activation_zero_point: int, *, float_weight: bool) -> onnx.ModelProto:
    """x -> Q/DQ (int8, the given zero point) -> Conv whose weight is int8 per channel, stored so or quantized from a
    float constant by a QuantizeLinear (as ModelOpt and torch exporters may leave it)."""
    rng = np.random.default_rng(2)
    floats = rng.normal(size=(4, 2, 3, 3)).astype(np.float32)
    scales = (np.abs(floats).reshape(4, -1).max(axis=1) / 127).astype(np.float32)
    quantized = np.rint(floats / scales[:, None, None, None]).astype(np.int8)
    constants = {"x_scale": np.float32(0.05), "x_zero": np.int8(activation_zero_point), "w_scale": scales,
                 "w_zero": np.zeros(4, np.int8)}  # fmt: skip
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "w_scale", "w_zero"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["y"], name="conv")]  # fmt: skip
    if float_weight:
        constants["w"] = floats
        nodes.insert(0, helper.make_node("QuantizeLinear", ["w", "w_scale", "w_zero"], ["wq"], axis=0))
    else:
        constants["wq"] = quantized
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ORT_IR_VERSION)
    onnx.save(model, str(path))
    return model


@pytest.mark.parametrize("float_weight", [False, True])
@pytest.mark.parametrize(("zero_point", "asked", "noted"), [(0, True, False), (5, True, True), (0, False, False)])
def test_activation_ranges_are_noted_only_where_the_graph_contradicts_the_recipe(float_weight, zero_point, asked, noted,
                                                                                  tmp_path):
    """An off-centre zero point proves an asymmetric range (noted against symmetric_activations: true); a centred one
    is what an asymmetric range calibrated on zero-centred data gets too, so it contradicts nothing. A weight quantized
    from a float constant in the graph is read as the values the session computes."""
    path = tmp_path / "qdq.onnx"
    model = _qdq_conv(path, zero_point, float_weight=float_weight)
    built = BuiltVariant(name="q", precision="int8", onnx_path=path,
                         params={"symmetric_activations": asked, "per_channel": True, "weight_type": "int8",
                                 "reduce_range": False, "activation_type": "int8"})  # fmt: skip
    facts = with_quantized_facts(built, model)
    assert facts.params["weights_as_built"] == {"Conv": {"int8, 8-bit, per-channel (axis 0), centred": 1}}
    centred = "centred" if zero_point == 0 else "asymmetric"
    assert facts.params["activations_as_built"] == {"Conv": {f"static int8, {centred}": 1}}
    assert list(facts.notes) == (["Conv: 1 of 1 node(s) hold asymmetric activations, though the variant's options say "
                                  "symmetric_activations: true (the quantizer's own rule for Conv decided)"] if noted
                                  else [])  # fmt: skip


@pytest.mark.parametrize(("weight_type", "per_channel"), [("int8", True), ("uint8", False)])
def test_a_qattention_records_its_packed_projection_as_stored(weight_type, per_channel, tmp_path):
    """Dynamic INT8 lowers a com.microsoft Attention to QAttention: its packed Q/K/V weight is recorded as stored."""
    rng = np.random.default_rng(8)
    path = _fused_attention_model(tmp_path / "attention.onnx", rng)
    feeds = {"x": rng.normal(size=(16, 6, 8)).astype(np.float32)}
    spec = VariantSpec(name="q", precision="int8", calibrator="dynamic", weight_type=weight_type,
                       per_channel=per_channel)  # fmt: skip
    built = build_variant(spec, BuildContext(reference_path=path, workdir=tmp_path / "w", calibration=[feeds]))
    stored = _initializers(built.onnx_path)
    attention = next(node for node in onnx.load(str(built.onnx_path)).graph.node if node.op_type == "QAttention")
    assert stored[attention.input[1]].dtype.name == weight_type
    assert built.params["weights_as_built"]["Attention"] == {_expected(stored[attention.input[1]], stored[attention.input[7]], 1): 1}
    assert built.params["activations_as_built"]["Attention"] == {"dynamic (quantized per batch at run time)": 1}
    assert not [note for note in built.notes if note.startswith("Attention: ")]


def test_fp8_weights_and_weights_inside_subgraphs_are_recorded(tmp_path):
    """An FP8 build's float8 weights are described (their type, granularity) and so are the quantized weights of an
    If branch; before, both builds had no weights_as_built at all."""
    from onnx import TensorProto, helper, numpy_helper

    from qbench.variants.base import BuiltVariant
    from qbench.variants.quantized_facts import with_quantized_facts

    weight = helper.make_tensor("wq", TensorProto.FLOAT8E4M3FN, [4, 4], np.linspace(-2, 2, 16).tolist())
    body = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
         helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
         helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"]), helper.make_node("MatMul", ["xd", "w"], ["m"])],
        "then", [], [helper.make_tensor_value_info("m", TensorProto.FLOAT, ["n", 4])],
        initializer=[weight, numpy_helper.from_array(np.array(0.1, np.float32), "ws")])  # fmt: skip
    nodes = [helper.make_node("ReduceSum", ["x"], ["r"], keepdims=0), helper.make_node("Greater", ["r", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=helper.make_graph(
                 [helper.make_node("Identity", ["x"], ["e"])], "else", [],
                 [helper.make_tensor_value_info("e", TensorProto.FLOAT, ["n", 4])]))]  # fmt: skip
    zero_point = helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0.0])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
                              initializer=[numpy_helper.from_array(np.array(0.05, np.float32), "s"), zero_point,
                                           numpy_helper.from_array(np.array(0, np.float32), "zero")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    built = with_quantized_facts(BuiltVariant(name="fp8", precision="fp8", onnx_path=tmp_path / "m.onnx"), model)
    assert built.params["weights_as_built"] == {"MatMul": {"float8_e4m3fn, per-tensor, centred": 1}}
    assert built.params["activations_as_built"] == {"MatMul": {"static float8_e4m3fn, centred": 1}}


def test_fp8_activations_quantized_without_a_zero_point_are_recorded_as_float8(mlp, tmp_path):
    """The FP8 builder writes QuantizeLinear with `output_dtype` float8_e4m3fn and no zero point; before, such an
    activation was recorded as "static uint8, asymmetric" (the operator's default type when no zero point is given)."""
    built = build_variant(VariantSpec(name="fp8", precision="fp8", calibrator="minmax"), mlp.context(tmp_path))
    model = onnx.load(str(built.onnx_path))
    quantize = [node for node in model.graph.node if node.op_type == "QuantizeLinear"]
    assert quantize and all(len(node.input) < 3 for node in quantize)  # what this test is about: no zero point
    assert built.params["activations_as_built"] == {"MatMul": {"static float8_e4m3fn, centred": 2}}


def test_a_lone_constant_at_the_far_end_of_its_range_is_not_called_7_bit(tmp_path):
    """Static INT8 of a regression head (MatMul -> Add of a one-value bias of -0.5): ONNX Runtime quantizes the bias as
    an activation, uint8 over [-0.5, 0], storing 0 at zero point 255, a full 8-bit range. Its one stored value spans no
    step, so it was described as 7-bit and noted against `reduce_range: false` (an sklearn MLPRegressor's INT8 build
    said `Add: 1 of 3 node(s) hold 7-bit weights`); the span now reaches the zero point, which every range holds."""
    rng = np.random.default_rng(0)
    constants = [numpy_helper.from_array(rng.normal(size=(3, 1)).astype(np.float32), "w"),
                 numpy_helper.from_array(np.array([-0.5], np.float32), "b")]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["y"], name="add")]  # fmt: skip
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
                              constants)  # fmt: skip
    path = tmp_path / "head.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ORT_IR_VERSION),
              str(path))  # fmt: skip
    spec = VariantSpec(name="q", precision="int8", calibrator="minmax", reduce_range=False)
    calibration = [{"x": rng.normal(size=(8, 3)).astype(np.float32)}]
    built = build_variant(spec, BuildContext(reference_path=path, workdir=tmp_path / "w", calibration=calibration))
    values, zeros = _stored_weight(built.onnx_path, "Add")
    assert (values.tolist(), int(zeros)) == ([0], 255)  # what ONNX Runtime 1.32 stores
    assert built.params["weights_as_built"]["Add"] == {"uint8, 8-bit, per-tensor, asymmetric": 1}
    assert [note for note in built.notes if "bit weights" in note] == []
