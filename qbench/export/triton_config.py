"""config.pbtxt for Triton's ONNX Runtime backend, from an ONNX model and what the sweep measured on it.

The model's inputs and outputs give names, data types and dims (an output's as ONNX Runtime reports it, the file's
refined by shape inference: `served_shapes`); the measured variant gives the batch sizes, the dynamic
batcher (the one its load scenario simulated, with `slo:`), the thread count and the graph optimisation level.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qbench.errors import QbenchError, expected_one_of
from qbench.export.pbtxt import EnumValue
from qbench.modelinfo.signature import ModelInfo, TensorMeta
from qbench.results.schema import VariantResult


@dataclass(frozen=True)
class TritonTarget:
    """How one qbench backend is served by Triton's ONNX Runtime backend."""

    instance_kind: str  # KIND_CPU | KIND_GPU
    tensorrt: bool  # TensorRT as ONNX Runtime's GPU execution accelerator


TARGETS: dict[str, TritonTarget] = {
    "onnxruntime-cpu": TritonTarget("KIND_CPU", tensorrt=False),
    "onnxruntime-cuda": TritonTarget("KIND_GPU", tensorrt=False),
    "onnxruntime-tensorrt": TritonTarget("KIND_GPU", tensorrt=True),
    "tensorrt": TritonTarget("KIND_GPU", tensorrt=True),
}

# numpy dtype name (as qbench.modelinfo reads it from the ONNX graph) -> Triton data type
TRITON_TYPES = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64", "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32",
    "int64": "TYPE_INT64", "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
    "bfloat16": "TYPE_BF16", "object": "TYPE_STRING",
}  # fmt: skip

# qbench's ONNX Runtime graph optimisation level -> Triton's `optimization.graph.level`
# (Triton: -1 basic, 1 extended, 2 disabled; no level = all optimisations, ONNX Runtime's default)
GRAPH_LEVELS = {"basic": -1, "extended": 1, "disable": 2}


def _triton_type(tensor: TensorMeta) -> EnumValue:
    name = tensor.dtype.name
    if name not in TRITON_TYPES:
        raise QbenchError(f"tensor {tensor.name!r}: {expected_one_of(name, TRITON_TYPES)} (a type Triton can serve)")
    return EnumValue(TRITON_TYPES[name])


def fixed_batch_of(info: ModelInfo) -> int | None:
    """The batch of rows each call of the model takes when its inputs fix one, None when every input takes any
    number of rows on axis 0. An input of rank 2 or more with a static axis 0 fixes it, as the sweep ran the model
    (`ModelInfo.batch_dims`): `x: [8, 64]`, or a recurrent net's initial state h0 [1, batch, H] beside x [batch, T,
    F], a batch of 1; otherwise inputs of rank 1 that all state one length (`[3]`: that many rows). Triton cannot
    batch such a model: its config has max_batch_size 0 and full dims, each request a whole batch."""
    fixed = set(info.batch_dims.values())
    if len(fixed) == 1:
        return fixed.pop()
    firsts = {t.shape[0] if t.shape else None for t in info.inputs.values()}
    return firsts.pop() if len(firsts) == 1 and None not in firsts else None


def unbatched_outputs(info: ModelInfo, evaluated: Collection[str] = ()) -> list[str]:
    """The tensor outputs of a batched model (no `fixed_batch_of`) without a dynamic first (batch) dimension: a
    scalar (a batch mean), a table of fixed length (class names). Triton's batcher hands each request its rows of
    every output config.pbtxt lists, which these have none of, so the config leaves them out: Triton's onnxruntime
    backend checks and returns only the outputs the config lists. An output the sweep scored has a row per data row,
    but its declared shape may still fix its first dimension (a converter's [1, 3] for rows ONNX Runtime runs in any
    number): a QbenchError when that leaves no output to serve, or leaves out one of `evaluated` (the recipe's
    model.output or model.outputs), rather than a config serving none of what was measured."""
    if fixed_batch_of(info) is not None:
        return []
    tensors = [t for t in info.outputs.values() if t.kind == "tensor"]
    left_out = [t.name for t in tensors if not t.shape or t.shape[0] is not None]
    scored = [name for name in evaluated if name in left_out]
    if scored or (tensors and len(left_out) == len(tensors)):
        tensor = info.outputs[(scored or left_out)[0]]
        first = tensor.shape[0] if tensor.shape else "none (a scalar)"
        raise QbenchError(f"output {tensor.name!r}: Triton's batching needs a dynamic first (batch) dimension, the "
                          f"model declares {first}{' and no other output has one' if not scored else ''}; expected "
                          "the model exported with a dynamic batch dimension on its evaluated output")  # fmt: skip
    return left_out


def served_shapes(info: ModelInfo, path: Path) -> ModelInfo:
    """`info` with every tensor output's shape as ONNX Runtime reports it, the shape Triton's onnxruntime backend
    compares config.pbtxt's output dims with, exactly (a -1 where the session reports a number fails the load): the
    file's stated shape refined by ONNX shape inference, as ONNX Runtime refines it when it loads the graph. A
    dimension the file leaves unnamed or names (tf2onnx's `unk__7`, a dynamic axis that is not) and inference fixes
    is that number; a shape the file leaves out (not even its rank; a converter may) is inferred. Where inference
    finds none either, the output is named."""
    tensors = {name for name, meta in info.outputs.items() if meta.kind == "tensor"}
    if not tensors:
        return info
    import onnx

    from qbench.onnx_read import infer_types

    inferred = infer_types(onnx.load(str(path), load_external_data=False), strict_mode=False)
    outputs = dict(info.outputs)
    for value in inferred.graph.output:
        if value.name not in tensors:
            continue
        if not value.type.tensor_type.HasField("shape"):
            if not info.outputs[value.name].shape and not info.outputs[value.name].scalar:
                raise QbenchError(f"output {value.name!r}: the model states no shape for it (not even its rank) and "
                                  "ONNX shape inference finds none; Triton's config.pbtxt needs its dims: export the "
                                  "model with output shapes (e.g. torch.onnx.export's dynamic_shapes, or "
                                  "onnx.shape_inference)")  # fmt: skip
            continue
        dims = value.type.tensor_type.shape.dim
        shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
        names = tuple(d.dim_param or None for d in dims)
        outputs[value.name] = dataclasses.replace(outputs[value.name], shape=shape, dim_names=names)
    return dataclasses.replace(info, outputs=outputs)


def _tensor(tensor: TensorMeta, *, batching: bool = True) -> dict[str, Any]:
    """Name, type and dims without the batch dimension (-1 for a dynamic dimension); without `batching` (a model
    with a fixed batch), every dimension (a scalar: `dims: [ 1 ]`; Triton refuses empty dims, and an empty reshape
    without batching).

    A tensor of the batch dimension alone (class ids, one score per row) is `dims: [ 1 ]` with
    `reshape: { shape: [ ] }`, Triton's form for it (its dims may not be empty when batching).
    """
    if tensor.kind != "tensor":
        raise QbenchError(
            f"tensor {tensor.name!r} is a {tensor.type_name}, not a tensor: Triton's ONNX Runtime backend serves "
            "tensors only (a converter's ZipMap: convert without it, e.g. skl2onnx options={'zipmap': False})"
        )
    if not batching:  # a scalar is dims [1]: Triton requires dims, and its onnxruntime backend takes 1s for a scalar
        dims = [-1 if d is None else d for d in tensor.shape] or [1]
        return {"name": tensor.name, "data_type": _triton_type(tensor), "dims": dims}
    if not tensor.shape or tensor.shape[0] is not None:
        first = tensor.shape[0] if tensor.shape else "none (a scalar)"
        raise QbenchError(
            f"tensor {tensor.name!r}: Triton's batching needs a dynamic first (batch) dimension, the model has {first}"
        )
    if len(tensor.shape) == 1:
        return {"name": tensor.name, "data_type": _triton_type(tensor), "dims": [1], "reshape": {"shape": []}}
    dims = [-1 if d is None else d for d in tensor.shape[1:]]
    return {"name": tensor.name, "data_type": _triton_type(tensor), "dims": dims}


def _parameter(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"string_value": value}}


def _optimization(measured: VariantResult, target: TritonTarget) -> dict[str, Any]:
    optimization: dict[str, Any] = {}
    level = GRAPH_LEVELS.get(str(measured.params.get("runtime.graph_optimization_level", "all")))
    if level is not None:
        optimization["graph"] = {"level": level}
    if target.tensorrt:
        # FP16 variants get TensorRT's FP16 flag, as on qbench's TensorRT backends; without a flag
        # ONNX Runtime builds a strongly typed network, so Q/DQ graphs run with explicit quantization.
        precision = "FP16" if measured.precision == "fp16" else "FP32"
        accelerator = {"name": "tensorrt", "parameters": [{"key": "precision_mode", "value": precision},
                                                          {"key": "trt_engine_cache_enable",
                                                           "value": "1"}]}  # fmt: skip
        optimization["execution_accelerators"] = {"gpu_execution_accelerator": [accelerator]}
    return optimization


def simulated_batcher(measured: VariantResult) -> int | None:
    """The largest batch of the dynamic batcher the sweep's load scenario simulated (`slo:`), None without one."""
    serving = measured.serving
    return serving.max_batch_size if serving is not None and serving.max_queue_delay_ms is not None else None


def batcher_sizes(measured: VariantResult) -> tuple[int, list[int]]:
    """config.pbtxt's max_batch_size and preferred batch sizes.

    Triton's dynamic batcher sends the largest preferred batch it can form at once, without waiting for
    max_queue_delay, and past that delay the largest batch max_batch_size allows. With the load scenario's
    batcher (wait until `max_batch_size` requests are queued or the oldest has waited the delay, send at most
    `max_batch_size`), that is max_batch_size = preferred = the simulated largest batch: every timed size as a
    preferred one (1 included) would send each request alone the moment the model is free, a batcher whose
    latency under load the sweep never simulated. Without a load scenario: the largest timed size, and every
    timed size preferred, so that at concurrency 1 each of qbench's latency points runs without queueing.
    Not written explicitly, Triton fills in preferred sizes of its own (4 and 8 in older releases)."""
    timed = sorted(p.batch_size for p in measured.latency.points) if measured.latency is not None else []
    simulated = simulated_batcher(measured)
    if simulated is not None:
        return simulated, [simulated]
    return timed[-1], timed


def triton_config(
    name: str, measured: VariantResult, info: ModelInfo, target: TritonTarget, *, max_queue_delay_us: int
) -> dict[str, Any]:
    """The model configuration as nested fields (see qbench.export.pbtxt), from what the sweep measured.

    The dynamic batcher is the one the sweep's load scenario simulated when it ran one (`slo:`, see
    `batcher_sizes`); otherwise max_batch_size is the largest batch size timed and every batch size timed is a
    preferred one. One instance (qbench times one session at a time) with the sweep's intra-op thread count
    (0 = ONNX Runtime's default); inter-op threads 1, since sessions run in sequential execution mode.
    A model with a fixed batch (`fixed_batch_of`) is not batched by Triton: max_batch_size 0, full dims, no
    dynamic batcher; each request is one whole batch, as qbench timed it. A batched model's outputs without a batch
    dimension are left out (`unbatched_outputs`).
    """
    if measured.latency is None or not measured.latency.points:
        raise QbenchError(f"{measured.key}: no latency was measured, so there are no batch sizes to configure")
    largest, preferred = batcher_sizes(measured)
    batching = fixed_batch_of(info) is None
    left_out = unbatched_outputs(info)
    config: dict[str, Any] = {
        "name": name,
        "platform": "onnxruntime_onnx",
        "backend": "onnxruntime",
        "max_batch_size": largest if batching else 0,
        "input": [_tensor(t, batching=batching) for t in info.inputs.values()],
        "output": [_tensor(t, batching=batching) for t in info.outputs.values() if t.name not in left_out],
        "instance_group": [{"count": 1, "kind": EnumValue(target.instance_kind)}],
    }
    if batching:
        config["dynamic_batching"] = {
            "preferred_batch_size": preferred,
            "max_queue_delay_microseconds": max_queue_delay_us,
        }
    config |= {
        "parameters": [
            _parameter("intra_op_thread_count", str(measured.latency.threads or 0)),
            _parameter("inter_op_thread_count", "1"),
        ],
    }
    optimization = _optimization(measured, target)
    if optimization:
        config["optimization"] = optimization
    return config
