"""The tasks' per-scope figures against scikit-learn/scipy computed on the scope's rows (or scored tokens) alone."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special
from sklearn import metrics as skm

from qbench.tasks.classification import Classification
from qbench.tasks.regression import Regression


def _kl_of_probabilities(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    p, q = (np.clip(x / x.sum(axis=1, keepdims=True), 1e-12, 1) for x in (p.astype(float), q.astype(float)))
    return special.rel_entr(p, q).sum(axis=1)


@pytest.mark.parametrize("seed", range(5))
def test_classification_slices_are_computed_on_their_own_rows(seed):
    rng = np.random.default_rng(seed)
    rows, classes = 80, 5
    reference = rng.normal(size=(rows, classes)).astype(np.float32) * 4
    outputs = (reference + rng.normal(size=reference.shape) * 2).astype(np.float16)
    labels = rng.integers(0, classes, rows)
    mask = rng.random(rows) < 0.3
    scope = Classification().rows(outputs, reference, labels).summarise("s", mask)
    predicted, expected = np.argmax(outputs[mask], axis=1), np.argmax(reference[mask], axis=1)
    assert scope.metrics["accuracy"] == pytest.approx(skm.accuracy_score(labels[mask], predicted))
    assert scope.metrics["agreement"] == pytest.approx(skm.accuracy_score(expected, predicted))
    log_p = special.log_softmax(reference[mask].astype(float), axis=1)
    log_q = special.log_softmax(outputs[mask].astype(float), axis=1)
    assert scope.metrics["kl_mean"] == pytest.approx(np.mean((np.exp(log_p) * (log_p - log_q)).sum(axis=1)))
    assert scope.metrics["max_abs_error"] == np.max(np.abs(outputs[mask].astype(float) - reference[mask]))


@pytest.mark.parametrize("seed", range(5))
def test_regression_slices_match_sklearn_on_their_rows(seed):
    rng = np.random.default_rng(seed)
    reference = rng.normal(size=(60, 3)) * [1e-3, 1.0, 50.0]
    outputs = reference + rng.normal(size=reference.shape) * [1e-4, 0.1, 5.0]
    labels = reference + rng.normal(size=reference.shape) * [2e-4, 0.2, 10.0]
    mask = rng.random(60) < 0.5
    scope = Regression().rows(outputs, reference, labels).summarise("s", mask)
    assert scope.metrics["mae"] == pytest.approx(skm.mean_absolute_error(labels[mask], outputs[mask]))
    assert scope.metrics["rmse"] == pytest.approx(skm.root_mean_squared_error(labels[mask], outputs[mask]))
    assert scope.metrics["r2"] == pytest.approx(skm.r2_score(labels[mask], outputs[mask]))
    assert scope.metrics["max_error"] == pytest.approx(np.max(np.abs(labels[mask] - outputs[mask])))


@pytest.mark.parametrize("padding", ["zeros", "nan"])
def test_token_figures_count_the_scored_tokens_only_and_read_their_scale_there(padding):
    """A token classifier's probabilities with its padding zeroed (times the attention mask) were read as logits:
    a second softmax flattened them, kl_mean 0.10 where it is 2.16."""
    rng = np.random.default_rng(0)
    rows, tokens, classes = 20, 6, 4
    reference = special.softmax(rng.normal(size=(rows, tokens, classes)) * 3, axis=2).astype(np.float32)
    outputs = special.softmax(rng.normal(size=(rows, tokens, classes)) * 3, axis=2).astype(np.float32)
    labels = rng.integers(0, classes, (rows, tokens))
    labels[:, 4:] = -100
    reference[:, 4:] = outputs[:, 4:] = 0.0 if padding == "zeros" else np.nan
    mask = rng.random(rows) < 0.6
    scope = Classification().rows(outputs, reference, labels).summarise("s", mask)
    scored = (labels != -100) & mask[:, None]
    assert scope.denominators["accuracy"] == np.count_nonzero(scored)
    assert scope.metrics["accuracy"] == pytest.approx(skm.accuracy_score(labels[scored],
                                                                         np.argmax(outputs[scored], axis=1)))
    assert scope.metrics["kl_mean"] == pytest.approx(np.mean(_kl_of_probabilities(reference[scored], outputs[scored])))
