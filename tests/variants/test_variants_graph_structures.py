"""Graph structures converters and optimisers ship: control flow whose subgraphs read outer tensors by name (torch
scripted `if` and loops), and ONNX Runtime contrib operators (graphs its transformer optimiser wrote)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.cli.app import main
from qbench.recipe.spec import VariantSpec
from qbench.variants import BuildContext, build_variant
from qbench.variants.onnx_utils import outer_scope_reads

FEATURES, HIDDEN, CLASSES = 8, 16, 3
RNG = np.random.default_rng(0)
WEIGHTS = {
    "w_in": RNG.normal(size=(FEATURES, HIDDEN)).astype(np.float32) * 0.5,
    "w_then": RNG.normal(size=(HIDDEN, CLASSES)).astype(np.float32) * 0.5,
    "w_else": RNG.normal(size=(HIDDEN, CLASSES)).astype(np.float32) * 0.5,
}
X = RNG.normal(size=(96, FEATURES)).astype(np.float32)


def _save(graph: onnx.GraphProto, path: Path, *domains: tuple[str, int]) -> Path:
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, v) for d, v in domains)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _branch(name: str, weight: str, *, own_activation: bool = False) -> onnx.GraphProto:
    """A branch computing `h @ weight`, reading the outer weight by name; the activation `h` is the outer one, or
    with `own_activation` the branch computes it itself from the graph input (Relu(x @ w_in))."""
    activation = f"{name}_h" if own_activation else "h"
    nodes = [helper.make_node("MatMul", [activation, weight], [f"{name}_out"], name=f"{name}_matmul")]
    if own_activation:
        nodes[:0] = [helper.make_node("MatMul", ["x", "w_in"], [f"{name}_pre"], name=f"{name}_matmul_in"),
                     helper.make_node("Relu", [f"{name}_pre"], [activation], name=f"{name}_relu")]  # fmt: skip
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)])


def if_model(path: Path, *, compute_outside: bool = True, relu: bool = True) -> Path:
    """x -> MatMul -> Relu -> h; If(rows > 0) then h @ w_then else h @ w_else. With `compute_outside` False, the
    MatMul and Relu are inside the branches too, so the main graph computes nothing but the condition; with `relu`
    False the branches read the MatMul's output itself."""
    condition = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
                 helper.make_node("ReduceSum", ["shape"], ["total"], name="total", keepdims=0),
                 helper.make_node("Greater", ["total", "zero"], ["rows"], name="rows")]  # fmt: skip
    head = [helper.make_node("MatMul", ["x", "w_in"], ["pre" if relu else "h"], name="matmul_in"),
            helper.make_node("Relu", ["pre"], ["h"], name="relu")][: 2 if relu else 1] if compute_outside else []  # fmt: skip
    inside = not compute_outside
    branch = helper.make_node("If", ["rows"], ["y"], name="branch",
                              then_branch=_branch("then", "w_then", own_activation=inside),
                              else_branch=_branch("else", "w_else", own_activation=inside))  # fmt: skip
    weights = [numpy_helper.from_array(v, k) for k, v in WEIGHTS.items()]
    graph = helper.make_graph([*condition, *head, branch], "if_model",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", CLASSES])],
                              [*weights, numpy_helper.from_array(np.array(0, np.int64), "zero")])  # fmt: skip
    return _save(graph, path)


def contrib_model(path: Path) -> Path:
    """MatMul -> com.microsoft Gelu -> MatMul: an op with no ONNX schema between two convertible ones."""
    nodes = [helper.make_node("MatMul", ["x", "w_in"], ["h"], name="matmul_in"),
             helper.make_node("Gelu", ["h"], ["g"], name="gelu", domain="com.microsoft"),
             helper.make_node("MatMul", ["g", "w_then"], ["y"], name="matmul_out")]  # fmt: skip
    graph = helper.make_graph(nodes, "contrib",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", CLASSES])],
                              [numpy_helper.from_array(WEIGHTS[k], k) for k in ("w_in", "w_then")])  # fmt: skip
    return _save(graph, path, ("com.microsoft", 1))


def _run(path: Path, x: np.ndarray = X) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _build(path: Path, workdir: Path, **variant) -> object:
    calibration = [{"x": X[i : i + 32]} for i in range(0, len(X), 32)]
    return build_variant(VariantSpec(**variant),
                         BuildContext(reference_path=path, workdir=workdir, calibration=calibration))  # fmt: skip


def test_outer_scope_reads_are_what_a_subgraph_reads_from_outside():
    branch = helper.make_node("If", ["c"], ["y"], then_branch=_branch("then", "w_then"),
                              else_branch=_branch("else", "w_else"))  # fmt: skip
    assert sorted(outer_scope_reads(branch)) == ["h", "w_else", "w_then"]
    assert outer_scope_reads(helper.make_node("Relu", ["h"], ["r"])) == []
    inside = helper.make_node("If", ["c"], ["y"], then_branch=_branch("then", "w_then", own_activation=True),
                              else_branch=_branch("else", "w_else", own_activation=True))  # fmt: skip
    assert sorted(outer_scope_reads(inside)) == ["w_else", "w_in", "w_then", "x"]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precision_of_a_graph_whose_branches_read_outer_tensors_loads_and_stays_close(tmp_path, precision):
    """The kept If's branches read `h`, which FP16 converts: they read a float32 cast of it (ORT refused the model)."""
    path = if_model(tmp_path / "if.onnx")
    built = _build(path, tmp_path / "w", name=precision, precision=precision)
    expected, ran = _run(path), _run(built.onnx_path)
    assert built.onnx_path != path.resolve()
    assert 0 < np.abs(ran - expected).max() < 0.02 * np.abs(expected).max()


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_graph_computing_only_inside_control_flow_is_left_as_fp32_saying_so(tmp_path, precision):
    """Shape reads a float tensor but never its values: it used to make the variant 'converted' (and gated silently)."""
    path = if_model(tmp_path / "if.onnx", compute_outside=False)
    built = _build(path, tmp_path / "w", name=precision, precision=precision)
    assert built.onnx_path == path.resolve()
    assert "nothing to" in built.notes[0]


def test_static_int8_keeps_what_a_branch_reads_and_names_the_nodes_left_float(tmp_path):
    """ORT's QDQ quantizer folded the Relu whose output the branches read (it saw no reader but the quantization):
    the branches then read the pre-activation and agreement with FP32 fell to about 0.6."""
    path = if_model(tmp_path / "if.onnx")
    built = _build(path, tmp_path / "w", name="int8", precision="int8", calibrator="minmax")
    expected, ran = _run(path), _run(built.onnx_path)
    assert np.mean(ran.argmax(1) == expected.argmax(1)) > 0.9
    assert any("2 MatMul inside control-flow subgraphs" in note for note in built.notes)


@pytest.mark.parametrize("variant", [{"precision": "int8", "calibrator": "minmax"},
                                     {"precision": "int8", "calibrator": "dynamic"},
                                     {"precision": "fp8", "calibrator": "minmax"}])  # fmt: skip
def test_a_main_graph_layer_a_branch_reads_is_named_as_left_float(tmp_path, variant):
    """The branches read the MatMul's output by name, so the build keeps that MatMul float: it was said nowhere (the
    notes counted only the MatMuls inside the branches), and with no other layer the variant read 'no node was
    quantized (check op_types, exclude_nodes and keep_float)', none of which the recipe had set."""
    path = if_model(tmp_path / "if.onnx", relu=False)
    built = _build(path, tmp_path / "w", name="q", **variant)
    graph = onnx.load(str(built.onnx_path)).graph
    kept = [node.name for node in graph.node if node.op_type == "MatMul" and "w_in" in node.input]
    assert kept == ["matmul_in"]  # it computes on the float weight: what the note says is what was built
    assert built.params["subgraph_read_kept_float"] == ["matmul_in"]
    assert any("1 MatMul of the main graph kept float (matmul_in)" in note for note in built.notes), built.notes
    assert built.params["quantized_nodes"] == 0  # its only layer: the reason is named, not the recipe's fields
    assert "no node was quantized: this variant computes in FP32 (1 node(s) a control-flow subgraph reads (matmul_in) " \
           "stay float; else check op_types, exclude_nodes and keep_float)" in built.notes


def test_fp16_casts_a_contrib_operator_output_before_converted_readers(tmp_path):
    """Gelu (com.microsoft) has no ONNX schema: the schema ONNX Runtime registers types it, and FP16 converts it as
    ONNX Runtime's float16 converter does (it was kept FP32, its output cast for the converted MatMul)."""
    path = contrib_model(tmp_path / "contrib.onnx")
    built = _build(path, tmp_path / "w", name="fp16", precision="fp16")
    expected, ran = _run(path), _run(built.onnx_path)
    assert 0 < np.abs(ran - expected).max() < 0.02 * np.abs(expected).max()
    assert any("com.microsoft" in note for note in built.notes)


def test_fp8_upgrades_the_opset_of_a_graph_importing_a_contrib_domain(tmp_path):
    path = contrib_model(tmp_path / "contrib.onnx")
    built = _build(path, tmp_path / "w", name="fp8", precision="fp8", calibrator="minmax")
    assert built.params["quantized_nodes"] == 2
    assert np.isfinite(_run(built.onnx_path)).all()


def test_bf16_rounds_every_neural_operator_whatever_its_schema_accepts(tmp_path):
    """BF16 is simulated in an FP32 graph: Conv (no bfloat16 in its opset-17 schema) and a contrib Gelu are rounded
    too (they were kept unrounded, understating BF16's error)."""
    path = contrib_model(tmp_path / "contrib.onnx")
    built = _build(path, tmp_path / "w", name="bf16", precision="bf16")
    model = onnx.load(str(built.onnx_path))
    for tensor in model.graph.initializer:
        values = numpy_helper.to_array(tensor)
        np.testing.assert_array_equal(values, values.astype(ml_dtypes.bfloat16).astype(np.float32))
    gelu = next(n for n in model.graph.node if n.op_type == "Gelu")
    producers = {o: n for n in model.graph.node for o in n.output}
    assert producers[gelu.input[0]].op_type == "Cast"
    assert built.params["kept_fp32_op_types"] == []


def test_the_fp16_emulation_orders_a_branch_after_what_it_reads(tmp_path):
    """The emulation re-sorts the graph: the If must come after the Cast its branches read (it was placed before)."""
    from qbench.variants.emulate import emulate_float16
    from qbench.variants.onnx_utils import load_model

    path = if_model(tmp_path / "if.onnx")
    built = _build(path, tmp_path / "w", name="fp16", precision="fp16")
    emulated, rounded = emulate_float16(load_model(built.onnx_path))
    onnx.checker.check_model(emulated, full_check=True)
    ran = ort.InferenceSession(emulated.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    assert rounded > 0
    np.testing.assert_allclose(ran, _run(built.onnx_path), atol=0.02 * np.abs(ran).max())


def test_explain_pruning_keeps_what_only_a_branch_reads(tmp_path):
    from qbench.variants.onnx_utils import load_model
    from qbench.variants.qdq_bypass import prune_unread

    graph = load_model(if_model(tmp_path / "if.onnx")).graph
    graph.node.extend([helper.make_node("Relu", ["x"], ["unread"], name="dead")])
    prune_unread(graph)
    assert [n.name for n in graph.node] == ["shape", "total", "rows", "matmul_in", "relu", "branch"]
    assert {t.name for t in graph.initializer} == {*WEIGHTS, "zero"}


def sequence_model(path: Path) -> Path:
    """x -> MatMul -> Relu -> MatMul -> logits; seq = SequenceConstruct(logits, softmax); second = SequenceAt(seq, 1).
    Outputs: seq (a sequence), logits, second."""
    nodes = [helper.make_node("MatMul", ["x", "w_in"], ["pre"], name="matmul_in"),
             helper.make_node("Relu", ["pre"], ["h"], name="relu"),
             helper.make_node("MatMul", ["h", "w_then"], ["logits"], name="matmul_out"),
             helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=1),
             helper.make_node("SequenceConstruct", ["logits", "probs"], ["seq"], name="pack"),
             helper.make_node("SequenceAt", ["seq", "one"], ["second"], name="pick")]  # fmt: skip
    outputs = [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None),
               helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES]),
               helper.make_tensor_value_info("second", TensorProto.FLOAT, ["N", CLASSES])]  # fmt: skip
    weights = [numpy_helper.from_array(WEIGHTS[k], k) for k in ("w_in", "w_then")]
    graph = helper.make_graph(nodes, "sequence",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
                              outputs, [*weights, numpy_helper.from_array(np.array(1, np.int64), "one")])  # fmt: skip
    return _save(graph, path)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_nodes_on_a_sequence_stay_fp32_and_the_sequence_keeps_its_type(tmp_path, precision):
    """FP16's converter narrowed the sequence output to seq(tensor(float16)) and Cast it (invalid on a sequence):
    the FP16 emulation was refused by ORT. Nodes reading or writing a sequence stay FP32, their tensor inputs cast."""
    from qbench.variants.emulate import save_float16_emulation

    path = sequence_model(tmp_path / "sequence.onnx")
    built = _build(path, tmp_path / "w", name=precision, precision=precision)
    session = ort.InferenceSession(str(built.onnx_path), providers=["CPUExecutionProvider"])
    assert [(o.name, o.type) for o in session.get_outputs()] == [
        ("seq", "seq(tensor(float))"), ("logits", "tensor(float)"), ("second", "tensor(float)")]
    seq, logits, second = session.run(None, {"x": X})
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": X})[1]
    assert 0 < np.abs(logits - expected).max() < 0.02 * np.abs(expected).max()
    np.testing.assert_array_equal(seq[0], logits)
    np.testing.assert_array_equal(second, seq[1])
    assert any("SequenceAt, SequenceConstruct (reads or writes a sequence" in note for note in built.notes)
    if precision == "fp16":
        emulated, rounded = save_float16_emulation(built.onnx_path)
        ran = ort.InferenceSession(str(emulated), providers=["CPUExecutionProvider"]).run(None, {"x": X})
        assert rounded > 0
        np.testing.assert_allclose(ran[1], logits, atol=0.02 * np.abs(logits).max())


def function_model(path: Path) -> Path:
    """x -> Block(x, w_in) -> Block(h, w_mid) -> MatMul(w_then) -> y, where Block (domain `local`) is a model-local
    function computing Relu(x @ w) and the weights are passed in as the call's inputs: the layout of the TorchScript
    exporter's `export_modules_as_functions` and of onnxscript-authored models."""
    block = helper.make_function(
        "local", "Block", ["inp", "weight"], ["out"],
        [helper.make_node("MatMul", ["inp", "weight"], ["pre"], name="matmul"),
         helper.make_node("Relu", ["pre"], ["out"], name="relu")],
        [helper.make_opsetid("", 17)],
    )  # fmt: skip
    nodes = [helper.make_node("Block", ["x", "w_in"], ["h"], name="/b1/Block", domain="local"),
             helper.make_node("Block", ["h", "w_mid"], ["h2"], name="/b2/Block", domain="local"),
             helper.make_node("MatMul", ["h2", "w_then"], ["y"], name="/head/MatMul")]  # fmt: skip
    weights = {**WEIGHTS, "w_mid": RNG.normal(size=(HIDDEN, HIDDEN)).astype(np.float32) * 0.3}
    graph = helper.make_graph(nodes, "functions",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", CLASSES])],
                              [numpy_helper.from_array(weights[k], k)
                               for k in ("w_in", "w_mid", "w_then")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=[block], ir_version=8)  # fmt: skip
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize(("variant", "param", "lowered"), [
    ({"precision": "fp16"}, "converted_nodes", 5),
    ({"precision": "bf16"}, "rounded_activations", 6),
    ({"precision": "fp8", "calibrator": "minmax"}, "quantized_nodes", 3),
    ({"precision": "int8", "calibrator": "minmax"}, "quantized_nodes", 3),
    ({"precision": "int8", "calibrator": "dynamic"}, "quantized_nodes", 3),
    ({"precision": "int8", "calibrator": "minmax", "technique": "linear"}, "quantized_linears", 3),
    ({"precision": "int8", "calibrator": "minmax", "smoothquant": {"alpha": 0.5}}, "quantized_linears", 3),
], ids=["fp16", "bf16", "fp8", "int8-static", "int8-dynamic", "linear", "smoothquant"])  # fmt: skip
def test_every_technique_lowers_the_nodes_inside_local_functions(tmp_path, variant, param, lowered):
    """Two of the three MatMuls sit inside a local function: every technique used to walk the main graph only, so
    INT8 quantized the head alone (1 of 3 nodes) and FP16 kept both blocks FP32 as an unknown operator, yet the
    variant was reported and gated as that precision; FP8 failed (its calibration copy calls an undeclared function)."""
    path = function_model(tmp_path / "functions.onnx")
    built = _build(path, tmp_path / "w", name="v", **variant)
    assert built.params[param] == lowered
    assert not onnx.load(str(built.onnx_path)).functions
    expected, ran = _run(path), _run(built.onnx_path)
    assert np.mean(ran.argmax(1) == expected.argmax(1)) > 0.9


def test_dynamic_int8_names_the_gemms_left_float_inside_control_flow(tmp_path):
    """Dynamic INT8 quantizes a main-graph Gemm (a torch Linear) as a MatMul, but an If's branches stay float: the
    note naming what stays FP32 there counted MatMul only, so a torch.cond export's branch Linears went unmentioned."""
    model = onnx.load(str(if_model(tmp_path / "if.onnx")))
    for node in model.graph.node:
        for attribute in node.attribute:
            for inner in attribute.g.node if attribute.HasField("g") else []:
                inner.op_type = "Gemm" if inner.op_type == "MatMul" else inner.op_type
    onnx.save(model, str(tmp_path / "if_gemm.onnx"))
    built = _build(tmp_path / "if_gemm.onnx", tmp_path / "w", name="int8", precision="int8", calibrator="dynamic")
    assert built.params["quantized_nodes"] == 1
    assert any("2 Gemm inside control-flow subgraphs" in note for note in built.notes), built.notes


def test_bf16_says_what_a_fused_contrib_operator_leaves_unrounded_inside(tmp_path):
    """A com.microsoft Attention (what ONNX Runtime's transformer optimizer writes for a BERT's self-attention) is
    rounded where it reads and writes only: its Q, K, V and scores stay float32, which the unfused graph's BF16
    rounds. An optimised BERT's BF16 was 1.6x closer to FP32 than its plain export's, with nothing saying why."""
    rng = np.random.default_rng(6)
    weights = {"qkv": rng.normal(0, 0.5, (FEATURES, 3 * FEATURES)).astype(np.float32),
               "bias": rng.normal(0, 0.1, (3 * FEATURES,)).astype(np.float32)}  # fmt: skip
    node = helper.make_node("Attention", ["x", "qkv", "bias"], ["y"], name="attention", domain="com.microsoft",
                            num_heads=2)  # fmt: skip
    graph = helper.make_graph([node], "attention",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, FEATURES])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])  # fmt: skip
    path = _save(graph, tmp_path / "attention.onnx", ("com.microsoft", 1))
    built = _build(path, tmp_path / "w", name="bf16", precision="bf16")
    assert [note for note in built.notes if "rounded where they read and write only" in note] == [
        "1 Attention (com.microsoft): rounded where they read and write only; what they compute inside (a fused "
        "Attention's Q, K, V and scores, a SkipLayerNormalization's residual sum) stays float32, which BF16 running "
        "the unfused ops would round: the figures may be closer to FP32 than BF16's"
    ]
    standard = helper.make_graph([helper.make_node("MatMul", ["x", "qkv"], ["y"])], "standard",
                                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
                                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3 * FEATURES])],
                                 [numpy_helper.from_array(weights["qkv"], "qkv")])  # fmt: skip
    unfused = _build(_save(standard, tmp_path / "standard.onnx"), tmp_path / "w2", name="bf16", precision="bf16")
    assert not [note for note in unfused.notes if "rounded where they read and write only" in note]


def control_flow_model(path: Path, kind: str) -> Path:
    """All compute inside control flow, its condition on the input's values: c = ReduceMax(x) > 0 (float nodes a
    half-precision variant lowers), then `If(c)` with a Relu(x @ w_in) @ w_then branch each, or a two-trip `Loop`
    whose body computes Relu(h @ w_sq) and carries c. The main graph holds no MatMul."""
    condition = [helper.make_node("ReduceMax", ["x"], ["peak"], name="peak", keepdims=0),
                 helper.make_node("Greater", ["peak", "zero"], ["c"], name="positive")]  # fmt: skip
    weights = {**WEIGHTS, "w_sq": RNG.normal(size=(FEATURES, FEATURES)).astype(np.float32) * 0.3}
    if kind == "If":
        flow = helper.make_node("If", ["c"], ["y"], name="flow",
                                then_branch=_branch("then", "w_then", own_activation=True),
                                else_branch=_branch("else", "w_else", own_activation=True))  # fmt: skip
        width = CLASSES
    else:
        body = helper.make_graph(
            [helper.make_node("MatMul", ["h_in", "w_sq"], ["pre"], name="body_matmul"),
             helper.make_node("Relu", ["pre"], ["h_out"], name="body_relu"),
             helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
            "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                     helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                     helper.make_tensor_value_info("h_in", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("h_out", TensorProto.FLOAT, None)])  # fmt: skip
        flow = helper.make_node("Loop", ["trips", "c", "x"], ["y"], name="flow", body=body)
        width = FEATURES
    graph = helper.make_graph([*condition, flow], kind,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
                              [*(numpy_helper.from_array(v, k) for k, v in weights.items()),
                               numpy_helper.from_array(np.array(0, np.float32), "zero"),
                               numpy_helper.from_array(np.array(2, np.int64), "trips")])  # fmt: skip
    return _save(graph, path)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize(("kind", "contractions"), [("If", 4), ("Loop", 1)])
def test_a_variant_lowering_only_the_condition_of_its_control_flow_says_it_computes_in_fp32(tmp_path, precision, kind,
                                                                                            contractions):  # fmt: skip
    """The ReduceMax and Greater choosing the branch were lowered, every MatMul stayed FP32 inside the kept If or Loop:
    the variant was described (and gated) as an FP16 model, its two lowered nodes counted like any others."""
    path = control_flow_model(tmp_path / "flow.onnx", kind)
    built = _build(path, tmp_path / "w", name=precision, precision=precision)
    assert built.onnx_path != path.resolve()  # the condition's nodes were lowered
    assert built.params["lowered_op_types"] == {"Greater": 1, "ReduceMax": 1}
    assert (built.params["contractions"], built.params["lowered_contractions"]) == (contractions, 0)
    [note] = [n for n in built.notes if n.startswith(f"lowered to {precision.upper()}")]
    assert f"none of the graph's {contractions} contractions" in note and "the variant computes in FP32" in note
    np.testing.assert_allclose(_run(built.onnx_path), _run(path), rtol=1e-6)  # its compute is FP32's own


def test_a_variant_lowering_some_contractions_counts_those_left_in_control_flow(tmp_path):
    """The main graph's MatMul is lowered, the two branch MatMuls stay FP32: 1 of 3, and no 'computes in FP32'."""
    built = _build(if_model(tmp_path / "if.onnx"), tmp_path / "w", name="fp16", precision="fp16")
    assert (built.params["contractions"], built.params["lowered_contractions"]) == (3, 1)
    [note] = [n for n in built.notes if n.startswith("lowered to FP16")]
    assert "1 of the graph's 3 contractions (MatMul, Conv, Gemm...) lowered (2 sit inside control-flow" in note
    assert "the variant computes in FP32" not in note


@pytest.mark.slow
def test_a_sweep_of_a_graph_computing_inside_control_flow_says_so_in_the_gate_and_the_range_analysis(tmp_path, capsys):
    """Through `qbench sweep --gate`: the FP16 variant's pass came with no note that it computes in FP32, and the range
    analysis, which sees the main graph's tensors only, did not say that the branches' nodes went unanalysed."""
    path = control_flow_model(tmp_path / "model.onnx", "If")
    x = np.random.default_rng(1).normal(size=(800, FEATURES)).astype(np.float32)
    labels = _run(path, x).argmax(1)
    pd.DataFrame({"x": list(x), "label": labels}).to_parquet(tmp_path / "rows.parquet")
    recipe = {"name": "flow", "task": "classification", "model": {"path": "model.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "label"},
              "variants": [{"name": "fp16", "precision": "fp16"}],
              "latency": {"batch_sizes": [1], "warmup": 0, "iterations": 2}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["sweep", "--gate", "--no-track", str(tmp_path / "recipe.yaml")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("gate note: fp16@onnxruntime-cpu computes in fp32 (none of its 4 contractions (MatMul, Conv...) was "
            "lowered): its pass says nothing about fp16") in out  # fmt: skip
    [report] = (tmp_path / "reports" / "flow").glob("*/report.md")
    assert "not analysed: 6 node(s) inside the control-flow subgraphs (If/Loop/Scan) of `flow`" in report.read_text()


@pytest.mark.parametrize("calibrator", ["dynamic", "minmax"])
def test_int8_quantizing_nothing_beside_a_branch_on_the_batch_size_names_the_layers_in_the_branches(tmp_path, calibrator):
    """If(x.shape[0] > 1) with both branches' layers inside: the main graph's one quantizable node is the Gather reading
    the batch size, and the note blamed it alone ('Q/DQ on Gather would only round data...'), not the 4 MatMuls the
    branches hold, which are why the variant is FP32."""
    condition = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
                 helper.make_node("Gather", ["shape", "first"], ["rows"], name="rows", axis=0),
                 helper.make_node("Greater", ["rows", "one"], ["many"], name="many"),
                 helper.make_node("If", ["many"], ["y"], name="branch",
                                  then_branch=_branch("then", "w_then", own_activation=True),
                                  else_branch=_branch("else", "w_else", own_activation=True))]  # fmt: skip
    constants = [numpy_helper.from_array(np.array(0, np.int64), "first"),
                 numpy_helper.from_array(np.array(1, np.int64), "one")]  # fmt: skip
    graph = helper.make_graph(condition, "shape_if",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", CLASSES])],
                              [*(numpy_helper.from_array(v, k) for k, v in WEIGHTS.items()), *constants])  # fmt: skip
    path = _save(graph, tmp_path / "shape_if.onnx")
    built = _build(path, tmp_path / "w", name="int8", precision="int8", calibrator=calibrator)
    assert built.onnx_path == path.resolve() and built.lowered_nothing
    [note] = built.notes
    assert "Q/DQ on Gather would only round data" in note
    inside = {"dynamic": "4 MatMul", "minmax": "4 MatMul, 2 Relu"}[calibrator]  # Relu: a static QDQ op type
    assert f"{inside} only inside control-flow subgraphs (If/Loop/Scan), which quantization leaves float" in note
