"""An INT8 variant is INT8 only where ONNX Runtime runs integer arithmetic, not wherever Q/DQ rounds data.

Q/DQ around ops that only move or select values (Concat, ArgMax, Reshape, MaxPool...) rounds them but runs no
integer arithmetic: such a variant computes in FP32 and must say so. The counts are checked against ONNX Runtime
itself: the graph its CPU provider optimises (saved with `optimized_model_filepath`) names the integer kernels
it runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.recipe.spec import VariantSpec
from qbench.variants import BuildContext, build_variant
from qbench.variants.base import BuiltVariant, lowered_nothing
from qbench.variants.integer_kernels import rounded_only, rule_kernel_counts, with_integer_kernels
from tests.variants.conftest import ORT_IR_VERSION, ort_integer_kernels


def _qdq(name: str, out: str, zero_point: str = "z") -> list[onnx.NodeProto]:
    return [helper.make_node("QuantizeLinear", [name, "s", zero_point], [f"{name}_q"]),
            helper.make_node("DequantizeLinear", [f"{name}_q", "s", zero_point], [out])]  # fmt: skip


def _flat_qdq() -> list[onnx.NodeProto]:
    """x flattened to [2, 16] and rounded: a Gemm's input."""
    return [helper.make_node("Flatten", ["x"], ["f"]), *_qdq("f", "fd")]


def _weight(name: str) -> onnx.NodeProto:
    return helper.make_node("DequantizeLinear", [f"{name}_i8", "ws", "wz"], [name])


# Hand-written Q/DQ graphs over x [2, 1, 4, 4] -> y: (nodes, y's shape).
QDQ_GRAPHS = {
    "concat_argmax": ([*_qdq("x", "xd"), helper.make_node("Concat", ["xd", "xd"], ["c"], axis=1), *_qdq("c", "cd"),
                       helper.make_node("ArgMax", ["cd"], ["y"], axis=1)], [2, 1, 4, 4]),
    "reshape_maxpool": ([*_qdq("x", "xd"), helper.make_node("MaxPool", ["xd"], ["p"], kernel_shape=[2, 2]),
                         *_qdq("p", "pd"), helper.make_node("Flatten", ["pd"], ["f"]), *_qdq("f", "y")], [2, 9]),
    "conv_requantized": ([*_qdq("x", "xd"), _weight("cw"), helper.make_node("Conv", ["xd", "cw"], ["c"]),
                          *_qdq("c", "y")], [2, 2, 2, 2]),
    "conv_float_output": ([*_qdq("x", "xd"), _weight("cw"), helper.make_node("Conv", ["xd", "cw"], ["y"])],
                          [2, 2, 2, 2]),
    "matmul_float_output": ([*_qdq("x", "xd"), _weight("mw"), helper.make_node("MatMul", ["xd", "mw"], ["y"])],
                            [2, 1, 4, 4]),
    "matmul_float_operand": ([*_qdq("x", "xd"), helper.make_node("MatMul", ["xd", "x"], ["y"])], [2, 1, 4, 4]),
    "layernorm_requantized": ([*_qdq("x", "xd"), helper.make_node("LayerNormalization", ["xd", "g", "b"], ["n"]),
                               *_qdq("n", "y")], [2, 1, 4, 4]),
    "add_requantized": ([*_qdq("x", "xd"), helper.make_node("Add", ["xd", "xd"], ["a"]), *_qdq("a", "y")],
                        [2, 1, 4, 4]),
    # torchao's PT2E export: a Relu before a Q whose zero point is its type's minimum is redundant, and removed
    "conv_relu_requantized_at_zero": ([*_qdq("x", "xd"), _weight("cw"),
                                       helper.make_node("Conv", ["xd", "cw", "cb"], ["c"]),
                                       helper.make_node("Relu", ["c"], ["r"]), *_qdq("r", "y", "z0")], [2, 2, 2, 2]),
    # ModelOpt's symmetric ranges: the Relu is not redundant, ORT fuses it into a float FusedConv / FusedGemm
    "conv_relu_requantized": ([*_qdq("x", "xd"), _weight("cw"), helper.make_node("Conv", ["xd", "cw"], ["c"]),
                               helper.make_node("Relu", ["c"], ["r"]), *_qdq("r", "y")], [2, 2, 2, 2]),
    "gemm_relu_requantized": ([*_flat_qdq(), _weight("gw"), helper.make_node("Gemm", ["fd", "gw"], ["c"]),
                               helper.make_node("Relu", ["c"], ["r"]), *_qdq("r", "y")], [2, 3]),
    "gemm_relu_float_output": ([*_flat_qdq(), _weight("gw"), helper.make_node("Gemm", ["fd", "gw"], ["c"]),
                                helper.make_node("Relu", ["c"], ["y"])], [2, 3]),
    # nn.Linear as torchao and ModelOpt export it: a float bias, which ORT quantizes only for a re-quantized output
    "gemm_float_bias_float_output": ([*_flat_qdq(), _weight("gw"), helper.make_node("Gemm", ["fd", "gw", "gb"], ["y"])],
                                     [2, 3]),
    "gemm_float_bias_requantized": ([*_flat_qdq(), _weight("gw"), helper.make_node("Gemm", ["fd", "gw", "gb"], ["c"]),
                                     *_qdq("c", "y")], [2, 3]),
    # a float-output Linear whose only reader is a Relu or Clip read by one float node: ORT fuses the activation into a
    # float op (found by fuzzing: SmoothQuant left a MatMul -> Clip -> Pad float, and it was counted as
    # MatMulIntegerToFloat)
    "matmul_clip_pad": ([*_qdq("x", "xd"), _weight("mw"), helper.make_node("MatMul", ["xd", "mw"], ["m"]),
                         helper.make_node("Clip", ["m", "lo", "hi"], ["c"]),
                         helper.make_node("Pad", ["c", "pads"], ["y"])],
                        [2, 1, 4, 6]),
    "matmul_relu_tanh": ([*_qdq("x", "xd"), _weight("mw"), helper.make_node("MatMul", ["xd", "mw"], ["m"]),
                          helper.make_node("Relu", ["m"], ["r"]), helper.make_node("Tanh", ["r"], ["y"])],
                          [2, 1, 4, 4]),
    "gemm_relu_tanh": ([*_flat_qdq(), _weight("gw"), helper.make_node("Gemm", ["fd", "gw"], ["c"]),
                        helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Tanh", ["r"], ["y"])], [2, 3]),
    "matmul_relu_two_readers": ([*_qdq("x", "xd"), _weight("mw"), helper.make_node("MatMul", ["xd", "mw"], ["m"]),
                                 helper.make_node("Relu", ["m"], ["r"]), helper.make_node("Tanh", ["r"], ["t"]),
                                 helper.make_node("Sigmoid", ["r"], ["sg"]),
                                 helper.make_node("Add", ["t", "sg"], ["y"])],
                                [2, 1, 4, 4]),
    # a float-output MatMul on a 2-D input read only by the Add of a float bias: ORT fuses the two into a float Gemm
    # (SmoothQuant, `linear`, QAT and ModelOpt Linears), yet the graph rules count it as MatMulIntegerToFloat
    "matmul_float_bias_add_2d": ([*_flat_qdq(), _weight("gw"), helper.make_node("MatMul", ["fd", "gw"], ["m"]),
                                  helper.make_node("Add", ["m", "gb"], ["y"])], [2, 3]),
    "matmul_float_bias_add_4d": ([*_qdq("x", "xd"), _weight("mw"), helper.make_node("MatMul", ["xd", "mw"], ["m"]),
                                  helper.make_node("Add", ["m", "b"], ["y"])], [2, 1, 4, 4]),
    "matmul_dynamically_quantized": ([helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
                                      helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]), _weight("mw"),
                                      helper.make_node("MatMul", ["xd", "mw"], ["y"])], [2, 1, 4, 4]),
}  # fmt: skip


def _qdq_model(case: str) -> onnx.ModelProto:
    nodes, shape = QDQ_GRAPHS[case]
    rng = np.random.default_rng(0)
    constants = {
        "s": np.array(0.05, np.float32), "z": np.array(128, np.uint8), "z0": np.array(0, np.uint8),
        "ws": np.array(0.02, np.float32), "wz": np.array(0, np.int8),
        "cw_i8": rng.integers(-50, 50, (2, 1, 3, 3)).astype(np.int8), "cb": rng.normal(size=2).astype(np.float32),
        "mw_i8": rng.integers(-50, 50, (4, 4)).astype(np.int8), "gw_i8": rng.integers(-50, 50, (16, 3)).astype(np.int8),
        "gb": rng.normal(size=3).astype(np.float32), "g": np.ones(4, np.float32), "b": np.zeros(4, np.float32),
        "lo": np.array(-1, np.float32), "hi": np.array(1, np.float32),
        "pads": np.array([0, 0, 0, 1, 0, 0, 0, 1], np.int64),
    }  # fmt: skip
    used = {name for node in nodes for name in node.input}
    graph = helper.make_graph(
        nodes, case, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT64 if case == "concat_argmax" else TensorProto.FLOAT,
                                       shape)],
        initializer=[numpy_helper.from_array(value, name) for name, value in constants.items() if name in used],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ORT_IR_VERSION)


def _counted(model: onnx.ModelProto, path: Path) -> BuiltVariant:
    onnx.save(model, str(path))
    return with_integer_kernels(BuiltVariant(name="int8", precision="int8", onnx_path=path), model)


@pytest.mark.parametrize("case", sorted(QDQ_GRAPHS))
def test_integer_kernels_are_counted_as_onnx_runtime_runs_them(tmp_path, case):
    model = _qdq_model(case)
    built = _counted(model, tmp_path / "qdq.onnx")
    expected = ort_integer_kernels(built.onnx_path, tmp_path)
    assert built.params["integer_kernels_from"] == "onnxruntime" and built.params["quantized_nodes"] == expected
    assert sum(rule_kernel_counts(model).values()) == expected


def test_a_linear_with_a_float_bias_add_on_a_2d_input_runs_in_float(tmp_path):
    """ONNX Runtime fuses MatMul + Add into a float Gemm: counted as {MatMul: 1}, the variant read as INT8."""
    built = _counted(_qdq_model("matmul_float_bias_add_2d"), tmp_path / "qdq.onnx")
    assert built.params["quantized_op_types"] == {} and lowered_nothing(built.params)
    assert any(note.startswith("no node computes in INT8") for note in built.notes)


def test_kernels_are_counted_under_the_op_types_they_replace(tmp_path):
    """ONNX Runtime names a kernel after the node it replaces; unnamed nodes are named in a copy (the saved model
    is left as it was), so QLinearMatMul is counted as the MatMul it runs."""
    model = _qdq_model("matmul_float_output")
    model.graph.node.append(helper.make_node("Identity", ["y"], ["y2"]))
    model.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, [2, 1, 4, 4]))
    built = _counted(model, tmp_path / "qdq.onnx")
    assert built.params["quantized_op_types"] == {"MatMul": 1}
    assert all(not node.name for node in onnx.load(str(built.onnx_path)).graph.node)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qdq.onnx"]


def test_without_onnx_runtime_the_graph_rules_count_and_say_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    built = _counted(_qdq_model("conv_requantized"), tmp_path / "qdq.onnx")
    assert built.params["quantized_op_types"] == {"Conv": 1}
    assert built.params["integer_kernels_from"].startswith("graph rules")
    assert any(note.startswith("integer kernels counted by qbench's graph rules") for note in built.notes)


def test_what_a_graph_without_integer_kernels_rounds_is_named():
    model = _qdq_model("concat_argmax")
    assert rule_kernel_counts(model) == {} and rounded_only(model) == {"ArgMax": 1, "Concat": 1}


def _concat_argmax(path: Path) -> Path:
    """Two inputs joined and the larger column picked: scores through Concat and ArgMax, no arithmetic."""
    graph = helper.make_graph(
        [helper.make_node("Concat", ["a", "b"], ["scores"], axis=1, name="join"),
         helper.make_node("ArgMax", ["scores"], ["label"], axis=1, keepdims=0, name="pick")],
        "vote", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2]) for n in "ab"],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"])],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ORT_IR_VERSION),
              str(path))
    return path


@pytest.mark.parametrize("calibrator", ["minmax", "entropy"])
def test_a_graph_that_only_moves_and_selects_is_the_fp32_model(tmp_path, calibrator):
    """Q/DQ was put on the Concat and the ArgMax and the variant reported as INT8 ({ArgMax: 1, Concat: 1}), though
    ONNX Runtime runs no integer arithmetic there: now it is the FP32 model, and says why."""
    path = _concat_argmax(tmp_path / "vote.onnx")
    rng = np.random.default_rng(0)
    calibration = [{"a": rng.normal(size=(16, 2)).astype(np.float32), "b": rng.normal(size=(16, 2)).astype(np.float32)}]
    built = build_variant(VariantSpec(name="int8", precision="int8", calibrator=calibrator),
                          BuildContext(reference_path=path, workdir=tmp_path / "w",
                                       calibration=calibration))  # fmt: skip
    assert built.onnx_path == path.resolve() and lowered_nothing(built.params)
    assert built.params["quantized_op_types"] == {}
    assert built.notes == ("nothing to quantize (Q/DQ on ArgMax, Concat would only round data that ONNX Runtime moves, "
                           "selects or computes in float: no integer arithmetic): the variant is the FP32 model",
                           )  # fmt: skip


def test_a_nearest_neighbours_classifier_is_the_fp32_model(tmp_path):
    """skl2onnx's KNeighborsClassifier: distances inside a Scan, the neighbours' votes through Concat and ArgMax. Static
    INT8 put Q/DQ on the votes only (outputs bit-identical to FP32) and reported the variant as INT8."""
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.datasets import make_classification
    from sklearn.neighbors import KNeighborsClassifier

    x, y = make_classification(n_samples=120, n_features=6, n_informative=4, n_classes=3, random_state=0)
    x = x.astype(np.float32)
    onx = skl2onnx.to_onnx(KNeighborsClassifier(3).fit(x, y), x[:1], options={"zipmap": False},
                           target_opset={"": 17, "ai.onnx.ml": 3})  # fmt: skip
    path = tmp_path / "knn.onnx"
    onnx.save(onx, str(path))
    calibration = [{"X": x[i : i + 32]} for i in range(0, 96, 32)]
    built = build_variant(VariantSpec(name="int8", precision="int8", calibrator="minmax"),
                          BuildContext(reference_path=path, workdir=tmp_path / "w",
                                       calibration=calibration))  # fmt: skip
    assert built.onnx_path == path.resolve() and lowered_nothing(built.params)
    assert "no integer arithmetic" in built.params["unchanged"] and "Concat" in built.params["unchanged"]


@pytest.mark.parametrize("calibrator", ["minmax", "dynamic"])
def test_a_cnn_is_int8_exactly_where_onnx_runtime_runs_integer_kernels(digits_cnn, tmp_path, calibrator):
    """Its Flatten reads a dequantized tensor too, and was counted as quantized; it only moves the data."""
    built = build_variant(VariantSpec(name="int8", precision="int8", calibrator=calibrator),
                          digits_cnn.context(tmp_path))
    assert not lowered_nothing(built.params) and "Flatten" not in built.params["quantized_op_types"]
    assert built.params["quantized_nodes"] == ort_integer_kernels(built.onnx_path, tmp_path)


def test_an_attention_block_is_int8_where_onnx_runtime_runs_integer_kernels(graph, tmp_path):
    """Projections, scores, Softmax and LayerNormalization: every quantized MatMul and the Softmax run as integer
    kernels; LayerNormalization runs in float on its dequantized input and is not counted."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
        helper.make_node("Transpose", ["k"], ["kt"], name="kt"),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        helper.make_node("Softmax", ["s"], ["p"], name="softmax"),
        helper.make_node("MatMul", ["p", "x"], ["o"], name="mix"),
        helper.make_node("LayerNormalization", ["o", "g", "b"], ["y"], name="norm"),
    ]
    weights = {"wq": rng.normal(size=(8, 8)).astype(np.float32), "wk": rng.normal(size=(8, 8)).astype(np.float32),
               "g": np.ones(8, np.float32), "b": np.zeros(8, np.float32)}  # fmt: skip
    path = graph(tmp_path / "attention.onnx", nodes, weights, {"x": 8}, {"y": 8})
    calibration = [{"x": rng.normal(size=(8, 8)).astype(np.float32)} for _ in range(4)]
    built = build_variant(VariantSpec(name="int8", precision="int8", calibrator="minmax"),
                          BuildContext(reference_path=path, workdir=tmp_path / "w",
                                       calibration=calibration))  # fmt: skip
    assert not lowered_nothing(built.params) and "LayerNormalization" not in built.params["quantized_op_types"]
    assert built.params["quantized_nodes"] == ort_integer_kernels(built.onnx_path, tmp_path) > 0


def _torch_model(kind: str, tmp_path: Path) -> tuple[BuildContext, np.ndarray]:
    """A small CNN or MLP given as model.torch (untrained: only the graphs matter), its FP32 export as the reference,
    and the context every INT8 technique builds from."""
    torch = pytest.importorskip("torch")
    from qbench.sources.torch_model import TorchModel
    from qbench.variants.base import TrainingData

    nn = torch.nn
    torch.manual_seed(0)
    if kind == "cnn":
        module, shape = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2, padding=1),
                                      nn.ReLU(), nn.Flatten(), nn.Linear(36, 3)), (1, 1, 6, 6)  # fmt: skip
    else:
        module, shape = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 3)), (1, 8)
    source = TorchModel(factory="tests:integer_kernels", input_shapes={"x": shape}, input_dtypes={"x": "float32"},
                        output_names=("y",), opset=17, cache_key=kind, _template=module.eval())  # fmt: skip
    reference = source.export(source.build(), tmp_path / f"{kind}.onnx")
    rows = np.random.default_rng(0).random((64, *shape[1:]), dtype=np.float32)
    training = TrainingData(feeds={"x": rows}, labels=np.arange(64) % 3)
    calibration = [{"x": rows[i : i + 32]} for i in (0, 32)]
    return BuildContext(reference_path=reference, workdir=tmp_path / "w", calibration=calibration, torch_model=source,
                        training=training), rows  # fmt: skip


@pytest.mark.parametrize("kind", ["cnn", "mlp"])
def test_a_qat_variant_counts_what_onnx_runtime_runs_as_integer_kernels(tmp_path, kind):
    """torchao's export keeps nn.Linear's float bias: its last Gemm (and a Gemm before a GELU) runs as a float Gemm,
    yet was counted as quantized; its Conv -> Relu -> Q runs as QLinearConv (the Relu is redundant) and was counted
    from the Q/DQ, not from what ONNX Runtime fuses."""
    pytest.importorskip("torchao")
    ctx, _ = _torch_model(kind, tmp_path)
    spec = VariantSpec.model_validate({"name": "qat", "precision": "int8", "calibrator": "minmax",
                                       "qat": {"epochs": 1, "lr": 1e-3, "batch_size": 32}})  # fmt: skip
    built = build_variant(spec, ctx)
    assert built.params["quantized_nodes"] == ort_integer_kernels(built.onnx_path, tmp_path) > 0
    assert "Gemm" not in built.params["quantized_op_types"] if kind == "cnn" else built.params["quantized_op_types"] == {"Gemm": 1}


@pytest.mark.parametrize("kind", ["cnn", "mlp"])
def test_a_modelopt_int8_variant_without_integer_kernels_is_the_fp32_model(tmp_path, kind):
    """ModelOpt rounds each layer's inputs only, on symmetric ranges: ONNX Runtime fuses the Relus into float Convs and
    Gemms and runs every layer in FP32. It was reported as INT8 ({Conv: 2, Gemm: 1} / {Gemm: 3}), its pass read as an
    INT8 pass; now it is the FP32 model, and says so."""
    pytest.importorskip("modelopt")
    ctx, _ = _torch_model(kind, tmp_path)
    spec = VariantSpec.model_validate({"name": "mo", "precision": "int8", "quantizer": "modelopt",
                                       "calibrator": "minmax"})
    built = build_variant(spec, ctx)
    assert ort_integer_kernels(built.onnx_path, tmp_path) == 0
    assert lowered_nothing(built.params) and built.params["quantized_op_types"] == {}
    assert "Gemm" in built.params["rounded_only"]
    assert any(note.startswith("no node computes in INT8") and note.endswith("computes in FP32")
               for note in built.notes)


def _rnn_classifier(path: Path, op: str, rng: np.random.Generator, *, bias: bool = False,
                    in_branch: bool = False) -> Path:
    """x [batch, 5 steps, 3] -> an ONNX LSTM/GRU of 8 units (time-major, as ONNX Runtime's CPU runs it), with a bias
    [1, 2 x gates x hidden] as torch exports it if `bias` -> its last state @ head -> y [batch, 2]: the recurrent
    layer holds most of the weights. With `in_branch`, the layer sits in both branches of an If (rows > 0), reading
    the outer weights by name."""
    hidden, gates = 8, {"LSTM": 4, "GRU": 3}[op]
    weights = {"w": rng.normal(0, 0.5, (1, gates * hidden, 3)), "r": rng.normal(0, 0.3, (1, gates * hidden, hidden)),
               "head": rng.normal(0, 1, (hidden, 2))}  # fmt: skip
    if bias:
        weights["b"] = rng.normal(0, 0.1, (1, 2 * gates * hidden))
    def rnn(state: str, name: str) -> onnx.NodeProto:
        return helper.make_node(op, ["steps", "w", "r", *(["b"] if bias else [])], ["", state], hidden_size=hidden,
                                name=name)

    def branch(name: str) -> onnx.GraphProto:
        return helper.make_graph([rnn(f"{name}_state", f"{name}_rnn")], name, [],
                                 [helper.make_tensor_value_info(f"{name}_state", TensorProto.FLOAT, None)])

    recurrent = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
                 helper.make_node("ReduceProd", ["shape"], ["size"], keepdims=0, name="size"),
                 helper.make_node("Greater", ["size", "zero"], ["rows"], name="rows"),
                 helper.make_node("If", ["rows"], ["state"], then_branch=branch("then"), else_branch=branch("else"),
                                  name="branch")] if in_branch else [rnn("state", "rnn")]  # fmt: skip
    weights["zero"] = np.array(0, np.int64)
    nodes = [helper.make_node("Transpose", ["x"], ["steps"], perm=[1, 0, 2], name="time_major"), *recurrent,
             helper.make_node("Squeeze", ["state", "axis0"], ["last"], name="last"),
             helper.make_node("MatMul", ["last", "head"], ["y"], name="classify")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "rnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [*(numpy_helper.from_array(v if k == "zero" else v.astype(np.float32), k) for k, v in weights.items()),
         numpy_helper.from_array(np.array([0], np.int64), "axis0")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ORT_IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize(("op", "precision", "calibrator", "left_float", "bias"), [
    ("LSTM", "int8", "minmax", {"LSTM": 1}, False), ("LSTM", "int8", "dynamic", None, False),
    ("LSTM", "int8", "dynamic", None, True), ("GRU", "int8", "dynamic", {"GRU": 1}, False),
    ("GRU", "fp8", "minmax", {"GRU": 1}, False),
])  # fmt: skip
def test_a_recurrent_layer_left_float_is_counted_and_noted(tmp_path, op, precision, calibrator, left_float, bias):
    """Static INT8 and FP8 of an RNN classifier quantized its head only, and dynamic INT8 of a GRU the same, yet the
    variant read as INT8 / FP8 with nothing left out ({MatMul: 1}); dynamic INT8 does lower an LSTM, and with a
    bias (every torch nn.LSTM export has one) its DynamicQuantizeLSTM was noted as a com.microsoft layer "left in
    float, weights included": it reads the float bias matrix, but it is the quantized LSTM."""
    rng = np.random.default_rng(3)
    path = _rnn_classifier(tmp_path / f"{op}.onnx", op, rng, bias=bias)
    calibration = [{"x": rng.normal(size=(16, 5, 3)).astype(np.float32)} for _ in range(2)]
    built = build_variant(VariantSpec(name="q", precision=precision, calibrator=calibrator),
                          BuildContext(reference_path=path, workdir=tmp_path / "w",
                                       calibration=calibration))  # fmt: skip
    saved = [node.op_type for node in onnx.load(str(built.onnx_path)).graph.node]
    assert built.params.get("float_recurrent") == left_float
    assert saved.count(op) == (left_float or {}).get(op, 0)  # counted from the saved graph
    assert "float_contrib" not in built.params
    noted = [note for note in built.notes if "left in float, weights included" in note]
    assert noted == ([] if left_float is None else [f"1 {op} left in float, weights included: of ONNX Runtime's "
                                                    "quantizers only dynamic INT8 lowers a recurrent layer (LSTM, as "
                                                    "DynamicQuantizeLSTM)"])  # fmt: skip


@pytest.mark.parametrize(("precision", "calibrator"), [("int8", "minmax"), ("int8", "dynamic"), ("fp8", "minmax")])
def test_a_recurrent_layer_inside_control_flow_is_counted_and_noted(tmp_path, precision, calibrator):
    """The count walked the main graph only: with the LSTMs in an If's branches, which every quantizer leaves float,
    the variant read as INT8 / FP8 (its head MatMul quantized) with no layer left float, and the subgraph note
    counts MatMul/Gemm/Conv only."""
    rng = np.random.default_rng(3)
    path = _rnn_classifier(tmp_path / "branch.onnx", "LSTM", rng, bias=True, in_branch=True)
    calibration = [{"x": rng.normal(size=(16, 5, 3)).astype(np.float32)} for _ in range(2)]
    built = build_variant(VariantSpec(name="q", precision=precision, calibrator=calibrator),
                          BuildContext(reference_path=path, workdir=tmp_path / "w",
                                       calibration=calibration))  # fmt: skip
    saved = onnx.load(str(built.onnx_path))
    branches = [node for branch in saved.graph.node if branch.op_type == "If" for graph in
                (helper.get_attribute_value(a) for a in branch.attribute) for node in graph.node]  # fmt: skip
    assert [node.op_type for node in branches] == ["LSTM", "LSTM"]  # what the build left float, read from the file
    assert built.params["quantized_op_types"]  # the head was quantized: the variant is not the FP32 model
    assert built.params.get("float_recurrent") == {"LSTM": 2}
    assert any(note.startswith("2 LSTM left in float, weights included (2 inside control-flow subgraphs")
               for note in built.notes), built.notes  # fmt: skip


def _fused_transformer_block(path: Path, fused: str, rng: np.random.Generator) -> Path:
    """x [batch, 4, 8] -> a com.microsoft operator with a weight matrix, as ONNX Runtime's transformer optimizer and
    its saved optimised graphs write them (Attention with its packed Q/K/V projection [8, 24], or FusedMatMul with a
    [8, 8] weight) -> ReduceMean over tokens -> a standard MatMul head -> y [batch, 2]."""
    weights = {"head": rng.normal(0, 1, (8, 2))}
    if fused == "Attention":
        weights |= {"qkv": rng.normal(0, 0.5, (8, 24)), "qkv_bias": rng.normal(0, 0.1, (24,))}
        block = helper.make_node("Attention", ["x", "qkv", "qkv_bias"], ["mixed"], domain="com.microsoft", num_heads=2)
    else:
        weights |= {"w": rng.normal(0, 0.5, (8, 8))}
        block = helper.make_node("FusedMatMul", ["x", "w"], ["mixed"], domain="com.microsoft", alpha=0.5)
    nodes = [block, helper.make_node("ReduceMean", ["mixed"], ["pooled"], axes=[1], keepdims=0, name="pool"),
             helper.make_node("MatMul", ["pooled", "head"], ["y"], name="classify")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "fused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=ORT_IR_VERSION), str(path))
    return path


@pytest.mark.parametrize(("fused", "precision", "calibrator"), [
    ("Attention", "int8", "minmax"), ("Attention", "fp8", "minmax"), ("FusedMatMul", "int8", "minmax"),
    ("FusedMatMul", "int8", "dynamic"),
])  # fmt: skip
def test_a_fused_contrib_layer_left_float_is_counted_and_noted(tmp_path, fused, precision, calibrator):
    """An optimised BERT's static INT8 / FP8 quantized the MatMuls around its com.microsoft Attention only (that holds
    the Q/K/V projections), yet read as INT8 / FP8 with nothing left out ({MatMul: 1}, no note). (Dynamic INT8 lowers
    the Attention to QAttention: test_variants_int8.)"""
    rng = np.random.default_rng(4)
    path = _fused_transformer_block(tmp_path / f"{fused}.onnx", fused, rng)
    calibration = [{"x": rng.normal(size=(16, 4, 8)).astype(np.float32)} for _ in range(2)]
    built = build_variant(VariantSpec(name="q", precision=precision, calibrator=calibrator),
                          BuildContext(reference_path=path, workdir=tmp_path / "w",
                                       calibration=calibration))  # fmt: skip
    saved = [node.op_type for node in onnx.load(str(built.onnx_path)).graph.node]
    assert saved.count(fused) == 1  # left float in the saved graph
    assert built.params["float_contrib"] == {f"{fused} (com.microsoft)": 1}
    assert f"1 {fused} (com.microsoft) left in float, weights included: only standard ONNX operators are quantized," in (
        " ".join(built.notes)
    )


NAMED = ["MatMul", "EmbedLayerNormalization"]


@pytest.mark.parametrize(("calibrator", "op_types", "counted", "embedding", "attributes"), [
    ("minmax", None, {"MatMul": 1}, "EmbedLayerNormalization", {}),
    ("dynamic", None, {"MatMulInteger": 1}, "EmbedLayerNormalization", {}),
    ("dynamic", NAMED, {"MatMulInteger": 1}, "QEmbedLayerNormalization", {}),
    ("dynamic", NAMED, {"MatMulInteger": 1}, "EmbedLayerNormalization", {"mask_index_type": 1}),
])  # fmt: skip
def test_a_fused_embedding_lookup_is_no_weight_left_float(tmp_path, calibrator, op_types, counted, embedding,
                                                          attributes):
    """EmbedLayerNormalization reads rows of its tables (as a Gather does): nothing there to quantize, so no
    `float_contrib` note. By default it stays float, as any table lookup (`lookups_kept_float`): 8-bit tables cost
    accuracy and save no time. Named in op_types, dynamic INT8 hands it to ONNX Runtime's quantizer: its tables are
    stored in 8 bits (QEmbedLayerNormalization), which is no integer arithmetic, so it is not counted as one. One
    with an attribute QEmbedLayerNormalization lacks (ONNX Runtime would refuse to load it) stays float."""
    rng = np.random.default_rng(5)
    tables = {"word": rng.normal(size=(10, 8)), "position": rng.normal(size=(4, 8)), "head": rng.normal(size=(8, 2))}
    constants = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in tables.items()]
    constants += [numpy_helper.from_array(np.ones(8, np.float32), "gamma"),
                  numpy_helper.from_array(np.zeros(8, np.float32), "beta")]  # fmt: skip
    nodes = [helper.make_node("EmbedLayerNormalization", ["ids", "", "word", "position", "", "gamma", "beta"],
                              ["vectors", "mask_index"], domain="com.microsoft", epsilon=1e-5, **attributes),
             helper.make_node("ReduceMean", ["vectors"], ["pooled"], axes=[1], keepdims=0),
             helper.make_node("MatMul", ["pooled", "head"], ["y"], name="classify")]  # fmt: skip
    graph = helper.make_graph(nodes, "embed", [helper.make_tensor_value_info("ids", TensorProto.INT32, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
                              constants)  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=ORT_IR_VERSION), str(tmp_path / "e.onnx"))
    calibration = [{"ids": rng.integers(0, 10, size=(16, 4)).astype(np.int32)} for _ in range(2)]
    built = build_variant(VariantSpec(name="q", precision="int8", calibrator=calibrator, op_types=op_types),
                          BuildContext(reference_path=tmp_path / "e.onnx", workdir=tmp_path / "w",
                                       calibration=calibration))  # fmt: skip
    assert built.params["quantized_op_types"] == counted
    assert "float_contrib" not in built.params
    assert embedding in [node.op_type for node in onnx.load(str(built.onnx_path)).graph.node]
    assert built.params.get("lookups_kept_float") == (None if op_types else {"EmbedLayerNormalization": 1})


def _branch(name: str, x: str, requantized: bool) -> onnx.GraphProto:
    """An If branch computing MatMul(x, its own INT8 weight); `x` is Q/DQ'd in the branch unless it is read from
    outside ("xd"), the output re-quantized or left float."""
    nodes = [helper.make_node("DequantizeLinear", [f"{name}_wq", f"{name}_ws", f"{name}_wz"], [f"{name}_w"],
                              name=f"{name}_dw")]
    if x == "x":
        nodes += [helper.make_node("QuantizeLinear", ["x", f"{name}_s", f"{name}_z"], [f"{name}_xq"],
                                   name=f"{name}_qx"),
                  helper.make_node("DequantizeLinear", [f"{name}_xq", f"{name}_s", f"{name}_z"], [f"{name}_xd"],
                                   name=f"{name}_dx")]  # fmt: skip
        x = f"{name}_xd"
    nodes.append(helper.make_node("MatMul", [x, f"{name}_w"], [f"{name}_m"], name=f"{name}_mm"))
    out = f"{name}_m"
    if requantized:
        nodes += [helper.make_node("QuantizeLinear", [out, f"{name}_s", f"{name}_z"], [f"{name}_q"], name=f"{name}_qo"),
                  helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_o"],
                                   name=f"{name}_do")]  # fmt: skip
        out = f"{name}_o"
    constants = {f"{name}_wq": np.random.default_rng(1).integers(-50, 50, (4, 4)).astype(np.int8),
                 f"{name}_ws": np.array(0.02, np.float32), f"{name}_wz": np.array(0, np.int8),
                 f"{name}_s": np.array(0.05, np.float32), f"{name}_z": np.array(128, np.uint8)}  # fmt: skip
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["n", 4])],
                             initializer=[numpy_helper.from_array(value, key) for key, value in constants.items()])


def _if_model(x: str) -> onnx.ModelProto:
    """x [n, 4] -> If(sum(x) > 0) with a MatMul in each branch (one re-quantized, one float), `x` Q/DQ'd in the
    branches ("x") or outside them ("xd")."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dx"),
             helper.make_node("ReduceSum", ["x"], ["r"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["r", "zero"], ["c"], name="positive"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=_branch("then", x, True),
                              else_branch=_branch("else", x, False))]  # fmt: skip
    constants = {"s": np.array(0.05, np.float32), "z": np.array(128, np.uint8), "zero": np.array(0, np.float32)}
    graph = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
                              initializer=[numpy_helper.from_array(value, key) for key, value in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ORT_IR_VERSION)


@pytest.mark.parametrize(("x", "kernels"), [("x", 2), ("xd", 0)])
def test_integer_kernels_inside_subgraphs_are_counted_as_onnx_runtime_runs_them(tmp_path, x, kernels):
    """ONNX Runtime fuses Q/DQ inside an If branch (QLinearMatMul, MatMulIntegerToFloat) where the DequantizeLinears
    are in that branch; an activation dequantized outside it leaves the MatMul float (MatMulNBits, weight only)."""
    model = _if_model(x)
    built = _counted(model, tmp_path / "if.onnx")
    assert ort_integer_kernels(built.onnx_path, tmp_path) == kernels
    assert built.params["quantized_nodes"] == kernels and sum(rule_kernel_counts(model).values()) == kernels
    assert built.params["quantized_op_types"] == ({"MatMul": kernels} if kernels else {})
