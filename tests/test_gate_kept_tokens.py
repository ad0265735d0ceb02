"""The gate's *_kept checks on token classification (token_decisions_kept) and extractive QA (answers_kept): tiny
ONNX models whose variant lost a rare token class, or the answers at the end of the context, while token accuracy
and span F1 moved less than the tolerance; honest INT8 (dynamic, static) and FP16 builds of the same models keep
every component."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.gate import EXIT_BREACH, EXIT_PASS, evaluate_gate
from qbench.gate_report import check_line
from qbench.recipe import GateSpec, VariantSpec
from qbench.results import Kept, SweepResults, VariantResult, from_dict, to_json
from qbench.validate.accuracy import evaluate_accuracy, with_drops
from qbench.validate.metrics import IGNORE_LABEL
from qbench.variants import build_variant
from qbench.variants.base import BuildContext

BACKEND = "onnxruntime-cpu"
ROWS, TOKENS = 1000, 16
HALVES = {"half=a": np.arange(ROWS) < ROWS // 2, "half=b": np.arange(ROWS) >= ROWS // 2}
HONEST = [VariantSpec(name="int8-dynamic", precision="int8", calibrator="dynamic"),
          VariantSpec(name="int8-minmax", precision="int8", calibrator="minmax"),
          VariantSpec(name="int8-entropy", precision="int8", calibrator="entropy"),
          VariantSpec(name="fp16", precision="fp16")]  # fmt: skip


def _save(path: Path, nodes: list, weights: dict[str, np.ndarray], inputs: list[str], outputs: dict[str, list]) -> Path:
    """`inputs`: int64 (rows, tokens), but "context", float (rows, tokens, 8)."""
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", TOKENS, 8]) if n == "context"
                        else helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", TOKENS]) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in outputs.items()],
        initializer=[numpy_helper.from_array(value, name) for name, value in weights.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _run(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


def _verdict(task: str, reference: dict, outputs: dict, labels: np.ndarray | None, spec: GateSpec, **kwargs):
    """The gate's report on FP32 and one variant 'int8-a' measured on the same rows (read back from results.json)."""
    fp32 = evaluate_accuracy(task, reference, reference, labels, HALVES, **kwargs)
    own = with_drops(evaluate_accuracy(task, outputs, reference, labels, HALVES, **kwargs), fp32)
    variants = tuple(VariantResult(variant=name, backend=BACKEND, precision=name[:4], status="ok", accuracy=accuracy)
                     for name, accuracy in (("fp32", fp32), ("int8-a", own)))  # fmt: skip
    results = SweepResults(qbench_version="0", created_at="", recipe={"name": "toy"}, environment={}, calibration=None,
                           evaluation_rows=ROWS, gate_metric=spec.metric, reference="fp32", variants=variants)  # fmt: skip
    return evaluate_gate(from_dict(__import__("json").loads(to_json(results))), spec), own


def _honest(reference: Path, tmp_path: Path, feeds: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Each honest build's outputs on `feeds`, calibrated (static INT8) on their first 200 rows."""
    calibration = [{k: v[i : i + 50] for k, v in feeds.items()} for i in range(0, 200, 50)]
    found = {}
    for spec in HONEST:
        workdir = tmp_path / spec.name
        workdir.mkdir()
        built = build_variant(spec, BuildContext(reference_path=reference, workdir=workdir, calibration=calibration))
        found[spec.name] = _run(built.onnx_path, feeds)
    return found


def _worst_kept(accuracy) -> float:
    return min(kept.share for scope in (accuracy.overall, *accuracy.slices) for kept in scope.kept.values())


# -- token classification -------------------------------------------------------------------------------------------

VOCABULARY, CLASSES, RARE = 60, 5, 4
RARE_BIAS = 0.0


def _tagger(path: Path, rare_bias: float = RARE_BIAS) -> Path:
    """(input_ids [N, T], context [N, T, 8]) -> logits [N, T, 5]: a word's embedding plus its context (what an encoder
    adds), MatMul, Relu, MatMul, Add(bias); class 4's bias `rare_bias` (FP32's: a rare tag; a broken variant's: -100)."""
    rng = np.random.default_rng(11)
    weights = {"emb": rng.normal(size=(VOCABULARY, 8)).astype(np.float32),
               "w1": rng.normal(size=(8, 16)).astype(np.float32),
               "w2": rng.normal(scale=0.5, size=(16, CLASSES)).astype(np.float32),
               "bias": np.zeros(CLASSES, np.float32)}  # fmt: skip
    weights["bias"][RARE] = rare_bias
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["g"]), helper.make_node("Add", ["g", "context"], ["e"]),
             helper.make_node("MatMul", ["e", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["m"]),
             helper.make_node("Add", ["m", "bias"], ["logits"])]  # fmt: skip
    return _save(path, nodes, weights, ["input_ids", "context"], {"logits": ["batch", TOKENS, CLASSES]})


def _sentences() -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Rows of 6 to 16 word ids (1..59), padded with id 0 (and no context there); each pad position is to be labelled
    IGNORE_LABEL."""
    rng = np.random.default_rng(12)
    ids = rng.integers(1, VOCABULARY, size=(ROWS, TOKENS)).astype(np.int64)
    padding = np.arange(TOKENS) >= rng.integers(6, TOKENS + 1, size=ROWS)[:, None]
    ids[padding] = 0
    context = rng.normal(scale=0.7, size=(ROWS, TOKENS, 8)).astype(np.float32)
    context[padding] = 0.0
    return {"input_ids": ids, "context": context}, padding


def test_a_token_class_the_variant_never_tags_breaches_though_token_accuracy_is_within_tolerance(tmp_path):
    """The rare tag's bias collapsed (-100): every token FP32 tags 4 gets another tag, 201 of the 10953 scored
    tokens (1.8 %), within max_drop 0.05 overall and per half: the gate passed it (exit 0). Honest builds keep the tag."""
    reference, broken = _tagger(tmp_path / "tagger.onnx"), _tagger(tmp_path / "broken.onnx", rare_bias=-100.0)
    feeds, padding = _sentences()
    fp32 = _run(reference, feeds)
    labels = fp32["logits"].argmax(axis=2)
    labels[padding] = IGNORE_LABEL
    rare = int(np.count_nonzero(labels == RARE))
    spec = GateSpec(metric="accuracy", max_drop=0.05, max_slice_drop=0.05, unresolved="note")
    report, _ = _verdict("classification", fp32, _run(broken, feeds), labels, spec)
    accuracy = [c for c in report.checks if c.metric == "accuracy"]
    assert (rare, int((~padding).sum())) == (201, 10953)
    assert [c.status for c in accuracy] == ["pass"] * 3 and accuracy[0].drop == pytest.approx(rare / (~padding).sum())
    assert report.exit_code == EXIT_BREACH
    [overall, *_] = report.breaches
    assert check_line(overall) == (f"BREACH int8-a@{BACKEND} overall token_decisions_kept: class 4: FP32 decides it on "
                                   f"{rare} tokens, the variant on 0 of them: 0.0% kept, under 50%")  # fmt: skip
    assert [c.scope for c in report.breaches] == ["overall", "half=a", "half=b"]
    for name, outputs in _honest(reference, tmp_path, feeds).items():
        verdict, accuracy = _verdict("classification", fp32, outputs, labels, spec)
        print(f"{name}: worst token class kept {_worst_kept(accuracy):.3f}",
              [(scope.name, str(scope.kept)) for scope in (accuracy.overall, *accuracy.slices)])
        assert verdict.exit_code == EXIT_PASS, [check_line(c) for c in verdict.breaches]


def test_tokens_the_labels_leave_unscored_are_no_part_of_token_decisions_kept(tmp_path):
    """A variant that changes only the padding's tag loses nothing: the task's metrics skip those tokens
    (IGNORE_LABEL), and so does the rule. Without labels every token is scored, the 5047 pads too: FP32 tags them
    all 0 (id 0, no context), beside 6351 words, and the variant keeps only the words' 6351 of those 11398."""
    reference = _tagger(tmp_path / "tagger.onnx")
    feeds, padding = _sentences()
    fp32 = _run(reference, feeds)
    labels = fp32["logits"].argmax(axis=2)
    assert (int(padding.sum()), set(labels[padding].tolist()), int((labels[~padding] == 0).sum())) == (5047, {0}, 6351)
    labels[padding] = IGNORE_LABEL
    padded = {"logits": fp32["logits"].copy()}
    padded["logits"][padding, 0] -= 100.0
    spec = GateSpec(metric="accuracy", max_drop=0.05, max_slice_drop=0.05, unresolved="note")
    report, accuracy = _verdict("classification", fp32, padded, labels, spec)
    assert report.exit_code == EXIT_PASS and _worst_kept(accuracy) == 1.0
    _, unlabelled = _verdict("classification", fp32, padded, None, spec)
    assert unlabelled.overall.kept["logits"] == Kept("token_decisions_kept", "class 0", 11398.0, 6351.0)


# -- extractive QA ---------------------------------------------------------------------------------------------------

QUESTION = 4  # tokens 0..3 are the question (token_type_ids 0), 4..15 the context: quarters start at 4, 7, 10, 13


def _reader(path: Path, late_start: float = 0.0) -> Path:
    """(input_ids, token_type_ids) -> start_logits, end_logits [N, T]: Gather, MatMul, Relu, MatMul, plus a
    token-type term and a position term falling by 0.2 a token (late answers are rare); `late_start` is added to the
    start scores of the last 3 positions (a broken variant's collapsed positions)."""
    rng = np.random.default_rng(5)
    position = np.repeat((-0.2 * np.arange(TOKENS, dtype=np.float32))[:, None], 2, axis=1)
    position[-3:, 0] += late_start
    weights = {"emb": rng.normal(size=(40, 8)).astype(np.float32), "w1": rng.normal(size=(8, 16)).astype(np.float32),
               "w2": rng.normal(scale=0.5, size=(16, 2)).astype(np.float32), "position": position,
               "type_w": np.array([3.0, 3.0], np.float32), "halves": np.array([1, 1], np.int64),
               "axis2": np.array([2], np.int64)}  # fmt: skip
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["e"]), helper.make_node("MatMul", ["e", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["m"]),
             helper.make_node("Cast", ["token_type_ids"], ["tf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["tf", "axis2"], ["t3"]), helper.make_node("Mul", ["t3", "type_w"], ["tw"]),
             helper.make_node("Add", ["m", "tw"], ["s0"]), helper.make_node("Add", ["s0", "position"], ["s"]),
             helper.make_node("Split", ["s", "halves"], ["a", "b"], axis=2),
             helper.make_node("Squeeze", ["a", "axis2"], ["start_logits"]),
             helper.make_node("Squeeze", ["b", "axis2"], ["end_logits"])]  # fmt: skip
    outputs = dict.fromkeys(("start_logits", "end_logits"), ["batch", TOKENS])
    return _save(path, nodes, weights, ["input_ids", "token_type_ids"], outputs)


def test_answers_at_the_end_of_the_context_the_variant_never_gives_breach_though_f1_is_within_tolerance(tmp_path):
    """The last 3 positions' start scores collapsed (-10): FP32's 11 answers starting there (the context's last
    quarter; 5 and 6 per half) all start earlier; span F1 against FP32 drops 0.008, within max_drop 0.05: the gate
    passed it (exit 0). Honest builds answer where FP32 does."""
    reference, broken = _reader(tmp_path / "reader.onnx"), _reader(tmp_path / "broken.onnx", late_start=-10.0)
    rng = np.random.default_rng(6)
    types = np.zeros((ROWS, TOKENS), np.int64)
    types[:, QUESTION:] = 1
    feeds = {"input_ids": rng.integers(0, 40, size=(ROWS, TOKENS)).astype(np.int64), "token_type_ids": types}
    fp32 = _run(reference, feeds)
    spec = GateSpec(metric="f1", max_drop=0.05, max_slice_drop=0.05, unresolved="note")
    report, own = _verdict("span", fp32, _run(broken, feeds), None, spec, feeds=feeds)
    f1 = [c for c in report.checks if c.metric == "f1"]
    assert [c.status for c in f1] == ["pass"] * 3 and f1[0].drop == pytest.approx(0.0080, abs=5e-5)
    assert report.exit_code == EXIT_BREACH
    assert [check_line(c) for c in report.breaches] == [(
        f"BREACH int8-a@{BACKEND} {where} answers_kept: answers in the context's last quarter: FP32 answers there on "
        f"{rows} rows, the variant on 0 of them: 0.0% kept, under 50%")
        for where, rows in (("overall", 11), ("slice half=a", 5), ("slice half=b", 6))]  # fmt: skip
    for name, outputs in _honest(reference, tmp_path, feeds).items():
        verdict, accuracy = _verdict("span", fp32, outputs, None, spec, feeds=feeds)
        print(f"{name}: worst part of the context kept {_worst_kept(accuracy):.3f}",
              [(scope.name, str(scope.kept)) for scope in (accuracy.overall, *accuracy.slices)])
        assert verdict.exit_code == EXIT_PASS, [check_line(c) for c in verdict.breaches]
