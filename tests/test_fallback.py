"""Accuracy-aware search through the sweep: fallback keeps the fragile nodes in FP32; calibrator auto tries them all."""

from __future__ import annotations

import dataclasses
import math

import onnx
import pytest
import yaml
from onnx import numpy_helper

from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS
from qbench.recipe.spec import load_recipe
from qbench.results.schema import read_results
from qbench.sweep.runner import run_sweep
from tests.explain.test_sensitivity import INT8, NOTED_GATE, one_gemm_model, write_fragile_project


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """The sweep writes <output_dir>/<name>/ under the working directory."""
    monkeypatch.chdir(tmp_path)


def _sweep(tmp_path, variant, *, limit=None, **project):
    """Sweep the fragile project with `variant`; `limit`: data.evaluation.limit (the rows beyond it choose)."""
    path = write_fragile_project(tmp_path, [variant], **{"gate": NOTED_GATE, **project})
    if limit is not None:
        raw = yaml.safe_load(path.read_text())
        raw["data"]["evaluation"]["limit"] = limit
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
    recipe = load_recipe(path)
    outcome = run_sweep(recipe, track=False)
    result = outcome.results.find(variant["name"], "onnxruntime-cpu")
    assert result is not None and result.status == "ok", result
    return outcome, result


def test_fallback_keeps_the_fragile_nodes_in_fp32_until_the_gate_passes(tmp_path):
    variant = {**INT8, "fallback": {"max_excluded": 3}}
    outcome, result = _sweep(tmp_path, variant, fragile=("a", "b"))
    steps = result.params["search.steps"]
    print([(s["excluded"], s["metric"], s["passed"]) for s in steps])
    assert sorted(result.params["exclude_nodes"]) == ["branch_a", "branch_b"]
    assert result.params["fallback.ranking"]["minmax"][:2] in (["branch_a", "branch_b"], ["branch_b", "branch_a"])
    assert [s["passed"] for s in steps] == [False, False, True]  # none kept float, then one, then both
    assert [len(s["excluded"]) for s in steps] == [0, 1, 2]
    assert result.params["search.outcome"] == "passed" and result.params["search.chosen"] == 2
    assert any("rests on too few of them" in note and "< 99 needed" in note for note in result.notes)
    assert outcome.gate.exit_code == EXIT_PASS
    assert any("kept in FP32 by the search: branch_" in note for note in result.notes)
    saved = read_results(outcome.results_path).find("int8", "onnxruntime-cpu")
    assert saved.params["search.steps"] == steps
    models = sorted(p.name for p in (outcome.run_dir / "models").iterdir())
    assert models == ["int8.calibration.json", "int8.onnx"]  # the search's own folders are gone


def test_tolerance_unreachable_when_max_excluded_is_too_small(tmp_path):
    """Two fragile nodes, one allowed in FP32: the ranking shows one cannot be enough, so no step is spent."""
    variant = {**INT8, "fallback": {"max_excluded": 1}}
    outcome, result = _sweep(tmp_path, variant, fragile=("a", "b"))
    steps = result.params["search.steps"]
    assert [s["excluded"] for s in steps] == [[]] and not steps[0]["passed"]
    assert result.params["fallback.ranking"]["minmax"][0] in ("branch_a", "branch_b")
    assert result.params["fallback.skipped"][0].startswith("minmax: ")
    assert result.params["search.outcome"] == "tolerance unreachable" and result.params["exclude_nodes"] == []
    note = next(n for n in result.notes if n.startswith("tolerance unreachable"))
    assert f"best: agreement {steps[0]['metric']:.4f}" in note and "breaches: overall drop" in note
    assert outcome.gate.exit_code == EXIT_BREACH


def test_calibrator_auto_records_every_try_then_falls_back_to_the_fastest_passing(tmp_path):
    variant = {"name": "int8-auto", "precision": "int8", "calibrator": "auto", "op_types": ["MatMul"],
               "fallback": {"max_excluded": 2}}  # fmt: skip
    # the rows beyond the limit choose, so all 96 calibration rows are fitted on, as in a sweep without a search
    gate = {**NOTED_GATE, "unresolved": "fail"}
    outcome, result = _sweep(tmp_path, variant, fragile=("a",), limit=150, gate=gate)
    steps = result.params["search.steps"]
    assert [s["calibrator"] for s in steps[:4]] == ["minmax", "entropy", "percentile", "dynamic"]
    assert all(s["excluded"] == [] and math.isfinite(s["p50_ms"]) and not s["passed"] for s in steps[:4])
    assert all(s["excluded"] for s in steps[4:])  # then fallback steps, fastest calibrator first
    chosen = steps[result.params["search.chosen"]]
    assert chosen["passed"] and chosen["p50_ms"] == min(s["p50_ms"] for s in steps if s["passed"])
    # its pass on the rows beyond the limit does not resolve the tolerance either: under `fail`, no pass
    assert "branch_a" in result.params["exclude_nodes"] and result.params["search.outcome"] == "pass unresolved"
    assert chosen["unresolved"] and any("so it is reported as not passing" in note for note in result.notes)
    assert result.params["calibrator"] == chosen["calibrator"] and result.params["calibrator_requested"] == "auto"
    # nor, on the 150 evaluated rows, does the gate: it finds a 50-row slice
    # that cannot resolve its tolerance: no pass
    assert outcome.gate.status_of("int8-auto", "onnxruntime-cpu") == "fail"
    assert [p for p in outcome.gate.problems if "too few rows" in p and "half=second agreement on 50 rows" in p]
    assert any(note.startswith("search on agreement: minmax ") for note in result.notes)


@pytest.mark.parametrize("variant", [{"calibrator": "auto"}, {"calibrator": "minmax", "fallback": {"until": "gate"}}],
                         ids=["auto", "fallback"])  # fmt: skip
def test_a_model_with_nothing_to_quantize_leaves_the_users_model_folder_untouched(tmp_path, variant):
    """Every try is the FP32 model itself (no MatMul/Gemm/Conv): choosing or discarding a try must never move or
    remove the files beside the user's model."""
    import numpy as np
    import onnx
    import pandas as pd
    import yaml
    from onnx import TensorProto, helper

    models = tmp_path / "models"
    models.mkdir()
    graph = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["n"]),
         helper.make_node("Sub", ["a", "n"], ["scores"])],
        "nothing", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["b", 3])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, models / "nothing.onnx")
    (models / "notes.txt").write_text("the user's own file")
    x = np.random.default_rng(0).normal(size=(120, 3)).astype(np.float32)
    pd.DataFrame({"x": list(x), "label": (np.abs(x) + x).argmax(1)}).to_parquet(tmp_path / "d.parquet")
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({
        "name": "nothing", "task": "classification", "model": {"path": "models/nothing.onnx"},
        "data": {"path": "d.parquet", "inputs": {"x": "x"}, "label": "label"},
        "variants": [{"name": "int8", "precision": "int8", **variant}], "analysis": {"ranges": False},
        "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 5, "threads": 1}, "output_dir": "reports",
    }))  # fmt: skip
    outcome = run_sweep(load_recipe(tmp_path / "r.yaml"), track=False)
    assert sorted(p.name for p in models.iterdir()) == ["notes.txt", "nothing.onnx"]
    assert outcome.results.find("int8", "onnxruntime-cpu").status == "ok"


def test_nodes_that_matter_only_together_are_still_tried(tmp_path, monkeypatch):
    """Every node's recovery measured alone made zero (as on a model whose nodes only help together): adding single
    recoveries said 100 % of the noise would stay, and the fallback was skipped as 'unreachable'. The noise left
    with max_excluded nodes in FP32 is measured on that candidate instead, and the fallback finds the pair."""
    from qbench import fallback

    real = fallback.rank_groups

    def alone_recovers_nothing(*args, **kwargs):
        return [dataclasses.replace(cost, overall=0.0) for cost in real(*args, **kwargs)]

    monkeypatch.setattr(fallback, "rank_groups", alone_recovers_nothing)
    variant = {**INT8, "fallback": {"max_excluded": 3}}
    outcome, result = _sweep(tmp_path, variant, fragile=("a", "b"))
    assert "fallback.skipped" not in result.params or not result.params["fallback.skipped"]
    assert {"branch_a", "branch_b"} <= set(result.params["exclude_nodes"])
    assert result.params["search.outcome"] == "passed" and outcome.gate.exit_code == EXIT_PASS


def test_a_fallback_over_every_node_leaves_the_users_model_and_keeps_one_node_in_int8(tmp_path):
    """Dynamic INT8 quantizes the 4 MatMuls, fewer than max_excluded (8): ranking with 8 nodes in FP32 rebuilt the
    try with every node float, which is the recipe's own model, and deleted it afterwards. No step may keep every
    node float (that is the FP32 model), and no file of the user's is touched."""
    variant = {"name": "int8", "precision": "int8", "calibrator": "dynamic", "op_types": ["MatMul"],
               "fallback": {"until": "gate"}}  # fmt: skip
    outcome, result = _sweep(tmp_path, variant, fragile=("a",))
    assert (tmp_path / "model.onnx").is_file()
    steps = result.params["search.steps"]
    assert all(len(s["excluded"]) < 4 and s["lowered"] for s in steps)
    assert "branch_a" in result.params["exclude_nodes"] and result.params["search.outcome"] == "passed"
    assert outcome.gate.exit_code == EXIT_PASS


def test_a_step_that_keeps_every_quantized_node_float_is_never_a_pass(tmp_path):
    """A zero-tolerance gate only FP32 itself can meet: dynamic INT8 quantizes one node (the Gemm), and keeping it in
    FP32 leaves an FP32 graph (its Gemm a MatMul + Add). That step 'passed' and the gate exited 0; the fallback now
    stops one node short of all, so the tolerance is unreachable and the gate fails the INT8 try."""
    variant = {"name": "int8", "precision": "int8", "calibrator": "dynamic", "fallback": {"until": "gate"}}
    path = write_fragile_project(tmp_path, [variant],
                                 gate={"metric": "agreement", "max_drop": 0.0, "max_slice_drop": 0.0})  # fmt: skip
    one_gemm_model(tmp_path / "model.onnx")
    outcome = run_sweep(load_recipe(path), track=False)
    result = outcome.results.find("int8", "onnxruntime-cpu")
    assert result.status == "ok" and result.params["quantized_nodes"] >= 1
    assert result.params["search.outcome"] == "tolerance unreachable" and result.params["exclude_nodes"] == []
    assert not any(s["passed"] for s in result.params["search.steps"])
    assert result.params["fallback.skipped"][0].startswith("dynamic: it quantizes 1 node(s)")
    assert outcome.gate.exit_code == EXIT_BREACH


def test_search_notes_print_a_small_metric_with_its_digits(tmp_path):
    """A kl_mean of 1e-5 (a well-quantized model gated tightly) was noted as 'minmax 0.0000✗', 'tolerance
    unreachable; best: kl_mean 0.0000' and '... with 1 nodes in FP32 (≤0% needed)': figures now keep their digits,
    as the gate's own lines do."""
    gate = {"metric": "kl_mean", "max_drop": 1e-9, "max_slice_drop": 1e-9}
    variant = {**INT8, "calibrator": "auto", "fallback": {"max_excluded": 1}}
    path = write_fragile_project(tmp_path, [variant], fragile=(), gate=gate)
    model = onnx.load(str(tmp_path / "model.onnx"))
    head = next(t for t in model.graph.initializer if t.name == "w3")
    head.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(head) / 10, "w3"))  # logits 10× smaller: KL ~100×
    onnx.save(model, str(tmp_path / "model.onnx"))
    result = run_sweep(load_recipe(path), track=False).results.find("int8", "onnxruntime-cpu")
    metrics = [step["metric"] for step in result.params["search.steps"]]
    print(metrics, result.notes)
    assert 0 < min(metrics) < 5e-5  # what 4 decimals print as 0.0000
    search_note = next(n for n in result.notes if n.startswith("search on kl_mean: "))
    assert "0.0000" not in search_note and f"minmax {metrics[0]:.2e}" in search_note
    unreachable = next(n for n in result.notes if n.startswith("tolerance unreachable"))
    assert f"best: kl_mean {min(metrics):.2e}" in unreachable
    needed = 1e-9 / metrics[0]  # the share of minmax's noise the gate allows: 0.029 %, which read "≤0% needed"
    skipped = next(n for n in result.notes if n.startswith("no fallback from minmax: "))
    assert skipped.endswith(f"with 1 node in FP32 (≤{needed * 100:.2g}% needed)")


def test_calibrator_auto_never_takes_rounded_data_movement_for_int8(tmp_path):
    """Scores that are the input joined to itself by a Concat: static INT8 put Q/DQ on the Concat (no integer kernel),
    the variant was reported as INT8 and calibrator auto kept a try. Every try now computes in FP32, and says so."""
    import numpy as np
    import pandas as pd
    import yaml
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Concat", ["x", "x"], ["scores"], axis=1, name="join")], "join",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["b", 6])],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m.onnx")
    x = np.random.default_rng(0).normal(size=(120, 3)).astype(np.float32)
    pd.DataFrame({"x": list(x), "label": x.argmax(1)}).to_parquet(tmp_path / "d.parquet")
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({
        "name": "join", "task": "classification", "model": {"path": "m.onnx"},
        "data": {"path": "d.parquet", "inputs": {"x": "x"}, "label": "label"},
        "variants": [{"name": "int8", "precision": "int8", "calibrator": "auto"}], "analysis": {"ranges": False},
        "gate": {"unresolved": "note"},  # 120 rows resolve no drop of 0.01; the note asserted below is the point
        "latency": {"batch_sizes": [1], "warmup": 1, "iterations": 5, "threads": 1}, "output_dir": "reports",
    }))  # fmt: skip
    outcome = run_sweep(load_recipe(tmp_path / "r.yaml"), track=False)
    result = outcome.results.find("int8", "onnxruntime-cpu")
    assert result.params["search.outcome"] == "nothing to quantize" and result.params["quantized_op_types"] == {}
    assert "no try computes any node in INT8: the variant computes in FP32" in result.notes
    assert any("int8@onnxruntime-cpu computes in fp32" in note for note in outcome.gate.notes)


def test_a_full_disk_while_building_a_try_fails_the_variant_rather_than_choosing_without_it(tmp_path, monkeypatch):
    """`calibrator: auto` counted a try whose model could not be written (a full disk) as that calibrator failing
    and chose among the others: a choice made by the disk. Now the variant fails, naming the file and the reason."""
    import errno
    import os

    import qbench.fallback
    from qbench.files import writing_file

    real_build = qbench.fallback.build_variant

    def full_for_entropy(spec, ctx):
        if spec.calibrator == "entropy":
            with writing_file(ctx.workdir / f"{spec.name}.onnx", "the model"):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_build(spec, ctx)

    monkeypatch.setattr(qbench.fallback, "build_variant", full_for_entropy)
    variant = {"name": "int8-auto", "precision": "int8", "calibrator": "auto", "op_types": ["MatMul"]}
    recipe = load_recipe(write_fragile_project(tmp_path, [variant], gate=NOTED_GATE, fragile=("a",)))
    outcome = run_sweep(recipe, track=False)
    result = outcome.results.find("int8-auto", "onnxruntime-cpu")
    assert result.status == "failed" and result.error.endswith("cannot write the model: No space left on device")
    assert outcome.gate.exit_code == 2
