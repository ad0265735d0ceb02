"""Whether several score columns hold probabilities or logits, and why: the graph's word first, FP32's values else.

The reading decides how kl_mean compares a variant with FP32: probabilities as they are (renormalised), logits
through their softmax. Read the wrong way, probabilities go through a second softmax that flattens both rows (a
variant whose top class moved on 6 rows in 10 showed kl_mean 0.02 where it was 1.37), and logits are clipped and
renormalised as if they were a distribution. So the graph decides where it says how the scores are made (a
Softmax or Sigmoid, an ONNX-ML classifier's probability transform: qbench.modelinfo.classes), and otherwise the
share of FP32's rows that are distributions does (metrics.DistributionRows): never a single row.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from qbench.validate import metrics


@dataclasses.dataclass(frozen=True)
class ScaleReading:
    """How scores are read (`probabilities`) and why, in words for results.json's notes and the report."""

    probabilities: bool
    why: str

    def note(self, output: str) -> str:
        kind = "probabilities" if self.probabilities else "logits (compared through their softmax)"
        return f"output {output!r}: scores read as {kind} because {self.why}"


def read_scale(reference: np.ndarray, stated: bool | None) -> ScaleReading:
    """The reading of FP32's (rows, classes) scores `reference`; `stated`: the graph's word (TensorMeta.probabilities).
    A variant is always read as FP32 is."""
    if stated is not None:
        made = "a Softmax, Sigmoid or a classifier's probability transform" if stated else "a linear layer"
        return ScaleReading(stated, f"the graph makes them with {made}")
    rows = metrics.distribution_rows(reference)
    share = (f"{rows.distributions} of {rows.informative} finite, non-zero FP32 rows are non-negative and sum to 1 "
             f"within {rows.tolerance:.3g}")  # fmt: skip
    if rows.probabilities:
        return ScaleReading(True, f"the graph does not say and {share}")
    return ScaleReading(False, f"the graph does not say and only {share} (a majority would read as probabilities)")
