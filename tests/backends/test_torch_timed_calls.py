"""What the latency loops time on torch-cpu: the module's forward alone, as a deployed server pays per inference; and
what the cold start's first run and a real server's batches run: the conversions a server pays, the modes entered once.

A recording clock stands in for qbench.validate.latency's perf_counter_ns: each timed run reads it twice, so every
event between an odd and an even read happened inside the timed region. No duration is asserted."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import qbench.backends.torch_backend as torch_backend
import qbench.validate.latency as latency
from qbench.backends.base import RunOptions, served_call, timed_load
from qbench.backends.torch_backend import TorchCPU, TorchRunner
from qbench.recipe.spec import StabilitySpec
from qbench.validate.load import Batcher
from qbench.validate.serve import serve
from qbench.variants.base import BuiltVariant

ROWS = 12


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.relu(self.fc1(x))
        return self.fc2(hidden), hidden


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mlp") / "mlp.onnx"
    torch.onnx.export(Mlp().eval(), (torch.zeros(2, 6),), str(path), input_names=["x"],
                      dynamic_axes={"x": {0: "batch"}}, dynamo=False)  # fmt: skip
    return path


class Recorder:
    """An event log; `clock` is the timing loop's perf_counter_ns, toggling whether the timed region is open."""

    def __init__(self) -> None:
        self.inside = False
        self.events: list[tuple[str, bool]] = []
        self.ticks = 0

    def log(self, what: str) -> None:
        self.events.append((what, self.inside))

    def clock(self) -> int:
        self.inside = not self.inside
        self.ticks += 1
        return self.ticks

    def timed(self) -> list[str]:
        return [what for what, inside in self.events if inside]


def _spied_runner(monkeypatch: pytest.MonkeyPatch, onnx_path: Path, precision: str, recorder: Recorder) -> TorchRunner:
    """A torch-cpu runner of Mlp in `precision` whose forward, input and output conversions and modes log events."""
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    variant = BuiltVariant(precision, precision, onnx_path, torch_module=lambda: Mlp().to(dtype))
    runner = TorchCPU().load(variant, RunOptions(threads=1))
    module = runner._live()
    module.register_forward_pre_hook(lambda *_: recorder.log("forward"))
    tensor, to_numpy, autocast = TorchRunner._tensor, torch_backend._to_numpy, TorchRunner._autocast
    monkeypatch.setattr(TorchRunner, "_tensor", lambda self, array: recorder.log("to tensor") or tensor(self, array))
    monkeypatch.setattr(torch_backend, "_to_numpy", lambda t: recorder.log("to numpy") or to_numpy(t))
    monkeypatch.setattr(TorchRunner, "_autocast", lambda self: recorder.log("modes") or autocast(self))
    inference_mode = torch.inference_mode
    monkeypatch.setattr(torch, "inference_mode", lambda *a: recorder.log("modes") or inference_mode(*a))
    monkeypatch.setattr(latency, "time", SimpleNamespace(perf_counter_ns=recorder.clock))
    return runner


def _feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(0).standard_normal((ROWS, 6)).astype(np.float32)}


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_only_the_forward_is_inside_the_timed_region(
    monkeypatch: pytest.MonkeyPatch, onnx_path: Path, precision: str
) -> None:
    recorder = Recorder()
    runner = _spied_runner(monkeypatch, onnx_path, precision, recorder)
    try:
        samples = latency.measure_samples(runner, _feeds(), [1, 4], warmup=3, iterations=16)
    finally:
        runner.close()
    assert recorder.timed() == ["forward"] * sum(len(durations) for durations in samples.values())
    _assert_per_call_work_is_done_once(recorder, samples)


def _assert_per_call_work_is_done_once(recorder: Recorder, samples: latency.TimedSamples) -> None:
    """Each distinct timed batch converted to tensors once, no output converted at all, the modes (inference mode,
    autocast) entered once per batch size."""
    events = [what for what, _ in recorder.events]
    assert sum(samples.batches.values()) > len(samples)  # batches in rotation: a cache of the last one would miss
    assert events.count("to tensor") == sum(samples.batches.values())
    assert "to numpy" not in events
    assert events.count("modes") == 2 * 2


def test_adaptive_timing_runs_the_same_calls(monkeypatch: pytest.MonkeyPatch, onnx_path: Path) -> None:
    """Timing until stable (its loop also reads the clock for its deadline) does no per-call conversion either."""
    recorder = Recorder()
    runner = _spied_runner(monkeypatch, onnx_path, "fp16", recorder)
    stability = StabilitySpec(windows=2, window_runs=4, window_seconds=0, max_iterations=40)
    try:
        samples = latency.measure_samples(runner, _feeds(), [1, 4], warmup=3, iterations=8, stability=stability)
    finally:
        runner.close()
    assert all(len(durations) >= 8 for durations in samples.values())
    _assert_per_call_work_is_done_once(recorder, samples)


def test_scoring_still_gets_numpy_outputs_equal_to_the_timed_forward(onnx_path: Path) -> None:
    """run() (what accuracy is computed on) and a timed call compute the same forward on the same batch."""
    variant = BuiltVariant("fp16", "fp16", onnx_path, torch_module=lambda: Mlp().half())
    runner = TorchCPU().load(variant, RunOptions(threads=1))
    feeds = _feeds()
    try:
        scored = runner.run(feeds)
        with runner.timed_calls([feeds]) as calls:
            timed: Any = calls[0]()
    finally:
        runner.close()
    assert all(isinstance(array, np.ndarray) and array.dtype == np.float32 for array in scored)
    assert [t.dtype for t in timed] == [torch.float16, torch.float16]  # left as the runtime's tensors
    for array, tensor in zip(scored, timed, strict=True):
        np.testing.assert_array_equal(array, tensor.float().numpy())


def test_describe_counts_the_ops_of_the_last_timed_batch(onnx_path: Path) -> None:
    """The op count describe() reports reruns the last batch run, whether it came through run() or a timed call."""
    variant = BuiltVariant("bf16", "bf16", onnx_path, torch_module=lambda: Mlp().to(torch.bfloat16))
    runner = TorchCPU().load(variant, RunOptions(threads=1))
    try:
        with runner.timed_calls([_feeds()]) as calls:
            calls[0]()
        description = runner.describe()
    finally:
        runner.close()
    assert description["lowered_ops"] > 0


def test_the_cold_start_s_first_run_counts_the_conversions_but_not_the_modes(
    monkeypatch: pytest.MonkeyPatch, onnx_path: Path
) -> None:
    """A server's first request arrives as numpy and is answered as numpy: its first run converts both ways inside the
    clock; the modes its worker enters once are entered before the clock starts."""
    recorder = Recorder()
    runner = _spied_runner(monkeypatch, onnx_path, "fp16", recorder)
    recorder.events.clear()
    _, _, first_ms = latency.measure_cold_start(lambda: runner, _feeds(), rows=4)
    runner.close()
    assert recorder.timed() == ["to tensor", "forward", "to numpy", "to numpy"]  # Mlp returns two outputs
    assert [what for what, _ in recorder.events].count("modes") == 2  # inference mode and autocast, outside
    assert first_ms > 0


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_real_server_s_batches_convert_each_time_and_enter_the_modes_once_in_its_thread(
    monkeypatch: pytest.MonkeyPatch, onnx_path: Path, precision: str
) -> None:
    """The batcher thread runs each batch as a server does (numpy in, numpy out) inside the modes it entered once;
    inference mode is per thread, so the forward must see it on in the batcher thread, not only where it was asked."""
    recorder = Recorder()
    runner = _spied_runner(monkeypatch, onnx_path, precision, recorder)
    modes_on: list[bool] = []
    runner._live().register_forward_pre_hook(lambda *_: modes_on.append(torch.is_inference_mode_enabled()))
    recorder.events.clear()
    arrivals = np.arange(40, dtype=np.float64) * 0.5  # 2,000 req/s: batches of 1 to 4 rows
    try:
        served = serve(runner, _feeds(), arrivals, Batcher(4, 1.0))
    finally:
        runner.close()
    events = [what for what, _ in recorder.events]
    batches = len(served.batch_sizes)
    assert batches > 1 and served.completed == arrivals.size
    assert events.count("forward") == events.count("to tensor") == batches
    assert events.count("to numpy") == 2 * batches  # Mlp returns two outputs
    assert events.count("modes") == 2
    assert modes_on == [True] * batches


def test_idle_starts_run_as_served_batches_with_the_modes_entered_once_per_batch_size(
    monkeypatch: pytest.MonkeyPatch, onnx_path: Path
) -> None:
    recorder = Recorder()
    runner = _spied_runner(monkeypatch, onnx_path, "fp32", recorder)
    monkeypatch.setattr(latency, "time", __import__("time"))  # the idle loop sleeps: a real clock
    recorder.events.clear()
    try:
        latency.measure_batcher_samples(runner, _feeds(), [1, 4], iterations=6, idle_ms=0.1)
    finally:
        runner.close()
    events = [what for what, _ in recorder.events]
    assert events.count("forward") == events.count("to tensor") == 2 * 6
    assert events.count("modes") == 2 * 2


def test_a_served_call_answers_what_scoring_does(onnx_path: Path) -> None:
    variant = BuiltVariant("fp16", "fp16", onnx_path, torch_module=lambda: Mlp().half())
    runner = TorchCPU().load(variant, RunOptions(threads=1))
    feeds = _feeds()
    try:
        scored = runner.run(feeds)
        with served_call(runner) as call:
            answered = call(feeds)
    finally:
        runner.close()
    assert all(isinstance(array, np.ndarray) and array.dtype == np.float32 for array in answered)
    for a, b in zip(scored, answered, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_served_call_copies_or_casts_only_what_needs_it(monkeypatch: pytest.MonkeyPatch, onnx_path: Path) -> None:
    """Per batch a server pays the conversions its arrays need, no more: an FP32 module's writable float32 batch is
    read in place and its float32 outputs handed back as they are (no .to/.float/.cpu call); a read-only batch is
    copied (torch refuses to share it without a warning) and an FP16 module's batch cast."""
    calls: list[str] = []
    for name in ("to", "float", "cpu", "detach"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name,
                            lambda self, *a, _n=name, _o=original, **k: calls.append(_n)
                            or _o(self, *a, **k))  # fmt: skip
    feeds = _feeds()
    runner = TorchCPU().load(BuiltVariant("fp32", "fp32", onnx_path, torch_module=Mlp), RunOptions(threads=1))
    try:
        with served_call(runner) as call:
            calls.clear()  # the load's module.to(device)
            answered = call(feeds)
            assert runner._last_inputs[0].data_ptr() == feeds["x"].ctypes.data
            assert calls == []
            read_only = feeds["x"].copy()
            read_only.flags.writeable = False
            np.testing.assert_array_equal(call({"x": read_only})[0], answered[0])
            assert runner._last_inputs[0].data_ptr() != read_only.ctypes.data
    finally:
        runner.close()
    half = TorchCPU().load(BuiltVariant("fp16", "fp16", onnx_path, torch_module=lambda: Mlp().half()),
                           RunOptions(threads=1))  # fmt: skip
    try:
        with served_call(half) as call:
            assert all(array.dtype == np.float32 for array in call(feeds))
            assert half._last_inputs[0].dtype == torch.float16
    finally:
        half.close()


def test_the_cold_start_times_building_the_module_not_reading_its_onnx_file(
    monkeypatch: pytest.MonkeyPatch, onnx_path: Path
) -> None:
    """The module's argument order comes from the variant's ONNX file, weights and all: read before the clock starts,
    as a server knows it from its code; building the module is what the load times."""
    recorder = Recorder()
    read = torch_backend.read_model_info
    monkeypatch.setattr(torch_backend, "read_model_info", lambda path: recorder.log("read onnx") or read(path))
    variant = BuiltVariant("fp32", "fp32", onnx_path, torch_module=lambda: recorder.log("build module") or Mlp())
    monkeypatch.setattr(latency, "time", SimpleNamespace(perf_counter_ns=recorder.clock))
    runner, _, _ = latency.measure_cold_start(timed_load(TorchCPU(), variant, RunOptions(threads=1)), _feeds())
    runner.close()
    assert ("read onnx", False) in recorder.events
    assert recorder.timed() == ["build module"]
