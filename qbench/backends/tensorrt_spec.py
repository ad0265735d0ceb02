"""What a TensorRT engine is built from, decided without importing TensorRT: the network mode and
builder flags per precision, the optimisation profile, the cache key, and what TensorRT cannot run.

Network mode per precision (ENGINE_SETTINGS): fp32 strongly typed with TF32 off (a real FP32
reference); fp16 / bf16 weakly typed with the FP16 / BF16 builder flag; int8 / fp8 strongly typed,
so the Q/DQ nodes alone decide what is quantized (explicit quantization, no precision flags, as
TensorRT's documentation asks). TensorRT quantizes symmetrically to signed types only: Q/DQ graphs
with uint8 or non-zero zero points, and ONNX Runtime's integer operators (dynamic INT8), are
reported as not supported. The ONNX file is `variant.params["tensorrt_onnx"]` when the variant
keeps a TensorRT-specific export there (ModelOpt's FP8), else `variant.onnx_path`.

Optimisation profile: a dynamic batch dimension spans 1..max batch with opt = max, where max batch
is the largest of `RunOptions.batch_sizes` (the sweep passes the latency and evaluation batch
sizes), else DEFAULT_MAX_BATCH (the recipe's default evaluation batch size). Other dynamic dimensions take the
sizes of the first batch run. Engines are cached in <qbench cache>/engines, keyed by the ONNX content
(external data included), the network mode and flags, the profile, the TensorRT version and the GPU name.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from qbench.backends.base import RunOptions
from qbench.errors import QbenchError, expected_one_of
from qbench.files import cache_dir
from qbench.variants.base import BuiltVariant

DEFAULT_MAX_BATCH = 64
_CACHE_FORMAT = 1  # bump when what goes into an engine changes, so older cached engines are not reused
_CHUNK = 1 << 20
_INTEGER_OPS = frozenset({"MatMulInteger", "ConvInteger", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul"})


@dataclass(frozen=True)
class EngineSettings:
    """How the network is created and which builder flags are set or cleared."""

    strongly_typed: bool
    set_flags: tuple[str, ...] = ()
    cleared_flags: tuple[str, ...] = ()

    def describe(self) -> str:
        mode = "strongly typed" if self.strongly_typed else "weakly typed"
        flags = [f"+{f}" for f in self.set_flags] + [f"-{f}" for f in self.cleared_flags]
        return f"{mode}{', ' + ' '.join(flags) if flags else ''}"


ENGINE_SETTINGS: dict[str, EngineSettings] = {
    "fp32": EngineSettings(strongly_typed=True, cleared_flags=("TF32",)),
    "fp16": EngineSettings(strongly_typed=False, set_flags=("FP16",)),
    "bf16": EngineSettings(strongly_typed=False, set_flags=("BF16",)),
    "int8": EngineSettings(strongly_typed=True),
    "fp8": EngineSettings(strongly_typed=True),
}


def engine_settings(precision: str) -> EngineSettings:
    if precision not in ENGINE_SETTINGS:
        raise QbenchError(f"tensorrt: precision {expected_one_of(precision, ENGINE_SETTINGS)}")
    return ENGINE_SETTINGS[precision]


@dataclass(frozen=True)
class InputRange:
    """One input's shapes in an optimisation profile."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


Profile = tuple[InputRange, ...]


def engine_profile(
    inputs: Mapping[str, Sequence[int | None]], max_batch: int, observed: Mapping[str, Sequence[int]] | None = None
) -> Profile | None:
    """The profile for `inputs` (name -> ONNX dims, None where dynamic): a dynamic first dim spans
    1..max_batch (opt = max_batch), other dynamic dims take their `observed` size. None when a dynamic
    dim other than the batch has no observed size yet."""
    ranges = []
    for name, dims in inputs.items():
        seen = observed.get(name) if observed is not None else None
        bounds = [_dim_bounds(axis, dim, max_batch, seen) for axis, dim in enumerate(dims)]
        if None in bounds:
            return None
        low = tuple(b[0] for b in bounds if b is not None)
        high = tuple(b[1] for b in bounds if b is not None)
        ranges.append(InputRange(name, low, high, high))
    return tuple(ranges)


def _dim_bounds(axis: int, dim: int | None, max_batch: int, seen: Sequence[int] | None) -> tuple[int, int] | None:
    """(min, max) of one dimension: static as is, the batch 1..max_batch, another dynamic one as observed."""
    if dim is not None and dim > 0:
        return dim, dim
    if axis == 0:
        return 1, max_batch
    if seen is not None and axis < len(seen):
        return seen[axis], seen[axis]
    return None


def profile_covers(profile: Profile, shapes: Mapping[str, Sequence[int]]) -> bool:
    """Whether every input's shape lies within its range."""
    return all(_within(r, shapes.get(r.name)) for r in profile)


def _within(r: InputRange, shape: Sequence[int] | None) -> bool:
    return (
        shape is not None and len(shape) == len(r.min) and all(lo <= d <= hi for lo, d, hi in zip(r.min, shape, r.max))
    )


def engine_cache_key(
    model_sha256: str, settings: EngineSettings, profile: Profile, tensorrt_version: str, gpu_name: str
) -> str:
    """Hash of everything an engine depends on: the model, how it is built, the profile, TensorRT, the GPU."""
    payload = {
        "format": _CACHE_FORMAT,
        "model": model_sha256,
        "settings": asdict(settings),
        "profile": [asdict(r) for r in profile],
        "tensorrt": tensorrt_version,
        "gpu": gpu_name,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def model_sha256(path: Path) -> str:
    """sha256 of an ONNX file's bytes and of the external data files it names (content only, not its name): every
    tensor's file, subgraphs' and Constant nodes' included (`external_data_files`), as onnx saves them all there."""
    from qbench.modelinfo.signature import external_data_files

    digest = hashlib.sha256()
    for file in [path, *(path.parent / location for location in external_data_files(path))]:
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(_CHUNK), b""):
                digest.update(block)
    return digest.hexdigest()


def unsupported_by_tensorrt(path: Path) -> str | None:
    """Why TensorRT cannot build this ONNX graph (ops or quantization it lacks), or None."""
    import onnx
    from onnx import TensorProto, numpy_helper

    graph = onnx.load(str(path), load_external_data=False).graph
    integer_ops = sorted({node.op_type for node in graph.node} & _INTEGER_OPS)
    if integer_ops:
        return f"ONNX Runtime's integer operators ({', '.join(integer_ops)}) have no TensorRT implementation"
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    for node in graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(node.input) < 3:
            continue
        zero_point = initializers.get(node.input[2])
        if zero_point is None:
            continue
        if zero_point.data_type == TensorProto.UINT8 or np.any(numpy_helper.to_array(zero_point).astype(np.float32)):
            return (
                f"TensorRT quantizes symmetrically to signed types only, and {node.op_type} {node.name!r} has a "
                "uint8 or non-zero zero point (build it with activation_type: int8 and symmetric_activations: true)"
            )
    return None


def tensorrt_onnx(variant: BuiltVariant) -> Path:
    """The ONNX file to build from: a TensorRT-specific export the variant keeps in its params, else its model."""
    special = variant.params.get("tensorrt_onnx")
    return Path(special) if special else variant.onnx_path


def max_batch_size(options: RunOptions) -> int:
    """The profile's max batch: the largest of options.batch_sizes, else the default."""
    return max(options.batch_sizes, default=DEFAULT_MAX_BATCH)


def engine_cache_dir() -> Path:
    return cache_dir() / "engines"
