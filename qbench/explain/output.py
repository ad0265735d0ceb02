"""The noise each group of quantized nodes causes at the model's OUTPUTS: the built Q/DQ model run once per group with
that group's quantization bypassed (qbench.variants.qdq_bypass: the nodes read their float inputs again; no rebuild,
no recalibration), its output noise-to-signal ratio against FP32 subtracted from the built model's.

Per-layer SQNR (explain_graph.sqnr_costs) reads the noise where each node computes, and so blames a later node for
noise an earlier one injected and it amplified: on a wide MLP whose head amplifies the first layer's noise, the head's
local score was 0.023 and the first layer's 0.0008, but kept float the head took the output noise from 0.0758 to
0.0757 and the first layer to 0.0001. One run per group is cheap for a few dozen groups; `output_effects` predicts the
cost of all of them from the seconds one candidate took (the built model, edited, saved, loaded and run on the same
rows) and measures none past the caller's allowance. Nodes a graph edit cannot bypass (a dynamic build's integer
kernels, a SmoothQuant build's rescaled tensors) keep their per-layer place (`merged_order`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from qbench.backends import Backend
from qbench.backends.base import RunOptions
from qbench.data import iter_batches
from qbench.explain.graph import Feeds, QuantizedNode, real_rows
from qbench.validate.measure import output_nsr
from qbench.variants import BuiltVariant
from qbench.variants.onnx_utils import discard_built, load_model, save_model
from qbench.variants.qdq_bypass import bypass_qdq

OUTPUT_BATCH_ROWS = 64  # rows run at a time: only the graph outputs of every row are held


@dataclass(frozen=True)
class OutputEffects:
    """What `output_effects` found: per measured group, the output NSR its quantization adds (the built model's less
    the one with the group bypassed); how many groups could be bypassed; the seconds measuring them all was predicted
    to take, and the allowance it was held to; why none was measured, where none was for another reason."""

    costs: dict[str, float]
    bypassable: int
    predicted_s: float = 0.0
    allowance_s: float = math.inf
    unmeasured: str = ""

    def describe(self, groups: int, what: str) -> str:
        """Which ranking `merged_order` gives, in words, for `groups` groups of `what` ("nodes", "groups")."""
        local = "by the noise each adds where it computes (per-layer SQNR)"
        if not self.bypassable:
            return f"{local}: none of its {groups} {what} can be bypassed in the built graph (integer kernels or " \
                   "rescaled tensors)"  # fmt: skip
        if self.unmeasured:
            return f"{local}: {self.unmeasured}"
        if not self.costs:
            return (f"{local}: measuring each of its {self.bypassable} bypassable {what} at the outputs was predicted "
                    f"to take {self.predicted_s:.3g} s, past the {self.allowance_s:.3g} s allowed")  # fmt: skip
        kept = groups - len(self.costs)
        rest = f"; {kept} that cannot be bypassed keep their per-layer SQNR place" if kept else ""
        return (f"by the noise each causes at the model's outputs (output noise-to-signal ratio with its quantization "
                f"bypassed, {len(self.costs)} {what}, {self.predicted_s:.3g} s){rest}")  # fmt: skip


def bypassable(built: BuiltVariant, quantized: onnx.ModelProto,
               groups: Mapping[str, Sequence[QuantizedNode]]) -> list[str]:
    """The groups a Q/DQ bypass can keep float in `built`: every node of theirs is in its graph and reads a dequantized
    tensor. None of a dynamic build's (its nodes became integer kernels under other names) or a build whose weights were
    rewritten (SmoothQuant: the tensors between its Linears are not FP32's, so no node can read FP32's again)."""
    if built.dynamic or built.params.get("weights_rewritten"):
        return []
    dequantized = {o for n in quantized.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    reads = {n.name: set(n.input) for n in quantized.graph.node if n.name}
    return [g for g, members in groups.items()
            if members and all(reads.get(n.name, set()) & dequantized for n in members)]  # fmt: skip


def output_effects(
    reference_path: Path, built: BuiltVariant, groups: Mapping[str, Sequence[QuantizedNode]], feeds: Feeds,
    backend: Backend, options: RunOptions, workdir: Path, fixed_batch: int | None, allowance_s: float,
) -> OutputEffects:  # fmt: skip
    """Group -> the output noise its quantization adds on `feeds`, for every group `bypassable` names, when measuring
    them all is predicted to take no more than `allowance_s`; else no group measured (the prediction said why).

    The prediction: the groups times the seconds the built model took as each candidate is taken (an edit bypassing
    nothing, saved, loaded, run on `feeds`), measured here on this model and these rows."""
    reference, quantized = load_model(reference_path), load_model(built.onnx_path)
    names = bypassable(built, quantized, groups)
    if not names:
        return OutputEffects({}, 0)
    if allowance_s <= 0:  # not even the one run its prediction takes
        return OutputEffects({}, len(names), allowance_s=allowance_s, unmeasured="no time was left to measure them at "
                             "the outputs")  # fmt: skip
    workdir.mkdir(parents=True, exist_ok=True)
    op_types = built.params.get("op_types")
    fp32 = _outputs(backend, options, dataclasses.replace(built, onnx_path=reference_path), feeds, fixed_batch)
    if not any(np.asarray(o).dtype.kind == "f" for o in fp32):
        return OutputEffects({}, len(names), unmeasured="the model has no floating-point output to measure noise on")

    def noise_without(kept: Collection[str], label: str) -> float:
        candidate = dataclasses.replace(built, name=label, onnx_path=workdir / f"{label}.onnx")
        save_model(bypass_qdq(quantized, reference, kept, op_types), candidate.onnx_path)
        try:
            return output_nsr(fp32, _outputs(backend, options, candidate, feeds, fixed_batch))
        finally:
            discard_built(candidate, workdir)

    started = time.perf_counter()
    everything = noise_without((), "output-noise-built")
    predicted = len(names) * (time.perf_counter() - started)
    if not math.isfinite(everything):
        return OutputEffects({}, len(names), unmeasured="the built model's outputs are not finite")
    if predicted > allowance_s:
        return OutputEffects({}, len(names), predicted, allowance_s)
    costs = {}
    for index, group in enumerate(names):
        costs[group] = everything - noise_without({n.name for n in groups[group]}, f"output-noise-{index}")
    return OutputEffects(costs, len(names), predicted, allowance_s)


def merged_order(local: Sequence[str], costs: Mapping[str, float]) -> list[str]:
    """The `local` order (noisiest first by per-layer SQNR) whose places held by groups measured at the outputs
    (finite `costs`) are refilled by those groups, the costliest first; the others keep their place. Measured groups
    the local ranking left out (their noise not measurable where they compute) fill the last places."""
    measured = [g for g in costs if math.isfinite(costs[g])]
    by_output = iter(sorted(measured, key=lambda g: -costs[g]))
    merged = [next(by_output) if g in costs and math.isfinite(costs[g]) else g for g in local]
    return merged + list(by_output)


def _outputs(backend: Backend, options: RunOptions, built: BuiltVariant, feeds: Feeds,
             fixed_batch: int | None) -> list[np.ndarray]:  # fmt: skip
    """The graph outputs of `built` on every row of `feeds`, a batch at a time (a model with a `fixed_batch`: that
    many, a last batch filled with repeats whose rows are left out)."""
    size = fixed_batch or OUTPUT_BATCH_ROWS
    rows = len(next(iter(feeds.values())))
    runner = backend.load(built, options)
    try:
        parts = [[real_rows(o, size, rows - start) for o in runner.run(batch)]
                 for start, batch in zip(range(0, rows, size),
                                         iter_batches(feeds, size, whole=fixed_batch is not None))]  # fmt: skip
    finally:
        runner.close()
    return [np.concatenate(column) if column[0].ndim else column[0] for column in zip(*parts)]
