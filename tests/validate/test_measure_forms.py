"""Each backend's result carries only what is true of the form of the variant it ran: the ONNX builder's params and
notes on ONNX Runtime, the torch form's (and what torch itself saw compute) on torch-cpu."""

from __future__ import annotations

import pytest
import torch
from module_source import ModuleSource
from torch import nn

from qbench.backends import get_backend
from qbench.backends.torch_backend import TorchCPU
from qbench.backends.torch_state import module_state
from qbench.preflight.prepare import prepare
from qbench.provenance import model_bytes, model_sha256
from qbench.recipe.spec import LatencySpec, VariantSpec, load_recipe
from qbench.validate.measure import failed_result, measure
from qbench.variants import BuildContext, build_variant
from qbench.variants.fp16 import BF16_NOTE
from qbench.variants.torch_forms import TORCH_FORM, attach_torch_form, torch_form_for
from tests.explain.test_sensitivity import INT8, WIDTH, write_fragile_project


class LinearThenMatmul(nn.Module):
    """An nn.Linear (torchao quantizes it) then a raw matmul with a parameter (torchao leaves it float)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.out = nn.Parameter(torch.randn(WIDTH, 4) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(torch.relu(self.fc(x)), self.out)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepare(load_recipe(write_fragile_project(tmp_path_factory.mktemp("forms"), [INT8])), track=False)


def _built(prepared, tmp_path, spec: VariantSpec):
    built = build_variant(spec, BuildContext(prepared.source.onnx_path, tmp_path, prepared.calibration_batches))
    return attach_torch_form(built, spec, ModuleSource(LinearThenMatmul().eval()))


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
    # torchao's per-token scales do not depend on the batch: the measured batch dependence finds nothing there
    assert not any(n.startswith("rows depend on their batch") for n in on_torch.notes)
    assert any(note.startswith("torch form: torchao") for note in on_torch.notes)
    assert not any(note.startswith("torch form") for note in on_ort.notes)


def test_a_torch_result_records_the_module_it_ran_and_its_bound_uses_the_modules_bytes(prepared, tmp_path):
    built = _built(prepared, tmp_path, VariantSpec(name="bf16", precision="bf16"))
    timing = LatencySpec(batch_sizes=[1, 8], warmup=1, iterations=5, stability=None)
    on_torch = measure(get_backend("torch-cpu"), built, prepared, timing=timing, quiet=True, serving=True).result
    on_ort = measure(get_backend("onnxruntime-cpu"), built, prepared, timing=timing, quiet=True, serving=True).result
    assert on_torch.status == on_ort.status == "ok"
    ran = module_state(built.torch_module())
    assert on_torch.model_bytes == ran.bytes == module_state(LinearThenMatmul()).bytes // 2  # bfloat16: 2 bytes each
    assert on_ort.model_bytes == model_bytes(built.onnx_path) > 1.5 * on_torch.model_bytes  # the FP32 rounding graph
    assert on_torch.model_sha256 == ran.sha256 != on_ort.model_sha256 == model_sha256(built.onnx_path)
    assert on_torch.model_path is None and on_ort.model_path == str(built.onnx_path)
    b1 = on_torch.latency.at(1).p50_ms
    assert on_torch.serving.bound.weight_bytes_per_s == pytest.approx(ran.bytes * 1000.0 / b1)


def test_fp16_without_native_cpu_kernels_is_emulated_latency_as_its_kernels_label_says(prepared, tmp_path, monkeypatch):
    monkeypatch.setattr(TorchCPU, "caveat", lambda self,
                        precision: " (no native fp16 matmul on this CPU: accuracy only)")  # fmt: skip
    built = _built(prepared, tmp_path, VariantSpec(name="fp16", precision="fp16"))
    result = measure(get_backend("torch-cpu"), built, prepared, quiet=True).result
    assert result.status == "ok" and "no native fp16 matmul" in result.params["runtime.kernels"]
    assert (result.fidelity.accuracy, result.fidelity.latency) == ("native", "emulated")
    assert "no native fp16 matmul" in result.fidelity.method


class CastsToFloat(nn.Module):
    """A forward that computes in float32 whatever its weights' dtype: no op runs in float16."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(torch.randn(WIDTH, 4) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float().unsqueeze(-1) * self.w.float()).sum(1)


def test_a_half_variant_none_of_whose_ops_ran_in_its_type_is_not_native(prepared, tmp_path):
    spec = VariantSpec(name="fp16", precision="fp16")
    built = build_variant(spec, BuildContext(prepared.source.onnx_path, tmp_path, prepared.calibration_batches))
    built = attach_torch_form(built, spec, ModuleSource(CastsToFloat().eval()))
    result = measure(get_backend("torch-cpu"), built, prepared, quiet=True).result
    assert result.status == "ok" and result.params["runtime.lowered_ops"] == 0
    assert "no op computed in float16" in result.params["runtime.kernels"]
    assert result.fidelity.accuracy == result.fidelity.latency == "emulated"


class Raises(LinearThenMatmul):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this module cannot run")


def test_a_skipped_or_failed_torch_result_names_no_onnx_file_and_carries_only_the_torch_forms_params(prepared, tmp_path):
    """A torch backend never runs the ONNX file: a result that did not run records no model, as one that ran records
    the module, and none of the graph's params; the ONNX Runtime result of the same build names its file."""
    torch_cpu, ort = get_backend("torch-cpu"), get_backend("onnxruntime-cpu")
    # a Q/DQ model only: no torch form, skipped
    static = VariantSpec(name="static", precision="int8", calibrator="minmax")
    built = build_variant(static, BuildContext(prepared.source.onnx_path, tmp_path, prepared.calibration_batches))
    skipped = measure(torch_cpu, attach_torch_form(built, static, ModuleSource(LinearThenMatmul())), prepared,
                      quiet=True)  # fmt: skip
    failing = _built(prepared, tmp_path, VariantSpec(name="bf16", precision="bf16"))
    failing = attach_torch_form(failing, VariantSpec(name="bf16", precision="bf16"), ModuleSource(Raises().eval()))
    failed = measure(torch_cpu, failing, prepared, quiet=True).result
    lost = failed_result(failing, torch_cpu, "worker lost")  # the scheduler's record of a job whose worker died
    assert (skipped.result.status, failed.status, skipped.result.error) == ("skipped", "failed", built_reason(static))
    assert "rounded_weights" not in failed.params and "rounded_weights" not in lost.params
    assert "quantized_nodes" not in skipped.result.params
    for result in (skipped.result, failed, lost):
        assert result.model_path is None and result.model_bytes is None and result.model_sha256 is None
    on_ort = failed_result(failing, ort, "worker lost")
    assert on_ort.model_path == str(failing.onnx_path) and "rounded_weights" in on_ort.params


def built_reason(spec: VariantSpec) -> str:
    reason = torch_form_for(spec, None)
    assert isinstance(reason, str)
    return reason


def test_a_variant_without_a_torch_form_keeps_the_forms_its_builder_marked(tmp_path):
    """No torch form: the graph's params are the graph's, the reason the torch backends', and a param its builder
    already marked as its module's (a read-back QAT build's training) stays so."""
    from qbench.variants.base import TORCH, BuiltVariant
    from qbench.variants.torch_forms import TORCH_UNAVAILABLE

    spec = VariantSpec(name="static", precision="int8", calibrator="minmax")
    built = BuiltVariant("static", "int8", tmp_path / "m.onnx", params={"opset": 17, "qat.epochs": 3},
                         param_forms={"qat.epochs": TORCH})  # fmt: skip
    on_torch = attach_torch_form(built, spec, ModuleSource(LinearThenMatmul())).as_run_in(TORCH)
    assert set(on_torch.params) == {"qat.epochs", TORCH_UNAVAILABLE}
