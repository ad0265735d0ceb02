"""Calibration passes shared by builds (qbench.variants.pass_memo): SmoothQuant dynamic and static of one model collect
their channel ranges once, a static build and its reduce_range twin calibrate once, and what a build gets from the
memo is what it would have computed itself; other rows or another graph are calibrated anew. Each test starts with
empty memos (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from test_variants_smoothquant import _batches, ffn_block

from qbench.recipe.spec import SmoothQuantSpec, VariantSpec
from qbench.variants import build_variant, calibrate, smoothquant
from qbench.variants.base import BuildContext
from qbench.variants.onnx_utils import graph_digest
from qbench.variants.pass_memo import PassMemo, batches_digest


def _counting(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[object]:
    """Replace `module.name` by a wrapper recording each call; returns the record."""
    calls: list[object] = []
    original = getattr(module, name)

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def _calibration_passes(sessions: list[object]) -> int:
    """The ORT sessions opened on SmoothQuant's calibration graph (the passes over the calibration rows)."""
    return sum(str(args[0]).endswith("smoothquant-calibration.onnx") for args in sessions)


def _smoothquant(name: str, calibrator: str, **options: object) -> VariantSpec:
    return VariantSpec(name=name, precision="int8", technique="smoothquant", calibrator=calibrator,
                       smoothquant=SmoothQuantSpec(alpha="auto"), **options)  # fmt: skip


def _model(tmp_path: Path, seed: int = 3) -> Path:
    path = tmp_path / f"ffn-{seed}.onnx"
    onnx.save(ffn_block(np.random.default_rng(seed)), str(path))
    return path


def test_smoothquant_dynamic_and_static_collect_channel_ranges_once(monkeypatch, tmp_path: Path) -> None:
    path, calibration = _model(tmp_path), _batches(np.random.default_rng(4), 3)
    sessions = _counting(monkeypatch, smoothquant.ort, "InferenceSession")
    built = {c: build_variant(_smoothquant(f"sq-{c}", c), BuildContext(path, tmp_path / c, calibration))
             for c in ("dynamic", "minmax")}  # fmt: skip
    assert _calibration_passes(sessions) == 1  # the static build reused the dynamic build's pass
    # the static build from the memo is the build made without it
    smoothquant.CHANNEL_RANGES.clear()
    alone = build_variant(_smoothquant("sq-minmax", "minmax"), BuildContext(path, tmp_path / "alone", calibration))
    assert _calibration_passes(sessions) == 2
    assert graph_digest(alone.onnx_path) == graph_digest(built["minmax"].onnx_path)
    assert alone.params["alphas_chosen"] == built["minmax"].params["alphas_chosen"]


def test_other_rows_or_another_graph_are_calibrated_anew(monkeypatch, tmp_path: Path) -> None:
    calibration = _batches(np.random.default_rng(4), 3)
    changed = [dict(batch) for batch in calibration]
    changed[-1] = {"x": changed[-1]["x"].copy()}
    changed[-1]["x"][0, 0, 0] += 1.0  # one value of one row
    sessions = _counting(monkeypatch, smoothquant.ort, "InferenceSession")
    first = build_variant(_smoothquant("a", "minmax"), BuildContext(_model(tmp_path), tmp_path / "a", calibration))
    build_variant(_smoothquant("b", "minmax"), BuildContext(_model(tmp_path), tmp_path / "b", changed))
    other = build_variant(_smoothquant("c", "minmax"), BuildContext(_model(tmp_path, 5), tmp_path / "c", calibration))
    assert _calibration_passes(sessions) == 3
    assert batches_digest(changed) != batches_digest(calibration)
    assert graph_digest(other.onnx_path) != graph_digest(first.onnx_path)


def test_a_static_build_and_its_reduce_range_twin_calibrate_once(monkeypatch, tmp_path: Path) -> None:
    path, calibration = _model(tmp_path), _batches(np.random.default_rng(6), 3)
    calibrators = _counting(monkeypatch, calibrate, "create_calibrator")

    def static(name: str, reduce_range: bool, workdir: Path) -> object:
        spec = VariantSpec(name=name, precision="int8", calibrator="minmax", reduce_range=reduce_range)
        return build_variant(spec, BuildContext(path, workdir, calibration))

    static("base", False, tmp_path / "base")
    twin = static("twin", True, tmp_path / "twin")
    assert len(calibrators) == 1
    calibrate.RANGES.clear()
    alone = static("twin", True, tmp_path / "alone")
    assert len(calibrators) == 2
    assert twin.activation_ranges == alone.activation_ranges
    assert graph_digest(twin.onnx_path) == graph_digest(alone.onnx_path)
    cache = "twin.calibration.json"
    assert (twin.onnx_path.parent / cache).read_text() == (alone.onnx_path.parent / cache).read_text()


def test_what_the_memo_hands_out_cannot_change_what_it_holds() -> None:
    memo = PassMemo()
    got = memo.get("k", lambda: {"low": np.zeros(2)})
    got["low"][0] = 7.0
    again = memo.get("k", lambda: {"low": np.ones(2)})
    assert memo.runs == 1 and again["low"].tolist() == [0.0, 0.0]


def test_the_memo_holds_only_its_most_recent_passes() -> None:
    memo = PassMemo(entries=2)
    for key in ("a", "b", "a", "c"):  # "a" used again before "c": "b" is the one dropped
        memo.get(key, lambda key=key: key)
    assert memo.runs == 3
    memo.get("a", lambda: "a")
    assert memo.runs == 3
    memo.get("b", lambda: "b")
    assert memo.runs == 4
