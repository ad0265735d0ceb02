"""The resolution rule: a pass counts only on a scope large enough to have shown a drop of the tolerance."""

from __future__ import annotations

import dataclasses
import json
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, EXIT_UNUSABLE, evaluate_gate, judge
from qbench.gate.junit import junit_xml
from qbench.gate.report import report_dict
from qbench.gate.resolution import CONFIDENCE, rows_to_resolve, upper_share
from qbench.recipe.spec import GateSpec
from qbench.results.schema import AccuracyResult, SliceMetrics, SweepResults, VariantResult, from_dict, to_json
from qbench.validate.accuracy import evaluate_accuracy
from qbench.validate.metrics import IGNORE_LABEL

SPEC = GateSpec(metric="accuracy", max_drop=0.01, max_slice_drop=0.02, applies_to=["int8"])


def result(name: str, overall: SliceMetrics, *slices: SliceMetrics) -> VariantResult:
    accuracy = AccuracyResult(rows=overall.size, nonfinite_outputs=0, overall=overall, slices=slices)
    return VariantResult(variant=name, backend="cpu", precision="fp32" if name == "fp32" else "int8", status="ok",
                         accuracy=accuracy)  # fmt: skip


def sweep(*variants: VariantResult) -> SweepResults:
    return SweepResults(qbench_version="0", created_at="", recipe={}, environment={}, calibration=None,
                        evaluation_rows=variants[0].accuracy.rows, gate_metric=SPEC.metric, reference="fp32",
                        variants=variants)  # fmt: skip


def scope(name: str, size: int, value: float, metric: str = "accuracy", interval=None) -> SliceMetrics:
    return SliceMetrics(name, size, {metric: value}, intervals={metric: interval} if interval else {})


@pytest.mark.parametrize("tolerance", [0.005, 0.01, 0.02, 0.05, 0.3])
def test_rows_to_resolve_is_the_fewest_rows_a_change_of_that_share_shows_on(tolerance):
    n = rows_to_resolve(tolerance)
    assert (1 - tolerance) ** n <= 1 - CONFIDENCE < (1 - tolerance) ** (n - 1)
    assert rows_to_resolve(tolerance, span=2.0) == rows_to_resolve(tolerance / 2)
    assert rows_to_resolve(0.0) == math.inf


def test_a_one_row_evaluation_cannot_pass():
    """The probe: one evaluation row, identical figures, exit 0 and no word said. Now the pass is unresolved: the
    variant cannot be judged (exit 2), and the problem names the scope, its rows and the rows needed."""
    report = evaluate_gate(sweep(result("fp32", scope("overall", 1, 1.0)), result("int8", scope("overall", 1, 1.0))),
                           SPEC)  # fmt: skip
    assert report.exit_code == EXIT_UNUSABLE
    assert report.status_of("int8", "cpu") == "fail"
    needed = rows_to_resolve(0.01)
    assert report.problems == (f"int8@cpu: too few rows to resolve the tolerance: overall accuracy on 1 rows < "
                               f"{needed} needed for a drop of 0.01 (a variant changing 0.01 of the rows leaves all 1 "
                               f"unchanged with probability 99.0% > 5%)",)  # fmt: skip


def test_slices_are_held_to_the_same_rule_and_min_slice_size_still_skips():
    enough, few = rows_to_resolve(0.01), rows_to_resolve(0.02) - 1
    fp32 = result("fp32", scope("overall", enough + few, 0.9), scope("small", few, 0.9))
    int8 = result("int8", scope("overall", enough + few, 0.9), scope("small", few, 0.9))
    report = evaluate_gate(sweep(fp32, int8), SPEC)
    assert report.exit_code == EXIT_UNUSABLE
    assert len(report.problems) == 1 and f"small accuracy on {few} rows < {few + 1} needed" in report.problems[0]
    assert "overall" not in report.problems[0]
    skipped = evaluate_gate(sweep(fp32, int8), SPEC.model_copy(update={"min_slice_size": few + 1}))
    assert skipped.exit_code == EXIT_PASS
    assert {c.scope: c.status for c in skipped.checks} == {"overall": "pass", "small": "skipped"}


def test_unresolved_note_passes_with_the_rule_in_a_note():
    few = rows_to_resolve(0.01) - 1
    results = sweep(result("fp32", scope("overall", few, 0.9)), result("int8", scope("overall", few, 0.9)))
    report = evaluate_gate(results, SPEC.model_copy(update={"unresolved": "note"}))
    assert report.exit_code == EXIT_PASS and not report.problems
    assert [n for n in report.notes if "too few rows" in n] == [
        f"int8@cpu: too few rows to resolve the tolerance: overall accuracy on {few} rows < {few + 1} needed for a "
        f"drop of 0.01 (a variant changing 0.01 of the rows leaves all {few} unchanged with probability "
        f"{0.99 ** few:.1%} > 5%)"]  # fmt: skip


def test_a_drop_past_the_tolerance_on_few_rows_is_still_a_breach():
    results = sweep(result("fp32", scope("overall", 10, 1.0)), result("int8", scope("overall", 10, 0.8)))
    report = evaluate_gate(results, SPEC)
    assert report.exit_code == EXIT_BREACH and not report.problems


def test_a_breach_on_one_scope_blocks_the_variant_whatever_its_unresolved_passes():
    """A slice past its tolerance is evidence enough: exit 1, not 'cannot judge' because another scope (here the
    overall figure on 30 rows) is too small to resolve its pass; that scope's rule is a note."""
    fp32 = result("fp32", scope("overall", 30, 1.0), scope("small", 10, 1.0))
    int8 = result("int8", scope("overall", 30, 0.9999), scope("small", 10, 0.7))
    report = evaluate_gate(sweep(fp32, int8), SPEC)
    assert report.exit_code == EXIT_BREACH and not report.problems
    assert {c.scope: c.status for c in report.checks} == {"overall": "pass", "small": "breach"}
    assert [n for n in report.notes if "too few rows" in n and "overall accuracy on 30 rows" in n]


def test_the_rule_is_in_the_json_and_junit_reports():
    report = evaluate_gate(sweep(result("fp32", scope("overall", 20, 1.0)), result("int8", scope("overall", 20, 1.0))),
                           SPEC)  # fmt: skip
    assert "overall accuracy on 20 rows < " in report_dict(report)["problems"][0]["message"]
    errors = [e.get("message") for e in ET.fromstring(junit_xml(report).encode()).iter("error")]
    assert errors == list(report.problems) and "overall accuracy on 20 rows < " in errors[0]


def test_a_search_ranks_by_drops_and_the_gate_holds_its_pick_to_the_rule():
    """The search and fallback judge candidates without the rule (a screen is a sample by design); the gate judges
    the results of the one they pick with it."""
    fp32, int8 = result("fp32", scope("overall", 20, 1.0)), result("int8", scope("overall", 20, 1.0))
    assert judge(fp32, int8, SPEC).exit_code == EXIT_PASS
    assert evaluate_gate(sweep(fp32, int8), SPEC).exit_code == EXIT_UNUSABLE


def test_a_mean_compared_with_fp32_needs_its_interval_within_the_tolerance():
    """cosine against FP32's own outputs: FP32's is 1 on every row (a point interval), so the variant's interval is
    the drop's. The same mean drop passes with a narrow spread and is unresolved with a wide one."""
    spec = GateSpec(metric="cosine", max_drop=0.01, max_slice_drop=0.02, applies_to=["int8"])
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(200, 8))
    steady = reference + 0.02 * rng.normal(size=reference.shape)
    # 4 rows of 200 at cosine 0.6 with FP32's, the rest unchanged: a mean drop of 0.008 whose interval reaches 0.0158;
    # each row keeps 0.6 of what tells it from the others (rows_kept: FP32's rows share a cosine of 0.003)
    away = rng.normal(size=(4, 8))
    along = np.sum(away * reference[:4], axis=1, keepdims=True) / np.sum(reference[:4] ** 2, axis=1, keepdims=True)
    away -= along * reference[:4]
    rare = reference.copy()
    rare[:4] = (0.6 * reference[:4] / np.linalg.norm(reference[:4], axis=1, keepdims=True)
                + 0.8 * away / np.linalg.norm(away, axis=1, keepdims=True))  # fmt: skip
    lost = reference.copy()
    lost[0] = 0.0  # one row with nothing of FP32's direction (cosine 0): a mean drop of 0.005, yet a row lost

    def judged(outputs: np.ndarray) -> tuple[int, tuple[str, ...]]:
        fp32 = evaluate_accuracy("embedding", reference, reference, None, {})
        int8 = evaluate_accuracy("embedding", outputs, reference, None, {})
        variants = [VariantResult(variant=name, backend="cpu", precision=name, status="ok", accuracy=acc)
                    for name, acc in (("fp32", fp32), ("int8", int8))]  # fmt: skip
        report = evaluate_gate(sweep(*variants), spec)
        return report.exit_code, report.problems

    assert judged(steady) == (EXIT_PASS, ())
    code, problems = judged(rare)
    assert code == EXIT_UNUSABLE and "the 95% interval of the drop reaches" in problems[0]
    assert judged(lost)[0] == EXIT_BREACH
    one = evaluate_gate(sweep(result("fp32", scope("overall", 1, 1.0, "cosine", (1.0, 1.0))),
                              result("int8", scope("overall", 1, 1.0, "cosine", (1.0, 1.0)))), spec)  # fmt: skip
    assert one.exit_code == EXIT_UNUSABLE and "a mean over 1 row has no spread" in one.problems[0]


def test_an_error_in_the_data_units_needs_two_rows():
    spec = GateSpec(metric="mae", max_drop=0.5, max_slice_drop=0.5, applies_to=["int8"])
    for rows, code in ((1, EXIT_UNUSABLE), (2, EXIT_PASS)):
        results = sweep(result("fp32", scope("overall", rows, 3.0, "mae")),
                        result("int8", scope("overall", rows, 3.1, "mae")))  # fmt: skip
        assert evaluate_gate(results, spec).exit_code == code


def test_a_variant_that_is_fp32s_own_graph_needs_no_rows():
    """Its outputs are FP32's on every input, so its pass rests on no sample (the gate notes it says nothing about
    its precision)."""
    fp32 = result("fp32", scope("overall", 3, 1.0))
    twin = dataclasses.replace(result("int8", scope("overall", 3, 1.0)), params={"identical_to": "fp32"})
    report = evaluate_gate(sweep(fp32, twin), SPEC)
    assert report.exit_code == EXIT_PASS and not [n for n in report.notes if "too few rows" in n]
    other = dataclasses.replace(twin, params={"identical_to": "int8-other"})
    assert evaluate_gate(sweep(fp32, other), SPEC).exit_code == EXIT_UNUSABLE


def _binary_scores(decisions: np.ndarray) -> np.ndarray:
    """Two-column logits deciding each row's class as `decisions` says."""
    return np.stack([1.0 - decisions, decisions.astype(float)], axis=1).astype(np.float32)


def _judged_decisions(fp32: np.ndarray, variant: np.ndarray, labels: np.ndarray, spec: GateSpec = SPEC):
    reference = _binary_scores(fp32)
    results = [evaluate_accuracy("classification", _binary_scores(d), reference, labels, {}) for d in (fp32, variant)]
    variants = [VariantResult(variant=name, backend="cpu", precision=name, status="ok", accuracy=acc)
                for name, acc in zip(("fp32", "int8"), results, strict=True)]  # fmt: skip
    return evaluate_gate(sweep(*variants), spec)


def test_compensating_changes_need_the_drops_paired_interval_within_the_tolerance():
    """The probe: a variant changing 224 of 1,000 rows' answers, 112 right -> wrong and 112 wrong -> right, has
    FP32's accuracy (a drop of 0) and passed a max_drop of 0.01 (exit 0). Each row's drop is -1, 0 or 1, so the
    drop's 95 % interval reaches 1.96 * sqrt(0.224 * 1000 / 999 / 1000) = 0.02935: the pass resolves nothing (exit
    2). Changes that all lose a right answer are judged by the rows rule as before, and a few compensating changes
    within the tolerance still pass."""
    rows = 1000
    fp32 = np.zeros(rows, dtype=np.int64)
    fp32[::2] = 1
    labels = fp32.copy()
    labels[:112] = 1 - labels[:112]  # FP32 wrong on 112 rows...
    variant = fp32.copy()
    variant[:224] = 1 - variant[:224]  # ...which the variant gets right, and wrong on the next 112
    report = _judged_decisions(fp32, variant, labels)
    assert report.exit_code == EXIT_UNUSABLE
    bound = 1.959964 * math.sqrt(0.224 * 1000 / 999 / 1000)
    assert report.problems == (
        f"int8@cpu: too few rows to resolve the tolerance: overall accuracy on 1000 rows: its decisions changed on "
        f"224 of them, more than its drop counts (changes right -> wrong offset by changes wrong -> right), and the "
        f"95% interval of the drop reaches {bound:.4g} > tolerance 0.01; about {math.ceil(1000 * (bound / 0.01) ** 2)} "
        f"rows would resolve it at this spread",)
    noted = _judged_decisions(fp32, variant, labels, SPEC.model_copy(update={"unresolved": "note"}))
    assert noted.exit_code == EXIT_PASS and noted.checks[0].drop == 0.0

    losing = fp32.copy()
    losing[:6:2] = 0  # 3 rows of class 1 moved to class 0
    losing_labels = fp32.copy()  # FP32 right everywhere: each change loses a right answer, none compensates
    assert _judged_decisions(fp32, losing, losing_labels).exit_code == EXIT_PASS  # its drop's bound 0.0078

    few = fp32.copy()
    few[:4] = 1 - few[:4]  # 2 changes each way on rows FP32 got wrong on 2 of: drop 0, interval reaches 0.0039
    few_labels = fp32.copy()
    few_labels[:2] = 1 - few_labels[:2]
    few_report = _judged_decisions(fp32, few, few_labels)
    assert few_report.checks[0].drop == 0.0 and few_report.exit_code == EXIT_PASS


def test_a_variant_whose_results_lack_the_count_of_its_changed_decisions_is_no_pass():
    """The probe's variant (224 of 1,000 answers changed, as many each way: a drop of 0) with `agreement` taken out of
    its results (FP32's keep it), or counted over other units, passed a max_drop of 0.01 (exit 0): the compensation
    rule had nothing to count changes with and fell back to the rows rule. qbench records agreement beside accuracy on
    the same units, so results without it are another qbench's or edited: the pass resolves nothing (exit 2)."""
    fp32 = np.zeros(1000, dtype=np.int64)
    fp32[::2] = 1
    labels, variant = fp32.copy(), fp32.copy()
    labels[:112] = 1 - labels[:112]
    variant[:224] = 1 - variant[:224]
    reference = _binary_scores(fp32)
    fp32_accuracy, own = (evaluate_accuracy("classification", _binary_scores(d), reference, labels, {})
                          for d in (fp32, variant))  # fmt: skip

    def judged(overall: SliceMetrics):
        variants = [VariantResult(variant=name, backend="cpu", precision=name, status="ok", accuracy=accuracy)
                    for name, accuracy in (("fp32", fp32_accuracy), ("int8", AccuracyResult(1000, 0, overall)))]
        return evaluate_gate(sweep(*variants), SPEC)

    without = {k: v for k, v in own.overall.metrics.items() if k != "agreement"}
    report = judged(dataclasses.replace(own.overall, metrics=without))
    assert report.exit_code == EXIT_UNUSABLE
    assert report.problems == ("int8@cpu: too few rows to resolve the tolerance: overall accuracy on 1000 rows: no "
                               "agreement recorded, so how many of its decisions changed (changes right -> wrong its "
                               "drop may offset by changes wrong -> right) is unknown: results written by another "
                               "qbench, or edited",)  # fmt: skip
    elsewhere = judged(dataclasses.replace(own.overall, denominators={"agreement": 500}))
    assert elsewhere.exit_code == EXIT_UNUSABLE
    assert "its agreement is counted over 500 units, its accuracy over 1000" in elsewhere.problems[0]
    whole = judged(own.overall)
    assert whole.exit_code == EXIT_UNUSABLE and "changed on 224 of them" in whole.problems[0]


TOKEN_SPEC = GateSpec(metric="accuracy", max_drop=0.05, max_slice_drop=0.05, applies_to=["int8"])


def token_rewrites() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(FP32's token classes, labels, a variant changing whole rows, one changing as many tokens one to a row) over
    1,990 scored tokens: rows 0-9 hold 100 each, rows 10-999 one each. `whole_rows` rewrites rows 0-1 (200 tokens
    right -> wrong) and rows 2-3 (200 tokens FP32 got wrong -> right); `scattered` changes 400 one-token rows alike."""
    rows, tokens = 1000, 100
    fp32 = np.arange(rows * tokens).reshape(rows, tokens) % 3
    scored = np.zeros((rows, tokens), dtype=bool)
    scored[:10], scored[10:, 0] = True, True
    labels = fp32.copy()
    labels[2:4] = (fp32[2:4] + 1) % 3  # FP32 wrong on every token of rows 2 and 3
    whole_rows = fp32.copy()
    whole_rows[:2] = (fp32[:2] + 1) % 3
    whole_rows[2:4] = labels[2:4]
    scattered = fp32.copy()
    labels[210:410, 0] = (fp32[210:410, 0] + 1) % 3  # ...and on 200 one-token rows, which `scattered` gets right
    scattered[210:410, 0] = labels[210:410, 0]
    scattered[10:210, 0] = (fp32[10:210, 0] + 1) % 3  # while it gets 200 other one-token rows wrong
    labels[~scored] = IGNORE_LABEL
    whole_rows[2:4] = np.where(scored[2:4], labels[2:4], whole_rows[2:4])
    return fp32, labels, whole_rows, scattered


def token_sweep(fp32: np.ndarray, labels: np.ndarray, variant: np.ndarray,
                edit=lambda scope: scope) -> tuple[SweepResults, SliceMetrics, SliceMetrics]:  # fmt: skip
    """The results of FP32 and 'int8' giving `variant`'s token classes (its overall scope through `edit`), read back
    from their JSON; the variant's overall scope and FP32's."""
    one_hot = np.eye(3, dtype=np.float32)
    fp32_accuracy, own = (evaluate_accuracy("classification", one_hot[d], one_hot[fp32], labels, {})
                          for d in (fp32, variant))  # fmt: skip
    variants = result("fp32", fp32_accuracy.overall), result("int8", edit(own.overall))
    return from_dict(json.loads(to_json(sweep(*variants)))), own.overall, fp32_accuracy.overall


def test_token_changes_of_one_row_widen_the_drops_interval_as_the_rows_they_move_in():
    """Token accuracy over 1,990 scored tokens (token_rewrites). A variant rewriting rows 0-1 (200 tokens right ->
    wrong) and rows 2-3 (200 tokens FP32 got wrong -> right) has FP32's accuracy, a drop of 0, and passed a max_drop
    of 0.05 (exit 0): the compensation rule took the token shares over the scope's 1,000 rows as if each changed
    independently, an interval reaching 0.0278. A row's tokens flip together: the drop is
    four rows' worth of +-100 tokens, its 95 % interval (over rows: sqrt(1000 / 999 * 4 * 100^2) / 1990 = 0.1006)
    reaching 0.197 (exit 2). The same 400 changes one to a row of their own stay a pass (0.0197)."""
    fp32, labels, whole_rows, scattered = token_rewrites()

    def judged(variant: np.ndarray, edit=lambda scope: scope):
        results, own, reference = token_sweep(fp32, labels, variant, edit)
        return evaluate_gate(results, TOKEN_SPEC), own, reference

    report, overall, reference = judged(whole_rows)
    assert (overall.denominators["accuracy"], overall.metrics["agreement"]) == (1990, pytest.approx(1 - 400 / 1990))
    assert overall.changed_together == {"agreement": 100.0}
    assert overall.metrics["accuracy"] == reference.metrics["accuracy"] == 1590 / 1990
    bound = 1.959964 * math.sqrt(1000 / 999 * 4 * 100**2) / 1990
    assert report.exit_code == EXIT_UNUSABLE
    assert ("overall accuracy on 1000 rows: its decisions changed on 400 of its 1990 scored units (100 changed "
            "together a row, weighted by changes), more than its drop counts") in report.problems[0]
    assert f"the 95% interval of the drop reaches {bound:.4g} > tolerance 0.05" in report.problems[0]
    report, overall, _ = judged(scattered)
    assert overall.changed_together == {"agreement": 1.0}
    assert overall.metrics["agreement"] == pytest.approx(1 - 400 / 1990)
    assert (report.checks[0].drop, report.exit_code) == (0.0, EXIT_PASS)
    edited, _, _ = judged(scattered, lambda scope: dataclasses.replace(scope, changed_together={}))  # FP32's has it
    assert edited.exit_code == EXIT_UNUSABLE
    assert "how many changes of its agreement share a row is nan" in edited.problems[0]


def test_changes_within_the_tolerance_are_never_judged_more_harshly_than_losses_alone():
    """Changes within a tolerance's worth (10 on 1,000 rows at 0.01) are held to the bound of their net drop alone:
    4 losses (a drop of 0.004, bound 0.0091) pass, and so do 5 losses and 1 gain (the same drop), which the
    compensation rule would leave unresolved. Only changes beyond the tolerance's worth rest on gains offsetting
    losses."""
    rows = 1000
    fp32 = np.zeros(rows, dtype=np.int64)
    fp32[::2] = 1
    labels = fp32.copy()
    labels[10:11] = 1 - labels[10:11]  # FP32 wrong on 1 row, which the mixed variant gets right
    losses = fp32.copy()
    losses[:4] = 1 - losses[:4]
    mixed = fp32.copy()
    mixed[:5] = 1 - mixed[:5]
    mixed[10:11] = 1 - mixed[10:11]
    one_way = _judged_decisions(fp32, losses, fp32.copy())
    offset = _judged_decisions(fp32, mixed, labels)
    assert (one_way.checks[0].drop, one_way.exit_code) == (pytest.approx(0.004), EXIT_PASS)
    assert (offset.checks[0].drop, offset.exit_code) == (pytest.approx(0.004), EXIT_PASS)
    labels[10:12] = 1 - fp32[10:12]  # FP32 wrong on 2 rows, which the variant gets right...
    beyond = 1 - fp32
    beyond[14:] = fp32[14:]  # ...and wrong on 12 FP32 got right: 14 changes > 10, 12 losses and 2 gains
    beyond = _judged_decisions(fp32, beyond, labels)
    assert beyond.exit_code == EXIT_UNUSABLE and "its decisions changed on 14 of them" in beyond.problems[0]


def test_copies_of_an_input_count_once():
    """600 rows of 200 inputs fed 3 times each: a variant breaking 1 % of the inputs leaves all 600 rows unchanged with
    probability 0.99^200 = 13.4 %, not 0.99^600 = 0.24 %. Counted as 600 rows (>= 299), the pass resolved max_drop
    0.01 (exit 0); the results' distinct_inputs make it unresolved (exit 2), and a slice whose rows repeat none is
    judged on its rows as before."""
    ref = result("fp32", scope("overall", 600, 0.95), scope("a", 300, 0.95))
    own = result("int8", scope("overall", 600, 0.95), scope("a", 300, 0.95))
    assert evaluate_gate(sweep(ref, own), SPEC).exit_code == EXIT_PASS
    repeated = dataclasses.replace(sweep(ref, own), distinct_inputs={"overall": 200})
    report = evaluate_gate(repeated, SPEC)
    assert report.exit_code == EXIT_UNUSABLE
    assert report.problems == ("int8@cpu: too few rows to resolve the tolerance: overall accuracy on 600 rows (200 "
                               "distinct inputs: the others repeat them) < 299 needed for a drop of 0.01 (a variant "
                               "changing 0.01 of the inputs leaves all 200 unchanged with probability 13.4% > 5%)",)
    assert round(0.99**200, 3) == 0.134
    # 299 distinct inputs resolve it, however many copies
    assert evaluate_gate(dataclasses.replace(repeated, distinct_inputs={"overall": 299}), SPEC).exit_code == EXIT_PASS
    # and the count survives results.json
    assert from_dict(json.loads(to_json(repeated))).distinct_inputs == {"overall": 200}


def test_copies_of_an_input_widen_the_drops_interval():
    """The interval rules read intervals computed as if every row were a sample of its own: 600 rows of 200 inputs fed
    3 times each give a kl_mean interval sqrt(599 / 199) = 1.73 times too narrow (its half-width over the rows 0.003,
    over the inputs 0.0052: checked with mean_interval on repeated draws), so a drop of 0.006 whose interval reached
    0.009 < max_drop 0.01 resolved (exit 0) on 2 distinct inputs as on 600. Widened it reaches 0.0112 > 0.01; the
    same for the paired interval of an accuracy whose decisions changed both ways (1,000 rows of 500 inputs: 0.0232
    over the rows, 0.0328 over the inputs, against 0.03)."""
    kl = GateSpec(metric="kl_mean", max_drop=0.01, max_slice_drop=0.02, applies_to=["int8"])
    ref = result("fp32", scope("overall", 600, 0.0, "kl_mean", (0.0, 0.0)))
    own = result("int8", scope("overall", 600, 0.006, "kl_mean", (0.003, 0.009)))
    assert evaluate_gate(sweep(ref, own), kl).exit_code == EXIT_PASS  # 600 distinct rows: resolved
    report = evaluate_gate(dataclasses.replace(sweep(ref, own), distinct_inputs={"overall": 200}), kl)
    assert report.exit_code == EXIT_UNUSABLE
    assert report.problems == ("int8@cpu: too few rows to resolve the tolerance: overall kl_mean on 600 rows (200 "
                               "distinct inputs: the others repeat them): the 95% interval of the drop reaches "
                               "0.0112 > tolerance 0.01; about 1016 rows would resolve it at this spread",)  # fmt: skip
    assert 0.006 + 0.003 * math.sqrt(599 / 199) == pytest.approx(0.0112, abs=5e-5)

    accuracy = GateSpec(metric="accuracy", max_drop=0.03, max_slice_drop=0.05, applies_to=["int8"])
    ref = result("fp32", SliceMetrics("overall", 1000, {"accuracy": 0.9, "agreement": 1.0}))
    own = result("int8", SliceMetrics("overall", 1000, {"accuracy": 0.9, "agreement": 0.86}))  # 140 rows changed
    assert evaluate_gate(sweep(ref, own), accuracy).exit_code == EXIT_PASS  # 1.96 * sqrt(0.14 / 999) = 0.0232
    report = evaluate_gate(dataclasses.replace(sweep(ref, own), distinct_inputs={"overall": 500}), accuracy)
    assert report.exit_code == EXIT_UNUSABLE
    assert "its decisions changed on 140 of them" in report.problems[0]
    assert "the 95% interval of the drop reaches 0.03283 > tolerance 0.03" in report.problems[0]
    assert 1.959964 * math.sqrt(0.14 / 999) * math.sqrt(999 / 499) == pytest.approx(0.03283, abs=5e-6)


@pytest.mark.parametrize(("interval", "problem"), [
    (None, "overall: only FP32's results record an interval of 'kl_mean'"),
    ((math.nan, math.nan), "overall: the variant's kl_mean 0.00992057 lies outside its interval [nan, nan]"),
    ((0.0, 0.0), "overall: the variant's kl_mean 0.00992057 lies outside its interval [0, 0]"),
], ids=["removed", "nan", "a-point-at-0"])  # fmt: skip
def test_an_interval_the_sweep_cannot_have_written_is_unusable(interval, problem):
    """kl_mean on 200 rows, one row's scores reversed: a mean of 0.0099 within max_drop 0.01 whose interval reaches
    0.0294, unresolved (exit 2). With the variant's interval removed, made NaN or a point at 0 the paired rule had no
    interval to read and the pass resolved (exit 0); such an interval is now unusable results (exit 2)."""
    spec = GateSpec(metric="kl_mean", max_drop=0.01, max_slice_drop=0.02, applies_to=["int8"])
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 200)
    logits = (rng.normal(size=(200, 3)) * 0.5).astype(np.float32)
    logits[np.arange(200), labels] += 3.0
    reversed_row = logits.copy()
    reversed_row[0] = logits[0][::-1] * 0.5
    fp32 = evaluate_accuracy("classification", logits, logits, labels, {})
    int8 = evaluate_accuracy("classification", reversed_row, logits, labels, {})
    variants = [VariantResult(variant=name, backend="cpu", precision=name, status="ok", accuracy=acc)
                for name, acc in (("fp32", fp32), ("int8", int8))]  # fmt: skip
    measured = evaluate_gate(sweep(*variants), spec)
    assert measured.exit_code == EXIT_UNUSABLE and "interval of the drop reaches 0.02936" in measured.problems[0]
    overall = int8.overall
    intervals = {k: v for k, v in overall.intervals.items() if k != "kl_mean"}
    if interval is not None:
        intervals["kl_mean"] = interval
    edited = dataclasses.replace(overall, intervals=intervals)
    variants[1] = dataclasses.replace(variants[1], accuracy=dataclasses.replace(int8, overall=edited))
    report = evaluate_gate(sweep(*variants), spec)
    assert report.exit_code == EXIT_UNUSABLE
    assert report.problems == (f"int8@cpu: {problem}: written by another qbench, or edited",)


def _alternating(rows: int) -> np.ndarray:
    """FP32's binary answers, 1 on every other row (the labels too: FP32 right on every row)."""
    fp32 = np.zeros(rows, dtype=np.int64)
    fp32[::2] = 1
    return fp32


def _with_first_lost(rows: int, lost: int):
    """The gate's report on a variant that flips FP32's answer, right on every row, on the first `lost` rows."""
    fp32 = _alternating(rows)
    variant = fp32.copy()
    variant[:lost] = 1 - variant[:lost]
    return _judged_decisions(fp32, variant, fp32.copy())


def test_a_drop_within_the_tolerance_needs_its_upper_bound_within_it_too():
    """The probe (bench/gate_calibration.py): a variant losing 1.5 % of the population's right answers, 1.5 x a
    max_drop of 0.01, shows a drop of at most 0.01 on 300 rows with probability P(X <= 3 | 300, 0.015) = 34 %, and
    every such pass counted (300 >= 299 rows; the rows rule asks only whether a change could show at all). Now a drop
    of k lost rows of n resolves only where the 95 % upper bound of the share lost (Clopper-Pearson) is within the
    tolerance: 0 lost is the rows rule as before, 2 of 300 reaches 0.0208."""
    rows = 300
    fp32 = _alternating(rows)
    assert _with_first_lost(rows, 0).exit_code == EXIT_PASS
    report = _with_first_lost(rows, 2)
    assert report.exit_code == EXIT_UNUSABLE
    assert report.problems == (
        "int8@cpu: too few rows to resolve the tolerance: overall accuracy on 300 rows: its drop of 2 of the 300 rows "
        "(0.006667) is within the tolerance, but a variant losing 0.01 of them shows as small a drop with probability "
        "over 5%: the 95% upper bound of the drop reaches 0.02084 > 0.01; about 2432 rows would resolve it at this "
        "drop",)
    assert upper_share(2, 300) == pytest.approx(0.020836, abs=1e-6)  # scipy.stats.beta.ppf(0.95, 3, 298)
    assert upper_share(0, 299) == pytest.approx(1 - 0.05 ** (1 / 299)) and rows_to_resolve(0.01) == 299

    rng = np.random.default_rng(0)  # the rate over seeds: 71 of 200 passed before (35.5 %)
    passes = 0
    for _ in range(200):
        variant = fp32.copy()
        lost = rng.random(rows) < 0.015
        variant[lost] = 1 - variant[lost]
        passes += _judged_decisions(fp32, variant, fp32.copy()).exit_code == EXIT_PASS
    assert passes <= 10  # 5 % of 200; P(X = 0 | 300, 0.015) = 1.1 %


def test_a_drop_a_hair_under_the_tolerance_on_many_rows_is_unresolved_without_a_row_count():
    """999 of 100,001 rows lost (0.00999) against a max_drop of 0.01: rows that would resolve such a drop number in
    the trillions, and the search for how many doubled them until the gate hung. Beyond 100 times the scope's rows
    the message names none."""
    report = _with_first_lost(100_001, 999)
    assert report.exit_code == EXIT_UNUSABLE
    assert report.problems == (
        "int8@cpu: too few rows to resolve the tolerance: overall accuracy on 100001 rows: its drop of 999 of the "
        "100001 rows (0.00999) is within the tolerance, but a variant losing 0.01 of them shows as small a drop with "
        "probability over 5%: the 95% upper bound of the drop reaches 0.01052 > 0.01",)  # normal approximation: 0.01051


def test_copies_of_an_input_count_once_where_some_rows_are_not_scored():
    """The probe: 600 rows of 200 inputs fed 3 times each, one question unanswerable (exact_match scored on 599 of
    them). The copies were counted only where every row is scored, so the 599 counted as 599 samples (>= 299) and the
    pass resolved max_drop 0.01 (exit 0). The scored rows hold at most the scope's 200 distinct inputs: unresolved."""
    spec = GateSpec(metric="exact_match", max_drop=0.01, max_slice_drop=0.02, applies_to=["int8"])

    def answered() -> SliceMetrics:
        return SliceMetrics("overall", 600, {"exact_match": 500 / 599}, denominators={"exact_match": 599})

    repeated = dataclasses.replace(sweep(result("fp32", answered()), result("int8", answered())),
                                   gate_metric="exact_match", distinct_inputs={"overall": 200})  # fmt: skip
    report = evaluate_gate(repeated, spec)
    assert report.exit_code == EXIT_UNUSABLE
    assert report.problems == ("int8@cpu: too few rows to resolve the tolerance: overall exact_match on 599 rows (200 "
                               "distinct inputs: the others repeat them) < 299 needed for a drop of 0.01 (a variant "
                               "changing 0.01 of the inputs leaves all 200 unchanged with probability 13.4% > 5%)",)
    assert evaluate_gate(dataclasses.replace(repeated, distinct_inputs={"overall": 599}), spec).exit_code == EXIT_PASS


def test_rows_fp32_gives_nan_on_are_no_changed_decisions_of_a_variant():
    """FP32 gives NaN/inf scores on 200 of 1,000 rows (a Log of a Sigmoid that underflows), as does the variant built
    from it: every result misses them, FP32's own agreement included (0.8). The variant changes 3 other rows' right
    answers (a drop of 0.003). Counted as 1 - agreement, its changed decisions were 203, more than its drop counts,
    and the compensation bound 0.003 + 1.96 * sqrt((0.203 - 0.003^2) / 999) = 0.0309 > 0.01 made the gate say that
    the rows could not resolve it (exit 2; an INT8 build of such a model on 944 rows: 'changed on 190 of them', 183
    of them FP32's NaN rows). Its changes are FP32's agreement minus its own: 3, all losses, judged by the rows rule
    (exit 0), as without the NaN rows."""
    rows = 1000
    fp32 = np.zeros(rows, dtype=np.int64)
    fp32[::2] = 1
    variant = fp32.copy()
    variant[200:206:2] = 1 - variant[200:206:2]  # 3 rows of class 1 moved to class 0, each a right answer lost
    reference, scores = _binary_scores(fp32), _binary_scores(variant)
    reference[:200] = scores[:200] = np.nan
    results = [evaluate_accuracy("classification", s, reference, fp32, {}) for s in (reference, scores)]
    assert [r.overall.metrics["agreement"] for r in results] == [0.8, 0.797]
    variants = [VariantResult(variant=name, backend="cpu", precision=name, status="ok", accuracy=acc)
                for name, acc in zip(("fp32", "int8"), results, strict=True)]  # fmt: skip
    report = evaluate_gate(sweep(*variants), SPEC)
    assert report.exit_code == EXIT_PASS, report.problems
    assert round(report.checks[0].drop, 6) == 0.003


def test_a_drop_of_tokens_is_not_told_as_a_count_of_rows():
    """A per-frame output (400 rows x 15 frames): accuracy over 6,000 scored frames, judged as the same share of the
    400 rows. The message said "its drop of 17 of the 400 rows", a count no row holds: 255 frames dropped, on 40
    rows. It now gives the units' count and says how they are judged."""
    per_token = {"accuracy": 6000}
    reference = SliceMetrics("overall", 400, {"accuracy": 5425 / 6000}, denominators=per_token)
    variant = SliceMetrics("overall", 400, {"accuracy": 5170 / 6000}, denominators=per_token)
    spec = SPEC.model_copy(update={"max_drop": 0.05})
    report = evaluate_gate(sweep(result("fp32", reference), result("int8", variant)), spec)
    assert report.exit_code == EXIT_UNUSABLE
    (problem,) = report.problems
    assert ("overall accuracy on 400 rows: its drop of 0.0425 (255 of its 6000 scored units, judged as the same share "
            "of its 400 rows: a row's units are not independent) is within the tolerance") in problem
    assert "17 of the 400 rows" not in problem
