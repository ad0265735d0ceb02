"""Histogram calibration: the vectorised entropy search equals ORT's, and bad tensors are skipped by name."""

from __future__ import annotations

import time

import numpy as np
import pytest
from onnx import helper
from onnxruntime.quantization.calibrate import HistogramCollector

from qbench.recipe.spec import VariantSpec
from qbench.variants import BuildContext, build_variant
from qbench.variants.calibrate import compute_ranges
from qbench.variants.histograms import GuardedHistogramCollector, entropy_threshold

FLOAT32_LOWEST = float(np.finfo(np.float32).min)


@pytest.mark.parametrize(("bins", "scale"), [(512, 1.0), (300, 2.0), (128, 1.0)])
def test_entropy_threshold_equals_orts_search(bins, scale):
    rng = np.random.default_rng(bins)
    collector = HistogramCollector("entropy", False, bins, 128, 99.9, "same")
    for batch in range(3):
        collector.collect({"t": [(rng.standard_t(3, size=400) * scale * (batch + 1)).astype(np.float32)]})
    histogram = collector.histogram_dict["t"]
    started = time.perf_counter()
    expected = collector.get_entropy_threshold(histogram, 128)
    ort_seconds = time.perf_counter() - started
    started = time.perf_counter()
    got = entropy_threshold(histogram, 128)
    print(f"{histogram[0].size} bins: ORT {ort_seconds:.3f} s, qbench {time.perf_counter() - started:.3f} s")
    assert (float(got[0]), float(got[1])) == (float(expected[0]), float(expected[1]))


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_collector_skips_masks_infinities_and_gives_constants_their_range(method):
    collector = GuardedHistogramCollector(method, False, 256, 128, 99.0)
    rng = np.random.default_rng(0)
    for _ in range(2):
        collector.collect({
            "good": [rng.normal(size=300).astype(np.float32)],
            "mask": [np.where(rng.random(300) > 0.5, 0.0, FLOAT32_LOWEST).astype(np.float32)],
            "inf": [np.array([1.0, np.inf], dtype=np.float32)],
            "constant": [np.full(10, 3.0, dtype=np.float32)],
        })  # fmt: skip
    results = collector.compute_collection_result()
    assert set(results) == {"good", "constant"}
    assert float(results["constant"].range_value[0]) == float(results["constant"].range_value[1]) == 3.0
    assert "a mask?" in collector.skipped["mask"] and "left unquantized" in collector.skipped["mask"]
    assert "NaN or infinity" in collector.skipped["inf"]
    assert collector.skipped["constant"] == "constant (3); min/max range used"


@pytest.fixture(scope="module")
def masked(tmp_path_factory, graph):
    """scores = x @ w + mask_bias (x float mask of 0 / float32's lowest, as attention masks are) -> MatMul."""
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm1"),
        helper.make_node("Add", ["h", "mask_bias"], ["scores"], name="add_mask"),
        helper.make_node("MatMul", ["scores", "w2"], ["y"], name="mm2"),
    ]
    weights = {"w": rng.normal(size=(8, 8)).astype(np.float32), "w2": rng.normal(size=(8, 4)).astype(np.float32)}
    path = graph(tmp_path_factory.mktemp("masked") / "masked.onnx", nodes, weights, {"x": 8, "mask_bias": 8}, {"y": 4})
    mask = np.where(rng.random((16, 8)) > 0.7, FLOAT32_LOWEST, 0.0).astype(np.float32)
    batches = [{"x": rng.normal(size=(16, 8)).astype(np.float32), "mask_bias": mask} for _ in range(3)]
    return path, batches


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_a_mask_tensor_does_not_fail_calibration_and_is_named(masked, tmp_path, method):
    path, batches = masked
    calibrated = compute_ranges(path, batches, method, op_types=["MatMul", "Add"], workdir=tmp_path)
    # scores and y (scores @ w2 overflows to inf) carry the mask's values
    assert set(calibrated.skipped) == {"mask_bias", "scores", "y"}
    assert "x" in calibrated.ranges and "h" in calibrated.ranges and "scores" not in calibrated.ranges
    assert "mask_bias" in calibrated.notes()[0] and "scores" in calibrated.notes()[0]


def test_an_int8_variant_builds_around_the_mask_and_says_so(masked, tmp_path):
    path, batches = masked
    spec = VariantSpec(name="int8-pct", precision="int8", calibrator="percentile", op_types=["MatMul", "Add"])
    built = build_variant(spec, BuildContext(reference_path=path, workdir=tmp_path, calibration=batches))
    assert set(built.params["uncalibrated_tensors"]) == {"mask_bias", "scores", "y"}
    assert any("not calibrated" in note and "mask_bias" in note for note in built.notes)
    assert built.params["unranged_nodes_kept_fp32"] == ["add_mask", "mm2"]
    assert built.params["quantized_op_types"]["MatMul"] == 1  # mm1 (x and h have ranges), not mm2
