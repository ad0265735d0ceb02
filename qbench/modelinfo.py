"""What an ONNX model expects and returns, read with onnx (no runtime needed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class TensorMeta:
    """One model input or output. shape entries are ints for static dims, None for dynamic ones."""

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]


@dataclass(frozen=True)
class ModelInfo:
    inputs: dict[str, TensorMeta]
    outputs: dict[str, TensorMeta]
    opset: int


def read_model_info(path: Path) -> ModelInfo:
    """Inputs (excluding initializers), outputs and the default-domain opset of an ONNX file."""
    import onnx
    from onnx import helper

    model = onnx.load(str(path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}

    def meta(value_info: onnx.ValueInfoProto) -> TensorMeta:
        tensor_type = value_info.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim)
        return TensorMeta(value_info.name, np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)), dims)

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return ModelInfo(
        inputs={v.name: meta(v) for v in model.graph.input if v.name not in initializers},
        outputs={v.name: meta(v) for v in model.graph.output},
        opset=opset,
    )
