"""Which tensors FP16 cannot represent, decided from the FP32 model's own values.

FP16's largest finite value is 65504: a raw feature of 3e6 (an income, a byte count), a conv
output before a BatchNorm with a huge running variance, or a weight such as that variance
becomes inf in FP16 (the converters clamp weights to 65504 instead, which is just as wrong for
a variance of 1e10). Below 6.1e-5 (FP16's smallest normal) a value keeps fewer than 11 bits,
and below 2**-25 it is 0: a tensor whose every value is that small (features scaled by 1e-7)
is not represented either.

FP16 conversion tools let a user keep such tensors in float32 (keep-io-types, node block
lists); this module tells which nodes to block, from values, not from names or op types:

- constants (initializers, Constant nodes) are checked as they are;
- every float tensor of the main graph (graph inputs, node outputs) is computed by the FP32
  model on the calibration sample, and its largest finite magnitude is compared with FP16's
  range, with `HEADROOM`: a calibration sample is a sample, and a tensor that reaches half of
  65504 there reaches 65504 on rows beyond it;
- a tensor out of range keeps in float32 the node that produces it and every node that reads
  its values (Shape and Size read only its shape). What those nodes write is FP16 again when
  it is in range.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from qbench.variants.base import Feeds
from qbench.variants.float_support import SHAPE_ONLY_OPS
from qbench.variants.onnx_utils import save_model

logger = logging.getLogger(__name__)

FP16_MAX_FINITE = 65504.0
FP16_MIN_NORMAL = 2.0**-14  # 6.1e-05: below it a float16 is subnormal (fewer significant bits), below 2**-25 zero
HEADROOM = 2.0  # an activation is kept when it reaches FP16_MAX_FINITE / HEADROOM on the calibration sample
RANGE_REASON = "reads or writes values outside FP16's range (fp16_range in params)"


@dataclass(frozen=True)
class RangeCheck:
    """Tensors found outside FP16's range (name -> largest finite magnitude) and the nodes they keep in float32."""

    tensors: dict[str, float] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)  # node name -> reason
    rows: int = 0  # calibration rows the activations were computed on (0: only constants were checked)

    def params(self) -> dict[str, object]:
        return {
            "fp16_range": {
                "rows_checked": self.rows,
                "overflow_limit": FP16_MAX_FINITE / HEADROOM,
                "underflow_limit": FP16_MIN_NORMAL,
                "tensors": {name: float(f"{value:.4g}") for name, value in self.tensors.items()},
                "kept_nodes": list(self.nodes),
            }
        }

    def note(self) -> str | None:
        if not self.tensors:
            return None
        listed = sorted(self.tensors.items(), key=lambda item: -abs(np.log10(max(item[1], 1e-45))))
        shown = ", ".join(f"{name} (max |x| {value:.3g})" for name, value in listed[:5])
        more = f" and {len(listed) - 5} more" if len(listed) > 5 else ""
        source = f"in the weights and on {self.rows} calibration rows" if self.rows else "in the weights"
        return (f"kept in FP32 for range: {len(self.nodes)} node(s) reading or writing tensors FP16 cannot hold "
                f"{source} (beyond {FP16_MAX_FINITE / HEADROOM:g} or all below {FP16_MIN_NORMAL:.2g}): {shown}{more}")


def unrepresentable(magnitude: float, *, headroom: float = HEADROOM) -> bool:
    """Whether a tensor whose largest finite magnitude is `magnitude` does not fit FP16 (module docstring)."""
    return magnitude > FP16_MAX_FINITE / headroom or 0.0 < magnitude < FP16_MIN_NORMAL


def _largest(values: np.ndarray) -> float:
    """The largest finite magnitude (0 when there is none: an inf that FP32 computes is FP16's inf too)."""
    finite = np.abs(values[np.isfinite(values)]) if values.size else values
    return float(finite.max()) if finite.size else 0.0


def constant_magnitudes(model: onnx.ModelProto) -> dict[str, float]:
    """Largest finite magnitude of each float32 initializer and Constant node output of the main graph."""
    tensors = [(t.name, t) for t in model.graph.initializer]
    tensors += [(node.output[0], a.t) for node in model.graph.node if node.op_type == "Constant"
                for a in node.attribute if a.type == AttributeProto.TENSOR]  # fmt: skip
    return {name: _largest(numpy_helper.to_array(t)) for name, t in tensors if t.data_type == TensorProto.FLOAT}


def activation_magnitudes(
    model: onnx.ModelProto, names: Sequence[str], batches: Iterable[Feeds]
) -> dict[str, float] | None:
    """Largest finite magnitude of each float32 tensor `names` (graph inputs or node outputs) over `batches`, computed
    by the FP32 model on ONNX Runtime's CPU provider with those tensors added as outputs; None when ONNX Runtime
    refuses the model with them (a tensor typed wrongly by inference): the activations are then left unchecked."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {o.name for o in exposed.graph.output}
    inputs = {i.name for i in exposed.graph.input}
    wanted = [n for n in names if n not in inputs]
    exposed.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                                for n in wanted if n not in present)  # fmt: skip
    order = [o.name for o in exposed.graph.output]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the FP32 model's values as written
    options.log_severity_level = 3
    found = dict.fromkeys(names, 0.0)
    with tempfile.TemporaryDirectory(prefix="qbench-fp16-range-") as tmp:
        path = save_model(exposed, Path(tmp) / "exposed.onnx")  # a path: models over 2 GB keep external data
        try:
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - the variant still builds; its emulated figures show any overflow
            logger.warning("FP16 range: activations not checked, ONNX Runtime refused the exposed model: %s", exc)
            return None
        for feeds in batches:
            values = dict(zip(order, session.run(order, dict(feeds)), strict=True)) | dict(feeds)
            for name in names:
                if name in values:
                    found[name] = max(found[name], _largest(np.asarray(values[name], dtype=np.float64)))
    return found


def out_of_fp16_range(
    model: onnx.ModelProto,
    types: Mapping[str, int],
    batches: Sequence[Feeds],
    skip: Iterable[str] = (),
) -> RangeCheck:
    """The nodes that must stay float32 because a tensor they produce or read does not fit FP16 (module docstring).

    `types`: tensor element types (float_support.tensor_types); `skip`: nodes already kept (control flow, ai.onnx.ml
    operators...), whose tensors are checked only where a converted node shares them.
    """
    graph = model.graph
    skipped = set(skip)
    constants = constant_magnitudes(model)
    computed = [i.name for i in graph.input if types.get(i.name) == TensorProto.FLOAT and i.name not in constants]
    computed += [name for node in graph.node if node.op_type != "Constant" for name in node.output
                 if name and types.get(name) == TensorProto.FLOAT]  # fmt: skip
    magnitudes = dict(constants)
    rows = sum(len(next(iter(feeds.values()))) for feeds in batches if feeds)
    activations = activation_magnitudes(model, computed, batches) if batches and computed else None
    magnitudes |= activations or {}
    headroom = {name: 1.0 for name in constants}  # constants are known exactly: no margin
    outside = {name: value for name, value in magnitudes.items()
               if unrepresentable(value, headroom=headroom.get(name, HEADROOM))}  # fmt: skip
    nodes: dict[str, str] = {}
    used: dict[str, float] = {}
    for node in graph.node:
        if node.name in skipped:
            continue
        reads = [] if node.op_type in SHAPE_ONLY_OPS else [n for n in node.input if n in outside]
        writes = [n for n in node.output if n in outside]
        if reads or writes:
            nodes[node.name] = RANGE_REASON
            used |= {name: outside[name] for name in [*reads, *writes]}
    if used:
        logger.info("FP16 range: %d tensor(s) outside FP16's range keep %d node(s) in float32", len(used), len(nodes))
    return RangeCheck(used, nodes, rows if activations is not None else 0)
