"""The gate's *_kept check on token classification (token_decisions_kept): a tiny ONNX tagger whose variant lost a
rare token class while token accuracy moved less than the tolerance; honest INT8 (dynamic, static) and FP16 builds of
the same model keep every class."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, evaluate_gate
from qbench.gate.report import check_line
from qbench.recipe.spec import GateSpec, VariantSpec
from qbench.results.schema import Kept, SweepResults, VariantResult, from_dict, to_json
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
                           evaluation_rows=ROWS, gate_metric=spec.metric, reference="fp32",
                           variants=variants)  # fmt: skip
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
    adds), MatMul, Relu, MatMul, Add(bias); class 4's bias `rare_bias` (FP32's: a rare tag; a broken variant's:
    -100)."""
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
    tokens (1.8 %), within max_drop 0.05 overall and per half: the gate passed it (exit 0). Honest builds keep the
    tag."""
    reference, broken = _tagger(tmp_path / "tagger.onnx"), _tagger(tmp_path / "broken.onnx", rare_bias=-100.0)
    feeds, padding = _sentences()
    fp32 = _run(reference, feeds)
    labels = fp32["logits"].argmax(axis=2)
    labels[padding] = IGNORE_LABEL
    rare, rare_rows = int(np.count_nonzero(labels == RARE)), int(np.count_nonzero((labels == RARE).any(axis=1)))
    spec = GateSpec(metric="accuracy", max_drop=0.05, max_slice_drop=0.05, unresolved="note")
    report, _ = _verdict("classification", fp32, _run(broken, feeds), labels, spec)
    accuracy = [c for c in report.checks if c.metric == "accuracy"]
    assert (rare, rare_rows, int((~padding).sum())) == (201, 179, 10953)
    assert [c.status for c in accuracy] == ["pass"] * 3 and accuracy[0].drop == pytest.approx(rare / (~padding).sum())
    assert report.exit_code == EXIT_BREACH
    [overall, *_] = report.breaches
    assert check_line(overall) == (f"BREACH int8-a@{BACKEND} overall token_decisions_kept: class 4: FP32 decides it in "
                                   f"{rare_rows} rows, the variant in 0 of them (on half of their tokens FP32 decides "
                                   "it on at least): 0.0% kept, under 50%; by chance at its change rate on the classes "
                                   "it keeps (0.00%): probability 0")  # fmt: skip
    assert [c.scope for c in report.breaches] == ["overall", "half=a", "half=b"]
    for name, outputs in _honest(reference, tmp_path, feeds).items():
        verdict, accuracy = _verdict("classification", fp32, outputs, labels, spec)
        print(f"{name}: worst token class kept {_worst_kept(accuracy):.3f}",
              [(scope.name, str(scope.kept)) for scope in (accuracy.overall, *accuracy.slices)])
        assert verdict.exit_code == EXIT_PASS, [check_line(c) for c in verdict.breaches]


def test_tokens_the_labels_leave_unscored_are_no_part_of_token_decisions_kept(tmp_path):
    """A variant that changes only the padding's tag loses nothing: the task's metrics skip those tokens
    (IGNORE_LABEL), and so does the rule. Without labels every token is scored, the 5047 pads too: FP32 tags them
    all 0 (id 0, no context), beside 6351 words, in every row, and the variant keeps tag 0 only on the words: on
    half of a row's tokens tagged 0 at least in 612 of the 1000 rows."""
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
    words, pads = ((labels == 0) & ~padding).sum(axis=1), padding.sum(axis=1)
    assert int(np.count_nonzero(words >= 0.5 * (words + pads))) == 612
    assert unlabelled.overall.kept["logits"] == Kept("token_decisions_kept", "class 0", 1000.0, 612.0)


def test_a_class_fp32_decides_in_few_rows_is_not_judged_however_many_of_their_tokens_it_holds(tmp_path):
    """A language model's repeated pattern: rows 0-2 repeat one word (no context), and FP32 decides tag 4 on their
    scored tokens alone (6 to 16 a row, bias +100 there). A variant that tags rows 1 and 2 otherwise lost tag 4 on
    tokens of 2 of 3 rows: no evidence that it lost the tag (a row's tokens, read in one context, flip together, and 3
    rows cannot show half lost), yet on its tokens (over 5) it breached at 1/3 kept. Now the tag is not judged, the
    other tags are (every token kept), and token accuracy (within max_drop) decides."""
    reference = _tagger(tmp_path / "tagger.onnx", rare_bias=-100.0)  # tag 4 never decided by the model itself
    feeds, padding = _sentences()
    feeds["input_ids"][:3] = np.where(padding[:3], 0, 5)
    feeds["context"][:3] = 0.0
    fp32 = _run(reference, feeds)
    pattern = np.zeros((ROWS, TOKENS), dtype=bool)
    pattern[:3] = ~padding[:3]
    fp32["logits"][pattern, RARE] += 200.0
    labels = fp32["logits"].argmax(axis=2)
    labels[padding] = IGNORE_LABEL
    variant = {"logits": fp32["logits"].copy()}
    variant["logits"][1:3][pattern[1:3], RARE] -= 200.0
    tokens = [int(n) for n in pattern[:3].sum(axis=1)]
    assert int((labels == RARE).sum()) == sum(tokens) and min(tokens) >= 5
    spec = GateSpec(metric="accuracy", max_drop=0.05, max_slice_drop=0.05, unresolved="note")
    report, accuracy = _verdict("classification", fp32, variant, labels, spec)
    assert report.exit_code == EXIT_PASS, [check_line(c) for c in report.breaches]
    assert all(kept.component != f"class {RARE}" for scope in (accuracy.overall, *accuracy.slices)
               for kept in scope.kept.values())  # fmt: skip
    assert accuracy.overall.kept["logits"].component != "" and _worst_kept(accuracy) == 1.0  # the others: judged, kept


# -- extractive QA ---------------------------------------------------------------------------------------------------
