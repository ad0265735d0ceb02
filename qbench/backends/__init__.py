"""Runtimes that load and run a built variant.

Each backend is one module registered here by name; the registry holds
"module:attr" strings so no runtime SDK is imported until a backend is used.
"""

from __future__ import annotations

from qbench.backends.base import Backend, Runner
from qbench.registry import Registry

BACKENDS: Registry[type[Backend]] = Registry("backend")
BACKENDS.register("onnxruntime-cpu", "qbench.backends.onnxruntime_cpu:OnnxRuntimeCPU")
BACKENDS.register("onnxruntime-cuda", "qbench.backends.onnxruntime_gpu:OnnxRuntimeCUDA")
BACKENDS.register("onnxruntime-tensorrt", "qbench.backends.onnxruntime_gpu:OnnxRuntimeTensorRT")
BACKENDS.register("tensorrt", "qbench.backends.tensorrt:TensorRT")
BACKENDS.register("torch-cpu", "qbench.backends.torch_backend:TorchCPU")
BACKENDS.register("torch-cuda", "qbench.backends.torch_backend:TorchCUDA")


def get_backend(name: str) -> Backend:
    """An instance of the backend registered as `name`."""
    return BACKENDS.get(name)()


__all__ = ["BACKENDS", "Backend", "Runner", "get_backend"]
