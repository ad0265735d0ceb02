"""Passes over the calibration rows remembered by content within a process, so that builds that need the same pass
run it once.

An INT8 search builds several candidates from one FP32 model and one calibration sample: SmoothQuant dynamic and
static (same alpha) collect the same per-channel ranges of the same Linear inputs, and a static candidate's reduce_range
twin and its keep-float rebuilds calibrate the same pre-processed graph with the same calibrator. Each such pass runs
the FP32 model over every calibration row; its result depends only on the graph, the rows and the pass's settings, so
it is remembered under a digest of exactly those (never a path or a name) and handed back as a deep copy: a caller
that edits what it got cannot change what the next one gets. What a hit returns is what the pass computed the first
time, so builds are the same bytes with or without the memo.
"""

from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import onnx

T = TypeVar("T")

MEMO_ENTRIES = 4  # passes held; least recently used dropped beyond (a small transformer's channel ranges: ~30 MB)


def model_digest(model: onnx.ModelProto) -> str:
    """sha256 of a model's serialized bytes (deterministic: map fields sorted)."""
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


def batches_digest(batches: Sequence[Mapping[str, np.ndarray]]) -> str:
    """sha256 of calibration batches: their order, and each feed's name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for batch in batches:
        digest.update(b"|batch")
        for name in sorted(batch):
            array = np.ascontiguousarray(batch[name])
            digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
            digest.update(array.tobytes() if array.dtype != object else repr(array.tolist()).encode())
    return digest.hexdigest()


class PassMemo:
    """Results of deterministic passes keyed by content; `runs` counts the passes actually run (a hit runs none)."""

    def __init__(self, entries: int = MEMO_ENTRIES) -> None:
        self.entries = entries
        self.runs = 0
        self._held: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """What `compute()` returns for `key`, computed on the first request only; always a copy of what is held."""
        if key in self._held:
            self._held.move_to_end(key)
        else:
            self.runs += 1
            self._held[key] = compute()
            while len(self._held) > self.entries:
                self._held.popitem(last=False)
        return copy.deepcopy(self._held[key])

    def clear(self) -> None:
        self._held.clear()
