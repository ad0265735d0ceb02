"""FP16 of an audio front-end computed inside the graph: a Hann window and a mel filterbank made by their operators,
and the log of a mel power plus a tiny epsilon, read on silent frames whose power is 0.

Every FP16 figure is read from the emulation the sweep scores on CPU (emulate.float16_emulation): ONNX Runtime's CPU
provider computes the deployable graph's FP16 Log in float32 and so hides what FP16 hardware computes."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from qbench.recipe.spec import VariantSpec
from qbench.variants.base import BuildContext
from qbench.variants.emulate import float16_emulation
from qbench.variants.fp16 import build_fp16

RNG = np.random.default_rng(0)
FRAME, BINS, MELS = 16, 9, 4
EPSILON = 1e-10  # as log-mel front-ends write it: far below FP16's smallest subnormal (6e-8)


def _run(path, feeds) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _frames(rows: int, silent_every: int = 4) -> dict[str, np.ndarray]:
    """Frames of a sine of random pitch and level; every `silent_every`-th row silent (all zeros)."""
    time = np.arange(FRAME) / 8000
    pitch, level = RNG.uniform(200, 3500, (rows, 1)), RNG.uniform(0.05, 1.0, (rows, 1))
    frames = (level * np.sin(2 * np.pi * pitch * time)).astype(np.float32)
    frames[::silent_every] = 0.0
    return {"x": frames}


def _log_mel_nodes(power: str) -> list:
    """`power` [batch, BINS] -> log(power @ mel + EPSILON) [batch, MELS]; the mel matrix is the initializer `mel` or
    made by a MelWeightMatrix node, as the caller writes it."""
    return [helper.make_node("MatMul", [power, "mel"], ["mel_power"], name="to_mel"),
            helper.make_node("Add", ["mel_power", "epsilon"], ["floored"], name="floor"),
            helper.make_node("Log", ["floored"], ["y"], name="log")]  # fmt: skip


def _spectrum_nodes() -> list:
    """x [batch, FRAME] windowed, projected on a real DFT basis (cosines: `basis`) and squared: [batch, BINS]."""
    return [helper.make_node("Mul", ["x", "window"], ["windowed"], name="window_frames"),
            helper.make_node("MatMul", ["windowed", "basis"], ["spectrum"], name="dft"),
            helper.make_node("Mul", ["spectrum", "spectrum"], ["power"], name="square")]  # fmt: skip


def _basis() -> np.ndarray:
    return np.cos(2 * np.pi * np.outer(np.arange(FRAME), np.arange(BINS)) / FRAME).astype(np.float32)


def _fp16_build(path, tmp_path):
    built = build_fp16(VariantSpec(name="half", precision="fp16"),
                       BuildContext(path, tmp_path / "work", [_frames(32), _frames(32)]))  # fmt: skip
    return built, float16_emulation(built).scored.onnx_path


def test_a_window_and_mel_matrix_made_by_their_operators_stay_fp32_and_the_fp16_graph_loads(graph, tmp_path):
    """HannWindow and MelWeightMatrix write the type their `output_datatype` attribute names (float32 by default):
    the converter retyped their outputs float16 and left the attribute, so ONNX Runtime refused the whole FP16 graph
    ("Type (tensor(float16)) of output arg ... does not match expected type (tensor(float))")."""
    constants = [helper.make_node("HannWindow", ["frame"], ["window"], name="hann"),
                 helper.make_node("MelWeightMatrix", ["mels", "dft_length", "rate", "low", "high"], ["mel"],
                                  name="filterbank")]  # fmt: skip
    weights = {"frame": np.array(FRAME, np.int64), "mels": np.array(MELS, np.int64),
               "dft_length": np.array(FRAME, np.int64), "rate": np.array(8000, np.int64),
               "low": np.array(0.0, np.float32), "high": np.array(4000.0, np.float32), "basis": _basis(),
               "epsilon": np.array(1.0, np.float32)}  # fmt: skip
    path = graph(tmp_path / "front_end.onnx", [*constants, *_spectrum_nodes(), *_log_mel_nodes("power")], weights,
                 {"x": FRAME}, {"y": MELS}, opset=17)  # fmt: skip
    built, emulated = _fp16_build(path, tmp_path)
    held_out = _frames(64)
    deployed = _run(built.onnx_path, held_out)  # before: refused at load
    reference = _run(path, held_out)
    print(f"max |fp16 - fp32| deployed {np.abs(deployed - reference).max():.3g}, "
          f"emulated {np.abs(_run(emulated, held_out) - reference).max():.3g}")
    np.testing.assert_allclose(deployed, reference, atol=0.02)
    np.testing.assert_allclose(_run(emulated, held_out), reference, atol=0.02)
    kept = " ".join(built.notes)
    assert "HannWindow, MelWeightMatrix (its float output's type is set by its 'output_datatype' attribute" in kept
    assert built.params["converted_nodes"] >= 5  # the window's Mul, the DFT's MatMul, the square, to_mel, the Log


def test_a_log_of_power_plus_a_tiny_epsilon_stays_finite_on_silent_frames(graph, tmp_path):
    """log(power @ mel + 1e-10): the Add was kept FP32 for its epsilon, but its output went to an FP16 Log, and FP16
    holds 1e-10 as 0: every silent frame became -inf (NaN after the next layer) where FP32 gives log(1e-10) = -23.
    A tensor holding values FP16 rounds to 0 is tried with them 0; here that moves the outputs, so its producer and
    its readers stay FP32."""
    mel = np.abs(RNG.normal(size=(BINS, MELS))).astype(np.float32)
    weights = {"window": np.hanning(FRAME).astype(np.float32), "basis": _basis(), "mel": mel,
               "epsilon": np.array(EPSILON, np.float32)}  # fmt: skip
    path = graph(tmp_path / "log_mel.onnx", [*_spectrum_nodes(), *_log_mel_nodes("power")], weights,
                 {"x": FRAME}, {"y": MELS})  # fmt: skip
    built, emulated = _fp16_build(path, tmp_path)
    held_out = _frames(64)
    reference, got = _run(path, held_out), _run(emulated, held_out)
    silent = ~held_out["x"].any(axis=1)
    print(f"silent rows: FP32 {reference[silent][0]}, FP16 {got[silent][0]}")
    np.testing.assert_allclose(reference[silent], np.log(np.float32(EPSILON)), rtol=1e-6)
    assert np.isfinite(got).all()  # before: -inf on every silent row
    np.testing.assert_allclose(got[silent], reference[silent], rtol=1e-3)
    np.testing.assert_allclose(got[~silent], reference[~silent], atol=0.05)
    range_check = built.params["fp16_range"]
    assert {"floor", "log"} <= set(range_check["kept_nodes"])
    assert "flushed to 0" in range_check["kept_because"]["floored"]


def test_values_fp16_flushes_to_zero_before_a_relu_leave_it_fp16(graph, tmp_path, monkeypatch):
    """The same floor read by a Relu instead of a Log: zero for 1e-10 moves no output at its scale, so the flush
    keeps nothing FP32 (a softmax's far tail, in every transformer, is such a tensor)."""
    from qbench.variants import fp16_range

    tried = []
    real = fp16_range.harmless_by_halves
    monkeypatch.setattr(fp16_range, "harmless_by_halves", lambda names, change: tried.extend(names) or real(names, change))
    nodes = [*_spectrum_nodes(), helper.make_node("MatMul", ["power", "mel"], ["mel_power"], name="to_mel"),
             helper.make_node("Add", ["mel_power", "epsilon"], ["floored"], name="floor"),
             helper.make_node("Relu", ["floored"], ["y"], name="relu")]  # fmt: skip
    weights = {"window": np.hanning(FRAME).astype(np.float32), "basis": _basis(),
               "mel": np.abs(RNG.normal(size=(BINS, MELS))).astype(np.float32),
               "epsilon": np.array(EPSILON, np.float32)}  # fmt: skip
    path = graph(tmp_path / "relu.onnx", nodes, weights, {"x": FRAME}, {"y": MELS})
    built, _ = _fp16_build(path, tmp_path)
    range_check = built.params["fp16_range"]
    assert "floored" in tried  # the floor on silent rows was tried ...
    assert "relu" not in range_check["kept_nodes"]  # ... and found harmless
    assert not any("flushed" in why for why in range_check["kept_because"].values())


def test_values_crossing_zero_by_chance_are_not_tried_as_flushed():
    """A unit-scale tensor holds a few values under 2**-25 by chance (about 6e-8 of them): their flush is noise,
    and trying it cost a 6-layer BERT's FP16 build a trial per such tensor (33 s -> 118 s on 128 rows). A floor on
    a quarter of the rows is tried, from the first batch that holds it."""
    from qbench.variants.fp16_range import Extent

    noise = RNG.normal(size=2_000_000)
    noise[:3] = [1e-9, -2e-8, 1e-10]
    assert Extent(0.0).joined(noise, 0).first_flushed is None
    floor = np.where(np.arange(4000) % 4 == 0, 1e-10, RNG.uniform(1, 100, 4000))
    joined = Extent(0.0).joined(np.ones(10), 0).joined(floor, 1).joined(floor, 2)
    assert joined.first_flushed == 1 and joined.largest == pytest.approx(floor.max())
    assert Extent(0.0).joined(np.zeros(8), 0).first_flushed is None  # zeros are not flushed: FP16 holds them
