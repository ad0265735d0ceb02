"""Protobuf's 2 GiB limit, simulated at a few hundred bytes, so that tests of models over it build tiny ones.

Importable from any test file (`from protobuf_limit import simulate_protobuf_limit`): tests/ is on sys.path.
"""

from __future__ import annotations

import onnx
import onnx.shape_inference
import onnxruntime.transformers.float16 as ort_float16
import pytest

from qbench import onnx_read


def simulate_protobuf_limit(
    monkeypatch: pytest.MonkeyPatch, limit: int, weightless: int, *, serialisation: bool = False
) -> None:
    """qbench takes a model whose weights hold over `limit` bytes for one over protobuf's limit, and holds back the
    values of tensors over `weightless` bytes from shape inference; onnx's in-memory shape inference (and ORT's FP16
    converter's, which imports it by name) fails on such a model as protobuf's serialisation does over 2 GiB. With
    `serialisation`, serialising such a model in memory (`ModelProto.SerializeToString`, which onnx.checker, an ORT
    session made from bytes and a copy by serialise-and-parse go through) fails too: onnx.save_model keeps tensors
    under 1 KiB in the model file, so a model saved with external data at this scale is refused as well."""

    def limited(model: onnx.ModelProto, *args: object, **kwargs: object) -> onnx.ModelProto:
        if sum(len(t.raw_data) for t in model.graph.initializer) > limit:
            raise ValueError("Message onnx.ModelProto exceeds maximum protobuf size of 2GB (simulated)")
        return real(model, *args, **kwargs)

    def serialised(model: onnx.ModelProto, *args: object, **kwargs: object) -> bytes:
        if sum(len(t.raw_data) for t in model.graph.initializer) > limit:
            raise ValueError("Message onnx.ModelProto exceeds maximum protobuf size of 2GB (simulated)")
        return serialise(model, *args, **kwargs)

    real = onnx.shape_inference.infer_shapes
    serialise = onnx.ModelProto.SerializeToString
    if serialisation:
        monkeypatch.setattr(onnx.ModelProto, "SerializeToString", serialised)
    monkeypatch.setattr(onnx_read, "PROTOBUF_SAFE_BYTES", limit)
    monkeypatch.setattr(onnx_read, "_WEIGHTLESS_BYTES", weightless)
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", limited)
    monkeypatch.setattr(ort_float16, "infer_shapes", limited)
