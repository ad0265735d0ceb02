"""The gate's notes beside its checks (qbench.gate.notes): what a pass cannot show, said with the verdict."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from qbench.gate.evaluate import EXIT_PASS, evaluate_gate
from qbench.gate.junit import junit_xml
from qbench.gate.report import report_dict, summary_line
from qbench.recipe.spec import GateSpec
from qbench.results.schema import SweepResults, VariantResult, from_dict, to_json
from qbench.validate.accuracy import evaluate_accuracy, with_drops

SPEC = GateSpec(metric="accuracy", max_drop=0.02, max_slice_drop=0.05)
ROWS = 300
THIRDS = {"group=a": np.arange(ROWS) % 3 == 0, "group=b": np.arange(ROWS) % 3 != 0}


def _results(fp32: np.ndarray, int8: np.ndarray, labels: np.ndarray) -> SweepResults:
    reference = evaluate_accuracy("classification", fp32, fp32, labels, THIRDS)
    own = with_drops(evaluate_accuracy("classification", int8, fp32, labels, THIRDS), reference)
    variants = (VariantResult("fp32", "onnxruntime-cpu", "fp32", "ok", accuracy=reference),
                VariantResult("int8", "onnxruntime-cpu", "int8", "ok", accuracy=own))  # fmt: skip
    results = SweepResults(qbench_version="0", created_at="", recipe={"name": "toy", "task": "classification"},
                           environment={}, calibration=None, evaluation_rows=ROWS, gate_metric=SPEC.metric,
                           reference="fp32", variants=variants)  # fmt: skip
    return from_dict(json.loads(to_json(results)))


def test_a_reference_giving_one_answer_on_every_row_is_noted_with_its_pass():
    """FP32 logits [0.1, 0.7, -0.3] on every row (a linear layer with zero weights: the bias alone), labels 0, 1, 2 in
    turn every 3 rows: FP32 and an int8 giving the same logits score 0.33 (hand: class 1 is the label on 99 of 300
    rows, 33 of group=a's 100, 66 of group=b's 200) and the int8 passed with no word that FP32's figures do not
    depend on the inputs. It still passes (the figures are sound), with a note naming the reference, the output and
    the rows. (Labels 0, 1, 2 row by row left FP32 at 0 on group=a: no drop could show there, so nothing is judged.)"""
    labels = np.arange(ROWS) // 3 % 3
    constant = np.tile(np.array([[0.1, 0.7, -0.3]], dtype=np.float32), (ROWS, 1))
    report = evaluate_gate(_results(constant, constant.copy(), labels), SPEC)
    assert report.exit_code == EXIT_PASS and summary_line(report) == "gate: PASS — 1 variant × 3 scopes, 3 checks"
    assert {c.scope: c.reference for c in report.checks} == pytest.approx({"overall": 0.33, "group=a": 0.33,
                                                                          "group=b": 0.33})  # fmt: skip
    [note] = [n for n in report.notes if "same answer" in n]
    assert note.startswith("fp32@onnxruntime-cpu gives the same answer on all 300 evaluation rows (its output "
                           "spreads 0 across them): its figures do not depend on the inputs")


def test_a_reference_whose_outputs_vary_gets_no_such_note():
    """One row's logits moved by 1e-3: FP32's output is no longer constant, and nothing is said."""
    labels = np.arange(ROWS) // 3 % 3
    varied = np.tile(np.array([[0.1, 0.7, -0.3]], dtype=np.float32), (ROWS, 1))
    varied[7, 0] += 1e-3
    report = evaluate_gate(_results(varied, varied.copy(), labels), SPEC)
    assert report.exit_code == EXIT_PASS and not [n for n in report.notes if "same answer" in n]


def test_an_output_constant_by_design_beside_one_that_varies_is_noted_as_that_output_alone():
    """FP32's logits vary across the rows and a second evaluated output, 'version', is 3.0 on every one (constant by
    design). The note said FP32 'gives the same answer on all 300 evaluation rows', that its figures 'do not depend on
    the inputs' and to check that data.inputs feed the model, all three false: the logits vary. It now names
    'version' alone, says 'logits' vary, and gives no such advice."""
    import dataclasses

    labels = np.arange(ROWS) % 3
    varied = np.random.default_rng(0).normal(size=(ROWS, 3)).astype(np.float32)
    results = _results(varied, varied.copy(), labels)
    with_version = []
    for variant in results.variants:
        overall = variant.accuracy.overall
        spread = {"logits": overall.spread[next(iter(overall.spread))], "version": 0.0}
        accuracy = dataclasses.replace(variant.accuracy, overall=dataclasses.replace(overall, spread=spread))
        with_version.append(dataclasses.replace(variant, accuracy=accuracy))
    report = evaluate_gate(dataclasses.replace(results, variants=tuple(with_version)), SPEC)
    assert report.exit_code == EXIT_PASS and spread["logits"] > 1
    [note] = [n for n in report.notes if "spread 0" in n or "same answer" in n]
    assert note.startswith("fp32@onnxruntime-cpu's output 'version' is the same on all 300 evaluation rows (spread 0 "
                           "across them) while 'logits' vary: figures on it do not depend on the inputs")
    assert "same answer" not in note and "data.inputs" not in note


@pytest.mark.parametrize("shared", [0, 40])
def test_a_pick_chosen_on_selection_rows_that_copy_evaluation_inputs_says_so(shared: int) -> None:
    """A calibration file holding copies of evaluation rows: the selection rows are kept apart from them by position,
    not by content, so a search (calibrator: auto, fallback) chose its dynamic pick partly on inputs that then judge
    it, and nothing said so (the calibration note names fitted variants only); the count survives results.json."""
    from dataclasses import replace

    from qbench.results.schema import CalibrationRecord

    rng = np.random.default_rng(0)
    fp32 = rng.normal(size=(ROWS, 3))
    results = _results(fp32, fp32, fp32.argmax(axis=1))
    picked = replace(results.variants[1], params={"calibration_rows": 0, "search.chosen_on": "selection"})
    record = CalibrationRecord(size=64, seed=0, stratify_by=None, row_ids_sha256="ab" * 32, per_slice_counts={},
                               overlap="hold_out", held_out_rows=0, evaluation_overlap_rows=0, selection_rows=100,
                               selection_from_sample=0, selection_overlap_rows=shared)  # fmt: skip
    results = from_dict(json.loads(to_json(replace(results, calibration=record,
                                                   variants=(results.variants[0], picked)))))  # fmt: skip
    report = evaluate_gate(results, SPEC)
    assert report.exit_code == EXIT_PASS
    expected = ["int8@onnxruntime-cpu was chosen among candidates on 100 selection rows of which 40 feed the model "
                "what evaluation rows feed it (the same inputs in both files, or twice in the table): the choice saw "
                "inputs that judge it, its pass may be optimistic"]
    assert [n for n in report.notes if "selection rows of which" in n] == (expected if shared else [])


def _pooled_encoder(common: float) -> bytes:
    """x (rows, 8) → y (rows, 16) = relu(x W1) W2 + `common` on every dimension: a large `common` is the one direction
    mean-pooled encoder vectors share (a small Whisper encoder's: a cosine of 0.99987 between any two rows)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {"w1": rng.normal(size=(8, 32)) / np.sqrt(8), "w2": rng.normal(size=(32, 16)) / np.sqrt(32),
               "common": np.full((1, 16), common)}  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["s"]),
             helper.make_node("Add", ["s", "common"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "pooled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", 16])],
                              [numpy_helper.from_array(v.astype(np.float32), k)
                               for k, v in weights.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_a_cosine_tolerance_wider_than_what_tells_the_rows_apart_is_noted(tmp_path, monkeypatch):
    """Vectors sharing one dominant direction: FP32's rows share a cosine near 1 (|mean unit vector|^2, by hand
    over onnxruntime's outputs), so a variant answering another row's vector drops cosine by about 1 - it, far
    under max_drop 0.01: the check could not fail, and the gate passed with no word. The sweep now records the
    shared cosine in FP32's params and the gate says so with its pass; tolerances below that room get no note."""
    import glob

    import onnxruntime as ort
    import pandas as pd
    import yaml
    from user_model import swept_breaches

    from qbench.validate.catalogue import SHARED_COSINES

    (tmp_path / "pooled.onnx").write_bytes(_pooled_encoder(40.0))
    x = np.random.default_rng(1).normal(size=(400, 8)).astype(np.float32)
    pd.DataFrame({"x": list(x), "part": np.where(x[:, 0] > 0, "high", "low"), "split": ["calib"] * 100 + ["eval"] * 300}
                 ).to_parquet(tmp_path / "rows.parquet")  # fmt: skip
    recipe = {"name": "pooled", "task": "embedding", "model": {"path": "pooled.onnx"},
              "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "slices": [{"by": "part"}],
                       "calibration": {"filter": {"split": "calib"}, "samples": 100, "seed": 0},
                       "evaluation": {"filter": {"split": "eval"}}},
              "variants": [{"name": "fp16", "precision": "fp16"}], "backends": ["onnxruntime-cpu"],
              "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 2, "threads": 1},
              "gate": {"metric": "cosine", "max_drop": 0.01, "max_slice_drop": 0.02, "unresolved": "note"}}  # fmt: skip
    (tmp_path / "qbench.yaml").write_text(yaml.safe_dump(recipe))
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    assert swept_breaches(tmp_path / "qbench.yaml") == (EXIT_PASS, [])

    fp32 = ort.InferenceSession(_pooled_encoder(40.0), providers=["CPUExecutionProvider"]).run(None, {"x": x[100:]})[0]
    units = np.mean(fp32 / np.linalg.norm(fp32, axis=1, keepdims=True), axis=0, dtype=np.float64)
    [path] = glob.glob(str(tmp_path / "reports" / "**" / "results.json"), recursive=True)
    results = from_dict(json.loads(open(path).read()))
    shared = results.find("fp32", "onnxruntime-cpu").params[SHARED_COSINES]
    assert shared == {"y": pytest.approx(float(units @ units), abs=1e-7)} and 0.999 < shared["y"] < 0.9999
    report = evaluate_gate(results, GateSpec(metric="cosine", max_drop=0.01, max_slice_drop=0.02, unresolved="note"))
    room = 1 - shared["y"]
    assert report.exit_code == EXIT_PASS
    assert [n for n in report.notes if "share a cosine" in n] == [
        f"fp32@onnxruntime-cpu's vectors share a cosine of {shared['y']:.6g} across the evaluation rows: a variant "
        f"answering another row's vector scores about that, a drop of {room:.2g}, within max_drop 0.01 and "
        "max_slice_drop 0.02, so cosine cannot tell a variant confusing rows from FP32; gate on nn_agreement, or "
        f"state tolerances below {room:.2g}"]
    tight = GateSpec(metric="cosine", max_drop=room / 2, max_slice_drop=room / 2, unresolved="note")
    assert not [n for n in evaluate_gate(results, tight).notes if "share a cosine" in n]


def test_outputs_no_figure_compares_are_named_once_with_the_verdict():
    """FP32 records the model outputs that no figure reads (a second head, a decoder's cache); the results and the
    report said so in its notes, but `qbench gate` printed a pass with no word of them. Now one note names them (the
    first four, the rest counted), once however many backends run the model."""
    from sweep_factory import make_sweep, make_variant

    from qbench.validate.catalogue import UNCOMPARED_OUTPUTS

    left = ["aux", *(f"present.{i}" for i in range(5))]
    variants = [make_variant("fp32", "fp32", backend=backend, params={UNCOMPARED_OUTPUTS: left})
                for backend in ("onnxruntime-cpu", "torch-cpu")]  # fmt: skip
    variants += [make_variant("fp16", "fp16", backend=backend) for backend in ("onnxruntime-cpu", "torch-cpu")]
    report = evaluate_gate(make_sweep(variants), SPEC)
    assert report.exit_code == EXIT_PASS
    assert [n for n in report.notes if "not compared with FP32" in n] == [
        "outputs 'aux', 'present.0', 'present.1', 'present.2' and 2 more not compared with FP32 (no figure reads "
        "them): this verdict does not cover them, a variant changing them passes; list the outputs to judge in "
        "model.outputs"
    ]
    every_output = [make_variant("fp32", "fp32"), make_variant("fp16", "fp16")]
    assert not [n for n in evaluate_gate(make_sweep(every_output), SPEC).notes if "not compared" in n]


def test_a_variant_its_backend_cannot_run_is_named_beside_the_pass():
    """int8 skipped by its backend (status skipped: an ONNX Runtime INT8 form a torch backend has no kernels for)
    under applies_to '*': nothing judges it, and the pass said '1 variant × 3 scopes' with no word of it, in the
    console, the JSON and the JUnit report alike. Now a note names it with its backend's reason; a variant the globs
    leave out is named by the applies_to note, with its status."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, ROWS)
    logits = np.eye(3, dtype=np.float32)[labels] + rng.normal(scale=0.1, size=(ROWS, 3)).astype(np.float32)
    base = _results(logits, logits.copy(), labels)
    fp16 = VariantResult("fp16", "onnxruntime-cpu", "fp16", "ok", accuracy=base.variants[1].accuracy)
    skipped = VariantResult("int8", "onnxruntime-cpu", "int8", "skipped",
                            error="torch-cpu has no kernel for\nQLinearMatMul")  # fmt: skip
    results = from_dict(json.loads(to_json(replace(base, variants=(base.variants[0], fp16, skipped)))))
    report = evaluate_gate(results, SPEC.model_copy(update={"unresolved": "note"}))
    assert report.exit_code == EXIT_PASS and report.gated == ("fp16@onnxruntime-cpu",)
    note = ("not judged, as its backend cannot run it (status skipped): int8@onnxruntime-cpu (torch-cpu has no kernel "
            "for QLinearMatMul)")  # fmt: skip
    assert note in report.notes
    assert note in report_dict(report)["notes"]
    assert f"note: {note}" in junit_xml(report)
    outside = evaluate_gate(results, SPEC.model_copy(update={"unresolved": "note", "applies_to": ["fp16"]}))
    assert [n for n in outside.notes if "int8@" in n] == [
        "not judged by this gate (gate.applies_to: fp16): int8@onnxruntime-cpu (int8, skipped: torch-cpu has no kernel "
        "for QLinearMatMul)"]  # fmt: skip
