"""ONNX Runtime on the CPU execution provider: the reference backend, present in every install.

It computes FP32 and INT8 with their own kernels. FP16 graphs run largely in FP32
(inserted Casts, removed Cast pairs, fusions) and FP8/BF16 only as simulations, so
their accuracy is scored on faithful emulations and all their figures are flagged
emulated (qbench.validate.fidelity).
"""

from __future__ import annotations

from qbench.backends.onnxruntime import OnnxRuntimeBackend


class OnnxRuntimeCPU(OnnxRuntimeBackend):
    name = "onnxruntime-cpu"
    providers = ("CPUExecutionProvider",)
    extra = "cpu"
    native_precisions = frozenset({"fp32", "int8"})
