"""GPU utilisation and memory, sampled in a background thread while a GPU backend runs.

Shared by every GPU backend (torch-cuda, onnxruntime-cuda/-tensorrt, tensorrt): start() when the
runner is loaded, stop() when it is closed, snapshot() for the numbers collected so far.

NVML (nvidia-ml-py's `pynvml`) reports device-wide figures: utilisation is the share of time a
kernel ran on the GPU during NVML's own sampling window (1/6 s to 1 s depending on the GPU), and
memory is everything allocated on the device, other processes included. They say whether the GPU
was busy and how much memory the run needed, not what one kernel cost.

A monitor never raises: without NVML (no driver, no GPU, no nvidia-ml-py) or on a device that
cannot report a figure (utilisation is not supported on MIG instances), the figure is left out and
an unavailable monitor returns {}.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any

DEFAULT_INTERVAL_S = 0.05
_MIB = 1024 * 1024


def _import_nvml() -> Any | None:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def _nvml_handle(nvml: Any, device: int | str) -> Any:
    """The NVML handle of `device`: a CUDA device index as this process sees it, or a GPU/MIG UUID.

    NVML numbers every GPU on the host and ignores CUDA_VISIBLE_DEVICES, so a CUDA index is mapped
    through that variable first (it lists indices or UUIDs).
    """
    if isinstance(device, str):
        return nvml.nvmlDeviceGetHandleByUUID(device)
    visible = [entry.strip() for entry in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if entry.strip()]
    if not visible:
        return nvml.nvmlDeviceGetHandleByIndex(device)
    entry = visible[device]
    return nvml.nvmlDeviceGetHandleByIndex(int(entry)) if entry.isdigit() else nvml.nvmlDeviceGetHandleByUUID(entry)


class GpuMonitor:
    """Samples one GPU's utilisation and used memory every `interval_s` seconds in a daemon thread.

    device: the CUDA device index as this process sees it (default 0), or a "GPU-..."/"MIG-..." UUID.
    nvml: the NVML binding to use (default: `pynvml`); tests pass a stand-in.
    """

    def __init__(self, device: int | str = 0, interval_s: float = DEFAULT_INTERVAL_S, nvml: Any | None = None) -> None:
        self._device = device
        self._interval_s = interval_s
        self._nvml = nvml
        self._handle: Any = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._samples = 0
        self._util_samples: list[float] = []
        self._mem_max_bytes: float | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Begin sampling afresh; does nothing when NVML or the device is unavailable, or when already started."""
        if self._thread is not None:
            return
        nvml = self._nvml if self._nvml is not None else _import_nvml()
        if nvml is None:
            return
        try:
            nvml.nvmlInit()
        except nvml.NVMLError:
            return
        try:
            self._handle = _nvml_handle(nvml, self._device)
        except (nvml.NVMLError, IndexError, ValueError):
            nvml.nvmlShutdown()
            return
        self._nvml = nvml
        with self._lock:
            self._samples, self._util_samples, self._mem_max_bytes = 0, [], None
        self._stopping.clear()
        self._sample()
        self._thread = threading.Thread(target=self._sample_until_stopped, name="qbench-gpu-monitor", daemon=True)
        self._thread.start()

    def snapshot(self) -> dict[str, float]:
        """The figures collected so far (empty when nothing could be sampled)."""
        with self._lock:
            figures: dict[str, float] = {}
            if self._util_samples:
                figures["gpu_util_mean_pct"] = sum(self._util_samples) / len(self._util_samples)
                figures["gpu_util_max_pct"] = max(self._util_samples)
            if self._mem_max_bytes is not None:
                figures["gpu_mem_used_max_mb"] = self._mem_max_bytes / _MIB
            if figures:
                figures["gpu_samples"] = float(self._samples)
            return figures

    def stop(self) -> dict[str, float]:
        """Stop sampling (one last sample first, so a run shorter than the interval is still seen); the figures."""
        if self._thread is None:
            return self.snapshot()
        self._stopping.set()
        self._thread.join()
        self._thread = None
        self._sample()
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass
        return self.snapshot()

    def _sample_until_stopped(self) -> None:
        while not self._stopping.wait(self._interval_s):
            self._sample()

    def _sample(self) -> None:
        """Read both figures; a figure the device cannot report is skipped, never raised."""
        nvml = self._nvml
        try:
            utilisation: float | None = float(nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
        except nvml.NVMLError:
            utilisation = None
        try:
            used: float | None = float(nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        except nvml.NVMLError:
            used = None
        with self._lock:
            self._samples += 1
            if utilisation is not None:
                self._util_samples.append(utilisation)
            if used is not None:
                self._mem_max_bytes = used if self._mem_max_bytes is None else max(self._mem_max_bytes, used)
