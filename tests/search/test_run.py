"""The INT8 search end to end, through the sweep, on a tiny model with a deliberately fragile node
(tests/explain/test_sensitivity.py)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import onnx
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.gate.evaluate import EXIT_BREACH, EXIT_PASS, EXIT_UNUSABLE
from qbench.gate.run import run_gate
from qbench.recipe.spec import load_recipe
from qbench.results.schema import read_results
from qbench.search import select
from qbench.search.budget import Budget
from qbench.search.retime import RETIME_ROUNDS
from qbench.sweep.runner import run_sweep
from tests.explain.test_sensitivity import SEARCH_BUDGET_S, fragile_model, one_gemm_model, write_fragile_project


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def _searched_recipe(path):
    recipe = load_recipe(path)
    return recipe, run_sweep(recipe, track=False)


def _searched(tmp_path, search, *, fragile=("a",), gate=None, model=None):
    path = write_fragile_project(tmp_path, [], fragile=fragile, gate=gate)
    if model is not None:
        model(tmp_path / "model.onnx")
    raw = yaml.safe_load(path.read_text())
    raw["search"] = {"time_budget_s": SEARCH_BUDGET_S, **search}  # a budget only where a test sets its own
    # a few dozen selection rows resolve no share-of-rows tolerance: a pass there is no pass under `fail`
    # (test_resolved_pass.py); these tests are about the search's other decisions
    raw["gate"]["unresolved"] = "note"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return _searched_recipe(path)


def test_the_search_finds_a_passing_candidate_and_records_every_candidate(tmp_path):
    """ORT's candidates all fail on the fragile node (SmoothQuant, left out here, would smooth it away);
    keeping it in float passes: that candidate is chosen."""
    recipe, outcome = _searched(tmp_path, {"finalists": 2, "techniques": ["ort-dynamic", "ort-static"]})
    report = outcome.results.search
    labels = [c.label for c in report.candidates]
    print([(c.label, c.stage, c.screen_excess, c.speedup, c.verdict) for c in report.candidates])
    assert labels[:2] == ["ort-dynamic", "ort-static"]  # every base failed: the twins ran, of the nearest base first
    assert sorted(labels[2:4]) == ["ort-dynamic rr", "ort-static rr"]
    assert report.outcome == "passed" and report.chosen is not None and report.closest is None
    chosen = report.candidates[report.chosen]
    assert chosen.passed and chosen.verdict.startswith("chosen") and "branch_a" in chosen.keep_float
    assert all(not c.passed for c in report.candidates[:4])  # no candidate without float nodes could pass
    assert all(c.speedup is not None and math.isfinite(c.speedup) for c in report.candidates if c.stage == "screened")
    passing = [c for c in report.candidates if c.passed]
    tied = [c for c in passing if c.speedup >= max(c.speedup for c in passing) * (1 - select.TIE)]
    assert chosen in tied and chosen.excess == min(c.excess for c in tied)  # a speed tie goes to the more accurate
    variant = outcome.results.find("int8-search", "onnxruntime-cpu")
    assert variant.status == "ok" and variant.params["search.candidate"] == chosen.label
    assert variant.params["exclude_nodes"] == list(chosen.keep_float)
    assert outcome.gate.exit_code == EXIT_PASS
    assert read_results(outcome.results_path).search == report  # round trip through results.json
    kept = sorted(p.name for p in (outcome.run_dir / "models").iterdir() if "search" in p.name)
    side_files = ["int8-search.calibration.json"] if chosen.technique == "ort-static" else []  # its calibration
    assert kept == sorted(["int8-search.onnx", *side_files])  # only the chosen candidate's files are kept
    markdown = outcome.report_path.read_text()
    assert "## INT8 search" in markdown and chosen.label in markdown and "branch_a" in markdown
    assert "INT8 search" in (outcome.run_dir / "report.html").read_text()
    assert run_gate(recipe)[0].exit_code == EXIT_PASS  # `qbench gate` expects the searched variant


def test_unreachable_names_the_closest_candidate_and_what_it_would_need(tmp_path):
    """Two fragile nodes, nothing kept in float, a tight gate: no candidate passes."""
    _, outcome = _searched(
        tmp_path, {"techniques": ["ort-static"], "max_keep_float": 0}, fragile=("a", "b"),
        gate={"metric": "agreement", "max_drop": 0.01, "max_slice_drop": 0.01},
    )  # fmt: skip
    report = outcome.results.search
    assert report.outcome == "unreachable" and report.chosen is None
    closest = report.candidates[report.closest]
    nearness = [c.excess if c.excess is not None else c.screen_excess for c in report.candidates]
    assert closest.verdict.startswith("closest (unreachable)")
    assert (closest.excess or closest.screen_excess) == min(n for n in nearness if n is not None)
    assert "overall drop" in report.needed and "max_drop ≥" in report.needed
    variant = outcome.results.find("int8-search", "onnxruntime-cpu")
    assert any(f"closest: {closest.label}" in note for note in variant.notes)
    assert outcome.gate.exit_code == EXIT_BREACH
    assert f"closest: {closest.label}" in outcome.report_path.read_text()


def test_the_time_budget_stops_new_candidates(tmp_path):
    """A budget smaller than one candidate: the first runs, every later one is recorded as not tried; the first, the
    only one measured, is then judged on every evaluation row (its screening rows cannot say it fails)."""
    _, outcome = _searched(tmp_path, {"time_budget_s": 0.001}, fragile=())
    report = outcome.results.search
    stages = [c.stage for c in report.candidates]
    assert stages[0] == "evaluated" and set(stages[1:]) == {"skipped"} and len(stages) >= 4
    assert all(c.verdict == "not tried: time budget spent" for c in report.candidates[1:])
    assert report.budget_exhausted
    first = report.candidates[0]  # without a fragile node it passes: the report must say so, as the gate does
    assert first.passed and report.outcome == "passed" and report.chosen == 0 and outcome.gate.exit_code == EXIT_PASS
    saved = json.loads(outcome.results_path.read_text())["search"]
    assert saved["time_budget_s"] == 0.001 and saved["budget_exhausted"] is True
    (overrun,) = [note for note in report.notes if note.startswith("the search took ")]  # past 0.001 s, and says so
    assert "past its 0.001 s time budget" in overrun
    assert f"then past it, as the search's rules require: screening {first.label}" in overrun


def test_a_searched_variant_name_must_be_free(tmp_path):
    from qbench.errors import RecipeError

    path = write_fragile_project(tmp_path, [{"name": "int8-search", "precision": "int8", "calibrator": "minmax"}])
    raw = yaml.safe_load(path.read_text())
    raw["search"] = {}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(RecipeError, match="search.name: 'int8-search' is already a variant's name"):
        load_recipe(path)


def test_a_chosen_candidate_slower_than_fp32_is_said_so_in_the_report_and_the_variant_notes(tmp_path, monkeypatch):
    """Every candidate timed at half FP32's speed (INT8 kernels that do not pay off on the backend): the search still
    picks the fastest passing one, and says that FP32 is the faster choice."""
    from qbench.search import select

    monkeypatch.setattr(select, "speedup", lambda reference, candidate: 0.5)
    # and FP32's own timings steady: on a loaded machine their measured noise widened the margin past 0.5x
    monkeypatch.setattr(select, "timing_noise", lambda timings: 0.0)
    _, outcome = _searched(tmp_path, {"techniques": ["ort-dynamic"]}, fragile=())
    report = outcome.results.search
    assert report.outcome == "passed"
    assert any("0.50× FP32" in note and "FP32 (or FP16) is the faster choice" in note for note in report.notes)
    variant = outcome.results.find("int8-search", "onnxruntime-cpu")
    assert any("0.50× FP32" in note for note in variant.notes)
    assert "0.50× FP32" in outcome.report_path.read_text()


def test_each_screened_candidate_is_timed_beside_fp32(tmp_path, monkeypatch):
    """A candidate's speed-up pairs its timing with FP32 timed right after it (the same machine load), not with
    one FP32 timing from the search's start."""
    from qbench.search import run as search_run

    timed = []
    real_measure = search_run.measure

    def recording(backend, built, prepared, **options):
        if options.get("timing") is not None:
            timed.append(built.name)
        return real_measure(backend, built, prepared, **options)

    monkeypatch.setattr(search_run, "measure", recording)
    _, outcome = _searched(tmp_path, {"techniques": ["ort-dynamic", "ort-static"]}, fragile=())
    screened = [i for i, c in enumerate(outcome.results.search.candidates) if c.stage != "not applicable"]
    assert len(screened) >= 2
    candidates = [name for name in timed if name != "fp32"]
    for name in candidates[: len(screened)]:
        position = timed.index(name)
        assert timed[position + 1] == "fp32", timed  # FP32 timed right after each screened candidate


@pytest.mark.parametrize("estimate", [0.7, 3.1])
def test_a_single_finalist_is_retimed_so_its_speedup_is_not_one_noisy_estimate(monkeypatch, estimate):
    """A sub-millisecond model's few screening runs said 0.72x FP32 while the sweep measured 1.2-1.6x; a lucky
    estimate overstates it the same way: the lone finalist's speed-up comes from interleaved rounds."""
    from types import SimpleNamespace

    from qbench.results.schema import LatencyPoint, LatencyResult
    from qbench.results.search import CandidateRecord
    from qbench.search import run

    timed = []

    def fake_measure(backend, built, prepared, **kwargs):
        timed.append(built)
        p50 = 2.0 if built == "fp32" else 1.0  # interleaved rounds: the candidate is twice as fast
        point = LatencyPoint(batch_size=1, warmup=1, iterations=5, p50_ms=p50, p95_ms=p50, p99_ms=p50, mean_ms=p50,
                             items_per_s=1e3 / p50)  # fmt: skip
        return SimpleNamespace(result=SimpleNamespace(latency=LatencyResult(threads=1, session_create_ms=1.0,
                                                                            first_run_ms=1.0, points=(point,))))  # fmt: skip

    monkeypatch.setattr(run, "measure", fake_measure)
    search = object.__new__(run._Search)
    search.records = [CandidateRecord("static", "ort-static", speedup=estimate, passed=True)]
    search.spec = SimpleNamespace(finalists=2, time_budget_s=60)
    search.budget = Budget(60, lambda: 0.0, 2)  # its __init__, which sets it, is not run
    search.follows_batch = {}
    search.now, search.tie = (lambda: 0.0), (lambda: 0.05)
    search.fp32_built, search.built = "fp32", {0: "static"}
    search.backend = search.prepared = search.screen = search.timing = search.clock = None
    search.retime_finalists()
    assert timed == ["fp32", "static"] * RETIME_ROUNDS  # rounds that agree: no more are run
    assert search.records[0].speedup == pytest.approx(2.0)


def test_a_candidate_building_an_earlier_candidates_graph_is_not_measured_again(tmp_path, monkeypatch):
    """Every static candidate made to build its dynamic twin's graph: each is recorded as that twin's duplicate,
    and neither screened nor timed."""
    from qbench.search import run as search_run
    from qbench.search.candidates import Candidate

    real_build, real_measure = search_run.build_variant, search_run.measure

    def dynamic_instead(spec, ctx):
        twin = Candidate("ort-dynamic", {"reduce_range": spec.reduce_range}, tuple(spec.exclude_nodes))
        return real_build(twin.spec(spec.name), ctx)

    measured = []

    def recording(backend, built, prepared, **options):
        measured.append(built.name)
        return real_measure(backend, built, prepared, **options)

    monkeypatch.setattr(search_run, "build_variant", dynamic_instead)
    monkeypatch.setattr(search_run, "measure", recording)
    _, outcome = _searched(tmp_path, {"techniques": ["ort-dynamic", "ort-static"], "max_keep_float": 0})
    records = {c.label: c for c in outcome.results.search.candidates}
    assert records["ort-static"].stage == "duplicate" and records["ort-static"].verdict.startswith("same graph as ort-dynamic")
    assert "ort-static rr" not in records  # a duplicate is no base for a twin
    assert records["ort-dynamic"].stage in ("screened", "evaluated")
    labels = [c.label for c in outcome.results.search.candidates]
    assert f"int8-search-{labels.index('ort-static')}" not in measured  # built, never run


def test_keep_float_candidates_keep_only_nodes_their_base_quantized(tmp_path):
    """The ranking comes from a static build over every compute op; a base that left a node float gets candidates
    from the rest of the ranking (keeping that node float again would rebuild the base's graph)."""
    from types import SimpleNamespace

    from qbench.search import run as search_run
    from qbench.search.candidates import Candidate
    from qbench.variants import BuildContext, build_variant

    fragile_model(tmp_path / "model.onnx", ("a",))
    ctx = BuildContext(tmp_path / "model.onnx", tmp_path / "build", [])
    base = build_variant(Candidate("ort-dynamic", keep_float=("head",)).spec("base"), ctx)
    search = object.__new__(search_run._Search)
    search.ctx, search.built = SimpleNamespace(reference_path=tmp_path / "model.onnx"), {0: base}
    ranking = ["head", "branch_a", "mm1", "branch_b"]
    assert search.base_ranking(0, ranking, set(ranking)) == (["branch_a", "mm1", "branch_b"], 3)


@pytest.mark.parametrize(("fp32_timings", "evaluated"),
                         [([{1: 10.0}, {1: 10.2}], False), ([{1: 10.0}, {1: 12.0}], True)])
def test_a_candidate_screened_slower_is_still_evaluated_when_fp32s_own_timings_are_as_noisy(fp32_timings, evaluated):
    """Screened at 1.33x against a passing 1.46x: on a quiet machine (FP32 within 2 %) it cannot win and is not
    evaluated; when FP32's timings were 10 and 12 ms (an estimate's noise: twice 1/11, 18 %), the two estimates
    cannot rank them and it is."""
    from qbench.results.search import CandidateRecord
    from qbench.search import run

    search = object.__new__(run._Search)
    search.records = [CandidateRecord("dynamic", "ort-dynamic", speedup=1.46, stage="evaluated", passed=True,
                                      excess=0.4),
                      CandidateRecord("static", "ort-static", speedup=1.33, stage="screened",
                                      screen_excess=0.3)]  # fmt: skip
    search.fp32_timings = fp32_timings
    search.budget, search.refusal = Budget(60, lambda: 0.0, 3), lambda what, seconds, **_: None
    search.follows_batch = {}
    calls = []
    search.evaluate = calls.append
    search.evaluate_promising()
    assert calls == ([1] if evaluated else [])
    if not evaluated:
        assert search.records[1].verdict == "not evaluated: a candidate screened faster passed"


def test_a_candidate_that_fails_to_run_is_said_on_the_console_not_only_in_the_report(tmp_path, monkeypatch, caplog):
    import logging

    from qbench.search import run as search_run

    real_measure = search_run.measure

    def static_fails(backend, built, prepared, **options):
        measured = real_measure(backend, built, prepared, **options)
        if built.params.get("quant_format") == "QDQ":
            return dataclasses.replace(measured, result=dataclasses.replace(measured.result, status="failed",
                                                                          error="INVALID_GRAPH"))
        return measured

    monkeypatch.setattr(search_run, "measure", static_fails)
    caplog.set_level(logging.WARNING, logger="qbench")
    _, outcome = _searched(tmp_path, {"techniques": ["ort-static"], "max_keep_float": 0}, fragile=())
    record = outcome.results.search.candidates[0]
    assert record.stage == "failed" and record.verdict == "failed to run: INVALID_GRAPH" and record.build_seconds
    assert "ort-static: failed to run: INVALID_GRAPH" in caplog.text


def test_a_candidate_with_every_quantized_node_float_is_never_chosen(tmp_path):
    """ORT dynamic quantizes one node (the Gemm); keeping it float leaves a graph that is not FP32's bytes (the Gemm is
    a MatMul + Add) but computes in FP32, so it met a zero-tolerance gate that no INT8 candidate can: the search said
    'passed' and the gate exited 0. Now the ladder stops one node short of all, and the closest INT8 candidate is kept
    as unreachable."""
    _, outcome = _searched(tmp_path, {"techniques": ["ort-dynamic"]}, model=one_gemm_model,
                           gate={"metric": "agreement", "max_drop": 0.0, "max_slice_drop": 0.0})  # fmt: skip
    report = outcome.results.search
    assert report.outcome == "unreachable" and report.chosen is None and not any(c.passed for c in report.candidates)
    assert not any(c.keep_float for c in report.candidates)  # one node quantized: none can be kept float
    variant = outcome.results.find("int8-search", "onnxruntime-cpu")
    assert variant.params["search.outcome"] == "tolerance unreachable" and variant.params["quantized_nodes"] == 1
    assert outcome.gate.exit_code == EXIT_BREACH


def test_a_candidate_in_which_no_node_computes_in_int8_is_not_applicable(tmp_path, monkeypatch):
    """Whatever its bytes: every candidate here is built with the Gemm excluded, so ORT quantizes nothing, yet the graph
    differs from FP32's (the Gemm became MatMul + Add). Such a candidate is never measured, so it can neither pass nor
    be kept: the search keeps nothing, as for a model with nothing to quantize."""
    from qbench.search import run as search_run

    real = search_run.build_variant

    def gemm_excluded(spec, ctx):
        return real(spec.model_copy(update={"exclude_nodes": [*spec.exclude_nodes, "fc"]}), ctx)

    monkeypatch.setattr(search_run, "build_variant", gemm_excluded)
    _, outcome = _searched(tmp_path, {"techniques": ["ort-dynamic"]}, model=one_gemm_model,
                           gate={"metric": "agreement", "max_drop": 0.0, "max_slice_drop": 0.0})  # fmt: skip
    report = outcome.results.search
    assert [c.stage for c in report.candidates] == ["not applicable"]
    assert report.candidates[0].verdict == "nothing to quantize: no node computes in INT8"
    assert report.outcome == "nothing built" and report.chosen is None and report.closest is None
    assert outcome.results.find("int8-search", "onnxruntime-cpu").status == "failed"
    assert outcome.gate.exit_code == EXIT_UNUSABLE


@pytest.mark.parametrize(("fp32_timings", "flagged"),
                         [([{1: 10.0}, {1: 10.1}], True), ([{1: 10.0}, {1: 12.0}, {1: 8.0}], False)])
def test_slower_than_fp32_is_flagged_only_beyond_the_timing_noise_the_search_measured(fp32_timings, flagged):
    """A pick estimated at 0.85x FP32: on a quiet machine that is slower than FP32; when FP32's own timings were 8 to
    12 ms (an estimate's noise: 40 %) the estimate cannot say so, as the search's ranking already knew (a fixed 5 %
    margin flagged it, and the report then showed the sweep measuring the pick faster than FP32)."""
    from qbench.results.search import CandidateRecord
    from qbench.search import run, select

    search = object.__new__(run._Search)
    search.fp32_timings = fp32_timings
    record = CandidateRecord("dynamic", "ort-dynamic", speedup=0.85, stage="evaluated", passed=True, excess=0.4)
    assert bool(select.slower_than_reference(record, search.tie())) is flagged


def _one_tie_project(root, rows=400, *, lone_slice=False):
    """y = x @ W over two features, class by the sign of feature 0 (|x0| >= 1 on every row) except the first
    calibration row and the first evaluation row, x = [0, 1e-3]: its classes are 0 and 1e-3 apart, and INT8 activations
    (a scale of ~0.04 for the batch's range) read 1e-3 as 0, so every INT8 candidate flips that one row and no other."""
    root.mkdir(parents=True, exist_ok=True)
    weight = np.array([[1.0, -1.0], [0.0, 1.0]], dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], "one_tie",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(root / "model.onnx"))
    rng = np.random.default_rng(0)
    x = np.stack([rng.choice([-1.0, 1.0], size=2 * rows) * rng.uniform(1, 5, size=2 * rows), np.zeros(2 * rows)], 1)
    x[0] = x[rows] = [0.0, 1e-3]  # the first calibration row (kept apart to choose on) and evaluation row
    halves = ["first"] * (rows // 2) + ["second"] * (rows - rows // 2)
    pd.DataFrame({"x": list(x.astype(np.float32)), "split": ["calib"] * rows + ["eval"] * rows, "half": halves * 2,
                  "tie": (["tie"] + ["rest"] * (rows - 1)) * 2}).to_parquet(root / "data.parquet")  # fmt: skip
    recipe = {
        "name": "one-tie", "task": "classification", "model": {"path": "model.onnx"},
        "data": {"path": "data.parquet", "inputs": {"x": "x"},
                 "calibration": {"filter": {"split": "calib"}, "samples": rows},
                 "evaluation": {"filter": {"split": "eval"}, "batch_size": 50},
                 "slices": [{"by": "half"}, *([{"by": "tie"}] if lone_slice else [])]},
        "variants": [], "latency": {"batch_sizes": [1, 8], "warmup": 2, "iterations": 10, "threads": 1},
        "gate": {"metric": "agreement", "max_drop": 0.01, "max_slice_drop": 0.02, "unresolved": "note"},  # as _searched
        "search": {"techniques": ["ort-static"], "max_keep_float": 0},
        "tracking": {"uri": f"sqlite:///{(root / 'mlflow.db').as_posix()}"}, "output_dir": "reports",
    }  # fmt: skip
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return root / "recipe.yaml"


def test_one_changed_row_on_the_screen_does_not_dismiss_a_candidate_that_passes(tmp_path):
    """INT8 flips one of the 200 selection rows (half the 400 calibration rows, the other half fitted on: drop 0.005,
    tolerance 0.01; 0.01 on its slice, tolerance 0.02), and that row is among the 48 screening rows, where it is a
    drop of 1/48 (0.021, and 1/24 on its slice): the screen judged at full strength called the candidate not
    promising, skipped its full evaluation and went on to its 7-bit twin. One row on the screen is not evidence: the
    candidate is evaluated, passes and no twin is tried."""
    _, outcome = _searched_recipe(_one_tie_project(tmp_path))
    report = outcome.results.search
    first = report.candidates[0]
    print([(c.label, c.stage, c.screen_drop, c.screen_excess, c.drop, c.verdict) for c in report.candidates])
    assert first.screen_drop == pytest.approx(1 / 48, abs=0.005)  # the flipped row is on the screen
    assert report.selection_rows == 200 and first.drop == pytest.approx(1 / 200)
    assert first.passed and first.verdict.startswith("chosen")
    assert [c.label for c in report.candidates] == ["ort-static"]  # a passing base needs no 7-bit twin
    assert outcome.gate.exit_code == EXIT_PASS


def test_the_screen_discounts_one_row_of_a_share_metric_only():
    assert select.beyond_one_unit(1 / 3, 3) == 0.0 and select.beyond_one_unit(2 / 3, 3) == pytest.approx(1 / 3)
    assert select.beyond_one_unit(-0.1, 3) == -0.1 and math.isnan(select.beyond_one_unit(math.nan, 3))
    assert select.beyond_one_unit(0.2, 0) == 0.2  # not a share of rows: the drop as it is


def test_a_slice_the_screen_holds_whole_is_judged_at_full_strength(tmp_path):
    """The flipped row is a slice of its own: the screen holds all of it, so its drop of 1 there is the gate's
    verdict, not sampling noise; no row is discounted and the candidate is not promising."""
    _, outcome = _searched_recipe(_one_tie_project(tmp_path, lone_slice=True))
    report = outcome.results.search
    assert all(c.screen_excess == pytest.approx(1.0 / 0.02) for c in report.candidates)  # ort-static and its twin
    assert report.outcome == "unreachable" and report.candidates[report.closest].worst_slice == "tie=tie"
    assert outcome.gate.exit_code == EXIT_BREACH


def test_candidates_dismissed_against_a_lucky_screening_estimate_are_evaluated_after_the_retiming(tmp_path, monkeypatch):
    """ort-dynamic screens at 2.0x (a lucky estimate), passes, and ort-static, screened at 1.0x, is dismissed as
    slower; the re-timing puts ort-dynamic at 0.9x. ort-static was never evaluated and ort-dynamic was chosen at 0.9x:
    now ort-static is evaluated, passes, and the faster of the two after re-timing is chosen."""
    from qbench.search import run as search_run

    screened = iter([2.0, 1.0])
    # the estimate over both batch sizes (select.per_batch's one-batch ratios keep theirs)
    monkeypatch.setattr(select, "speedup",
                        lambda reference, candidate: next(screened, 1.0) if len(reference) > 1 else 1.0)
    monkeypatch.setattr(select, "timing_noise", lambda timings: 0.0)
    retimed = {"ort-dynamic": 0.9, "ort-static": 1.0}

    def retime(self):
        self.records = [r.with_(speedup=retimed[r.label]) if r.passed else r for r in self.records]

    monkeypatch.setattr(search_run._Search, "retime_finalists", retime)
    # timing_runs: a search of its own (the build store would serve another test's search of the same recipe)
    search = {"techniques": ["ort-dynamic", "ort-static"], "timing_runs": 4}
    _, outcome = _searched(tmp_path, search, fragile=())
    report = outcome.results.search
    print([(c.label, c.stage, c.speedup, c.verdict) for c in report.candidates])
    records = {c.label: c for c in report.candidates}
    assert records["ort-static"].passed and report.candidates[report.chosen].label == "ort-static"


def _screened_at(monkeypatch, speed, failing=lambda record: False) -> None:
    """Screened candidates timed at `speed(label)` (no noise, no re-timing); those `failing` says fail their screen."""
    from qbench.search import run as search_run

    real_screen = search_run._Search.screen_candidate

    def screen(self, candidate):
        index = real_screen(self, candidate)
        record = self.records[index]
        if record.stage == "screened" and failing(record):
            self.records[index] = record.with_(stage="failed", screen_excess=None, screen_drop=None, verdict="failed")
        elif record.stage == "screened":
            self.records[index] = record.with_(speedup=speed(record.label), speedups={})
        return index

    monkeypatch.setattr(search_run._Search, "screen_candidate", screen)
    monkeypatch.setattr(search_run._Search, "retime_finalists", lambda self: None)
    monkeypatch.setattr(select, "timing_noise", lambda timings: 0.0)


def test_a_slower_passing_candidate_does_not_stop_keep_float_on_a_faster_failing_one(tmp_path, monkeypatch):
    """SmoothQuant passes (it smooths the fragile branch) but is timed at 1.0x; ORT dynamic fails at 2.0x. Keeping the
    fragile node float makes ORT dynamic pass at 1.8x: the search must try it and choose it, not stop at SmoothQuant
    (keep-float candidates were tried only when nothing passed)."""
    _screened_at(monkeypatch, lambda label: 1.0 if label.startswith("smoothquant") else 1.8 if "float" in label
                 else 2.0)
    search = {"techniques": ["ort-dynamic", "smoothquant-dynamic"], "timing_runs": 3}
    _, outcome = _searched(tmp_path, search)
    report = outcome.results.search
    records = {c.label: c for c in report.candidates}
    assert records["smoothquant-dynamic a=auto"].passed and not records["ort-dynamic"].passed
    chosen = report.candidates[report.chosen]
    assert chosen.technique == "ort-dynamic" and "branch_a" in chosen.keep_float and chosen.passed
    assert outcome.gate.exit_code == EXIT_PASS


def test_keep_float_is_tried_on_every_failing_candidate_not_only_the_two_fastest(tmp_path, monkeypatch):
    """Keep-float candidates came from the two fastest failing candidates only, and which two followed timing noise:
    of three sweeps of one recipe, one rebuilt ORT static (7-bit) with a node float, which passed, and two rebuilt
    two others and reported the gate unreachable. Here keeping nodes float cannot rescue the two dynamic candidates
    (timed fastest); it rescues ORT static, timed third: the search must still find it."""
    _screened_at(monkeypatch, lambda label: 1.2 if "float" in label else 2.0 if label.startswith("ort-dynamic")
                 else 1.5,
                 failing=lambda record: bool(record.keep_float) and record.label.startswith("ort-dynamic"))
    _, outcome = _searched(tmp_path, {"techniques": ["ort-dynamic", "ort-static"], "timing_runs": 3})
    report = outcome.results.search
    assert not any(c.passed for c in report.candidates if not c.keep_float)
    assert any(c.stage == "failed" and c.label.startswith("ort-dynamic") for c in report.candidates)
    assert report.outcome == "passed" and report.chosen is not None
    chosen = report.candidates[report.chosen]
    assert chosen.technique == "ort-static" and "branch_a" in chosen.keep_float and chosen.passed
    assert outcome.gate.exit_code == EXIT_PASS


def test_a_search_whose_calibration_rows_are_all_zero_says_so(tmp_path, monkeypatch):
    """Calibration rows exported as zeros: every static candidate's input range was 0, so each left its nodes float
    (no scale can be formed) and quantized nothing. The search then failed with 'found nothing to quantize ... (no
    MatMul, Gemm or Conv with constant weights, e.g. a tree ensemble)', blaming a model that has a Gemm; it names the
    calibration instead."""
    from qbench.search import run as search_run

    real = search_run.build_variant

    def zero_calibration(spec, ctx):
        zeros = [{name: np.zeros_like(values) for name, values in batch.items()} for batch in ctx.calibration]
        return real(spec, dataclasses.replace(ctx, calibration=zeros))

    monkeypatch.setattr(search_run, "build_variant", zero_calibration)
    _, outcome = _searched(tmp_path, {"techniques": ["ort-static"]}, model=one_gemm_model)
    report = outcome.results.search
    assert report.candidates and all(c.stage == "not applicable" for c in report.candidates if c.stage != "skipped")
    assert all(select.NO_RANGE in c.verdict for c in report.candidates if c.stage == "not applicable")
    failed = outcome.results.find("int8-search", "onnxruntime-cpu")
    assert failed.status == "failed" and "no usable calibration range" in failed.error
    assert "tree ensemble" not in failed.error and "data.calibration" in failed.error
    assert outcome.gate.exit_code == EXIT_UNUSABLE


def test_a_full_disk_while_building_a_candidate_fails_the_search_rather_than_picking_another(tmp_path, monkeypatch):
    """A candidate that could not be written (a full disk) was recorded as a failed candidate and the search went on
    to pick another: a pick decided by the disk, not the gate. Now the searched variant fails, its job recorded as the
    machine's fault (which `--resume` runs again), and the gate exits 2."""
    import errno
    import os

    from qbench.execute.records import read_records
    from qbench.files import writing_file
    from qbench.search import run as search_run

    real_build = search_run.build_variant

    def full_on_the_first(spec, ctx):
        if spec.name.endswith("-0"):
            with writing_file(ctx.workdir / f"{spec.name}.onnx", "the model"):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_build(spec, ctx)

    monkeypatch.setattr(search_run, "build_variant", full_on_the_first)
    recipe, outcome = _searched(tmp_path, {"techniques": ["ort-dynamic", "ort-static"]})
    variant = outcome.results.find("int8-search", "onnxruntime-cpu")
    assert variant.status == "failed" and variant.error.endswith("cannot write the model: No space left on device")
    records = read_records(outcome.run_dir).values()
    [record] = [r for r in records if r.job.startswith("build") and "int8-search" in r.job]
    assert record.environment == "no space left on device"
    assert outcome.gate.exit_code == EXIT_UNUSABLE


def test_a_spent_budget_still_tries_candidates_until_one_is_measured(tmp_path, monkeypatch):
    """The first candidate fails to build and the budget is already spent: the next one is tried, so even a tiny budget
    yields a variant. Before, the first *started* candidate was the one allowed: every other was 'not tried: time
    budget spent', no variant was kept, and the message named only the failed build, as if no candidate could be
    built."""
    from qbench.search import run as search_run

    real_build = search_run.build_variant

    def broken_first(spec, ctx):
        if spec.name.endswith("-0"):
            raise RuntimeError("quantizer crashed")
        return real_build(spec, ctx)

    monkeypatch.setattr(search_run, "build_variant", broken_first)
    _, outcome = _searched(tmp_path, {"time_budget_s": 0.001, "techniques": ["ort-dynamic", "ort-static"]}, fragile=())
    report = outcome.results.search
    stages = [c.stage for c in report.candidates]
    assert stages[:2] == ["failed", "evaluated"] and set(stages[2:]) == {"skipped"}
    assert report.chosen == 1 and report.budget_exhausted and outcome.gate.exit_code == EXIT_PASS

