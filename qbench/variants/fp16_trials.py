"""Whether FP16's range limit changes a model's outputs: the FP32 model run on the calibration sample with chosen
tensors clamped or overflowed as FP16 would leave them, its outputs compared with the unchanged FP32 outputs.

A tensor FP16 cannot hold is not always a tensor FP16 gets wrong. Transformer exports build the attention mask from
float32's minimum (-3.4e38) or -1e9: every FP16 converter clamps that constant to -65504, and the softmax reading
`scores + mask` computes exactly the same (exp(-65504 + s) is 0, as exp(-3.4e38) is). A BatchNormalization whose
running variance of 1e10 is clamped to 65504 divides by 256 instead of 1e5. Only running the model tells them
apart, and that is what this module does, with one ONNX Runtime session per stage: the tried constants become graph
inputs (fed as they are or clamped), each tried activation gets a switch (a bool input) that overflows it.

How close is unchanged (`HARMLESS_SPACINGS`): every output value is compared with the spacing FP16 has at that
value (2**-10 of its binade, at least FP16's smallest subnormal 2**-24). An FP16 model's output differs from FP32's
by at least the rounding that storing it in FP16 costs, up to half that spacing, plus every rounding before it; a
trial that moves no output by more than an eighth of that spacing (a quarter of the storage rounding alone) changes
nothing FP16's own rounding does not dwarf. An output whose every value lies below FP16's smallest normal is not
stored in FP16 (the variant keeps it in float32, out of range), so its floor is its own scale instead: the spacing
FP16's 10 bits give its largest value (logits of 1e-9, rounded to zero a layer before, moved by 0.06 subnormals).
Harmful clamps are orders of magnitude beyond it (the variance above moves outputs by thousands of spacings), harmless
ones are 0 or nearly so, so the outcome does not hinge on the figure. Non-float outputs must be equal, and an output
NaN or inf where FP32's is not (or the reverse) is a change.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from qbench.per_call import fed_per_call, session_per_call_inputs
from qbench.variants.base import Feeds
from qbench.variants.onnx_utils import save_model

logger = logging.getLogger(__name__)

HARMLESS_SPACINGS = 0.125  # the most a harmless trial moves any output value, in FP16 spacings at that value
MAX_SINGLE_TRIALS = 16  # tensors tried one by one after a failed group trial; the rest count as harmful, untried
CACHED_OUTPUT_BYTES = 256 * 2**20  # reference outputs kept between trials; batches beyond it are recomputed
_SWITCH = "qbench_fp16_trial/"


FP16_SMALLEST_SUBNORMAL = 2.0**-24
FP16_FLUSHED_BELOW = 2.0**-25  # a nonzero magnitude FP16 rounds to 0 (half its smallest subnormal, ties to even)


def fp16_spacing(values: np.ndarray, floor: float = FP16_SMALLEST_SUBNORMAL) -> np.ndarray:
    """FP16's spacing at each |value| (2**-10 of its binade; `floor` below it), exponent unbounded above."""
    _, exponent = np.frexp(np.abs(values.astype(np.float64)))
    return np.where(values == 0, floor, np.maximum(np.ldexp(1.0, exponent - 11), floor))


def spacing_floor(values: np.ndarray) -> float:
    """The least spacing an output's values are measured in: FP16's smallest subnormal, or, for an output whose
    every value lies below FP16's smallest normal (kept float32), the spacing 2**-10 of its largest value's binade."""
    largest = float(np.max(np.abs(values), initial=0.0))
    if largest == 0.0:
        return FP16_SMALLEST_SUBNORMAL
    return min(FP16_SMALLEST_SUBNORMAL, float(fp16_spacing(np.array([largest]), floor=0.0)[0]))


def output_change(reference: Sequence[np.ndarray], got: Sequence[np.ndarray], at_scale: bool = False) -> float:
    """The largest change of any output value, in FP16 spacings at the reference value (module docstring), or with
    `at_scale` at the output's largest magnitude (the resolution FP16 gives the output as a whole)."""
    worst = 0.0
    for want, have in zip(reference, got, strict=True):
        want, have = np.asarray(want), np.asarray(have)
        if want.shape != have.shape:
            return float("inf")
        if want.dtype.kind != "f":
            if not np.array_equal(want, have):
                return float("inf")
            continue
        same_special = (np.isnan(want) & np.isnan(have)) | (np.isinf(want) & (want == have))
        finite = np.isfinite(want) & np.isfinite(have)
        if np.any(~finite & ~same_special):
            return float("inf")
        if np.any(finite):
            spacing = fp16_spacing(want[finite], spacing_floor(want[finite]))
            if at_scale:
                spacing = np.maximum(spacing, fp16_spacing(np.abs(want[finite]).max(keepdims=True)))
            moved = np.abs(have[finite].astype(np.float64) - want[finite]) / spacing
            worst = max(worst, float(moved.max()))
    return worst


@dataclass(frozen=True)
class Verdict:
    """The tried tensors found harmless and harmful, each with the output change measured (None: not tried)."""

    harmless: dict[str, float]
    harmful: dict[str, float | None]


def harmless_subset(names: Sequence[str], change: Callable[[Sequence[str]], float]) -> Verdict:
    """Which of `names` the model tolerates, `change(subset)` measuring the output change with that subset altered.

    The whole group first (one run: the common case, every one harmless); when it is not, each alone, at most
    `MAX_SINGLE_TRIALS` of them (the rest count as harmful, untried), then the harmless ones together again: two
    harmless alone may not be together, and then none of them is taken.
    """
    if not names:
        return Verdict({}, {})
    group = change(names)
    if group <= HARMLESS_SPACINGS:
        return Verdict(dict.fromkeys(names, group), {})
    if len(names) == 1:
        return Verdict({}, {names[0]: group})
    alone = {name: change([name]) for name in names[:MAX_SINGLE_TRIALS]}
    harmful: dict[str, float | None] = {name: value for name, value in alone.items() if value > HARMLESS_SPACINGS}
    harmful |= dict.fromkeys(names[MAX_SINGLE_TRIALS:])
    harmless = {name: value for name, value in alone.items() if name not in harmful}
    if len(harmless) > 1 and change(list(harmless)) > HARMLESS_SPACINGS:
        harmful |= harmless
        harmless = {}
    return Verdict(harmless, harmful)


def harmless_by_halves(names: Sequence[str], change: Callable[[Sequence[str]], float]) -> Verdict:
    """Which of `names` the model tolerates, as `harmless_subset` tells it, for many candidates of which few are
    harmful (every activation holding a value FP16 flushes to 0: each softmax beside one log of a power): a group
    that moves the outputs is halved until its harmful members stand alone, so every candidate is tried whatever
    their number, in about two runs per harmful one and level of halving; then the harmless ones together again."""
    harmless: dict[str, float] = {}
    harmful: dict[str, float | None] = {}
    groups = [list(names)] if names else []
    while groups:
        group = groups.pop()
        moved = change(group)
        if moved <= HARMLESS_SPACINGS:
            harmless |= dict.fromkeys(group, moved)
        elif len(group) == 1:
            harmful[group[0]] = moved
        else:
            groups += [group[len(group) // 2 :], group[: len(group) // 2]]
    if harmful and len(harmless) > 1 and (together := change(list(harmless))) > HARMLESS_SPACINGS:
        return Verdict({}, harmful | dict.fromkeys(harmless, together))
    return Verdict(harmless, harmful)


def clamped_as_converted(values: np.ndarray, min_positive: float, max_finite: float) -> np.ndarray:
    """`values` as the FP16 converters leave their range: beyond +-max_finite clamped to it, nonzero values below
    min_positive raised to it, values below FP16's smallest normal rounded to FP16 (its subnormals keep fewer bits).
    Normal values keep every float32 bit: their rounding is the precision every FP16 tensor has, not the range's."""
    clamped = np.clip(values, -max_finite, max_finite)
    tiny = (clamped != 0) & (np.abs(clamped) < min_positive)
    clamped = np.where(tiny, np.copysign(min_positive, clamped), clamped)
    subnormal = np.abs(clamped) < np.finfo(np.float16).tiny
    return np.where(subnormal, clamped.astype(np.float16).astype(np.float32), clamped).astype(np.float32)


class TrialSession:
    """One ONNX Runtime session of the FP32 model in which `constants` are graph inputs and each of `overflowed`
    (activation -> the magnitude beyond which it becomes inf), `rounded` (activations rounded to FP16 through a
    Cast pair) and `flushed` (activations whose values FP16 rounds to 0 become 0, the others kept) has a switch;
    `change(...)` runs the calibration sample and compares with the run that alters nothing.
    """

    def __init__(self, model: onnx.ModelProto, batches: Sequence[Feeds], constants: Iterable[str] = (),
                 overflowed: Mapping[str, float] | None = None, rounded: Iterable[str] = (),
                 flushed: Iterable[str] = ()) -> None:  # fmt: skip
        self.batches = batches
        trial, self.constants = _constants_as_inputs(model, set(constants))
        self.switches = _add_switches(trial, dict(overflowed or {}), set(rounded), set(flushed))
        self.outputs = [o.name for o in trial.graph.output]
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the FP32 model as written
        options.log_severity_level = 3
        with tempfile.TemporaryDirectory(prefix="qbench-fp16-trial-") as tmp:
            path = save_model(trial, Path(tmp) / "trial.onnx")
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.per_call = session_per_call_inputs(self.session)
        self._reference: dict[int, list[np.ndarray]] = {}
        self._cached = 0

    def run(self, feeds: Feeds, constants: Mapping[str, np.ndarray] | None = None,
            switched: Iterable[str] = ()) -> list[np.ndarray]:  # fmt: skip
        """The model's outputs on `feeds`, with `constants` replacing the tried constants' values and the
        activations `switched` altered."""
        on = set(switched)
        values = self.constants | dict(constants or {})
        flags = {flag: np.array(name in on) for name, flag in self.switches.items()}
        return self.session.run(self.outputs, {**fed_per_call(feeds, self.per_call), **values, **flags})

    def change(self, constants: Mapping[str, np.ndarray] | None = None, switched: Iterable[str] = (),
               only: Collection[int] | None = None, at_scale: bool = False) -> float:  # fmt: skip
        """The largest output change over the calibration sample, or its batches `only` (output_change, `at_scale`
        as there), against the unaltered model."""
        worst = 0.0
        switched = list(switched)
        for index, feeds in enumerate(self.batches):
            if only is not None and index not in only:
                continue
            got = self.run(feeds, constants, switched)
            worst = max(worst, output_change(self._reference_for(index, feeds), got, at_scale))
            if worst == float("inf"):
                break
        return worst

    def _reference_for(self, index: int, feeds: Feeds) -> list[np.ndarray]:
        if index in self._reference:
            return self._reference[index]
        outputs = self.run(feeds)
        size = sum(np.asarray(o).nbytes for o in outputs)
        if self._cached + size <= CACHED_OUTPUT_BYTES:
            self._reference[index], self._cached = outputs, self._cached + size
        return outputs


def _constants_as_inputs(model: onnx.ModelProto, names: set[str]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A copy of `model` whose initializers and Constant nodes named `names` are graph inputs; their values."""
    trial = onnx.ModelProto()
    trial.CopyFrom(model)
    graph = trial.graph
    values: dict[str, np.ndarray] = {}
    for tensor in [t for t in graph.initializer if t.name in names]:
        values[tensor.name] = numpy_helper.to_array(tensor)
        graph.initializer.remove(tensor)
    for node in [n for n in graph.node if n.op_type == "Constant" and n.output[0] in names]:
        values[node.output[0]] = next(numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value")
        graph.node.remove(node)
    declared = {i.name for i in graph.input}
    graph.input.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, value.shape)
                       for name, value in values.items() if name not in declared)  # fmt: skip
    return trial, values


def _add_switches(model: onnx.ModelProto, overflowed: dict[str, float], rounded: set[str],
                  flushed: set[str]) -> dict[str, str]:  # fmt: skip
    """Put a switch on each tried activation of `model`, in place: its main-graph readers read
    Where(switch, altered, original) instead. Returns activation -> the switch's bool input."""
    graph = model.graph
    tried = [*overflowed, *sorted((rounded | flushed) - set(overflowed))]
    if not tried:
        return {}
    switches = {name: f"{_SWITCH}{index}/on" for index, name in enumerate(tried)}
    inserted: dict[str, list[onnx.NodeProto]] = {}
    for index, name in enumerate(tried):
        prefix, altered = f"{_SWITCH}{index}/", f"{_SWITCH}{index}/altered"
        if name in overflowed:  # |x| beyond the limit -> x * inf: FP16 arithmetic overflows to inf, it does not clamp
            nodes = _altered_beyond(graph, name, prefix, switches[name], ("Greater", overflowed[name]), np.inf)
        elif name in flushed:  # |x| under half FP16's smallest subnormal -> x * 0: FP16 holds it as 0, sign kept
            nodes = _altered_beyond(graph, name, prefix, switches[name], ("Less", FP16_FLUSHED_BELOW), 0.0)
        else:  # every value below FP16's normals: FP16 holds it as a subnormal, or 0
            nodes = [helper.make_node("Cast", [name], [prefix + "half"], name=prefix + "half", to=TensorProto.FLOAT16),
                     helper.make_node("Cast", [prefix + "half"], [prefix + "back"], name=prefix + "back",
                                      to=TensorProto.FLOAT),
                     helper.make_node("Where", [switches[name], prefix + "back", name], [altered],
                                      name=altered)]  # fmt: skip
        inserted[name] = nodes
        graph.input.append(helper.make_tensor_value_info(switches[name], TensorProto.BOOL, []))
    renamed = {name: f"{_SWITCH}{index}/altered" for index, name in enumerate(tried)}
    order = [n for name in tried if name in {i.name for i in graph.input} for n in inserted.pop(name)]
    for node in graph.node:
        node.input[:] = [renamed.get(n, n) for n in node.input]
        order.append(node)
        order += [n for out in node.output if out in inserted for n in inserted.pop(out)]
    graph.ClearField("node")
    graph.node.extend(order)
    return switches


def _altered_beyond(graph: onnx.GraphProto, name: str, prefix: str, switch: str, bound: tuple[str, float],
                    factor: float) -> list[onnx.NodeProto]:  # fmt: skip
    """The nodes writing `prefix`altered: `name` times `factor` where its magnitude compares with `bound` (an op
    type, Greater or Less, and a limit) and `switch` is on, `name` elsewhere; their constants join `graph`."""
    compare, limit = bound
    graph.initializer.extend([numpy_helper.from_array(np.array(limit, np.float32), prefix + "limit"),
                              numpy_helper.from_array(np.array(factor, np.float32), prefix + "factor")])  # fmt: skip
    return [helper.make_node("Abs", [name], [prefix + "abs"], name=prefix + "abs"),
            helper.make_node(compare, [prefix + "abs", prefix + "limit"], [prefix + "hit_any"],
                             name=prefix + "hit_any"),
            helper.make_node("And", [prefix + "hit_any", switch], [prefix + "hit"], name=prefix + "hit"),
            helper.make_node("Mul", [name, prefix + "factor"], [prefix + "scaled"], name=prefix + "scaled"),
            helper.make_node("Where", [prefix + "hit", prefix + "scaled", name], [prefix + "altered"],
                             name=prefix + "altered")]  # fmt: skip
