"""QAT of model shapes beyond the tiny CNN of test_variants_qat: forward() reading the batch size, residual adds.

torch.export keeps a size forward() reads symbolic (`aten.sym_size.int`); the TorchScript trace of the converted graph
recorded it as the example's batch, so a flatten by `x.view(x.size(0), -1)`, an RNN's initial state and a transformer's
attention reshapes were refused ("does not follow the batch size") where INT8 PTQ of the same models ran. And
X86InductorQuantizer's Conv + add pattern left a residual block's convolutions in float under ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from qbench.recipe.spec import VariantSpec
from qbench.sources.torch_model import TorchModel
from qbench.variants.base import BuildContext, BuiltVariant, TrainingData
from qbench.variants.integer_kernels import with_integer_kernels
from qbench.variants.qat import build_qat
from tests.variants.conftest import ort_integer_kernels

CLASSES = 3
STEPS, FEATURES = 4, 5


class _FlattenByView(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.head = torch.nn.Linear(4 * STEPS * FEATURES, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.conv(x))
        return self.head(features.view(features.size(0), -1))


class _GruClassifier(torch.nn.Module):
    """nn.GRU without an initial state: torch.export writes it as zeros of [1, batch, hidden]."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = torch.nn.GRU(FEATURES, 8, batch_first=True)
        self.head = torch.nn.Linear(8, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(x)[0][:, -1])


class _Attention(torch.nn.Module):
    """One nn.TransformerEncoderLayer (its attention reshapes by the batch) and a mean-pooled head."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.TransformerEncoderLayer(FEATURES + 3, 2, 16, dropout=0.0, batch_first=True)
        self.proj = torch.nn.Linear(FEATURES, FEATURES + 3)
        self.head = torch.nn.Linear(FEATURES + 3, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.proj(x)).mean(dim=1))


def _build(module: torch.nn.Module, shape: tuple[int, ...], tmp_path: Path) -> tuple[BuiltVariant, np.ndarray]:
    """QAT for one epoch on random rows labelled by the FP32 model; returns the variant and 7 held-out rows."""
    torch.manual_seed(0)
    module = module.eval()
    rows = np.random.default_rng(0).random((71, *shape), dtype=np.float32)
    with torch.no_grad():
        labels = module(torch.from_numpy(rows)).argmax(1).numpy()
    source = TorchModel(factory="tests:batch_sized", input_shapes={"x": (1, *shape)}, input_dtypes={"x": "float32"},
                        output_names=("scores",), opset=17, cache_key="batch-sized", _template=module)  # fmt: skip
    ctx = BuildContext(reference_path=tmp_path / "unused.onnx", workdir=tmp_path, torch_model=source,
                       calibration=[{"x": rows[:32]}],
                       training=TrainingData(feeds={"x": rows[:64]}, labels=labels[:64]))  # fmt: skip
    spec = VariantSpec.model_validate({"name": "int8-qat", "precision": "int8", "calibrator": "minmax",
                                       "qat": {"epochs": 1, "lr": 1e-3, "batch_size": 32}})  # fmt: skip
    return build_qat(spec, ctx), rows[64:]


@pytest.mark.parametrize(
    ("module", "shape"),
    [(_FlattenByView, (1, STEPS, FEATURES)), (_GruClassifier, (STEPS, FEATURES)), (_Attention, (STEPS, FEATURES))],
    ids=["view-by-batch", "gru-initial-state", "transformer-attention"],
)
def test_the_qdq_export_follows_the_batch_and_computes_the_modules_outputs(module: type, shape: tuple,
                                                                           tmp_path: Path) -> None:
    built, held_out = _build(module(), shape, tmp_path)
    session = ort.InferenceSession(str(built.onnx_path), providers=["CPUExecutionProvider"])
    converted = built.torch_module()
    for batch in (1, 2, 7):  # the export's example batch is 2
        rows = held_out[:batch]
        got = session.run(None, {"x": rows})[0]
        with torch.no_grad():
            expected = converted(torch.from_numpy(rows)).numpy()
        assert got.shape == (batch, CLASSES)
        assert np.abs(got - expected).max() <= 0.05, (f"batch {batch}: max |ORT - torch form| "
                                                      f"{np.abs(got - expected).max()}")
        assert np.array_equal(got.argmax(1), expected.argmax(1))


class _Residual(torch.nn.Module):
    """A stem and one residual block (conv, relu, conv, + the block's input, relu), then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.conv1 = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.head = torch.nn.Linear(4 * STEPS * FEATURES, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        x = torch.relu(x + self.conv2(torch.relu(self.conv1(x))))
        return self.head(x.flatten(1))


def test_every_convolution_of_a_residual_block_runs_as_an_integer_kernel(tmp_path: Path) -> None:
    """The conv before the add, whose output X86's Conv + add pattern left unquantized, ran as a float Conv on
    dequantized weights: 2 of 3 fused. The head, whose output is the model's, stays a float Gemm."""
    built, held_out = _build(_Residual(), (1, STEPS, FEATURES), tmp_path)
    kernels = with_integer_kernels(built, onnx.load(str(built.onnx_path))).params["quantized_op_types"]
    assert kernels == {"Conv": 3}
    assert ort_integer_kernels(built.onnx_path, tmp_path) == 3
    graph = onnx.load(str(built.onnx_path)).graph
    producers = {output: node.op_type for node in graph.node for output in node.output}
    # a grid on a conv's output before its torch.relu would also span the negative half: quantized after the ReLU
    assert [producers[node.input[0]] for node in graph.node if node.op_type == "Relu"] == ["Conv", "Conv", "Add"]
    session = ort.InferenceSession(str(built.onnx_path), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        expected = built.torch_module()(torch.from_numpy(held_out)).numpy()
    assert np.array_equal(session.run(None, {"x": held_out})[0].argmax(1), expected.argmax(1))
