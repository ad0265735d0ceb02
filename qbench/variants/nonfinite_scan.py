"""Which tensors carry NaN or ±inf on the calibration rows: such a tensor stays float in every quantized build.

With `data.nonfinite_inputs: keep` a model that reads NaN as missing (IsNaN -> Where, a tree ensemble's missing-value
branch, an Imputer) is calibrated on rows holding NaN. Quantize-dequantize maps NaN to a number, so whatever reads the
tensor afterwards takes the branch of a present value, on exactly the rows with a missing value. Nothing downstream
of ORT's quantizers notices: its MinMax calibrator gives such a tensor a finite range (its ReduceMin/ReduceMax kernels
may skip NaN, and it merges batches with np.nanmin/np.nanmax), and DynamicQuantizeLinear computes its scale from the
values that are not NaN and writes NaN as the tensor's minimum. The histogram calibrators already refuse such a
tensor (`histograms.histogram_problem`); this scan gives every other build the same rule.

Only calibration batches fed NaN/inf make it run (`holds_nonfinite`): then one ORT pass per calibration batch
exposes, for each tensor, the sum of (t - t) in float64: NaN exactly where t holds NaN or ±inf anywhere, since a sum
propagates NaN in any order (a min/max kernel need not).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from qbench.per_call import fed_per_call, session_per_call_inputs
from qbench.variants.base import Feeds
from qbench.variants.onnx_utils import save_model

_PREFIX = "qbench_nonfinite_"


def nonfinite_tensors(model: onnx.ModelProto, tensors: Iterable[str], batches: Sequence[Feeds],
                      workdir: Path) -> set[str]:
    """The numeric `tensors` (graph inputs or outputs of main-graph nodes of `model`) that hold NaN or ±inf on any of
    `batches`; names `model` does not compute at its top level are ignored. `model` is not changed."""
    graph = model.graph
    known = {value.name for value in graph.input} | {name for node in graph.node for name in node.output if name}
    names = sorted(set(tensors) & known)
    if not names or not any(holds_nonfinite(batch) for batch in batches):
        return set()
    scan = onnx.ModelProto()
    scan.CopyFrom(model)
    del scan.graph.output[:]
    for index, name in enumerate(names):
        flag = f"{_PREFIX}{index}"
        scan.graph.node.extend([
            helper.make_node("Cast", [name], [f"{flag}_double"], to=TensorProto.DOUBLE, name=f"{flag}_cast"),
            helper.make_node("Sub", [f"{flag}_double", f"{flag}_double"], [f"{flag}_zero"], name=f"{flag}_sub"),
            helper.make_node("ReduceSum", [f"{flag}_zero"], [flag], keepdims=0, name=f"{flag}_sum"),
        ])  # fmt: skip
        scan.graph.output.append(helper.make_tensor_value_info(flag, TensorProto.DOUBLE, []))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    path = save_model(scan, workdir / "nonfinite-scan.onnx")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    wanted = {value.name for value in session.get_inputs()}
    per_call = session_per_call_inputs(session)
    found: set[str] = set()
    for batch in batches:
        pending = [index for index, name in enumerate(names) if name not in found]
        if not pending:
            break
        fed = fed_per_call({k: v for k, v in batch.items() if k in wanted}, per_call)
        sums = session.run([f"{_PREFIX}{index}" for index in pending], dict(fed))
        found.update(names[index] for index, total in zip(pending, sums) if not np.isfinite(total))
    return found


def holds_nonfinite(batch: Feeds) -> bool:
    """Whether a float feed of `batch` holds NaN or ±inf: the rows `data.nonfinite_inputs: keep` feeds as they are.
    Only then is the model run again: a tensor computed from finite inputs that turns non-finite (a mask's -inf) gets
    no finite range from any calibrator (calibrate._finite), and the scan would cost every build a pass over its
    calibration rows."""
    return any(np.asarray(v).dtype.kind == "f" and not np.isfinite(v).all() for v in batch.values())


def nodes_reading_nonfinite(
    model: onnx.ModelProto, nodes: Collection[str], batches: Sequence[Feeds], workdir: Path
) -> dict[str, list[str]]:
    """Of the main-graph nodes named in `nodes`, those reading a computed float tensor (not an initializer) that holds
    NaN or ±inf on `batches`: node name -> those tensors. Quantizing such an input at run time (dynamic INT8) or with a
    calibrated range turns the NaN into a number."""
    graph = model.graph
    constants = {tensor.name for tensor in graph.initializer}
    other = _declared_not_float(model)
    reading = {node.name: [name for name in node.input if name and name not in constants and name not in other]
               for node in graph.node if node.name in nodes}  # fmt: skip
    bad = nonfinite_tensors(model, {name for names in reading.values() for name in names}, batches, workdir)
    return {node: [name for name in names if name in bad] for node, names in reading.items() if bad.intersection(names)}


def kept_float_note(reading: Mapping[str, list[str]]) -> str:
    """The variant's note naming the nodes `nodes_reading_nonfinite` found, kept float."""
    listed = ", ".join(f"{node} ({', '.join(tensors)})" for node, tensors in list(reading.items())[:5])
    more = f" (+{len(reading) - 5} more)" if len(reading) > 5 else ""
    return (f"{len(reading)} node(s) kept FP32: their inputs hold NaN/inf on calibration rows, which quantizing "
            f"would turn into numbers: {listed}{more}")


def _declared_not_float(model: onnx.ModelProto) -> set[str]:
    """Names of the tensors `model` declares (inputs, value_info, outputs) with a type that holds no NaN: integers,
    booleans, strings (an undeclared tensor is scanned: casting an integer to float64 costs nothing wrong)."""
    kinds = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    graph = model.graph
    return {value.name for value in (*graph.input, *graph.value_info, *graph.output)
            if not value.type.HasField("tensor_type") or value.type.tensor_type.elem_type not in kinds}  # fmt: skip
