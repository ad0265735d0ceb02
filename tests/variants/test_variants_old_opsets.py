"""Graphs as exporters of opset 7-10 wrote them: Upsample (scales an attribute, then an input), Resize-10, Pad and
Slice with attributes, Dropout with a ratio, BatchNormalization. Variants raise such graphs to a newer opset (ONNX
Runtime's quantizers to 11, per-channel Q/DQ to 13, FP8 to 21); the upgrade must compute what the file computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.errors import QbenchError
from qbench.recipe.spec import VariantSpec
from qbench.variants import BuildContext, build_variant
from qbench.variants.opset_upgrade import _check_interface_kept, ensure_opset

RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 3, 8, 8)).astype(np.float32)
IMAGES = ["n", "c", "h", "w"]


def _value(name: str, shape: list | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _model(graph: onnx.GraphProto, opset: int) -> onnx.ModelProto:
    if opset < 9:  # IR 3: every initializer is a graph input too
        graph.input.extend(_value(t.name, list(t.dims)) for t in graph.initializer)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 3 if opset < 9 else 5
    onnx.checker.check_model(model)
    return model


def resize_model(op_type: str, opset: int, mode: str, scales: list[float]) -> onnx.ModelProto:
    """x[1,2,7,9] -> Upsample or Resize-10 by `scales` (an attribute at opset 7, an initializer after)."""
    attribute = {"scales": scales} if opset < 9 else {}
    inputs = ["x"] + (["scales"] if opset >= 9 else [])
    node = helper.make_node(op_type, inputs, ["y"], name="resize", mode=mode, **attribute)
    weights = [numpy_helper.from_array(np.array(scales, np.float32), "scales")] if opset >= 9 else []
    graph = helper.make_graph([node], "resize", [_value("x", [1, 2, 7, 9])], [_value("y", IMAGES)], weights)
    return _model(graph, opset)


def _run(model: onnx.ModelProto | Path, x: np.ndarray) -> np.ndarray:
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize(("op_type", "opset", "mode", "scales"), [
    ("Upsample", 7, "linear", [1.0, 1.0, 2.0, 2.0]), ("Upsample", 7, "nearest", [1.0, 1.0, 1.5, 2.5]),
    ("Upsample", 9, "linear", [1.0, 1.0, 1.5, 2.5]), ("Upsample", 9, "nearest", [1.0, 1.0, 3.0, 1.0]),
    ("Resize", 10, "linear", [1.0, 1.0, 2.0, 2.0]), ("Resize", 10, "linear", [1.0, 1.0, 0.6, 1.5]),
    ("Resize", 10, "nearest", [1.0, 1.0, 0.6, 0.75]), ("Resize", 10, "nearest", [1.0, 1.0, 1.5, 2.5])])  # fmt: skip
@pytest.mark.parametrize("target", [11, 13, 21])
def test_an_opset_upgrade_samples_the_pixels_upsample_and_resize_10_sample(op_type, opset, mode, scales, target):
    """onnx's converter wrote a Resize-11 without coordinate_transformation_mode (half_pixel by default) where opset
    10 maps output pixel x to x / scale: a bilinear x2 Upsample moved by up to 1.2 on inputs drawn from N(0, 1), a
    nearest 0.6 x 0.75 Resize by 2.8; every variant raising the opset (FP8, per-channel INT8, BF16) did so."""
    model = resize_model(op_type, opset, mode, scales)
    x = RNG.normal(size=(1, 2, 7, 9)).astype(np.float32)
    np.testing.assert_array_equal(_run(ensure_opset(model, target), x), _run(model, x))


def test_a_resize_inside_a_branch_is_upgraded_alike():
    """Subgraphs are converted too (a torch-scripted branch resizing its input); the branch taken is the linear one."""
    resize = resize_model("Resize", 10, "linear", [1.0, 1.0, 2.0, 2.0])
    branch = helper.make_graph(list(resize.graph.node), "then", [], [_value("y", IMAGES)])
    nearest = helper.make_node("Resize", ["x", "scales"], ["z"], name="nearest", mode="nearest")
    other = helper.make_graph([nearest], "else", [], [_value("z", IMAGES)])
    nodes = [helper.make_node("ReduceMax", ["x"], ["peak"], keepdims=0),
             helper.make_node("Greater", ["peak", "low"], ["c"]),
             helper.make_node("If", ["c"], ["out"], then_branch=branch, else_branch=other)]
    weights = [*resize.graph.initializer, numpy_helper.from_array(np.array(-1e9, np.float32), "low")]
    graph = helper.make_graph(nodes, "g", [_value("x", [1, 2, 7, 9])], [_value("out", IMAGES)], weights)
    model = _model(graph, 10)
    x = RNG.normal(size=(1, 2, 7, 9)).astype(np.float32)
    np.testing.assert_array_equal(_run(ensure_opset(model, 13), x), _run(model, x))


@pytest.mark.parametrize(("opset", "axis"), [(9, 1), (11, 1), (11, -1), (11, 0), (12, 2)])
@pytest.mark.parametrize("target", [13, 21])
def test_an_opset_upgrade_keeps_what_a_hardmax_before_13_computes(opset, axis, target):
    """Before opset 13 Hardmax takes the maximum over every axis from `axis` on (the input flattened to 2-D); onnx's
    converter kept the node as it was, which from 13 on takes it along `axis` alone: an axis-1 Hardmax of a [2, 3, 4]
    input gave another answer on every row (max difference 1.0). Inside an If branch too."""
    hardmax = helper.make_node("Hardmax", ["x"], ["y"], name="pick", **({"axis": axis} if axis != 1 else {}))
    branch = helper.make_graph([helper.make_node("Hardmax", ["x"], ["z"], name="inner", axis=max(axis, 0))], "then",
                               [], [_value("z", ["n", 3, 4])])  # fmt: skip
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["w"])], "else", [], [_value("w", ["n", 3, 4])])
    nodes = [hardmax, helper.make_node("ReduceMax", ["x"], ["peak"], keepdims=0),
             helper.make_node("Greater", ["peak", "low"], ["c"]),
             helper.make_node("If", ["c"], ["branched"], then_branch=branch, else_branch=other)]
    weights = [numpy_helper.from_array(np.array(-1e9, np.float32), "low")]
    graph = helper.make_graph(nodes, "g", [_value("x", ["n", 3, 4])],
                              [_value("y", ["n", 3, 4]), _value("branched", ["n", 3, 4])], weights)  # fmt: skip
    model = _model(graph, opset)
    x = RNG.normal(size=(5, 3, 4)).astype(np.float32)
    session = ort.InferenceSession(ensure_opset(model, target).SerializeToString(), providers=["CPUExecutionProvider"])
    before = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(session.run(None, {"x": x}), before.run(None, {"x": x}), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("target", [9, 13, 21])
def test_an_opset_upgrade_writes_a_per_element_batchnorm_as_its_arithmetic(target):
    """BatchNormalization before opset 9 with spatial=0 (statistics per element of a row): onnx's converter stopped at
    an assertion ('Attribute spatial must have value 1'), every variant raising the opset failed with it."""
    stats = {name: RNG.uniform(0.5, 2.0, size=(3, 4)).astype(np.float32) for name in ("scale", "bias", "mean", "var")}
    stats["mean"] -= 1.0
    node = helper.make_node("BatchNormalization", ["x", *stats], ["y"], name="bn", spatial=0, epsilon=1e-3)
    graph = helper.make_graph([node], "g", [_value("x", ["n", 3, 4])], [_value("y", ["n", 3, 4])],
                              [numpy_helper.from_array(value, name) for name, value in stats.items()])  # fmt: skip
    model = _model(graph, 7)
    x = RNG.normal(size=(6, 3, 4)).astype(np.float32)
    want = (x - stats["mean"]) / np.sqrt(stats["var"] + np.float32(1e-3)) * stats["scale"] + stats["bias"]
    np.testing.assert_allclose(_run(model, x), want, rtol=1e-5, atol=1e-6)  # ONNX Runtime's reading of opset 7
    np.testing.assert_allclose(_run(ensure_opset(model, target), x), want, rtol=1e-5, atol=1e-6)


def test_a_nearest_resize_10_mixing_up_and_downsampling_is_refused_in_one_line():
    """ONNX Runtime floors the source pixel on an upsampling axis and ceils it on a downsampling one: no single
    Resize-11 nearest_mode computes both."""
    with pytest.raises(QbenchError, match=r"^Resize node 'resize' \(opset 10, nearest\): its scales mix up- and "
                                          r"downsampling axes[^\n]*; export "
                                          r"the model at opset 11 or later$"):  # fmt: skip
        ensure_opset(resize_model("Resize", 10, "nearest", [1.0, 1.0, 0.6, 1.5]), 11)


def old_cnn(path: Path, opset: int, mode: str = "nearest") -> Path:
    """Conv -> BatchNormalization -> Relu -> Upsample x2 -> Pad and Slice (attributes) -> Dropout(ratio) -> Flatten ->
    Gemm, as an exporter of opset 7 to 9 wrote it (the classifier reads every upsampled pixel)."""
    channels = 4
    weights = {"cw": RNG.normal(size=(channels, 3, 3, 3)) * 0.5, "cb": RNG.normal(size=channels) * 0.5,
               "s": 1 + RNG.normal(size=channels) * 0.1, "b": RNG.normal(size=channels) * 0.1,
               "m": RNG.normal(size=channels) * 0.1, "v": 1 + np.abs(RNG.normal(size=channels)) * 0.1,
               "gw": RNG.normal(size=(3, channels * 16 * 16)) * 0.02, "gb": RNG.normal(size=3) * 0.5}  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], name="bn",
                              **({"spatial": 1} if opset < 9 else {})),
             helper.make_node("Relu", ["bn"], ["r"], name="relu"),
             helper.make_node("Upsample", ["r"] + (["scales"] if opset >= 9 else []), ["u"], name="up", mode=mode,
                              **({"scales": [1.0, 1.0, 2.0, 2.0]} if opset < 9 else {})),
             helper.make_node("Pad", ["u"], ["p"], pads=[0, 0, 1, 1, 0, 0, 1, 1], name="pad"),
             helper.make_node("Slice", ["p"], ["sl"], starts=[1, 1], ends=[17, 17], axes=[2, 3], name="slice"),
             helper.make_node("Dropout", ["sl"], ["d"], ratio=0.3, name="drop"),
             helper.make_node("Flatten", ["d"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "gw", "gb"], ["y"], transB=1, name="fc")]  # fmt: skip
    initializers = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()]
    if opset >= 9:
        initializers.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    graph = helper.make_graph(nodes, "old_cnn", [_value("x", ["N", 3, 8, 8])], [_value("y", ["N", 3])], initializers)
    onnx.save(_model(graph, opset), str(path))
    return path


@pytest.mark.parametrize("opset", [7, 9])
@pytest.mark.parametrize("calibrator", ["dynamic", "minmax"])
def test_int8_builds_a_cnn_upsampling_at_opset_7_to_9(tmp_path, opset, calibrator):
    """ONNX Runtime's pre-processing replaced the Upsample by a Resize its version converter could not raise ('No
    Adapter From Version $9 for Resize'): every INT8 variant of such a CNN failed to build."""
    path = old_cnn(tmp_path / "cnn.onnx", opset)
    calibration = [{"x": X[:32]}, {"x": X[32:]}]
    built = build_variant(VariantSpec(name="int8", precision="int8", calibrator=calibrator),
                          BuildContext(reference_path=path, workdir=tmp_path / "w",
                                       calibration=calibration))  # fmt: skip
    assert built.params["preprocess"].startswith(f"opset {opset} raised to 11; ")
    expected, ran = _run(path, X), _run(built.onnx_path, X)
    assert np.abs(ran - expected).max() < 0.05 * np.abs(expected).max()


@pytest.mark.parametrize("opset", [7, 9])
@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_an_opset_upgrade_of_a_cnn_computes_what_it_computed_and_keeps_the_upsample_name(tmp_path, opset, mode):
    """The converter renames an Upsample's output (its reader reads the new name) and drops the node's name."""
    model = onnx.load(str(old_cnn(tmp_path / "cnn.onnx", opset, mode)))
    upgraded = ensure_opset(model, 13)
    assert [node.name for node in upgraded.graph.node if node.op_type == "Resize"] == ["up"]
    np.testing.assert_allclose(_run(upgraded, X), _run(model, X), rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant", [{"precision": "bf16"}, {"precision": "fp8", "calibrator": "minmax"},
                                     {"precision": "int8", "calibrator": "minmax", "per_channel": True}])  # fmt: skip
def test_variants_raising_the_opset_of_a_bilinear_upsample_stay_close_to_fp32(tmp_path, variant):
    """Built at opset 13 or 21 from an opset-9 CNN, BF16 was 1.32 off FP32's logits (of 3.5; 92 % of the rows kept
    their class), FP8 1.36, per-channel INT8 1.32: the half-pixel Resize, not the precision. Now 0.013, 0.14, 0.06."""
    path = old_cnn(tmp_path / "cnn.onnx", 9, "linear")
    calibration = [{"x": X[:32]}, {"x": X[32:]}]
    built = build_variant(VariantSpec(name="v", **variant),
                          BuildContext(reference_path=path, workdir=tmp_path / "w",
                                       calibration=calibration))  # fmt: skip
    expected, ran = _run(path, X), _run(built.onnx_path, X)
    assert np.abs(ran - expected).max() < 0.05 * np.abs(expected).max()


def scan_8_model(path: Path) -> Path:
    """An opset-8 Scan (its inputs carry a batch axis, dropped at opset 9) whose final state feeds a MatMul."""
    hidden, features = 8, 6
    body = helper.make_graph(
        [helper.make_node("MatMul", ["xt", "wx"], ["a"]), helper.make_node("MatMul", ["s_in", "wh"], ["b"]),
         helper.make_node("Add", ["a", "b"], ["ab"]), helper.make_node("Tanh", ["ab"], ["s_out"])],
        "body", [_value("s_in", [hidden]), _value("xt", [features])], [_value("s_out", [hidden])])  # fmt: skip
    nodes = [helper.make_node("Scan", ["", "s0", "x"], ["state"], body=body, num_scan_inputs=1, name="scan"),
             helper.make_node("MatMul", ["state", "wo"], ["y"], name="head")]  # fmt: skip
    weights = {"wx": RNG.normal(size=(features, hidden)), "wh": RNG.normal(size=(hidden, hidden)) * 0.3,
               "wo": RNG.normal(size=(hidden, 3))}  # fmt: skip
    graph = helper.make_graph(nodes, "scan8", [_value("s0", [2, hidden]), _value("x", [2, 5, features])],
                              [_value("y", [2, 3])], [numpy_helper.from_array(v.astype(np.float32), k)
                                                      for k, v in weights.items()])  # fmt: skip
    onnx.save(_model(graph, 8), str(path))
    return path


@pytest.mark.parametrize(("variant", "opset"),
                         [({"precision": "bf16"}, 13), ({"precision": "fp8", "calibrator": "minmax"}, 21),
                                                ({"precision": "int8", "calibrator": "dynamic"}, 11)])  # fmt: skip
def test_an_opset_upgrade_changing_the_graph_inputs_is_the_variants_one_line_error(tmp_path, variant, opset):
    """onnx's Scan 8 -> 9 adapter drops the batch axis from the graph's inputs: BF16 and dynamic INT8 were reported
    built and refused FP32's feeds when measured ('Invalid rank for input'), FP8 failed calibration with the same
    words."""
    path = scan_8_model(tmp_path / "scan8.onnx")
    feeds = {"s0": np.zeros((2, 8), np.float32), "x": RNG.normal(size=(2, 5, 6)).astype(np.float32)}
    with pytest.raises(QbenchError,
                       match=rf"raising opset 8 to {opset} \(onnx's version converter\) changed graph input "
                                          r"'s0' from float32\[2, 8\] to "
                                          r"float32\[8\]; export the model at opset"):  # fmt: skip
        build_variant(VariantSpec(name="v", **variant),
                      BuildContext(reference_path=path, workdir=tmp_path / "w", calibration=[feeds]))  # fmt: skip


def _normalized_model(op_type: str, opset: int) -> onnx.ModelProto:
    """x [batch, 8] -> MatMul -> `op_type` in the ONNX domain (ONNX Runtime's own operator there: the RMSNorm its
    transformer optimizer fuses, or its LayerNormalization before opset 17) -> MatMul -> y [batch, 4]."""
    rng = np.random.default_rng(3)
    weights = {"w1": rng.normal(size=(8, 8)), "w2": rng.normal(size=(8, 4)), "gamma": 1 + 0.1 * rng.normal(size=8)}
    inputs = ["h", "gamma"] + (["beta"] if op_type == "LayerNormalization" else [])
    weights |= {"beta": 0.1 * rng.normal(size=8)} if op_type == "LayerNormalization" else {}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="dense"),
             helper.make_node(op_type, inputs, ["n"], name="norm", axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["n", "w2"], ["y"], name="head")]  # fmt: skip
    graph = helper.make_graph(nodes, "normalized", [_value("x", ["batch", 8])], [_value("y", ["batch", 4])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


@pytest.mark.parametrize(("op_type", "opset"), [("SimplifiedLayerNormalization", 17), ("LayerNormalization", 14)])
def test_onnx_runtimes_own_operators_in_the_onnx_domain_survive_an_opset_upgrade(tmp_path, op_type, opset):
    """ONNX Runtime registers SimplifiedLayerNormalization (at any opset) and LayerNormalization (before 17) in the
    ONNX domain, and its optimizers write them there. onnx's version converter has no schema for them and failed on
    an assertion ('Op has no registered schema', 'No Adapter'), so every FP8 build of such a graph failed (BF16
    or per-channel INT8 of a SimplifiedLayerNormalization before opset 13 too). The node now keeps its place and
    computes what it computed."""
    model = _normalized_model(op_type, opset)
    x = np.random.default_rng(4).normal(size=(16, 8)).astype(np.float32)
    upgraded = ensure_opset(model, 21)
    assert [(node.domain, node.op_type) for node in upgraded.graph.node][1] == ("", op_type)
    assert [(o.domain, o.version) for o in upgraded.opset_import] == [("", 21)]
    np.testing.assert_array_equal(_run(upgraded, x), _run(model, x))
    onnx.save(model, str(tmp_path / "m.onnx"))
    calibration = [{"x": np.random.default_rng(5).normal(size=(16, 8)).astype(np.float32)}]
    built = build_variant(VariantSpec(name="fp8", precision="fp8", calibrator="minmax"),
                          BuildContext(reference_path=tmp_path / "m.onnx", workdir=tmp_path / "w",
                                       calibration=calibration))  # fmt: skip
    assert built.params["quantized_op_types"] == {"MatMul": 2}
    assert np.isfinite(_run(onnx.load(str(built.onnx_path)), x)).all()


def test_an_fp8_build_of_a_zipmap_classifier_keeps_its_probability_map(tmp_path):
    """FP8 raises the opset to 21, where onnx's version converter states the scalar shape of a ZipMap's values
    (`seq(map(int64, float32[any rank]))` becomes `seq(map(int64, float32[]))`): the same values, yet every FP8 build
    of a scikit-learn PCA -> LogisticRegression pipeline converted at opset 17 was refused as a changed graph output.
    It now builds, and its probability map is FP32's within FP8's rounding."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    x, y = load_iris(return_X_y=True)
    x = x.astype(np.float32)
    model = to_onnx(make_pipeline(PCA(3), LogisticRegression(max_iter=500)).fit(x, y), x[:1], target_opset=17)
    onnx.save(model, str(tmp_path / "m.onnx"))
    built = build_variant(VariantSpec(name="fp8", precision="fp8", calibrator="minmax"),
                          BuildContext(reference_path=tmp_path / "m.onnx", workdir=tmp_path / "w",
                                       calibration=[{"X": x[:64]}]))  # fmt: skip
    assert built.params["quantized_op_types"] == {"MatMul": 1}
    run = {p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
           for p in (tmp_path / "m.onnx", built.onnx_path)}
    fp32, fp8 = ([[row[c] for c in range(3)] for row in s.run(["output_probability"], {"X": x})[0]]
                 for s in run.values())
    np.testing.assert_allclose(fp8, fp32, atol=0.1)


def test_an_opset_upgrade_changing_what_a_sequence_holds_is_refused_naming_both_types():
    """A sequence output whose element type changes is not the same interface, and the error writes both types
    as types (before: the protobuf's text on one line)."""
    seq = helper.make_sequence_type_proto
    floats, ints = (helper.make_tensor_type_proto(t, None) for t in (TensorProto.FLOAT, TensorProto.INT64))
    with pytest.raises(QbenchError, match=r"changed graph output 'y' from seq\(float32\[any rank\]\) to "
                                          r"seq\(int64\[any rank\]\)"):  # fmt: skip
        _check_interface_kept(_interface_model(seq(floats)), _interface_model(seq(ints)), 21)


def _interface_model(output: onnx.TypeProto) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("SequenceConstruct", ["x"], ["y"])], "g", [_value("x", [2])],
                              [helper.make_value_info("y", output)])  # fmt: skip
    return _model(graph, 17)


def ml_only_model(path: Path) -> Path:
    """x [N, 4] -> ai.onnx.ml LinearClassifier -> ZipMap: a model importing `ai.onnx.ml` alone and no ONNX-domain
    opset, as CatBoost's `save_model(..., format="onnx")` writes its TreeEnsembleClassifier and ZipMap."""
    coefficients = np.random.default_rng(6).normal(size=12).tolist()
    nodes = [helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml", name="linear",
                              classlabels_ints=[0, 1, 2], coefficients=coefficients, intercepts=[0.1, -0.2, 0.0],
                              post_transform="SOFTMAX"),
             helper.make_node("ZipMap", ["scores"], ["probabilities"], domain="ai.onnx.ml", name="zipmap",
                              classlabels_int64s=[0, 1, 2])]  # fmt: skip
    probabilities = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    graph = helper.make_graph(nodes, "ml_only", [_value("x", ["N", 4])],
                              [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
                               helper.make_value_info("probabilities", probabilities)])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 2)], ir_version=3)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_an_opset_upgrade_of_a_model_importing_no_onnx_opset_adds_the_import(tmp_path):
    """onnx's version converter read the missing ONNX-domain import as opset 0 and stopped on an assertion."""
    model = onnx.load(str(ml_only_model(tmp_path / "m.onnx")))
    upgraded = ensure_opset(model, 13)
    assert sorted((o.domain, o.version) for o in upgraded.opset_import) == [("", 13), ("ai.onnx.ml", 2)]
    assert [(o.domain, o.version) for o in model.opset_import] == [("ai.onnx.ml", 2)]  # the model itself is unchanged
    x = RNG.normal(size=(16, 4)).astype(np.float32)
    session = ort.InferenceSession(upgraded.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(["label"], {"x": x})[0], _run_label(model, x))


def _run_label(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["label"], {"x": x})[0]


@pytest.mark.parametrize("variant", [{"calibrator": "minmax", "per_channel": True},
                                     {"calibrator": "minmax", "smoothquant": {"alpha": 0.5}},
                                     {"calibrator": "dynamic", "technique": "linear"}])  # fmt: skip
def test_int8_builds_of_a_model_importing_no_onnx_opset_find_nothing_to_quantize(tmp_path, variant):
    """CatBoost's ONNX export imports `ai.onnx.ml` alone: every per-channel INT8, SmoothQuant and `linear` build of it
    failed ('upgrading opset 0 to 13: ... invalid version (must be between 1 and 28)'), and the INT8 search said it
    could not build any candidate. Each now builds the FP32 model, quantizing nothing."""
    path = ml_only_model(tmp_path / "m.onnx")
    built = build_variant(VariantSpec(name="int8", precision="int8", **variant),
                          BuildContext(reference_path=path, workdir=tmp_path / "w",
                                       calibration=[{"x": RNG.normal(size=(16, 4)).astype(np.float32)}]))  # fmt: skip
    assert built.params["quantized_nodes"] == 0
    x = RNG.normal(size=(16, 4)).astype(np.float32)
    np.testing.assert_array_equal(_run_label(onnx.load(str(built.onnx_path)), x), _run_label(onnx.load(str(path)), x))
