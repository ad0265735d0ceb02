"""What an FP16/BF16 torch variant's ops really computed in (qbench.backends.torch_trace), as a torch backend
describes it: the narrow type, mixed precision where forward() casts to float32, or nothing in the narrow type."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from module_source import ModuleSource
from torch import nn

from qbench.backends.base import RunOptions
from qbench.backends.torch_backend import TorchCPU
from qbench.recipe.spec import VariantSpec
from qbench.variants.base import BuiltVariant
from qbench.variants.torch_forms import attach_torch_form

FEATURES = 8


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(FEATURES, 16), nn.LayerNorm(16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x))))


class SoftmaxInFloat32(Plain):
    """Large logits put through a softmax in float32 (`.float()`), as attention code often does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.softmax(self.fc1(x).float() * 30.0, dim=-1)
        return self.fc2(scores)


class AllInFloat32(nn.Module):
    """A forward that casts its input and weights to float32 itself: nothing is left to compute in a narrow type."""

    def __init__(self) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(3, FEATURES)), nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.bias.float(), x.float()[:, :3], self.weight.float()[:, 0]) * 2.0


class WeightsAsBuffers(nn.Module):
    """Weights registered as buffers: .half() converts them, but the module has no parameter to read a dtype from."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 2.0, FEATURES))
        self.register_buffer("shift", torch.linspace(-1.0, 1.0, FEATURES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


@pytest.fixture(autouse=True)
def native_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Labelled as on a CPU with native fp16/bf16 matmuls: what these tests read is the op count, and the label's
    CPU caveat depends on the machine (test_backend_torch checks it against oneDNN's own probe)."""
    monkeypatch.setattr(TorchCPU, "caveat", lambda self, precision: "")


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Any graph with one input named `x`: the runner reads the argument order from it."""
    path = tmp_path_factory.mktemp("trace") / "x.onnx"
    torch.onnx.export(Plain().eval(), (torch.zeros(2, FEATURES),), str(path), input_names=["x"],
                      dynamic_axes={"x": {0: "batch"}}, opset_version=17, dynamo=False)  # fmt: skip
    return path


def _describe(onnx_path: Path, module: nn.Module, precision: str) -> tuple[np.ndarray, dict]:
    torch.manual_seed(0)
    spec = VariantSpec(name=precision, precision=precision)
    variant = attach_torch_form(BuiltVariant(precision, precision, onnx_path), spec, ModuleSource(module.eval()))
    runner = TorchCPU().load(variant, RunOptions(threads=1))
    try:
        outputs = runner.run({"x": np.random.default_rng(0).standard_normal((16, FEATURES)).astype(np.float32)})
        return outputs[0], runner.describe()
    finally:
        runner.close()


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_module_computed_in_its_type_is_labelled_with_it_alone(onnx_path: Path, precision: str) -> None:
    torch.manual_seed(0)
    _, description = _describe(onnx_path, Plain(), precision)
    assert description["kernels"] == precision
    assert description["lowered_ops"] == 4, "2 linears, the norm and the gelu ran in the narrow type"


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_ops_a_forward_runs_in_float32_are_counted_and_named(onnx_path: Path, precision: str) -> None:
    torch.manual_seed(0)
    _, description = _describe(onnx_path, SoftmaxInFloat32(), precision)
    assert description["kernels"].startswith(f"{precision} mixed: 2 of 4 ops in float32 (mul, softmax)")
    assert description["lowered_ops"] == 2, "the two linears"


def test_a_variant_with_no_op_in_its_type_says_its_figures_are_not_its_type(onnx_path: Path) -> None:
    torch.manual_seed(0)
    _, description = _describe(onnx_path, AllInFloat32(), "fp16")
    assert description["lowered_ops"] == 0
    assert description["kernels"].startswith("fp16 requested, but no op computed in float16")


def test_a_module_with_weights_as_buffers_computes_in_its_type(onnx_path: Path) -> None:
    module = WeightsAsBuffers()
    outputs, description = _describe(onnx_path, module, "fp16")
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((16, FEATURES)).astype(np.float32))
    expected = (x.half() * module.scale.half() + module.shift.half()).float().numpy()
    np.testing.assert_array_equal(outputs, expected)
    assert description["dtype"] == "float16" and description["kernels"] == "fp16"


class RecurrentThenLinear(nn.Module):
    """A recurrent layer over 4 steps of x, then an nn.Linear: torchao quantizes the Linear only."""

    def __init__(self, layer: type[nn.Module]) -> None:
        super().__init__()
        self.rnn, self.head = layer(FEATURES // 4, 16, batch_first=True), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states, _ = self.rnn(x.view(x.size(0), 4, FEATURES // 4))
        return self.head(states[:, -1])


@pytest.mark.parametrize("layer", [nn.LSTM, nn.GRU])
def test_a_recurrent_layer_torchao_left_float_is_said_in_the_int8_label(onnx_path: Path,
                                                                        layer: type[nn.Module]) -> None:
    """On CPU an nn.LSTM runs as one fused oneDNN kernel (mkldnn_rnn_layer), which was not counted as a matrix
    product: its int8 form read 'int8 (torchao dynamic, 1 of 1 linear layers)' with nothing left in float, while
    the LSTM, most of the weights, ran in float32 (an nn.GRU's addmm/mm were counted)."""
    torch.manual_seed(0)
    spec = VariantSpec(name="int8", precision="int8", calibrator="dynamic")
    variant = attach_torch_form(BuiltVariant("int8", "int8", onnx_path), spec,
                                ModuleSource(RecurrentThenLinear(layer).eval()))  # fmt: skip
    runner = TorchCPU().load(variant, RunOptions(threads=1))
    try:
        runner.run({"x": np.random.default_rng(0).standard_normal((16, FEATURES)).astype(np.float32)})
        description = runner.describe()
    finally:
        runner.close()
    assert description["lowered_ops"] == 1  # the head
    assert "1 of 1 linear layers); matrix products: 1 of " in description["kernels"]
    assert " in int8, " in description["kernels"] and " left in float32 (" in description["kernels"]


class AttentionThenLinear(nn.Module):
    """Self-attention over 2 steps of x (nn.MultiheadAttention, or a whole nn.TransformerEncoderLayer; 2 heads, as
    PyTorch's fused inference path wants an even number), then a head."""

    def __init__(self, encoder: bool) -> None:
        super().__init__()
        width = FEATURES // 2
        self.encoder = encoder
        self.attention = (nn.TransformerEncoderLayer(width, 2, dim_feedforward=8, dropout=0.0, batch_first=True)
                          if encoder else nn.MultiheadAttention(width, 2, batch_first=True))  # fmt: skip
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = x.view(x.size(0), 2, FEATURES // 2)
        states = self.attention(steps) if self.encoder else self.attention(steps, steps, steps, need_weights=False)[0]
        return self.head(states.mean(1))


@pytest.mark.parametrize("encoder", [False, True])
def test_attention_torchao_left_float_is_said_in_the_int8_label(onnx_path: Path, encoder: bool) -> None:
    """In inference nn.MultiheadAttention runs its in-projection, both attention products and (where torchao left
    its out_proj alone, as it does) the out-projection in one fused op, _native_multi_head_attention, which was not
    counted as a matrix product: a transformer's int8 form read 'int8 (torchao dynamic, 3 of 4 linear layers)' with
    nothing left in float, while the attention ran in float32."""
    torch.manual_seed(0)
    spec = VariantSpec(name="int8", precision="int8", calibrator="dynamic")
    module = AttentionThenLinear(encoder).eval()
    variant = attach_torch_form(BuiltVariant("int8", "int8", onnx_path), spec, ModuleSource(module))
    runner = TorchCPU().load(variant, RunOptions(threads=1))
    try:
        runner.run({"x": np.random.default_rng(0).standard_normal((16, FEATURES)).astype(np.float32)})
        kernels = runner.describe()["kernels"]
    finally:
        runner.close()
    assert "; matrix products: " in kernels and " in int8, " in kernels
    assert " left in float32 (" in kernels and "_native_multi_head_attention" in kernels


def test_unsigned_8_bit_products_count_as_the_int8_form_computing_in_int8() -> None:
    """torchao's dynamic INT8 feeds torch._int_mm unsigned activations on some x86 CPUs: those products ran in 8-bit
    integers, so the form lowered them (it is no float32 model, and the label names only what stayed float)."""
    from collections import Counter

    from qbench.backends.torch_trace import lowered_count, quantized_products_label

    products = {"uint8": Counter({"_int_mm": 2}), "float32": Counter({"matmul": 1})}
    assert lowered_count("int8", products) == 2
    assert quantized_products_label("int8", products) == "; matrix products: 2 of 3 in int8, 1 left in float32 (matmul)"
    assert quantized_products_label("int8", {"uint8": Counter({"_int_mm": 2})}) == ""
    assert lowered_count("float8_e4m3fn", products) == 0  # only INT8 takes either sign
