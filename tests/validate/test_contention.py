"""Other processes' CPU use while a point was timed: the arithmetic, where it is recorded, and the notes it gives."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from sweep_factory import default_variants, make_sweep

from qbench.gate.evaluate import evaluate_gate
from qbench.recipe.spec import GateSpec
from qbench.report.frontier import frontier_text
from qbench.report.tables import _summary_grid, summary_table
from qbench.results.schema import SweepResults, from_dict, to_json
from qbench.validate.contention import CpuSample, contention_notes, others_cpus
from qbench.validate.latency import TimedSamples, latency_points


def test_others_cpus_is_busy_time_less_this_process_per_second() -> None:
    # 2 s: the CPUs were busy 3 s in all, 1 s of it this process's: another process kept 1 CPU busy
    assert others_cpus(CpuSample(10.0, 100.0, 5.0), CpuSample(12.0, 103.0, 6.0)) == 1.0
    # this process's counter ticked past the machine's: never below 0
    assert others_cpus(CpuSample(10.0, 100.0, 5.0), CpuSample(11.0, 100.5, 5.8)) == 0.0
    assert math.isnan(others_cpus(CpuSample(10.0, 100.0, 5.0), CpuSample(10.0, 101.0, 5.0)))


def test_a_window_shorter_than_the_counters_resolution_gives_no_figure() -> None:
    # 1 ms of timing over which the busy counter moved by one 10 ms tick: not 10 CPUs of other work, nothing known
    assert math.isnan(others_cpus(CpuSample(10.0, 100.0, 5.0), CpuSample(10.001, 100.01, 5.0)))
    assert others_cpus(CpuSample(10.0, 100.0, 5.0), CpuSample(10.5, 100.26, 5.01)) == pytest.approx(0.5)


def test_timed_samples_carry_others_cpus_into_their_points() -> None:
    samples = TimedSamples()
    samples[1], samples[32] = np.full(10, 1.0), np.full(10, 20.0)
    samples.others_cpus[32] = 1.4
    one, thirty_two = latency_points(samples, warmup=0)
    assert math.isnan(one.others_cpus) and thirty_two.others_cpus == 1.4
    assert all(math.isnan(p.others_cpus) for p in latency_points({1: np.full(10, 1.0)}, warmup=0))


def _loaded(results: SweepResults, variant: str, batch_size: int, cpus: float, rest: float = 0.05) -> SweepResults:
    """Every timed point at `rest` CPUs of other processes' use, `variant` at `batch_size` at `cpus`."""

    def load(v):
        if v.latency is None:
            return v
        points = tuple(dataclasses.replace(p, others_cpus=cpus if (v.variant, p.batch_size) == (variant, batch_size)
                                           else rest) for p in v.latency.points)  # fmt: skip
        return dataclasses.replace(v, latency=dataclasses.replace(v.latency, points=points))

    return dataclasses.replace(results, variants=tuple(load(v) for v in results.variants))


def test_a_point_timed_beside_busy_processes_is_named_in_the_report_not_the_gate() -> None:
    """A caveat on speed-ups: in the sweep's log and the report; the gate's output, which CI parses, depends on the
    accuracy and the SLO only, never on how busy the machine happened to be."""
    results = _loaded(make_sweep(default_variants()), "fp32", 32, 1.62)
    (note,) = contention_notes(results)
    assert note.startswith("onnxruntime-cpu: other processes kept 1.62 CPUs busy while fp32 was timed at batch 32 "
                           "(0.05 while ")  # fmt: skip
    assert not [n for n in evaluate_gate(results, GateSpec(max_drop=0.5, max_slice_drop=0.5)).notes if "busy" in n]
    assert note in str(summary_table(results, None).caption)
    assert contention_notes(_loaded(results, "fp32", 32, 0.4)) == []  # below CONTENDED_CPUS
    assert contention_notes(make_sweep(default_variants())) == []  # not recorded (older results): no claim
    twin = dataclasses.replace(results.variants[0], variant="fp32-copy", params={"identical_to": "fp32"})
    with_twin = dataclasses.replace(results, variants=(*results.variants, twin))
    assert contention_notes(with_twin) == [note]  # a twin's figures are fp32's: fp32 is named, as it was timed


def test_others_cpus_round_trips_through_results_json() -> None:
    results = _loaded(make_sweep(default_variants()), "fp16", 1, 0.75)
    back = from_dict(json.loads(to_json(results)))
    assert back.find("fp16", "onnxruntime-cpu").latency.at(1).others_cpus == 0.75
    raw = json.loads(to_json(make_sweep(default_variants())))
    assert raw["variants"][0]["latency"]["points"][0]["others_cpus"] is None  # NaN is written as null, read as NaN
    assert math.isnan(from_dict(raw).variants[0].latency.points[0].others_cpus)


def _marked_speedups(results: SweepResults) -> list[str]:
    """The variants whose speed-up cell carries the footnote saying it was timed under load."""
    grid = _summary_grid(results, None)
    column = next(i for i, header in enumerate(grid.headers) if header.startswith("speed-up"))
    marks = [line.split(" ", 1)[0] for line in grid.footer if "this speed-up compares loads, not variants" in line]
    return [str(row[0]).split(" ")[0] for row in grid.rows if marks and str(row[column]).endswith(f" {marks[0]}")]


def test_a_speed_up_and_a_frontier_entry_timed_beside_busy_processes_are_marked_where_shown() -> None:
    """Not only in a note: the speed-up cell of a point (or of FP32's point) timed under load carries a footnote, and
    a frontier entry timed under load is marked as on the frontier by its metric alone."""
    quiet = make_sweep(default_variants())
    assert _marked_speedups(quiet) == []
    assert "~" not in frontier_text(quiet)
    loaded = _loaded(quiet, "int8_minmax", 32, 1.62)
    assert _marked_speedups(loaded) == ["int8_minmax"]
    # FP32 timed under load: every speed-up at that batch size is a ratio to a loaded time
    assert _marked_speedups(_loaded(quiet, "fp32", 32, 1.62)) == ["fp32", "fp16", "int8_minmax", "fp8_e4m3"]
    assert "batch 32: int8_minmax" not in frontier_text(loaded)  # less accurate than fp32, its speed not compared
    text = frontier_text(_loaded(quiet, "fp16", 32, 1.62))  # as accurate as fp32: on it, marked
    # and the quiet, faster int8 stays: the loaded fp16 is not shown as fast as it (it had pushed it off)
    assert "batch 32: int8_minmax (12.0 ms, 0.9400) → fp32 (20.0 ms, 0.9500) = fp16~ (21.0 ms" in text
    assert "~ timed while other processes kept CPUs busy" in text


def test_this_process_s_other_python_threads_count_as_others_not_as_the_timing_s_own(monkeypatch) -> None:
    """A helper thread of this process (MLflow's sampler, a progress bar's refresh) takes CPUs from the model as
    another process would: its CPU is left out of the timing's own, the calling thread's and native threads' kept."""
    import threading
    from types import SimpleNamespace

    import psutil

    import qbench.validate.contention as contention

    stop = threading.Event()
    helper = threading.Thread(target=stop.wait)
    helper.start()
    try:
        me = threading.get_native_id()
        threads = [SimpleNamespace(id=me, user_time=1.0, system_time=0.5),  # the timing thread
                   SimpleNamespace(id=helper.native_id, user_time=3.0, system_time=1.0),  # a Python helper
                   SimpleNamespace(id=-7, user_time=2.0, system_time=0.0)]  # a runtime's native pool thread
        process = SimpleNamespace(cpu_times=lambda: SimpleNamespace(user=6.0, system=1.5), threads=lambda: threads)
        monkeypatch.setattr(psutil, "Process", lambda: process)
        assert contention.cpu_sample().own_s == pytest.approx(7.5 - 4.0)
    finally:
        stop.set()
        helper.join()
