"""The opset a Q/DQ build writes its QuantizeLinear/DequantizeLinear at: one the installed ONNX Runtime runs.

A build inserts its nodes at the model's ONNX opset. ONNX Runtime may load a model stamped with an opset at which
it has no kernel for the version QuantizeLinear/DequantizeLinear take there: ONNX Runtime 1.32 runs an opset-28
model (onnx 1.23's newest) but has no QuantizeLinear(28), so every static INT8, FP8 and SmoothQuant/`linear` static
build of such a model failed when measured (`Could not find an implementation for QuantizeLinear(28)`), after the
rest of the sweep had run. Where the runtime lacks that kernel, the build is stamped at the lowest opset at which
every ONNX-domain node of the model keeps the version it has at its own opset (an opset import names, for each
operator, the newest version not above it; a node whose operator last changed at 17 means the same at 17 as at 28),
so the inserted Q/DQ take a version the runtime runs and the model's own nodes compute what they did. A model whose
own nodes need the runtime-less opset is a one-line build error naming the node and what to do."""

from __future__ import annotations

import functools

import onnx
from onnx import helper

from qbench.errors import QbenchError
from qbench.variants.onnx_utils import all_nodes, default_opset, subgraphs_of

_ONNX_DOMAINS = ("", "ai.onnx")


@functools.cache
def runtime_runs_qdq(opset: int) -> bool:
    """Whether the installed ONNX Runtime loads a QuantizeLinear -> DequantizeLinear pair (uint8) at `opset`."""
    import numpy as np
    import onnxruntime as ort

    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"])]  # fmt: skip
    inits = [onnx.numpy_helper.from_array(np.array(0.1, np.float32), "scale"),
             onnx.numpy_helper.from_array(np.array(128, np.uint8), "zero")]  # fmt: skip
    graph = helper.make_graph(nodes, "qdq_probe", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])], inits)  # fmt: skip
    imports = [helper.make_opsetid("", opset)]
    probe = helper.make_model(graph, opset_imports=imports,
                              ir_version=helper.find_min_ir_version_for(imports))  # fmt: skip
    try:
        ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - any refusal means the runtime does not run the pair at this opset
        return False
    return True


def qdq_runnable(model: onnx.ModelProto, minimum: int) -> tuple[onnx.ModelProto, str]:
    """`model`, or a copy stamped at a lower ONNX opset (at least `minimum`, what the build itself needs) whose
    QuantizeLinear/DequantizeLinear the installed ONNX Runtime runs, and the step's description ("" when unchanged).
    Raises QbenchError naming the node that holds the model at its opset where no lower stamp keeps its meaning."""
    opset = default_opset(model)
    if opset == 0 or runtime_runs_qdq(opset):
        return model, ""
    needed, holder = _opset_needed(model, minimum)
    if needed >= opset or not runtime_runs_qdq(needed):
        import onnxruntime as ort

        held = f"its node {holder} needs opset {needed}" if holder else f"the build needs opset {needed}"
        raise QbenchError(f"onnxruntime {ort.__version__} has no QuantizeLinear/DequantizeLinear kernel at the "
                          f"model's opset {opset}, and {held}, so no lower opset keeps what the model computes; "
                          f"expected a model exported at an opset this runtime quantizes at (re-export at an older "
                          f"opset), or a newer onnxruntime")  # fmt: skip
    lowered = onnx.ModelProto()
    lowered.CopyFrom(model)
    for entry in [*lowered.opset_import, *(e for f in lowered.functions for e in f.opset_import)]:
        if entry.domain in _ONNX_DOMAINS and entry.version == opset:
            entry.version = needed
    return lowered, (f"opset {opset} stamped as {needed} (every node keeps its operator version; onnxruntime "
                     f"has no QuantizeLinear/DequantizeLinear at {opset}); ")  # fmt: skip


def _opset_needed(model: onnx.ModelProto, minimum: int) -> tuple[int, str]:
    """The lowest opset, at least `minimum`, at which every ONNX-domain node of `model` (its subgraphs' and local
    functions' too) takes the operator version it takes at the model's opset, and the node that sets it ("" where
    `minimum` does). An operator ONNX has no schema for (ONNX Runtime's own, in the ONNX domain) holds the opset."""
    opset = default_opset(model)
    bodies = [body for function in model.functions for node in function.node for body in subgraphs_of(node)]
    nodes = [*all_nodes(model.graph), *(node for function in model.functions for node in function.node),
             *(node for body in bodies for node in all_nodes(body))]
    needed, holder = minimum, ""
    for node in (node for node in nodes if node.domain in _ONNX_DOMAINS):
        try:
            since = onnx.defs.get_schema(node.op_type, opset, "").since_version
        except onnx.defs.SchemaError:
            since = opset
        if since > needed:
            needed, holder = since, f"{node.op_type} {node.name!r}"
    return needed, holder
