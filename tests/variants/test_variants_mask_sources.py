"""Masks the `masks` rule finds without a non-float graph input: a causal mask built from shapes and constants (a
`bias` buffer sliced to the sequence, Range/Less, Trilu) and a float additive mask fed as a graph input."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from qbench.recipe.spec import VariantSpec
from qbench.variants import build_variant
from qbench.variants.base import BuildContext, Feeds
from qbench.variants.float_rules import kept_float_nodes
from tests.variants.test_variants_float_rules import ORT_IR_VERSION, _fed_by_dequantize

WIDTH, SEQ, ROWS = 16, 8, 4
FLOAT32_MIN = float(torch.finfo(torch.float32).min)


class CausalAttention(torch.nn.Module):
    """One head of causal self-attention, masked the ways GPT-style exports do (`style`), with `fill` in the
    masked places; the queries are scaled up so that attention is sharp (a flattened one then shows)."""

    def __init__(self, style: str, fill: float = -1e4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(WIDTH, WIDTH) for _ in range(4))
        with torch.no_grad():
            self.q.weight.mul_(4.0)
        self.register_buffer("bias", torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)).view(1, SEQ, SEQ))
        self.register_buffer("masked_bias", torch.tensor(fill))
        self.style, self.fill = style, fill

    def forward(self, x: torch.Tensor, attention_bias: torch.Tensor | None = None) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(-1, -2)
        length = x.shape[1]
        if self.style == "where":  # GPT-2's older exports: Where(bias[:, :L, :L], scores, masked_bias)
            scores = torch.where(self.bias[:, :length, :length], scores, self.masked_bias)
        elif self.style == "masked_fill":
            scores = scores.masked_fill(~self.bias[:, :length, :length], self.fill)
        elif self.style == "range":
            positions = torch.arange(length)
            scores = torch.where(positions[None, :, None] >= positions[None, None, :], scores, self.masked_bias)
        elif self.style == "triu":
            scores = scores + torch.full((length, length), self.fill).triu(1)
        elif self.style == "float_input":
            scores = scores + attention_bias
        return self.o(scores.softmax(-1) @ self.v(x))


def _export(module: torch.nn.Module, path: Path, *, fold: bool = True, dynamic: bool = True) -> Path:
    """`dynamic`: a dynamic batch and sequence; without, constant folding folds the causal mask into a constant."""
    names = ["x", "attention_bias"] if module.style == "float_input" else ["x"]
    args = (torch.randn(ROWS, SEQ, WIDTH), torch.zeros(ROWS, 1, SEQ))[: len(names)]
    axes = {"x": {0: "batch", 1: "seq"}, "attention_bias": {0: "batch", 2: "seq"}, "y": {0: "batch"}}
    torch.onnx.export(module.eval(), args, str(path), dynamo=False, do_constant_folding=fold, input_names=names,
                      output_names=["y"], dynamic_axes={k: v for k, v in axes.items() if dynamic
                                                        and k in [*names, "y"]},
                      opset_version=17)  # fmt: skip
    return path


def _feeds(model: onnx.ModelProto, seed: int, count: int) -> list[Feeds]:
    rng, names = np.random.default_rng(seed), {value.name for value in model.graph.input}
    feeds = []
    for _ in range(count):
        feed = {"x": rng.normal(0, 1, (ROWS, SEQ, WIDTH)).astype(np.float32)}
        if "attention_bias" in names:  # the last two positions are padding
            feed["attention_bias"] = np.where(np.arange(SEQ) >= SEQ - 2, -1e4, 0).astype(np.float32)[None, None].repeat(ROWS, 0)
        feeds.append(feed)
    return feeds


def _build(path: Path, calibrator: str, precision: str = "int8", **options):
    spec = VariantSpec(name="v", precision=precision, calibrator=calibrator, **options)
    calibration = _feeds(onnx.load(str(path)), 1, 4)
    workdir = path.parent / f"{path.stem}-{precision}-{calibrator}-{len(options)}"
    return build_variant(spec, BuildContext(reference_path=path, workdir=workdir, calibration=calibration))


def _error(reference: Path, variant: Path) -> float:
    """Largest absolute error vs FP32, as a share of FP32's largest output."""
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (reference, variant)]
    errors = []
    for feed in _feeds(onnx.load(str(reference)), 7, 2):
        expected, got = (session.run(["y"], feed)[0] for session in sessions)
        errors.append(float(np.abs(got - expected).max() / np.abs(expected).max()))
    return max(errors)


def _softmax_and_its_mask(model: onnx.ModelProto) -> set[str]:
    """The Softmax's name and the name of the node writing its input's fill (the Where or Add on the scores)."""
    producer = {out: node for node in model.graph.node for out in node.output}
    (softmax,) = [node for node in model.graph.node if node.op_type == "Softmax"]
    applied = producer[softmax.input[0]]
    assert applied.op_type in ("Where", "Add")
    return {softmax.name, applied.name}


EXPORTS = {"folded": {"fold": True}, "unfolded": {"fold": False}, "static shapes": {"fold": True, "dynamic": False}}


# not ("triu", "static shapes"): a float mask folded into a constant is not matched
# (docs/recipe-reference.md, keep_float)
CASES = [(style, export) for style in ("where", "masked_fill", "range", "triu", "float_input") for export in EXPORTS
         if (style, export) != ("triu", "static shapes")]  # fmt: skip


@pytest.mark.parametrize(("style", "export"), CASES)
def test_a_mask_without_a_non_float_input_is_kept_float(style, export, tmp_path):
    path = _export(CausalAttention(style), tmp_path / "model.onnx", **EXPORTS[export])
    model = onnx.load(str(path))
    kept = kept_float_nodes(model, ["masks"], default=True)
    assert _softmax_and_its_mask(model) <= set(kept.names)
    linears = {node.name for node in model.graph.node if node.op_type in ("MatMul", "Gemm")}
    assert not linears & set(kept.names), "the model's features (x) are not a mask"
    built = _build(path, "minmax")
    assert not _softmax_and_its_mask(model) & _fed_by_dequantize(onnx.load(str(built.onnx_path)))


@pytest.mark.parametrize("style", ["where", "float_input"])
@pytest.mark.parametrize("calibrator", ["minmax", "entropy", "percentile"])
def test_a_causal_or_input_fill_no_longer_flattens_static_int8_attention(style, calibrator, tmp_path):
    """Against the same graph with float32's minimum as the fill (which the range rule already handled): quantized
    on the -1e4 fill's range attention is gone; kept float, the error is what INT8 costs elsewhere."""
    reference = _export(CausalAttention(style), tmp_path / "model.onnx")
    handled_reference = _export(CausalAttention("where", FLOAT32_MIN), tmp_path / "min.onnx")
    elsewhere = _error(handled_reference, _build(handled_reference, calibrator, keep_float=[]).onnx_path)
    assert _error(reference, _build(reference, calibrator, keep_float=[]).onnx_path) > 2 * elsewhere
    assert _error(reference, _build(reference, calibrator).onnx_path) <= 1.5 * elsewhere


def _graph(nodes: list, inputs: list, constants: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(value, name) for name, value in constants.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ORT_IR_VERSION)


def test_shape_derived_floats_that_leave_no_fill_in_the_scores_are_not_masks():
    """A sinusoidal position table (Range -> Sin) added to the embeddings, and a 1/sqrt(d) scale computed from the
    queries' shape, are computed from shapes only like a causal mask, but no fill of theirs reaches a Softmax."""
    rng = np.random.default_rng(0)
    constants = {"wq": rng.normal(size=(WIDTH, WIDTH)).astype(np.float32), "zero": np.array(0, np.int64),
                 "one": np.array(1, np.int64), "last": np.array([-1], np.int64),
                 "freq": np.array(0.1, np.float32)}  # fmt: skip
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], start=1, end=2),
        helper.make_node("Squeeze", ["shape"], ["length"]),
        helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
        helper.make_node("Cast", ["positions"], ["positions_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["positions_f", "freq"], ["angles"]),
        helper.make_node("Sin", ["angles"], ["table"]),
        helper.make_node("Unsqueeze", ["table", "last"], ["table2"]),
        helper.make_node("Add", ["x", "table2"], ["h"], name="add_positions"),
        helper.make_node("MatMul", ["h", "wq"], ["q"], name="proj_q"),
        helper.make_node("Transpose", ["q"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
        helper.make_node("Shape", ["q"], ["q_shape"], start=-1),
        helper.make_node("Cast", ["q_shape"], ["width"], to=TensorProto.FLOAT),
        helper.make_node("Sqrt", ["width"], ["scale"]),
        helper.make_node("Div", ["scores", "scale"], ["scaled"], name="scale"),
        helper.make_node("Softmax", ["scaled"], ["y"], name="softmax", axis=-1),
    ]
    model = _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", WIDTH])], constants)
    onnx.shape_inference.infer_shapes(model, strict_mode=True)  # the rule sees every tensor's type
    assert kept_float_nodes(model, ["masks"], default=True).names == ()


def test_a_float_input_that_is_also_multiplied_is_not_an_additive_mask():
    """A float input that is applied other than additively (here also as a 0/1 product) is data, not a fill."""
    constants = {"w": np.ones((SEQ, SEQ), np.float32)}
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["scores"], name="scores"),
        helper.make_node("Add", ["scores", "bias"], ["masked"], name="add_bias"),
        helper.make_node("Mul", ["masked", "bias"], ["weighted"], name="weigh"),
        helper.make_node("Softmax", ["weighted"], ["y"], name="softmax", axis=-1),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", SEQ, SEQ]) for n in ("x", "bias")]
    assert kept_float_nodes(_graph(nodes, inputs, constants), ["masks"], default=True).names == ()


def test_a_gpt2_from_config_keeps_its_causal_mask_float(tmp_path):
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=100, n_positions=32, use_cache=False)
    model = transformers.GPT2LMHeadModel(config).eval()
    config._attn_implementation = "eager"

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    path = tmp_path / "gpt2.onnx"
    ids = torch.randint(0, 100, (2, SEQ))
    torch.onnx.export(Logits(), (ids, torch.ones_like(ids)), str(path), dynamo=False, opset_version=17,
                      input_names=["input_ids", "attention_mask"], output_names=["y"],
                      dynamic_axes={"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"}})  # fmt: skip
    exported = onnx.load(str(path))
    assert _softmax_and_its_mask(exported) <= set(kept_float_nodes(exported, ["masks"], default=True).names)
