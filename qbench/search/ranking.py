"""The keep-float stage's sensitivity ranking: the nodes a build quantized, the most noise added first (per-layer SQNR
against FP32 on the screening rows, qbench.explain_graph.sqnr_costs).

The search ranks once on a static Q/DQ build (`ort-static`: Conv, MatMul, Gemm) and restricts that ranking to what each
keep-float base quantized. A base that quantizes nodes the static build leaves float (ONNX Runtime's dynamic INT8
lowers an LSTM to DynamicQuantizeLSTM, an Attention to QAttention) is ranked on its own build instead: on the static
ranking alone such nodes could never be kept float.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from qbench.backends import Backend
from qbench.backends.base import RunOptions
from qbench.explain_graph import quantized_nodes, sqnr_costs
from qbench.files import write_fault
from qbench.validate.measure import describe_error
from qbench.variants import BuiltVariant
from qbench.variants.onnx_utils import load_model

logger = logging.getLogger(__name__)


def quantized_names(reference_path: Path, built: BuiltVariant) -> set[str]:
    """The names of the reference's nodes that `built` computes on quantized data."""
    return {n.name for n in quantized_nodes(load_model(reference_path), built)}


def noisiest_first(reference_path: Path, built: BuiltVariant, feeds: dict[str, np.ndarray], backend: Backend,
                   options: RunOptions, workdir: Path, fixed_batch: int | None) -> list[str]:  # fmt: skip
    """The nodes `built` quantized whose added noise could be measured on `feeds`, the noisiest first."""
    nodes = quantized_nodes(load_model(reference_path), built)
    workdir.mkdir(parents=True, exist_ok=True)
    noise = sqnr_costs(reference_path, built, nodes, [feeds], backend, options, workdir, fixed_batch)
    ranked = sorted((n for n in nodes if math.isfinite(noise.get(n.name, math.nan))), key=lambda n: -noise[n.name])
    return [n.name for n in ranked]


def ranked_nodes(reference_path: Path, built: BuiltVariant, feeds: dict[str, np.ndarray], backend: Backend,
                 options: RunOptions, workdir: Path, fixed_batch: int | None) -> list[str]:  # fmt: skip
    """`noisiest_first`, said on the console, or [] where the noise cannot be measured (without a ranking there are no
    keep-float candidates; a disk that cannot be written is raised: another candidate would be picked for it)."""
    try:
        names = noisiest_first(reference_path, built, feeds, backend, options, workdir, fixed_batch)
    except Exception as exc:  # noqa: BLE001 - without a ranking there are no keep-float candidates
        if write_fault(exc):
            raise
        logger.warning(f"  no sensitivity ranking of {built.name}: {describe_error(exc)}")
        return []
    logger.info(f"  sensitivity of {built.name} (added noise, SQNR): {', '.join(names[:4])}"
                f"{' ...' if len(names) > 4 else ''}")  # fmt: skip
    return names
