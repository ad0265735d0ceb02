"""ONNX Runtime on NVIDIA GPUs: the CUDA and the TensorRT execution providers.

Both come with `onnxruntime-gpu` (the `gpu` extra), which replaces `onnxruntime`.
That package lists its GPU providers as available on any machine, GPU or not, and
a session silently falls back to the CPU when the device or its libraries are
missing (trials.md, pitfall 10). So `check_available` also looks for a visible
NVIDIA GPU, and `load` refuses a session whose first provider is not the one asked
for, naming the libraries that usually explain the fallback.

What `run` times: `InferenceSession.run` on host arrays. ONNX Runtime copies the
inputs to the GPU, runs, copies the outputs back and returns after that copy, so
a figure is host latency (H2D + compute + D2H), what a caller of ONNX Runtime with
NumPy arrays pays, not device-only compute time. Binding inputs on the device once
per batch would drop the H2D copy from the figure, but the runner cannot tell a
reused batch from a buffer refilled in place, and a stale input would silently
corrupt the accuracy results; the TensorRT backend (tensorrt.py) reports device
compute time separately, from CUDA events.

The visible-GPU probe here is shared with the TensorRT backend.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from qbench.backends.base import RunOptions
from qbench.backends.gpu_monitor import GpuMonitor
from qbench.backends.onnxruntime import (
    OnnxRuntimeBackend,
    OnnxRuntimeRunner,
    _import_onnxruntime,
    _load_errors,
    load_failure,
)
from qbench.errors import QbenchError
from qbench.files import cache_dir
from qbench.variants.base import BuiltVariant

if TYPE_CHECKING:  # pragma: no cover
    import onnxruntime

GPU_EXTRA = "gpu"
ONNXRUNTIME_GPU_HINT = "It replaces onnxruntime: uninstall onnxruntime first (pip uninstall onnxruntime)"
DEVICE_ID = 0  # qbench runs on the first visible GPU; choose another with CUDA_VISIBLE_DEVICES
_NVIDIA_SMI_TIMEOUT_S = 20
_SMI_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)")

ProviderEntry = str | tuple[str, dict[str, str]]


# -- is an NVIDIA GPU visible? --------------------------------------------------------------------


@dataclass(frozen=True)
class GpuProbe:
    """The NVIDIA GPUs this process can use, in CUDA order; `reason` says why there are none."""

    names: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str


def _nvml_inventory(nvml: Any) -> list[Gpu]:
    """Every GPU on the host, from NVML (raises nvml.NVMLError without a driver)."""
    nvml.nvmlInit()
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(Gpu(index, _text(nvml.nvmlDeviceGetName(handle)), _text(nvml.nvmlDeviceGetUUID(handle))))
        return gpus
    finally:
        nvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def parse_nvidia_smi_list(text: str) -> list[Gpu]:
    """GPUs from `nvidia-smi -L` lines such as 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1b2c...)'."""
    matches = (_SMI_LINE.match(line.strip()) for line in text.splitlines())
    return [Gpu(int(m.group(1)), m.group(2), m.group(3)) for m in matches if m]


def _named_gpu(entry: str, gpus: Sequence[Gpu]) -> Gpu | None:
    """The GPU a CUDA_VISIBLE_DEVICES entry names: an index, a GPU UUID prefix, or a MIG instance UUID."""
    if entry.startswith("MIG-"):  # NVML lists whole GPUs; trust the instance the user named
        return Gpu(-1, f"MIG instance {entry}", entry)
    for gpu in gpus:
        if (entry.isdigit() and gpu.index == int(entry)) or (entry.startswith("GPU-") and gpu.uuid.startswith(entry)):
            return gpu
    return None


def visible_gpus(gpus: Sequence[Gpu], cuda_visible_devices: str | None) -> list[Gpu]:
    """The GPUs CUDA shows this process: CUDA_VISIBLE_DEVICES lists indices or UUIDs and ends at the
    first entry that names no GPU (so '' and '-1' hide every GPU)."""
    if cuda_visible_devices is None:
        return list(gpus)
    visible = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        match = _named_gpu(entry, gpus)
        if match is None:
            break
        visible.append(match)
    return visible


def probe_gpus(nvml: Any | None = None, nvidia_smi: Callable[[], str | None] | None = None) -> GpuProbe:
    """Which NVIDIA GPUs are visible, from NVML (nvidia-ml-py) or else `nvidia-smi -L`; never raises.

    nvml / nvidia_smi: stand-ins for tests (nvidia_smi returns the command's output, None when absent).
    """
    nvml = nvml if nvml is not None else _import_optional("pynvml")
    if nvml is not None:
        try:
            gpus = _nvml_inventory(nvml)
        except nvml.NVMLError as exc:
            return GpuProbe((), f"NVML cannot reach an NVIDIA driver ({exc})")
    else:
        listing = (nvidia_smi or _run_nvidia_smi)()
        if listing is None:
            return GpuProbe((), "no NVIDIA driver found (nvidia-smi is not on PATH and nvidia-ml-py is not installed)")
        gpus = parse_nvidia_smi_list(listing)
    if not gpus:
        return GpuProbe((), "the NVIDIA driver reports no GPU")
    cuda_visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = visible_gpus(gpus, cuda_visible)
    if not visible:
        return GpuProbe((), f"CUDA_VISIBLE_DEVICES={cuda_visible!r} hides all {len(gpus)} GPU(s)")
    return GpuProbe(tuple(g.name for g in visible))


def _import_optional(module: str) -> Any | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _run_nvidia_smi() -> str | None:
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return None
    try:
        done = subprocess.run(
            [executable, "-L"], check=False, capture_output=True, text=True, timeout=_NVIDIA_SMI_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def require_gpu(backend: str) -> str:
    """The name of the GPU `backend` will run on; QbenchError when no NVIDIA GPU is visible."""
    found = probe_gpus()
    if not found.names:
        raise QbenchError(f"no NVIDIA GPU visible: {found.reason}; {backend} needs one")
    return found.names[DEVICE_ID]


# -- the backends -------------------------------------------------------------------------------


class OnnxRuntimeGpuRunner(OnnxRuntimeRunner):
    """An ONNX Runtime session on a GPU provider, with the GPU's name, the provider options qbench set,
    what `run` times, and GPU utilisation and memory sampled while the runner is alive."""

    def __init__(
        self, session: onnxruntime.InferenceSession, version: str, gpu_name: str, options: Mapping[str, str]
    ) -> None:
        super().__init__(session, version)
        self._gpu_name = gpu_name
        self._options = dict(options)
        self._monitor = GpuMonitor(DEVICE_ID)
        self._monitor.start()

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "device": self._gpu_name,
            "provider_options": self._options,
            "timing": "host latency: InferenceSession.run on host arrays (H2D copy + compute + D2H copy)",
            **self._monitor.snapshot(),
        }

    def close(self) -> None:
        self._monitor.stop()
        super().close()


class OnnxRuntimeGpuBackend(OnnxRuntimeBackend):
    """ONNX Runtime with a GPU provider first; subclasses give the provider entries (name and options)."""

    extra: ClassVar[str] = GPU_EXTRA
    needs_gpu: ClassVar[bool] = True  # a job on this backend asks the cluster for a GPU
    # what usually makes ONNX Runtime drop this provider, for the fallback error
    fallback_hint: ClassVar[str] = (
        "check that the CUDA and cuDNN libraries this onnxruntime-gpu was built for are installed and loadable"
    )

    install_name: ClassVar[str | None] = "onnxruntime-gpu"
    install_hint: ClassVar[str | None] = ONNXRUNTIME_GPU_HINT

    def check_available(self) -> None:
        super().check_available()
        require_gpu(self.name)

    def provider_entries(self, variant: BuiltVariant) -> list[ProviderEntry]:
        """The `providers` argument of InferenceSession: the required provider first, with its options."""
        raise NotImplementedError

    def load(self, variant: BuiltVariant, options: RunOptions) -> OnnxRuntimeGpuRunner:
        """A runner on the GPU provider; QbenchError if ORT rejects the model or falls back to another provider."""
        ort = _import_onnxruntime(self.extra)
        gpu_name = require_gpu(self.name)
        entries = self.provider_entries(variant)
        try:
            session = ort.InferenceSession(
                str(variant.onnx_path), sess_options=self.session_options(variant, options), providers=entries
            )
        except _load_errors() as exc:
            raise load_failure(variant, exc) from None
        in_use = session.get_providers()
        if not in_use or in_use[0] != self.required_provider:
            raise QbenchError(
                f"{self.name}: onnxruntime fell back to {in_use[0] if in_use else 'no provider'} instead of "
                f"{self.required_provider} for variant {variant.name} ({self.fallback_hint}); "
                f"its timings would not be {self.name} timings"
            )
        return OnnxRuntimeGpuRunner(session, ort.__version__, gpu_name, _options_of(entries[0]))


def _options_of(entry: ProviderEntry) -> dict[str, str]:
    return dict(entry[1]) if isinstance(entry, tuple) else {}


class OnnxRuntimeCUDA(OnnxRuntimeGpuBackend):
    name = "onnxruntime-cuda"
    providers = ("CUDAExecutionProvider", "CPUExecutionProvider")

    def provider_entries(self, variant: BuiltVariant) -> list[ProviderEntry]:
        return [("CUDAExecutionProvider", {"device_id": str(DEVICE_ID)}), "CPUExecutionProvider"]


class OnnxRuntimeTensorRT(OnnxRuntimeGpuBackend):
    """TensorRT inside ONNX Runtime: engines and timing caches persist under <qbench cache>/onnxruntime-tensorrt,
    so only the first session of a model pays for the engine build. Subgraphs TensorRT cannot take run on CUDA.

    Precision follows the variant's graph: FP16 variants also get TensorRT's FP16 flag (as the `tensorrt`
    backend does); without it ONNX Runtime builds a strongly typed network, which runs Q/DQ graphs
    (INT8, FP8) with explicit quantization and every other tensor in the type the graph gives it.
    """

    name = "onnxruntime-tensorrt"
    runtime_packages = ("onnxruntime-gpu", "tensorrt")
    providers = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
    fallback_hint = (
        "check that TensorRT's libraries (libnvinfer) are installed and loadable: "
        "pip install --extra-index-url https://pypi.nvidia.com tensorrt"
    )

    def provider_entries(self, variant: BuiltVariant) -> list[ProviderEntry]:
        cache = cache_dir() / "onnxruntime-tensorrt"
        cache.mkdir(parents=True, exist_ok=True)
        options = {
            "device_id": str(DEVICE_ID),
            "trt_engine_cache_enable": "True",
            "trt_engine_cache_path": str(cache),
            "trt_timing_cache_enable": "True",
            "trt_timing_cache_path": str(cache),
            "trt_fp16_enable": str(variant.precision == "fp16"),
        }
        return [
            ("TensorrtExecutionProvider", options),
            ("CUDAExecutionProvider", {"device_id": str(DEVICE_ID)}),
            "CPUExecutionProvider",
        ]
