"""SmoothQuant's fold of an attention-output projection's smoothing into V's projection (variants.attention_heads).

Smoothing alone must leave the FP32 function unchanged; the fold must happen only where the head split and merge
provably give context channel c from V channel c.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.variants import smoothquant
from qbench.variants.smoothquant import SmoothedModel, SmoothQuantSettings, smooth_model

WIDTH, HEADS, SEQ = 16, 4, 6
HEAD_DIM = WIDTH // HEADS
LAYERS = 2


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _muls(model: onnx.ModelProto) -> int:
    return Counter(node.op_type for node in model.graph.node)["Mul"]


# -- a 2-layer BERT exported by torch ------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["eager", "sdpa"])
def bert(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> onnx.ModelProto:
    """A seeded 2-layer transformers BertModel (random weights), exported by the TorchScript exporter as qbench does,
    with each attention implementation (torch's SDPA export adds a Reshape of the context to its own shape)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=WIDTH, num_hidden_layers=LAYERS,
                                     num_attention_heads=HEADS, intermediate_size=2 * WIDTH, max_position_embeddings=16)
    config._attn_implementation = request.param
    encoder = transformers.BertModel(config).eval()
    with torch.no_grad():  # trained-like values: no zero biases the exporter would share through Identity nodes
        for name, parameter in encoder.named_parameters():
            parameter.copy_(torch.rand_like(parameter) + 0.5 if name.endswith("LayerNorm.weight")
                            else torch.randn_like(parameter) * 0.2)  # fmt: skip

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    sample = (torch.randint(0, 50, (2, SEQ)), torch.ones(2, SEQ, dtype=torch.int64))
    torch.onnx.export(Hidden(), sample, str(path), input_names=["input_ids", "attention_mask"], output_names=["hidden"],
                      dynamic_axes={name: {0: "batch"} for name in ("input_ids", "attention_mask", "hidden")},
                      opset_version=17, dynamo=False)  # fmt: skip
    return onnx.load(path)


def _token_batches(rng: np.random.Generator, count: int) -> list[dict[str, np.ndarray]]:
    batches = []
    for _ in range(count):
        mask = np.ones((4, SEQ), np.int64)
        mask[1:, SEQ - 2 :] = 0  # padded rows, as the tokenizer writes them
        batches.append({"input_ids": rng.integers(0, 50, (4, SEQ)).astype(np.int64), "attention_mask": mask})
    return batches


def test_bert_attention_output_smoothing_folds_into_v_and_computes_what_the_mul_did(
    bert: onnx.ModelProto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(0)
    calibration, feeds = _token_batches(rng, 2), _token_batches(rng, 1)[0]
    settings = SmoothQuantSettings(alpha=0.5)
    folded = smooth_model(_copy(bert), calibration, settings, tmp_path)
    monkeypatch.setattr(smoothquant, "head_merge_source", lambda *_: None)  # what qbench did: a Mul before each
    with_mul: SmoothedModel = smooth_model(_copy(bert), calibration, settings, tmp_path)
    # per layer: the context's smoothing goes into V's projection instead of a Mul of its own
    assert folded.report.folded_into["MatMul"] == LAYERS
    assert with_mul.report.folded_into["MatMul"] == 0
    assert folded.report.inserted_muls == with_mul.report.inserted_muls - LAYERS
    assert _muls(folded.model) == _muls(with_mul.model) - LAYERS
    # the same per-tensor ranges after smoothing (the folded context keeps its name, the Mul's output had its own)
    np.testing.assert_allclose(sorted(folded.input_ranges.values()), sorted(with_mul.input_ranges.values()), rtol=1e-6)
    reference, by_mul, by_fold = (_run(m, feeds)[0] for m in (bert, with_mul.model, folded.model))
    assert np.abs(by_fold - by_mul).max() < 1e-5, np.abs(by_fold - by_mul).max()
    assert np.abs(by_fold - reference).max() < 1e-5, np.abs(by_fold - reference).max()


# -- one attention block built by hand, its head split and merge chosen -----------------------------------------


def _attention(layout: str) -> onnx.ModelProto:
    """LayerNorm -> Q/K/V -> softmax(Q K^T) V over HEADS heads -> output projection. `layout`:
    heads-major   split (..., heads, head_dim), merge back the same way: V channel c is context channel c
    dims-major    split (..., head_dim, heads), heads moved first: V channel d * heads + h lands on h * head_dim + d
    merge-swapped the standard split, merged as (..., head_dim, heads): a permutation too
    values-read   heads-major, V's projection also a graph output: rescaling it would change that output"""
    rng = np.random.default_rng(1)
    gains = np.geomspace(0.05, 20.0, WIDTH)  # context channels of very different ranges: s far from uniform
    weights = {"gamma": rng.normal(1, 0.2, WIDTH), "beta": rng.normal(0, 0.1, WIDTH),
               **{f"w{p}": rng.normal(0, WIDTH**-0.5, (WIDTH, WIDTH)) for p in "qkvo"}}  # fmt: skip
    weights["wv"] *= gains
    split = [0, 0, HEAD_DIM, HEADS] if layout == "dims-major" else [0, 0, HEADS, HEAD_DIM]
    split_perm = [0, 3, 1, 2] if layout == "dims-major" else [0, 2, 1, 3]
    merge_perm = [0, 2, 3, 1] if layout == "merge-swapped" else [0, 2, 1, 3]
    heads = [helper.make_node("Reshape", ["k", "qk_split"], ["k_split"]),
             helper.make_node("Reshape", ["q", "qk_split"], ["q_split"]),
             helper.make_node("Transpose", ["k_split"], ["kh"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["q_split"], ["qh"], perm=[0, 2, 1, 3])]  # fmt: skip
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], axis=-1),
        *(helper.make_node("MatMul", ["h", f"w{p}"], [p]) for p in "qkv"),
        *heads,
        helper.make_node("MatMul", ["qh", "kh"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("Reshape", ["v", "split"], ["v_split"]),
        helper.make_node("Transpose", ["v_split"], ["vh"], perm=split_perm),
        helper.make_node("MatMul", ["probs", "vh"], ["context_heads"]),
        helper.make_node("Transpose", ["context_heads"], ["context_split"], perm=merge_perm),
        helper.make_node("Reshape", ["context_split", "merge"], ["context"]),
        helper.make_node("MatMul", ["context", "wo"], ["y"]),
    ]
    outputs = ["y", "v"] if layout == "values-read" else ["y"]
    shapes = {"split": split, "qk_split": [0, 0, HEADS, HEAD_DIM], "merge": [0, 0, -1]}
    graph = helper.make_graph(
        nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", SEQ, WIDTH])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", SEQ, WIDTH]) for name in outputs],
        initializer=[*(numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()),
                     *(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in shapes.items())],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize(
    ("layout", "folded_into", "inserted_muls"),
    [("heads-major", {"LayerNormalization": 1, "MatMul": 1}, 0), ("dims-major", {"LayerNormalization": 1}, 1),
     ("merge-swapped", {"LayerNormalization": 1}, 1), ("values-read", {"LayerNormalization": 1}, 1)],
)  # fmt: skip
def test_the_fold_into_v_happens_only_where_the_chain_keeps_each_channel(
    tmp_path: Path, layout: str, folded_into: dict[str, int], inserted_muls: int
) -> None:
    model = _attention(layout)
    rng = np.random.default_rng(2)
    calibration = [{"x": rng.normal(0, 1, (4, SEQ, WIDTH)).astype(np.float32)} for _ in range(2)]
    feeds = {"x": rng.normal(0, 1, (3, SEQ, WIDTH)).astype(np.float32)}
    smoothed = smooth_model(_copy(model), calibration, SmoothQuantSettings(alpha=0.8), tmp_path)
    assert dict(smoothed.report.folded_into) == folded_into
    assert smoothed.report.inserted_muls == inserted_muls
    for reference, result in zip(_run(model, feeds), _run(smoothed.model, feeds)):  # exact, whatever it chose
        assert np.abs(result - reference).max() < 1e-4 * np.abs(reference).max()
