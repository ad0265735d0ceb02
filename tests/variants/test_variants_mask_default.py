"""Static INT8 and FP8 keep attention-mask arithmetic float by default (`keep_float: [masks]` unless the recipe sets
keep_float): a finite fill (-1e4, -1e9) would otherwise set the range of the masked scores and flatten attention."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.recipe.spec import VariantSpec
from qbench.search.candidates import Candidate
from qbench.variants import build_variant
from qbench.variants.base import BuildContext, Feeds
from qbench.variants.float_rules import kept_float_nodes
from tests.variants.test_variants_float_rules import ORT_IR_VERSION, _batches, _fed_by_dequantize, masked_attention

FLOAT32_MIN = float(np.finfo(np.float32).min)
STATIC = [("int8", "minmax"), ("int8", "entropy"), ("int8", "percentile"), ("fp8", "minmax")]


def _with_fill(fill: float) -> onnx.ModelProto:
    model = masked_attention(np.random.default_rng(0))
    for tensor in model.graph.initializer:
        if tensor.name == "big":
            tensor.CopyFrom(numpy_helper.from_array(np.array(fill, np.float32), "big"))
    return model


def _build(model: onnx.ModelProto, workdir: Path, precision: str, calibrator: str, **options):
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "model.onnx"
    onnx.save(model, str(path))
    calibration = _batches(np.random.default_rng(1), 4)
    spec = VariantSpec(name="v", precision=precision, calibrator=calibrator, **options)
    return path, build_variant(spec,
                               BuildContext(reference_path=path, workdir=workdir / "built", calibration=calibration))


def _error(reference: Path, variant: Path, feeds: list[Feeds]) -> float:
    """Largest absolute error vs FP32, as a share of FP32's largest output."""
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (reference, variant)]
    errors = []
    for feed in feeds:
        expected, got = (s.run(["y"], feed)[0] for s in sessions)
        errors.append(float(np.abs(got - expected).max() / np.abs(expected).max()))
    return max(errors)


@pytest.mark.parametrize("fill", [-1e4, -1e9, FLOAT32_MIN])
@pytest.mark.parametrize(("precision", "calibrator"), STATIC)
def test_static_builds_keep_the_mask_and_the_softmax_reading_it_float_by_default(fill, precision, calibrator, tmp_path):
    reference, built = _build(_with_fill(fill), tmp_path, precision, calibrator)
    graph = onnx.load(str(built.onnx_path))
    assert not {"mask_apply", "softmax"} & _fed_by_dequantize(graph), "the fill's range reaches no node"
    assert built.params["kept_float_nodes"] == ["mask_cast", "mask_invert", "mask_scale", "mask_apply", "softmax"]
    assert built.params["keep_float"] == {"masks": 5} and "keep_float: [masks]" in built.params["keep_float_default"]
    assert any("5 attention-mask node(s) kept float by default" in note for note in built.notes)
    # an explicit list is the recipe's choice: the same build as the default, said as the recipe's
    _, explicit = _build(_with_fill(fill), tmp_path / "explicit", precision, calibrator, keep_float=["masks"])
    assert _digest(explicit.onnx_path) == _digest(built.onnx_path) and "keep_float_default" not in explicit.params


@pytest.mark.parametrize("fill", [-1e4, -1e9])
@pytest.mark.parametrize("calibrator", ["minmax", "entropy", "percentile"])
def test_a_finite_fill_no_longer_flattens_static_int8_attention(fill, calibrator, tmp_path):
    """Quantized on the fill's range every real score rounds to one value: about the whole output scale wrong. With
    the mask float the error is what INT8 costs elsewhere in the graph (the same build with float32's minimum as
    the fill, which the range rule already handled)."""
    feeds = _batches(np.random.default_rng(7), 2)
    reference, built = _build(_with_fill(fill), tmp_path, "int8", calibrator)
    _, off = _build(_with_fill(fill), tmp_path / "off", "int8", calibrator, keep_float=[])
    _, handled = _build(_with_fill(FLOAT32_MIN), tmp_path / "min", "int8", calibrator, keep_float=[])
    elsewhere = _error(tmp_path / "min" / "model.onnx", handled.onnx_path, feeds)
    assert _error(reference, off.onnx_path, feeds) > 2 * elsewhere  # what the default was: attention gone
    assert _error(reference, built.onnx_path, feeds) <= 1.5 * elsewhere


def test_an_explicit_empty_keep_float_turns_the_default_off_and_keys_differently(tmp_path):
    _, off = _build(_with_fill(-1e4), tmp_path, "int8", "minmax", keep_float=[])
    assert {"mask_apply", "softmax"} <= _fed_by_dequantize(onnx.load(str(off.onnx_path)))
    assert "keep_float" not in off.params
    unset = VariantSpec(name="v", precision="int8", calibrator="minmax")
    empty = VariantSpec(name="v", precision="int8", calibrator="minmax", keep_float=[])
    assert "keep_float" not in unset.model_dump()  # recipes without keep_float keep their fingerprints
    assert empty.model_dump()["keep_float"] == []  # and one that turns the default off does not share them
    assert VariantSpec.model_validate(empty.model_dump()).model_dump() == empty.model_dump()


def test_dynamic_int8_has_no_default_rules(tmp_path):
    _, built = _build(_with_fill(-1e4), tmp_path, "int8", "dynamic")
    assert "keep_float" not in built.params and "keep_float_default" not in built.params


def test_the_search_static_candidate_keeps_the_mask_float(tmp_path):
    model_path = tmp_path / "model.onnx"
    onnx.save(_with_fill(-1e4), str(model_path))
    ctx = BuildContext(reference_path=model_path, workdir=tmp_path / "built",
                       calibration=_batches(np.random.default_rng(1), 4))  # fmt: skip
    built = build_variant(Candidate("ort-static").spec("candidate"), ctx)
    assert "softmax" in built.params["kept_float_nodes"] and "keep_float_default" in built.params


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = {"w": rng.normal(0, 0.3, (4, 1, 3, 3)), "fc": rng.normal(0, 0.3, (64, 3)), "shape": np.array([0, -1])}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "fc"], ["y"], name="fc"),
    ]
    initializers = [numpy_helper.from_array(v.astype(np.int64 if k == "shape" else np.float32), k)
                    for k, v in weights.items()]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
                              initializers)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ORT_IR_VERSION)


@pytest.mark.parametrize(("precision", "calibrator"), STATIC)
def test_a_model_without_a_mask_builds_as_before(precision, calibrator, tmp_path):
    model = _cnn()
    assert kept_float_nodes(model, ["masks"], default=True).params() == {}
    path = tmp_path / "cnn.onnx"
    onnx.save(model, str(path))
    calibration = [{"x": np.random.default_rng(i).normal(size=(4, 1, 4, 4)).astype(np.float32)} for i in range(3)]
    built = {}
    for name, options in (("default", {}), ("off", {"keep_float": []})):
        spec = VariantSpec(name="v", precision=precision, calibrator=calibrator, **options)
        built[name] = build_variant(spec,
                                    BuildContext(reference_path=path, workdir=tmp_path / name, calibration=calibration))
    assert _digest(built["default"].onnx_path) == _digest(built["off"].onnx_path)
    assert built["default"].params.keys() == built["off"].params.keys() and "keep_float" not in built["default"].params
