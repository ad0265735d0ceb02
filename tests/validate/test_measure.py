"""measure(): load, run, compare with FP32, time, close, on a tiny linear model; and every caller goes through it."""

from __future__ import annotations

import math
import os
import platform
import socket
import tracemalloc

import numpy as np
import pytest

from qbench.backends import get_backend
from qbench.preflight.prepare import prepare
from qbench.recipe.search import SearchSpec
from qbench.recipe.spec import LatencySpec, load_recipe
from qbench.validate import metrics
from qbench.validate.measure import Rows, measure, output_nsr
from qbench.variants import BuildContext, BuiltVariant, build_variant
from tests.explain.test_sensitivity import INT8, write_fragile_project


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepare(load_recipe(write_fragile_project(tmp_path_factory.mktemp("measure"), [INT8])), track=False)


def _fp32(prepared) -> BuiltVariant:
    return BuiltVariant("fp32", "fp32", prepared.source.onnx_path)


def test_output_nsr_by_hand():
    reference, outputs = [np.array([3.0, 4.0])], [np.array([3.0, 5.0])]
    assert output_nsr(reference, outputs) == pytest.approx(1.0 / 25.0)
    assert output_nsr(reference, [np.array([np.inf, 4.0])]) == math.inf
    assert output_nsr([np.zeros(2)], [np.zeros(2)]) == 0.0


def test_output_nsr_block_by_block_matches_the_whole_arrays(monkeypatch):
    rng = np.random.default_rng(0)
    reference = [rng.normal(size=(50, 6)).astype(np.float32), rng.normal(size=50), np.arange(50)]
    outputs = [(r * 1.1).astype(r.dtype) for r in reference]
    whole = output_nsr(reference, outputs)
    monkeypatch.setattr(metrics, "ROW_BLOCK_ELEMENTS", 12)  # 2 rows of 6 values a block
    assert output_nsr(reference, outputs) == pytest.approx(whole, rel=1e-12)
    assert whole == pytest.approx(0.01, rel=1e-6)  # every float output 10 % off: noise 0.01 of the signal
    outputs[0][37, 2] = np.nan  # in a later block
    assert output_nsr(reference, outputs) == math.inf


def test_output_nsr_widens_no_output_whole(monkeypatch):
    reference = [np.random.default_rng(1).normal(size=(4000, 500)).astype(np.float32)]  # 8 MB, 16 MB as float64
    outputs = [reference[0] * np.float32(1.01)]
    monkeypatch.setattr(metrics, "ROW_BLOCK_ELEMENTS", 50_000)
    tracemalloc.start()
    try:
        output_nsr(reference, outputs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000


def test_rows_subset_and_from_batches():
    rows = Rows({"x": np.arange(10)[:, None]}, np.arange(10), {"even": np.arange(10) % 2 == 0}, 4)
    sub = rows.subset(np.array([0, 3, 4]))
    assert sub.count == 3 and sub.labels.tolist() == [0, 3, 4] and sub.slices["even"].tolist() == [True, False, True]
    batches = [{"x": np.ones((4, 2))}, {"x": np.zeros((4, 2))}, {"x": np.ones((4, 3))}]
    joined = Rows.from_batches(batches, 6)
    assert joined.count == 6 and joined.batch_size == 4 and joined.labels is None and joined.slices == {}
    assert Rows.from_batches(batches[1:], 100).count == 4  # the third batch's shape differs: not joined


def test_fp32_against_itself_then_a_variant_against_fp32(prepared, tmp_path):
    backend = get_backend("onnxruntime-cpu")
    timing = LatencySpec(batch_sizes=[1, 8], warmup=1, iterations=3, stability=None)
    fp32 = measure(backend, _fp32(prepared), prepared, timing=timing)
    assert fp32.result.status == "ok" and fp32.nsr == 0.0
    assert fp32.result.accuracy.overall.drops["agreement"] == 0.0
    assert [p.batch_size for p in fp32.result.latency.points] == [1, 8]
    assert all(p.iterations == 3 for p in fp32.result.latency.points)
    rows = len(prepared.evaluation_rows)  # timed over the evaluation rows in rotation, as many batches as runs at most
    assert [p.batches for p in fp32.result.latency.points] == [min(3, -(-rows // b)) for b in (1, 8)]
    machine = fp32.result.latency.machine  # the machine the timings ran on (each node of a cluster records its own)
    assert machine["host"] == socket.gethostname() and machine["cpus"] == len(os.sched_getaffinity(0))
    assert machine["cpu"] and machine["arch"] == platform.machine() and "device" not in machine
    int8 = build_variant(load_recipe(prepared.recipe.source).variants[0],
                         BuildContext(prepared.source.onnx_path, tmp_path,
                                                                                        prepared.calibration_batches))  # fmt: skip
    measured = measure(backend, int8, prepared, reference=fp32.reference)
    assert measured.result.latency is None  # not timed
    assert measured.nsr > 0.01  # the fragile node's channel is rounded away
    drop = measured.result.accuracy.overall.drops["agreement"]
    assert drop == pytest.approx(1.0 - measured.result.accuracy.overall.metrics["agreement"]) and drop > 0.05
    screen = Rows.evaluation(prepared).subset(np.arange(0, 200, 10))
    on_rows = measure(backend, int8, prepared, rows=screen, reference=measure(backend, _fp32(prepared), prepared,
                                                                             rows=screen).reference)  # fmt: skip
    assert on_rows.result.accuracy.rows == 20
    timed_only = measure(backend, int8, prepared, timing=timing, score=False)
    assert timed_only.result.accuracy is None and timed_only.outputs is None and timed_only.result.latency is not None
    assert fp32.result.serving is None  # a search's ranking needs no load simulation: only the sweep asks for it
    served = measure(backend, _fp32(prepared), prepared, timing=timing, serving=True).result.serving
    assert served is not None and served.bound is not None


def test_a_model_that_cannot_run_is_a_failed_result_not_an_exception(prepared, tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    measured = measure(get_backend("onnxruntime-cpu"), BuiltVariant("broken", "fp32", broken), prepared, quiet=True)
    assert measured.result.status == "failed" and measured.result.error and measured.outputs is None


@pytest.mark.parametrize("module",
                         ["qbench.execute.jobs", "qbench.explain.sensitivity", "qbench.fallback", "qbench.search.run"])
def test_sweep_explain_fallback_and_search_measure_through_it(module, tmp_path, monkeypatch):
    """Each caller's measurements go through measure(): replaced in the caller, it sees every model run."""
    import importlib

    from qbench.explain.sensitivity import explain_variant
    from qbench.sweep.runner import run_sweep

    caller = importlib.import_module(module)
    seen: list[str] = []
    original = caller.measure
    monkeypatch.setattr(caller, "measure", lambda backend, built, *a,
                        **k: seen.append(built.name) or original(backend, built, *a, **k))  # fmt: skip
    monkeypatch.chdir(tmp_path)
    if module == "qbench.explain.sensitivity":
        explain_variant(load_recipe(write_fragile_project(tmp_path, [INT8])), "int8", method="leave_one_out")
        assert seen[:2] == ["fp32", "int8"] and len(seen) == 2 + 4  # reference, the variant, one per node
        return
    variant = {**INT8, "fallback": {"max_excluded": 1}} if module == "qbench.fallback" else INT8
    recipe = load_recipe(write_fragile_project(tmp_path, [variant]))
    if module == "qbench.search.run":
        recipe = recipe.model_copy(update={"search": SearchSpec(time_budget_s=0.001)})
    run_sweep(recipe, track=False)
    assert seen, f"{module} measured nothing through measure()"
    if module == "qbench.execute.jobs":  # the sweep's jobs
        assert seen == ["fp32", "int8"]
    elif module == "qbench.fallback":  # the ranking's reference and candidates, on calibration rows
        assert seen[0] == "fp32" and any(name.startswith("candidate-") for name in seen)
    else:
        assert seen[0] == "fp32" and any(name.startswith("int8-search-") for name in seen)


def test_a_variant_whose_rows_follow_their_batch_is_judged_also_at_the_batch_sizes_it_serves(prepared, tmp_path):
    """Measured, not named: dynamic INT8's rows follow their batch (each batch's own activation range), static INT8's
    do not. The search measures its candidates the same way (a `timing` of None: the recipe's batch sizes)."""
    from qbench.recipe.spec import VariantSpec

    backend = get_backend("onnxruntime-cpu")
    ctx = BuildContext(prepared.source.onnx_path, tmp_path, prepared.calibration_batches)
    dynamic = build_variant(VariantSpec(name="dyn", precision="int8", calibrator="dynamic"), ctx)
    static = build_variant(load_recipe(prepared.recipe.source).variants[0], ctx)
    reference = measure(backend, _fp32(prepared), prepared).reference
    notes = measure(backend, dynamic, prepared, reference=reference).result.notes
    judged = [note for note in notes if note.startswith("rows depend on their batch")]
    assert len(judged) == 1 and "accuracy judged in 3 batch arrangements" in judged[0]  # fmt: skip
    assert "batches of 50, in the evaluation rows' order" in judged[0] and "batches of 8, rows in a seeded mix" in judged[0]
    assert not any("depend on their batch" in note
                   for note in measure(backend, static, prepared, reference=reference).result.notes)


def test_fp32_warns_when_its_values_contradict_the_graphs_word_on_the_scale(tmp_path, caplog):
    """A MatMul (logits to the graph) whose one column happens to lie within [0, 1]: threshold 0 calls every row
    class 1. FP32's own measurement says so, naming the output; screens (quiet) do not."""
    import logging

    import onnx
    import pandas as pd
    import yaml
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.full((4, 1), 0.25, np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["score"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["n", 1])],
                              [weight])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(tmp_path / "m.onnx"))  # fmt: skip
    features = np.random.default_rng(2).uniform(size=(40, 4)).astype(np.float32)
    pd.DataFrame({"x": list(features), "y": (features.mean(axis=1) > 0.5).astype(int)}).to_parquet(tmp_path / "d.parquet")
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({
        "name": "scale", "model": {"path": "m.onnx"}, "output_dir": str(tmp_path / "reports"),
        "data": {"path": "d.parquet", "inputs": {"x": "x"}, "label": "y", "calibration": {"samples": 8}},
        "variants": [{"name": "h", "precision": "fp16"}]}))  # fmt: skip
    prepared = prepare(load_recipe(tmp_path / "r.yaml"), track=False)
    backend = get_backend("onnxruntime-cpu")
    with caplog.at_level(logging.WARNING, logger="qbench.validate.measure"):
        measure(backend, _fp32(prepared), prepared, quiet=True)
        assert not caplog.records
        measure(backend, _fp32(prepared), prepared)
    [record] = caplog.records
    assert record.getMessage().startswith("fp32@onnxruntime-cpu: output 'score': "
                                          "the graph makes it with a linear layer")


def _served_at_any_rate(monkeypatch) -> list[float]:
    """measure()'s real server stood in for by one whose runs meet the budget at any rate; returns the rates it is
    asked, as they come. A real run at a budget's rate of 10 req/s sends 200 requests and sleeps 20 s through their
    arrivals (twice where it cannot tell whether the server keeps up), for figures the tests using this never read
    (real runs: tests/validate/test_serve.py)."""
    import qbench.validate.measure as measure_module
    from qbench.results.serving import LoadStats

    rates: list[float] = []

    def server_for(*args, **kwargs):
        def at(rate_rps, overhead_ms, budget_ms=math.inf, runs=1):
            rates.append(rate_rps)
            return LoadStats(rate_rps, 200, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, rate_rps)

        return at

    monkeypatch.setattr(measure_module, "server_for", server_for)
    return rates


def test_a_sweep_measurement_times_idle_starts_and_simulates_load_with_them(prepared, monkeypatch):
    """With `slo:` the sweep's measurement also times batches served from idle (after the budget rate's mean arrival
    gap plus the queue delay, within [1, 50] ms: 100 + 2 ms at 10 req/s, so 50 ms) and the load simulation charges
    them: at 10 req/s with a 2 ms queue delay nearly every request waits the delay alone, then 40 ms from idle, so its
    latency is about 42 ms (back to back the model takes a fraction of a ms)."""
    import dataclasses

    import qbench.validate.measure as measure_module
    from qbench.recipe.slo import LoadSpec, SloSpec
    from qbench.validate.latency import BatcherSamples

    calls = []

    def batcher_samples(runner, feeds, batch_sizes, iterations, idle_ms, padding=None):
        calls.append((tuple(batch_sizes), iterations, idle_ms))
        return BatcherSamples({bs: 0.0 for bs in batch_sizes}, {bs: 40.0 for bs in batch_sizes})

    monkeypatch.setattr(measure_module, "measure_batcher_samples", batcher_samples)
    served_rates = _served_at_any_rate(monkeypatch)
    slo = SloSpec(p99_ms=100.0, rate_rps=10.0, load=LoadSpec(max_queue_delay_ms=2.0, requests=200))
    with_slo = dataclasses.replace(prepared, recipe=prepared.recipe.model_copy(update={"slo": slo}))
    timing = LatencySpec(batch_sizes=[1, 8], warmup=1, iterations=3, stability=None)
    served = measure(get_backend("onnxruntime-cpu"), _fp32(with_slo), with_slo, timing=timing, serving=True).result.serving
    assert calls == [((1, 8), 3, 50.0)]
    # the real runs start at the simulated highest rate, confirmed by a second run
    assert served_rates[:2] == [served.simulated_max_rate_rps] * 2 and served.max_rate_rps == served_rates[0]
    # the figures of the recipe's 200 requests, which show the pass at 10 req/s (judge_rate): a few share a batch and
    # wait less
    assert served.at_rate.requests == 200 and 41.5 <= served.at_rate.p50_ms < 43.0


def test_the_load_simulation_is_clocked_as_its_own_phase_not_as_inference(prepared, monkeypatch):
    """The simulation computes over timings already taken: its time is the "simulation" phase's, and the measurement's
    "inference" leaves it out (a simulation made 0.3 s slower moves 0.3 s there and none into inference)."""
    import dataclasses
    import time

    import qbench.validate.load_search as load_search
    from qbench.recipe.slo import LoadSpec, SloSpec
    from qbench.validate.clock import PhaseClock

    simulate = load_search.search_max_rate

    def slow_simulation(*args, **kwargs):
        time.sleep(0.3)
        return simulate(*args, **kwargs)

    monkeypatch.setattr(load_search, "search_max_rate", slow_simulation)
    _served_at_any_rate(monkeypatch)
    slo = SloSpec(p99_ms=100.0, rate_rps=10.0, load=LoadSpec(max_queue_delay_ms=2.0, requests=200))
    with_slo = dataclasses.replace(prepared, recipe=prepared.recipe.model_copy(update={"slo": slo}))
    timing = LatencySpec(batch_sizes=[1, 8], warmup=1, iterations=3, stability=None)
    clock = PhaseClock()
    started = time.perf_counter()
    measured = measure(get_backend("onnxruntime-cpu"), _fp32(with_slo), with_slo, timing=timing, serving=True,
                       clock=clock)
    elapsed = time.perf_counter() - started
    assert measured.result.status == "ok"
    assert clock.seconds["simulation"] >= 0.3
    assert clock.seconds["inference"] + clock.seconds["simulation"] <= elapsed
    assert clock.seconds["inference"] > 0


def test_threads_beyond_the_usable_cpus_put_a_note_on_the_result_and_unset_threads_follow_them(prepared, monkeypatch):
    """On one usable CPU (as under `taskset -c 0`) 2 timed threads take turns: the result records the threads timed
    and the allowance, and carries the note; unset threads are timed as 1 (the usable CPUs), with no note."""
    from qbench import environment

    monkeypatch.setattr(environment, "cpu_allowance", lambda root=None: environment.CpuAllowance(1, None))
    backend = get_backend("onnxruntime-cpu")
    crowded = measure(backend, _fp32(prepared), prepared,
                      timing=LatencySpec(batch_sizes=[1], warmup=1, iterations=3, stability=None, threads=2)).result
    assert crowded.latency.threads == 2 and crowded.params["runtime.intra_op_threads"] == 2
    assert (crowded.latency.machine["cpus"], crowded.latency.machine["affinity_cpus"]) == (1, 1)
    assert [n for n in crowded.notes if n.startswith("latency timed with 2 threads on 1 usable CPU (affinity 1): ")]
    default = measure(backend, _fp32(prepared), prepared,
                      timing=LatencySpec(batch_sizes=[1], warmup=1, iterations=3, stability=None)).result
    assert default.latency.threads == 1 and default.params["runtime.intra_op_threads"] == 1
    assert not [n for n in default.notes if n.startswith("latency timed with")]


def test_threads_beyond_a_fractional_cgroup_quota_are_named_on_the_result(prepared, monkeypatch, tmp_path):
    """A container whose cgroup v2 cpu.max is "150000 100000" (1.5 CPUs) on this machine: 1 usable CPU, so unset
    threads are timed as 1 with no note; 2 timed threads exceed the quota and the result says they were throttled;
    the quota is part of the kind of machine the timings came from."""
    from qbench import environment
    from qbench.environment import machine_kind

    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/kubepods/pod1\n")
    (tmp_path / "sys/fs/cgroup/kubepods/pod1").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/kubepods/pod1/cpu.max").write_text("150000 100000\n")
    real = environment.cpu_allowance
    monkeypatch.setattr(environment, "cpu_allowance", lambda root=None: real(tmp_path))
    backend = get_backend("onnxruntime-cpu")
    crowded = measure(backend, _fp32(prepared), prepared,
                      timing=LatencySpec(batch_sizes=[1], warmup=1, iterations=3, stability=None, threads=2)).result
    assert (crowded.latency.machine["cpus"], crowded.latency.machine["cpu_quota"]) == (1, 1.5)
    assert " x1 quota 1.5 " in machine_kind(crowded.latency.machine)
    assert [n for n in crowded.notes if n.startswith("latency timed with 2 threads under a cgroup quota of 1.50 CPUs")]
    default = measure(backend, _fp32(prepared), prepared,
                      timing=LatencySpec(batch_sizes=[1], warmup=1, iterations=3, stability=None)).result
    assert default.latency.threads == 1 and not [n for n in default.notes if n.startswith("latency timed with")]
