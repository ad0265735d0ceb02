"""A tensor holding NaN/inf on the calibration rows stays float in every quantized build (`nonfinite_scan`).

The graph reads NaN as missing: h = MatMul(x * g) is NaN on the rows where x has a NaN, IsNaN(h) picks a fill value
there. Quantize-dequantize would turn the NaN into a number and IsNaN would no longer see it; the test graph exposes
IsNaN's mask so each variant's can be compared with FP32's, computed by onnxruntime directly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import ORT_IR_VERSION, run_variant
from onnx import TensorProto, helper, numpy_helper

from qbench.recipe.spec import VariantSpec
from qbench.variants import BuildContext, build_variant
from qbench.variants.calibrate import compute_ranges
from qbench.variants.histograms import NONFINITE
from qbench.variants.nonfinite_scan import nonfinite_tensors

WIDTH = 4
VARIANTS = [
    {"precision": "int8", "calibrator": "minmax"},
    {"precision": "int8", "calibrator": "entropy"},
    {"precision": "int8", "calibrator": "dynamic"},
    {"precision": "fp8", "calibrator": "minmax"},
    {"precision": "int8", "technique": "linear", "calibrator": "minmax"},
    {"precision": "int8", "technique": "linear", "calibrator": "dynamic"},
    {"precision": "int8", "calibrator": "minmax", "smoothquant": {"alpha": 0.5}},
]


@pytest.fixture(scope="module")
def missing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """x, z -> g = MatMul(z) -> a = x * g -> h = MatMul(a) -> IsNaN(h) ? fill : h -> MatMul -> y; outputs y and the
    mask; x holds NaN in one column on every third row."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["z", "wz"], ["g"], name="gate"),
        helper.make_node("Mul", ["x", "g"], ["a"], name="mul"),
        helper.make_node("MatMul", ["a", "w1"], ["h"], name="mm1"),
        helper.make_node("IsNaN", ["h"], ["missing"], name="isnan"),
        helper.make_node("Where", ["missing", "fill", "h"], ["hf"], name="where"),
        helper.make_node("MatMul", ["hf", "w2"], ["y"], name="mm2"),
    ]
    weights = {"wz": rng.normal(size=(WIDTH, WIDTH)), "w1": rng.normal(size=(WIDTH, WIDTH)),
               "fill": np.full(WIDTH, 3.0), "w2": rng.normal(size=(WIDTH, 3))}  # fmt: skip
    graph = helper.make_graph(
        nodes, "missing",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", WIDTH]) for name in ("x", "z")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("missing", TensorProto.BOOL, ["batch", WIDTH])],
        initializer=[numpy_helper.from_array(value.astype(np.float32), name) for name, value in weights.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ORT_IR_VERSION)
    path = tmp_path_factory.mktemp("missing") / "missing.onnx"
    onnx.save(model, str(path))
    x = rng.normal(size=(64, WIDTH)).astype(np.float32)
    x[::3, 1] = np.nan
    return path, {"x": x, "z": rng.normal(size=(64, WIDTH)).astype(np.float32)}


def _batches(feeds: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    return [{name: value[start : start + 16] for name, value in feeds.items()} for start in range(0, 64, 16)]


def _outputs(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_minmax_leaves_the_tensors_holding_nan_float_as_the_histogram_calibrators_do(missing, tmp_path):
    path, feeds = missing
    found = {method: compute_ranges(path, _batches(feeds), method, workdir=tmp_path / method)
             for method in ("minmax", "entropy", "percentile")}  # fmt: skip
    for calibrated in found.values():
        assert {name for name, why in calibrated.skipped.items() if why == NONFINITE} == {"x", "a", "h"}
        assert not {"x", "a", "h"} & set(calibrated.ranges.keys())
        assert {"g", "hf"} <= set(calibrated.ranges.keys())


def test_the_scan_finds_nan_and_inf_wherever_they_are_and_nothing_on_finite_rows(missing, tmp_path):
    path, feeds = missing
    model = onnx.load(str(path))
    tensors = ["x", "z", "g", "a", "h", "hf", "y", "not-a-tensor"]
    assert nonfinite_tensors(model, tensors, _batches(feeds), tmp_path) == {"x", "a", "h"}
    finite = {name: np.nan_to_num(value) for name, value in feeds.items()}
    assert nonfinite_tensors(model, tensors, _batches(finite), tmp_path) == set()
    finite["z"][5, 2] = np.inf  # one value in one late row: g is inf there, a = x * g too
    assert nonfinite_tensors(model, tensors, _batches(finite), tmp_path) >= {"z", "g", "a"}


@pytest.mark.parametrize("variant", VARIANTS,
                         ids=lambda v: "-".join(str(v[k]) for k in ("technique", "calibrator") if k in v)
                         + ("-smoothquant" if "smoothquant" in v else "") + f"-{v['precision']}")  # fmt: skip
def test_no_variant_turns_the_missing_marker_into_a_number(missing, tmp_path, variant):
    path, feeds = missing
    context = BuildContext(reference_path=path, workdir=tmp_path, calibration=_batches(feeds))
    built = build_variant(VariantSpec(name="v", **variant), context)
    session = ort.InferenceSession(str(built.onnx_path), providers=["CPUExecutionProvider"])
    mask = session.run(["missing"], feeds)[0]
    expected = _outputs(path, feeds)[1]
    assert expected.any(axis=1).sum() == np.isnan(feeds["x"][:, 1]).sum()
    np.testing.assert_array_equal(mask, expected)
    assert np.isfinite(run_variant(built, feeds)).all()
    said = " ".join(built.notes)
    assert "NaN" in said and ("x" in said or "a" in said)
