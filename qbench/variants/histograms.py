"""Histogram calibration that skips what a histogram cannot hold, and a fast entropy threshold.

ORT's `HistogramCollector` fails a whole calibration on one bad tensor: an attention
mask holding float32's lowest value (-3.4e38) makes the histogram range overflow ("Too
many bins for data range"), NaN or infinity break `np.histogram`. `GuardedHistogramCollector`
leaves such tensors unquantized (no range is written, so the quantizer keeps them float)
and gives a constant tensor its min/max range; `skipped` names each with what was done.

Activations are buffered and histogrammed together (up to `BUFFER_BYTES` at a time)
rather than batch by batch: ORT's merge keeps the first batch's bin width and adds bins
whenever a later batch reaches further, so histograms grew to 10,000+ bins on a tiny
model and the entropy search (one candidate per bin pair) grew with them. One
histogram over the whole sample has exactly `num_bins` bins and does not depend on the
order of the batches.

ORT's entropy threshold loops in Python over every candidate threshold and every
quantized bin (1,000 x 128 x 3 `sum()` calls per tensor at 2,048 bins: seconds per
tensor, most of a tiny model's sweep). `entropy_threshold` computes the same KL search
with array operations per candidate; it returns what ORT's `get_entropy_threshold`
returns (tests/variants/test_variants_histograms.py checks that).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnxruntime.quantization.calibrate import HistogramCollector, TensorData

# A histogram spans [-amax, amax]; beyond half of float32's largest value its width overflows.
HISTOGRAM_LIMIT = float(np.finfo(np.float32).max) / 2
UNQUANTIZED = "left unquantized"
NONFINITE = f"holds NaN or infinity; {UNQUANTIZED}"  # why a tensor holding NaN/inf on calibration rows stays float
BUFFER_BYTES = 64 * 2**20  # activations held before they are histogrammed


def histogram_problem(values: np.ndarray) -> str | None:
    """Why `values` cannot go into a histogram, or None when they can."""
    if values.size and not np.all(np.isfinite(values)):
        return NONFINITE
    if values.size and float(np.max(np.abs(values))) > HISTOGRAM_LIMIT:
        return (f"holds values up to {float(np.max(np.abs(values))):.3g} "
                f"(a mask?) beyond a histogram's range; {UNQUANTIZED}")
    return None


class GuardedHistogramCollector(HistogramCollector):
    """ORT's collector for entropy / percentile, minus the tensors it cannot histogram (see module docstring)."""

    def __init__(self, method: str, symmetric: bool, num_bins: int, num_quantized_bins: int, percentile: float) -> None:
        super().__init__(method, symmetric, num_bins, num_quantized_bins, percentile, scenario="same")
        self.skipped: dict[str, str] = {}
        self._extremes: dict[str, tuple[float, float]] = {}
        self._pending: dict[str, list[np.ndarray]] = {}
        self._pending_bytes = 0

    def collect(self, name_to_arr: dict[str, Any]) -> None:
        """Check and buffer one call's activations; histogram them once the buffer is full."""
        for name, arrays in name_to_arr.items():
            values = np.concatenate([np.ravel(a) for a in arrays]) if isinstance(arrays, list) else np.ravel(arrays)
            if name in self.skipped:
                continue
            problem = histogram_problem(values)
            if problem is not None:
                self.skipped[name] = problem
                self.histogram_dict.pop(name, None)
                continue
            if values.size:
                low, high = self._extremes.get(name, (np.inf, -np.inf))
                self._extremes[name] = (min(low, float(values.min())), max(high, float(values.max())))
                self._pending.setdefault(name, []).append(values)
                self._pending_bytes += values.nbytes
        if self._pending_bytes > BUFFER_BYTES:
            self._flush()

    def _flush(self) -> None:
        usable = {name: [np.concatenate(parts)] for name, parts in self._pending.items() if name not in self.skipped}
        self._pending, self._pending_bytes = {}, 0
        if usable:
            super().collect(usable)

    def compute_collection_result(self) -> dict[str, Any]:
        self._flush()
        constant = {name for name, (low, high) in self._extremes.items() if low == high and name in self.histogram_dict}
        for name in sorted(constant):
            self.skipped[name] = f"constant ({self._extremes[name][0]:g}); min/max range used"
        self.histogram_dict = {k: v for k, v in self.histogram_dict.items() if k not in constant}
        results: dict[str, Any] = {}
        if self.histogram_dict:
            if self.method == "entropy":
                results = {
                    name: (*entropy_threshold(histogram, self.num_quantized_bins), *histogram[:2])
                    for name, histogram in self.histogram_dict.items()
                }
            else:
                results = super().compute_collection_result()
        for name in constant:
            value = np.array(self._extremes[name][0], dtype=np.float32)
            results[name] = TensorData(lowest=value, highest=value.copy())
        return results


def _smoothed(counts: np.ndarray, eps: float = 1e-4) -> np.ndarray | None:
    """ORT's `smooth_distribution` in float32, in fewer array passes (same values bit for bit)."""
    zeros = counts == 0
    n_zeros = int(np.count_nonzero(zeros))
    n_nonzeros = counts.size - n_zeros
    if not n_nonzeros:
        return None
    shift = np.where(zeros, np.float32(eps), np.float32(-(eps * n_zeros / n_nonzeros)))
    return counts.astype(np.float32) + shift


def _kl_divergence(p: np.ndarray, q: np.ndarray, dtype: np.dtype) -> float:
    """ORT's `entropy(smooth(p), smooth(q))` (float32 throughout); inf when either is all zeros."""
    p_smooth, q_smooth = _smoothed(p), _smoothed(q)
    if p_smooth is None or q_smooth is None:
        return float("inf")
    pk = p_smooth / np.sum(p_smooth)
    qk = q_smooth / np.sum(q_smooth)
    return float(np.array(np.sum(pk * np.log(pk / qk)), dtype=dtype))


def entropy_threshold(histogram: tuple, num_quantized_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """The (low, high) range minimising the KL divergence, as ORT's `get_entropy_threshold` finds it."""
    hist, edges, min_value, max_value = histogram[0], histogram[1], histogram[2], histogram[3]
    num_bins = hist.size
    zero_bin = num_bins // 2
    half_quantized = num_quantized_bins // 2
    prefix = np.concatenate([[0], np.cumsum(hist)])
    total = prefix[-1]
    candidates = range(half_quantized, zero_bin + 1)
    divergences = np.empty(len(candidates))
    for k, i in enumerate(candidates):
        start, end = zero_bin - i, min(zero_bin + i + 1, num_bins)
        sliced = hist[start:end]
        p = sliced.astype(np.int64)
        p[0] += prefix[start]
        p[-1] += total - prefix[end]
        merged = sliced.size // num_quantized_bins
        body = num_quantized_bins * merged
        quantized = sliced[:body].reshape(num_quantized_bins, merged).sum(axis=1)
        quantized[-1] += sliced[body:].sum()
        norm = (p[:body] != 0).reshape(num_quantized_bins, merged).sum(axis=1)
        q = np.zeros(p.size, dtype=np.int64)
        q[:body] = np.repeat(np.where(norm != 0, quantized / np.maximum(norm, 1), 0).astype(np.int64), merged)
        divergences[k] = _kl_divergence(p, q, edges.dtype)
    best = candidates[int(np.argmin(divergences))]
    low, high = edges[zero_bin - best], edges[min(zero_bin + best + 1, num_bins)]
    if low < min_value:
        low = min_value
    if high > max_value:
        high = max_value
    return low, high
