"""Probabilities or logits: the graph's word first, else the share of FP32's rows that are distributions; a few
odd rows never turn the reading of all the others (a second softmax flattens probabilities: kl_mean far too small)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import special

from qbench.modelinfo.signature import read_model_info
from qbench.tasks.classification import Classification
from qbench.validate import metrics
from qbench.validate.accuracy import evaluate_accuracy, scale_notes
from qbench.validate.scores_scale import read_scale


def _probabilities(rows: int, classes: int, seed: int) -> np.ndarray:
    return special.softmax(np.random.default_rng(seed).normal(size=(rows, classes)) * 3, axis=1)


def _kl_of_distributions(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """KL of rows read as they are: clipped at 1e-12 and renormalised, as a distribution is."""
    p, q = (np.clip(a, 1e-12, None) for a in (p, q))
    p, q = p / p.sum(axis=1, keepdims=True), q / q.sum(axis=1, keepdims=True)
    return np.sum(p * np.log(p / q), axis=1)


def test_a_few_odd_rows_do_not_read_probabilities_as_logits() -> None:
    """One all-zero row (a masked one) or one row summing to 0.99 read every row as logits: kl_mean 0.02 where
    it was 1.36."""
    reference, variant = _probabilities(300, 6, seed=0), _probabilities(300, 6, seed=1)
    reference[0], reference[1] = 0.0, reference[1] * 0.99
    assert metrics.distribution_rows(reference) == metrics.DistributionRows(298, 299, 1e-3)
    np.testing.assert_allclose(metrics.kl_rows(reference, variant)[2:], _kl_of_distributions(reference, variant)[2:])


def test_float16_rows_are_distributions_within_a_few_units_in_the_last_place() -> None:
    reference = (_probabilities(50, 4, seed=2) * 0.998).astype(np.float16)  # rows sum to 0.998, as rounding leaves
    assert metrics.probability_tolerance(np.float16) == pytest.approx(4 * 2.0**-10)
    assert metrics.probability_tolerance(np.float32) == 1e-3
    assert metrics.looks_like_probabilities(reference)


def test_logits_stay_logits_when_a_few_rows_look_like_distributions() -> None:
    logits = np.random.default_rng(3).normal(size=(40, 3))
    logits[:19] = _probabilities(19, 3, seed=4)
    assert not metrics.looks_like_probabilities(logits)
    assert read_scale(logits, None).why == ("the graph does not say and only 19 of 40 finite, non-zero FP32 rows are "
                                            "non-negative and sum to 1 within 0.001 "
                                            "(a majority would read as probabilities)")  # fmt: skip


def test_the_graph_decides_several_sigmoid_columns_are_probabilities() -> None:
    """A Sigmoid per class (rows not summing to 1) was read by its values, as logits: a softmax of values in [0, 1]
    flattened both sides (kl_mean 0.04 where it was 0.28)."""
    rng = np.random.default_rng(5)
    reference, variant = special.expit(rng.normal(size=(200, 5)) * 3), special.expit(rng.normal(size=(200, 5)) * 3)
    kl = Classification().rows(variant, reference, None, probabilities=True).kl
    np.testing.assert_allclose(kl, _kl_of_distributions(reference, variant))
    assert read_scale(reference, True).note("p") == ("output 'p': scores read as probabilities because the graph "
                                                     "makes them with a Softmax, Sigmoid or a classifier's probability "
                                                     "transform")  # fmt: skip


class _ClippedSoftmax(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(torch.softmax(self.linear(x) * 3, dim=1), 0.02, 1.0)  # rows sum up to 1.18


def test_probabilities_clipped_in_the_graph_are_read_as_probabilities(tmp_path: Path) -> None:
    """Softmax then Clip: every row summed past 1 + 1e-3, so the output read as logits (kl_mean 0.02 where it was
    0.80); the graph is read back through the Clip, and FP32's note says why."""
    torch.manual_seed(0)
    reference_model, variant_model = _ClippedSoftmax(), _ClippedSoftmax()
    x = torch.from_numpy(np.random.default_rng(6).normal(size=(100, 6)).astype(np.float32))
    path = tmp_path / "m.onnx"
    torch.onnx.export(reference_model, (x[:2],), str(path), input_names=["x"], output_names=["p"],
                      dynamic_axes={"x": {0: "b"}, "p": {0: "b"}}, dynamo=False)  # fmt: skip
    with torch.no_grad():
        reference, variant = reference_model(x).numpy(), variant_model(x).numpy()
    scales = {"p": read_model_info(path).outputs["p"].probabilities}
    assert scales == {"p": True}
    result = evaluate_accuracy("classification", {"p": variant}, {"p": reference}, None, {}, probabilities=scales)
    expected = np.mean(_kl_of_distributions(reference.astype(np.float64), variant.astype(np.float64)))
    assert result.overall.metrics["kl_mean"] == pytest.approx(expected, rel=1e-9)
    assert scale_notes("classification", {"p": reference}, scales, None) == [read_scale(reference, True).note("p")]
