"""The search's decisions on hand-made figures: excess, speed-up, evaluation order, choice, closest, what is needed."""

from __future__ import annotations

import math
import statistics

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.results.search import CandidateRecord
from qbench.search import select
from qbench.variants.integer_kernels import float_weighted_layers


def _record(label: str, *, speedup: float | None = None, screen: float | None = None, excess: float | None = None,
            passed: bool | None = None, stage: str = "screened", keep_float: tuple[str, ...] = (),
            **more) -> CandidateRecord:  # fmt: skip
    return CandidateRecord(label, "ort-dynamic", speedup=speedup, screen_excess=screen, excess=excess, passed=passed,
                           stage=stage, keep_float=keep_float, **more)  # fmt: skip


def test_excess_is_the_largest_drop_over_tolerance():
    assert select.excess([(0.004, 0.005), (0.012, 0.01), (0.002, 0.01)]) == pytest.approx(1.2)
    assert select.excess([(-0.003, 0.005)]) == 0.0  # better than FP32
    assert select.excess([(0.0, 0.0)]) == 0.0 and select.excess([(0.001, 0.0)]) == math.inf
    assert select.excess([(math.nan, 0.01)]) == math.inf
    assert select.excess([]) == math.inf


def test_speedup_is_the_geometric_mean_over_shared_batch_sizes():
    # 10/5 = 2 at batch 1, 100/80 = 1.25 at batch 16: sqrt(2.5)
    assert select.speedup({1: 10.0, 16: 100.0}, {1: 5.0, 16: 80.0}) == pytest.approx(math.sqrt(2.5))
    assert select.speedup({1: 10.0, 16: 100.0}, {16: 50.0}) == pytest.approx(2.0)
    assert math.isnan(select.speedup({1: 10.0}, {}))


def test_evaluation_order_takes_promising_candidates_fastest_first():
    records = [
        _record("slow-good", speedup=1.2, screen=0.3),
        _record("fast-bad", speedup=1.9, screen=3.0),  # beyond the screening slack
        _record("fast-near", speedup=1.6, screen=1.4),
        _record("fastest", speedup=1.7, screen=0.9),
        _record("done", speedup=2.0, screen=0.1, stage="evaluated", passed=True),  # already evaluated
        _record("failed", stage="failed"),
    ]
    assert select.evaluation_order(records) == [3, 2, 0]
    assert select.evaluation_order(records, slack=1.0) == [3, 0]


def test_may_win_allows_ties_within_the_noise_margin():
    best = _record("best", speedup=1.60, passed=True)
    assert select.may_win(_record("a", speedup=1.55), best)  # within 5 %
    assert not select.may_win(_record("b", speedup=1.50), best)
    assert select.may_win(_record("c", speedup=0.5), None)


def test_choose_is_the_fastest_passing_candidate():
    records = [
        _record("accurate-slow", speedup=1.2, excess=0.2, passed=True),
        _record("fast-fail", speedup=1.9, excess=1.3, passed=False),
        _record("fast-pass", speedup=1.6, excess=0.9, passed=True),
        _record("unevaluated", speedup=2.5, screen=0.5),
    ]
    assert select.choose(records) == 2
    assert select.choose(records[:2] + records[3:]) == 0
    assert select.choose([records[1], records[3]]) is None


def test_choose_breaks_a_speed_tie_by_accuracy_then_float_nodes_then_order_not_by_noise():
    records = [
        _record("fastest-by-noise", speedup=1.60, excess=0.9, passed=True),
        _record("tied-accurate", speedup=1.55, excess=0.3, passed=True),  # within 5 % of 1.60
        _record("slower-most-accurate", speedup=1.40, excess=0.1, passed=True),  # beyond the margin
    ]
    assert select.choose(records) == 1
    assert select.fastest_passing(records) == 0
    # the same figures with the noise swapped between the tied two: the same pick
    swapped = [records[0].with_(speedup=1.55), records[1].with_(speedup=1.60), records[2]]
    assert select.choose(swapped) == 1
    # equal excess: fewer float nodes, then the earlier candidate
    even = [_record("kf", speedup=1.6, excess=0.5, passed=True, keep_float=("n1",)),
            _record("plain", speedup=1.58, excess=0.5, passed=True),
            _record("later", speedup=1.59, excess=0.5, passed=True)]
    assert select.choose(even) == 1
    # no speeds
    assert select.choose([_record("x", excess=0.5, passed=True), _record("y", excess=0.2, passed=True)]) == 1


def test_closest_prefers_full_evaluation_figures_then_speed():
    records = [
        _record("screen-only", speedup=1.5, screen=1.1),
        _record("evaluated", speedup=1.3, screen=0.8, excess=1.3, passed=False),
        _record("tie-slow", speedup=1.1, excess=1.1, passed=False),
        _record("unmeasured", stage="skipped"),
    ]
    assert select.closest(records) == 2  # 1.1 (screen) ties 1.1 (full): the one judged on every row wins
    assert select.closest(records[1:]) == 1  # 1.1 < 1.3
    assert select.closest([records[0], records[1]]) == 0  # 1.1 < 1.3, screening figure or not
    assert select.closest([records[3]]) is None


def test_against_a_zero_tolerance_the_smallest_drop_is_closest_and_every_measured_candidate_may_be_a_base():
    """max_drop 0: every positive drop is an infinite excess, yet the candidates were measured and differ."""
    inf = math.inf
    records = [
        _record("far", speedup=1.6, screen=inf, screen_drop=0.04),
        _record("near", speedup=1.2, screen=inf, screen_drop=0.01),
        _record("evaluated", speedup=1.3, excess=inf, passed=False, drop=0.02, worst_slice="s", worst_slice_drop=0.03),
        _record("broken", speedup=1.9, screen=inf, screen_drop=math.nan),  # an unknown drop is no measurement
    ]
    assert select.closest(records) == 2  # judged on every row: its figures beat a screening estimate
    assert select.closest(records[:2]) == 1  # between screenings, the smaller drop
    assert select.keep_float_bases(records) == [0, 2, 1]
    assert select.closest([records[3]]) is None and select.keep_float_bases([records[3]]) == []


def test_keep_float_bases_are_the_fastest_failing_candidates_without_float_nodes():
    records = [
        _record("a", speedup=1.4, screen=2.0),
        _record("b", speedup=1.8, screen=9.0),
        _record("passed", speedup=1.0, excess=0.5, passed=True),  # slower than the bases: they may still win
        _record("kept", speedup=1.9, screen=1.2, keep_float=("n1",)),
        _record("c", speedup=1.1, screen=1.5),
        _record("skipped", stage="skipped"),
    ]
    assert select.keep_float_bases(records) == [1, 0, 4]  # every one, not the two fastest (timing noise picked them)


def test_a_slower_passing_candidate_leaves_keep_float_to_the_failing_ones_that_may_still_beat_it():
    """A slow candidate passing must not end the search for a faster one: only failing candidates that cannot beat
    the fastest passing one (within the tie margin) are no bases."""
    records = [
        _record("slow-pass", speedup=0.9, excess=0.1, passed=True),
        _record("fast-fail", speedup=1.3, excess=1.2, passed=False),
        _record("tied-fail", speedup=0.88, screen=2.0),  # within 5 % of the passing one: may still win
        _record("slower-fail", speedup=0.8, screen=1.1),
    ]
    assert select.keep_float_bases(records) == [1, 2]
    assert select.keep_float_bases(records, tie=0.2) == [1, 2, 3]  # a noisier machine widens the margin


def test_needed_names_the_gaps_and_what_would_close_them():
    record = _record("sq", speedup=1.6, excess=1.24, passed=False, drop=0.0062, worst_slice="topic=law",
                     worst_slice_drop=0.012)  # fmt: skip
    text = select.needed(record, 0.005, 0.01, budget_exhausted=True, keep_float_exhausted=True)
    assert "overall drop 0.0062 > 0.005 (cut it by 19%)" in text
    assert "topic=law drop 0.0120 > 0.01 (cut it by 17%)" in text
    assert "search.max_keep_float" in text and "search.time_budget_s" in text
    assert "max_drop ≥ 0.0062" in text and "max_slice_drop ≥ 0.0120" in text
    quiet = select.needed(record, 0.005, 0.02, budget_exhausted=False, keep_float_exhausted=False)
    assert "topic=law" not in quiet and "time_budget" not in quiet and "max_keep_float" not in quiet


def test_needed_shows_a_drop_just_over_a_tight_tolerance_as_a_different_figure():
    """A drop of 0.00012 against max_drop 5e-05 (a kl_mean gate) read 'overall drop 0.0001 > 5e-05' at 4 decimals."""
    record = _record("sq", speedup=1.6, excess=1.4, passed=False, drop=0.00012, worst_slice="topic=law",
                     worst_slice_drop=0.000104)  # fmt: skip
    text = select.needed(record, 0.00005, 0.0001, budget_exhausted=False, keep_float_exhausted=False)
    assert "overall drop 0.00012 > 5e-05" in text and "topic=law drop 0.000104 > 0.0001" in text
    assert "max_drop ≥ 0.00012" in text and "max_slice_drop ≥ 0.000104" in text


@pytest.mark.parametrize(("drop", "cut"), [(0.5, "99.8%"), (10.0, "99.99%"), (0.0050001, "0.002%")])
def test_needed_never_reads_100_percent_for_less_or_0_percent_for_more(drop: float, cut: str) -> None:
    """A drop of 0.5 against max_drop 0.001 needs a 99.8 % cut: the text read "cut it by 100%"."""
    record = _record("sq", speedup=1.6, excess=1.4, passed=False, drop=drop)
    assert f"(cut it by {cut})" in select.needed(record, 0.001 if drop != 0.0050001 else 0.005, 1.0,
                                                 budget_exhausted=False, keep_float_exhausted=False)  # fmt: skip


def test_slower_than_reference_flags_a_choice_that_does_not_beat_fp32():
    assert "0.62× FP32" in select.slower_than_reference(_record("conv-int8", speedup=0.62, passed=True))
    assert select.slower_than_reference(_record("tie", speedup=0.97, passed=True)) is None  # within the noise margin
    assert select.slower_than_reference(_record("fast", speedup=1.4, passed=True)) is None
    assert select.slower_than_reference(_record("untimed", speedup=None, passed=True)) is None


def test_why_none_tells_nothing_to_quantize_from_candidates_that_failed():
    na = _record("ort-dynamic", stage="not applicable", verdict="nothing to quantize: the graph is FP32's")
    skipped = _record("ort-static", stage="skipped", verdict="not tried: time budget spent")
    assert "found nothing to quantize" in select.why_none([na, skipped])
    # the search's techniques quantize MatMul/Gemm/Conv; static INT8 quantized a GaussianNB's Add and Mul (and moved
    # its accuracy) in the sweep that said "there is no INT8 variant of this model"
    assert "the search has no INT8 variant of this model (a static INT8 variant may still quantize its elementwise" \
        in select.why_none([na, skipped])
    broken = _record("smoothquant-static a=auto", stage="failed", verdict="build failed: no calibration rows")
    reason = select.why_none([na, broken])
    assert "could not build and run any candidate" in reason and "smoothquant-static a=auto: build failed" in reason


def test_timing_noise_is_twice_the_median_deviation_from_the_median_over_shared_batch_sizes():
    # geometric means over batch 1 and 16: sqrt(4 * 100) = 20, sqrt(4 * 144) = 24, sqrt(9 * 64) = 24, 22 (4 * 121)
    timings = [{1: 4.0, 16: 100.0}, {1: 4.0, 16: 144.0, 32: 1.0}, {1: 9.0, 16: 64.0}, {1: 4.0, 16: 121.0}]
    # median 23; deviations 3/23, 1/23, 1/23, 1/23: median 1/23, twice that
    assert select.timing_noise(timings) == pytest.approx(2 / 23)
    # one outlier (a pause during one timing) does not widen it: 10, 10.2, 10.1, 30 -> median 10.15
    outlier = [{1: 10.0}, {1: 10.2}, {1: 10.1}, {1: 30.0}]
    assert select.timing_noise(outlier) == pytest.approx(2 * statistics.median([0.15, 0.05, 0.05, 19.85]) / 10.15)
    assert select.timing_noise(timings[:1]) == 0.0 and select.timing_noise([]) == 0.0
    assert select.timing_noise([{1: 5.0}, {16: 5.0}]) == 0.0  # no batch size in common: nothing to compare


def test_slower_than_fp32_is_judged_per_batch_size():
    """A GRU model's pick: 0.72x FP32 at batch 1, 1.05x at batch 32, 0.87x as a geometric mean. FP32 is the faster
    choice at batch 1 only; the note said so for every batch size."""
    mixed = CandidateRecord("d", "ort-dynamic", speedup=0.87, speedups={"b1": 0.72, "b32": 1.05}, passed=True)
    note = select.slower_than_reference(mixed)
    assert note is not None and "batch 1 (0.72×)" in note and "batch 32" not in note and "no INT8 candidate" not in note
    slower = CandidateRecord("d", "ort-dynamic", speedup=0.7, speedups={"b1": 0.72, "b32": 0.68}, passed=True)
    assert "no INT8 candidate beat FP32" in select.slower_than_reference(slower)
    assert select.slower_than_reference(CandidateRecord("d", "ort-dynamic", speedup=1.2, speedups={"b1": 0.97})) is None
    assert select.per_batch({1: 2.0, 8: 4.0}, {1: 1.0, 8: 0.0, 16: 1.0}) == {"b1": 2.0}


def test_why_none_names_the_layers_holding_the_weights_when_the_graph_has_them():
    na = [CandidateRecord(t, t, stage="not applicable") for t in ("ort-dynamic", "ort-static")]
    said = select.why_none(na, {"GRU": 2})
    assert "its weights are in 2 GRU" in said and "(ort-dynamic, ort-static)" in said
    assert "e.g. a tree ensemble" in select.why_none(na, {})


def test_linear_layers_inside_an_if_are_where_the_weights_are_left_float():
    """An optimum merged decoder: an If on a `use_cache_branch` input picks the with-past or the without-past graph,
    whose Linears read the main graph's float weights by name. The quantizers never enter the branches, so the INT8
    search's 'nothing to quantize' must name those layers: it said 'no MatMul, Gemm or Conv with constant weights,
    e.g. a tree ensemble' of a GPT-2 with 16 Gemm and 2 MatMul in its branches."""
    rng = np.random.default_rng(0)
    weights = {"w": rng.normal(size=(4, 4)).astype(np.float32), "b": rng.normal(size=4).astype(np.float32)}
    out = helper.make_tensor_value_info

    def branch(name: str, linear: onnx.NodeProto) -> onnx.GraphProto:
        return helper.make_graph([linear], name, [], [out(linear.output[0], TensorProto.FLOAT, ["n", 4])])

    then = branch("with_past", helper.make_node("Gemm", ["x", "w", "b"], ["yt"], name="gemm"))
    other = branch("no_past", helper.make_node("MatMul", ["x", "w"], ["ye"], name="matmul"))
    graph = helper.make_graph(
        [helper.make_node("If", ["use_cache_branch"], ["y"], then_branch=then, else_branch=other, name="if")], "merged",
        [out("x", TensorProto.FLOAT, ["n", 4]), out("use_cache_branch", TensorProto.BOOL, [1])],
        [out("y", TensorProto.FLOAT, ["n", 4])],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    layers = float_weighted_layers(model)
    assert layers == {"Gemm (inside If/Loop/Scan)": 1, "MatMul (inside If/Loop/Scan)": 1}
    said = select.why_none([CandidateRecord(t, t, stage="not applicable") for t in ("ort-dynamic", "ort-static")],
                           layers)  # fmt: skip
    assert "its weights are in 1 Gemm (inside If/Loop/Scan), 1 MatMul (inside If/Loop/Scan)" in said
    assert "tree ensemble" not in said and "decoder_with_past_model.onnx" in said




def test_linear_layers_computing_in_float64_are_where_the_weights_are_left_float():
    """A scikit-learn MLP converted with double inputs: every MatMul reads a float64 weight, which ONNX Runtime's
    quantizers leave as it is. The search said 'no MatMul, Gemm or Conv with constant weights, e.g. a tree ensemble';
    a float32 layer beside them is no such layer."""
    rng = np.random.default_rng(0)
    out = helper.make_tensor_value_info
    weights = [numpy_helper.from_array(rng.normal(size=(4, 4)), "w_double"),
               numpy_helper.from_array(rng.normal(size=(4, 2)).astype(np.float32), "w_float")]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w_double"], ["h"]),
             helper.make_node("Cast", ["h"], ["hf"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["hf", "w_float"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "mixed", [out("x", TensorProto.DOUBLE, ["n", 4])],
                              [out("y", TensorProto.FLOAT, ["n", 2])], weights)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    layers = float_weighted_layers(model)
    assert layers == {"MatMul (float64)": 1}
    records = [CandidateRecord(t, t, stage="not applicable") for t in ("ort-dynamic", "ort-static")]
    said = select.why_none(records, layers)
    assert "its weights are in 1 MatMul (float64)" in said and "FloatTensorType" in said and "tree ensemble" not in said
def test_evaluation_order_puts_a_screen_near_the_gate_after_one_clearing_it_at_a_similar_speed():
    """A candidate screened a shade faster but only within the slack (excess over 1) waits for one that cleared the
    gate within the tie of its speed; a clearly faster risky candidate still goes first."""
    records = [
        _record("risky-fast", speedup=2.12, screen=1.3),
        _record("clear", speedup=2.05, screen=0.4),  # within 5 % of 2.12
        _record("risky-much-faster", speedup=2.6, screen=1.4),
        _record("clear-slower", speedup=1.7, screen=0.2),
        _record("certain-fail", speedup=3.0, screen=0.9, failure_certain="certain to fail after 8 of 40 rows"),
    ]
    assert select.evaluation_order(records) == [2, 1, 0, 3]
    # a wider tie (the noise the search measured): the clear one goes before the much faster risky one too
    assert select.evaluation_order(records, tie=0.25) == [1, 2, 3, 0]
    # all near the gate at a similar speed: fastest first, then the smaller excess
    near = [_record("a", speedup=2.0, screen=1.2), _record("b", speedup=2.0, screen=1.1),
            _record("c", speedup=2.05, screen=1.4)]  # fmt: skip
    assert select.evaluation_order(near) == [2, 1, 0]


def test_evaluation_order_takes_every_promising_candidate_whatever_the_tie():
    """The noise a search measures from two FP32 timings can exceed 100 % (one timed during a pause at 3x the other):
    a candidate without a speed-up (its timings not finite) is still taken, not an IndexError that ended the search."""
    records = [_record("untimed", speedup=math.nan, screen=0.5), _record("timed", speedup=1.5, screen=0.8)]
    assert select.evaluation_order(records, tie=1.2) == [1, 0]
    assert select.evaluation_order(records[:1], tie=1.0) == [0]


def test_the_report_says_why_a_pick_timed_a_shade_slower_was_kept():
    records = [
        _record("fast-thin", speedup=1.62, excess=0.9, passed=True),
        _record("tied-clear", speedup=1.58, excess=0.3, passed=True),
        _record("slow", speedup=1.2, excess=0.1, passed=True),
    ]
    chosen = select.choose(records)
    assert chosen == 1
    assert select.tie_note(records, chosen) == (
        "tied-clear (1.58×) was chosen over fast-thin (1.62×): within the 5% tie, where timings do not say which is "
        "faster, the pick goes to the larger accuracy margin (largest drop / tolerance 0.30 against 0.90)")
    assert select.tie_note(records[1:], select.choose(records[1:])) is None  # the pick is the fastest: nothing to say
    even = [_record("kf", speedup=1.62, excess=0.5, passed=True, keep_float=("n1",)),
            _record("plain", speedup=1.6, excess=0.5, passed=True)]
    assert select.tie_note(even, select.choose(even)).endswith("the pick goes to fewer float nodes")
