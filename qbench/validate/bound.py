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

A constant table the graph only looks rows up in (an embedding: a Gather at computed ids) is not read whole by a run,
only the rows it looks up: its bytes are left out of the traffic (`lookup_table_bytes`), or a recommender's item table
would count as read on every call (traffic past the copy bandwidth, or a memory-bound verdict for a model whose per-call
reads fit in the cache).

What it leaves out: activation traffic, the table rows looked up and data shared between rows of a batch. It is
labelled an estimate wherever it is shown.
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path

import numpy as np

from qbench.results.serving import BoundEstimate

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


def lookup_table_bytes(model_path: Path) -> int:
    """Bytes of the constant tables `model_path`'s graph (subgraphs included) only looks rows up in: initializers whose
    every reader is a Gather taking them as its data at indices that are not constant (an embedding table)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    graphs, tables, readers, constants = [model.graph], {}, {}, set()
    while graphs:
        graph = graphs.pop()
        tables.update((t.name, t) for t in graph.initializer)
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
            if node.op_type == "Constant":
                constants.update(node.output)
            graphs += [a.g for a in node.attribute if a.HasField("g")] + [g for a in node.attribute for g in a.graphs]
    constants |= set(tables)
    total = 0
    for name, table in tables.items():
        reads = readers.get(name, [])
        looked_up = all(n.op_type == "Gather" and n.input[0] == name and n.input[1] not in constants for n in reads)
        if reads and looked_up:
            total += math.prod(table.dims) * _itemsize(table.data_type)
    return total


def _itemsize(data_type: int) -> int:
    """Bytes per value of an ONNX tensor type (0 for one onnx does not know: such a table is not left out)."""
    import onnx

    try:
        return onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize
    except KeyError:
        return 0


def estimate_bound(
    model_bytes: int | None,
    b1_ms: float | None,
    *,
    bandwidth_bytes_per_s: float,
    batched: tuple[int, float] | None = None,
    gpu_util_pct: float | None = None,
    cache_bytes: int | None = None,
    lookup_bytes: int = 0,
) -> BoundEstimate:
    """The verdict from model bytes, the batch-1 p50 (ms), the largest batch (size, p50 ms), GPU utilisation
    and the last-level cache size; `lookup_bytes` of the model are tables a run reads only rows of
    (`lookup_table_bytes`), left out of the traffic."""
    if not model_bytes or b1_ms is None or not (b1_ms > 0 and math.isfinite(b1_ms)):
        return BoundEstimate("unknown", "needs the model size and a batch-1 latency", gpu_util_pct=gpu_util_pct)
    read = max(model_bytes - lookup_bytes, 0)
    traffic = read * 1000.0 / b1_ms
    fraction = traffic / bandwidth_bytes_per_s
    figures = dict(weight_bytes_per_s=traffic, bandwidth_bytes_per_s=bandwidth_bytes_per_s,
                   bandwidth_fraction=fraction, gpu_util_pct=gpu_util_pct)  # fmt: skip
    moved = (f"weights {traffic / 1e9:.3g} GB/s = {fraction:.1%} of "
             f"{bandwidth_bytes_per_s / 1e9:.3g} GB/s copy bandwidth")
    if lookup_bytes:
        left = min(lookup_bytes, model_bytes) / 1e6
        moved += f" ({left:.3g} MB of lookup tables left out: a run reads only their rows)"
    cached = cache_bytes is not None and read <= cache_bytes
    if cached:
        fits = "what a run reads fits" if lookup_bytes else "the model fits"  # not the tables it reads rows of
        moved += f" ({fits} in the {cache_bytes / 2**20:.3g} MiB cache)"
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
