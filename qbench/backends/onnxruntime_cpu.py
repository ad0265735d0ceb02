"""ONNX Runtime on the CPU execution provider: the reference backend, present in every install."""

from __future__ import annotations

from qbench.backends.onnxruntime import OnnxRuntimeBackend


class OnnxRuntimeCPU(OnnxRuntimeBackend):
    name = "onnxruntime-cpu"
    providers = ("CPUExecutionProvider",)
    extra = "cpu"
