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
    """sha256 of a model's content, read field by field and each initializer's bytes tensor by tensor: the model is
    never serialised whole (a second copy of its weights in memory, and protobuf refuses one over 2 GiB). Equal
    models give equal digests; a change to any field, a node or one weight's bytes changes it."""
    digest = hashlib.sha256()
    _digest_fields(digest, model, {"graph": _graph})
    return digest.hexdigest()


def _graph(digest: Any, graph: onnx.GraphProto) -> None:
    _digest_fields(digest, graph, {"initializer": _tensor})


def _tensor(digest: Any, tensor: onnx.TensorProto) -> None:
    _digest_fields(digest, tensor, {"raw_data": None})


def _digest_fields(digest: Any, message: Any, walked: Mapping[str, Callable[..., None] | None]) -> None:
    """Feed `digest` every set field of `message` in field-number order: each tagged with its number and its length.
    A field named in `walked` is read by its function, item by item (None: a bytes field taken as it is); any other
    is serialised whole (deterministic: map fields sorted)."""
    for field, value in message.ListFields():
        digest.update(f"|{field.number}:".encode())
        walk = walked.get(field.name, _serialised)
        if walk is None:
            digest.update(f"{len(value)}:".encode())
            digest.update(value)
            continue
        scalars = field.message_type is None  # a repeated scalar field (dims, float_data) is one list
        for item in value if field.is_repeated and not scalars else [list(value) if field.is_repeated else value]:
            digest.update(b"{")
            walk(digest, item)
            digest.update(b"}")


def _serialised(digest: Any, value: Any) -> None:
    data = value.SerializeToString(deterministic=True) if hasattr(value, "SerializeToString") else repr(value).encode()
    digest.update(f"{len(data)}:".encode())
    digest.update(data)


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
