"""The keep-float stage's sensitivity ranking: the nodes a build quantized, the costliest first.

Each node's cost is the noise its quantization causes at the model's outputs (against FP32 on the screening rows, the
built Q/DQ model run with that node bypassed: qbench.explain.output), where measuring every node is predicted to take
at most OUTPUT_SHARE of the time the search has left; beyond that, and for nodes a graph edit cannot bypass, the noise
each adds where it computes (per-layer SQNR, qbench.explain.graph.sqnr_costs). Per-layer SQNR alone kept the wrong node
float: on a wide MLP whose head amplifies its first layer's noise it ranked the head first, and the search said
"unreachable" where keeping the first layer float passed. `Ranking.note` says which ranking was used.

The search ranks once on a static Q/DQ build (`ort-static`: Conv, MatMul, Gemm) and restricts that ranking to what each
keep-float base quantized. A base that quantizes nodes the static build leaves float (ONNX Runtime's dynamic INT8
lowers an LSTM to DynamicQuantizeLSTM, an Attention to QAttention) is ranked on its own build instead: on the static
ranking alone such nodes could never be kept float.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qbench.backends import Backend
from qbench.backends.base import RunOptions
from qbench.explain.graph import quantized_nodes, sqnr_costs
from qbench.explain.output import merged_order, output_effects
from qbench.files import write_fault
from qbench.validate.measure import describe_error
from qbench.variants import BuiltVariant
from qbench.variants.onnx_utils import load_model

logger = logging.getLogger(__name__)

# the share of the search's remaining time the output ranking may take: the rest is left to the keep-float candidates
# it ranks for (each a build and a screening)
OUTPUT_SHARE = 0.5


@dataclass(frozen=True)
class Ranking:
    names: list[str]  # the costliest first
    note: str  # which ranking, in words (the search report's notes); empty where none could be measured


def quantized_names(reference_path: Path, built: BuiltVariant) -> set[str]:
    """The names of the reference's nodes that `built` computes on quantized data."""
    return {n.name for n in quantized_nodes(load_model(reference_path), built)}


def noisiest_first(reference_path: Path, built: BuiltVariant, feeds: dict[str, np.ndarray], backend: Backend,
                   options: RunOptions, workdir: Path, fixed_batch: int | None,
                   seconds_left: float) -> Ranking:  # fmt: skip
    """The nodes `built` quantized whose noise could be measured on `feeds`, the costliest first (see the module
    docstring); `seconds_left`: the search's time budget left."""
    nodes = quantized_nodes(load_model(reference_path), built)
    workdir.mkdir(parents=True, exist_ok=True)
    noise = sqnr_costs(reference_path, built, nodes, [feeds], backend, options, workdir, fixed_batch)
    local = sorted((n.name for n in nodes if math.isfinite(noise.get(n.name, math.nan))), key=lambda n: -noise[n])
    effects = output_effects(reference_path, built, {n.name: [n] for n in nodes}, feeds, backend, options, workdir,
                             fixed_batch, OUTPUT_SHARE * max(seconds_left, 0.0))  # fmt: skip
    return Ranking(merged_order(local, effects.costs), f"keep-float ranking of {built.name}: "
                   + effects.describe(len(nodes), "nodes"))  # fmt: skip


def ranked_nodes(reference_path: Path, built: BuiltVariant, feeds: dict[str, np.ndarray], backend: Backend,
                 options: RunOptions, workdir: Path, fixed_batch: int | None,
                 seconds_left: float) -> Ranking:  # fmt: skip
    """`noisiest_first`, said on the console, or no names where the noise cannot be measured (without a ranking there
    are no keep-float candidates; a disk that cannot be written is raised: another candidate would be picked for it)."""
    try:
        ranking = noisiest_first(reference_path, built, feeds, backend, options, workdir, fixed_batch, seconds_left)
    except Exception as exc:  # noqa: BLE001 - without a ranking there are no keep-float candidates
        if write_fault(exc):
            raise
        logger.warning(f"  no sensitivity ranking of {built.name}: {describe_error(exc)}")
        return Ranking([], "")
    logger.info(f"  {ranking.note}: {', '.join(ranking.names[:4])}{' ...' if len(ranking.names) > 4 else ''}")
    return ranking
