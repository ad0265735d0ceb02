"""FP32 reference, FP16 conversion and the BF16 simulation."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.errors import QbenchError
from qbench.recipe.spec import VariantSpec
from qbench.variants.base import BuildContext
from qbench.variants.emulate import emulate_float16
from qbench.variants.fp16 import BF16_NOTE, build_bf16, build_fp16, round_to_bf16
from qbench.variants.fp32 import build_fp32
from qbench.variants.reference import settle_built_model


def _reference(mlp) -> np.ndarray:
    session = ort.InferenceSession(str(mlp.path), providers=["CPUExecutionProvider"])
    return session.run(None, mlp.held_out)[0]


def test_fp32_is_the_reference_itself(mlp, tmp_path):
    built = build_fp32(VariantSpec(name="fp32", precision="fp32"), mlp.context(tmp_path / "work"))
    assert built.onnx_path == mlp.path.resolve()
    assert built.precision == "fp32"
    assert not (tmp_path / "work").exists(), "the reference needs no copy"


def test_fp32_with_a_missing_model_is_a_user_error(mlp, tmp_path):
    missing = BuildContext(reference_path=tmp_path / "nope.onnx", workdir=tmp_path)
    with pytest.raises(QbenchError, match="does not exist"):
        build_fp32(VariantSpec(name="fp32", precision="fp32"), missing)


def test_fp16_keeps_fp32_io_and_stays_close(mlp, run, tmp_path):
    built = build_fp16(VariantSpec(name="half", precision="fp16"), mlp.context(tmp_path))
    model = onnx.load(str(built.onnx_path))
    assert built.onnx_path == (tmp_path / "half.onnx").resolve()
    assert {v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]} == {TensorProto.FLOAT}
    assert {t.data_type for t in model.graph.initializer} == {TensorProto.FLOAT16}
    reference, output = _reference(mlp), run(built, mlp.held_out)
    error = np.abs(output - reference).max()
    print(f"fp16 max abs error {error:.5f}")
    assert 0 < error < 0.05
    assert built.params["keep_io_types"] is True and built.params["weights_clamped"] == 0


def test_fp16_keeps_a_weight_beyond_its_range_fp32_and_clamps_only_stray_tiny_values(graph, tmp_path, run):
    """A weight of 1e5 clamped to 65504 changes the model (a running variance of 1e10 divides by 256, not 1e5): its
    reader stays FP32. A tiny value among normal ones is clamped up to FP16's smallest subnormal, and counted."""
    weights = {"w_big": np.array([[1e5, 1.0], [3.0, 2.0]], dtype=np.float32),
               "w": np.array([[0.5, 1.0], [1e-9, 2.0]], dtype=np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w_big"], ["y"], name="big"),
             helper.make_node("MatMul", ["x", "w"], ["z"], name="small")]  # fmt: skip
    path = graph(tmp_path / "big.onnx", nodes, weights, {"x": 2}, {"y": 2, "z": 2})
    ctx = BuildContext(reference_path=path, workdir=tmp_path / "work")
    built = build_fp16(VariantSpec(name="half", precision="fp16"), ctx)
    assert built.params["weights_clamped"] == 1 and built.params["fp16_range"]["kept_nodes"] == ["big"]
    # the note says which way: "outside FP16's range were clamped" read as a weight too large for FP16
    assert any(note.startswith("1 nonzero weight value(s) nearer 0 than FP16's smallest positive value (5.96e-08) "
                               "were raised to it") for note in built.notes)  # fmt: skip
    assert not any("largest finite" in note for note in built.notes)
    assert any("kept in FP32 for range" in note and "w_big (max |x| 1e+05)" in note for note in built.notes)
    x = {"x": np.array([[1.0, 2.0]], dtype=np.float32)}
    np.testing.assert_array_equal(run(built, x), [[1e5 + 6.0, 5.0]])


def test_fp16_keeps_the_readers_of_a_constant_nodes_value_beyond_its_range_fp32(graph, tmp_path, run):
    """torch writes a scalar such as a mask fill as a Constant node, which the converter would clamp as it does
    weights."""
    fill = helper.make_node("Constant", [], ["big"], value=numpy_helper.from_array(np.array(1.5e5, dtype=np.float32)))
    nodes = [fill, helper.make_node("Mul", ["x", "big"], ["y"])]
    path = graph(tmp_path / "const.onnx", nodes, {}, {"x": 2}, {"y": 2})
    built = build_fp16(VariantSpec(name="half", precision="fp16"),
                       BuildContext(reference_path=path, workdir=tmp_path / "w"))  # fmt: skip
    assert "unchanged" in built.params and built.params["fp16_range"]["tensors"] == {"big": 1.5e5}
    assert any("big (max |x| 1.5e+05)" in note for note in built.notes)


def test_ort_cpu_cannot_run_real_bf16_compute(tmp_path):
    """Why BF16 is simulated. If this fails, ORT CPU gained BF16 kernels and a real BF16 path is possible."""
    nodes = [
        helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
        helper.make_node("MatMul", ["xb", "xb"], ["yb"]),
        helper.make_node("Cast", ["yb"], ["y"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes, "bf16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(Exception, match="NOT_IMPLEMENTED|Could not find an implementation"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_bf16_simulation_rounds_weights_and_activations(mlp, run, tmp_path):
    built = build_bf16(VariantSpec(name="brain", precision="bf16"), mlp.context(tmp_path))
    assert built.simulation and built.session_hints == {}
    assert BF16_NOTE in built.notes
    model = onnx.load(str(built.onnx_path))
    assert [o.name for o in model.graph.output] == ["y"] and [i.name for i in model.graph.input] == ["x"]
    for tensor in model.graph.initializer:
        values = onnx.numpy_helper.to_array(tensor)
        np.testing.assert_array_equal(values, round_to_bf16(values))
    assert built.params["rounded_weights"] == 3
    assert built.params["rounded_activations"] == 5  # x, h, r, m, y

    output = run(built, mlp.held_out)  # default ORT optimisation level: the casts must survive it
    np.testing.assert_array_equal(output, round_to_bf16(output))
    reference = _reference(mlp)
    relative = np.abs(output - reference).max() / np.abs(reference).max()
    print(f"bf16 max error relative to the largest output: {relative:.5f}")
    assert 0 < relative < 0.03


def test_bf16_matches_a_numpy_simulation(mlp, run, tmp_path):
    built = build_bf16(VariantSpec(name="brain", precision="bf16"), mlp.context(tmp_path))
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(mlp.path)).graph.initializer}
    x = round_to_bf16(mlp.held_out["x"])
    hidden = round_to_bf16(np.maximum(round_to_bf16(x @ round_to_bf16(weights["w1"])), 0))
    expected = round_to_bf16(round_to_bf16(hidden @ round_to_bf16(weights["w2"])) + round_to_bf16(weights["b2"]))
    # Summation order may differ by one bfloat16 step (2**-8 relative) on a few values.
    np.testing.assert_allclose(run(built, mlp.held_out), expected, rtol=2**-7, atol=1e-6)


@pytest.mark.parametrize("stored_as", ["constant_node", "initializer"])
def test_bf16_saturates_a_float32_extreme_mask_fill_instead_of_rounding_it_to_inf(graph, tmp_path, run, stored_as):
    """torch.finfo(torch.float32).min, the attention-mask fill exporters write, rounds to -inf in bfloat16: a row
    whose every score is masked (a left-padded row's padding positions) got a softmax of NaN, though FP32 and a
    model built in BF16 give it a finite one. The fill saturates to BF16's largest finite value and is counted."""
    fill = np.array(np.finfo(np.float32).min, dtype=np.float32)
    weights = {"half": np.array(0.5, dtype=np.float32)}
    nodes = [helper.make_node("Greater", ["keep", "half"], ["attend"], name="mask"),
             helper.make_node("Where", ["attend", "x", "fill"], ["scores"], name="masked"),
             helper.make_node("Softmax", ["scores"], ["y"], axis=-1, name="softmax")]  # fmt: skip
    if stored_as == "initializer":
        weights["fill"] = fill
    else:
        nodes.insert(0, helper.make_node("Constant", [], ["fill"], value=numpy_helper.from_array(fill), name="fill"))
    path = graph(tmp_path / "mask.onnx", nodes, weights, {"x": 4, "keep": 4}, {"y": 4})
    built = build_bf16(VariantSpec(name="brain", precision="bf16"), BuildContext(reference_path=path, workdir=tmp_path))
    feeds = {"x": np.array([[1.0, 2.0, 0.5, -1.0]] * 2, dtype=np.float32),
             "keep": np.array([[1, 1, 0, 0], [0, 0, 0, 0]], dtype=np.float32)}  # fmt: skip
    output = run(built, feeds)
    assert np.isfinite(output).all()
    np.testing.assert_allclose(output[1], [0.25] * 4)  # FP32's: every score masked alike
    np.testing.assert_allclose(output[0], [0.2689, 0.7311, 0, 0], atol=4e-3)
    assert built.params["saturated_values"] == 1
    assert any("1 constant value(s) beyond BF16's range" in note for note in built.notes)


def test_bf16_keeps_an_overflow_computed_at_run_time_and_an_infinity_written_in_the_graph(graph, tmp_path, run):
    """Only stored finite constants saturate: a product past BF16's range is inf as on BF16 hardware."""
    weights = {"big": np.array([3e38], dtype=np.float32), "inf": np.array([-np.inf], dtype=np.float32)}
    nodes = [helper.make_node("Mul", ["x", "big"], ["y"], name="scale"),
             helper.make_node("Add", ["y", "inf"], ["z"], name="shift")]  # fmt: skip
    path = graph(tmp_path / "overflow.onnx", nodes, weights, {"x": 1}, {"y": 1, "z": 1})
    built = build_bf16(VariantSpec(name="brain", precision="bf16"), BuildContext(reference_path=path, workdir=tmp_path))
    assert built.params["saturated_values"] == 0
    output = run(built, {"x": np.array([[0.5], [2.0]], dtype=np.float32)})
    np.testing.assert_array_equal(output, [[round_to_bf16(np.float32(1.5e38))], [np.inf]])


def test_a_broken_model_file_is_reported_as_a_variant_failure(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    ctx = BuildContext(reference_path=broken, workdir=tmp_path / "work")
    with pytest.raises(QbenchError, match=r"variant 'half': loading the FP32 model"):
        build_fp16(VariantSpec(name="half", precision="fp16"), ctx)
    with pytest.raises(QbenchError, match=r"variant 'brain': loading the FP32 model"):
        build_bf16(VariantSpec(name="brain", precision="bf16"), ctx)


def _float64_matmul() -> onnx.ModelProto:
    """y = x @ w in float64, as skl2onnx writes an MLP converted with double inputs."""
    w = numpy_helper.from_array(np.ones((3, 2), np.float64), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "doubles",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [None, 3])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [None, 2])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("build", "precision", "action"), [(build_fp16, "fp16", "convert to FP16"),
                                                            (build_bf16, "bf16", "round to BF16")])  # fmt: skip
def test_a_float64_graph_is_left_as_it_is_and_the_note_says_why(tmp_path, build, precision, action):
    """The note read 'every node stays FP32: )': no op type was kept, the graph computes in float64."""
    path = tmp_path / "doubles.onnx"
    onnx.save(_float64_matmul(), str(path))
    context = BuildContext(reference_path=path, workdir=tmp_path / "w")
    built = build(VariantSpec(name="low", precision=precision), context)
    why = f"nothing to {action} (the graph computes in float64, which the conversion leaves as it is)"
    assert built.params["unchanged"] == why


# A weight FP16 cannot hold (spacing 2**-10 at 1): rounded, x @ w loses 2**-13 per unit of x; BF16 loses it too.
_TIED = np.array([[1 + 2**-13, 0.5], [-3.0, 1 + 2**-12]], dtype=np.float32)


def _exact_float32(path, feeds) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_fp16_a_node_the_range_check_keeps_reads_a_tied_weight_unrounded(graph, tmp_path, run):
    """`w` is read by a MatMul FP16 converts and by one the range check keeps FP32 (its input passes 32752): the
    converter stored `w` once in float16 and cast it back for the kept node, which then computed 160000 where FP32
    gives 160019.53 (4e4 x 4 x (1 + 2**-13)), on the FP16 model and on its CPU emulation alike."""
    nodes = [helper.make_node("MatMul", ["big", "w"], ["kept"], name="kept_mm"),
             helper.make_node("MatMul", ["x", "w"], ["half"], name="half_mm")]  # fmt: skip
    path = graph(tmp_path / "tied.onnx", nodes, {"w": _TIED}, {"big": 2, "x": 2}, {"kept": 2, "half": 2})
    rng = np.random.default_rng(0)
    calibration = [{"big": np.full((8, 2), 4e4, np.float32), "x": rng.normal(size=(8, 2)).astype(np.float32)}]
    built = build_fp16(VariantSpec(name="half", precision="fp16"),
                       BuildContext(reference_path=path, workdir=tmp_path / "w", calibration=calibration))  # fmt: skip
    assert built.params["fp16_range"]["kept_nodes"] == ["kept_mm"]
    feeds = {"big": np.array([[4e4, 3 * 4e4]], np.float32), "x": np.array([[1.0, 1.0]], np.float32)}
    expected = _exact_float32(path, feeds)
    emulated = tmp_path / "emulated.onnx"
    onnx.save(emulate_float16(onnx.load(str(built.onnx_path)))[0], str(emulated))
    for model in (built.onnx_path, emulated):
        kept, half = _exact_float32(model, feeds)
        np.testing.assert_array_equal(kept, expected[0])
        assert not np.array_equal(half, expected[1])  # the converted reader does compute on the rounded weight
    stored = {t.name: t.data_type for t in onnx.load(str(built.onnx_path)).graph.initializer}
    assert stored["w"] == TensorProto.FLOAT16 and TensorProto.FLOAT in stored.values()


def test_fp16_a_node_the_range_check_keeps_reads_a_constant_of_shape_fill_unrounded(tmp_path):
    """`c` = ConstantOfShape(Shape(x), 1 + 2**-13) is read by a Mul FP16 converts and one the range check keeps
    (`big` passes 32752): the converter narrowed the fill to 1, so the kept Mul gave 40000 where FP32 gives
    40004.88. It now reads a kept copy of the node, and gives FP32's values exactly."""
    fill = numpy_helper.from_array(np.array([1 + 2**-13], np.float32), "fill")
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("ConstantOfShape", ["s"], ["c"], value=fill, name="fill"),
             helper.make_node("Mul", ["big", "c"], ["kept"], name="kept_mul"),
             helper.make_node("Mul", ["x", "c"], ["half"], name="half_mul")]  # fmt: skip
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2]) for n in ("x", "big", "kept", "half")]
    model = helper.make_model(helper.make_graph(nodes, "fill", io[:2], io[2:]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # fmt: skip
    path = tmp_path / "fill.onnx"
    onnx.save(model, str(path))
    calibration = [{"big": np.full((8, 2), 4e4, np.float32), "x": np.ones((8, 2), np.float32)}]
    built = build_fp16(VariantSpec(name="half", precision="fp16"),
                       BuildContext(reference_path=path, workdir=tmp_path / "w", calibration=calibration))  # fmt: skip
    assert built.params["fp16_range"]["kept_nodes"] == ["kept_mul"]
    feeds = {"x": np.array([[1.0, 3.0]], np.float32), "big": np.array([[4e4, 1.2e5]], np.float32)}
    expected = _exact_float32(path, feeds)
    emulated = tmp_path / "emulated.onnx"
    onnx.save(emulate_float16(onnx.load(str(built.onnx_path)))[0], str(emulated))
    for variant in (built.onnx_path, emulated):
        kept, half = _exact_float32(variant, feeds)
        np.testing.assert_array_equal(kept, expected[0])
        assert not np.array_equal(half, expected[1])  # the converted Mul does compute on the rounded fill


@pytest.mark.parametrize("build", [build_fp16, build_bf16])
@pytest.mark.parametrize("stored_as", ["initializer", "Constant", "ConstantOfShape"])
def test_a_control_flow_branch_reads_a_constant_it_shares_with_a_narrowed_node_unrounded(tmp_path, build, stored_as):
    """An If stays FP32 whole, but its branch reads `w` by name, a weight (or a Constant node's value, or a
    ConstantOfShape's fill) a converted MatMul also reads: FP16 cast the float16 copy back for the branch, BF16
    rounded it, so the kept branch computed on rounded weights (1 instead of 1 + 2**-13)."""
    branch = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"], name="branch_mm")], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])  # fmt: skip
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="neg")], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])  # fmt: skip
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="positive"),
             helper.make_node("If", ["c"], ["kept"], then_branch=branch, else_branch=other, name="if"),
             helper.make_node("MatMul", ["x", "w"], ["half"], name="half_mm")]  # fmt: skip
    weights = [numpy_helper.from_array(np.array(0, np.float32), "zero")]
    if stored_as == "Constant":
        nodes.insert(0, helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(_TIED), name="w_value"))
    elif stored_as == "ConstantOfShape":
        fill = numpy_helper.from_array(_TIED[:1, 0], "fill")
        nodes.insert(0, helper.make_node("ConstantOfShape", ["w_shape"], ["w"], value=fill, name="w_fill"))
        weights.append(numpy_helper.from_array(np.array([2, 2], np.int64), "w_shape"))
    else:
        weights.append(numpy_helper.from_array(_TIED, "w"))
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2]) for n in ("x", "kept", "half")]
    model = helper.make_model(helper.make_graph(nodes, "tied", io[:1], io[1:], weights),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # fmt: skip
    path = tmp_path / "tied.onnx"
    onnx.save(model, str(path))
    built = build(VariantSpec(name="low", precision=build.__name__.removeprefix("build_")),
                  BuildContext(reference_path=path, workdir=tmp_path / "w"))  # fmt: skip
    feeds = {"x": np.array([[1.0, 2.0]], np.float32)}
    kept, half = _exact_float32(built.onnx_path, feeds)
    expected = _exact_float32(path, feeds)
    np.testing.assert_array_equal(kept, expected[0])
    assert not np.array_equal(half, expected[1])


def test_fp16_of_a_reference_whose_nodes_carry_the_converters_own_names_is_valid(graph, tmp_path, run):
    """A model converted to FP16 once (keep_io_types) and optimized back to FP32 by ONNX Runtime on a CPU keeps the
    converter's node names (`graph_output_cast0`): the converter skips every node so named, which then read a tensor
    it had renamed, and the FP16 build was an invalid graph (a failed variant, the gate unusable)."""
    rng = np.random.default_rng(6)
    weights = {"w": rng.normal(size=(4, 3)).astype(np.float32)}
    nodes = [helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT, name="graph_input_cast0"),
             helper.make_node("MatMul", ["x32", "w"], ["h"], name="mm"),
             helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT, name="graph_output_cast0")]  # fmt: skip
    path = graph(tmp_path / "named.onnx", nodes, weights, {"x": 4}, {"y": 3})
    built = build_fp16(VariantSpec(name="half", precision="fp16"),
                       BuildContext(reference_path=path, workdir=tmp_path / "w"))  # fmt: skip
    onnx.checker.check_model(settle_built_model(built.onnx_path, path), full_check=True)  # as a sweep settles it
    x = rng.normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_allclose(run(built, {"x": x}), x @ weights["w"], rtol=1e-2, atol=1e-2)
    assert built.params["converted_nodes"] >= 1


def test_fp16_converts_a_model_over_protobufs_limit(mlp, run, tmp_path, monkeypatch):
    """A model over 2 GiB failed its FP16 build: "Unable to parse proto from the given bytes: ... exceeds the size
    limit" (ORT's converter runs onnx's in-memory shape inference). The limit is simulated at 600 bytes; the build
    must be the one made without it."""
    from protobuf_limit import simulate_protobuf_limit

    spec = VariantSpec(name="half", precision="fp16")
    expected = onnx.load(str(build_fp16(spec, mlp.context(tmp_path / "plain")).onnx_path))
    simulate_protobuf_limit(monkeypatch, limit=600, weightless=100)
    built = build_fp16(spec, mlp.context(tmp_path / "big"))
    assert onnx.load(str(built.onnx_path)).graph == expected.graph
    assert np.abs(run(built, mlp.held_out) - _reference(mlp)).max() < 0.05
