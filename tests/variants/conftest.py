"""Fixtures for the variant builders: tiny ONNX graphs built with onnx.helper, and a trained digits CNN."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.variants.base import BuildContext, BuiltVariant, Feeds
from qbench.variants.onnx_utils import all_nodes

ORT_IR_VERSION = 8  # onnx 1.23 writes IR 14 by default; ORT 1.31 reads up to 13


def save_graph(
    path: Path,
    nodes: Sequence[onnx.NodeProto],
    weights: dict[str, np.ndarray],
    inputs: dict[str, int],
    outputs: dict[str, int],
    opset: int = 17,
) -> Path:
    """Write a float32 graph with a dynamic batch dimension: inputs/outputs map name -> feature width."""
    graph = helper.make_graph(
        list(nodes),
        "tiny",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width]) for name, width in inputs.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width]) for name, width in outputs.items()],
        initializer=[numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ORT_IR_VERSION)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@dataclass(frozen=True)
class TinyModel:
    path: Path
    calibration: list[Feeds]
    held_out: Feeds

    def context(self, workdir: Path) -> BuildContext:
        return BuildContext(reference_path=self.path, workdir=workdir, calibration=self.calibration)


@pytest.fixture(scope="session")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """x[8] -> MatMul(mm1) -> Relu -> MatMul(mm2) -> Add(bias) -> y[4]; calibration ends with a short batch."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["m"], name="mm2"),
        helper.make_node("Add", ["m", "b2"], ["y"], name="bias"),
    ]
    weights = {
        "w1": rng.normal(size=(8, 16)).astype(np.float32),
        "w2": rng.normal(scale=0.5, size=(16, 4)).astype(np.float32),
        "b2": rng.normal(size=(4,)).astype(np.float32),
    }
    path = save_graph(tmp_path_factory.mktemp("mlp") / "mlp.onnx", nodes, weights, {"x": 8}, {"y": 4})
    calibration = [{"x": rng.normal(size=(rows, 8)).astype(np.float32)} for rows in (16, 16, 16, 5)]
    return TinyModel(path, calibration, {"x": rng.normal(size=(64, 8)).astype(np.float32)})


def run_variant(built: BuiltVariant, feeds: Feeds) -> np.ndarray:
    """The first output of `built` on ORT CPU, honouring its session hints."""
    options = ort.SessionOptions()
    if built.session_hints.get("graph_optimization_level") == "basic":
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(str(built.onnx_path), options, providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))[0]


@pytest.fixture(scope="session")
def run() -> Callable[[BuiltVariant, Feeds], np.ndarray]:
    return run_variant


@pytest.fixture(scope="session")
def graph() -> Callable[..., Path]:
    """`save_graph` as a fixture, for tests that build their own tiny graph."""
    return save_graph


# -- the digits CNN -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DigitsCnn:
    path: Path
    calibration: list[Feeds]
    held_out: np.ndarray  # images the model never saw, [N, 1, 8, 8]

    def context(self, workdir: Path) -> BuildContext:
        return BuildContext(reference_path=self.path, workdir=workdir, calibration=self.calibration)


@dataclass(frozen=True)
class DigitsNet:
    """A trained torch CNN and the digits split it was trained on."""

    net: Any
    images: np.ndarray  # [N, 1, 8, 8] in [0, 1]
    labels: np.ndarray
    train: np.ndarray
    held_out: np.ndarray


@pytest.fixture(scope="session")
def digits_net() -> DigitsNet:
    """A 3-conv CNN (modules 0, 2, 5 Conv; 4 MaxPool; 8 Linear) trained for a few seconds on scikit-learn's digits."""
    torch = pytest.importorskip("torch")
    datasets = pytest.importorskip("sklearn.datasets")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    digits = datasets.load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(images))
    train, held_out = order[:1200], order[1200:]

    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(32 * 4 * 4, 10),
    )  # fmt: skip
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    x_train, y_train = torch.from_numpy(images[train]), torch.from_numpy(labels[train])
    for _ in range(8):
        for batch in torch.randperm(len(train)).split(32):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x_train[batch]), y_train[batch]).backward()
            optimizer.step()
    return DigitsNet(net.eval(), images, labels, train, held_out)


@pytest.fixture(scope="session")
def digits_cnn(digits_net: DigitsNet, tmp_path_factory: pytest.TempPathFactory) -> DigitsCnn:
    """`digits_net` exported with the TorchScript exporter."""
    import torch

    path = tmp_path_factory.mktemp("digits") / "digits_cnn.onnx"
    torch.onnx.export(
        digits_net.net, (torch.zeros(2, 1, 8, 8),), str(path), dynamo=False,
        input_names=["image"], output_names=["logits"],
        dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
    )  # fmt: skip
    images, train = digits_net.images, digits_net.train
    calibration = [{"image": images[train[i : i + 32]]} for i in range(0, 128, 32)]
    return DigitsCnn(path, calibration, images[digits_net.held_out])


# ORT kernels that hold INT8 data without computing on it: a QLinearConcat re-scales and copies.
MOVING_KERNELS = {"QLinearConcat", "QLinearWhere"}


def ort_integer_kernels(path: Path, tmp_path: Path) -> int:
    """How many nodes of the graph ONNX Runtime's CPU provider runs (subgraphs' included) are integer kernels that
    compute, optimised at the level the sweep runs an INT8 variant (all optimisations, ONNX Runtime's default)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ops = Counter(node.op_type for node in all_nodes(onnx.load(options.optimized_model_filepath).graph))
    fused = {"QGemm", "DynamicQuantizeMatMul", "QAttention", "DynamicQuantizeLSTM"}
    return sum(n for op, n in ops.items() if (op.startswith("QLinear") or "Integer" in op or op in fused)
               and op not in MOVING_KERNELS)  # fmt: skip


@pytest.fixture
def exporter_weights(tmp_path: Path) -> tuple[Path, Path, list[Feeds]]:
    """One MLP twice: with its weights behind the constant computations exporters leave (a Transpose of an
    initializer, a Constant node, a Cast of a float16 initializer read by a Gemm with transB), and with those weights
    stored as the initializers they compute; and calibration batches. Heavy-tailed weights, so a weight quantized
    with an activation's clipping range shows."""
    rng = np.random.default_rng(3)
    w1 = rng.standard_t(3, size=(16, 8)).astype(np.float32)  # [N, K]
    w2 = rng.standard_t(3, size=(16, 4)).astype(np.float32)
    w3 = rng.standard_t(3, size=(4, 4)).astype(np.float16)  # [N, K] for transB
    tail = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["m"], name="mm2"),
        helper.make_node("Gemm", ["m", "w3"], ["y"], transB=1, name="gemm"),
    ]
    computed = [
        helper.make_node("Transpose", ["w1t"], ["w1"], perm=[1, 0], name="transpose"),
        helper.make_node("Constant", [], ["w2"], value=numpy_helper.from_array(w2), name="constant"),
        helper.make_node("Cast", ["w3h"], ["w3"], to=TensorProto.FLOAT, name="cast"),
    ]
    exported = save_graph(tmp_path / "exported.onnx", computed + tail, {"w1t": w1, "w3h": w3}, {"x": 8}, {"y": 4})
    stored = {"w1": np.ascontiguousarray(w1.T), "w2": w2, "w3": w3.astype(np.float32)}
    folded = save_graph(tmp_path / "folded.onnx", tail, stored, {"x": 8}, {"y": 4})
    return exported, folded, [{"x": rng.normal(size=(32, 8)).astype(np.float32)} for _ in range(4)]
