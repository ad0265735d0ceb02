"""One judge: the INT8 search, `fallback:` and `calibrator: auto` say of a candidate what `qbench gate` says of the
same figures.

Random small cases (a classifier, a regressor, a multilabel tagger; slices of every size, among them one where no
gated metric can show a drop: FP32 wrong on every row, a constant target, no positive label with FP32 predicting
one) under random gate settings (metrics, max_drop, max_slice_drop, min_slice_size, gate.unresolved). Before, the
searches judged a pass beside such a slice as resolved: the search kept it as "passed" and the gate exited 2 on the
same results under `gate.unresolved: fail`."""

from __future__ import annotations

import numpy as np
import pytest

from qbench.fallback import Trial, _outcome
from qbench.gate.evaluate import EXIT_PASS, EXIT_UNUSABLE, evaluate_gate, judge
from qbench.gate.resolution import PASS_UNRESOLVED
from qbench.gate.tolerance import tolerances_by_metric
from qbench.recipe.spec import GateSpec
from qbench.results.schema import SweepResults, VariantResult
from qbench.results.search import CandidateRecord
from qbench.search import select
from qbench.search.certain import certain_failure
from qbench.search.screen import evaluated_record
from qbench.validate.accuracy import evaluate_accuracy, with_drops
from qbench.variants import BuiltVariant

BACKEND = "onnxruntime-cpu"
CASES = 60
CANDIDATES = 3
GATED = {  # task -> the gate.metrics a case draws from (one metric, or several)
    "classification": [["accuracy"], ["agreement"], ["accuracy", "agreement"]],
    "regression": [["r2"], ["mae"], ["r2", "mae"]],
    "multilabel": [["micro_f1"], ["micro_f1", "label_agreement"]],
}


def _outputs(task: str, rows: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(FP32's outputs, labels, slices) with a slice `blind` no single metric of the task can judge on its own."""
    blind = np.zeros(rows, dtype=bool)
    blind[: max(2, rows // 8)] = True
    if task == "classification":
        fp32 = rng.normal(size=(rows, 4)).astype(np.float32)
        labels = np.where(rng.random(rows) < 0.8, fp32.argmax(axis=1), rng.integers(0, 4, rows))
        labels[blind] = (fp32[blind].argmax(axis=1) + 1) % 4  # FP32 wrong on every row: accuracy 0, its worst
    elif task == "regression":
        labels = rng.normal(size=rows)
        labels[blind] = 1.5  # a constant target: R² undefined for FP32 and every variant
        fp32 = (labels + rng.normal(scale=0.3, size=rows)).astype(np.float32).reshape(-1, 1)
    else:
        labels = (rng.random((rows, 3)) < 0.4).astype(np.int64)
        labels[blind] = 0  # no positive label, FP32 predicting one: micro_f1 0, its worst
        fp32 = (np.where(labels == 1, 3.0, -3.0) + rng.normal(scale=0.5, size=labels.shape)).astype(np.float32)
        fp32[0, 0] = 2.0
    small = np.zeros(rows, dtype=bool)
    small[rng.choice(rows, size=int(rng.integers(1, 7)), replace=False)] = True
    return fp32, labels, {"blind": blind, "half": rng.random(rows) < 0.5, "small": small}


def _drawn(seed: int) -> tuple[str, list[np.ndarray], np.ndarray, dict[str, np.ndarray], GateSpec]:
    """(task, FP32's outputs then each candidate's, adding noise of a random size to them, labels, slices, random gate
    settings)."""
    rng = np.random.default_rng(seed)
    task = ["classification", "regression", "multilabel"][seed % 3]
    fp32, labels, slices = _outputs(task, int(rng.integers(30, 400)), rng)
    noise = [float(rng.choice([0.0, 0.01, 0.1, 0.5, 1.5])) for _ in range(CANDIDATES)]
    outputs = [fp32, *((fp32 + rng.normal(scale=scale, size=fp32.shape)).astype(np.float32) for scale in noise)]
    metrics = GATED[task][int(rng.integers(len(GATED[task])))]
    drops = [0.0, 0.01, 0.05, 0.2, 0.5]
    entries = [{"metric": m, "max_drop": float(rng.choice(drops)), "max_slice_drop": float(rng.choice(drops))}
               for m in metrics]  # fmt: skip
    spec = GateSpec(metrics=entries, min_slice_size=int(rng.choice([1, 5, 30])),
                    unresolved=str(rng.choice(["fail", "note"])))  # fmt: skip
    return task, outputs, labels, slices, spec


def _results(task: str, outputs: list[np.ndarray], labels: np.ndarray,
             slices: dict[str, np.ndarray]) -> tuple[VariantResult, list[VariantResult]]:  # fmt: skip
    """FP32's result and each candidate's, from their outputs."""
    fp32 = evaluate_accuracy(task, outputs[0], outputs[0], labels, slices)
    candidates = [VariantResult(f"int8-{index}", BACKEND, "int8", "ok",
                                accuracy=with_drops(evaluate_accuracy(task, own, outputs[0], labels, slices), fp32))
                  for index, own in enumerate(outputs[1:])]  # fmt: skip
    return VariantResult("fp32", BACKEND, "fp32", "ok", accuracy=fp32), candidates


def _case(seed: int) -> tuple[VariantResult, list[VariantResult], GateSpec]:
    """FP32, the candidates and the gate settings of case `seed`."""
    task, outputs, labels, slices, spec = _drawn(seed)
    return *_results(task, outputs, labels, slices), spec


def _gate_exit(fp32: VariantResult, candidate: VariantResult, spec: GateSpec) -> int:
    """`qbench gate`'s exit code on results holding FP32 and `candidate`."""
    results = SweepResults(qbench_version="0", created_at="", recipe={}, environment={}, calibration=None,
                           evaluation_rows=fp32.accuracy.rows, gate_metric=spec.metric, reference="fp32",
                           variants=(fp32, candidate))  # fmt: skip
    return evaluate_gate(results, spec, expected=[("fp32", BACKEND), (candidate.variant, BACKEND)]).exit_code


@pytest.mark.parametrize("seed", range(CASES))
def test_the_searches_verdict_on_a_candidate_is_the_gates_on_the_same_figures(seed, tmp_path):
    fp32, candidates, spec = _case(seed)
    setting = spec.unresolved
    built = BuiltVariant("int8", "int8", tmp_path / "int8.onnx")
    records, exits = [], []
    for index, candidate in enumerate(candidates):
        verdict = judge(fp32, candidate, spec)
        record = evaluated_record(CandidateRecord(f"c{index}", "ort-static"), verdict, candidate)
        record = record.with_(speedup=1.0 + index / 10)
        trial = Trial("minmax", (), built, candidate, verdict)
        exit_code = _gate_exit(fp32, candidate, spec)
        records.append(record)
        exits.append(exit_code)
        assert record.counted(setting) == trial.counted(setting) == (exit_code == EXIT_PASS), record.verdict
        if not record.passed:  # a breach or a problem: the same exit code
            assert exit_code == verdict.exit_code != EXIT_PASS
        elif not record.counted(setting):  # a pass the gate holds: unusable, never a breach
            assert exit_code == EXIT_UNUSABLE and record.unresolved
        fallback = _outcome(trial, setting)
        expected = "passed" if exit_code == EXIT_PASS else PASS_UNRESOLVED if trial.passed else "tolerance unreachable"
        assert fallback == expected
    chosen, pick, thin = select.picked(records, setting)
    outcome = select.outcome(chosen, pick, thin)
    assert pick is not None
    if outcome == "passed":
        assert exits[pick] == EXIT_PASS
    else:  # the search keeps no pick the gate passes, and finds none where one passes
        assert exits[pick] != EXIT_PASS and EXIT_PASS not in exits
        assert outcome == ("unresolved" if records[pick].passed else "unreachable")
        if outcome == "unresolved":
            assert exits[pick] == EXIT_UNUSABLE and records[pick].unresolved


def test_the_random_cases_hold_every_kind_of_verdict():
    """The cases above are no test if every candidate passes, or none: they hold resolved passes, breaches, and passes
    the gate holds for a scope no gated metric judges, and some the searches kept as passed before."""
    seen = set()
    for seed in range(CASES):
        fp32, candidates, spec = _case(seed)
        for candidate in candidates:
            verdict = judge(fp32, candidate, spec)
            record = evaluated_record(CandidateRecord("c", "ort-static"), verdict, candidate)
            blind = bool(record.unresolved) and "not judged on blind" in record.unresolved
            seen.add(("pass" if record.resolved_pass else "held blind" if blind and record.passed else
                      "held" if record.passed else "fail", spec.unresolved))  # fmt: skip
    assert {("pass", "fail"), ("pass", "note"), ("fail", "fail"), ("held blind", "fail"), ("held blind", "note")} <= seen



def _certain_refusals(seed: int) -> list[tuple[bool, int]]:
    """(whether the certain-failure bound refuses each candidate of case `seed` on a screen of two thirds of its rows,
    the gate's exit code on every row)."""
    task, outputs, labels, slices, spec = _drawn(seed)
    fp32, candidates = _results(task, outputs, labels, slices)
    rows = labels.shape[0]
    screen = np.sort(np.random.default_rng(10_000 + seed).choice(rows, size=2 * rows // 3, replace=False))
    fp32_screen, screened = _results(task, [own[screen] for own in outputs], labels[screen],
                                     {name: mask[screen] for name, mask in slices.items()})  # fmt: skip
    tolerances = tolerances_by_metric(fp32, spec)  # every row's, as the search screens with
    found = []
    for candidate, own_screen in zip(candidates, screened, strict=True):
        verdict = judge(fp32_screen, own_screen, spec, tolerances)
        why = certain_failure(verdict.checks, own_screen.accuracy, fp32_screen.accuracy, fp32.accuracy)
        found.append((why is not None, _gate_exit(fp32, candidate, spec)))
    return found


@pytest.mark.parametrize("seed", range(CASES))
def test_the_certain_failure_bound_only_refuses_what_the_gate_fails(seed):
    """The screen's certain-failure bound (qbench.search.certain) skips a candidate's full evaluation: it may do so
    only where the gate, on every row, would not pass it (on the screening rows the candidate's outputs are those of
    its full evaluation)."""
    assert all(exit_code != EXIT_PASS for refused, exit_code in _certain_refusals(seed) if refused)


def test_the_certain_failure_bound_refuses_some_of_the_cases():
    """The test above is no test where the bound refuses nothing."""
    assert sum(refused for seed in range(CASES) for refused, _ in _certain_refusals(seed)) >= 5
