"""Regression: one or more float values per row, judged against float labels and against FP32.

Without labels, mae / rmse / r2 / r2_min / max_error are measured against the FP32 outputs instead.
Several targets per row are judged one target at a time, then averaged uniformly (scikit-learn's
default): rmse and r2 are the mean of each target's, mae the mean over all values (the same thing),
r2_min the worst target's R². mae and rmse, in the targets' units, are decided by the largest-scale target; a
small one it would hide shows in r2, r2_min and the gate's fit_kept (qbench.validate.kept). max_error is the largest
error of any value, in the targets' units. A row agrees with FP32 when every one of its values is
within AGREEMENT_TOLERANCE x the standard deviation of that target's FP32 outputs (a scale-free
tolerance: the model's units are unknown; x the value itself where FP32 outputs one constant), and on a numerically
constant target never below ROUNDING_ULPS FP16 ULPs at the value's magnitude. One target per row is the plain
single-target case.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from qbench.modelinfo.signature import TensorMeta
from qbench.results.schema import SliceMetrics
from qbench.tasks.base import (
    LabelError,
    RowSummary,
    Task,
    example_rows,
    float_output_problem,
    mean_or_nan,
    wilson,
)
from qbench.validate import kept as kept_rules
from qbench.validate import metrics, metrics_targets
from qbench.validate.catalogue import MAX_ABS_ERROR, MetricInfo, share_of_rows

if TYPE_CHECKING:  # pragma: no cover
    import torch

AGREEMENT_TOLERANCE = 0.01
ROUNDING_ULPS = 2
"""The agreement tolerance's floor on a numerically constant target (its FP32 spread below one FP16 ULP at its
magnitude, a saturated sigmoid), in FP16 ULPs at each FP32 value's magnitude (ROUNDING_ULPS x FP16's epsilon
2**-10 x |value|): FP16 is the finest of the reduced precisions a variant rounds to (BF16, FP8 and INT8 are
coarser), so on such a target a difference below it is rounding that any of them makes, not disagreement. A target
that varies by more keeps 1 % of its spread even under FP16's resolution: that FP16 cannot tell its values apart is
a disagreement to show, not to tolerate."""
FP16_EPSILON = float(np.finfo(np.float16).eps)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _targets(value: Any) -> list[float] | None:
    """A label cell as its targets: [x] for a number, the numbers of a list or array; None if any is not finite."""
    items = list(np.asarray(value).reshape(-1)) if isinstance(value, (list, tuple, np.ndarray)) else [value]
    if not items or not all(_is_number(v) and math.isfinite(float(v)) for v in items):
        return None
    return [float(v) for v in items]


def _any_list(values: Sequence[Any]) -> bool:
    return any(isinstance(v, (list, tuple, np.ndarray)) for v in values)


def agreeing_rows(outputs: np.ndarray, reference: np.ndarray, tolerance: float | np.ndarray) -> np.ndarray:
    """1.0 for rows whose every |output - reference| <= tolerance (one, or one per target), else 0.0 (NaN/inf never
    agree)."""
    outputs, reference = np.asarray(outputs, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    difference = np.abs(outputs - reference).reshape(outputs.shape[0], -1)
    with np.errstate(invalid="ignore"):
        return (np.isfinite(difference) & (difference <= tolerance)).all(axis=1).astype(np.float64)


def agreement_tolerances(reference: np.ndarray) -> np.ndarray:
    """Each element's agreement tolerance, (rows, values) as `reference` (FP32's outputs): AGREEMENT_TOLERANCE x the
    population std of FP32's finite values of its column; where FP32 gives the column one value on every finite row
    (a constant channel, a bias passed through: std 0), x that value's magnitude instead. A std of 0 gave a tolerance
    of 0, so FP16's rounding of a constant 0.1 (to 0.0999756) disagreed on every row, whatever the other values did.
    On a numerically constant column (spread under FP16's epsilon x its magnitude) never below ROUNDING_ULPS FP16
    ULPs at the element's own magnitude: a saturated sigmoid (0.99999999 +- 1e-9) got 1 % of a std of 1e-9, so a
    variant's rounding of 1e-4 disagreed on every row. 0 where no value is finite (or the value is 0)."""
    finite = np.where(np.isfinite(reference), reference, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a value FP32 gives NaN/inf on every row: no scale
        spread = np.nan_to_num(np.nanstd(finite, axis=0), nan=0.0)
        magnitude = np.nan_to_num(np.nanmax(np.abs(finite), axis=0), nan=0.0)
    numerically_constant = spread < FP16_EPSILON * magnitude
    floor = np.where(numerically_constant, ROUNDING_ULPS * FP16_EPSILON * np.abs(np.nan_to_num(finite, nan=0.0)), 0.0)
    return np.maximum(AGREEMENT_TOLERANCE * np.where(spread > 0, spread, magnitude), floor)


@dataclass(frozen=True)
class RegressionRows:
    outputs: np.ndarray  # (rows, targets) float64
    reference: np.ndarray
    target: np.ndarray  # labels, or the FP32 outputs without labels
    agrees: np.ndarray

    def summarise(self, name: str, mask: np.ndarray) -> SliceMetrics:
        size = int(np.count_nonzero(mask))
        outputs, target, reference = self.outputs[mask], self.target[mask], self.reference[mask]
        agreement = mean_or_nan(self.agrees[mask])
        errors = np.abs(outputs - target)
        values = {
            "mae": metrics_targets.mean_absolute_error(outputs, target),
            "rmse": metrics_targets.root_mean_squared_error(outputs, target),
            "r2": metrics_targets.r2_score(outputs, target),
            "r2_min": metrics_targets.r2_min(outputs, target),
            "max_error": float(np.max(errors)) if errors.size else math.nan,
            "agreement": agreement,
            "max_abs_error": metrics.max_abs_error(outputs, reference),
        }
        intervals = {"mae": metrics.mean_interval(errors.mean(axis=1)), "agreement": wilson(agreement, size)}
        found = [k for k in (kept_rules.tail_kept(outputs, reference), kept_rules.fit_kept(outputs, reference, target))
                 if k is not None]  # fmt: skip
        kept = min(found, key=lambda k: k.share, default=None)  # the lower share; FP32 keeps both whole
        return SliceMetrics(name=name, size=size, metrics=values, intervals=intervals, kept={"": kept} if kept else {},
                            drop_intervals=metrics_targets.drop_intervals(outputs, reference, target))


class Regression(Task):
    name = "regression"
    labels_may_be_fed = True  # an autoencoder's target is its input
    metric_infos = (
        MetricInfo("mae", False, "mean absolute error vs labels (vs FP32 without labels)", low=0.0, data_units=True),
        MetricInfo("rmse", False, "root mean squared error vs labels (vs FP32 without labels), averaged over targets",
                   low=0.0, data_units=True),
        MetricInfo("r2", True, "coefficient of determination vs labels (vs FP32 without labels), "
                   "averaged over targets", high=1.0),
        MetricInfo("r2_min", True, "the worst target's coefficient of determination (r2 with one target)", high=1.0),
        MetricInfo("max_error", False, "largest absolute error vs labels (vs FP32 without labels)", low=0.0,
                   data_units=True),
        share_of_rows("agreement", True, "fraction of rows within 1% of each target's FP32 spread of FP32"),
        MAX_ABS_ERROR,
    )  # fmt: skip
    default_gate_metric = "mae"

    def labels_from_values(self, values: Sequence[Any], positions: np.ndarray) -> np.ndarray:
        """One finite number per row, or (several targets) a list of as many finite numbers in every row."""
        targets = [_targets(v) for v in values]
        bad = np.array([t is None for t in targets], dtype=bool)
        if bad.any():
            raise LabelError(f"{example_rows(bad, values, positions)} are not finite numbers; expected float targets "
                             "(a number per row, or a list of numbers for several targets)")  # fmt: skip
        widths = {len(t) for t in targets if t is not None}
        if len(widths) > 1:
            first = len(targets[0] or ())
            uneven = np.array([len(t or ()) != first for t in targets], dtype=bool)
            raise LabelError(f"{example_rows(uneven, values, positions)} hold a different number of targets than "
                             f"the first row ({first})")  # fmt: skip
        labels = np.array(targets, dtype=np.float64)
        return labels[:, 0] if labels.ndim == 2 and labels.shape[1] == 1 and not _any_list(values) else labels

    def check_labels(self, labels: np.ndarray, output: TensorMeta, positions: np.ndarray) -> None:
        targets = 1 if labels.ndim == 1 else labels.shape[1]
        width = output.shape[-1] if len(output.shape) == 2 else 1 if len(output.shape) == 1 else None
        if len(output.shape) > 2 or (width is not None and width != targets):
            raise LabelError(f"{targets} target{'s' if targets != 1 else ''} per row, but output {output.name!r} has "
                             f"shape {list(output.shape)}")  # fmt: skip

    def output_problem(self, output: TensorMeta) -> str | None:
        return float_output_problem(self.name, output)

    def rows(
        self, outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None, *,
        probabilities: bool | None = None
    ) -> RowSummary:
        if np.asarray(outputs).dtype.kind != "f":
            raise LabelError(f"task 'regression' reads float outputs only, got {np.asarray(outputs).dtype} values")
        rows = np.shape(outputs)[0]
        out = np.asarray(outputs, dtype=np.float64).reshape(rows, -1)
        ref = np.asarray(reference, dtype=np.float64).reshape(rows, -1)
        target = ref if labels is None else np.asarray(labels, dtype=np.float64).reshape(rows, -1)
        if target.shape[1] != out.shape[1]:
            raise LabelError(f"{target.shape[1]} target(s) per row, but the output has {out.shape[1]} values per row")
        return RegressionRows(out, ref, target, agreeing_rows(out, ref, agreement_tolerances(ref)))

    def qat_label_targets(self, labels: np.ndarray, output: torch.Tensor) -> torch.Tensor:
        import torch

        targets = torch.as_tensor(np.array(labels), dtype=torch.float32)
        width = 1 if targets.ndim == 1 else targets.shape[1]
        if output.reshape(output.shape[0], -1).shape[1] != width:
            raise LabelError(f"qat.loss 'label' needs {width} value(s) per row; the model returns {list(output.shape)}")
        return targets

    def qat_loss(self, kind: str, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        return F.mse_loss(output.reshape(targets.shape) if kind == "label" else output, targets)


REGRESSION = Regression()
