"""torch-cpu / torch-cuda and the torch forms of variants, on a tiny two-input module exported to ONNX.

Each torch form is compared with ONNX Runtime's FP32 outputs of the same model by SQNR (dB);
failures print the measured value.
"""

from __future__ import annotations

import shutil
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnxruntime as ort
import pytest
import torch
from module_source import ModuleSource
from torch import nn

from qbench.backends import get_backend
from qbench.backends.base import Backend, Runner, RunOptions
from qbench.backends.torch_backend import TorchCPU, TorchCUDA
from qbench.errors import QbenchError
from qbench.recipe.spec import VariantSpec
from qbench.variants.base import BuiltVariant
from qbench.variants.torch_forms import (
    FAKE_QUANT,
    TORCH_COMPILE,
    TORCH_DEVICES,
    TORCH_FORM,
    TORCH_UNAVAILABLE,
    attach_torch_form,
)

INPUT_NAMES = ["x", "ids"]
OUTPUT_NAMES = ["logits", "hidden"]
ROWS = 40


class TinyNet(nn.Module):
    """A float input and an integer input (token ids): logits and the hidden layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.cat([x, self.embed(ids).mean(dim=1)], dim=1)
        hidden = torch.relu(self.fc1(features))
        return self.fc2(hidden), hidden


class ConvOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


@dataclass
class FakeTorchModel(ModuleSource):
    """What qbench.sources.torch_model.TorchModel offers the torch forms: a fresh module per build(), its names."""

    input_names: tuple[str, ...] = tuple(INPUT_NAMES)
    output_names: tuple[str, ...] = tuple(OUTPUT_NAMES)

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        return torch.zeros(2, 8), torch.zeros(2, 4, dtype=torch.int64)


@dataclass(frozen=True)
class Exported:
    torch_model: FakeTorchModel
    onnx_path: Path
    feeds: dict[str, np.ndarray]
    reference: list[np.ndarray]  # ONNX Runtime FP32 outputs on `feeds`


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    torch_model = FakeTorchModel(TinyNet().eval())
    path = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    dynamic = {name: {0: "batch"} for name in INPUT_NAMES + OUTPUT_NAMES}
    torch.onnx.export(
        torch_model.build(), torch_model.example_inputs(), str(path), input_names=INPUT_NAMES,
        output_names=OUTPUT_NAMES, dynamic_axes=dynamic, opset_version=17, dynamo=False,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    # deliberately not in the module's argument order: the runner must order them itself
    feeds = {
        "ids": rng.integers(0, 10, size=(ROWS, 4)).astype(np.int64),
        "x": rng.standard_normal((ROWS, 8)).astype(np.float32),
    }
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return Exported(torch_model, path, feeds, session.run(None, feeds))


def _spec(precision: str, **options: object) -> VariantSpec:
    return VariantSpec(name=f"{precision}-{options.get('calibrator', 'plain')}", precision=precision, **options)


def _torch_variant(exported: Exported, spec: VariantSpec, torch_model: FakeTorchModel | None = None) -> BuiltVariant:
    built = BuiltVariant(name=spec.name, precision=spec.precision, onnx_path=exported.onnx_path)
    return attach_torch_form(built, spec, torch_model or exported.torch_model)


def sqnr_db(reference: np.ndarray, actual: np.ndarray) -> float:
    noise = float(np.sum((reference.astype(np.float64) - actual) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(reference.astype(np.float64) ** 2)) / noise)


def _run_all(backend: Backend, variant: BuiltVariant, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], dict]:
    runner = backend.load(variant, RunOptions(threads=1))
    try:
        return runner.run(feeds), runner.describe()
    finally:
        runner.close()


def test_registered_backends_meet_the_protocol() -> None:
    for name, cls in (("torch-cpu", TorchCPU), ("torch-cuda", TorchCUDA)):
        backend = get_backend(name)
        assert isinstance(backend, cls) and isinstance(backend, Backend)
        assert backend.name == name
    get_backend("torch-cpu").check_available()


@pytest.mark.parametrize(
    ("spec", "min_db", "kernels"),
    [
        (_spec("fp32"), 100.0, "fp32"),
        (_spec("fp16"), 50.0, "fp16"),
        (_spec("bf16"), 35.0, "bf16"),
        (_spec("int8", calibrator="dynamic"), 28.0, "int8 (torchao dynamic, 2 of 2 linear layers"),
    ],
    ids=lambda value: value.name if isinstance(value, VariantSpec) else None,
)
def test_torch_cpu_forms_match_onnxruntime(exported: Exported, spec: VariantSpec, min_db: float, kernels: str) -> None:
    variant = _torch_variant(exported, spec)
    assert variant.params[TORCH_DEVICES] == ["cpu", "cuda"] and variant.params[TORCH_COMPILE] is False
    outputs, description = _run_all(TorchCPU(), variant, exported.feeds)
    assert len(outputs) == 2, "both outputs, in the model's order"
    for name, reference, actual in zip(OUTPUT_NAMES, exported.reference, outputs):
        assert actual.dtype == np.float32 and actual.shape == reference.shape
        measured = sqnr_db(reference, actual)
        assert measured >= min_db, f"{spec.precision} {name}: SQNR {measured:.1f} dB < {min_db} dB"
    assert description["runtime"] == "torch" and description["device"] == "cpu"
    assert description["kernels"].startswith(kernels)
    assert description["threads"] == 1


class RecordsInputDtypes(nn.Module):
    seen: ClassVar[list[tuple[torch.dtype, torch.dtype]]] = []  # shared by the copies that build() makes

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        RecordsInputDtypes.seen.append((x.dtype, ids.dtype))
        return self.inner(x, ids)


@pytest.mark.parametrize(("precision", "dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_half_precision_modules_get_float_inputs_in_their_dtype(
    exported: Exported, precision: str, dtype: torch.dtype
) -> None:
    RecordsInputDtypes.seen.clear()
    recording = FakeTorchModel(RecordsInputDtypes(exported.torch_model.build()))
    variant = _torch_variant(exported, _spec(precision), recording)
    _, description = _run_all(TorchCPU(), variant, exported.feeds)
    assert set(RecordsInputDtypes.seen) == {(dtype, torch.int64)}, "float inputs cast, integer inputs left as they are"
    assert description["dtype"] == str(dtype).removeprefix("torch.")
    probe = {"fp16": torch.ops.mkldnn._is_mkldnn_fp16_supported, "bf16": torch.ops.mkldnn._is_mkldnn_bf16_supported}
    assert (f"no native {precision} matmul" in description["kernels"]) is not probe[precision]()


class CastsToFloat32(nn.Module):
    """Mean pooling as sentence-transformers writes it: the mask is cast with .float(), so the pooled activations
    are float32 whatever the weights' dtype, and a Linear follows."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.after = inner, nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, other = self.inner(x, ids)
        pooled = logits * (ids[:, :1] >= 0).float()
        return self.after(pooled), other


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_forward_that_casts_to_float32_runs_in_half_precision_under_autocast(exported: Exported,
                                                                               precision: str) -> None:
    torch.manual_seed(1)
    fp32 = CastsToFloat32(exported.torch_model.build()).eval()
    variant = _torch_variant(exported, _spec(precision), FakeTorchModel(fp32))
    outputs, _ = _run_all(TorchCPU(), variant, exported.feeds)
    with torch.inference_mode():
        expected = fp32(torch.from_numpy(exported.feeds["x"]), torch.from_numpy(exported.feeds["ids"]))[0].numpy()
    assert sqnr_db(expected, outputs[0]) > {"fp16": 40.0, "bf16": 25.0}[precision]  # computed, in the narrow type


def test_int8_dynamic_form_is_noted(exported: Exported) -> None:
    variant = _torch_variant(exported, _spec("int8", calibrator="dynamic"))
    assert "torchao" in variant.params[TORCH_FORM]
    assert any("torchao int8" in note for note in variant.notes)
    spec = _spec("int8", calibrator="dynamic")
    again = attach_torch_form(variant, spec, exported.torch_model)  # a build read back from the store gets it again
    assert sum("torchao int8" in note for note in again.notes) == 1
    assert again.as_run_in("torch").notes == again.notes and not again.as_run_in("onnx").notes  # the module's note


def test_an_int8_form_whose_every_matrix_product_is_quantized_says_nothing_more(exported: Exported) -> None:
    _, description = _run_all(TorchCPU(), _torch_variant(exported, _spec("int8", calibrator="dynamic")), exported.feeds)
    assert description["lowered_ops"] == 2  # fc1 and fc2 ran in int8 (the embedding's mean is no matrix product)
    assert "matrix products" not in description["kernels"] and "2 of 2 linear layers" in description["kernels"]


def test_new_feeds_are_not_served_from_the_previous_batch(exported: Exported) -> None:
    """The runner reuses converted inputs while the same arrays come again; other arrays must be converted."""
    runner = TorchCPU().load(_torch_variant(exported, _spec("fp32")), RunOptions(threads=1))
    first = {name: array[:8] for name, array in exported.feeds.items()}
    second = {name: array[8:16] for name, array in exported.feeds.items()}
    try:
        a1, a2 = runner.run(first)[0], runner.run(first)[0]
        b = runner.run(second)[0]
    finally:
        runner.close()
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_allclose(b, exported.reference[0][8:16], rtol=1e-5, atol=1e-6)


def test_threads_are_set_while_loaded_and_restored_at_close(exported: Exported) -> None:
    before = torch.get_num_threads()
    runner = TorchCPU().load(_torch_variant(exported, _spec("fp32")), RunOptions(threads=before + 1))
    assert torch.get_num_threads() == before + 1
    runner.close()
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="closed"):
        runner.run(exported.feeds)


def test_dict_and_tuple_outputs_are_flattened_in_order(exported: Exported) -> None:
    class DictOutputs(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor, ids: torch.Tensor) -> dict[str, object]:
            logits, hidden = self.inner(x, ids)
            return {"logits": logits, "extra": None, "rest": (hidden, logits.argmax(dim=1))}

    variant = _torch_variant(exported, _spec("fp32"), FakeTorchModel(DictOutputs(exported.torch_model.build())))
    (logits, hidden, labels), _ = _run_all(TorchCPU(), variant, exported.feeds)
    np.testing.assert_allclose(logits, exported.reference[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hidden, exported.reference[1], rtol=1e-5, atol=1e-6)
    assert labels.dtype == np.int64, "integer outputs keep their dtype"
    np.testing.assert_array_equal(labels, exported.reference[0].argmax(axis=1))


def test_static_int8_has_no_torch_form_and_is_refused_with_the_reason(exported: Exported) -> None:
    variant = _torch_variant(exported, _spec("int8", calibrator="minmax"))
    assert variant.torch_module is None
    reason = TorchCPU().supports(variant)
    assert reason is not None and "ONNX Runtime QDQ" in reason
    with pytest.raises(QbenchError, match="ONNX Runtime QDQ"):
        TorchCPU().load(variant, RunOptions())


def test_a_variant_without_any_torch_form_is_refused() -> None:
    onnx_only = BuiltVariant(name="fp16", precision="fp16", onnx_path=Path("model.onnx"))
    assert "only as an ONNX model" in (TorchCPU().supports(onnx_only) or "")


def test_int8_dynamic_needs_a_linear_layer(exported: Exported) -> None:
    variant = _torch_variant(exported, _spec("int8", calibrator="dynamic"), FakeTorchModel(ConvOnly().eval()))
    assert variant.torch_module is None
    assert "nn.Linear" in (TorchCPU().supports(variant) or "")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_fp8_has_no_torch_form_without_a_recent_gpu(exported: Exported) -> None:
    variant = _torch_variant(exported, _spec("fp8", calibrator="minmax"))
    assert "compute capability >= 8.9" in variant.params[TORCH_UNAVAILABLE]
    assert TorchCPU().supports(variant) == variant.params[TORCH_UNAVAILABLE]


def test_a_cuda_only_form_is_refused_by_torch_cpu(exported: Exported) -> None:
    fp32 = _torch_variant(exported, _spec("fp32"))
    cuda_only = replace(fp32, params={**fp32.params, TORCH_DEVICES: ["cuda"]})
    assert TorchCPU().supports(cuda_only) == "its torch form runs only on cuda"


def test_fake_quant_modules_are_described_as_accuracy_only(exported: Exported) -> None:
    fp32 = _torch_variant(exported, _spec("fp32"))
    qat = replace(fp32, name="qat", precision="int8", params={FAKE_QUANT: True})
    _, description = _run_all(TorchCPU(), qat, exported.feeds)
    assert description["kernels"] == "fake-quant (accuracy only)"


def test_a_builders_own_quantized_module_is_described_as_simulated(exported: Exported) -> None:
    """A quantized module that is not torchao's (ModelOpt's, say) computes in float."""
    fp32 = _torch_variant(exported, _spec("fp32"))
    simulated = replace(fp32, name="int8-modelopt", precision="int8", params={})
    _, description = _run_all(TorchCPU(), simulated, exported.feeds)
    assert description["kernels"] == "int8 simulated in float by its builder (accuracy only)"


def test_read_only_feeds_are_accepted_without_warnings(exported: Exported) -> None:
    frozen = {name: array.copy() for name, array in exported.feeds.items()}
    for array in frozen.values():
        array.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outputs, _ = _run_all(TorchCPU(), _torch_variant(exported, _spec("fp32")), frozen)
    np.testing.assert_allclose(outputs[0], exported.reference[0], rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(
    not any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")),
    reason="torch.compile (Inductor) needs a C++ compiler"
)
def test_compile_on_cpu_matches_eager_and_reports_compile_time(exported: Exported) -> None:
    variant = _torch_variant(exported, _spec("fp32", compile=True))
    assert variant.params[TORCH_COMPILE] is True
    outputs, description = _run_all(TorchCPU(), variant, exported.feeds)
    np.testing.assert_allclose(outputs[0], exported.reference[0], rtol=1e-4, atol=1e-5)
    assert description["compile_ms"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_torch_cuda_refuses_clearly_without_a_gpu(exported: Exported) -> None:
    with pytest.raises(QbenchError, match=r"torch-cuda needs an NVIDIA GPU .*torch.cuda.is_available\(\) is False"):
        TorchCUDA().check_available()
    with pytest.raises(QbenchError, match="torch-cuda needs an NVIDIA GPU"):
        TorchCUDA().load(_torch_variant(exported, _spec("fp32")), RunOptions())


# -- on an NVIDIA GPU ----------------------------------------------------------------------------


def _cuda_describe_checks(description: dict) -> None:
    assert description["device"].startswith("cuda:")
    assert description["gpu_mem_used_max_mb"] > 0, description
    assert description["gpu_samples"] >= 1, description


@pytest.mark.gpu
@pytest.mark.parametrize(("spec", "min_db"), [(_spec("fp16"), 50.0), (_spec("bf16"), 35.0)], ids=["fp16", "bf16"])
def test_torch_cuda_half_precision(exported: Exported, spec: VariantSpec, min_db: float) -> None:
    TorchCUDA().check_available()
    outputs, description = _run_all(TorchCUDA(), _torch_variant(exported, spec), exported.feeds)
    measured = sqnr_db(exported.reference[0], outputs[0])
    assert measured >= min_db, f"{spec.precision} on CUDA: SQNR {measured:.1f} dB < {min_db} dB"
    assert description["dtype"] == {"fp16": "float16", "bf16": "bfloat16"}[spec.precision]
    _cuda_describe_checks(description)


@pytest.mark.gpu
def test_torch_cuda_fp8_on_a_recent_gpu(tmp_path: Path) -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("torchao float8 needs compute capability >= 8.9")
    torch.manual_seed(0)
    wide = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32)).eval()  # dims divisible by 16
    path = tmp_path / "wide.onnx"
    torch.onnx.export(wide, (torch.zeros(2, 64),), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "b"}, "y": {0: "b"}}, opset_version=17, dynamo=False)  # fmt: skip
    feeds = {"x": np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)}
    with torch.inference_mode():
        reference = wide(torch.from_numpy(feeds["x"])).numpy()
    spec = _spec("fp8", calibrator="minmax")
    built = BuiltVariant(name=spec.name, precision="fp8", onnx_path=path)
    variant = attach_torch_form(built, spec, FakeTorchModel(wide, input_names=("x",), output_names=("y",)))
    assert TorchCPU().supports(variant) == "its torch form runs only on cuda"
    outputs, description = _run_all(TorchCUDA(), variant, feeds)
    measured = sqnr_db(reference, outputs[0])
    assert measured >= 20.0, f"fp8 on CUDA: SQNR {measured:.1f} dB"
    assert description["kernels"].startswith("fp8 (torchao float8 e4m3, 2 of 2 linear layers")
    _cuda_describe_checks(description)


def test_loaded_runner_meets_the_protocol(exported: Exported) -> None:
    runner = TorchCPU().load(_torch_variant(exported, _spec("fp32")), RunOptions())
    try:
        assert isinstance(runner, Runner)
    finally:
        runner.close()


def test_unset_threads_are_the_usable_cpus_while_loaded(exported: Exported, monkeypatch) -> None:
    """torch's own default counts the affinity mask's CPUs, not a cgroup quota's: unset threads are the usable CPUs
    (qbench.environment.default_threads) while the runner is loaded, and the count before comes back at close."""
    from qbench import environment

    monkeypatch.setattr(environment, "cpu_allowance", lambda root=None: environment.CpuAllowance(64, 1.0))
    original = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        runner = TorchCPU().load(_torch_variant(exported, _spec("fp32")), RunOptions())
        assert torch.get_num_threads() == 1 and runner.describe()["threads"] == 1
        runner.close()
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(original)
