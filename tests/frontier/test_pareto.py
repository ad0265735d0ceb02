"""The latency–accuracy frontier: Pareto sets on hand-built points."""

from __future__ import annotations

import dataclasses
import math

import pytest
from sweep_factory import make_latency, make_sweep, make_variant

from qbench.errors import QbenchError
from qbench.frontier.pareto import (
    compute_frontier,
    gate_threshold,
    mixed_timing_machines,
    slower_than_reference,
    slower_than_reference_notes,
    speedup,
)
from qbench.frontier.svg import panel_svg
from qbench.recipe.spec import GateSpec
from qbench.report.frontier import frontier_text
from qbench.results.schema import AccuracyResult, SliceMetrics, VariantResult


def point(name: str, p50_ms: float, value: float, *, metric: str = "accuracy", backend: str = "cpu",
          status: str = "ok", batch_sizes: tuple[int, ...] = (1,)) -> VariantResult:  # fmt: skip
    """A variant with one overall metric and the same p50 (scaled by batch size) at each batch size."""
    overall = SliceMetrics("overall", 100, {metric: value})
    return VariantResult(
        variant=name, backend=backend, precision="int8", status=status,
        accuracy=AccuracyResult(rows=100, nonfinite_outputs=0, overall=overall),
        latency=make_latency({bs: p50_ms * bs for bs in batch_sizes}),
    )  # fmt: skip


def names(frontier: tuple) -> list[str]:
    return [p.variant for p in frontier]


def test_dominated_point_is_left_out() -> None:
    variants = [point("fast", 1.0, 0.90), point("accurate", 3.0, 0.97), point("dominated", 2.0, 0.89)]
    assert names(compute_frontier(variants, "accuracy")) == ["fast", "accurate"]


def test_identical_points_both_stay_in_name_order() -> None:
    variants = [point("zeta", 1.0, 0.95), point("alpha", 1.0, 0.95), point("slow", 2.0, 0.95)]
    assert names(compute_frontier(variants, "accuracy")) == ["alpha", "zeta"]


def test_identical_models_are_one_point_whatever_their_timing_noise() -> None:
    same = "ab" * 32
    twin_a = dataclasses.replace(point("twin-a", 1.0, 0.94), model_sha256=same)
    twin_b = dataclasses.replace(point("twin-b", 0.5, 0.94), model_sha256=same)  # the same graph, timed luckier
    other = dataclasses.replace(point("other", 0.8, 0.94), model_sha256="cd" * 32)
    frontier = compute_frontier([twin_b, other, twin_a], "accuracy")
    # alone, twin-b (0.5 ms) would beat other (0.8 ms) and twin-a (1.0 ms); as one model both twins
    # sit at the median 0.75 ms, which beats other, and they are listed by name
    assert names(frontier) == ["twin-a", "twin-b"]
    assert [p.p50_ms for p in frontier] == [0.75, 0.75]


def test_identical_models_share_the_worst_metric_and_unknown_digests_stay_apart() -> None:
    same = "ef" * 32
    lucky = dataclasses.replace(point("lucky", 1.0, 0.96), model_sha256=same)
    plain = dataclasses.replace(point("plain", 1.0, 0.94), model_sha256=same)
    rival = point("rival", 1.0, 0.95)  # no digest (an older results file): never merged
    assert names(compute_frontier([lucky, plain, rival], "accuracy")) == ["rival"]
    undigested = [point("a", 1.0, 0.95), point("b", 2.0, 0.95)]
    assert names(compute_frontier(undigested, "accuracy")) == ["a"]


def _spread(variant: VariantResult, spread: float) -> VariantResult:
    points = tuple(dataclasses.replace(p, spread=spread) for p in variant.latency.points)
    return dataclasses.replace(variant, latency=dataclasses.replace(variant.latency, points=points))


def test_a_p50_within_the_timing_noise_is_the_same_speed() -> None:
    """An A/A variant (FP32's graph re-saved) timed 3 % below FP32 is as fast, not faster: it must not push FP32 off
    the frontier; a variant as fast within the noise but less accurate is dominated; faster beyond it still wins."""
    fp32, same = point("fp32", 1.0, 0.95), point("fp32-resaved", 0.97, 0.95)
    assert names(compute_frontier([fp32, same], "accuracy")) == ["fp32-resaved", "fp32"]
    assert names(compute_frontier([fp32, point("int8", 0.96, 0.94)], "accuracy")) == ["fp32"]
    assert names(compute_frontier([fp32, point("int8", 0.94, 0.95)], "accuracy")) == ["int8"]
    # its timing windows spread 20 %: 0.85 ms is within that noise of 1.0 ms, 0.7 ms is not
    assert names(compute_frontier([fp32, _spread(point("int8", 0.85, 0.95), 0.2)], "accuracy")) == ["int8", "fp32"]
    assert names(compute_frontier([_spread(fp32, 0.2), point("int8", 0.7, 0.95)], "accuracy")) == ["int8"]


def test_equal_latency_keeps_only_the_better_metric() -> None:
    variants = [point("worse", 1.0, 0.90), point("better", 1.0, 0.93)]
    assert names(compute_frontier(variants, "accuracy")) == ["better"]


def test_failed_and_nan_variants_take_no_part() -> None:
    variants = [
        point("ok", 2.0, 0.90),
        point("failed", 0.5, 0.99, status="failed"),  # would dominate if it counted
        point("nan", 0.5, math.nan),
    ]
    assert names(compute_frontier(variants, "accuracy")) == ["ok"]


def test_lower_is_better_metric_flips_the_direction() -> None:
    metric = "max_abs_error"
    variants = [point("fp32", 3.0, 0.0, metric=metric), point("int8", 1.0, 0.4, metric=metric),
                point("bad_int8", 1.5, 0.9, metric=metric)]  # fmt: skip
    frontier = compute_frontier(variants, metric)
    assert names(frontier) == ["int8", "fp32"]
    assert [p.metric for p in frontier] == [0.4, 0.0]


def test_frontier_is_per_backend_and_batch_size_and_sorted() -> None:
    variants = [
        point("a", 1.0, 0.90, backend="gpu", batch_sizes=(1, 8)),
        point("b", 2.0, 0.95, backend="gpu", batch_sizes=(1, 8)),
        point("a", 5.0, 0.90, backend="cpu", batch_sizes=(1, 8)),  # slower on cpu, but alone there with b
        point("b", 4.0, 0.95, backend="cpu", batch_sizes=(1, 8)),
    ]
    frontier = compute_frontier(variants, "accuracy")
    keys = [(p.backend, p.batch_size, p.variant) for p in frontier]
    assert keys == [
        ("cpu", 1, "b"), ("cpu", 8, "b"), ("gpu", 1, "a"), ("gpu", 1, "b"), ("gpu", 8, "a"), ("gpu", 8, "b"),
    ]  # fmt: skip
    assert [p.p50_ms for p in frontier if p.backend == "gpu" and p.batch_size == 8] == [8.0, 16.0]


def test_unknown_metric_is_a_user_error() -> None:
    with pytest.raises(QbenchError, match="did you mean 'accuracy'"):
        compute_frontier([point("a", 1.0, 0.9)], "acuracy")


def test_gate_threshold_follows_the_metric_direction() -> None:
    results = make_sweep()
    reference = results.find("fp32", "onnxruntime-cpu").accuracy.overall.metrics["accuracy"]
    assert gate_threshold(results, GateSpec(max_drop=0.01)) == pytest.approx(reference - 0.01)
    lower = make_sweep([point("fp32", 1.0, 0.2, metric="kl_mean"), point("int8", 0.5, 0.3, metric="kl_mean")],
                       gate_metric="kl_mean")  # fmt: skip
    assert gate_threshold(lower, GateSpec(metric="kl_mean", max_drop=0.05)) == pytest.approx(0.25)
    no_reference = make_sweep([make_variant("fp32", "fp32", error="boom"), make_variant("int8", "int8")])
    assert gate_threshold(no_reference, GateSpec(max_drop=0.01)) is None


def test_speedup_is_reference_p50_over_variant_p50() -> None:
    results = make_sweep()
    int8 = results.find("int8_minmax", "onnxruntime-cpu")
    fp32 = results.find("fp32", "onnxruntime-cpu")
    assert speedup(results, int8, 32) == pytest.approx(fp32.latency.at(32).p50_ms / int8.latency.at(32).p50_ms)
    assert math.isnan(speedup(results, int8, 64))  # batch size not measured
    assert math.isnan(speedup(results, results.find("int8_dynamic", "onnxruntime-cpu"), 1))


def _timed_on(results, machines: dict[str, dict]):
    """`results` with each named variant's latency recorded on the given machine."""
    variants = [dataclasses.replace(v, latency=dataclasses.replace(v.latency, machine=machines[v.variant]))
                if v.variant in machines and v.latency else v for v in results.variants]  # fmt: skip
    return dataclasses.replace(results, variants=tuple(variants))


XEON = {"host": "node-1", "cpu": "Intel Xeon 8375C", "cpus": 8, "arch": "x86_64"}
EPYC = {"host": "node-2", "cpu": "AMD EPYC 7B13", "cpus": 8, "arch": "x86_64"}


def test_no_speedup_between_timings_on_machines_of_different_kinds() -> None:
    """On a cluster FP32 may be timed on one node and INT8 on another: that ratio compares machines."""
    results = make_sweep()
    twin_xeon = {**XEON, "host": "node-3"}  # another host of the same kind compares
    mixed = _timed_on(results, {"fp32": XEON, "int8_minmax": EPYC, "fp16": twin_xeon})
    assert math.isnan(speedup(mixed, mixed.find("int8_minmax", "onnxruntime-cpu"), 32))
    fp16 = mixed.find("fp16", "onnxruntime-cpu")
    assert speedup(mixed, fp16, 32) == pytest.approx(speedup(results, results.find("fp16", "onnxruntime-cpu"), 32))
    fewer_cpus = _timed_on(results, {"fp32": XEON, "int8_minmax": {**XEON, "cpus": 2}})
    assert math.isnan(speedup(fewer_cpus, fewer_cpus.find("int8_minmax", "onnxruntime-cpu"), 32))
    unrecorded = _timed_on(results, {"fp32": XEON})  # results written before qbench recorded machines
    assert math.isfinite(speedup(unrecorded, unrecorded.find("int8_minmax", "onnxruntime-cpu"), 32))


def test_a_backend_timed_on_several_kinds_of_machine_is_named_with_its_variants() -> None:
    results = make_sweep()
    assert mixed_timing_machines(_timed_on(results, {"fp32": XEON, "int8_minmax": {**XEON, "host": "b"}})) == []
    (note,) = mixed_timing_machines(_timed_on(results, {"fp32": XEON, "fp16": XEON, "int8_minmax": EPYC}))
    assert note.startswith("onnxruntime-cpu timed its variants on 2 kinds of machine (fp32, fp16 on Intel Xeon 8375C "
                           "x8 x86_64; int8_minmax on AMD EPYC 7B13 x8 x86_64): ")  # fmt: skip


def test_a_backend_timed_on_two_kinds_of_machine_has_one_frontier_per_kind_never_one_across_them() -> None:
    """A cluster timed FP32 and FP16 on a fast node and INT8 (faster than both there) on a slow one: one frontier
    over all three would drop INT8 for FP32's lower p50, a comparison of the nodes; each kind gets its own."""
    results = make_sweep()
    slow = {"fp32": XEON, "fp16": XEON, "fp8_e4m3": XEON, "int8_minmax": EPYC}
    fast_node = dataclasses.replace(results, variants=tuple(
        dataclasses.replace(v, latency=make_latency({1: 5.0, 32: 50.0})) if v.variant == "int8_minmax" else v
        for v in results.variants))  # fmt: skip
    mixed = _timed_on(fast_node, slow)
    frontier = [p for p in compute_frontier(mixed.variants, "accuracy") if p.batch_size == 1]
    assert {(p.variant, p.machine) for p in frontier} == {("fp32", "Intel Xeon 8375C x8 x86_64"),
                                                          ("int8_minmax", "AMD EPYC 7B13 x8 x86_64")}  # fmt: skip
    assert panel_svg(mixed, 1, None).count('class="steps"') == 2  # one staircase per kind, none joining them
    text = frontier_text(dataclasses.replace(mixed, frontier=compute_frontier(mixed.variants, "accuracy")))
    assert "  onnxruntime-cpu, batch 1, timed on AMD EPYC 7B13 x8 x86_64: int8_minmax (5.00 ms" in text
    assert "  onnxruntime-cpu, batch 1, timed on Intel Xeon 8375C x8 x86_64: fp32 (1.00 ms" in text
    one_kind = _timed_on(results, {**slow, "int8_minmax": {**XEON, "host": "node-9"}})
    assert "  onnxruntime-cpu, batch 1: int8_minmax (" in frontier_text(one_kind)  # one kind: not named


def test_a_variant_slower_than_fp32_at_every_batch_size_beyond_the_noise_is_named() -> None:
    """fp8 (6.0 / 130 ms vs FP32's 1.0 / 20 ms) is slower at both batch sizes; int8 is faster; a variant slower at
    one batch size only, or by less than the noise, is no finding."""
    results = make_sweep()
    fp8 = results.find("fp8_e4m3", "onnxruntime-cpu")
    assert slower_than_reference(results, fp8) == "0.17× at batch 1, 0.15× at batch 32"
    assert slower_than_reference(results, results.find("int8_minmax", "onnxruntime-cpu")) is None
    assert slower_than_reference(results, results.find("fp32", "onnxruntime-cpu")) is None
    mixed = make_sweep([make_variant("fp32", "fp32", p50_by_batch={1: 1.0, 32: 20.0}),
                        make_variant("a", "int8", p50_by_batch={1: 1.5, 32: 18.0}),  # faster at 32
                        make_variant("b", "int8", p50_by_batch={1: 1.04, 32: 20.9}),  # within 5 %
                        make_variant("c", "int8", p50_by_batch={1: 1.2, 32: 24.0})])  # fmt: skip
    assert [slower_than_reference(mixed, v) for v in mixed.variants[1:]] == [None, None,
                                                                             "0.83× at batch 1, 0.83× at batch 32"]
    noisy = dataclasses.replace(mixed.variants[3], latency=dataclasses.replace(
        mixed.variants[3].latency, points=tuple(dataclasses.replace(p, spread=0.3)
                                                for p in mixed.variants[3].latency.points)))
    assert slower_than_reference(mixed, noisy) is None  # its windows spread 30 %: 0.83x is within its noise
    (note,) = slower_than_reference_notes(mixed)
    assert note == ("c@onnxruntime-cpu runs slower than fp32 at every batch size timed (0.83× at batch 1, 0.83× at "
                    "batch 32): for speed, fp32 is the better choice on onnxruntime-cpu")  # fmt: skip
    assert slower_than_reference_notes(mixed, {"b@onnxruntime-cpu"}) == []


def _others(variant: VariantResult, cpus: float) -> VariantResult:
    points = tuple(dataclasses.replace(p, others_cpus=cpus) for p in variant.latency.points)
    return dataclasses.replace(variant, latency=dataclasses.replace(variant.latency, points=points))


def test_a_point_timed_beside_busy_processes_ranks_nothing_by_speed() -> None:
    """An FP16 timed 158x faster than FP32 while other processes kept 1.6 CPUs busy: that gap compares loads. It
    neither pushes a more accurate FP32 off the frontier nor stays on it by its speed; quiet points still compete, and a
    contended point pushes no quiet one off."""
    fp32, fp16 = point("fp32", 56.1, 0.95), point("fp16", 0.35, 0.94)
    assert names(compute_frontier([fp32, fp16], "accuracy")) == ["fp16", "fp32"]  # quiet: faster, on the frontier
    assert names(compute_frontier([fp32, _others(fp16, 1.6)], "accuracy")) == ["fp32"]
    # FP32's load: FP32 is not shown to be as fast as the quiet FP16, which stays beside it (it was pushed off)
    assert names(compute_frontier([_others(fp32, 1.6), fp16], "accuracy")) == ["fp16", "fp32"]
    # as accurate: neither is faster, both stay; below CONTENDED_CPUS the speed counts
    assert names(compute_frontier([fp32, _others(point("fp16", 0.35, 0.95), 1.6)], "accuracy")) == ["fp16", "fp32"]
    assert names(compute_frontier([fp32, _others(point("fp16", 0.35, 0.95), 0.4)], "accuracy")) == ["fp16"]


def test_no_variant_is_named_slower_than_fp32_from_a_point_timed_beside_busy_processes() -> None:
    results = make_sweep()
    fp8 = results.find("fp8_e4m3", "onnxruntime-cpu")
    assert slower_than_reference(results, _others(fp8, 1.2)) is None
    loaded_reference = dataclasses.replace(results, variants=tuple(
        _others(v, 1.2) if v.variant == "fp32" else v for v in results.variants))  # fmt: skip
    assert slower_than_reference(loaded_reference, fp8) is None
    assert slower_than_reference(results, _others(fp8, 0.4)) == "0.17× at batch 1, 0.15× at batch 32"


def test_nodes_of_one_cpu_model_under_different_cgroup_quotas_have_a_frontier_each(tmp_path) -> None:
    """A Ray cluster's 16-CPU node and a pod limited to a 2-CPU quota on one like it (2 usable CPUs each, as a
    2-CPU node without a quota has): INT8, timed in the pod, is not compared with FP32 timed on the node, in
    results.json's frontier, the report's frontier, the speed-ups, and MLflow's tags."""
    from qbench.results.schema import read_results, write_results
    from qbench.track.content import sweep_tags, variant_tags

    node = {"host": "n1", "cpu": "Intel Xeon 8375C", "cpus": 2, "arch": "x86_64", "affinity_cpus": 2, "cpu_quota": None}
    pod = {**node, "host": "n2", "affinity_cpus": 16, "cpu_quota": 2.0}
    results = make_sweep()
    fast_pod = dataclasses.replace(results, variants=tuple(
        dataclasses.replace(v, latency=make_latency({1: 5.0, 32: 50.0})) if v.variant == "int8_minmax" else v
        for v in results.variants))  # fmt: skip
    mixed = _timed_on(fast_pod, {"fp32": node, "fp16": node, "fp8_e4m3": node, "int8_minmax": pod})
    mixed = dataclasses.replace(mixed, frontier=compute_frontier(mixed.variants, "accuracy"))
    stored = read_results(write_results(mixed, tmp_path / "results.json"))
    at_1 = {(p.variant, p.machine) for p in stored.frontier if p.batch_size == 1}
    assert at_1 == {("fp32", "Intel Xeon 8375C x2 x86_64"), ("int8_minmax", "Intel Xeon 8375C x2 quota 2 x86_64")}
    assert math.isnan(speedup(mixed, mixed.find("int8_minmax", "onnxruntime-cpu"), 1))
    text = frontier_text(stored)
    assert "  onnxruntime-cpu, batch 1, timed on Intel Xeon 8375C x2 quota 2 x86_64: int8_minmax (5.00 ms" in text
    assert "  onnxruntime-cpu, batch 1, timed on Intel Xeon 8375C x2 x86_64: fp32 (1.00 ms" in text
    assert variant_tags(mixed.find("int8_minmax", "onnxruntime-cpu"))["qbench.timed_on"] == (
        "Intel Xeon 8375C x2 quota 2 x86_64")
    assert "timed on Intel Xeon 8375C x2 quota 2 x86_64" in sweep_tags(mixed, None)["mlflow.note.content"]
    (note,) = mixed_timing_machines(mixed)
    assert "int8_minmax on Intel Xeon 8375C x2 quota 2 x86_64" in note
