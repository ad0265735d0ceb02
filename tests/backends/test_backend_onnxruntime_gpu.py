"""ONNX Runtime's CUDA and TensorRT execution providers: clear errors without them (run everywhere),
the visible-GPU probe on stand-ins for NVML and nvidia-smi, and real GPU runs (marked gpu)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest
import yaml
from matmul_model import WEIGHT

from qbench.backends import get_backend
from qbench.backends import onnxruntime_gpu as gpu_module
from qbench.backends.base import Backend, Runner, RunOptions
from qbench.backends.onnxruntime_cpu import OnnxRuntimeCPU
from qbench.backends.onnxruntime_gpu import (
    GpuProbe,
    OnnxRuntimeCUDA,
    OnnxRuntimeGpuBackend,
    OnnxRuntimeTensorRT,
    ProviderEntry,
    parse_nvidia_smi_list,
    probe_gpus,
)
from qbench.cli.app import main
from qbench.errors import MissingExtraError, QbenchError
from qbench.variants.base import BuiltVariant


def _variant(path: Path, precision: str = "fp32") -> BuiltVariant:
    return BuiltVariant(name=precision, precision=precision, onnx_path=path)


def _providers(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make onnxruntime report exactly these providers (what an onnxruntime-gpu install would list)."""
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: list(names))


def _gpus(monkeypatch: pytest.MonkeyPatch, *names: str, reason: str = "stand-in: no GPU") -> None:
    monkeypatch.setattr(gpu_module, "probe_gpus", lambda: GpuProbe(tuple(names), "" if names else reason))


class _FakeNvml:
    """NVML as pynvml exposes it, for two GPUs (names come back as bytes, as older pynvml returns them)."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[tuple[str, str]] | None = None, fail: bool = False) -> None:
        self._gpus = gpus if gpus is not None else [("NVIDIA H100 80GB HBM3", "GPU-aaa"), ("NVIDIA L4", "GPU-bbb")]
        self._fail = fail
        self.open = 0

    def nvmlInit(self) -> None:
        if self._fail:
            raise self.NVMLError("Driver Not Loaded")
        self.open += 1

    def nvmlShutdown(self) -> None:
        self.open -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return self._gpus[handle][0].encode()

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self._gpus[handle][1]


# -- registry and errors (run everywhere) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cls", "first"),
    [("onnxruntime-cuda", OnnxRuntimeCUDA, "CUDAExecutionProvider"),
     ("onnxruntime-tensorrt", OnnxRuntimeTensorRT, "TensorrtExecutionProvider")],
)  # fmt: skip
def test_registered_backends_meet_the_protocol(name: str, cls: type, first: str) -> None:
    backend = get_backend(name)
    assert isinstance(backend, cls) and isinstance(backend, Backend)
    assert backend.name == name and backend.required_provider == first and backend.extra == "gpu"


@pytest.mark.parametrize("backend", [OnnxRuntimeCUDA(), OnnxRuntimeTensorRT()], ids=lambda b: b.name)
def test_missing_provider_names_the_gpu_extra(monkeypatch: pytest.MonkeyPatch, backend: OnnxRuntimeGpuBackend) -> None:
    _providers(monkeypatch, "CPUExecutionProvider")
    with pytest.raises(MissingExtraError) as caught:
        backend.check_available()
    message = str(caught.value)
    assert caught.value.extra == "gpu"
    assert "onnxruntime-gpu is not installed" in message and "pip install 'qbench[gpu]'" in message
    assert "uninstall onnxruntime first" in message and "CPUExecutionProvider" in message


def test_provider_without_a_visible_gpu_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime-gpu lists its providers on a machine without a GPU (pitfall 10): the device is checked too."""
    _providers(monkeypatch, "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
    _gpus(monkeypatch, reason="NVML cannot reach an NVIDIA driver (Driver Not Loaded)")
    for backend in (OnnxRuntimeCUDA(), OnnxRuntimeTensorRT()):
        with pytest.raises(QbenchError, match="no NVIDIA GPU visible: NVML cannot reach") as caught:
            backend.check_available()
        assert not isinstance(caught.value, MissingExtraError)
        assert backend.name in str(caught.value)
    _gpus(monkeypatch, "NVIDIA H100 80GB HBM3")
    OnnxRuntimeCUDA().check_available()  # provider and GPU both there: no error


def _recipe(tmp_path: Path, model_path: Path, backends: list[str]) -> Path:
    (tmp_path / "data.csv").write_text("a,b,c\n" + "\n".join(f"{i},{i + 1},{i + 2}" for i in range(4)) + "\n")
    recipe = tmp_path / "gpu.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "gpu-check", "model": {"path": str(model_path)},
        "data": {"path": "data.csv", "inputs": {"a": "x"}},
        "variants": [{"name": "fp16", "precision": "fp16"}], "backends": backends,
    }))  # fmt: skip
    return recipe


def test_validate_names_the_backend_field_and_the_extra(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _providers(monkeypatch, "CPUExecutionProvider")
    recipe = _recipe(tmp_path, model_path, ["onnxruntime-cpu", "onnxruntime-cuda"])
    assert main(["validate", str(recipe)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err
    assert "gpu.yaml: backends[1]: onnxruntime-gpu is not installed" in err
    assert "pip install 'qbench[gpu]'" in err and "uninstall onnxruntime first" in err


# -- the visible-GPU probe ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("visible", "names"),
    [(None, ("NVIDIA H100 80GB HBM3", "NVIDIA L4")), ("1", ("NVIDIA L4",)), ("GPU-bb", ("NVIDIA L4",)),
     ("1,0", ("NVIDIA L4", "NVIDIA H100 80GB HBM3")), ("0,7,1", ("NVIDIA H100 80GB HBM3",))],
)  # fmt: skip
def test_probe_reads_nvml_and_honours_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, names: tuple[str, ...]
) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    nvml = _FakeNvml()
    assert probe_gpus(nvml=nvml) == GpuProbe(names)
    assert nvml.open == 0  # every nvmlInit was matched by an nvmlShutdown


@pytest.mark.parametrize("visible", ["", "-1", "9"])
def test_cuda_visible_devices_can_hide_every_gpu(monkeypatch: pytest.MonkeyPatch, visible: str) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    found = probe_gpus(nvml=_FakeNvml())
    assert found.names == () and f"CUDA_VISIBLE_DEVICES={visible!r} hides all 2 GPU(s)" in found.reason


def test_probe_without_a_driver_or_without_gpus_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert probe_gpus(nvml=_FakeNvml(fail=True)).reason == "NVML cannot reach an NVIDIA driver (Driver Not Loaded)"
    assert probe_gpus(nvml=_FakeNvml(gpus=[])) == GpuProbe((), "the NVIDIA driver reports no GPU")


def test_probe_falls_back_to_nvidia_smi_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu_module, "_import_optional", lambda module: None)
    listing = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-0c1)\nGPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-9f2)\n"
    assert probe_gpus(nvidia_smi=lambda: listing).names == ("NVIDIA A100-SXM4-40GB",) * 2
    assert "nvidia-smi is not on PATH" in probe_gpus(nvidia_smi=lambda: None).reason
    assert probe_gpus(nvidia_smi=lambda: "").reason == "the NVIDIA driver reports no GPU"


def test_parse_nvidia_smi_list_reads_index_name_and_uuid() -> None:
    [gpu] = parse_nvidia_smi_list("No devices were found\nGPU 3: Tesla T4 (UUID: GPU-12ab-34cd)\n")
    assert (gpu.index, gpu.name, gpu.uuid) == (3, "Tesla T4", "GPU-12ab-34cd")


def test_probe_on_this_machine_never_raises() -> None:
    found = probe_gpus()
    assert bool(found.names) != bool(found.reason)  # either GPUs, or the reason there are none


# -- provider options and the load path, on the CPU provider ---------------------------------------------


def test_tensorrt_provider_caches_engines_and_follows_the_precision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_path: Path
) -> None:
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    entries = OnnxRuntimeTensorRT().provider_entries(_variant(model_path, "fp16"))
    assert [e[0] if isinstance(e, tuple) else e for e in entries] == list(OnnxRuntimeTensorRT.providers)
    _, options = entries[0]
    cache = tmp_path / "cache" / "onnxruntime-tensorrt"
    assert options["trt_engine_cache_enable"] == "True" and Path(options["trt_engine_cache_path"]) == cache
    assert options["trt_timing_cache_enable"] == "True" and cache.is_dir()
    assert options["trt_fp16_enable"] == "True"
    fp32_options = OnnxRuntimeTensorRT().provider_entries(_variant(model_path, "fp32"))[0][1]
    assert fp32_options["trt_fp16_enable"] == "False"
    assert OnnxRuntimeCUDA().provider_entries(_variant(model_path))[0] == ("CUDAExecutionProvider", {"device_id": "0"})


class _CpuStandIn(OnnxRuntimeGpuBackend):
    """The GPU backends' load path, pointed at the CPU provider so it runs here."""

    name = "onnxruntime-standin"
    providers = ("CPUExecutionProvider",)

    def provider_entries(self, variant: BuiltVariant) -> list[ProviderEntry]:
        return [("CPUExecutionProvider", {"arena_extend_strategy": "kSameAsRequested"})]


class _AbsentProvider(OnnxRuntimeGpuBackend):
    name = "onnxruntime-absent"
    providers = ("NoSuchExecutionProvider", "CPUExecutionProvider")

    def provider_entries(self, variant: BuiltVariant) -> list[ProviderEntry]:
        return [("NoSuchExecutionProvider", {"device_id": "0"}), "CPUExecutionProvider"]


def test_load_runs_and_describes_what_it_timed(monkeypatch: pytest.MonkeyPatch, model_path: Path) -> None:
    _gpus(monkeypatch, "NVIDIA H100 80GB HBM3")
    runner = _CpuStandIn().load(_variant(model_path), RunOptions(threads=1))
    assert isinstance(runner, Runner)
    x = np.array([[1, 2, 3], [0, -1, 0]], dtype=np.float32)
    np.testing.assert_allclose(runner.run({"x": x})[0], x @ WEIGHT, rtol=1e-6)
    described: dict[str, Any] = runner.describe()
    assert described["device"] == "NVIDIA H100 80GB HBM3"
    assert described["providers"][0] == "CPUExecutionProvider" and described["intra_op_threads"] == 1
    assert described["provider_options"] == {"arena_extend_strategy": "kSameAsRequested"}
    assert "H2D" in described["timing"] and "D2H" in described["timing"]
    runner.close()
    with pytest.raises(RuntimeError, match="closed"):
        runner.run({"x": x})


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_load_refuses_a_silent_fallback_and_says_what_to_check(
    monkeypatch: pytest.MonkeyPatch, model_path: Path
) -> None:
    _gpus(monkeypatch, "NVIDIA H100 80GB HBM3")
    with pytest.raises(QbenchError, match="fell back to CPUExecutionProvider instead of NoSuchExecutionProvider") as e:
        _AbsentProvider().load(_variant(model_path), RunOptions())
    assert "cuDNN" in str(e.value)


def test_load_without_a_gpu_fails_before_creating_a_session(monkeypatch: pytest.MonkeyPatch, model_path: Path) -> None:
    _gpus(monkeypatch)
    with pytest.raises(QbenchError, match="no NVIDIA GPU visible"):
        _CpuStandIn().load(_variant(model_path), RunOptions())


def test_bad_model_is_a_user_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _gpus(monkeypatch, "NVIDIA H100 80GB HBM3")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(QbenchError, match="cannot load"):
        _CpuStandIn().load(_variant(garbage), RunOptions())


# -- on a GPU -----------------------------------------------------------------------------------------------


def _require_provider(provider: str) -> None:
    if provider not in onnxruntime.get_available_providers():
        pytest.skip(f"this onnxruntime has no {provider} (install onnxruntime-gpu: pip install 'qbench[gpu]')")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", [OnnxRuntimeCUDA(), OnnxRuntimeTensorRT()], ids=lambda b: b.name)
def test_gpu_outputs_match_the_cpu_provider(
    backend: OnnxRuntimeGpuBackend, model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _require_provider(backend.required_provider)
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    backend.check_available()
    x = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    cpu = OnnxRuntimeCPU().load(_variant(model_path), RunOptions())
    expected = cpu.run({"x": x})[0]
    cpu.close()
    runner = backend.load(_variant(model_path), RunOptions())
    try:
        np.testing.assert_allclose(runner.run({"x": x})[0], expected, rtol=1e-3, atol=1e-3)
        described = runner.describe()
        assert described["providers"][0] == backend.required_provider
        assert described["device"]
    finally:
        runner.close()
