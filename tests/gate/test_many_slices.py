"""A recipe cutting its rows into hundreds of small slices (a store or user id each): the verdict stays readable."""

from __future__ import annotations

import json

import numpy as np

from qbench.errors import NAMED_SCOPES
from qbench.gate.evaluate import EXIT_BREACH, EXIT_UNUSABLE, evaluate_gate
from qbench.gate.report import BREACH_LINES, console_lines, report_json, summary_line
from qbench.recipe.spec import GateSpec
from qbench.results.schema import SweepResults, VariantResult
from qbench.validate.accuracy import evaluate_accuracy

SPEC = GateSpec(metric="accuracy", max_drop=0.01, max_slice_drop=0.02, applies_to=["int8"])
STORES, ROWS = 300, 20  # 300 slices of 20 rows: each far under the 149 rows a drop of 0.02 needs


def _judged(variant_decisions: np.ndarray, fp32: np.ndarray, labels: np.ndarray, spec: GateSpec = SPEC,
            names: tuple[str, ...] = ("int8",)):  # fmt: skip
    """The gate's report on binary decisions, each store of ROWS consecutive rows a named slice (`names`: the
    variants deciding so)."""
    store = np.repeat(np.arange(STORES), ROWS)
    variants = []
    for name, decisions in (("fp32", fp32), *((name, variant_decisions) for name in names)):
        scores = np.stack([1.0 - decisions, decisions.astype(float)], axis=1).astype(np.float32)
        reference = np.stack([1.0 - fp32, fp32.astype(float)], axis=1).astype(np.float32)
        slices = {f"s{i:04d}": store == i for i in range(STORES)}
        accuracy = evaluate_accuracy("classification", scores, reference, labels, slices)
        variants.append(VariantResult(variant=name, backend="cpu", precision=name, status="ok", accuracy=accuracy))
    results = SweepResults(qbench_version="0", created_at="", recipe={}, environment={}, calibration=None,
                           evaluation_rows=fp32.size, gate_metric=spec.metric, reference="fp32",
                           variants=tuple(variants))  # fmt: skip
    return evaluate_gate(results, spec)


def _rows() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    fp32 = rng.integers(0, 2, STORES * ROWS)
    return fp32, fp32.copy()  # labels FP32 gets right on every row


def test_an_unresolved_variant_on_hundreds_of_slices_is_named_in_one_short_line():
    """The probe: 1,000 stores of 20 rows, an FP16 variant changing 3 of 20,000 decisions; its unresolved problem
    named every slice with its numbers, one line of 148,772 characters (149 KB per variant in the console, the JSON
    and the MLflow tag). Now NAMED_SCOPES of them and a count; the JSON's `unresolved` lists every one."""
    fp32, labels = _rows()
    report = _judged(fp32.copy(), fp32, labels)
    assert report.exit_code == EXIT_UNUSABLE
    (problem,) = report.problems
    assert problem.startswith("int8@cpu: too few rows to resolve the tolerance: s0000 accuracy on 20 rows < 149")
    assert problem.endswith(f" and {STORES - NAMED_SCOPES} more")
    assert problem.count("accuracy on 20 rows") == NAMED_SCOPES
    assert len(problem) < 1000
    assert len(json.loads(report_json(report))["unresolved"]) == STORES


def test_the_jsons_unresolved_passes_name_their_variant():
    """Two variants each unresolved on every slice: the JSON's `unresolved` listed 2 x 300 reasons ('s0000 accuracy on
    20 rows < 149 ...') with nothing saying whose, while its problems name only NAMED_SCOPES of each; each entry now
    names its variant, as a problem's does."""
    fp32, labels = _rows()
    spec = SPEC.model_copy(update={"applies_to": ["int8*"]})
    report = _judged(fp32.copy(), fp32, labels, spec, names=("int8", "int8-b"))
    unresolved = json.loads(report_json(report))["unresolved"]
    assert [entry["variant"] for entry in unresolved] == ["int8@cpu"] * STORES + ["int8-b@cpu"] * STORES
    assert unresolved[STORES]["message"].startswith("s0000 accuracy on 20 rows < 149")
    assert report.unresolved == tuple(entry["message"] for entry in unresolved)


def test_a_variant_breaching_hundreds_of_slices_prints_a_few_lines_and_a_count():
    """The probe: a variant flipping one row of every store breached every slice (drop 0.05 > 0.02): 301 BREACH
    lines by default (the overall rows too), and a summary naming all 301 scopes. Now BREACH_LINES of them and one
    line counting the rest; the summary names NAMED_SCOPES; the JSON holds every check."""
    fp32, labels = _rows()
    variant = fp32.copy()
    variant[::ROWS] = 1 - variant[::ROWS]  # the first row of each store wrong
    report = _judged(variant, fp32, labels)
    breaches = STORES + 1  # every slice, and the overall rows (0.05 > 0.01)
    assert report.exit_code == EXIT_BREACH and len(report.breaches) == breaches
    lines = console_lines(report)
    assert len(lines) == BREACH_LINES + 1
    assert lines[0].startswith("BREACH int8@cpu overall accuracy")
    assert lines[-1] == (f"BREACH int8@cpu: {breaches - BREACH_LINES} more breaches (--verbose prints every check, "
                         "--json writes each)")  # fmt: skip
    assert f"int8@cpu (overall, s0000, s0001, s0002, s0003 and {breaches - NAMED_SCOPES} more)" in summary_line(report)
    assert sum(c["status"] == "breach" for c in json.loads(report_json(report))["checks"]) == breaches
