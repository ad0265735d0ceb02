"""FP32 on each later backend is judged against the first backend's FP32 as a variant is (qbench.gate): a backend
whose FP32 is wrong breaches (exit 1, one line naming it), its variants cannot pass, and none of its rows is the
cheapest. Before, each backend's FP32 was its own reference: a wrong one passed its backend's variants (exit 0)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.backends import BACKENDS
from qbench.backends.onnxruntime_cpu import OnnxRuntimeCPU
from qbench.cli.app import main
from qbench.export.triton import GateVerdict, gate_verdict
from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, EXIT_UNUSABLE, evaluate_gate
from qbench.gate.report import summary_line
from qbench.recipe.spec import GateSpec
from qbench.report.frontier import frontier_text
from qbench.report.serving import accuracy_verdict
from qbench.results.evidence import unrecorded
from qbench.results.schema import SweepResults, VariantResult, from_dict, to_json
from qbench.track.content import GATE_REASONS_TAG, GATE_TAG, gate_tags
from qbench.validate.accuracy import evaluate_accuracy, with_drops

SPEC = GateSpec(metric="accuracy", max_drop=0.02, max_slice_drop=0.04, unresolved="note")
ROWS = 600
HALVES = {"half=a": np.arange(ROWS) < ROWS // 2, "half=b": np.arange(ROWS) >= ROWS // 2}
FIRST, SECOND = "onnxruntime-cpu", "ort-second"


def _logits() -> tuple[np.ndarray, np.ndarray]:
    """(logits, labels): 3 classes, FP32 right on 90 % of the rows (every 10th label is another class)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(ROWS, 3)).astype(np.float32)
    labels = logits.argmax(1)
    labels[::10] = (labels[::10] + 1) % 3
    return logits, labels


def _rotated(logits: np.ndarray) -> np.ndarray:
    """Each row's classes rotated by a row-dependent step: what a runtime with a wrong FP32 kernel might give."""
    step = np.arange(len(logits)) % 3
    return logits[np.arange(len(logits))[:, None], (np.arange(3)[None, :] + step[:, None]) % 3]


def _results(second_fp32: np.ndarray, first_fp32: np.ndarray | None = None, own: bool = False) -> SweepResults:
    """FP32 and 'int8' on two backends, as the sweep measures them: every output against FP32 on the first backend,
    drops against FP32 on the result's own backend (a later FP32's against the first's); int8 computes as the first
    backend's FP32 does on both (`own`: as its backend's FP32 does). `first_fp32`: the first backend's FP32 logits
    (default: right)."""
    logits, labels = _logits()
    logits = logits if first_fp32 is None else first_fp32
    first = evaluate_accuracy("classification", logits, logits, labels, HALVES)
    second = with_drops(evaluate_accuracy("classification", second_fp32, logits, labels, HALVES), first)
    int8 = evaluate_accuracy("classification", logits, logits, labels, HALVES)
    int8_second = evaluate_accuracy("classification", second_fp32, logits, labels, HALVES) if own else int8
    variants = (VariantResult("fp32", FIRST, "fp32", "ok", accuracy=first),
                VariantResult("fp32", SECOND, "fp32", "ok", accuracy=second),
                VariantResult("int8", FIRST, "int8", "ok", accuracy=with_drops(int8, first)),
                VariantResult("int8", SECOND, "int8", "ok", accuracy=with_drops(int8_second, second)))  # fmt: skip
    results = SweepResults(qbench_version="0", created_at="", recipe={"name": "toy", "task": "classification"},
                           environment={}, calibration=None, evaluation_rows=ROWS, gate_metric=SPEC.metric,
                           reference="fp32", variants=variants)  # fmt: skip
    return from_dict(json.loads(to_json(results)))


def test_a_later_backends_wrong_fp32_breaches_and_its_variants_cannot_pass():
    """FP32 on the second backend scores 1/3 against 0.9, on each half too (hand-computed: of every 30 rows, the 10
    rotated by 0 keep FP32's answer, right on 9; the 10 rotated by 2 move it to the next class, which is the label
    on the one of them whose label was moved); int8 there, equal to the first backend's FP32, passed against it
    (exit 0). Now that FP32 breaches overall and on both halves (exit 1), int8 there fails with it, and one line
    names the backend."""
    logits, labels = _logits()
    wrong = _rotated(logits)
    assert (wrong.argmax(1) == labels).sum() == 20 * (9 + 1)
    report = evaluate_gate(_results(wrong), SPEC)
    assert report.exit_code == EXIT_BREACH
    fp32 = {c.scope: c for c in report.checks if (c.variant, c.backend, c.metric) == ("fp32", SECOND, "accuracy")}
    assert {s: (c.reference, round(c.observed, 4), c.status) for s, c in fp32.items()} == {
        "overall": (0.9, 0.3333, "breach"), "half=a": (0.9, 0.3333, "breach"), "half=b": (0.9, 0.3333, "breach")}
    assert report.status_of("int8", SECOND) == "fail"
    assert report.status_of("int8", FIRST) == "pass"
    assert report.status_of("fp32", SECOND) == "fail"
    assert all(c.status == "pass" for c in report.checks if c.variant == "int8")  # against its own backend's FP32
    assert list(report.fp32_differs()) == [SECOND]
    assert report.fp32_differs()[SECOND].startswith(
        f"backend {SECOND}'s FP32 differs from backend {FIRST}'s FP32: overall accuracy 0.9 → 0.3333; half=a "
        "accuracy 0.9 → 0.3333; half=b accuracy 0.9 → 0.3333")
    results = _results(wrong)
    verdicts = {v.key: accuracy_verdict(results, report, v) for v in results.variants}
    assert verdicts == {f"fp32@{FIRST}": "reference", f"fp32@{SECOND}": "fail", f"int8@{FIRST}": "pass",
                        f"int8@{SECOND}": "fail"}  # fmt: skip
    tags = gate_tags(report, f"int8@{SECOND}")  # its MLflow run: failed, and why
    assert tags[GATE_TAG] == "fail"
    assert tags[GATE_REASONS_TAG] == report.fp32_differs()[SECOND]
    assert f"  ! {report.fp32_differs()[SECOND]}" in frontier_text(results, report.fp32_differs())


def test_fp32_that_agrees_across_backends_passes_and_changes_no_verdict():
    """Two backends computing the same FP32 (ONNX Runtime's CPU provider twice): FP32 there passes with a drop of 0,
    every variant passes as before, and no backend's FP32 is said to differ."""
    logits, _ = _logits()
    report = evaluate_gate(_results(logits.copy()), SPEC)
    assert report.exit_code == EXIT_PASS, report.problems
    assert report.status_of("int8", SECOND) == report.status_of("int8", FIRST) == "pass"
    assert {c.drop for c in report.checks if c.variant == "fp32"} == {0.0}
    assert report.fp32_differs() == {}
    assert not report.notes


def test_the_summary_counts_a_later_fp32_apart_from_the_variants():
    """One variant on two backends: the summary read '3 variants × 3 scopes', counting FP32 on the second backend
    (judged against the first's) as a variant. It now counts the 2 variant@backend pairs and names the later FP32
    apart, passing and breaching."""
    logits, _ = _logits()
    passing = evaluate_gate(_results(logits.copy()), SPEC)
    assert summary_line(passing) == (f"gate: PASS — 2 variants × 3 scopes and FP32 on 1 later backend (judged "
                                     f"against {FIRST}'s FP32), 9 checks")  # fmt: skip
    breaching = evaluate_gate(_results(_rotated(logits)), SPEC)
    assert summary_line(breaching) == (f"gate: FAIL — FP32 on 1 of 1 later backend breaches (against {FIRST}'s "
                                       f"FP32): fp32@{SECOND} (overall, half=a, half=b); 12 checks")  # fmt: skip


def test_fp32_is_exported_on_no_backend_without_force():
    """FP32 on the first backend was refused as not gated, FP32 on a later one that agrees with it was exported as
    'pass'. One rule now: FP32 is the reference on every backend, refused without --force; a later one that
    disagrees says it failed."""
    logits, _ = _logits()
    report = evaluate_gate(_results(logits.copy()), SPEC)
    assert report.status_of("fp32", SECOND) == "pass"  # it agrees with the first backend's FP32
    assert gate_verdict(report, "fp32", FIRST, reference="fp32") == GateVerdict("not gated", "the FP32 reference")
    later = gate_verdict(report, "fp32", SECOND, reference="fp32")
    assert later.status == "not gated" and f"agrees with FP32 on {FIRST}" in later.reason
    assert gate_verdict(report, "int8", SECOND, reference="fp32") == GateVerdict("pass", "")
    wrong = gate_verdict(evaluate_gate(_results(_rotated(logits)), SPEC), "fp32", SECOND, reference="fp32")
    assert wrong == GateVerdict("fail", "6 breach(es), worst overall: drop 0.5667 > 0.0200")  # 0.9 - 1/3


def test_a_later_fp32_above_a_wrong_first_fp32_beyond_the_tolerance_breaches():
    """The first backend's FP32 is the wrong one: 13 rows of half=b it had right rotated to another class (hand:
    527/600 = 0.8783 overall, 257/300 = 0.8567 on half=b), the second's right (0.9, 0.9); int8 on each backend
    computes as its FP32 does. Judged one way, the second gained 0.0217 and 0.0433 and passed, and int8 on the first
    backend passed against its wrong FP32 (exit 0). A later FP32 now breaches beyond the tolerance either way (exit 1,
    the line naming it); a gain within it still passes."""
    logits, labels = _logits()
    wrong = logits.copy()
    rows = [row for row in range(ROWS // 2, ROWS) if row % 10][:13]  # labels FP32 gets right
    wrong[rows] = np.roll(wrong[rows], 1, axis=1)
    assert (wrong.argmax(1) == labels).sum() == 540 - 13 and (wrong.argmax(1) == labels)[ROWS // 2:].sum() == 270 - 13
    report = evaluate_gate(_results(logits.copy(), first_fp32=wrong, own=True), SPEC)
    assert report.exit_code == EXIT_BREACH
    fp32 = {c.scope: c for c in report.checks if (c.variant, c.backend, c.metric) == ("fp32", SECOND, "accuracy")}
    assert {s: (round(c.reference, 4), round(c.observed, 4), round(c.drop, 4), c.status) for s, c in fp32.items()} == {
        "overall": (0.8783, 0.9, -0.0217, "breach"), "half=a": (0.9, 0.9, 0.0, "pass"),
        "half=b": (0.8567, 0.9, -0.0433, "breach")}  # fmt: skip
    assert report.fp32_differs()[SECOND].startswith(f"backend {SECOND}'s FP32 differs from backend {FIRST}'s FP32: "
                                                    "overall accuracy 0.8783 → 0.9; half=b accuracy 0.8567 → 0.9")
    within = wrong.copy()
    within[rows[8:]] = logits[rows[8:]]  # 8 rows wrong: a gain of 0.0133 overall, 0.0267 on half=b
    assert evaluate_gate(_results(logits.copy(), first_fp32=within, own=True), SPEC).exit_code == EXIT_PASS


def test_a_later_fp32_that_cannot_be_judged_leaves_its_backend_unjudged():
    """FP32 on the second backend lacks a slice every result has: its results cannot be judged (exit 2), and int8
    there, judged against it, cannot pass."""
    logits, _ = _logits()
    raw = json.loads(to_json(_results(logits.copy())))
    raw["variants"][1]["accuracy"]["slices"] = raw["variants"][1]["accuracy"]["slices"][:1]
    report = evaluate_gate(from_dict(raw), SPEC)
    assert report.exit_code == EXIT_UNUSABLE
    assert f"fp32@{SECOND}: slice 'half=b' missing from the results" in report.problems
    assert report.status_of("int8", SECOND) == "fail"


def test_a_variant_failing_with_its_backends_unjudged_fp32_alone_says_why():
    """The first backend's FP32 failed: FP32 on the second cannot be judged against it, and int8 there, with no
    breach or problem of its own, fails with it. Its MLflow reasons said 'none' and its Triton refusal gave no
    reason; both now name FP32's problem."""
    logits, _ = _logits()
    raw = json.loads(to_json(_results(logits.copy())))
    raw["variants"][0].update(status="failed", accuracy=None, error="out of memory")
    report = evaluate_gate(from_dict(raw), SPEC)
    problem = f"fp32@{SECOND}: no usable FP32 reference on {FIRST}"
    assert report.exit_code == EXIT_UNUSABLE and problem in report.problems
    assert report.status_of("int8", SECOND) == "fail"
    tags = gate_tags(report, f"int8@{SECOND}")
    assert (tags[GATE_TAG], tags[GATE_REASONS_TAG]) == ("fail", f"UNUSABLE {problem} (fail closed)")
    assert gate_tags(report, f"fp32@{SECOND}")[GATE_REASONS_TAG] == f"UNUSABLE {problem} (fail closed)"  # once
    assert gate_verdict(report, "int8", SECOND, reference="fp32") == GateVerdict("fail", problem)
    assert report.fp32_problems(SECOND) == [problem] and report.fp32_problems(FIRST) == []


def test_results_of_several_backends_without_fp32_drops_are_refused_one_backend_needs_none():
    """A later FP32's drops taken against the first backend's FP32 are recorded since evidence 'fp32_drops'; results
    of several backends written before it are refused (exit 2) with the line naming it, one backend's need nothing."""
    logits, _ = _logits()
    raw = json.loads(to_json(_results(_rotated(logits))))
    raw["evidence"] = [name for name in raw["evidence"] if name != "fp32_drops"]
    report = evaluate_gate(from_dict(raw), SPEC)
    assert report.exit_code == EXIT_UNUSABLE
    assert report.problems == ("results written by qbench '0' record no fp32_drops (this qbench's sweep records them), "
                               "so these checks cannot be applied: each later backend's FP32 against the first "
                               "backend's (its drops, as the report and MLflow show them); re-run `qbench sweep`",)
    assert [e.name for e in unrecorded(tuple(raw["evidence"]), slo=False, several_backends=False)] == []


# -- a sweep with a second backend whose FP32 path is wrong ----------------------------------------------------


class _Rotating:
    """A runner whose logits have each row's classes rotated by a step taken from its input."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def run(self, feeds):
        out = self._inner.run(feeds)
        x = next(iter(feeds.values()))
        step = (np.abs(x.reshape(len(x), -1)).sum(axis=1) * 1e4).astype(np.int64) % 3
        return [out[0][np.arange(len(x))[:, None], (np.arange(3)[None, :] + step[:, None]) % 3], *out[1:]]


class _WrongFp32(OnnxRuntimeCPU):
    """ONNX Runtime's CPU provider with a wrong FP32 path: other precisions compute as they should."""

    name = "ort-wrong-fp32"

    def load(self, built, options):
        runner = super().load(built, options)
        return _Rotating(runner) if built.precision == "fp32" else runner


def _project(tmp_path: Path, second: str) -> Path:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["logits"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
                              [numpy_helper.from_array(w, "w")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "model.onnx")
    x = rng.normal(size=(600, 8)).astype(np.float32)
    labels = (x @ w).argmax(1)
    labels[::10] = (labels[::10] + 1) % 3
    pd.DataFrame({"x": list(x), "label": labels, "group": np.where(np.arange(600) % 2, "a", "b")}).to_parquet(
        tmp_path / "rows.parquet")
    recipe = {"name": "two-backends", "task": "classification", "model": {"path": "model.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "label", "slices": [{"by": "group"}],
                       "calibration": {"samples": 64}},
              "variants": [{"name": "fp16", "precision": "fp16"}], "backends": [FIRST, second],
              "latency": {"batch_sizes": [1], "warmup": 2, "iterations": 100},
              "slo": {"p99_ms": 1000, "batch_size": 1}, "cost": {"price_per_hour": {FIRST: 1.0, second: 0.01}},
              "analysis": {"ranges": False}, "executor": {"store": "store"},
              "gate": {"metric": "accuracy", "max_drop": 0.02, "max_slice_drop": 0.04}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return tmp_path / "recipe.yaml"


def test_a_sweep_on_a_cheaper_backend_with_a_wrong_fp32_is_a_breach_and_names_no_row_of_it_cheapest(
        tmp_path, capsys, monkeypatch):  # fmt: skip
    """Before: exit 0 and a row of the wrong backend named the cheapest (its FP32 at 0.36 against 0.9, its fp16
    judged against that). Now: exit 1, the line naming the backend, on the frontier too, the cheapest a row of the
    first backend, and the wrong FP32's drop recorded against the first backend's FP32."""
    monkeypatch.setitem(BACKENDS._entries, _WrongFp32.name, _WrongFp32)
    assert main(["sweep", "--no-track", "--gate", str(_project(tmp_path, _WrongFp32.name))]) == EXIT_BREACH
    captured = capsys.readouterr()
    err = captured.out + captured.err
    line = f"backend {_WrongFp32.name}'s FP32 differs from backend {FIRST}'s FP32: overall accuracy 0.9 → "
    assert f"BREACH {line}" in err and f"  ! {line}" in err
    cheapest = next(row for row in err.splitlines() if row.startswith("cheapest meeting accuracy and SLO: "))
    assert cheapest.removeprefix("cheapest meeting accuracy and SLO: ").split(" ")[0].endswith(f"@{FIRST}"), cheapest
    results = from_dict(json.loads(next(tmp_path.glob("reports/two-backends/*/results.json")).read_text()))
    wrong = results.find("fp32", _WrongFp32.name)
    assert wrong.accuracy.overall.drops["accuracy"] > 0.5  # recorded against the first backend's FP32
    assert "differs" not in frontier_text(results)  # the frontier names it only beside a gate's verdict
