"""Reading an ONNX file into the one form qbench inspects and builds from: model-local functions inlined.

Exporters wrap layers in ONNX local functions (`FunctionProto`: the TorchScript exporter's
`export_modules_as_functions`, onnxscript-authored models, graphs saved by onnx-ir based tools): the main graph
then holds a call node per block (`Block` in domain `__main__`) and the Conv/MatMul/Gemm it computes with sit in
the function's body. ONNX Runtime runs such a model, but every graph rewrite (ORT's quantizers and FP16 converter,
qbench's own BF16, FP8, Linear and SmoothQuant passes, the range analysis, explain) walks the main graph only: a
variant would quantize or convert the few nodes outside the functions and leave the rest FP32 while being reported
as that precision (the FP8 calibrator even fails: ORT's augmented copy calls a function it no longer declares).
Inlining once, where the model is read, gives every reader the graph that really computes. The names onnx's inliner
gives (a function node's name with `__<call>`) are a function of the file alone, so every read names them alike.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from qbench.errors import QbenchError, one_line


def read_onnx(path: Path, *, weights: bool = False) -> onnx.ModelProto:
    """The model at `path` with its local functions inlined; external tensors are read in only with `weights`.

    Inlining runs before the external data is loaded, so a model over protobuf's 2 GiB inlines too.
    """
    model = inline_functions(onnx.load(str(path), load_external_data=False), path)
    if weights:
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(model, str(Path(path).parent))
    return model


def inline_functions(model: onnx.ModelProto, path: Path | str = "model") -> onnx.ModelProto:
    """`model` with every call to a model-local function replaced by the function's body (recursively, subgraphs
    too); the model itself when it has none. Opset imports only the functions' domains needed are dropped."""
    if not model.functions:
        return model
    import onnx.inliner

    function_domains = {function.domain for function in model.functions}
    try:
        inlined = onnx.inliner.inline_local_functions(model, convert_version=True)
    except Exception as exc:  # noqa: BLE001 - the C++ inliner and the version converter raise several types
        raise QbenchError(one_line(f"{path}: cannot inline the model's local functions: {exc}")) from exc
    used = _domains_used(inlined.graph)
    kept = [o for o in inlined.opset_import if o.domain not in function_domains or o.domain in used]
    inlined.ClearField("opset_import")
    inlined.opset_import.extend(kept)
    return inlined


def _domains_used(graph: onnx.GraphProto) -> set[str]:
    used = set()
    for node in graph.node:
        used.add(node.domain)
        for attribute in node.attribute:
            for body in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                used |= _domains_used(body)
    return used
