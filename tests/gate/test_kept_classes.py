"""The gate's decisions_kept on a model with a thousand classes of 5 to 15 rows each (an ImageNet-style evaluation
set): an honest variant changing 6 % of its answers loses 3 of some class's 5 rows by chance alone, which breached
(exit 1); a class is now lost only where losing as many is unlikely at the variant's change rate on the classes it
keeps, corrected for the thousand classes judged (qbench.validate.kept.lost). A collapsed class still breaches."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, evaluate_gate
from qbench.gate.report import check_line
from qbench.recipe.spec import GateSpec
from qbench.results.schema import SweepResults, VariantResult, from_dict, to_json
from qbench.validate.accuracy import evaluate_accuracy, with_drops
from qbench.validate.kept import CHANCE, KEPT

BACKEND = "onnxruntime-cpu"
CLASSES = 1000
SPEC = GateSpec(metric="accuracy", max_drop=0.01, unresolved="note")


def _classifier() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(FP32's logits, labels, an honest variant's logits): 5 to 15 rows of each of 1000 classes (10,153 rows),
    FP32 right on 77 % of them; the variant adds rounding noise (sd 0.1 on logits of sd 1) that changes 6 % of its
    decisions, as INT8 does on a large classifier."""
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(CLASSES), rng.integers(5, 16, CLASSES))
    logits = rng.normal(size=(labels.size, CLASSES)).astype(np.float32)
    logits[np.arange(labels.size), labels] += 4.0
    return logits, labels, logits + rng.normal(scale=0.1, size=logits.shape).astype(np.float32)


def _verdict(reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray):
    fp32 = evaluate_accuracy("classification", reference, reference, labels, {})
    own = with_drops(evaluate_accuracy("classification", outputs, reference, labels, {}), fp32)
    variants = tuple(VariantResult(variant=name, backend=BACKEND, precision=name[:4], status="ok", accuracy=accuracy)
                     for name, accuracy in (("fp32", fp32), ("int8-a", own)))  # fmt: skip
    results = SweepResults(qbench_version="0", created_at="", recipe={"name": "toy"}, environment={}, calibration=None,
                           evaluation_rows=labels.size, gate_metric=SPEC.metric, reference="fp32",
                           variants=variants)  # fmt: skip
    read = from_dict(json.loads(to_json(results)))
    return evaluate_gate(read, SPEC), read.find("int8-a", BACKEND).accuracy.overall


def test_an_honest_variant_of_a_thousand_class_model_passes_though_a_class_kept_under_half_its_rows():
    logits, labels, honest = _classifier()
    report, overall = _verdict(logits, honest, labels)
    kept = overall.kept[""]
    # 2 of class 183's 5 rows kept: a breach before. At the variant's 5.95 % change rate on the classes it keeps,
    # losing 3 of 5 has probability 10 p^3 (1 - p)^2 + ... = 0.0019 per class, over 1000 classes judged: 1
    assert (kept.component, kept.reference, kept.own) == ("class 183", 5.0, 2.0) and kept.share < KEPT
    assert kept.elsewhere == pytest.approx(0.0595, abs=5e-4) and kept.chance == 1.0
    assert [c.status for c in report.checks if c.metric == "accuracy"] == ["pass"]
    assert report.exit_code == EXIT_PASS, [check_line(c) for c in report.breaches]


def test_a_class_collapsed_among_a_thousand_still_breaches():
    logits, labels, honest = _classifier()
    collapsed = honest.copy()
    collapsed[:, 50] -= 10.0  # class 50's logit collapsed: the 5 rows FP32 decides it on go to other classes
    report, _ = _verdict(logits, collapsed, labels)
    assert [c.status for c in report.checks if c.metric == "accuracy"] == ["pass"]
    assert report.exit_code == EXIT_BREACH
    [breach] = report.breaches
    assert check_line(breach).startswith(
        f"BREACH int8-a@{BACKEND} overall decisions_kept: class 50: FP32 decides it on 5 rows, the variant on 0 of "
        "them: 0.0% kept, under 50%; by chance at its change rate on the classes it keeps (5.9")
    # losing all 5 at 5.9 %: p^5 = 7.3e-7 per class, over 1000 classes judged 7.3e-4
    chance = float(check_line(breach).rpartition("probability ")[2])
    assert chance == pytest.approx(7.3e-4, rel=0.05) and chance < CHANCE


def test_a_class_lost_by_chance_on_one_of_many_slices_is_corrected_for_the_slices_judged():
    """100 classes of 50 labelled rows in 10 slices (5 of each class a slice); a variant whose rounding noise changes
    8 % of its answers lost 4 of the 5 rows FP32 decides class 10 on in slice part=9 (chance 0.014 over that slice's
    classes) and breached (exit 1), though each scope is as likely to show such a loss by chance: the gate judges 11
    scopes, and one class lost by chance on any of them breached. Corrected over them (0.014 x 11 = 0.15), it passes;
    a class collapsed on every row still breaches overall and on each slice FP32 decides it on 5 rows at least
    (all lost: 0.0065 at most, on 5 rows at a change rate of 9.9 %)."""
    rng = np.random.default_rng(9)
    labels = np.repeat(np.arange(100), 50)
    logits = rng.normal(size=(labels.size, 100)).astype(np.float32)
    logits[np.arange(labels.size), labels] += 3.0
    honest = logits + rng.normal(scale=0.12, size=logits.shape).astype(np.float32)
    slices = {f"part={s}": np.arange(labels.size) % 10 == s for s in range(10)}
    spec = GateSpec(metric="accuracy", max_drop=0.02, max_slice_drop=0.05, unresolved="note")

    def verdict(outputs: np.ndarray):
        fp32 = evaluate_accuracy("classification", logits, logits, labels, slices)
        own = with_drops(evaluate_accuracy("classification", outputs, logits, labels, slices), fp32)
        variants = tuple(VariantResult(variant=name, backend=BACKEND, precision=name[:4], status="ok", accuracy=acc)
                         for name, acc in (("fp32", fp32), ("int8-a", own)))  # fmt: skip
        results = SweepResults(qbench_version="0", created_at="", recipe={"name": "toy"}, environment={},
                               calibration=None, evaluation_rows=labels.size, gate_metric=spec.metric,
                               reference="fp32", variants=variants)  # fmt: skip
        return evaluate_gate(from_dict(json.loads(to_json(results))), spec), own

    report, own = verdict(honest)
    kept = own.slice("part=9").kept[""]
    assert (kept.component, kept.reference, kept.own) == ("class 10", 5.0, 1.0)
    assert kept.chance == pytest.approx(0.014, abs=5e-4) and kept.chance < CHANCE  # a breach on that scope alone
    assert report.exit_code == EXIT_PASS, [check_line(c) for c in report.breaches]
    collapsed = honest.copy()
    collapsed[:, 10] -= 10.0
    report, _ = verdict(collapsed)
    lost = [c for c in report.breaches if c.metric == "decisions_kept"]
    judged = {name for name, rows in slices.items() if np.count_nonzero(logits[rows].argmax(axis=1) == 10) >= 5}
    assert report.exit_code == EXIT_BREACH and {c.scope for c in lost} == {"overall", *judged} and len(judged) == 5
    assert max(float(check_line(c).rpartition("probability ")[2]) for c in lost) == pytest.approx(0.0065, abs=5e-5)
