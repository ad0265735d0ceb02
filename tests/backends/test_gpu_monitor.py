"""GpuMonitor against a stand-in NVML binding (any machine) and against the real GPU (gpu marker)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from sampled import wait_for_samples

from qbench.backends.gpu_monitor import GpuMonitor

_MIB = 1024 * 1024


class FakeNVMLError(Exception):
    pass


@dataclass
class FakeNvml:
    """Just enough of pynvml: cycles through `utilisation` and `memory_mib`, records what it returned."""

    utilisation: list[int] = field(default_factory=lambda: [10, 70, 40])
    memory_mib: list[int] = field(default_factory=lambda: [100, 900, 300])
    init_fails: bool = False
    utilisation_supported: bool = True
    NVMLError: type[Exception] = FakeNVMLError
    returned_utilisation: list[int] = field(default_factory=list)
    returned_memory_mib: list[int] = field(default_factory=list)
    opened: list[tuple[str, int | str]] = field(default_factory=list)
    initialised: int = 0

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise FakeNVMLError("NVML Shared Library Not Found")
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        self.opened.append(("index", index))
        return f"gpu{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self.opened.append(("uuid", uuid))
        return uuid

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        if not self.utilisation_supported:
            raise FakeNVMLError("Not Supported")
        value = self.utilisation[len(self.returned_utilisation) % len(self.utilisation)]
        self.returned_utilisation.append(value)
        return SimpleNamespace(gpu=value, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        value = self.memory_mib[len(self.returned_memory_mib) % len(self.memory_mib)]
        self.returned_memory_mib.append(value)
        return SimpleNamespace(used=value * _MIB, total=16384 * _MIB, free=0)


def _run_briefly(monitor: GpuMonitor, seconds: float = 0.05) -> dict[str, float]:
    monitor.start()
    time.sleep(seconds)
    return monitor.stop()


def test_figures_summarise_every_sample_taken() -> None:
    nvml = FakeNvml()
    monitor = GpuMonitor(interval_s=0.005, nvml=nvml)
    monitor.start()
    wait_for_samples(nvml.returned_memory_mib, 2)
    figures = monitor.stop()
    returned = nvml.returned_utilisation
    assert len(returned) >= 3, f"expected the thread's samples and stop()'s last one, got {len(returned)}"
    assert figures["gpu_util_mean_pct"] == pytest.approx(sum(returned) / len(returned))
    assert figures["gpu_util_max_pct"] == max(returned)
    assert figures["gpu_mem_used_max_mb"] == max(nvml.returned_memory_mib)
    assert figures["gpu_samples"] == len(returned)
    assert nvml.initialised == 0, "stop() must shut NVML down"


def test_a_run_shorter_than_the_interval_is_still_sampled() -> None:
    nvml = FakeNvml()
    figures = _run_briefly(GpuMonitor(interval_s=10.0, nvml=nvml), seconds=0.0)
    assert figures["gpu_samples"] >= 1
    assert set(figures) == {"gpu_util_mean_pct", "gpu_util_max_pct", "gpu_mem_used_max_mb", "gpu_samples"}


def test_snapshot_reports_while_running() -> None:
    nvml = FakeNvml()
    monitor = GpuMonitor(interval_s=0.005, nvml=nvml)
    monitor.start()
    try:
        wait_for_samples(nvml.returned_memory_mib, 1)
        assert monitor.running
        assert monitor.snapshot()["gpu_samples"] >= 1
    finally:
        monitor.stop()
    assert not monitor.running


def test_unavailable_nvml_returns_nothing_and_never_raises() -> None:
    monitor = GpuMonitor(nvml=FakeNvml(init_fails=True))
    monitor.start()
    assert not monitor.running
    assert monitor.snapshot() == {}
    assert monitor.stop() == {}


def test_stop_without_start_returns_nothing() -> None:
    assert GpuMonitor(nvml=FakeNvml()).stop() == {}


def test_unsupported_utilisation_leaves_only_memory() -> None:
    """MIG instances report memory but not utilisation."""
    figures = _run_briefly(GpuMonitor(interval_s=0.005, nvml=FakeNvml(utilisation_supported=False)))
    assert "gpu_util_mean_pct" not in figures and "gpu_util_max_pct" not in figures
    assert figures["gpu_mem_used_max_mb"] == 900


def test_a_second_start_does_not_add_a_thread() -> None:
    monitor = GpuMonitor(interval_s=0.005, nvml=FakeNvml())
    monitor.start()
    threads = threading.active_count()
    monitor.start()
    assert threading.active_count() == threads
    monitor.stop()


def test_restart_begins_afresh() -> None:
    nvml = FakeNvml(memory_mib=[900])
    monitor = GpuMonitor(interval_s=10.0, nvml=nvml)
    _run_briefly(monitor, seconds=0.0)
    nvml.memory_mib = [100]
    assert _run_briefly(monitor, seconds=0.0)["gpu_mem_used_max_mb"] == 100


@pytest.mark.parametrize(
    ("visible", "device", "opened"),
    [
        (None, 1, ("index", 1)),
        ("3,1", 0, ("index", 3)),
        ("GPU-aaa,GPU-bbb", 1, ("uuid", "GPU-bbb")),
        (None, "MIG-ccc", ("uuid", "MIG-ccc")),
    ],
)
def test_device_is_mapped_through_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, device: int | str, opened: tuple[str, int | str]
) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    nvml = FakeNvml()
    _run_briefly(GpuMonitor(device=device, interval_s=10.0, nvml=nvml), seconds=0.0)
    assert nvml.opened == [opened]


def test_a_device_that_is_not_visible_returns_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    nvml = FakeNvml()
    assert _run_briefly(GpuMonitor(device=2, nvml=nvml), seconds=0.0) == {}
    assert nvml.initialised == 0


def test_real_nvml_never_raises() -> None:
    """On this machine: {} without a GPU or driver; the three figures with one."""
    figures = _run_briefly(GpuMonitor(interval_s=0.01))
    assert figures == {} or figures["gpu_mem_used_max_mb"] > 0


@pytest.mark.gpu
def test_real_gpu_shows_the_memory_and_work_of_a_run() -> None:
    torch = pytest.importorskip("torch")
    monitor = GpuMonitor(device=torch.cuda.current_device(), interval_s=0.02)
    monitor.start()
    block = torch.ones((16 * _MIB,), dtype=torch.float32, device="cuda")  # 64 MiB
    a = torch.randn(4096, 4096, device="cuda")
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    figures = monitor.stop()
    del block, a
    assert figures["gpu_mem_used_max_mb"] >= 64 + 64, figures  # the block plus the matrices
    assert figures["gpu_util_max_pct"] > 0, figures
    assert figures["gpu_samples"] >= 10, figures
