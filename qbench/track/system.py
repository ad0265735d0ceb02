"""The sweep's system metrics (CPU, memory, disk, network; GPU when NVML answers), sampled in memory while the
sweep runs and logged into its parent run once, when the sweep ends.

MLflow's own monitor writes as it samples: a store read (is the run still RUNNING?) and a metrics write every
interval, from a thread running beside the latency timing, which on a sqlite store is 20-40 ms of CPU each second
on a 2-CPU machine. Here only the collectors' psutil/NVML reads run during the sweep. MLflow's collectors are
reused, so the metrics carry the names, units and averaging of MLflow's System Metrics tab (`system/...`), one
step per sampling interval.
"""

from __future__ import annotations

import threading
import time

from mlflow.entities import Metric

PREFIX = "system/"
DEFAULT_INTERVAL_S = 1.0


def _collectors() -> list:
    """MLflow's collectors: CPU and memory, disk, network, and the GPUs when NVML (or ROCm's SMI) answers."""
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
    from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
    from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor
    from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor
    from mlflow.system_metrics.metrics.rocm_monitor import ROCMMonitor

    collectors = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
    for gpu in (GPUMonitor, ROCMMonitor):
        try:
            collectors.append(gpu())
            break
        except Exception:  # noqa: BLE001 - no such GPU or driver here: try the next kind
            continue
    return collectors


class SystemSampler:
    """Samples every `interval_s` (MLflow's MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL overrides it) from `start` until
    `finish`, which returns the samples as metrics: steps from `first_step` (a resumed sweep's run goes on from its
    last step), each at the time it was taken. Raises ImportError without psutil."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, first_step: int = 0) -> None:
        from mlflow.environment_variables import MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL

        self._collectors = _collectors()
        self.interval_s = MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL.get() or interval_s
        self._first_step = first_step
        self._samples: list[tuple[int, dict[str, float]]] = []  # (time in ms, figures)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._collect()  # a baseline: CPU use and network counters are read as changes since the previous call
        for collector in self._collectors:
            collector.clear_metrics()
        self._thread = threading.Thread(target=self._run, name="qbench-system-metrics", daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        for collector in self._collectors:
            collector.collect_metrics()

    def _sample(self) -> None:
        self._collect()
        figures: dict[str, float] = {}
        for collector in self._collectors:
            figures.update(collector.aggregate_metrics())
            collector.clear_metrics()
        self._samples.append((int(time.time() * 1000), figures))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def finish(self) -> list[Metric]:
        """Stop sampling (with a last sample, so that a sweep shorter than the interval has one) and return every
        sample as metrics. Idempotent: a second call returns nothing."""
        if self._thread is None:
            return []
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._sample()
        return [Metric(PREFIX + key, float(value), timestamp, self._first_step + step)
                for step, (timestamp, figures) in enumerate(self._samples)
                for key, value in figures.items()]  # fmt: skip
