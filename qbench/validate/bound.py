"""Is a variant compute-, memory- or overhead-bound? An estimate from model bytes, latency and bandwidth.

The arithmetic, at batch size 1 where every run reads the model's weights once:
- memory: weight traffic = model bytes x runs per second, against the machine's memory bandwidth
  (measured once per process with a NumPy copy: read + write bytes over the best time). At least
  half the bandwidth is memory-bound: a smaller precision helps by moving fewer bytes. A model
  smaller than the last-level cache is not read from memory on every run, so it is never called
  memory-bound.
- overhead: latency is close to affine in batch size, t(n) = fixed + n x per_row; from batch 1 and
  the largest batch, fixed = (N t1 - tN) / (N - 1). When the fixed per-call share is at least half
  of t1, the call overhead dominates at batch 1: batching helps, precision hardly does.
- else compute-bound. On GPU backends a mean GPU utilisation (NVML) under 50 % means the device
  waited on the host: overhead-bound.

What it leaves out: activation traffic and data shared between rows of a batch. It is labelled an
estimate wherever it is shown.
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path

import numpy as np

from qbench.results_serving import BoundEstimate

MEMORY_BOUND_FRACTION = 0.5
OVERHEAD_SHARE = 0.5
GPU_BUSY_PCT = 50.0
_COPY_BYTES = 64 * 1024 * 1024
_COPY_REPEATS = 5
_CACHE_FOLDER = Path("/sys/devices/system/cpu/cpu0/cache")
_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3}


@functools.cache
def memory_bandwidth_bytes_per_s() -> float:
    """Copy bandwidth of this machine (bytes read + written per second, best of a few 64 MiB copies)."""
    source = np.ones(_COPY_BYTES, dtype=np.uint8)
    target = np.empty_like(source)
    np.copyto(target, source)  # touch both buffers so page faults are not timed
    best = math.inf
    for _ in range(_COPY_REPEATS):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return 2 * _COPY_BYTES / best


@functools.cache
def last_level_cache_bytes(folder: Path = _CACHE_FOLDER) -> int | None:
    """The largest CPU cache's size from Linux sysfs (None elsewhere)."""
    sizes = []
    for entry in folder.glob("index*/size"):
        text = entry.read_text().strip()
        if text[:-1].isdigit() and text[-1] in _UNITS:
            sizes.append(int(text[:-1]) * _UNITS[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes, default=None)


def estimate_bound(
    model_bytes: int | None,
    b1_ms: float | None,
    *,
    bandwidth_bytes_per_s: float,
    batched: tuple[int, float] | None = None,
    gpu_util_pct: float | None = None,
    cache_bytes: int | None = None,
) -> BoundEstimate:
    """The verdict from model bytes, the batch-1 p50 (ms), the largest batch (size, p50 ms), GPU utilisation
    and the last-level cache size."""
    if not model_bytes or b1_ms is None or not (b1_ms > 0 and math.isfinite(b1_ms)):
        return BoundEstimate("unknown", "needs the model size and a batch-1 latency", gpu_util_pct=gpu_util_pct)
    traffic = model_bytes * 1000.0 / b1_ms
    fraction = traffic / bandwidth_bytes_per_s
    figures = dict(weight_bytes_per_s=traffic, bandwidth_bytes_per_s=bandwidth_bytes_per_s,
                   bandwidth_fraction=fraction, gpu_util_pct=gpu_util_pct)  # fmt: skip
    moved = f"weights {traffic / 1e9:.3g} GB/s = {fraction:.1%} of {bandwidth_bytes_per_s / 1e9:.3g} GB/s copy bandwidth"
    cached = cache_bytes is not None and model_bytes <= cache_bytes
    if cached:
        moved += f" (the model fits in the {cache_bytes / 2**20:.3g} MiB cache)"
    if gpu_util_pct is not None and gpu_util_pct < GPU_BUSY_PCT:
        return BoundEstimate("overhead-bound", f"GPU busy {gpu_util_pct:.0f} % of the time; {moved}", **figures)
    if fraction >= MEMORY_BOUND_FRACTION and not cached:
        return BoundEstimate("memory-bound", f"{moved} (>= {MEMORY_BOUND_FRACTION:.0%})", **figures)
    if batched is not None and batched[0] > 1:
        size, tn_ms = batched
        share = (size * b1_ms - tn_ms) / (size - 1) / b1_ms
        if share >= OVERHEAD_SHARE:
            return BoundEstimate("overhead-bound", f"{moved}; fixed per-call cost {share:.0%} of batch 1", **figures)
    return BoundEstimate("compute-bound", moved, **figures)
