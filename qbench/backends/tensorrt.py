"""TensorRT as a qbench backend: an engine built from the variant's ONNX file, run from torch CUDA buffers.

What an engine is built from (network mode per precision, optimisation profile, cache key, what
TensorRT cannot run) is `qbench.backends.tensorrt_spec`; this module builds, caches, loads and runs
engines. A dynamic dimension other than the batch takes the sizes of the first batch run, so such an
engine is built at the first run rather than at load. A batch outside the profile gets another engine
(cached too) before it runs; describe() counts them.

What `run` times: the inputs' copy to the GPU, execute_async_v3 on a private stream and the
outputs' copy back, synchronised (host latency, as trtexec calls it). The device time between CUDA
events around execute_async_v3 alone is in describe()["gpu_compute_ms"]: p50 / p99 per batch size.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from qbench.backends.base import RunOptions
from qbench.backends.gpu_monitor import GpuMonitor
from qbench.backends.onnxruntime_gpu import DEVICE_ID, require_gpu
from qbench.backends.tensorrt_spec import (
    ENGINE_SETTINGS,
    EngineSettings,
    Profile,
    engine_cache_dir,
    engine_cache_key,
    engine_profile,
    engine_settings,
    max_batch_size,
    model_sha256,
    profile_covers,
    tensorrt_onnx,
    unsupported_by_tensorrt,
)
from qbench.errors import MissingExtraError, QbenchError
from qbench.modelinfo.signature import ModelInfo, read_model_info
from qbench.variants.base import BuiltVariant

TENSORRT_EXTRA = "tensorrt"
TENSORRT_HINT = (
    "TensorRT's wheels come from NVIDIA's package index: pip install --extra-index-url https://pypi.nvidia.com tensorrt"
)
_MIN_CAPABILITY = {"bf16": (8, 0), "fp8": (8, 9)}  # BF16 from Ampere, FP8 from Ada / Hopper
# TensorRT DataType name -> torch dtype name
_TORCH_DTYPES = {
    "FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT8": "int8", "UINT8": "uint8",
    "INT32": "int32", "INT64": "int64", "BOOL": "bool", "FP8": "float8_e4m3fn",
}  # fmt: skip


# -- building and loading engines ---------------------------------------------------------------------


def _import_tensorrt() -> ModuleType:
    try:
        return importlib.import_module("tensorrt")
    except (ImportError, OSError):  # OSError: the wheel is there but its libraries are not
        raise MissingExtraError("tensorrt", TENSORRT_EXTRA, hint=TENSORRT_HINT) from None


def _import_torch_cuda() -> ModuleType:
    """torch with CUDA: its tensors are the engine's device buffers and its streams and events time it."""
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        hint = "the tensorrt backend keeps its buffers in torch CUDA tensors"
        raise MissingExtraError("torch", "torch", hint=hint) from None
    if not torch.cuda.is_available():
        raise QbenchError(
            f"tensorrt keeps its buffers in torch CUDA tensors, and torch {torch.__version__} cannot use the GPU "
            "(torch.cuda.is_available() is False): install a CUDA build of torch==2.13.0"
        )
    return torch


def _collecting_logger(trt: ModuleType) -> Any:
    """A TensorRT logger that keeps error messages (for one-line QbenchErrors) and prints nothing."""

    class CollectingLogger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR):
                self.errors.append(msg)

    return CollectingLogger()


def _errors(logger: Any, limit: int = 3) -> str:
    return "; ".join(logger.errors[-limit:]) or "TensorRT gave no message"


def build_engine(trt: ModuleType, onnx_path: Path, settings: EngineSettings, profile: Profile, logger: Any) -> bytes:
    """Parse the ONNX file and build a serialised engine with `settings` and one optimisation profile."""
    builder = trt.Builder(logger)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if settings.strongly_typed else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        problems = "; ".join(parser.get_error(i).desc() for i in range(min(parser.num_errors, 3)))
        raise QbenchError(f"TensorRT cannot parse {onnx_path}: {problems}")
    config = builder.create_builder_config()
    for name in settings.set_flags:
        config.set_flag(_builder_flag(trt, name))
    for name in settings.cleared_flags:
        config.clear_flag(_builder_flag(trt, name))
    shapes = builder.create_optimization_profile()
    for r in profile:
        shapes.set_shape(r.name, r.min, r.opt, r.max)
    config.add_optimization_profile(shapes)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise QbenchError(f"TensorRT could not build an engine from {onnx_path}: {_errors(logger)}")
    return bytes(plan)


def _builder_flag(trt: ModuleType, name: str) -> Any:
    flag = getattr(trt.BuilderFlag, name, None)
    if flag is None:
        raise QbenchError(f"TensorRT {trt.__version__} has no builder flag {name}")
    return flag


@dataclass(frozen=True)
class EnginePlan:
    data: bytes
    path: Path
    cache_hit: bool
    build_seconds: float
    profile: Profile


@dataclass
class EngineSource:
    """Serialised engines for one ONNX file and settings, from the cache or freshly built (then cached)."""

    trt: ModuleType
    onnx_path: Path
    settings: EngineSettings
    gpu_name: str
    cache_dir: Path
    logger: Any = None
    _model_sha256: str = field(default="", init=False)

    def plan(self, profile: Profile) -> EnginePlan:
        if not self._model_sha256:
            self._model_sha256 = model_sha256(self.onnx_path)
        key = engine_cache_key(self._model_sha256, self.settings, profile, self.trt.__version__, self.gpu_name)
        path = self.cache_dir / f"{key}.engine"
        if path.is_file():
            return EnginePlan(path.read_bytes(), path, True, 0.0, profile)
        start = time.perf_counter()
        data = build_engine(self.trt, self.onnx_path, self.settings, profile, self.logger)
        seconds = time.perf_counter() - start
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_bytes(data)
        os.replace(partial, path)  # atomic: a concurrent sweep never reads half an engine
        return EnginePlan(data, path, False, seconds, profile)


class LoadedEngine:
    """A deserialised engine with its execution context, private CUDA stream and timing events."""

    def __init__(
        self, trt: ModuleType, torch: ModuleType, plan: EnginePlan, outputs: Sequence[str], logger: Any
    ) -> None:
        self.plan = plan
        self._torch = torch
        self._device = f"cuda:{DEVICE_ID}"
        self._runtime = trt.Runtime(logger)  # kept: the engine must not outlive its runtime
        self._engine = self._runtime.deserialize_cuda_engine(plan.data)
        if self._engine is None:
            raise QbenchError(f"TensorRT cannot load engine {plan.path} ({_errors(logger)}); delete it to rebuild it")
        self._context = self._engine.create_execution_context()
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        self._inputs = [n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = list(outputs)
        self._dtypes = {n: getattr(torch, _TORCH_DTYPES[self._engine.get_tensor_dtype(n).name]) for n in names}
        self._stream = torch.cuda.Stream(device=DEVICE_ID)
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def _bind_input(self, name: str, array: np.ndarray) -> Any:
        """Copy one input to the device (on the current stream) and give TensorRT its shape and address."""
        device = self._torch.from_numpy(np.ascontiguousarray(array)).to(self._device, self._dtypes[name])
        if not self._context.set_input_shape(name, tuple(device.shape)):
            raise QbenchError(
                f"tensorrt: input {name!r} of shape {tuple(device.shape)} is outside the engine's profile"
            )
        self._context.set_tensor_address(name, device.data_ptr())
        return device

    def _bind_output(self, name: str) -> Any:
        """A device buffer of the output's shape for the bound inputs."""
        shape = tuple(self._context.get_tensor_shape(name))
        device = self._torch.empty(shape, dtype=self._dtypes[name], device=self._device)
        self._context.set_tensor_address(name, device.data_ptr())
        return device

    def execute(self, feeds: Mapping[str, np.ndarray]) -> tuple[list[np.ndarray], float]:
        """Outputs in model order and the GPU compute time in ms (CUDA events around execute_async_v3)."""
        torch = self._torch
        with torch.cuda.stream(self._stream):
            inputs = [self._bind_input(name, feeds[name]) for name in self._inputs]  # alive until synchronised
            outputs = [self._bind_output(name) for name in self._outputs]
            self._start.record(self._stream)
            if not self._context.execute_async_v3(self._stream.cuda_stream):
                raise QbenchError("tensorrt: execute_async_v3 failed")
            self._end.record(self._stream)
            on_host = [(t.float() if t.dtype in (torch.bfloat16, torch.float8_e4m3fn) else t).cpu() for t in outputs]
        self._stream.synchronize()
        del inputs
        return [t.numpy() for t in on_host], self._start.elapsed_time(self._end)

    def release(self) -> None:
        """Free the context, then the engine, then the runtime: the order TensorRT needs them destroyed in."""
        self._context = None
        self._engine = None
        self._runtime = None


# -- the runner and the backend ------------------------------------------------------------------------


class TensorRTRunner:
    """Runs batches on an engine whose profile covers them, switching engines (cached) when one does not."""

    def __init__(
        self, trt: ModuleType, torch: ModuleType, source: EngineSource, model: ModelInfo, max_batch: int
    ) -> None:
        self._trt, self._torch, self._source, self._model = trt, torch, source, model
        self._max_batch = max_batch
        self._engine: LoadedEngine | None = None
        self._engines_used = 0
        self._gpu_ms: dict[int, list[float]] = {}
        self._monitor = GpuMonitor(DEVICE_ID)
        self._closed = False

    def start(self) -> None:
        """Build (or load) the engine now when the profile needs no observed shape; start the GPU monitor."""
        profile = engine_profile(self._input_dims(), self._max_batch)
        if profile is not None:
            self._load(profile)
        self._monitor.start()

    def _input_dims(self) -> dict[str, tuple[int | None, ...]]:
        return {name: meta.shape for name, meta in self._model.inputs.items()}

    def _release(self) -> None:
        if self._engine is not None:
            self._engine.release()
            self._engine = None

    def _load(self, profile: Profile) -> LoadedEngine:
        self._release()  # free the previous engine's memory before building the next
        plan = self._source.plan(profile)
        self._engine = LoadedEngine(self._trt, self._torch, plan, list(self._model.outputs), self._source.logger)
        self._engines_used += 1
        return self._engine

    def _engine_for(self, shapes: Mapping[str, tuple[int, ...]]) -> LoadedEngine:
        """The current engine when its profile covers `shapes`, else one whose profile does."""
        if self._engine is not None and profile_covers(self._engine.plan.profile, shapes):
            return self._engine
        self._max_batch = max([self._max_batch, *(shape[0] for shape in shapes.values() if shape)])
        profile = engine_profile(self._input_dims(), self._max_batch, observed=shapes)
        if profile is None:
            raise QbenchError(f"tensorrt: the feeds' shapes {dict(shapes)} leave a dynamic dimension unknown")
        return self._load(profile)

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        if self._closed:
            raise RuntimeError("this runner was closed")
        missing = sorted(set(self._model.inputs) - set(feeds))
        if missing:
            raise QbenchError(f"tensorrt: feeds lack model input(s) {', '.join(missing)}")
        shapes = {name: tuple(np.shape(feeds[name])) for name in self._model.inputs}
        outputs, gpu_ms = self._engine_for(shapes).execute(feeds)
        batch = next((shape[0] for shape in shapes.values() if shape), 1)
        self._gpu_ms.setdefault(batch, []).append(gpu_ms)
        return outputs

    def describe(self) -> dict[str, Any]:
        plan = self._engine.plan if self._engine is not None else None
        described: dict[str, Any] = {
            "runtime": "tensorrt",
            "version": self._trt.__version__,
            "device": self._source.gpu_name,
            "network": self._source.settings.describe(),
            "timing": "host latency: H2D copy + execute_async_v3 + D2H copy, synchronised",
            "gpu_compute_ms": {
                str(batch): {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "runs": len(ms)}
                for batch, ms in sorted(self._gpu_ms.items())
            },
            "engines_used": self._engines_used,
        }
        if plan is not None:
            described |= {
                "engine_cache": "hit" if plan.cache_hit else "miss",
                "engine_build_s": plan.build_seconds,
                "engine_path": str(plan.path),
                "profile": {r.name: {"min": r.min, "opt": r.opt, "max": r.max} for r in plan.profile},
            }
        return described | self._monitor.snapshot()

    def close(self) -> None:
        self._release()
        self._closed = True
        self._monitor.stop()


class TensorRT:
    name = "tensorrt"
    needs_gpu = True  # a job on this backend asks the cluster for a GPU
    runtime_packages = ("tensorrt",)

    def check_available(self) -> None:
        _import_tensorrt()
        require_gpu(self.name)
        _import_torch_cuda()

    def supports(self, variant: BuiltVariant) -> str | None:
        path = tensorrt_onnx(variant)
        if not path.is_file():
            return f"model file not found: {path}"
        if variant.precision not in ENGINE_SETTINGS:
            return f"no TensorRT network mode for precision {variant.precision!r}"
        return unsupported_by_tensorrt(path) or _capability_gap(variant.precision)

    def load(self, variant: BuiltVariant, options: RunOptions) -> TensorRTRunner:
        """A runner whose engine is built (or read from the cache) now when the model's shapes allow."""
        trt, torch = _import_tensorrt(), _import_torch_cuda()
        path = tensorrt_onnx(variant)
        source = EngineSource(
            trt, path, engine_settings(variant.precision), require_gpu(self.name), engine_cache_dir(),
            logger=_collecting_logger(trt),
        )  # fmt: skip
        runner = TensorRTRunner(trt, torch, source, read_model_info(path), max_batch_size(options))
        try:
            runner.start()
        except QbenchError as exc:
            runner.close()
            raise QbenchError(f"variant {variant.name}: {exc}") from None
        except BaseException:
            runner.close()
            raise
        return runner


def _capability_gap(precision: str) -> str | None:
    """Why this GPU cannot run `precision` (BF16 needs compute capability 8.0, FP8 8.9), or None."""
    needed = _MIN_CAPABILITY.get(precision)
    if needed is None:
        return None
    torch = _import_torch_cuda()
    have = torch.cuda.get_device_capability(DEVICE_ID)
    if tuple(have) < needed:
        return (
            f"{precision} needs compute capability {needed[0]}.{needed[1]} or newer; this GPU has {have[0]}.{have[1]}"
        )
    return None
