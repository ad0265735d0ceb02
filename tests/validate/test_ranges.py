"""Range analysis: the pure reductions against hand-computed values, then a sweep on a tiny model
whose activations overflow FP16 on one slice only, a slice that calibration never saw."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from qbench.results.schema import ClipRecord, from_dict, to_json
from qbench.validate.ranges import (
    FP16_MAX,
    GRAPH_INPUT,
    CalibratedVariant,
    analyse_ranges,
    bf16_saturated,
    clip_record,
    coverage_warnings,
    expose_float_tensors,
    fp16_handled,
    limit_checks,
    over_limit,
    row_abs_max,
    row_out_of_range,
    rows_per_batch,
    scope_max,
    scope_sum,
)

# -- pure reductions ------------------------------------------------------------------------------------


def test_row_abs_max_per_leading_row_ignoring_nan() -> None:
    values = np.array([[[1.0, -5.0], [2.0, 0.5]], [[np.nan, -0.25], [0.0, 3.0]], [[-np.inf, 1.0], [0.0, 0.0]]])
    assert row_abs_max(values, 3).tolist() == [5.0, 3.0, math.inf]
    assert row_abs_max(values, 2) is None  # leading dimension is not the batch
    assert row_abs_max(np.float32(4.0), 1) is None


def test_row_out_of_range_counts_values_outside_the_interval() -> None:
    values = np.array([[-2.0, -1.0, 0.0, 1.0], [1.5, 1.0, 3.0, -0.5]])
    # interval [-1, 1]: row 0 -> -2 only; row 1 -> 1.5 and 3.0
    assert row_out_of_range(values, 2, -1.0, 1.0).tolist() == [1, 2]
    assert row_out_of_range(values, 4, -1.0, 1.0) is None


def test_scope_reductions_over_masks() -> None:
    per_row = np.array([3.0, 7.0, 1.0, np.nan])
    masks = np.array([[True, True, True, True], [True, False, True, False], [False, False, False, True]])
    # overall max 7 (NaN ignored); scope 1 rows 0, 2 -> 3; scope 2 only the NaN row -> 0
    assert scope_max(per_row, masks).tolist() == [7.0, 3.0, 0.0]
    assert scope_sum(np.array([2, 0, 5, 1]), masks).tolist() == [8, 7, 1]


def test_over_limit_lists_tensors_by_ratio_with_their_nodes() -> None:
    abs_max = {"a": 70000.0, "b": 100.0, "c": math.inf, "d": math.nan, "e": 200.0}
    limits = {"a": FP16_MAX, "b": 448.0, "c": FP16_MAX, "d": 1.0, "e": 100.0}
    peaks = over_limit(abs_max, limits, {"a": "node_a", "c": "node_c", "e": "node_e"})
    # c is infinite; e is 2x its limit; a is 70000 / 65504 = 1.07x; b is under; NaN d is not "over"
    assert [(p.tensor, p.node) for p in peaks] == [("c", "node_c"), ("e", "node_e"), ("a", "node_a")]
    assert peaks[2].limit == 65504.0


def test_clip_record_totals_and_worst_tensor() -> None:
    clipped = {"t1": 3, "t2": 10, "t3": 0}
    values = {"t1": 4, "t2": 100, "t3": 50}
    record = clip_record("int8", "s", clipped, values, {"t1": "n1", "t2": "n2"})
    # 13 of 154 values; t1 has the largest share (3/4) even though t2 clips more values
    assert (record.clipped, record.values) == (13, 154)
    assert record.share == pytest.approx(13 / 154)
    assert (record.worst_tensor, record.worst_node, record.worst_share) == ("t1", "n1", 0.75)
    nothing = clip_record("int8", "s", {"t3": 0}, values, {})
    assert (nothing.share, nothing.worst_tensor, nothing.worst_share) == (0.0, None, 0.0)


def test_coverage_warning_needs_zero_calibration_rows_and_clipping() -> None:
    records = [
        ClipRecord("int8", "overall", 5, 100, 0.05, "t", "n", 0.1),
        ClipRecord("int8", "hot", 5, 10, 0.5, "t", "n", 1.0),  # 0 calibration rows, clips -> warning
        ClipRecord("int8", "cold", 0, 10, 0.0),  # 0 calibration rows, clips nothing
        ClipRecord("int8", "warm", 2, 10, 0.2, "t", "n", 0.2),  # calibrated on
        ClipRecord("int8", "unknown", 2, 10, 0.2, "t", "n", 0.2),  # no recorded count
    ]
    warnings = coverage_warnings(records, {"hot": 0, "cold": 0, "warm": 3})
    assert [(w.slice, w.variant, w.worst_node) for w in warnings] == [("hot", "int8", "n")]
    assert "'hot'" in warnings[0].message and "clips 50%" in warnings[0].message and "'n'" in warnings[0].message


def test_limit_checks_scale_fp8_by_the_variant_ranges() -> None:
    abs_max = {"overall": {"x": 500.0, "y": 3.0}}
    nodes = {"x": GRAPH_INPUT, "y": "relu"}
    raw = {c.format: c for c in limit_checks(abs_max, nodes, [])}
    assert [p.tensor for p in raw["fp8_e4m3"].over["overall"]] == ["x"]  # 500 > 448
    assert raw["fp16"].over["overall"] == ()
    fp8 = CalibratedVariant("fp8", "fp8", {"y": (-2.0, 2.0)})  # scale 2 / 448: y's limit is 2
    scaled = [c for c in limit_checks(abs_max, nodes, [fp8]) if c.format == "fp8_e4m3"]
    assert len(scaled) == 1 and scaled[0].scaled_by == "fp8"
    assert [(p.tensor, p.limit) for p in scaled[0].over["overall"]] == [("y", 2.0)]  # x has no FP8 scale


# -- the pass on a tiny model ---------------------------------------------------------------------------

GAIN = 1000.0  # amplify: x * 1000, so inputs of 70 or more overflow FP16 (65504)


def tiny_model(path: Path, batch: int | str = "batch") -> Path:
    """x [N, 4] -> `amplify` (Mul by 1000) -> `amplified` -> `head` (MatMul, 4 x 3, weights 0.01) -> logits;
    N is `batch`, fixed (an int) or symbolic (a name)."""
    weights = np.full((4, 3), 0.01, dtype=np.float32)
    weights[:, 1] = -0.02
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "gain"], ["amplified"], name="amplify"),
         helper.make_node("MatMul", ["amplified", "w"], ["logits"], name="head")],  # fmt: skip
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 3])],
        initializer=[numpy_helper.from_array(np.array(GAIN, dtype=np.float32), "gain"),
                     numpy_helper.from_array(weights, "w")],  # fmt: skip
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def tiny_rows() -> tuple[np.ndarray, np.ndarray]:
    """40 normal rows (x in [0, 1)) then 8 hot rows (x in [70, 100)): only hot rows overflow FP16 after `amplify`."""
    rng = np.random.default_rng(3)
    normal = rng.uniform(0.0, 1.0, size=(40, 4))
    hot = rng.uniform(70.0, 100.0, size=(8, 4))
    return np.concatenate([normal, hot]).astype(np.float32), np.array(["normal"] * 40 + ["hot"] * 8)


def test_expose_float_tensors_names_producing_nodes(tmp_path: Path) -> None:
    exposed, nodes = expose_float_tensors(onnx.load(str(tiny_model(tmp_path / "tiny.onnx"))))
    assert nodes == {"x": GRAPH_INPUT, "amplified": "amplify", "logits": "head"}
    assert [o.name for o in exposed.graph.output] == ["logits", "amplified"]


def test_analyse_ranges_on_hand_computed_activations(tmp_path: Path) -> None:
    x, kind = tiny_rows()
    slices = {"kind=hot": kind == "hot", "kind=normal": kind == "normal"}
    # a variant whose range for `amplified` is [0, 500]: normal rows above 0.5 and every hot value clip
    variant = CalibratedVariant("int8", "int8", {"amplified": (0.0, 500.0)})
    analysis = analyse_ranges(tiny_model(tmp_path / "tiny.onnx"), {"x": x}, slices, batch_size=5,
                              variants=[variant], calibration_counts={"kind=hot": 0, "kind=normal": 40})  # fmt: skip
    amplified = x * np.float32(GAIN)
    assert analysis.abs_max["kind=hot"]["amplified"] == pytest.approx(float(amplified[40:].max()))
    assert analysis.abs_max["kind=normal"]["amplified"] == pytest.approx(float(amplified[:40].max()))
    assert analysis.abs_max["overall"]["x"] == pytest.approx(float(x.max()))
    fp16 = next(c for c in analysis.limits if c.format == "fp16")
    assert [p.tensor for p in fp16.over["kind=hot"]] == ["amplified"] and fp16.over["kind=normal"] == ()
    records = {r.scope: r for r in analysis.clipping}
    assert (records["kind=hot"].clipped, records["kind=hot"].values) == (32, 32)
    assert records["kind=normal"].clipped == int(np.count_nonzero(amplified[:40] > 500.0))
    assert records["overall"].clipped == 32 + records["kind=normal"].clipped
    assert [(w.slice, w.worst_node) for w in analysis.warnings] == [("kind=hot", "amplify")]
    assert from_dict(json.loads(to_json_with(analysis))).ranges == analysis



def fused_model(path: Path) -> Path:
    """x [N, 2, 4] -> `fused` (com.microsoft SkipLayerNormalization of x + x, as ONNX Runtime's transformer
    optimizer writes it) -> `normed` -> `head` (MatMul, 4 x 3) -> logits: ONNX knows no com.microsoft schema, so its
    shape inference leaves `normed`, the tensor the MatMul's quantizer calibrates, untyped."""
    weights = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    graph = helper.make_graph(
        [helper.make_node("SkipLayerNormalization", ["x", "x", "gamma", "beta"], ["normed"], name="fused",
                          domain="com.microsoft", epsilon=1e-5),
         helper.make_node("MatMul", ["normed", "w"], ["logits"], name="head")],  # fmt: skip
        "fused",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2, 3])],
        initializer=[numpy_helper.from_array(np.full(4, 2.0, dtype=np.float32), "gamma"),
                     numpy_helper.from_array(np.full(4, 0.5, dtype=np.float32), "beta"),
                     numpy_helper.from_array(weights, "w")],  # fmt: skip
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_analyse_ranges_sees_the_tensors_after_a_fused_contrib_operator(tmp_path: Path) -> None:
    x = np.random.default_rng(5).normal(size=(12, 2, 4)).astype(np.float32)
    doubled = 2 * x
    centred = doubled - doubled.mean(axis=-1, keepdims=True)
    normed = 2.0 * centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + 1e-5) + 0.5
    variant = CalibratedVariant("int8", "int8", {"normed": (-1.0, 1.0)})
    analysis = analyse_ranges(fused_model(tmp_path / "fused.onnx"), {"x": x}, {}, batch_size=4, variants=[variant])
    assert analysis.abs_max["overall"]["normed"] == pytest.approx(float(np.abs(normed).max()), rel=1e-4)
    records = {r.scope: r for r in analysis.clipping}
    assert (records["overall"].clipped, records["overall"].values) == (int(np.count_nonzero(np.abs(normed) > 1.0)),
                                                                       normed.size)


def to_json_with(analysis) -> str:
    """A minimal results.json carrying `analysis`, to check the section's round trip."""
    raw = json.loads(to_json(analysis))
    return json.dumps({"schema_version": 1, "qbench_version": "0", "created_at": "", "recipe": {}, "calibration": None,
                       "evaluation_rows": 48, "gate_metric": "agreement", "reference": "fp32", "variants": [],
                       "ranges": raw})  # fmt: skip


# -- a whole sweep ---------------------------------------------------------------------------------------


def write_project(root: Path, **recipe_changes: object) -> Path:
    x, kind = tiny_rows()
    pd.DataFrame({"x": list(x), "kind": kind}).to_parquet(root / "rows.parquet")
    tiny_model(root / "tiny.onnx")
    recipe = {
        "name": "tiny-ranges",
        "model": {"path": "tiny.onnx"},
        "data": {
            "path": "rows.parquet",
            "inputs": {"x": "x"},
            "calibration": {"filter": {"kind": "normal"}, "samples": 16, "batch_size": 8},
            "evaluation": {"batch_size": 16},
            "slices": [{"by": "kind"}],
        },
        "variants": [{"name": "int8", "precision": "int8", "calibrator": "minmax", "op_types": ["MatMul"]}],
        "latency": {"batch_sizes": [1], "warmup": 0, "iterations": 1, "threads": 1},
        "gate": {"metric": "agreement"},
        "output_dir": str(root / "reports"),
        **recipe_changes,
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@pytest.mark.slow
def test_sweep_reports_fp16_overflow_and_uncovered_slice(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from qbench.results.schema import read_results
    from qbench.sweep.runner import run_sweep

    outcome = run_sweep(write_project(tmp_path), track=False)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name == "qbench.sweep.runner"]
    assert any("calibration coverage" in w and "'kind=hot'" in w and "'amplify'" in w for w in warned), warned

    results = read_results(outcome.results_path)
    assert results.ranges is not None and results.ranges == outcome.results.ranges
    built_ranges = results.ranges.clipping
    hot = next(r for r in built_ranges if r.variant == "int8" and r.scope == "kind=hot")
    assert hot.share == 1.0 and hot.worst_node == "amplify"  # calibration saw amplified values below 1000 only
    assert [(w.slice, w.variant, w.worst_node) for w in results.ranges.warnings] == [("kind=hot", "int8", "amplify")]
    assert results.timings["ranges"] > 0

    report = outcome.report_path.read_text()
    section = report[report.index("## Activation ranges") :]
    fp16_line = next(line for line in section.splitlines() if line.startswith("- FP16"))
    hot_line = section.splitlines()[section.splitlines().index(fp16_line) + 1]
    assert "kind=hot" in hot_line and "`amplified`" in hot_line and "`amplify`" in hot_line
    assert "kind=normal" not in section.split("- BF16")[0].split(fp16_line)[1]
    assert "no calibration rows" in section


@pytest.mark.slow
def test_sweep_without_range_analysis(tmp_path: Path) -> None:
    from qbench.sweep.runner import run_sweep

    outcome = run_sweep(write_project(tmp_path, analysis={"ranges": False}), track=False)
    assert outcome.results.ranges is None and "ranges" not in outcome.results.timings
    assert "## Activation ranges" not in outcome.report_path.read_text()


def argmax_model(path: Path) -> Path:
    """x [N, 4] -> ArgMax -> label [N] (int64): no node makes a float tensor (like a tree ensemble before a ZipMap,
    whose scores ONNX shape inference cannot type)."""
    graph = helper.make_graph(
        [helper.make_node("ArgMax", ["x"], ["label"], name="pick", axis=1, keepdims=0)],
        "argmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_model_without_float_intermediate_tensors_has_nothing_to_analyse(tmp_path: Path) -> None:
    x, kind = tiny_rows()
    assert analyse_ranges(argmax_model(tmp_path / "argmax.onnx"), {"x": x}, {"hot": kind == "hot"}, batch_size=8) is None


@pytest.mark.slow
def test_sweep_of_such_a_model_says_so_without_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from qbench.sweep.runner import run_sweep

    caplog.set_level(logging.INFO, logger="qbench.sweep.runner")
    recipe = write_project(tmp_path, variants=[{"name": "fp16", "precision": "fp16"}])
    argmax_model(tmp_path / "tiny.onnx")
    outcome = run_sweep(recipe, track=False)
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "qbench.sweep.runner"]
    assert not [m for level, m in logged if level == "ERROR"], logged
    assert ("INFO", "  skipped: no node of the model makes a float tensor of known type (nothing to analyse)") in logged
    assert outcome.results.ranges is None
    assert "## Activation ranges" not in outcome.report_path.read_text()


def test_rows_per_batch_fits_the_memory_budget() -> None:
    assert rows_per_batch(bytes_per_row=100, batch_size=64, memory_budget=1000) == 10
    assert rows_per_batch(bytes_per_row=10, batch_size=64, memory_budget=1000) == 64  # capped by the batch size
    assert rows_per_batch(bytes_per_row=5000, batch_size=64, memory_budget=1000) == 1  # never fewer than one row
    assert rows_per_batch(bytes_per_row=0, batch_size=8, memory_budget=1000) == 8


def test_a_small_memory_budget_gives_the_same_analysis(tmp_path: Path) -> None:
    x, kind = tiny_rows()
    slices = {"kind=hot": kind == "hot"}
    variant = CalibratedVariant("int8", "int8", {"amplified": (0.0, 500.0)})
    model = tiny_model(tmp_path / "tiny.onnx")
    whole = analyse_ranges(model, {"x": x}, slices, batch_size=48, variants=[variant])
    # a row's exposed tensors take 4 + 3 floats (amplified, logits): 28 bytes; 60 bytes -> 2 rows per batch
    split = analyse_ranges(model, {"x": x}, slices, batch_size=48, variants=[variant], memory_budget=60)
    assert split.abs_max == whole.abs_max and split.clipping == whole.clipping


def test_a_fixed_batch_model_is_analysed_on_its_rows_only(tmp_path: Path) -> None:
    """Input [5, 4]: 48 rows are 9 batches of 5 and one of 3 hot rows filled with 2 repeats, which count nowhere:
    the figures are those of the same model with a symbolic batch."""
    x, kind = tiny_rows()
    slices = {"kind=hot": kind == "hot"}
    variant = CalibratedVariant("int8", "int8", {"amplified": (0.0, 500.0)})
    dynamic = analyse_ranges(tiny_model(tmp_path / "dynamic.onnx"), {"x": x}, slices, batch_size=5, variants=[variant])
    fixed = analyse_ranges(tiny_model(tmp_path / "fixed.onnx", batch=5), {"x": x}, slices, batch_size=5,
                           variants=[variant], whole=True)  # fmt: skip
    assert fixed.abs_max == dynamic.abs_max and fixed.clipping == dynamic.clipping
    hot = next(r for r in fixed.clipping if r.scope == "kind=hot")
    assert (hot.clipped, hot.values) == (32, 32)


def test_tensors_without_a_batch_dimension_count_in_overall_only(tmp_path: Path) -> None:
    """`offset` is x's column sums reshaped to [1, 4]: no row of it belongs to one evaluation row."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["offset"], name="column_sums", keepdims=1),
         helper.make_node("Add", ["x", "offset"], ["shifted"], name="shift")],  # fmt: skip
        "batchless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("shifted", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(np.array([0], dtype=np.int64), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "batchless.onnx"))
    x = np.array([[1.0, 0, 0, 0], [0, 2.0, 0, 0], [0, 0, 3.0, 0]], dtype=np.float32)
    slices = {"last": np.array([False, False, True])}
    analysis = analyse_ranges(tmp_path / "batchless.onnx", {"x": x}, slices, batch_size=2)
    assert analysis.unattributed == ("offset",)
    # batches [rows 0-1] and [row 2]: offsets (1, 2, 0, 0) and (0, 0, 3, 0); the second one has a leading 1
    # like a one-row batch, but `offset` was found batchless in the first batch and stays out of the slices
    assert analysis.abs_max["overall"]["offset"] == 3.0 and analysis.abs_max["last"]["offset"] == 0.0
    assert analysis.abs_max["last"]["shifted"] == 6.0  # row 2 + offset (0, 0, 3, 0) -> (0, 0, 6, 0)


def test_tensors_the_fp16_variant_keeps_or_clamps_harmlessly_are_not_reported_as_its_overflows() -> None:
    """A mask filled from float32's minimum (clamped harmlessly by the FP16 variant) and raw features it keeps in
    FP32 are over 65504 in the FP32 model, but no FP16 overflow: the count leaves them out, the report says why."""
    from sweep_factory import make_sweep

    from qbench.report.ranges import ranges_section
    from qbench.results.schema import RangeAnalysis
    from qbench.track.content import sweep_metrics

    params = {"fp16_range": {"tensors": {"x": 1e7},
                             "harmless": {"mask": {"max_abs": 3.4e38, "output_change_fp16_spacings": 0.0}}}}
    handled = fp16_handled([("half", params)])
    assert handled == {"x": "half keeps it in FP32", "mask": "half clamps or overflows it harmlessly"}
    assert fp16_handled([("half", params), ("half2", {"fp16_range": {"tensors": {"x": 1e7}}})]) == {
        "x": "half keeps it in FP32; half2 keeps it in FP32"}  # fmt: skip  # mask: half2 overflows it unchecked
    assert fp16_handled([("old", {})]) == {}  # a build without the record: nothing is known to be handled
    abs_max = {"overall": {"x": 1e7, "mask": 3.4e38, "logits": 1e5},
               "kind=hot": {"x": 1e7, "mask": 3.4e38, "logits": 1e5},
               "kind=cold": {"x": 1.0, "mask": 3.4e38, "logits": 1.0}}  # fmt: skip
    nodes = {"x": GRAPH_INPUT, "mask": "mask_add", "logits": "fc"}
    checks = limit_checks(abs_max, nodes, [], handled)
    fp16 = next(c for c in checks if c.format == "fp16")
    assert [(p.tensor, p.handled) for p in fp16.over["kind=hot"]] == [
        ("mask", "half clamps or overflows it harmlessly"), ("x", "half keeps it in FP32"),
        ("logits", None)]  # fmt: skip
    bf16 = next(c for c in checks if c.format == "bf16")
    assert all(p.handled is None for peaks in bf16.over.values() for p in peaks)
    analysis = RangeAnalysis(rows=4, seconds=0.1, nodes=nodes, abs_max=abs_max, limits=checks)
    results = dataclasses.replace(make_sweep(), ranges=analysis)
    metrics = sweep_metrics(results, None)
    assert metrics["range/kind_hot/fp16_overflow_tensors"] == 1.0  # logits only: the FP16 variant overflows there
    assert metrics["range/kind_cold/fp16_overflow_tensors"] == 0.0  # before: 1 (the mask)
    section = ranges_section(results)
    print(section)
    assert ("slice `kind=hot`: `logits` from node `fc` (100,000 > 65,504); no overflow in the sweep's FP16 variant(s): "
            "`mask` from node `mask_add` (3.4e+38 > 65,504: half clamps or overflows it harmlessly), `x` from node "
            "`<graph input>` (10,000,000 > 65,504: half keeps it in FP32)") in section
    assert "slice `kind=cold`: no overflow in the sweep's FP16 variant(s): `mask` from node `mask_add`" in section
    round_trip = from_dict(json.loads(to_json(results)))
    assert round_trip.ranges.limits[0].over["kind=hot"] == fp16.over["kind=hot"]


def test_tensors_computed_from_a_constant_the_bf16_variant_saturates_are_not_reported_as_its_overflows(tmp_path) -> None:
    """A mask filled from float32's minimum (-3.4028e38, beyond BF16's 3.3895e38) and the scores it is added to are
    over BF16's limit in the FP32 model, but the BF16 variant saturates the fill, so they hold finite values there: the
    BF16 list listed them as overflows. A tensor that passes the limit by arithmetic (x times 3e38, and what adds it)
    still overflows in BF16 and stays listed."""
    from qbench.recipe.spec import VariantSpec
    from qbench.variants.base import BuildContext
    from qbench.variants.fp16 import build_bf16

    nodes = [
        helper.make_node("Constant", [], ["fill"],
                         value=numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32))),
        helper.make_node("Mul", ["mask", "fill"], ["bias"], name="mask_fill"),
        helper.make_node("Add", ["x", "bias"], ["scores"], name="mask_add"),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1, name="softmax"),
        helper.make_node("Mul", ["x", "big"], ["huge"], name="scale"),
        helper.make_node("Add", ["probs", "huge"], ["y"], name="out"),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "masked", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4]) for n in ("x", "mask")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(np.array(3e38, np.float32), "big")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "masked.onnx"
    onnx.save(model, str(path))
    feeds = {"x": np.array([[1.0, 1.13, 0.5, 0.2], [0.3, 0.1, 0.2, 0.4]], np.float32),
             "mask": np.array([[0, 0, 1, 1], [0, 1, 1, 1]], np.float32)}  # fmt: skip
    built = build_bf16(VariantSpec(name="brain", precision="bf16"),
                       BuildContext(reference_path=path, workdir=tmp_path / "w"))  # fmt: skip
    saturated = bf16_saturated([("brain", built.params)])
    assert saturated == {"fill": float(np.abs(np.finfo(np.float32).min))}
    assert bf16_saturated([("brain", built.params), ("old", {})]) == {}  # a build without the record: nothing known
    analysis = analyse_ranges(path, feeds, {}, batch_size=2, bf16_saturated=saturated)
    bf16 = next(c for c in analysis.limits if c.format == "bf16")
    marked = {p.tensor: p.handled for p in bf16.over["overall"]}
    assert set(marked) == {"bias", "scores", "huge", "y"}  # over 3.3895e38 in the FP32 model
    assert "saturate the constant `fill`" in marked["bias"] and marked["scores"] == marked["bias"]
    assert marked["huge"] is None and marked["y"] is None  # y adds the masked softmax to `huge`: its peak is huge's
    fp16 = next(c for c in analysis.limits if c.format == "fp16")
    assert all(p.handled is None for p in fp16.over["overall"])  # no FP16 variant in this sweep


def test_the_nodes_inside_control_flow_are_counted_as_not_analysed_and_the_report_says_so(tmp_path: Path) -> None:
    """The tiny model's Mul and MatMul moved into an If branch: hot rows still overflow FP16 there, but the pass sees
    main-graph tensors only. The analysis listed no tensor over FP16's limit and said nothing of the branches."""
    from sweep_factory import make_sweep

    from qbench.report.ranges import ranges_html, ranges_section

    branch = onnx.load(str(tiny_model(tmp_path / "tiny.onnx"))).graph
    then = helper.make_graph(list(branch.node), "then", [], list(branch.output))
    other = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["logits_else"], name="plain")], "else", [],
                              [helper.make_tensor_value_info("logits_else", TensorProto.FLOAT, None)])  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("ReduceMax", ["x"], ["peak"], name="peak", keepdims=0),
         helper.make_node("Greater", ["peak", "zero"], ["positive"], name="positive"),
         helper.make_node("If", ["positive"], ["logits"], name="route", then_branch=then, else_branch=other)],
        "routed", list(branch.input), list(branch.output),
        [*branch.initializer, numpy_helper.from_array(np.array(-1.0, np.float32), "zero")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(tmp_path / "routed.onnx"))
    x, kind = tiny_rows()
    analysis = analyse_ranges(tmp_path / "routed.onnx", {"x": x}, {"kind=hot": kind == "hot"}, batch_size=8)
    assert analysis.subgraph_nodes == {"route": 3}  # the then branch's Mul and MatMul, the else branch's MatMul
    assert next(c for c in analysis.limits if c.format == "fp16").over["kind=hot"] == ()  # unseen, hence the line
    results = dataclasses.replace(make_sweep(), ranges=analysis)
    said = ("not analysed: 3 node(s) inside the control-flow subgraphs (If/Loop/Scan) of `route`; their tensors are "
            "not graph outputs, so an overflow or clipping there is not shown")  # fmt: skip
    assert said in ranges_section(results)
    assert "not analysed: 3 node(s)" in ranges_html(results) and "<code>route</code>" in ranges_html(results)
    assert from_dict(json.loads(to_json(results))).ranges == analysis
