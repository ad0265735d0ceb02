"""compute_ranges: the three calibrators really differ, short batches are used, nothing is left behind."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from qbench.errors import QbenchError
from qbench.variants.calibrate import CalibrationSettings, calibration_rows, compute_ranges, tensor_amax


@pytest.fixture(scope="module")
def skewed(tmp_path_factory: pytest.TempPathFactory, graph) -> tuple[Path, list[dict[str, np.ndarray]]]:
    """One MatMul whose input is mostly N(0, 1) with rare outliers of +-60; the last batch is short."""
    rng = np.random.default_rng(1)
    path = graph(
        tmp_path_factory.mktemp("skewed") / "skewed.onnx",
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        {"w": rng.normal(size=(16, 4)).astype(np.float32)},
        {"x": 16},
        {"y": 4},
    )
    batches = []
    for rows in (32, 32, 32, 7):
        x = rng.normal(size=(rows, 16)).astype(np.float32)
        x.flat[rng.choice(x.size, 2, replace=False)] = rng.choice([-60.0, 60.0], 2)
        batches.append({"x": x})
    return path, batches


def _amax(path: Path, batches: list[dict[str, np.ndarray]], method: str, workdir: Path, **options: float) -> float:
    ranges = compute_ranges(path, batches, method, op_types=["MatMul"], workdir=workdir, **options).ranges
    amax = tensor_amax(ranges, "x")
    assert amax is not None
    return amax


def test_minmax_entropy_and_percentile_give_different_ranges_on_outliers(skewed, tmp_path):
    path, batches = skewed
    minmax = _amax(path, batches, "minmax", tmp_path)
    entropy = _amax(path, batches, "entropy", tmp_path, num_bins=2048, num_quantized_bins=128)
    percentile = _amax(path, batches, "percentile", tmp_path, percentile=99.0, num_bins=2048)
    print(f"amax of x: minmax {minmax:.3f}, entropy {entropy:.3f}, percentile {percentile:.3f}")
    assert minmax == pytest.approx(60.0)
    assert entropy < 0.5 * minmax, "entropy should clip the rare outliers"
    assert percentile < 0.5 * minmax, "the 99th percentile should clip the rare outliers"
    assert abs(entropy - percentile) > 1e-3


def test_entropy_bins_matter(skewed, tmp_path):
    """Guards pitfall 4: with the histogram bins passed through, 2048 and 128 bins do not agree."""
    path, batches = skewed
    fine = _amax(path, batches, "entropy", tmp_path, num_bins=2048, num_quantized_bins=128)
    coarse = _amax(path, batches, "entropy", tmp_path, num_bins=128, num_quantized_bins=128)
    assert abs(fine - coarse) > 1e-3


def test_histogram_calibration_uses_the_short_last_batch(skewed, tmp_path):
    path, batches = skewed
    with_short = _amax(path, batches, "percentile", tmp_path, percentile=100.0)
    without_short = _amax(path, batches[:-1], "percentile", tmp_path, percentile=100.0)
    assert calibration_rows(batches) == 32 * 3 + 7
    assert with_short >= without_short
    big = {"x": np.full((3, 16), 200.0, dtype=np.float32)}
    assert _amax(path, [*batches, big], "percentile", tmp_path, percentile=100.0) == pytest.approx(200.0, rel=0.01)


def test_calibration_leaves_no_files_in_the_working_directory_or_workdir(skewed, tmp_path, monkeypatch):
    path, batches = skewed
    cwd, workdir = tmp_path / "cwd", tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    compute_ranges(path, batches, "entropy", op_types=["MatMul"], workdir=workdir)
    assert Path.cwd() == cwd
    assert os.listdir(cwd) == []
    assert os.listdir(workdir) == []


def test_empty_calibration_and_unknown_method_are_user_errors(skewed, tmp_path):
    path, batches = skewed
    with pytest.raises(QbenchError, match="at least one batch"):
        compute_ranges(path, [], "minmax", workdir=tmp_path)
    with pytest.raises(QbenchError, match="distribution"):
        compute_ranges(path, batches, "distribution", workdir=tmp_path)


def test_settings_resolve_defaults_and_report_only_what_the_method_uses():
    from qbench.recipe.spec import VariantSpec

    def settings(spec: VariantSpec, op_types: list[str] | None) -> CalibrationSettings:
        return CalibrationSettings.of(spec.technique_config.calibration, False, op_types)

    entropy = settings(VariantSpec(name="e", precision="int8", calibrator="entropy"), ["MatMul"])
    assert (entropy.num_bins, entropy.num_quantized_bins) == (2048, 128)
    expected = {"calibrator": "entropy", "calibration_symmetric": False, "num_bins": 2048, "num_quantized_bins": 128}
    assert entropy.params() == expected
    spec = VariantSpec(name="p", precision="fp8", calibrator="percentile", percentile=99.9)
    assert settings(spec, None).params()["percentile"] == 99.9
    minmax = settings(VariantSpec(name="m", precision="int8", calibrator="minmax"), None)
    assert set(minmax.params()) == {"calibrator", "calibration_symmetric"}


def test_a_calibrator_registered_after_import_calibrates_by_its_onnxruntime_method(skewed, tmp_path, monkeypatch):
    """The registry is read when a calibrator is used, not copied when this module was imported, and a calibrator
    takes ORT's path by the method its entry names, not by its own name."""
    from qbench.techniques import CALIBRATORS, Calibrator

    path, batches = skewed
    monkeypatch.setattr(CALIBRATORS, "_entries", dict(CALIBRATORS._entries))
    CALIBRATORS.register("absmax", Calibrator("absmax", ("int8",), (), "MinMax"))
    CALIBRATORS.register("p99", Calibrator("p99", ("int8",), ("percentile", "num_bins"), "Percentile"))
    assert _amax(path, batches, "absmax", tmp_path / "a") == _amax(path, batches, "minmax", tmp_path / "m")
    tail = {"percentile": 99.0, "num_bins": 512}
    assert _amax(path, batches, "p99", tmp_path / "p", **tail) == _amax(path, batches, "percentile",
                                                                        tmp_path / "q", **tail)
    assert _amax(path, batches, "p99", tmp_path / "p", **tail) < _amax(path, batches, "absmax", tmp_path / "a")
    settings = CalibrationSettings(method="p99", percentile=99.0, num_bins=512)
    assert settings.params() == {"calibrator": "p99", "calibration_symmetric": False, "num_bins": 512,
                                 "percentile": 99.0}  # fmt: skip


# -- pre-processing: symbolic shape inference only where ONNX's own leaves a tensor untyped -------------------------


def _quantized(model_path: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch, *, symbolic: bool):
    """(nodes, initializer bytes) of ORT's dynamic INT8 of `model_path` after qbench's pre-processing."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from qbench.variants import calibrate

    if symbolic:
        monkeypatch.setattr(calibrate, "typed_by_onnx_inference", lambda model: None)
    workdir.mkdir()
    path, done = calibrate.preprocess_model(onnx.load(str(model_path)), workdir)
    monkeypatch.undo()
    quantize_dynamic(str(path), str(workdir / "int8.onnx"), weight_type=QuantType.QInt8)
    quantized = onnx.load(str(workdir / "int8.onnx"))
    nodes = [(n.op_type, tuple(n.input), tuple(n.output)) for n in quantized.graph.node]
    weights = {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in quantized.graph.initializer}
    return done, nodes, weights


def test_a_graph_onnx_types_fully_skips_the_symbolic_pass_and_quantizes_the_same(mlp, tmp_path, monkeypatch):
    import onnx

    from qbench.variants.calibrate import typed_by_onnx_inference

    assert typed_by_onnx_inference(onnx.load(str(mlp.path))) is not None
    done, nodes, weights = _quantized(mlp.path, tmp_path / "onnx", monkeypatch, symbolic=False)
    symbolic_done, symbolic_nodes, symbolic_weights = _quantized(mlp.path, tmp_path / "sym", monkeypatch, symbolic=True)
    assert "no symbolic shape inference needed" in done and symbolic_done.startswith("symbolic")
    assert any(op == "MatMulInteger" for op, _, _ in nodes)
    assert (nodes, weights) == (symbolic_nodes, symbolic_weights)


def test_untyped_tensors_contrib_ops_and_subgraphs_keep_the_symbolic_pass(graph, tmp_path):
    import onnx
    from onnx import TensorProto

    from qbench.variants.calibrate import typed_by_onnx_inference

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, ["rank"])  # its length: known only at run time
    reshaped = helper.make_model(helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "g",
                                                   [x, shape], [y]))  # fmt: skip
    assert typed_by_onnx_inference(reshaped) is None
    fused = helper.make_model(helper.make_graph([helper.make_node("FusedGemm", ["x", "x"], ["y"],
                                                                  domain="com.microsoft")],
                                                "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("com.microsoft", 1)])  # fmt: skip
    assert typed_by_onnx_inference(fused) is None
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "b", [],
                               [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 4])])  # fmt: skip
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    branched = helper.make_model(helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)], "g", [x, cond],
        [y]))  # fmt: skip
    assert typed_by_onnx_inference(branched) is None
    assert isinstance(typed_by_onnx_inference(onnx.load(str(_plain_matmul(graph, tmp_path)))), onnx.ModelProto)


def _plain_matmul(graph, tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    return graph(tmp_path / "mm.onnx", [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                 {"w": rng.normal(size=(4, 4)).astype(np.float32)}, {"x": 4}, {"y": 4})  # fmt: skip


@pytest.mark.parametrize("big", [False, True])
def test_pre_processing_keeps_the_branch_a_constant_if_does_not_take(tmp_path, monkeypatch, big):
    """ONNX Runtime's symbolic shape inference copies the branch an If with a constant condition takes over the other,
    weights included: every INT8/FP8 variant of such a graph held that branch twice (22 KB of FP32 written as 39 KB)
    and counted the copy's nodes as left float. Pre-processing now writes the graph's nodes as they were."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, numpy_helper

    from qbench.variants import calibrate

    rng = np.random.default_rng(5)
    w = rng.normal(size=(64, 32)).astype(np.float32)
    taken = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"])], "then", [],
                              [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["n", 32])],
                              [numpy_helper.from_array(w, "w")])  # fmt: skip
    other = helper.make_graph([helper.make_node("Identity", ["z"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, ["n", 32])])  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "zero"], ["z"]),
         helper.make_node("If", ["cond"], ["y"], then_branch=taken, else_branch=other)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])],
        [numpy_helper.from_array(np.array(True), "cond"),
         numpy_helper.from_array(np.zeros((64, 32), np.float32), "zero")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if big:  # over protobuf's limit: the main graph's weights are written beside the model, and stay readable
        from protobuf_limit import simulate_protobuf_limit

        simulate_protobuf_limit(monkeypatch, limit=4096, weightless=512)
    path, done = calibrate.preprocess_model(model, tmp_path)
    assert (tmp_path / "preprocessed.onnx.data").is_file() == big
    processed = onnx.load(str(path))
    branches = {a.name: [n.op_type for n in a.g.node] for a in processed.graph.node[1].attribute}
    assert branches == {"then_branch": ["MatMul"], "else_branch": ["Identity"]}
    assert "1 subgraph(s) that symbolic shape inference rewrote restored" in done
    stored = [t.name for a in processed.graph.node[1].attribute for t in a.g.initializer]
    assert stored == ["w"]  # the branch's weight stored once
    x = rng.normal(size=(3, 64)).astype(np.float32)
    out = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(out, x @ w)


def test_pre_processing_a_fully_typed_graph_imports_no_sympy(graph, tmp_path):
    """ONNX Runtime's symbolic shape inference imports sympy (and torch, where installed): seconds of a `qbench
    sweep` process that builds INT8 of an ONNX model that never needed it."""
    import subprocess
    import sys

    model = _plain_matmul(graph, tmp_path)
    code = ("import sys, onnx\nfrom pathlib import Path\nfrom qbench.variants.calibrate import preprocess_model\n"
            f"preprocess_model(onnx.load({str(model)!r}), Path({str(tmp_path)!r}))\n"
            "print(sorted(m for m in ('sympy', 'torch') if m in sys.modules))")  # fmt: skip
    output = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert output.strip().splitlines()[-1] == "[]"
@pytest.mark.parametrize("fill", [-np.inf, np.finfo(np.float32).min], ids=["minus_inf", "float32_min"])
def test_a_tensor_holding_a_masks_fill_is_left_float_by_minmax(graph, tmp_path, fill):
    """An attention mask added as -inf (nn.MultiheadAttention's key_padding_mask, exported as Where(mask, -inf, 0)):
    min/max calibration gave that tensor and the scores it is added to a range of -inf, the quantizer a scale of inf,
    and the static INT8 of a trained attention classifier fell from 0.955 to 0.595 accuracy. Hugging Face's causal
    models (GPT-2, Llama) fill with float32's minimum instead: a finite range, but a scale of about 1e36 that rounded
    every attention score to zero (a 2-layer GPT-2's mean cosine to FP32 fell to 0.56). Either range is dropped, as the
    histogram calibrators already drop it, and the nodes around it stay float."""
    from qbench.recipe.spec import VariantSpec
    from qbench.variants import BuildContext, build_variant

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="project"),
             helper.make_node("Cast", ["pad"], ["is_pad"], to=9, name="to_bool"),
             helper.make_node("Where", ["is_pad", "minus_inf", "zero"], ["mask_bias"], name="mask"),
             helper.make_node("Add", ["h", "mask_bias"], ["scores"], name="add_mask"),
             helper.make_node("Softmax", ["scores"], ["weights"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["weights", "w2"], ["y"], name="head")]  # fmt: skip
    weights = {"w": rng.normal(size=(8, 8)).astype(np.float32), "w2": rng.normal(size=(8, 3)).astype(np.float32),
               "minus_inf": np.array(fill, np.float32), "zero": np.array(0.0, np.float32)}  # fmt: skip
    path = graph(tmp_path / "masked.onnx", nodes, weights, {"x": 8, "pad": 8}, {"y": 3})

    def rows(n: int) -> dict[str, np.ndarray]:
        pad = (np.arange(8)[None, :] >= rng.integers(2, 9, (n, 1))).astype(np.float32)  # 2 to 8 real positions
        return {"x": rng.normal(size=(n, 8)).astype(np.float32), "pad": pad}

    calibration = [rows(16) for _ in range(3)]
    calibrated = compute_ranges(path, calibration, "minmax", workdir=tmp_path / "c")
    assert {"mask_bias", "scores"} <= set(calibrated.skipped) and "scores" not in calibrated.ranges
    assert "x" in calibrated.ranges and "weights" in calibrated.ranges
    built = build_variant(VariantSpec(name="int8", precision="int8", calibrator="minmax"),
                          BuildContext(reference_path=path, workdir=tmp_path / "w",
                                       calibration=calibration))  # fmt: skip
    assert any("not calibrated" in note and "scores" in note for note in built.notes)
    import onnxruntime as ort

    held_out = rows(64)
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, held_out)
    (got,) = ort.InferenceSession(str(built.onnx_path), providers=["CPUExecutionProvider"]).run(None, held_out)
    assert np.isfinite(got).all()
    assert np.max(np.abs(got - want)) < 0.1 * np.max(np.abs(want))


@pytest.mark.parametrize("precision,calibrator", [("int8", "minmax"), ("int8", "entropy"), ("int8", "percentile"),
                                                  ("fp8", "minmax")])  # fmt: skip
def test_a_tensor_zero_on_every_calibration_row_is_left_float(graph, tmp_path, precision, calibrator):
    """An input that is 0 on every calibration row (a feature group the calibration export left empty, an optional
    input absent there) calibrated to the range [0, 0]: ONNX Runtime replaced the scale it cannot form by 1.0, so the
    INT8 variant rounded that input to whole numbers and clipped it at 255 on real rows (a 4-feature MLP calibrated on
    zeros: agreement with FP32 0.655). Its range is dropped: the tensor and the nodes reading it stay float, and the
    notes say why."""
    import onnxruntime as ort

    from qbench.recipe.spec import VariantSpec
    from qbench.variants import BuildContext, build_variant

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm_x"),
             helper.make_node("MatMul", ["z", "w2"], ["b"], name="mm_z")]  # fmt: skip
    weights = {"w": rng.normal(size=(8, 3)).astype(np.float32), "w2": rng.normal(size=(8, 3)).astype(np.float32)}
    path = graph(tmp_path / "zero.onnx", nodes, weights, {"x": 8, "z": 8}, {"a": 3, "b": 3})
    calibration = [{"x": rng.normal(size=(16, 8)).astype(np.float32), "z": np.zeros((16, 8), np.float32)}] * 3

    calibrated = compute_ranges(path, calibration, calibrator, workdir=tmp_path / "c")
    assert "z" not in calibrated.ranges and "0 on every calibration row" in calibrated.skipped["z"]
    assert "x" in calibrated.ranges
    built = build_variant(VariantSpec(name="v", precision=precision, calibrator=calibrator),
                          BuildContext(reference_path=path, workdir=tmp_path / "w",
                                       calibration=calibration))  # fmt: skip
    assert any("0 on every calibration row" in note for note in built.notes)
    held_out = {"x": rng.normal(size=(64, 8)).astype(np.float32), "z": rng.normal(size=(64, 8)).astype(np.float32)}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["b"], held_out)[0]
    got = ort.InferenceSession(str(built.onnx_path), providers=["CPUExecutionProvider"]).run(["b"], held_out)[0]
    assert np.max(np.abs(got - want)) < 0.1 * np.max(np.abs(want))


def test_pre_processing_a_model_over_protobufs_limit_writes_its_weights_beside_it(tmp_path, monkeypatch):
    """ORT's pre-processing saved a model over 2 GiB as one protobuf: the dynamic INT8 build of one failed with
    "Unable to parse proto from file: .../symbolic_shape_inferred.onnx". The limit is simulated at 8 KB."""
    import onnx
    from protobuf_limit import simulate_protobuf_limit

    from qbench.variants import calibrate
    from tests.variants.conftest import save_graph

    rng = np.random.default_rng(0)
    weights = {"w1": rng.normal(size=(32, 64)).astype(np.float32), "w2": rng.normal(size=(64, 4)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]  # fmt: skip
    source = save_graph(tmp_path / "mlp.onnx", nodes, weights, {"x": 32}, {"y": 4})
    simulate_protobuf_limit(monkeypatch, limit=8192, weightless=512)
    for symbolic in (False, True):  # ONNX's inference typed every tensor; and the symbolic pass
        if symbolic:
            monkeypatch.setattr(calibrate, "typed_by_onnx_inference", lambda model: None)
        workdir = tmp_path / str(symbolic)
        workdir.mkdir()
        path, _ = calibrate.preprocess_model(onnx.load(str(source)), workdir)
        stored = onnx.load(str(path), load_external_data=False)
        assert {t.name for t in stored.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL} == {"w1", "w2"}
        assert (workdir / "preprocessed.onnx.data").is_file()
        read = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
        assert all(np.array_equal(read[name], value) for name, value in weights.items())


@pytest.mark.parametrize(("named", "in_workdir", "saves"), [(True, True, 0), (False, True, 1), (True, False, 1)])
def test_a_model_already_in_normal_form_is_calibrated_from_its_own_file(tmp_path, monkeypatch, named,
                                                                        in_workdir, saves):
    """compute_ranges loaded the model and saved it again to calibrate the copy: a full write of the weights (and the
    model held in memory through the calibration) for the file every INT8/FP8 build has just pre-processed into its
    scratch folder. Such a file is calibrated as it is; one with an unnamed node is still saved named, and one
    outside the caller's folder is copied there (ORT's calibrator writes scratch files beside its model)."""
    import onnx
    from onnx import numpy_helper

    from qbench.variants import calibrate

    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.normal(size=(16, 4)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm" if named else "")], "g",
                              [helper.make_tensor_value_info("x", 1, ["n", 16])],
                              [helper.make_tensor_value_info("y", 1, ["n", 4])], [w])  # fmt: skip
    workdir = tmp_path / "work"
    path = (workdir if in_workdir else tmp_path / "user") / "m.onnx"
    path.parent.mkdir(parents=True)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path),
                    save_as_external_data=True, location="m.onnx.data", size_threshold=0)  # fmt: skip
    batches = [{"x": rng.normal(size=(8, 16)).astype(np.float32)}]
    saved: list[Path] = []
    real_save = calibrate.save_model
    monkeypatch.setattr(calibrate, "save_model", lambda model, target: saved.append(target) or real_save(model, target))
    ranges = compute_ranges(path, batches, "minmax", op_types=["MatMul"], workdir=workdir).ranges
    assert len(saved) == saves
    assert tensor_amax(ranges, "x") == pytest.approx(float(np.abs(batches[0]["x"]).max()))
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.onnx", "m.onnx.data"]  # ORT's scratch files gone


@pytest.mark.parametrize("method", ["minmax", "entropy"])
def test_calibrating_a_model_over_protobufs_limit_writes_the_augmented_copy_with_external_data(tmp_path, monkeypatch,
                                                                                               method):
    """ORT's calibrator saved its augmented copy of a model over 2 GiB as one protobuf, which it could not parse back:
    the static INT8 build of a 2.4 GB MLP failed with "INVALID_PROTOBUF : Load model from .../augmented.onnx failed".
    The limit is simulated at 8 KB; the ranges are those of the model below it."""
    import onnx
    from protobuf_limit import simulate_protobuf_limit

    from qbench.variants import calibrate
    from tests.variants.conftest import save_graph

    rng = np.random.default_rng(0)
    weights = {"w1": rng.normal(size=(32, 64)).astype(np.float32), "w2": rng.normal(size=(64, 4)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]  # fmt: skip
    source = save_graph(tmp_path / "mlp.onnx", nodes, weights, {"x": 32}, {"y": 4})
    onnx.save_model(onnx.load(str(source)), str(source), save_as_external_data=True, location="mlp.onnx.data")
    batches = [{"x": rng.normal(size=(8, 32)).astype(np.float32)} for _ in range(3)]
    expected = calibrate.compute_ranges(source, batches, method, workdir=tmp_path / "below")
    calibrate.RANGES.clear()
    simulate_protobuf_limit(monkeypatch, limit=8192, weightless=512, serialisation=True)
    got = calibrate.compute_ranges(source, batches, method, workdir=tmp_path / "over")
    calibrate.RANGES.clear()
    assert sorted(got.ranges.keys()) == sorted(expected.ranges.keys()) and len(expected.ranges.keys()) >= 3
    for name in expected.ranges.keys():
        for a, b in zip(got.ranges[name].range_value, expected.ranges[name].range_value, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_note_on_nodes_left_float_around_unranged_tensors_counts_the_ones_it_does_not_name(graph, tmp_path):
    """The note named 5 nodes under a count of 6 and said nothing of the sixth (a Wav2Vec2 CTC model's static INT8:
    `6 node(s) left in FP32 around tensors without a range:` followed by 5 names), so a reader could not tell a
    node was missing from the list. Past 5 names it now says how many more, as the 'not calibrated' note does."""
    from qbench.recipe.spec import VariantSpec
    from qbench.variants import BuildContext, build_variant

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm_x")]
    nodes += [helper.make_node("MatMul", ["z", f"w{i}"], [f"b{i}"], name=f"mm_z{i}") for i in range(7)]
    nodes.append(helper.make_node("Sum", [f"b{i}" for i in range(7)], ["b"], name="sum_z"))
    weights = {"w": rng.normal(size=(8, 3)).astype(np.float32)}
    weights.update({f"w{i}": rng.normal(size=(8, 3)).astype(np.float32) for i in range(7)})
    path = graph(tmp_path / "zero7.onnx", nodes, weights, {"x": 8, "z": 8}, {"a": 3, "b": 3})
    calibration = [{"x": rng.normal(size=(16, 8)).astype(np.float32), "z": np.zeros((16, 8), np.float32)}] * 3
    built = build_variant(VariantSpec(name="v", precision="int8", calibrator="minmax"),
                          BuildContext(reference_path=path, workdir=tmp_path / "w",
                                       calibration=calibration))  # fmt: skip
    (note,) = [note for note in built.notes if "around tensors without a range" in note]
    # the 7 MatMuls reading z and the Sum of their outputs, 0 on every calibration row too
    assert note.startswith("8 node(s) left in FP32")
    assert note.endswith("mm_z0, mm_z1, mm_z2, mm_z3, mm_z4 (+3 more)")
