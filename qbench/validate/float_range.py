"""Values a variant's float format cannot hold, rounded to -inf or +inf, where the task's decision does not hang on
them.

FP16's largest finite value is 65504 and its smallest positive one 2**-24 (6e-08): FP32 class scores below -65504 on
a few rows (a feature far beyond the calibration sample's, an unbounded logit) are -inf in an FP16 variant, one above
65504 is +inf, and a Log of a Softmax computed in FP16 is -inf wherever the probability is below 6e-08. Read as any
NaN/inf, such a row was the variant's failure, a breach at the gate, though the served variant decides every row as
FP32 does. A task deciding by arg-max (Task.read_beyond_range) reads such a value as FP32's instead, where:

- the variant is -inf and FP32's probability of that class (the softmax of its scores along the last axis, computed in
  float64: the class's own probability for log-probabilities) is below the format's smallest positive value: the
  variant rounds to 0 a probability its format cannot hold, and nothing in the decision moves (a class that unlikely
  is never the arg-max);
- the variant is +inf, FP32's value is beyond the format's largest finite value, and no other score of that entry is
  +inf: the highest score, beyond the format, is still the arg-max;

and the entry's arg-max is the same read either way (a variant whose other scores moved is judged on what it gives).
Nothing else changes: NaN, a +inf FP32's value does not explain, an -inf on a class FP32 gives a probability the
format holds, stay failures; tasks whose values are the answer (regression, embedding) lose a value beyond the format,
and that stays the variant's failure. Formats are those of precisions whose variants compute in plain floats (FP16,
BF16); an INT8 or FP8 variant's scales, not its format, bound its values (FP8 saturates at 448 x scale: finite).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from qbench.validate.metrics import row_blocks, softmax


@dataclass(frozen=True)
class FloatFormat:
    """A float format a variant's values pass through: beyond `largest` a value rounds to inf, a positive value below
    `smallest` (its smallest subnormal) to 0."""

    name: str
    largest: float
    smallest: float


def _format(name: str, dtype: type) -> FloatFormat:
    info = ml_dtypes.finfo(dtype)
    return FloatFormat(name, float(info.max), float(info.smallest_subnormal))


FLOAT_FORMATS: Mapping[str, FloatFormat] = {
    "fp16": _format("float16", np.float16),  # 65504, 5.96e-08
    "bf16": _format("bfloat16", ml_dtypes.bfloat16),  # 3.39e38, 9.18e-41
}
"""Variant precision (VariantResult.precision) -> the float format its values pass through."""


def float_format(precision: str | None) -> FloatFormat | None:
    """The float format of a variant of `precision`, None where its format bounds nothing (FP32) or scales do (INT8,
    FP8)."""
    return FLOAT_FORMATS.get(precision or "")


def _beyond_block(outputs: np.ndarray, reference: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    values, ref = outputs.astype(np.float64), reference.astype(np.float64)
    finite = np.isfinite(ref)
    with np.errstate(invalid="ignore"):
        below = np.isneginf(values) & finite & (softmax(ref) < fmt.smallest)
    above = np.isposinf(values) & finite & (ref > fmt.largest)
    above &= (np.count_nonzero(np.isposinf(values), axis=-1) == 1)[..., None]
    rounded = below | above
    read = np.where(rounded, ref, values)
    kept = (np.argmax(read, axis=-1) == np.argmax(values, axis=-1)) & ~np.isneginf(values).all(axis=-1)
    return rounded & kept[..., None]


def beyond_format(outputs: np.ndarray, reference: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """Boolean mask, shaped as `outputs`, of the variant's -inf/+inf values that round an FP32 score `fmt` cannot hold
    and leave the arg-max along the last axis as it is (module docstring); an entry is a last-axis vector. Float
    outputs of several columns only; computed a block of rows at a time (metrics.row_blocks)."""
    outputs, reference = np.asarray(outputs), np.asarray(reference)
    rounded = np.zeros(outputs.shape, dtype=bool)
    if outputs.shape != reference.shape or outputs.dtype.kind != "f" or outputs.ndim < 2 or outputs.shape[-1] < 2:
        return rounded
    features = int(np.prod(outputs.shape[1:], dtype=np.int64))
    for block in row_blocks(outputs.shape[0], features):
        if np.isinf(outputs[block]).any():
            rounded[block] = _beyond_block(outputs[block], reference[block], fmt)
    return rounded


def read_as_reference(outputs: np.ndarray, reference: np.ndarray, fmt: FloatFormat | None) -> np.ndarray:
    """`outputs` with the values beyond_format marks read as FP32's (`outputs` itself where none is, or no format)."""
    outputs = np.asarray(outputs)
    if fmt is None:
        return outputs
    rounded = beyond_format(outputs, reference, fmt)
    if not rounded.any():
        return outputs
    read = np.array(outputs, copy=True)
    read[rounded] = np.asarray(reference)[rounded]
    return read


def beyond_format_note(name: str, outputs: np.ndarray, read: np.ndarray, fmt: FloatFormat) -> str | None:
    """What the variant's notes say of the rows whose -inf/+inf `outputs` a task reads as FP32's values (`read`: as it
    reads them, Task.read_beyond_range), None where there is none."""
    outputs, read = np.asarray(outputs), np.asarray(read)
    if outputs.dtype.kind != "f" or not outputs.size:
        return None
    rounded = np.isinf(outputs) & np.isfinite(read)
    rows = int(np.count_nonzero(rounded.reshape(rounded.shape[0], -1).any(axis=1)))
    if not rows:
        return None
    where = f"output {name!r}: " if name else ""
    return (f"{where}{rows} row{'s' if rows != 1 else ''} hold -inf/+inf scores where FP32's score is beyond "
            f"{fmt.name}'s range (+-{fmt.largest:.6g}) or its class's probability below {fmt.name}'s smallest "
            f"({fmt.smallest:.3g}), the arg-max unchanged: scored as FP32's values, not as the variant's NaN/inf rows")
