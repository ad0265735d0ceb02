"""The reference must compute in FP32: an INT8 or FP16 model given as the reference is refused in one line, by what
its graph computes in (a weight stored in a smaller type and widened once is still an FP32 model)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.cli.app import main
from qbench.preflight.precision import reduced_precision, rounded_activations, stored_weights

ROWS = 64


def _linear(elem: int = TensorProto.FLOAT, nodes: list | None = None, weights: list | None = None) -> onnx.ModelProto:
    """x [batch, 4] -> logits [batch, 3] = x @ w + b, in `elem` (or the given nodes and weights)."""
    rng = np.random.default_rng(0)
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    weights = weights if weights is not None else [
        numpy_helper.from_array(rng.normal(size=(4, 3)).astype(dtype), "w"),
        numpy_helper.from_array(rng.normal(size=3).astype(dtype), "b"),
    ]  # fmt: skip
    nodes = nodes if nodes is not None else [
        helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["logits"]),
    ]  # fmt: skip
    graph = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", elem, ["batch", 4])],
                              [helper.make_tensor_value_info("logits", elem, ["batch", 3])], weights)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def _stored_weight(stored: int, widen: str) -> onnx.ModelProto:
    """An FP32 linear model whose weight is stored as `stored` and widened to float once (`widen`: Cast or
    DequantizeLinear)."""
    w = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    if widen == "Cast":
        stored_w = helper.make_tensor("w_stored", stored, [4, 3], w.astype(np.float16).tobytes(), raw=True) \
            if stored == TensorProto.FLOAT16 else helper.make_tensor("w_stored", stored, [4, 3], w.ravel().tolist())
        first = helper.make_node("Cast", ["w_stored"], ["w"], to=TensorProto.FLOAT)
        extra = []
    else:
        dtype = helper.tensor_dtype_to_np_dtype(stored)
        stored_w = numpy_helper.from_array(np.round(w * 4).astype(dtype), "w_stored")
        first = helper.make_node("DequantizeLinear", ["w_stored", "w_scale"], ["w"])
        extra = [numpy_helper.from_array(np.array(1 / 4, np.float32), "w_scale")]
    nodes = [first, helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["logits"])]
    return _linear(nodes=nodes, weights=[stored_w, numpy_helper.from_array(np.zeros(3, np.float32), "b"), *extra])


def _quantized(tmp_path: Path, kind: str) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static

    onnx.save(_linear(), str(tmp_path / "fp32.onnx"))
    rows = np.random.default_rng(1).normal(size=(16, 4)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": rows[i : i + 4]} for i in range(0, 16, 4)])

        def get_next(self) -> dict | None:
            return next(self.batches, None)

    target = tmp_path / f"{kind}.onnx"
    if kind == "dynamic":
        quantize_dynamic(tmp_path / "fp32.onnx", target)
    else:
        formats = {"qoperator": QuantFormat.QOperator, "qdq": QuantFormat.QDQ}
        quantize_static(tmp_path / "fp32.onnx", target, Reader(), quant_format=formats[kind])
    return onnx.load(str(target))


@pytest.mark.parametrize(
    ("kind", "found"),
    [
        ("qoperator", r"already quantized: 1 QLinearAdd, 1 QLinearMatMul, 1 DequantizeLinear, 1 QuantizeLinear nodes$"),
        ("qdq", r"already quantized: 3 DequantizeLinear, 3 QuantizeLinear nodes$"),
        ("dynamic", r"already quantized: .*1 MatMulInteger.* nodes"),
    ],
)
def test_an_int8_model_is_named_by_its_integer_nodes(tmp_path: Path, kind: str, found: str) -> None:
    problem = reduced_precision(_quantized(tmp_path, kind))
    assert problem is not None
    assert re.search(found, problem), problem


@pytest.mark.parametrize("elem", [TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_a_half_precision_model_is_named_by_its_nodes_and_io(elem: int) -> None:
    name = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}[elem]
    assert reduced_precision(_linear(elem)) == (f"the model already computes in {name}: 1 Add, 1 MatMul nodes; its "
                                                f"graph inputs/outputs x, logits are {name}")  # fmt: skip


def test_float16_compute_between_float32_io_is_found() -> None:
    """convert_float_to_float16(keep_io_types=True): float32 in and out, float16 inside."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    converted = convert_float_to_float16(_linear(), keep_io_types=True)
    assert reduced_precision(converted) == "the model already computes in float16: 1 Add, 1 MatMul nodes"


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(lambda: _linear(), id="float32"),
        pytest.param(lambda: _linear(TensorProto.DOUBLE), id="float64"),
        pytest.param(lambda: _stored_weight(TensorProto.BFLOAT16, "Cast"), id="bfloat16-weight-cast-to-float"),
        pytest.param(lambda: _stored_weight(TensorProto.FLOAT16, "Cast"), id="float16-weight-cast-to-float"),
        pytest.param(lambda: _stored_weight(TensorProto.INT16, "DequantizeLinear"), id="int16-weight-dequantized"),
    ],
)
def test_a_graph_computing_in_float32_or_float64_is_an_fp32_reference(model) -> None:
    assert reduced_precision(model()) is None


def _validate(folder: Path, model: onnx.ModelProto) -> int:
    """`qbench validate` of an embedding recipe with an FP16 variant of `model`, on random rows."""
    onnx.save(model, str(folder / "model.onnx"))
    rng = np.random.default_rng(2)
    pd.DataFrame({"x": list(rng.normal(size=(ROWS, 4)).astype(np.float32))}).to_parquet(folder / "rows.parquet")
    recipe = {"name": "already-int8", "task": "embedding", "model": {"path": "model.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "calibration": {"samples": 16}},
              "variants": [{"name": "fp16", "precision": "fp16"}], "gate": {"metric": "cosine"}}  # fmt: skip
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return main(["validate", str(folder / "recipe.yaml")])


def test_validate_refuses_a_quantized_reference_in_one_line_naming_the_field(tmp_path: Path, capsys) -> None:
    assert _validate(tmp_path, _quantized(tmp_path, "qoperator")) == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert line.startswith(f"error: {tmp_path / 'recipe.yaml'}: model.path: {tmp_path / 'model.onnx'}: the model is "
                           "already quantized: 1 QLinearAdd, 1 QLinearMatMul")  # fmt: skip
    assert line.endswith("expected the FP32 model that variants are built from (qbench makes the reduced-precision "
                         "variants itself)")  # fmt: skip


def _wrapped_in_a_function(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its whole graph moved into one model-local function that the main graph calls (the weights stay
    initializers, passed in as the call's inputs, as the TorchScript exporter's `export_modules_as_functions` does)."""
    graph = model.graph
    weights = [t.name for t in graph.initializer]
    inputs, outputs = [*[v.name for v in graph.input], *weights], [v.name for v in graph.output]
    body = helper.make_function("local", "Body", inputs, outputs, list(graph.node), list(model.opset_import))
    call = helper.make_node("Body", inputs, outputs, name="/body", domain="local")
    wrapped = helper.make_graph([call], graph.name, list(graph.input), list(graph.output), list(graph.initializer))
    opsets = [*model.opset_import, helper.make_opsetid("local", 1)]
    result = helper.make_model(wrapped, opset_imports=opsets, functions=[body], ir_version=model.ir_version)
    onnx.checker.check_model(result)
    return result


@pytest.mark.parametrize("kind", ["qdq", "dynamic"])
def test_validate_refuses_a_quantized_reference_whose_nodes_sit_inside_a_local_function(tmp_path: Path, kind: str,
                                                                                        capsys) -> None:  # fmt: skip
    """The main graph held only the call node: the check saw no integer node and took an INT8 model for FP32 (every
    variant's drop would then be measured against a quantized baseline)."""
    assert _validate(tmp_path, _wrapped_in_a_function(_quantized(tmp_path, kind))) == 2
    assert "the model is already quantized: " in capsys.readouterr().err


def test_a_half_precision_model_of_many_kinds_counts_the_nodes_left_unnamed() -> None:
    """Seven kinds of float16 node (as in a float16 BERT that ONNX Runtime's optimizer wrote) read '..., 1 Min and 2
    more kinds nodes': the nodes of the kinds not named were not counted (an Identity only stores: not counted)."""
    kinds = ["Add", "Sub", "Mul", "Div", "Max", "Min"]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h0"]), helper.make_node("MatMul", ["h0", "square"], ["h1"])]
    nodes += [helper.make_node(op, [f"h{i + 1}", "b"], [f"h{i + 2}"]) for i, op in enumerate(kinds)]
    nodes.append(helper.make_node("Identity", ["h7"], ["y"]))
    weights = [numpy_helper.from_array(np.ones((4, 3), np.float16), "w"),
               numpy_helper.from_array(np.eye(3, dtype=np.float16), "square"),
               numpy_helper.from_array(np.ones(3, np.float16), "b")]  # fmt: skip
    graph = helper.make_graph(nodes, "kinds", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["batch", 3])],
                              weights)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    assert reduced_precision(model) == ("the model already computes in float16: 2 MatMul, 1 Add, 1 Div, "
                                        "1 Max, 1 Min nodes and 2 more of 2 other "
                                        "kinds; its graph inputs/outputs x, y are float16")  # fmt: skip


@pytest.mark.parametrize(
    ("model", "stored"),
    [
        pytest.param(lambda: _stored_weight(TensorProto.INT16, "DequantizeLinear"),
                     "1 weight in int16 (DequantizeLinear)", id="int16"),
        pytest.param(lambda: _stored_weight(TensorProto.FLOAT16, "Cast"), "1 weight in float16 (Cast)", id="float16"),
        pytest.param(lambda: _stored_weight(TensorProto.BFLOAT16, "Cast"), "1 weight in bfloat16 (Cast)",
                     id="bfloat16"),
    ],
)  # fmt: skip
def test_a_reference_storing_weights_in_a_smaller_type_is_named_by_them(model, stored: str) -> None:
    assert stored_weights(model()).startswith(f"stores {stored} and widens them to float when it runs")


def test_float_weights_and_an_integer_mask_cast_to_float_are_no_stored_weights() -> None:
    """An integer constant cast to float is a mask or an index, not a weight rounded to that type."""
    mask = numpy_helper.from_array(np.array([1, 0, 1], np.uint8), "mask")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xw", "m"], ["logits"])]  # fmt: skip
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    assert stored_weights(_linear()) is None
    assert stored_weights(_linear(nodes=nodes, weights=[w, mask])) is None


def test_a_sweep_from_a_weight_only_quantized_reference_says_so_in_results_report_and_gate(tmp_path: Path, capsys) -> None:
    """A reference with float16 weights widened once is accepted (it computes in FP32), but every drop is measured
    from its rounding: the results, the report and the gate said 'fp32' and nothing more. Its dynamic INT8 variant
    finds no float weight to quantize (identical to the reference), which `qbench gate` must still judge."""
    onnx.save(_stored_weight(TensorProto.FLOAT16, "Cast"), str(tmp_path / "model.onnx"))
    rng = np.random.default_rng(3)
    pd.DataFrame({"x": list(rng.normal(size=(ROWS, 4)).astype(np.float32))}).to_parquet(tmp_path / "rows.parquet")
    recipe = {"name": "weight-only", "task": "embedding", "model": {"path": "model.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}},
              "variants": [{"name": "fp16", "precision": "fp16"},
                           {"name": "int8-dyn", "precision": "int8", "calibrator": "dynamic"}],
              "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 3}, "gate": {"metric": "cosine"}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["sweep", "--no-track", str(tmp_path / "recipe.yaml")]) == 0
    said = "the FP32 reference stores 1 weight in float16 (Cast) and widens them to float when it runs"
    [run] = (tmp_path / "reports" / "weight-only").iterdir()
    results = json.loads((run / "results.json").read_text())
    [reference] = [v for v in results["variants"] if v["variant"] == "fp32"]
    assert any(note.startswith(said) for note in reference["notes"])
    assert said in (run / "report.md").read_text()
    capsys.readouterr()
    assert main(["gate", str(tmp_path / "recipe.yaml")]) == 0
    assert "gate note: the reference fp32 stores 1 weight in float16 (Cast)" in capsys.readouterr().out


@pytest.mark.parametrize("op", ["MatMulInteger16", "QOrderedMatMul", "QuantizeWithOrder", "DequantizeBFP", "QMoE"])
def test_onnx_runtime_quantized_contrib_ops_are_an_int8_model(op: str) -> None:
    """ONNX Runtime's com.microsoft quantized ops beyond the QLinear* family and a fixed list passed as FP32."""
    call = helper.make_node(op, ["x", "w"], ["logits"], domain="com.microsoft")
    graph = helper.make_graph([call], "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
                              [numpy_helper.from_array(np.ones((4, 3), np.float32), "w")])  # fmt: skip
    model = helper.make_model(graph,
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    assert reduced_precision(model) == f"the model is already quantized: 1 {op} node"


def test_an_int8_variant_of_a_reference_with_int16_weights_quantizes_them_to_int8(tmp_path: Path) -> None:
    """The int16 weight's DequantizeLinear was left in place: the quantizer took its output for an activation, kept
    the int16 weight and only rounded what the MatMul read, so the "INT8" variant computed in FP32 (a gate note said
    so, and the variant still passed)."""
    onnx.save(_stored_weight(TensorProto.INT16, "DequantizeLinear"), str(tmp_path / "model.onnx"))
    rng = np.random.default_rng(4)
    pd.DataFrame({"x": list(rng.normal(size=(ROWS, 4)).astype(np.float32))}).to_parquet(tmp_path / "rows.parquet")
    recipe = {"name": "int16-weights", "task": "embedding", "model": {"path": "model.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}},
              "variants": [{"name": "int8", "precision": "int8", "calibrator": "minmax"}],
              "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 3}, "gate": {"metric": "cosine"}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["sweep", "--no-track", str(tmp_path / "recipe.yaml")]) == 0
    [run] = (tmp_path / "reports" / "int16-weights").iterdir()
    [variant] = [v for v in json.loads((run / "results.json").read_text())["variants"] if v["variant"] == "int8"]
    assert variant["params"]["folded_weights"] == ["w"]
    assert variant["params"]["weights_as_built"]["MatMul"] == {"int8, 8-bit, per-tensor, centred": 1}
    assert not [note for note in variant["notes"] if "computes in FP32" in note or "int16" in note]


def _matmul(w: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", w.shape[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", w.shape[1]])],
                              [numpy_helper.from_array(w, "w")])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("kind", ["float16", "bfloat16"])
def test_float32_weights_holding_only_16_bit_values_are_named_as_rounded(kind: str) -> None:
    """ONNX Runtime saves an FP16 model optimized on a CPU with its weights widened to float32 initializers (and a
    PyTorch module loaded from FP16 weights exports so): no node shows the rounding, and the reference was plain FP32
    while every drop was measured from it."""
    import torch

    w = torch.from_numpy(np.random.default_rng(5).normal(size=(8, 8)).astype(np.float32))
    rounded = w.to(getattr(torch, kind)).float().numpy()
    assert stored_weights(_matmul(w.numpy())) is None
    assert stored_weights(_matmul(rounded)).startswith(f"stores 1 weight in {kind} (rounded, stored as float32) and "
                                                       "widens them to float when it runs")  # fmt: skip


@pytest.mark.parametrize(
    "w",
    [np.ones((8, 8), np.float32), np.arange(64, dtype=np.float32).reshape(8, 8),
     np.tile(np.linspace(-1, 1, 8, dtype=np.float32).round(1) / 4, (8, 1)).astype(np.float16).astype(np.float32)],
    ids=["ones", "integers", "few-distinct"],
)  # fmt: skip
def test_float32_weights_that_16_bits_hold_by_their_few_values_are_not_called_rounded(w: np.ndarray) -> None:
    assert stored_weights(_matmul(w)) is None


def _rounded_activation(elem: int) -> onnx.ModelProto:
    """An FP32 linear model that rounds its input to `elem` and widens it back before computing in float."""
    nodes = [helper.make_node("Cast", ["x"], ["x_narrow"], to=elem),
             helper.make_node("Cast", ["x_narrow"], ["x_rounded"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["x_rounded", "w"], ["xw"]),
             helper.make_node("Add", ["xw", "b"], ["logits"])]  # fmt: skip
    rng = np.random.default_rng(0)
    return _linear(nodes=nodes, weights=[numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "w"),
                                         numpy_helper.from_array(rng.normal(size=3).astype(np.float32),
                                                                 "b")])  # fmt: skip


@pytest.mark.parametrize(("elem", "name"), [(TensorProto.FLOAT16, "float16"), (TensorProto.BFLOAT16, "bfloat16")])
def test_a_reference_rounding_its_activations_to_16_bits_is_fp32_and_named_by_them(elem: int, name: str) -> None:
    """A Cast of the input to a 16-bit float and back is storage to `reduced_precision` (nothing computes in it), so
    the reference was accepted and said nothing, yet every value it computes on was rounded."""
    model = _rounded_activation(elem)
    assert reduced_precision(model) is None
    assert rounded_activations(model) == (
        f"rounds 1 activation to {name} (Cast) and widens it back to float when it runs: it computes in FP32 on values "
        "already rounded to that type, so every drop is measured from that rounding, not from the float model")
    assert rounded_activations(_linear()) is None
    assert rounded_activations(_stored_weight(TensorProto.FLOAT16, "Cast")) is None  # a weight, named by stored_weights


def test_a_reference_rounding_its_activations_to_float8_is_refused_as_quantized() -> None:
    """A float8 round trip on activations is their FP8 quantization (fake-quant): an FP8 variant would be judged
    against an FP8 model. Before, the reference was taken as FP32."""
    assert reduced_precision(_rounded_activation(TensorProto.FLOAT8E4M3FN)) == (
        "the model already rounds its activations to float8: 1 Cast node")


def test_a_sweep_from_a_reference_rounding_activations_says_so_in_results_and_gate(tmp_path: Path, capsys) -> None:
    """Before, a bfloat16 round trip of the reference's input went unsaid: results, report and gate called it FP32."""
    onnx.save(_rounded_activation(TensorProto.BFLOAT16), str(tmp_path / "model.onnx"))
    rng = np.random.default_rng(3)
    pd.DataFrame({"x": list(rng.normal(size=(ROWS, 4)).astype(np.float32))}).to_parquet(tmp_path / "rows.parquet")
    recipe = {"name": "rounded", "task": "embedding", "model": {"path": "model.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}},
              "variants": [{"name": "fp16", "precision": "fp16"}],
              "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 3}, "gate": {"metric": "cosine"}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["sweep", "--no-track", str(tmp_path / "recipe.yaml")]) == 0
    said = "the FP32 reference rounds 1 activation to bfloat16 (Cast) and widens it back to float when it runs"
    [run] = (tmp_path / "reports" / "rounded").iterdir()
    [reference] = [v for v in json.loads((run / "results.json").read_text())["variants"] if v["variant"] == "fp32"]
    assert any(note.startswith(said) for note in reference["notes"])
    assert said in (run / "report.md").read_text()
    capsys.readouterr()
    assert main(["gate", str(tmp_path / "recipe.yaml")]) == 0
    assert "gate note: the reference fp32 rounds 1 activation to bfloat16 (Cast)" in capsys.readouterr().out


def test_a_dequantized_graph_input_is_the_data_fed_not_a_quantized_model() -> None:
    """uint8 features decoded by a DequantizeLinear of the graph input (pixels to float), then FP32 layers, was refused
    as 'already quantized: 1 DequantizeLinear node', though nothing the model computes is quantized and every variant
    is fed the same integers. A QuantizeLinear of a float input (quantized activations) is still refused."""
    weights = [numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32), "w"),
               numpy_helper.from_array(np.array(1 / 16, np.float32), "x_scale"),
               numpy_helper.from_array(np.array(128, np.uint8), "x_zero")]  # fmt: skip

    def model(elem: int, quantize: bool) -> onnx.ModelProto:
        nodes = [helper.make_node("DequantizeLinear", ["xq" if quantize else "x", "x_scale", "x_zero"], ["xf"]),
                 helper.make_node("MatMul", ["xf", "w"], ["logits"])]  # fmt: skip
        if quantize:
            nodes.insert(0, helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"]))
        graph = helper.make_graph(nodes, "decoded", [helper.make_tensor_value_info("x", elem, ["batch", 4])],
                                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
                                  weights)  # fmt: skip
        built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
        onnx.checker.check_model(built, full_check=True)
        return built

    assert reduced_precision(model(TensorProto.UINT8, quantize=False)) is None
    assert reduced_precision(model(TensorProto.FLOAT, quantize=True)) == (
        "the model is already quantized: 1 DequantizeLinear, 1 QuantizeLinear nodes")


@pytest.mark.parametrize("rearranged", [
    helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
    helper.make_node("Flatten", ["x"], ["xt"], axis=1),
])  # fmt: skip
def test_a_graph_input_rearranged_before_it_is_dequantized_is_still_the_data_fed(rearranged: onnx.NodeProto) -> None:
    """uint8 pixels transposed (NHWC to NCHW, as a converter writes it) or flattened before their DequantizeLinear were
    refused as 'already quantized: 1 DequantizeLinear node', where the same DequantizeLinear straight on the input was
    accepted: a storage op computes nothing, so what is decoded is still the data fed."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "w"),
               numpy_helper.from_array(np.array(1 / 16, np.float32), "x_scale"),
               numpy_helper.from_array(np.array(128, np.uint8), "x_zero")]  # fmt: skip
    flat = rearranged.op_type == "Flatten"
    nodes = [rearranged, helper.make_node("DequantizeLinear", ["xt", "x_scale", "x_zero"], ["xf"]),
             helper.make_node("MatMul", ["xf", "w"], ["logits"])]  # fmt: skip
    fed = helper.make_tensor_value_info("x", TensorProto.UINT8, ["batch", 2, 2] if flat else ["batch", 4, 2])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3] if flat else ["batch", 2, 3])
    model = helper.make_model(helper.make_graph(nodes, "decoded", [fed], [out], weights),
                              opset_imports=[helper.make_opsetid("", 21)], ir_version=10)  # fmt: skip
    onnx.checker.check_model(model, full_check=True)

    assert reduced_precision(model) is None
