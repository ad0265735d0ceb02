"""Each backend's result carries only what is true of the form of the variant it ran: the ONNX builder's params and
notes on ONNX Runtime, the torch form's (and what torch itself saw compute) on torch-cpu."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from test_explain import INT8, WIDTH, write_fragile_project
from torch import nn

from qbench.backends import get_backend
from qbench.preflight import prepare
from qbench.recipe import LatencySpec, VariantSpec, load_recipe
from qbench.validate.measure import measure
from qbench.variants import BuildContext, build_variant
from qbench.variants.fp16 import BF16_NOTE
from qbench.variants.torch_forms import TORCH_FORM, attach_torch_form


class LinearThenMatmul(nn.Module):
    """An nn.Linear (torchao quantizes it) then a raw matmul with a parameter (torchao leaves it float)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.out = nn.Parameter(torch.randn(WIDTH, 4) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(torch.relu(self.fc(x)), self.out)


@dataclass
class Source:
    """What the torch forms need of the recipe's PyTorch source: a fresh module per build()."""

    template: nn.Module

    def build(self) -> nn.Module:
        return copy.deepcopy(self.template)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepare(load_recipe(write_fragile_project(tmp_path_factory.mktemp("forms"), [INT8])), track=False)


def _built(prepared, tmp_path, spec: VariantSpec):
    built = build_variant(spec, BuildContext(prepared.source.onnx_path, tmp_path, prepared.calibration_batches))
    return attach_torch_form(built, spec, Source(LinearThenMatmul().eval()))


def test_the_bf16_rounding_graphs_emulation_is_not_said_of_the_torch_module(prepared, tmp_path):
    built = _built(prepared, tmp_path, VariantSpec(name="bf16", precision="bf16"))
    on_torch = measure(get_backend("torch-cpu"), built, prepared, quiet=True).result
    on_ort = measure(get_backend("onnxruntime-cpu"), built, prepared, quiet=True).result
    assert on_torch.status == on_ort.status == "ok"
    assert BF16_NOTE not in on_torch.notes and BF16_NOTE in on_ort.notes
    assert on_torch.fidelity.accuracy == on_torch.fidelity.latency == "native"  # torch computed in bfloat16
    assert on_ort.fidelity.accuracy == on_ort.fidelity.latency == "emulated"
    assert "rounded_weights" not in on_torch.params and "rounded_weights" in on_ort.params  # the graph's counts
    assert on_torch.params[TORCH_FORM].startswith("bf16") and TORCH_FORM not in on_ort.params
    assert on_torch.params["runtime.lowered_ops"] > 0


def test_torchao_int8_says_which_matrix_products_stayed_float_and_carries_no_onnx_kernel_counts(prepared, tmp_path):
    built = _built(prepared, tmp_path, VariantSpec(name="dyn", precision="int8", calibrator="dynamic"))
    timing = LatencySpec(batch_sizes=[1, 50], warmup=1, iterations=2, stability=None)
    on_torch = measure(get_backend("torch-cpu"), built, prepared, timing=timing, quiet=True).result
    on_ort = measure(get_backend("onnxruntime-cpu"), built, prepared, timing=timing, quiet=True).result
    assert on_torch.status == on_ort.status == "ok"
    kernels = on_torch.params["runtime.kernels"]
    assert "1 of 1 linear layers" in kernels and "matrix products: 1 of 2 in int8, 1 left in float32 (matmul)" in kernels
    assert on_torch.params["runtime.lowered_ops"] == 1
    for key in ("quantized_nodes", "integer_kernels_of", "calibrator", "quant_format"):  # ONNX Runtime's graph
        assert key not in on_torch.params and key in on_ort.params
    # ORT's dynamic INT8 scales a whole batch at once; torchao's per-token scales do not depend on the batch
    assert any("per batch" in note for note in on_ort.notes) and not any("per batch" in n for n in on_torch.notes)
    assert any(note.startswith("torch form: torchao") for note in on_torch.notes)
    assert not any(note.startswith("torch form") for note in on_ort.notes)
