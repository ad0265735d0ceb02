"""Outputs a measurement already has for some of its rows, taken instead of running those rows again.

A search screens each candidate on some of the rows it later evaluates it on, and measures FP32 on every row before
it screens FP32 on some of them: the outputs of those rows are known. Taking them gives what running every row
gives only where each row's outputs follow that row alone, whatever is batched beside it: FP32 (its rows are
checked at preflight: qbench.preflight.rows) and a variant whose rows were seen not to depend on their batch
(`Measured.rows_independent`; measure checks the rows it evaluates again, and runs them all where they do depend).
Only outputs are taken: a timing is of the rows it ran, never of others.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class KnownOutputs:
    """The outputs (name -> values, a row each) of the rows at `indices` (sorted positions in the measured rows)."""

    indices: np.ndarray
    outputs: Feeds

    @classmethod
    def of_rows(cls, outputs: Mapping[str, np.ndarray], indices: np.ndarray) -> KnownOutputs:
        """The rows at `indices` of `outputs` (a run of every row), as the outputs of a measurement of those rows
        alone (positions 0, 1, ... there)."""
        return cls(np.arange(len(indices)), {name: np.asarray(values)[indices] for name, values in outputs.items()})

    @property
    def count(self) -> int:
        return len(self.indices)


def with_known(run: Callable[[Feeds, int], Feeds], feeds: Mapping[str, np.ndarray], batch_size: int,
               known: KnownOutputs) -> Feeds:  # fmt: skip
    """Every row's outputs: the `known` rows' as they are, the others' from `run(feeds of those rows, batch_size)`;
    every row run when the two disagree in outputs, shape or dtype (nothing then is taken)."""
    count = len(next(iter(feeds.values())))
    rest = np.setdiff1d(np.arange(count), known.indices)
    if not len(rest):
        return dict(known.outputs)
    ran = run({name: np.asarray(values)[rest] for name, values in feeds.items()}, batch_size)
    if set(ran) != set(known.outputs) or any(_shape(ran[n]) != _shape(known.outputs[n]) for n in ran):
        return run(dict(feeds), batch_size)
    joined = {}
    for name, values in ran.items():
        whole = np.empty((count, *values.shape[1:]), dtype=values.dtype)
        whole[rest], whole[known.indices] = values, known.outputs[name]
        joined[name] = whole
    return joined


def _shape(values: np.ndarray) -> tuple:
    return values.dtype, values.shape[1:]
