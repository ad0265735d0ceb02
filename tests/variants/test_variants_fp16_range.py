"""FP16 keeps in float32 the tensors FP16 cannot hold, decided from the FP32 model's values on the calibration sample;
FP16 and BF16 leave the data movement between float32 nodes alone.

Every FP16 figure is read from the emulation the sweep scores on CPU (emulate.float16_emulation): it rounds every
float16 tensor as FP16 hardware does, so an overflow shows as inf there."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qbench.recipe.spec import VariantSpec
from qbench.variants.base import BuildContext
from qbench.variants.emulate import float16_emulation
from qbench.variants.float_support import KeptNodes, tensor_types, with_data_movement_between_kept
from qbench.variants.fp16 import build_bf16, build_fp16
from qbench.variants.fp16_range import out_of_fp16_range
from qbench.variants.onnx_utils import load_model

RNG = np.random.default_rng(0)


def _ort(path, feeds) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _fp16_output(built, feeds) -> np.ndarray:
    """What the sweep scores for an FP16 variant on CPU: its emulation (the FP32 model itself when unchanged)."""
    scored = built.onnx_path if "unchanged" in built.params else float16_emulation(built).scored.onnx_path
    return _ort(scored, feeds)


def _raw_feature_mlp(graph, folder):
    """x holds raw features of 1e5..1e7, normalised in the graph (Sub mean, Div std) before a 2-layer MLP."""
    nodes = [
        helper.make_node("Sub", ["x", "mean"], ["centred"], name="centre"),
        helper.make_node("Div", ["centred", "std"], ["z"], name="scale"),
        helper.make_node("MatMul", ["z", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    weights = {"mean": np.full(6, 5e6, np.float32), "std": np.full(6, 3e6, np.float32),
               "w1": RNG.normal(size=(6, 16)).astype(np.float32), "w2": RNG.normal(size=(16, 3)).astype(np.float32)}
    return graph(folder / "raw.onnx", nodes, weights, {"x": 6}, {"y": 3})


def _features(rows: int) -> dict[str, np.ndarray]:
    return {"x": RNG.uniform(1e5, 1e7, (rows, 6)).astype(np.float32)}


def test_raw_features_beyond_fp16_keep_only_the_nodes_that_read_them_in_fp32(graph, tmp_path):
    path = _raw_feature_mlp(graph, tmp_path)
    calibration = [_features(32) for _ in range(3)]
    built = build_fp16(VariantSpec(name="half", precision="fp16"), BuildContext(path, tmp_path / "w", calibration))
    held_out = _features(200)
    reference, got = _ort(path, held_out), _fp16_output(built, held_out)
    print(f"max |fp16 - fp32| = {np.max(np.abs(got - reference)):.4g}")
    assert np.all(np.isfinite(got))  # before: x became inf in FP16, every output NaN
    np.testing.assert_allclose(got, reference, rtol=0.02, atol=0.05)
    checked = built.params["fp16_range"]
    assert checked["rows_checked"] == 96 and set(checked["kept_nodes"]) == {"centre", "scale"}
    assert {"x", "centred", "mean", "std"} <= set(checked["tensors"]) and "z" not in checked["tensors"]
    assert built.params["converted_nodes"] == 3  # the MLP itself is FP16
    model = onnx.load(str(built.onnx_path))
    kinds = {t.name: t.data_type for t in model.graph.initializer}
    assert kinds["w1"] == kinds["w2"] == TensorProto.FLOAT16 and kinds["mean"] == TensorProto.FLOAT
    assert any("kept in FP32 for range" in note and "x (max |x| 1e+07)" in note for note in built.notes)


def test_a_batchnorm_with_a_huge_running_variance_stays_fp32_with_the_conv_feeding_it(graph, tmp_path):
    """A variance of 1e10 clamped to 65504 divides by 256 instead of 1e5; the conv output (~5e5) overflows."""
    nodes = [
        helper.make_node("Conv", ["x", "wc"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["y"], name="flat"),
    ]
    weights = {"wc": RNG.normal(size=(4, 1, 3, 3)).astype(np.float32) * 1e3, "s": np.ones(4, np.float32),
               "b": np.zeros(4, np.float32), "m": np.zeros(4, np.float32), "v": np.full(4, 1e10, np.float32)}
    graph_ = helper.make_graph(
        [*nodes], "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        initializer=[numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    path = tmp_path / "bn.onnx"
    onnx.save(helper.make_model(graph_, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    images = [{"x": RNG.uniform(0, 100, (32, 1, 8, 8)).astype(np.float32)} for _ in range(3)]
    built = build_fp16(VariantSpec(name="half", precision="fp16"), BuildContext(path, tmp_path / "w", images))
    held_out = {"x": RNG.uniform(0, 100, (64, 1, 8, 8)).astype(np.float32)}
    reference, got = _ort(path, held_out), _fp16_output(built, held_out)
    print(f"max relative error {np.max(np.abs(got - reference) / (np.abs(reference) + 1e-3)):.3g}")
    np.testing.assert_allclose(got, reference, rtol=0.01, atol=1e-4)  # before: 75 % of the outputs were inf
    assert set(built.params["fp16_range"]["kept_nodes"]) == {"conv", "bn"}
    assert built.params["weights_clamped"] == 0


def test_a_tensor_of_subnormal_values_keeps_its_producer_and_readers_fp32(graph, tmp_path):
    """x * x with x ~ 1e-3 is ~1e-6: every value subnormal in FP16 (6 % spacing at 1e-6, zero below 3e-8)."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["tiny"], name="square"),
             helper.make_node("MatMul", ["tiny", "w"], ["y"], name="mm"),
             helper.make_node("Relu", ["x"], ["other"], name="relu")]  # fmt: skip
    path = graph(tmp_path / "tiny.onnx", nodes, {"w": np.full((4, 2), 1e3, np.float32)}, {"x": 4}, {"y": 2, "other": 4})
    sample = [{"x": RNG.uniform(1e-4, 2e-3, (16, 4)).astype(np.float32)}]
    built = build_fp16(VariantSpec(name="half", precision="fp16"), BuildContext(path, tmp_path / "w", sample))
    reference, got = _ort(path, sample[0]), _fp16_output(built, sample[0])
    np.testing.assert_allclose(got, reference, rtol=1e-5)  # before: up to 1 % off
    assert set(built.params["fp16_range"]["kept_nodes"]) == {"square", "mm"}
    assert built.params["converted_nodes"] == 1  # the Relu


def test_the_range_has_headroom_for_activations_and_none_for_constants(graph, tmp_path):
    nodes = [helper.make_node("Mul", ["x", "k"], ["big"], name="scale"),
             helper.make_node("Relu", ["big"], ["y"], name="relu"),
             helper.make_node("Mul", ["x", "half_k"], ["z"], name="halve"),
             helper.make_node("Less", ["x", "fits"], ["below"], name="compare")]  # fmt: skip
    weights = {"k": np.array([40.0], np.float32), "half_k": np.array([20.0], np.float32),
               "fits": np.array([60000.0], np.float32)}
    path = graph(tmp_path / "headroom.onnx", nodes, weights, {"x": 1}, {"y": 1, "z": 1})
    model = load_model(path)
    sample = [{"x": np.array([[500.0], [1000.0]], np.float32)}]  # x * 40 reaches 40000: over 65504 / 2; x * 20 not
    found = out_of_fp16_range(model, tensor_types(model), sample)
    assert set(found.tensors) == {"big", "y"} and set(found.nodes) == {"scale", "relu"}  # a constant of 60000 is exact
    no_sample = out_of_fp16_range(model, tensor_types(model), [])
    assert no_sample.rows == 0 and not no_sample.nodes


def test_data_movement_between_fp32_nodes_stays_fp32_and_nothing_else_does(graph, tmp_path):
    """Concat -> Reshape between a kept node and the output stays with it; a Transpose feeding a MatMul does not."""
    nodes = [helper.make_node("Concat", ["x", "x"], ["cat"], name="cat", axis=1),
             helper.make_node("Reshape", ["cat", "shape"], ["flat"], name="reshape"),
             helper.make_node("Abs", ["flat"], ["y"], name="kept"),
             helper.make_node("Identity", ["x"], ["xi"], name="ident"),
             helper.make_node("MatMul", ["xi", "w"], ["z"], name="mm")]  # fmt: skip
    weights = {"shape": np.array([-1, 4], np.int64), "w": np.ones((2, 2), np.float32)}
    path = graph(tmp_path / "glue.onnx", nodes, weights, {"x": 2}, {"y": 4, "z": 2})
    model = load_model(path)
    kept = with_data_movement_between_kept(model, KeptNodes({"kept": "test"}), tensor_types(model))
    assert set(kept.names) == {"kept", "cat", "reshape"}


def test_a_pipelines_concat_in_front_of_trees_is_not_rounded_to_fp16_or_bf16(tmp_path):
    """ColumnTransformer -> RandomForest with features near 1e4 (FP16 spacing 8, BF16 spacing 64): every compute
    node is an ai.onnx.ml operator, FP32 in any deployment, so neither variant has anything to lower."""
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = RNG.uniform(9000, 11000, (400, 4)).astype(np.float32)
    labels = (x[:, 0] + x[:, 1] > 20000).astype(int)
    pipeline = make_pipeline(ColumnTransformer([("raw", "passthrough", [0, 1]), ("scaled", StandardScaler(), [2, 3])]),
                             RandomForestClassifier(20, random_state=0)).fit(x, labels)  # fmt: skip
    path = tmp_path / "forest.onnx"
    onnx.save(skl2onnx.to_onnx(pipeline, x[:1], options={"zipmap": False}, target_opset={"": 17, "ai.onnx.ml": 3}),
              str(path))  # fmt: skip
    ctx = BuildContext(path, tmp_path / "w", [{"X": x[:64]}])
    for build, precision in ((build_fp16, "fp16"), (build_bf16, "bf16")):
        built = build(VariantSpec(name=precision, precision=precision), ctx)
        assert "unchanged" in built.params, built.notes  # before: the Concat was lowered, 1-4 % of the labels flipped
        assert built.onnx_path == path.resolve()


FLOAT32_MIN = float(np.finfo(np.float32).min)  # -3.4e38: the mask fill of torch.finfo(float32).min


def _attention_block(path, extra_nodes=(), extra_weights=None, output="y"):
    """One attention head as transformer exports write it: the mask (1 keep, 0 pad) becomes (1 - mask) * float32's
    minimum (a Constant node), added to the scaled scores before the softmax."""
    d = 8
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v"),
        helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale"),
        helper.make_node("Unsqueeze", ["mask", "axis1"], ["mask3"], name="unsqueeze"),
        helper.make_node("Sub", ["one", "mask3"], ["padding"], name="invert"),
        helper.make_node("Constant", [], ["fill"], name="fill",
                         value=numpy_helper.from_array(np.array(FLOAT32_MIN, np.float32))),
        helper.make_node("Mul", ["padding", "fill"], ["bias"], name="mask_bias"),
        helper.make_node("Add", ["scaled", "bias"], ["masked"], name="mask_add"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["context"], name="context"),
        helper.make_node("MatMul", ["context", "wo"], ["y"], name="out"),
        *extra_nodes,
    ]  # fmt: skip
    weights = {name: RNG.normal(size=(d, d)).astype(np.float32) for name in ("wq", "wk", "wv", "wo")}
    weights |= {"scale": np.array(d**-0.5, np.float32), "axis1": np.array([1], np.int64),
                "one": np.array(1, np.float32),
                **(extra_weights or {})}  # fmt: skip
    graph_ = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "t", d]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["n", "t"])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["n", "t", d])],
        initializer=[numpy_helper.from_array(value, name) for name, value in weights.items()],
    )  # fmt: skip
    onnx.save(helper.make_model(graph_, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _sentences(rows: int, tokens: int = 12) -> dict[str, np.ndarray]:
    """Token states and a padding mask: each row keeps its first 2..tokens positions."""
    lengths = RNG.integers(2, tokens + 1, rows)
    return {"x": RNG.normal(size=(rows, tokens, 8)).astype(np.float32),
            "mask": (np.arange(tokens)[np.newaxis, :] < lengths[:, np.newaxis]).astype(np.float32)}  # fmt: skip


def test_an_attention_mask_filled_from_float32s_minimum_is_left_to_fp16_clamped(tmp_path):
    """The converter clamps -3.4e38 to -65504 and the softmax is exactly the same: no node of the block stays FP32
    (before: the fill, the mask's Mul and Add and the Softmax did, casts around every softmax)."""
    path = _attention_block(tmp_path / "attention.onnx")
    calibration = [_sentences(16) for _ in range(2)]
    built = build_fp16(VariantSpec(name="half", precision="fp16"), BuildContext(path, tmp_path / "w", calibration))
    checked = built.params["fp16_range"]
    print(checked)
    assert checked["kept_nodes"] == [] and checked["tensors"] == {} and built.params["kept_fp32_nodes"] == 0
    assert checked["harmless"]["fill"] == {"max_abs": 3.403e38, "output_change_fp16_spacings": 0.0}
    assert built.params["weights_clamped"] == 1
    assert "1 weight value(s) beyond FP16's largest finite value (65504) were clamped to it" in built.notes
    model = onnx.load(str(built.onnx_path))
    softmax = next(node for node in model.graph.node if node.op_type == "Softmax")
    assert softmax.attribute[0].name == "axis" and not any(n.op_type == "Cast" and n.output[0] == softmax.input[0]
                                                           for n in model.graph.node)  # fmt: skip
    held_out = _sentences(64)
    reference, got = _ort(path, held_out), _fp16_output(built, held_out)
    cosine = np.sum(reference * got, -1) / np.linalg.norm(reference, axis=-1) / np.linalg.norm(got, axis=-1)
    print(f"cosine fp16 vs fp32: min {cosine.min():.6f}")
    assert np.all(np.isfinite(got)) and cosine.min() > 0.999
    assert any("left to FP16 though out of its range" in note and "fill (max |x| 3.4e+38)" in note
               for note in built.notes)


def test_a_harmful_constant_beside_a_harmless_mask_keeps_only_its_own_reader_fp32(tmp_path):
    """y / 1e5: clamped to 65504, the constant scales the output by 1.5. The group's trial fails; one by one, only
    the divisor keeps its reader FP32, and the mask fill is still clamped harmlessly."""
    extra = [helper.make_node("Div", ["y", "big"], ["z"], name="shrink")]
    path = _attention_block(tmp_path / "attention.onnx", extra, {"big": np.array(1e5, np.float32)}, output="z")
    built = build_fp16(VariantSpec(name="half", precision="fp16"),
                       BuildContext(path, tmp_path / "w", [_sentences(16) for _ in range(2)]))  # fmt: skip
    checked = built.params["fp16_range"]
    print(checked)
    assert checked["kept_nodes"] == ["shrink"] and set(checked["tensors"]) == {"big"}
    assert set(checked["harmless"]) == {"fill", "bias", "masked"}  # the fill; the mask made from it, then overflowed
    assert checked["kept_because"]["big"].startswith("clamped as the converter clamps it, it moves the outputs by")
    held_out = _sentences(64)
    np.testing.assert_allclose(_fp16_output(built, held_out), _ort(path, held_out), rtol=0.02, atol=1e-6)


def _rows_of_each_run(monkeypatch) -> list[int]:
    """The rows of every ONNX Runtime run made from now on in the test, in order."""
    run_rows: list[int] = []
    real_session = ort.InferenceSession

    class CountingSession(real_session):
        def run(self, output_names, feeds, *args, **kwargs):
            run_rows.append(len(next(iter(feeds.values()))))
            return super().run(output_names, feeds, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", CountingSession)
    return run_rows


def test_activations_are_read_in_parts_of_a_batch_that_fit_the_memory_budget(graph, tmp_path, monkeypatch):
    """Every exposed tensor of a run is alive at once: a vision model's activations of a 16-row calibration batch run
    to gigabytes. The batch is run in parts sized by the bytes a row's tensors took, with the same magnitudes."""
    from qbench.variants import fp16_range

    model = load_model(_raw_feature_mlp(graph, tmp_path))
    names = ["x", "centred", "z", "h", "r", "y"]
    batches = [_features(16) for _ in range(2)]
    whole = fp16_range.activation_magnitudes(model, names, batches)
    run_rows = _rows_of_each_run(monkeypatch)
    bytes_per_row = 4 * (6 + 6 + 16 + 16 + 3)  # the exposed outputs of one row: centred, z, h, r, y
    parted = fp16_range.activation_magnitudes(model, names, batches, memory_budget=5 * bytes_per_row)
    assert parted == whole
    assert run_rows[0] == 2 and max(run_rows) == 5 and sum(run_rows) == 32


def test_the_fp16_build_of_a_model_of_a_fixed_batch_reads_its_batches_whole(graph, tmp_path, monkeypatch):
    """A session of a fixed-batch model refuses any other batch: the range check must not run it in parts."""
    model = load_model(_raw_feature_mlp(graph, tmp_path))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 16
    path = tmp_path / "fixed.onnx"
    onnx.save(model, str(path))
    run_rows = _rows_of_each_run(monkeypatch)
    context = BuildContext(path, tmp_path / "w", [_features(16) for _ in range(2)], fixed_batch=16)
    built = build_fp16(VariantSpec(name="half", precision="fp16"), context)
    assert built.params["fp16_range"]["rows_checked"] == 32
    assert run_rows and set(run_rows) == {16}


def test_a_full_disk_in_a_trial_fails_the_build_rather_than_building_it_without_the_trial(tmp_path, monkeypatch):
    """The trial's model is saved to a temporary folder. A full disk there was taken for ONNX Runtime refusing the
    trial: the mask fill then stayed FP32 (as without a trial) and the build succeeded, with other figures, and went
    to the build store under the key of a build made with its trial. Now the build fails, naming the disk."""
    import errno
    import os

    from qbench.errors import QbenchError, environment_cause
    from qbench.variants import fp16_trials, onnx_utils

    path = _attention_block(tmp_path / "attention.onnx")
    calibration = [_sentences(16) for _ in range(2)]
    saved = onnx_utils.save_model

    def full_disk(model, target):
        with onnx_utils.writing_file(target, "the model"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fp16_trials, "save_model", full_disk)
    with pytest.raises(QbenchError, match=r"trial\.onnx: cannot write the model: No space left on device$") as failed:
        build_fp16(VariantSpec(name="half", precision="fp16"), BuildContext(path, tmp_path / "w", calibration))
    assert environment_cause(failed.value) == "no space left on device"  # the machine's fault: --resume builds it again
    monkeypatch.setattr(fp16_trials, "save_model", saved)
    built = build_fp16(VariantSpec(name="half", precision="fp16"), BuildContext(path, tmp_path / "again", calibration))
    assert built.params["fp16_range"]["kept_nodes"] == []  # with its trial: the fill is clamped, nothing stays FP32


def test_an_output_living_below_fp16s_normals_is_judged_at_its_own_scale(graph, tmp_path):
    """Logits of ~1e-9 (a net whose activations shrink layer after layer, as a randomly initialised MobileNetV2's
    reach 1e-25): rounding the hidden layer to FP16's subnormals zeroes most of it and reorders the logits, yet
    moves them by far less than FP16's smallest subnormal. Measured in FP16 spacings floored at 2**-24 that read as
    harmless and the FP16 variant's logits collapsed; the output's own scale calls it harmful."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
             helper.make_node("Mul", ["a", "c"], ["b"], name="shrink1"),
             helper.make_node("Mul", ["b", "c"], ["h"], name="shrink2"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]  # fmt: skip
    weights = {"w1": (rng.normal(size=(8, 16)) * 0.1).astype(np.float32), "c": np.array([1e-4], np.float32),
               "w2": (rng.normal(size=(16, 4)) * 0.1).astype(np.float32)}  # every constant normal in FP16
    path = graph(tmp_path / "shrinking.onnx", nodes, weights, {"x": 8}, {"y": 4})
    sample = [{"x": rng.normal(size=(32, 8)).astype(np.float32)} for _ in range(2)]
    built = build_fp16(VariantSpec(name="half", precision="fp16"), BuildContext(path, tmp_path / "w", sample))
    held_out = {"x": rng.normal(size=(200, 8)).astype(np.float32)}
    reference, got = _ort(path, held_out), _fp16_output(built, held_out)
    assert np.abs(reference).max() < 6.1e-5  # every logit below FP16's smallest normal
    agreement = float(np.mean(reference.argmax(1) == got.argmax(1)))
    print(f"top-1 agreement with FP32 {agreement:.3f}, max |logit| FP32 {np.abs(reference).max():.3g}")
    assert agreement == 1.0  # before: 0.46, h and r "harmless" at 0.06 FP16 spacings
    assert set(built.params["fp16_range"]["kept_nodes"]) == {"shrink2", "relu", "mm2"}
