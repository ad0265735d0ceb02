"""Which tensors FP16 cannot represent, and which of them FP16 gets wrong, decided from the FP32 model's own values.

FP16's largest finite value is 65504: a raw feature of 3e6 (an income, a byte count), a conv
output before a BatchNorm with a huge running variance, or a weight such as that variance
becomes inf in FP16 (the converters clamp weights to 65504 instead, which is just as wrong for
a variance of 1e10). Below 6.1e-5 (FP16's smallest normal) a value keeps fewer than 11 bits,
and below 2**-25 it is 0: a tensor whose every value is that small (features scaled by 1e-7)
is not represented either.

But not every such tensor matters: transformer exports fill the attention mask from float32's
minimum (-3.4e38) or -1e9, which every FP16 converter clamps to -65504 with the same softmax
after it. FP16 conversion tools let a user keep tensors in float32 (node block lists); this
module tells which nodes to block, from values, never from names or op types:

- constants (initializers, Constant nodes) out of FP16's range are checked as they are, then
  tried as the converter leaves them (clamped, fp16_trials.clamped_as_converted) in the FP32
  model on the calibration sample: those whose clamp leaves the outputs unchanged (within
  fp16_trials.HARMLESS_SPACINGS) are left to the converter, the others keep their readers FP32;
- every float tensor of the main graph (graph inputs, node outputs) is then computed on the
  calibration sample by the FP32 model with the harmless constants clamped (a mask built from
  a clamped fill holds -65504, not -3.4e38), and its largest finite magnitude is compared with
  FP16's range, with `HEADROOM`: a calibration sample is a sample, and a tensor that reaches
  half of 65504 there reaches 65504 on rows beyond it;
- such an activation is tried too: overflowed to inf beyond that half (FP16 arithmetic
  overflows, it does not clamp; `scores + mask` at -65504 - 20 is -inf, whose softmax weight
  is 0 all the same), or rounded to FP16 when every value is below its normals. The outputs
  unchanged, it is left to FP16; otherwise it keeps in float32 the node that produces it and
  every node that reads its values (Shape and Size read only its shape). What those nodes write
  is FP16 again when it is in range. A graph output out of range is kept without a trial;
- an activation in range of whose nonzero values a share (FLUSHED_SHARE) in a batch are ones FP16
  rounds to 0 (under 2**-25: a log-mel's `power + 1e-10` on silent frames) is tried with those
  values 0, on that batch, the outputs' change judged at their own scale: harmless for most (a
  softmax's tail), not for a reader that is singular there (Log, a divisor), whose input became
  -inf / NaN in FP16 though its producer was kept FP32 for the tiny constant; harmful, it keeps its
  producer and readers in float32 as above (fp16_trials.harmless_by_halves tries any number).

Without a calibration sample nothing is tried: a constant out of range keeps its readers FP32.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import onnxruntime as ort
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from qbench.files import write_fault
from qbench.per_call import fed_per_call, session_per_call_inputs
from qbench.variants.base import Feeds
from qbench.variants.float_support import SHAPE_ONLY_OPS
from qbench.variants.fp16_trials import (
    FP16_FLUSHED_BELOW,
    HARMLESS_SPACINGS,
    MAX_SINGLE_TRIALS,
    TrialSession,
    Verdict,
    clamped_as_converted,
    harmless_by_halves,
    harmless_subset,
)
from qbench.variants.onnx_utils import MEMORY_BUDGET_BYTES, rows_per_batch, save_model

logger = logging.getLogger(__name__)

FP16_MAX_FINITE = 65504.0
FP16_MIN_NORMAL = 2.0**-14  # 6.1e-05: below it a float16 is subnormal (fewer significant bits), below 2**-25 zero
FP16_MIN_POSITIVE = 5.96e-08  # smallest positive (subnormal) float16; the converter raises smaller values to it
HEADROOM = 2.0  # an activation is kept when it reaches FP16_MAX_FINITE / HEADROOM on the calibration sample
RANGE_REASON = "reads or writes values outside FP16's range (fp16_range in params)"


@dataclass(frozen=True)
class RangeCheck:
    """Tensors found outside FP16's range and kept (name -> largest finite magnitude; `why` each is kept), those
    FP16 may have (name -> (largest finite magnitude, output change in FP16 spacings): constants clamped,
    activations overflowing), and the nodes the kept ones keep in float32."""

    tensors: dict[str, float] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)  # node name -> reason
    rows: int = 0  # calibration rows the activations were computed on (0: only constants were checked)
    why: dict[str, str] = field(default_factory=dict)
    harmless: dict[str, tuple[float, float]] = field(default_factory=dict)

    def params(self) -> dict[str, object]:
        return {
            "fp16_range": {
                "rows_checked": self.rows,
                "overflow_limit": FP16_MAX_FINITE / HEADROOM,
                "underflow_limit": FP16_MIN_NORMAL,
                "harmless_change_limit_fp16_spacings": HARMLESS_SPACINGS,
                "tensors": {name: float(f"{value:.4g}") for name, value in self.tensors.items()},
                "kept_because": dict(self.why),
                "harmless": {name: {"max_abs": float(f"{value:.4g}"),
                                    "output_change_fp16_spacings": float(f"{change:.3g}")}
                             for name, (value, change) in self.harmless.items()},  # fmt: skip
                "kept_nodes": list(self.nodes),
            }
        }  # fmt: skip

    def note(self) -> str | None:
        notes = []
        if self.harmless:
            largest = max(change for _, change in self.harmless.values())
            shown = ", ".join(f"{name} (max |x| {value:.3g})" for name, (value, _) in list(self.harmless.items())[:5])
            more = f" and {len(self.harmless) - 5} more" if len(self.harmless) > 5 else ""
            notes.append(f"left to FP16 though out of its range: {len(self.harmless)} tensor(s) whose clamp or "
                         f"overflow moves the outputs on the calibration sample by at most {largest:.3g} FP16 "
                         f"spacings (limit {HARMLESS_SPACINGS:g}): {shown}{more}")  # fmt: skip
        if self.tensors:
            listed = sorted(self.tensors.items(), key=lambda item: -abs(np.log10(max(item[1], 1e-45))))
            shown = ", ".join(f"{name} (max |x| {value:.3g})" for name, value in listed[:5])
            more = f" and {len(listed) - 5} more" if len(listed) > 5 else ""
            source = f"in the weights and on {self.rows} calibration rows" if self.rows else "in the weights"
            notes.append(f"kept in FP32 for range: {len(self.nodes)} node(s) reading or writing tensors FP16 cannot "
                         f"hold {source} (beyond {FP16_MAX_FINITE / HEADROOM:g}, all below {FP16_MIN_NORMAL:.2g}, "
                         f"or with values under {FP16_FLUSHED_BELOW:.2g} that FP16 holds as 0), "
                         f"which change the outputs in FP16: {shown}{more}")  # fmt: skip
        return "; ".join(notes) or None


def unrepresentable(magnitude: float, *, headroom: float = HEADROOM) -> bool:
    """Whether a tensor whose largest finite magnitude is `magnitude` does not fit FP16 (module docstring)."""
    return magnitude > FP16_MAX_FINITE / headroom or 0.0 < magnitude < FP16_MIN_NORMAL


def _largest(values: np.ndarray) -> float:
    """The largest finite magnitude (0 when there is none: an inf that FP32 computes is FP16's inf too)."""
    finite = np.abs(values[np.isfinite(values)]) if values.size else values
    return float(finite.max()) if finite.size else 0.0


def constant_magnitudes(model: onnx.ModelProto) -> dict[str, float]:
    """Largest finite magnitude of each float32 initializer and Constant node output of the main graph."""
    return {name: _largest(numpy_helper.to_array(t)) for name, t in _named_constants(model)
            if t.data_type == TensorProto.FLOAT}  # fmt: skip


FLUSHED_SHARE = 1e-3  # the share of a tensor's nonzero values in a batch FP16 must flush for a trial of that flush


class Extent(NamedTuple):
    """The largest finite magnitude of a tensor's values (0 when none is finite), and the index of the first batch
    in which at least FLUSHED_SHARE of its nonzero values are ones FP16 flushes to 0 (None: in none), which a trial
    of that flush runs. A floor such as 1e-10 on silent frames, a softmax's tail, reach it; values of a unit-scale
    tensor crossing 0 by chance (about 6e-8 of them fall under 2**-25) never do, and their flush is noise."""

    largest: float
    first_flushed: int | None = None

    def joined(self, values: np.ndarray, batch: int) -> Extent:
        finite = np.abs(values[np.isfinite(values)])
        largest = max(self.largest, float(finite.max(initial=0.0)))
        nonzero = finite[finite > 0]
        flushed = np.count_nonzero(nonzero < FP16_FLUSHED_BELOW)
        if self.first_flushed is None and flushed and flushed >= FLUSHED_SHARE * nonzero.size:
            return Extent(largest, batch)
        return self._replace(largest=largest)


def activation_magnitudes(
    model: onnx.ModelProto, names: Sequence[str], batches: Iterable[Feeds], *, whole: bool = False,
    memory_budget: int = MEMORY_BUDGET_BYTES,
) -> dict[str, Extent] | None:
    """The extent (Extent: largest finite magnitude, first batch holding a value FP16 flushes to 0) of each float32
    tensor `names` (graph inputs or node outputs) over `batches`, computed by the FP32 model on ONNX Runtime's CPU
    provider with those tensors added as outputs; None when ONNX Runtime refuses the model with them (a tensor typed
    wrongly by inference): the activations are then left unchecked.

    Every exposed tensor of a run is alive at once (a vision model's activations of 16 rows run to gigabytes): a
    batch is run in parts of as many rows as fit in `memory_budget`, learnt from a first run of two rows; with `whole`
    (a model of a fixed batch) each batch whole."""
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
    found = dict.fromkeys(names, Extent(0.0))
    with tempfile.TemporaryDirectory(prefix="qbench-fp16-range-") as tmp:
        path = save_model(exposed, Path(tmp) / "exposed.onnx")  # a path: models over 2 GB keep external data
        try:
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - the variant still builds; its emulated figures show any overflow
            logger.warning("FP16 range: activations not checked, ONNX Runtime refused the exposed model: %s", exc)
            return None
        rows = None if whole else 2  # rows per run, until the first run tells a row's bytes
        per_call = session_per_call_inputs(session)
        for batch, feeds in enumerate(batches):
            size = len(next(iter(feeds.values())))
            start = 0
            while start < size:
                part = {k: v[start : start + (rows or size)] for k, v in feeds.items()}
                count = len(next(iter(part.values())))
                outputs = session.run(order, dict(fed_per_call(part, per_call)))
                if rows is not None:
                    tensor_bytes = sum(a.nbytes for a in outputs if isinstance(a, np.ndarray))  # not sequences, maps
                    rows = rows_per_batch(tensor_bytes // count, max(size, 2), memory_budget)
                values = dict(zip(order, outputs, strict=True)) | part
                for name in names:
                    if name in values:
                        found[name] = found[name].joined(np.asarray(values[name], dtype=np.float64), batch)
                start += count
    return found


def out_of_fp16_range(
    model: onnx.ModelProto,
    types: Mapping[str, int],
    batches: Sequence[Feeds],
    skip: Iterable[str] = (),
    whole: bool = False,
) -> RangeCheck:
    """The nodes that must stay float32 because a tensor they produce or read does not fit FP16 and changes the
    outputs when FP16 clamps or overflows it (module docstring).

    `types`: tensor element types (float_support.tensor_types); `skip`: nodes already kept (control flow, ai.onnx.ml
    operators...), whose tensors are checked only where a converted node shares them; `whole`: the model's batch is
    fixed (activation_magnitudes).
    """
    graph = model.graph
    skipped = set(skip)
    converted = [node for node in graph.node if node.name not in skipped]
    touched = {name for node in converted for name in [*node.output, *(
        () if node.op_type in SHAPE_ONLY_OPS else node.input)] if name}  # fmt: skip
    constants = constant_magnitudes(model)
    outside = {name: value for name, value in constants.items()
               if name in touched and unrepresentable(value, headroom=1.0)}  # fmt: skip  # known exactly: no margin
    rows = sum(len(next(iter(feeds.values()))) for feeds in batches if feeds)
    if not batches:
        why = dict.fromkeys(outside, "a constant out of range, not tried: no calibration sample")
        return _kept(converted, outside, why, {}, 0)
    verdict = _try_constants(model, batches, list(outside))
    harmless = {name: (outside[name], change) for name, change in verdict.harmless.items()}
    why = _reasons(verdict, lambda _: "clamped as the converter clamps it")
    clamped = _with_constants_clamped(model, list(verdict.harmless))
    computed = [i.name for i in graph.input if types.get(i.name) == TensorProto.FLOAT and i.name not in constants]
    computed += [name for node in graph.node if node.op_type != "Constant" for name in node.output
                 if name and types.get(name) == TensorProto.FLOAT]  # fmt: skip
    activations = activation_magnitudes(clamped, computed, batches, whole=whole) if computed else None
    extents = {name: extent for name, extent in (activations or {}).items() if name in touched}
    found = {name: extent.largest for name, extent in extents.items() if unrepresentable(extent.largest)}
    outputs = {o.name for o in graph.output}
    why |= dict.fromkeys(found.keys() & outputs, "a graph output out of range: FP16 would hand it out clamped or inf")
    flushed = {name: extent.first_flushed for name, extent in extents.items()
               if name not in found and name not in outputs and extent.first_flushed is not None}  # fmt: skip
    verdict = _try_activations(clamped, batches, {name: value for name, value in found.items() if name not in outputs},
                               flushed)  # fmt: skip
    harmless |= {name: (found[name], change) for name, change in verdict.harmless.items() if name in found}
    limit = FP16_MAX_FINITE / HEADROOM
    why |= _reasons(verdict, lambda name: f"its values under {FP16_FLUSHED_BELOW:.3g} flushed to 0 as FP16 holds them"
                    if name not in found else f"overflowed to inf beyond {limit:g}" if found[name] > limit
                    else "rounded to FP16's subnormals")  # fmt: skip
    outside |= {name: extents[name].largest for name in [*found, *flushed] if name not in verdict.harmless}
    return _kept(converted, {n: v for n, v in outside.items() if n not in harmless}, why, harmless,
                 rows if activations is not None else 0)  # fmt: skip


def _kept(converted: Sequence[onnx.NodeProto], outside: Mapping[str, float], why: Mapping[str, str],
          harmless: dict[str, tuple[float, float]], rows: int) -> RangeCheck:  # fmt: skip
    """The converted nodes that read or write a tensor of `outside`, which stay float32."""
    nodes: dict[str, str] = {}
    used: dict[str, float] = {}
    for node in converted:
        reads = [] if node.op_type in SHAPE_ONLY_OPS else [n for n in node.input if n in outside]
        writes = [n for n in node.output if n in outside]
        if reads or writes:
            nodes[node.name] = RANGE_REASON
            used |= {name: outside[name] for name in [*reads, *writes]}
    if used:
        logger.info("FP16 range: %d tensor(s) outside FP16's range keep %d node(s) in float32", len(used), len(nodes))
    if harmless:
        logger.info("FP16 range: %d tensor(s) outside FP16's range change no output: left to FP16", len(harmless))
    return RangeCheck(used, nodes, rows, {name: why.get(name, "") for name in used}, harmless)


def _reasons(verdict: Verdict, altered: Callable[[str], str]) -> dict[str, str]:
    """Why each harmful tensor of `verdict` is kept: `altered(name)` says how it was tried."""
    return {name: (f"{altered(name)}, it moves the outputs by {change:.3g} FP16 spacings on the calibration sample"
                   if change is not None else f"not tried (only {MAX_SINGLE_TRIALS} are tried one by one, or ONNX "
                   "Runtime refused the trial model): kept to be safe")
            for name, change in verdict.harmful.items()}  # fmt: skip


def _named_constants(model: onnx.ModelProto) -> list[tuple[str, onnx.TensorProto]]:
    """The main graph's initializers and Constant node values (TENSOR attributes), by the tensor they define."""
    tensors = [(t.name, t) for t in model.graph.initializer]
    return tensors + [(node.output[0], a.t) for node in model.graph.node if node.op_type == "Constant"
                      for a in node.attribute if a.type == AttributeProto.TENSOR]  # fmt: skip


def _clamped_values(model: onnx.ModelProto, names: Iterable[str]) -> dict[str, np.ndarray]:
    """The float constants `names` as the converter writes their range (fp16_trials.clamped_as_converted)."""
    wanted = set(names)
    return {name: clamped_as_converted(numpy_helper.to_array(t), FP16_MIN_POSITIVE, FP16_MAX_FINITE)
            for name, t in _named_constants(model) if name in wanted}  # fmt: skip


def _with_constants_clamped(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """`model` itself when `names` is empty, else a copy whose constants `names` hold their clamped values."""
    if not names:
        return model
    values = _clamped_values(model, names)
    clamped = onnx.ModelProto()
    clamped.CopyFrom(model)
    for name, tensor in _named_constants(clamped):
        if name in values:
            tensor.CopyFrom(numpy_helper.from_array(values[name], tensor.name))
    return clamped


def _try_constants(model: onnx.ModelProto, batches: Sequence[Feeds], names: Sequence[str]) -> Verdict:
    """Which constants of `names` the model's outputs tolerate clamped (fp16_trials.harmless_subset)."""
    if not names:
        return Verdict({}, {})
    try:
        session = TrialSession(model, batches, constants=names)
    except Exception as exc:  # noqa: BLE001 - then every one of them keeps its readers FP32, as without a trial
        if write_fault(exc):  # the disk's fault: a build without its trial would be stored under its key
            raise
        logger.warning("FP16 range: constants out of range not tried, ONNX Runtime refused the trial model: %s", exc)
        return Verdict({}, dict.fromkeys(names))
    clamped = _clamped_values(model, names)
    return harmless_subset(names, lambda subset: session.change({name: clamped[name] for name in subset}))


def _try_activations(model: onnx.ModelProto, batches: Sequence[Feeds], found: Mapping[str, float],
                     flushed: Mapping[str, int] | None = None) -> Verdict:  # fmt: skip
    """Which activations of `found` (name -> largest magnitude) the outputs tolerate overflowed (those beyond the
    limit) or rounded to FP16 (those below its normals), and which of `flushed` (in range, but holding values FP16
    rounds to 0; name -> the first batch holding one) they tolerate with those values 0, compared with `model`
    (its harmless constants clamped: each stage within HARMLESS_SPACINGS of the one before).

    A flush moves a value by under 3e-8: most outputs move by as little, which matters only where it reaches FP16's
    resolution at the output's own scale (a log of 0 is -inf; a LayerNorm output of 1e-7 moved by 2e-7 is noise
    FP16 stores as no better), and only the batches holding the tensors tried are run (a trial of a transformer's
    calibration sample per candidate group cost it seconds each)."""
    flushed = dict(flushed or {})
    tried = [*found, *flushed]
    if not tried:
        return Verdict({}, {})
    limit = FP16_MAX_FINITE / HEADROOM
    try:
        session = TrialSession(model, batches,
                               overflowed={name: limit for name, value in found.items() if value > limit},
                               rounded=[name for name, value in found.items() if value <= limit],
                               flushed=flushed)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - then every one of them stays FP32, as without a trial
        if write_fault(exc):  # the disk's fault: a build without its trial would be stored under its key
            raise
        logger.warning("FP16 range: activations out of range not tried, ONNX Runtime refused the trial model: %s", exc)
        return Verdict({}, dict.fromkeys(tried))
    beyond = harmless_subset(list(found), lambda subset: session.change(switched=subset))
    under = harmless_by_halves(list(flushed), lambda subset: session.change(
        switched=[*beyond.harmless, *subset], only={flushed[name] for name in subset}, at_scale=True))
    return Verdict(beyond.harmless | under.harmless, beyond.harmful | under.harmful)
