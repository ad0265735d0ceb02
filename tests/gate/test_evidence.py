"""Results written before qbench recorded a kind of evidence (qbench.results.evidence): the gate cannot apply the
checks resting on it, and says so (exit 2), where it once passed them unjudged. Results of the current sweep record
every kind and are judged as before; a kind recorded with nothing in it (FP32 decides no class on 5 rows) is no
missing evidence."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_gate_kept import BACKEND, HALVES, _rare_class
from test_resolution import TOKEN_SPEC, token_rewrites, token_sweep

from qbench.errors import QbenchError
from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, EXIT_UNUSABLE, evaluate_gate
from qbench.recipe.slo import SloSpec
from qbench.recipe.spec import GateSpec
from qbench.results.evidence import EVIDENCE
from qbench.results.schema import AccuracyResult, SweepResults, VariantResult, from_dict, to_json
from qbench.validate.accuracy import evaluate_accuracy, with_drops

SPEC = GateSpec(metric="accuracy", max_drop=0.03, unresolved="note")
OLD_LINE = (
    "results written by qbench '0.1.0' record no output_spread, spread_of_values_read, kept, changed_together, "
    "stored_weights, random_ops, model_sha256, project_modules, factory_files (this qbench's sweep records them), so "
    "these checks cannot be applied: output_spread (collapsed outputs); output_spread of per-token scores and answer "
    "spans; decisions_kept, tail_kept, spread_kept (lost classes, tails, dimensions); the resolution of a pass on "
    "token accuracy (a row's tokens change together); the note on a reference stored rounded; "
    "results of a deterministic reference; the measured model file is the one measured; staleness of the code the "
    "PyTorch factory or a custom metric imports (a model class in another file); staleness of a checkpoint or config "
    "the factory loads itself (not through model.weights); re-run `qbench sweep`"
)


def _raw(reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray, halves=HALVES) -> dict:
    """results.json (parsed) of FP32 and 'int8-a' on the same rows, as the current sweep writes it."""
    fp32 = evaluate_accuracy("classification", reference, reference, labels, halves)
    own = with_drops(evaluate_accuracy("classification", outputs, reference, labels, halves), fp32)
    variants = tuple(VariantResult(variant=name, backend=BACKEND, precision=name[:4], status="ok", accuracy=accuracy)
                     for name, accuracy in (("fp32", fp32), ("int8-a", own)))  # fmt: skip
    results = SweepResults(qbench_version="0.1.0", created_at="", recipe={"name": "toy", "task": "classification"},
                           environment={}, calibration=None, evaluation_rows=len(labels), gate_metric=SPEC.metric,
                           reference="fp32", variants=variants)  # fmt: skip
    return json.loads(to_json(results))


def _as_written_before_evidence(raw: dict) -> dict:
    """The same results as a qbench from before spreads, kept records and `evidence` wrote them."""
    raw = {k: v for k, v in raw.items() if k != "evidence"}
    for variant in raw["variants"]:
        for scope in (variant["accuracy"]["overall"], *variant["accuracy"]["slices"]):
            del scope["spread"], scope["kept"]
    return raw


def test_an_old_results_file_of_a_variant_that_lost_a_class_is_unusable_not_a_pass():
    """Class 2's logit collapsed: decisions_kept breaches on fresh results (exit 1). The same figures without the
    kept records passed (exit 0: nothing to judge looked like nothing recorded); now one line says which checks
    cannot be applied, which qbench wrote the file and to re-run the sweep, and no check or note is shown."""
    logits, labels = _rare_class()
    raw = _raw(logits, logits - np.float32([0, 0, 10]), labels)
    assert evaluate_gate(from_dict(raw), SPEC).exit_code == EXIT_BREACH
    report = evaluate_gate(from_dict(_as_written_before_evidence(raw)), SPEC)
    assert report.exit_code == EXIT_UNUSABLE
    assert report.problems == (OLD_LINE,)
    assert (report.checks, report.notes) == ((), ())


def test_fresh_results_record_every_kind_and_are_judged_as_before():
    """An honest variant (noise of 0.01 on the logits) on fresh results: every kind recorded, a pass, no problem and
    no note about evidence."""
    logits, labels = _rare_class()
    noisy = logits + np.random.default_rng(1).normal(scale=0.01, size=logits.shape).astype(np.float32)
    raw = _raw(logits, noisy, labels)
    assert raw["evidence"] == list(EVIDENCE)
    report = evaluate_gate(from_dict(raw), SPEC)
    assert (report.exit_code, report.problems, report.notes) == (EXIT_PASS, (), ())


def test_a_kind_recorded_with_nothing_to_judge_is_no_missing_evidence():
    """8 rows, no class FP32 decides on 5 of them: no kept record, yet `evidence` says kept was recorded, so the
    gate judges the rest (a pass) rather than refusing the results."""
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 2])
    logits = np.full((8, 3), -1.0, dtype=np.float32)
    logits[np.arange(8), labels] = 1.0
    raw = _raw(logits, logits.copy(), labels, halves={})
    assert raw["variants"][0]["accuracy"]["overall"]["kept"] == {}
    report = evaluate_gate(from_dict(raw), SPEC)
    assert (report.exit_code, report.problems) == (EXIT_PASS, ())


def test_the_slo_s_evidence_is_needed_only_where_an_slo_is_judged():
    logits, labels = _rare_class()
    raw = _raw(logits, logits.copy(), labels)
    raw["evidence"] = [name for name in raw["evidence"] if name not in ("others_cpus", "usable_cpus")]
    results = from_dict(raw)
    assert evaluate_gate(results, SPEC).problems == ()
    problems = evaluate_gate(results, SPEC, slo=SloSpec(p99_ms=100.0, batch_size=1)).problems
    assert problems[0].startswith("results written by qbench '0.1.0' record no others_cpus, usable_cpus (this ")
    assert problems[0].endswith("so these checks cannot be applied: the SLO's contended timings; the SLO's timings "
                                "with more threads than CPUs; re-run `qbench sweep`")  # fmt: skip


def test_results_whose_real_runs_kept_up_by_the_old_rule_cannot_be_judged_on_an_slo():
    """Results written before a real run's keeping up was bounded by its batches' capacity record served runs that
    passed on completions within 5 % of the arrivals' span (runs 1-3 % short of the rate among them), and no
    keep_up_undecided: read today, every such run looks decided, so an SLO judged on them is refused (exit 2)."""
    logits, labels = _rare_class()
    raw = _raw(logits, logits.copy(), labels)
    raw["evidence"] = [name for name in raw["evidence"] if name != "keep_up_bound"]
    results = from_dict(raw)
    assert evaluate_gate(results, SPEC).exit_code == EXIT_PASS  # no SLO judged: nothing rests on it
    report = evaluate_gate(results, SPEC, slo=SloSpec(p99_ms=100.0, rate_rps=10.0))
    assert report.exit_code == EXIT_UNUSABLE
    assert report.problems[0].startswith("results written by qbench '0.1.0' record no keep_up_bound (this ")


@pytest.mark.parametrize(("evidence", "message"), [
    (["kept", "new_kind"], "evidence: unknown 'new_kind': this qbench does not know it, and judges no results it "
                           "would read without it"),
    ("kept", "evidence: got 'kept', expected a list of names"),
])  # fmt: skip
def test_evidence_this_qbench_does_not_know_is_refused(evidence, message):
    logits, labels = _rare_class()
    raw = _raw(logits, logits.copy(), labels)
    raw["evidence"] = evidence
    with pytest.raises(QbenchError) as caught:
        from_dict(raw)
    assert str(caught.value) == message


def _embedding_raw() -> dict:
    """results.json (parsed) of an embedding's FP32 and an 'int8-a' that flipped 3 of 1000 rows: rows_kept breaches."""
    rng = np.random.default_rng(0)
    reference = (rng.normal(size=(1000, 16)) + 3.0).astype(np.float32)
    outputs = reference.copy()
    outputs[:3] *= -1
    fp32 = evaluate_accuracy("embedding", reference, reference, None, HALVES)
    own = with_drops(evaluate_accuracy("embedding", outputs, reference, None, HALVES), fp32)
    return _two_variants("embedding", "cosine", fp32, own, 1000)


def _two_variants(task: str, metric: str, fp32: AccuracyResult, own: AccuracyResult, rows: int) -> dict:
    """results.json (as read) of FP32 and one variant, int8-a, from qbench '0.1.0'."""
    variants = tuple(VariantResult(variant=name, backend=BACKEND, precision=name[:4], status="ok", accuracy=accuracy)
                     for name, accuracy in (("fp32", fp32), ("int8-a", own)))  # fmt: skip
    results = SweepResults(qbench_version="0.1.0", created_at="", recipe={"name": "toy", "task": task},
                           environment={}, calibration=None, evaluation_rows=rows, gate_metric=metric,
                           reference="fp32", variants=variants)  # fmt: skip
    return json.loads(to_json(results))


def _unusable_without(raw: dict, kind: str, spec: GateSpec) -> tuple[str, ...]:
    """The problems of `raw`'s results with `kind` taken off their evidence, which make them unusable (asserted)."""
    raw["evidence"] = [name for name in raw["evidence"] if name != kind]
    report = evaluate_gate(from_dict(raw), spec)
    assert report.exit_code == EXIT_UNUSABLE
    return report.problems


def _a_classifier_lacking_is_judged(kind: str) -> None:
    """A classifier's results whose evidence lacks `kind` (another task's) are judged as they were: a pass."""
    logits, labels = _rare_class()
    classifier = _raw(logits, logits.copy(), labels)
    classifier["evidence"] = [name for name in classifier["evidence"] if name != kind]
    judged = evaluate_gate(from_dict(classifier), SPEC)
    assert (judged.exit_code, judged.problems) == (EXIT_PASS, ())


def test_embedding_results_written_before_rows_kept_are_unusable_and_other_tasks_results_are_judged():
    """rows_kept is recorded in the one kept slot an embedding scope had (spread_kept's): results written before it
    hold the dimension kept least of, which cannot tell that no row was judged, so they cannot be judged (exit 2).
    The kind is the embedding's alone: a classifier's results written before it are judged as they were."""
    spec = GateSpec(metric="cosine", max_drop=0.01, unresolved="note")
    raw = _embedding_raw()
    assert evaluate_gate(from_dict(raw), spec).exit_code == EXIT_BREACH
    assert _unusable_without(raw, "rows_kept", spec) == (
        "results written by qbench '0.1.0' record no rows_kept (this qbench's sweep records them), so these checks "
        "cannot be applied: rows_kept (embedding rows moved off FP32's); re-run `qbench sweep`",
    )
    _a_classifier_lacking_is_judged("rows_kept")


def test_regression_results_written_before_drop_intervals_are_unusable_and_other_tasks_results_are_judged():
    """A regression pass rests on the paired interval of its drop (drop_intervals): without it, results from an older
    qbench read as a resolved pass on 2 rows. Regression results lacking the kind cannot be judged (exit 2); a
    classifier's, which never record it, are judged as they were."""
    rng = np.random.default_rng(0)
    labels = rng.normal(scale=5.0, size=400)
    reference = labels + rng.normal(size=400)
    fp32 = evaluate_accuracy("regression", reference, reference, labels, {})
    own = with_drops(evaluate_accuracy("regression", reference + rng.normal(scale=1e-3, size=400), reference, labels,
                                       {}), fp32)  # fmt: skip
    raw = _two_variants("regression", "mae", fp32, own, 400)
    spec = GateSpec(metric="mae")
    assert evaluate_gate(from_dict(raw), spec).exit_code == EXIT_PASS
    for variant in raw["variants"]:
        del variant["accuracy"]["overall"]["drop_intervals"]
    assert _unusable_without(raw, "drop_intervals", spec) == (
        "results written by qbench '0.1.0' record no drop_intervals (this qbench's sweep records them), so these "
        "checks cannot be applied: the resolution of a pass on mae, rmse or r2 (the paired interval of its drop); "
        "re-run `qbench sweep`",
    )
    _a_classifier_lacking_is_judged("drop_intervals")


def test_regression_results_written_before_fit_kept_are_unusable_and_other_tasks_results_are_judged():
    """fit_kept is recorded in the one kept slot a regression scope had (tail_kept's): results written before it hold
    a tail, which cannot tell that no target's fit was judged (exit 2). A classifier's results are judged as they
    were."""
    rng = np.random.default_rng(0)
    labels = rng.normal(size=(400, 2)) * [100.0, 0.01]
    reference = labels + rng.normal(size=(400, 2)) * [5.0, 0.0005]
    outputs = reference.copy()
    outputs[:, 1] = labels[:, 1].mean()  # target 1 at its mean: no skill; the pooled mae moves by 0.1 %
    fp32 = evaluate_accuracy("regression", reference, reference, labels, {})
    own = with_drops(evaluate_accuracy("regression", outputs, reference, labels, {}), fp32)
    raw = _two_variants("regression", "mae", fp32, own, 400)
    spec = GateSpec(metric="mae", unresolved="note")
    assert evaluate_gate(from_dict(raw), spec).exit_code == EXIT_BREACH
    assert _unusable_without(raw, "fit_kept", spec) == (
        "results written by qbench '0.1.0' record no fit_kept (this qbench's sweep records them), so these checks "
        "cannot be applied: fit_kept (a target predicted no better than its mean); re-run `qbench sweep`",)
    _a_classifier_lacking_is_judged("fit_kept")


def test_regression_results_written_before_r2_min_and_multi_target_rmse_had_drop_intervals_are_unusable():
    """Results that record drop_intervals of mae, rmse (one target) and r2 only, from a qbench before r2_min's and
    several targets' rmse had one, would judge a pass on those on two rows: without target_drop_intervals they cannot
    be judged (exit 2); a classifier's are judged as they were."""
    rng = np.random.default_rng(0)
    labels = rng.normal(scale=5.0, size=(400, 2))
    reference = labels + rng.normal(size=(400, 2))
    fp32 = evaluate_accuracy("regression", reference, reference, labels, {})
    own = with_drops(evaluate_accuracy("regression", reference + rng.normal(scale=1e-3, size=(400, 2)), reference,
                                       labels, {}), fp32)  # fmt: skip
    raw = _two_variants("regression", "r2_min", fp32, own, 400)
    spec = GateSpec(metric="r2_min")
    assert evaluate_gate(from_dict(raw), spec).exit_code == EXIT_PASS
    assert _unusable_without(raw, "target_drop_intervals", spec) == (
        "results written by qbench '0.1.0' record no target_drop_intervals (this qbench's sweep records them), so "
        "these checks cannot be applied: the resolution of a pass on r2_min, or on rmse over several targets (the "
        "paired interval of its drop); re-run `qbench sweep`",)  # fmt: skip
    _a_classifier_lacking_is_judged("target_drop_intervals")


def test_token_results_written_before_changed_together_are_unusable_and_other_tasks_results_are_judged():
    """A token scope's changed_together widens a pass's interval by how many changed tokens share a row. Results from
    a qbench before it lack it on FP32 and the variant alike, which read as each token a row of its own: a variant
    rewriting 4 rows of 100 tokens (400 of 1,990 tokens changed, drop 0) passed max_drop 0.05 there (exit 0) where
    its fresh results are unresolved (exit 2). Such results cannot be judged; an embedding's are judged as they
    were."""
    fp32, labels, whole_rows, _ = token_rewrites()
    fresh, own, _ = token_sweep(fp32, labels, whole_rows)
    assert own.changed_together == {"agreement": 100.0}
    assert evaluate_gate(fresh, TOKEN_SPEC).exit_code == EXIT_UNUSABLE  # unresolved: the rows tell too little
    raw = json.loads(to_json(fresh))
    for variant in raw["variants"]:
        del variant["accuracy"]["overall"]["changed_together"]
    assert _unusable_without(raw, "changed_together", TOKEN_SPEC) == (
        "results written by qbench '0' record no changed_together (this qbench's sweep records them), so these checks "
        "cannot be applied: the resolution of a pass on token accuracy (a row's tokens change together); re-run "
        "`qbench sweep`",)  # fmt: skip
    embedding = _embedding_raw()
    embedding["evidence"] = [name for name in embedding["evidence"] if name != "changed_together"]
    assert evaluate_gate(from_dict(embedding), GateSpec(metric="cosine", max_drop=0.01)).exit_code == EXIT_BREACH


@pytest.mark.parametrize(("resolved", "unusable"), [
    ({"model": {"path": "model.onnx"}}, False),
    ({"model": {"path": "model.onnx"}, "metrics": [{"name": "top2"}]}, False),
    ({"model": {"torch": "mypkg.models:make"}}, True),
    ({"model": {"path": "model.onnx"}, "metrics": [{"name": "iou", "function": "mypkg.metrics:iou"}]}, True),
    (None, True),  # no embedded recipe to read: as naming code
])  # fmt: skip
def test_results_lacking_project_modules_are_unusable_only_where_the_recipe_names_code(resolved, unusable):
    """The project modules a recipe's code imported are recorded only where it names code (a PyTorch factory, a
    metric's function): an ONNX recipe's results from before the kind are judged as they were, a torch recipe's are
    not (an edit to its model class would go unseen)."""
    logits, labels = _rare_class()
    raw = _raw(logits, logits.copy(), labels)
    raw["recipe"] = {**raw["recipe"], **({"resolved": resolved} if resolved is not None else {})}
    raw["evidence"] = [name for name in raw["evidence"] if name != "project_modules"]
    problems = evaluate_gate(from_dict(raw), SPEC).problems
    assert bool(problems) == unusable
    assert all("record no project_modules (" in problem for problem in problems)


@pytest.mark.parametrize("kind", ["at_rate_bound", "at_rate_breach_bound", "at_rate_pooled"])
def test_results_whose_simulated_p99_at_the_rate_was_one_replays_cannot_be_judged_on_an_slo(kind):
    """Results written before the simulated p99 at the budget's rate was shown within the budget by the search's bound
    hold one replay's p99 (within the budget near capacity where the truth was 25 % to 2.5x over) and no
    at_rate_undecided; those written before a breach there was shown by the lower bound on independent replays hold
    one replay's p99 over it (a rate the server meets breached on 7 of 40 seeds); those written before the verdict
    pooled its replays and asked a pool spanning many relaxation times of a pass passed a rate over its budget on 2 of
    40 seeds near capacity: an SLO judged on any of them is refused (exit 2); a gate without an SLO reads none of it."""
    logits, labels = _rare_class()
    raw = _raw(logits, logits.copy(), labels)
    raw["evidence"] = [name for name in raw["evidence"] if name != kind]
    results = from_dict(raw)
    assert evaluate_gate(results, SPEC).exit_code == EXIT_PASS
    report = evaluate_gate(results, SPEC, slo=SloSpec(p99_ms=100.0, rate_rps=10.0))
    assert report.exit_code == EXIT_UNUSABLE
    assert report.problems[0].startswith(f"results written by qbench '0.1.0' record no {kind} (this ")
