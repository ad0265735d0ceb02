"""keep_float: nodes kept in floating point by rule (op type or graph pattern), checked on the quantized graphs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.recipe.spec import VariantSpec
from qbench.techniques.options import FLOAT_RULES
from qbench.variants import build_variant
from qbench.variants.base import BuildContext, Feeds
from qbench.variants.float_rules import PATTERNS, kept_float_nodes

WIDTH, SEQ, VOCAB = 16, 6, 5
ORT_IR_VERSION = 8
OP_TYPES = ["MatMul", "Add", "Mul", "Sub", "Softmax"]
ATTENTION = {"attention_scores", "attention_context"}
MASKS = {"mask_cast", "mask_invert", "mask_scale", "mask_apply"}


def masked_attention(rng: np.random.Generator) -> onnx.ModelProto:
    """An encoder layer's attention with an int64 attention_mask input and a token-type embedding lookup:

    x + E[token_type] -> LayerNorm -> Q/K/V -> softmax(Q K^T + (1 - mask) * -1e4) V -> out projection + bias
    """
    weights = {w: rng.normal(0, WIDTH**-0.5, (WIDTH, WIDTH)).astype(np.float32) for w in ("wq", "wk", "wv", "wo")}
    weights |= {
        "gamma": np.ones(WIDTH, np.float32), "beta": np.zeros(WIDTH, np.float32),
        "bo": rng.normal(0, 0.1, WIDTH).astype(np.float32),
        "types": rng.normal(0, 0.5, (VOCAB, WIDTH)).astype(np.float32),
        "axes": np.array([1], np.int64), "one": np.array(1.0, np.float32), "big": np.array(-1e4, np.float32),
    }  # fmt: skip
    nodes = [
        helper.make_node("Gather", ["types", "token_type"], ["type_embedding"], name="type_lookup"),
        helper.make_node("Add", ["x", "type_embedding"], ["embedded"], name="embed_add"),
        helper.make_node("LayerNormalization", ["embedded", "gamma", "beta"], ["h"], name="ln", axis=-1),
        *(helper.make_node("MatMul", ["h", f"w{p}"], [p], name=f"proj_{p}") for p in "qkv"),
        helper.make_node("Transpose", ["k"], ["kt"], name="k_transpose", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="attention_scores"),
        helper.make_node("Unsqueeze", ["attention_mask", "axes"], ["mask3"], name="mask_unsqueeze"),
        helper.make_node("Cast", ["mask3"], ["maskf"], name="mask_cast", to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "maskf"], ["inverted"], name="mask_invert"),
        helper.make_node("Mul", ["inverted", "big"], ["additive"], name="mask_scale"),
        helper.make_node("Add", ["scores", "additive"], ["masked"], name="mask_apply"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["context"], name="attention_context"),
        helper.make_node("MatMul", ["context", "wo"], ["projected"], name="proj_out"),
        helper.make_node("Add", ["projected", "bo"], ["y"], name="out_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", SEQ, WIDTH]),
            helper.make_tensor_value_info("token_type", TensorProto.INT64, ["batch", SEQ]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", SEQ]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", SEQ, WIDTH])],
        initializer=[numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ORT_IR_VERSION)
    onnx.checker.check_model(model)
    return model


def _batches(rng: np.random.Generator, count: int, rows: int = 4) -> list[Feeds]:
    batches = []
    for _ in range(count):
        mask = np.ones((rows, SEQ), np.int64)
        mask[:, SEQ - 2 :] = 0
        batches.append({
            "x": rng.normal(0, 1, (rows, SEQ, WIDTH)).astype(np.float32),
            "token_type": rng.integers(0, VOCAB, (rows, SEQ)).astype(np.int64),
            "attention_mask": mask,
        })  # fmt: skip
    return batches


@pytest.fixture(scope="module")
def attention(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Feeds]]:
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("float_rules") / "attention.onnx"
    onnx.save(masked_attention(rng), str(path))
    return path, _batches(rng, 3)


def _fed_by_dequantize(model: onnx.ModelProto) -> set[str]:
    """Names of the nodes that read at least one DequantizeLinear output (they compute on quantized data)."""
    dequantized = {out for node in model.graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    return {
        node.name for node in model.graph.node if node.op_type != "QuantizeLinear" and dequantized & set(node.input)
    }


def test_rule_names_are_the_implemented_patterns() -> None:
    assert set(PATTERNS) == set(FLOAT_RULES)


def test_the_patterns_match_attention_matmuls_and_the_mask_not_the_embedding_lookup() -> None:
    model = masked_attention(np.random.default_rng(0))
    kept = kept_float_nodes(model, ["attention_matmuls", "masks", "Softmax"])
    assert kept.by_rule == {
        "attention_matmuls": ["attention_scores", "attention_context"],
        "masks": ["mask_cast", "mask_invert", "mask_scale", "mask_apply", "softmax"],
        "Softmax": ["softmax"],
    }
    assert "embed_add" not in kept.names and "type_lookup" not in kept.names  # a lookup's output is data, not a mask
    assert kept.params()["keep_float"] == {"attention_matmuls": 2, "masks": 5, "Softmax": 1}
    assert kept_float_nodes(model, []).params() == {}


def test_unnamed_matches_are_named_so_an_exclusion_list_can_hold_them() -> None:
    model = masked_attention(np.random.default_rng(0))
    for node in model.graph.node:
        if node.op_type == "Softmax":
            node.name = ""
    kept = kept_float_nodes(model, ["Softmax"])
    (name,) = kept.names
    assert name and name in {node.name for node in model.graph.node if node.op_type == "Softmax"}


def _build(path: Path, calibration: list[Feeds], workdir: Path, **options) -> tuple[onnx.ModelProto, dict]:
    spec = VariantSpec(name="v", precision="int8", op_types=OP_TYPES, **options)
    built = build_variant(spec, BuildContext(reference_path=path, workdir=workdir, calibration=calibration))
    session = ort.InferenceSession(str(built.onnx_path), providers=["CPUExecutionProvider"])
    assert np.isfinite(session.run(["y"], calibration[0])[0]).all()
    return onnx.load(str(built.onnx_path)), built.params


def test_static_int8_leaves_exactly_the_matched_nodes_unquantized(attention, tmp_path: Path) -> None:
    path, calibration = attention
    plain, _ = _build(path, calibration, tmp_path / "plain", calibrator="minmax", keep_float=[])
    rules = ["attention_matmuls", "masks", "Softmax"]
    kept, params = _build(path, calibration, tmp_path / "kept", calibrator="minmax", keep_float=rules)
    matched = set(params["kept_float_nodes"])
    quantized_plain, quantized_kept = (_fed_by_dequantize(plain), _fed_by_dequantize(kept))
    assert ATTENTION | {"softmax", "mask_apply"} <= quantized_plain, "without rules these nodes are quantized"
    assert quantized_kept == quantized_plain - matched, "exactly the matched nodes left the quantized set"
    assert params["keep_float"] == {"attention_matmuls": 2, "masks": 5, "Softmax": 1}
    # the Q/DQ pairs that only fed kept nodes are gone: q and v reach the attention MatMuls unrounded
    readers = {name for node in kept.graph.node if node.name in ATTENTION for name in node.input}
    assert {"q", "probs", "v"} <= readers


def test_dynamic_int8_keeps_an_op_type_float(attention, tmp_path: Path) -> None:
    path, calibration = attention
    plain, _ = _build(path, calibration, tmp_path / "plain", calibrator="dynamic")
    kept, _ = _build(path, calibration, tmp_path / "kept", calibrator="dynamic", keep_float=["MatMul"])
    integer = [node for node in plain.graph.node if node.op_type == "MatMulInteger"]
    assert len(integer) == 4  # the four projections; the attention MatMuls are not quantized dynamically anyway
    assert not [node for node in kept.graph.node if node.op_type == "MatMulInteger"]
    assert {node.name for node in kept.graph.node if node.op_type == "MatMul"} == ATTENTION | {
        "proj_q",
        "proj_k",
        "proj_v",
        "proj_out",
    }


def test_an_op_type_rule_keeps_linears_float_in_the_linear_technique(attention, tmp_path: Path) -> None:
    path, calibration = attention
    spec = VariantSpec(name="lin", precision="int8", technique="linear", calibrator="minmax", keep_float=["MatMul"])
    built = build_variant(spec, BuildContext(reference_path=path, workdir=tmp_path, calibration=calibration))
    assert built.params["quantized_linears"] == 0 and "DequantizeLinear" not in {
        n.op_type for n in onnx.load(str(built.onnx_path)).graph.node
    }


def test_masks_follow_an_additive_fill_to_its_softmax_but_not_a_product_or_a_fused_embedding() -> None:
    """The fill a Where writes is followed through a Reshape to the Softmax that ends it; a 0/1 product (mean
    pooling) leaves no fill, so the Linear after it stays quantizable; a fused embedding's output is learned data."""
    table = numpy_helper.from_array(np.ones((VOCAB, WIDTH), np.float32), "word")
    constants = [table, numpy_helper.from_array(np.ones(WIDTH, np.float32), "gamma"),
                 numpy_helper.from_array(np.zeros(WIDTH, np.float32), "beta"),
                 numpy_helper.from_array(np.array(-1e9, np.float32), "fill"),
                 numpy_helper.from_array(np.array([0, SEQ], np.int64), "shape"),
                 numpy_helper.from_array(np.ones((WIDTH, 2), np.float32), "head")]  # fmt: skip
    nodes = [
        helper.make_node("EmbedLayerNormalization", ["ids", "", "word", "word", "", "gamma", "beta"], ["h"],
                         name="embed", domain="com.microsoft", epsilon=1e-5),  # fmt: skip
        helper.make_node("Equal", ["ids", "zero"], ["padding"], name="is_padding"),
        helper.make_node("Where", ["padding", "fill", "scores"], ["filled"], name="mask_fill"),
        helper.make_node("Reshape", ["filled", "shape"], ["flat"], name="flatten"),
        helper.make_node("Softmax", ["flat"], ["probs"], name="softmax", axis=-1),
        helper.make_node("Cast", ["ids"], ["keep"], name="keep_cast", to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["keep", "axes"], ["keep3"], name="keep_unsqueeze"),
        helper.make_node("Mul", ["h", "keep3"], ["kept"], name="pool_mask"),
        helper.make_node("ReduceSum", ["kept", "axes"], ["pooled"], name="pool", keepdims=0),
        helper.make_node("MatMul", ["pooled", "head"], ["y"], name="classify"),
    ]
    constants += [numpy_helper.from_array(np.array(0, np.int64), "zero"),
                  numpy_helper.from_array(np.array([2], np.int64), "axes")]  # fmt: skip
    graph = helper.make_graph(nodes, "masks", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", SEQ]),
                                               helper.make_tensor_value_info("scores", TensorProto.FLOAT,
                                                                             ["batch", SEQ])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2]),
                               helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", SEQ])],
                               constants)  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=ORT_IR_VERSION)
    assert kept_float_nodes(model, ["masks"]).names == (
        "is_padding", "mask_fill", "flatten", "softmax", "keep_cast", "keep_unsqueeze", "pool_mask",
    )  # fmt: skip
