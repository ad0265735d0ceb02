"""The `linear` and `smoothquant` techniques on tiny graphs: folding vs an inserted Mul, static/dynamic
Linear-only INT8, per-channel weights, symmetric/asymmetric activations, the alphas `auto` tries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from test_variants_smoothquant import (
    STATIC,
    WIDTH,
    _batches,
    _copy,
    _model,
    _op_counts,
    _reference,
    _simulated,
    attention_block,
    ffn_block,
    relative_error,
    sqnr_db,
)

from qbench.recipe.spec import VariantSpec
from qbench.variants import build_variant
from qbench.variants.base import BuildContext
from qbench.variants.linear_int8 import linear_int8, smoothquant_int8
from qbench.variants.linear_qdq import LinearQuantSettings
from qbench.variants.smoothquant import SmoothQuantSettings, smooth_model
from tests.variants.conftest import run_variant


@pytest.mark.parametrize("block", [ffn_block, attention_block])
def test_folding_computes_what_the_inserted_mul_computes(block, tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    model, calibration, held_out = (block(rng), _batches(rng, 3), _batches(rng, 1, rows=16)[0])
    folded = smooth_model(_copy(model), calibration, SmoothQuantSettings(alpha=0.5), tmp_path)
    unfolded = smooth_model(_copy(model), calibration, SmoothQuantSettings(alpha=0.5, fold=False), tmp_path)
    assert sum(folded.report.folded_into.values()) >= 1 and unfolded.report.folded_into == {}
    assert unfolded.report.inserted_muls == unfolded.report.groups == folded.report.groups
    assert _op_counts(unfolded.model)["Mul"] - _op_counts(folded.model)["Mul"] == sum(
        folded.report.folded_into.values()
    )
    float_diff = np.abs(_reference(folded.model, held_out) - _reference(unfolded.model, held_out)).max()
    scale = np.abs(_reference(model, held_out)).max()
    # quantized: the same scales either way, so INT8 outputs differ only where float rounding flips an int8 step
    settings = SmoothQuantSettings(alpha=0.5, quantization=STATIC)
    int8_folded, _ = smoothquant_int8(_copy(model), calibration, settings, tmp_path)
    int8_unfolded, _ = smoothquant_int8(
        _copy(model), calibration, SmoothQuantSettings(0.5, quantization=STATIC, fold=False), tmp_path
    )
    int8_diff = relative_error(_simulated(int8_unfolded, held_out), _simulated(int8_folded, held_out))
    print(
        f"{block.__name__}: folded vs unfolded max |diff| float "
        f"{float_diff:.2e} (of {scale:.2f}), INT8 {int8_diff:.2e} relative"
    )
    assert float_diff <= 1e-5 * scale
    assert int8_diff < 2e-2


def test_linear_technique_static_and_dynamic_keep_outputs_float(tmp_path: Path) -> None:
    rng = np.random.default_rng(12)
    path = tmp_path / "attention.onnx"
    model = attention_block(rng)
    onnx.save(model, str(path))
    calibration, held_out = _batches(rng, 3), _batches(rng, 1, rows=16)[0]
    quality: dict[str, float] = {}
    for calibrator, kernel in (("minmax", "DequantizeLinear"), ("dynamic", "MatMulInteger")):
        spec = VariantSpec(name=f"lin-{calibrator}", precision="int8", technique="linear", calibrator=calibrator)
        built = build_variant(
            spec, BuildContext(reference_path=path, workdir=tmp_path / calibrator, calibration=calibration)
        )
        quantized = onnx.load(str(built.onnx_path))
        assert built.params["technique"] == "linear" and built.params["quantized_linears"] == 4
        assert built.params["float_matmuls"] == 2 and built.params["per_channel"] is True
        assert "alpha" not in built.params and built.params["calibration_batches"] == (
            3 if calibrator == "minmax" else 0
        )
        assert _op_counts(quantized)[kernel] >= 4
        # attention MatMuls still multiply two float tensors; every QuantizeLinear is on a Linear input
        attention = {n.name: n for n in quantized.graph.node if n.name in ("attention_scores", "attention_context")}
        assert [n.op_type for n in attention.values()] == ["MatMul", "MatMul"]
        quality[calibrator] = sqnr_db(_reference(model, held_out), _simulated(quantized, held_out))
    spec = VariantSpec(name="sq", precision="int8", calibrator="minmax", smoothquant={"alpha": 0.5})
    built = build_variant(spec, BuildContext(reference_path=path, workdir=tmp_path / "sq", calibration=calibration))
    quality["smoothquant"] = sqnr_db(_reference(model, held_out), _simulated(onnx.load(str(built.onnx_path)), held_out))
    print(
        "SQNR dB on the block with a x50 LayerNorm outlier channel: "
        + ", ".join(f"{k} {v:.1f}" for k, v in quality.items())
    )
    # the outlier channel costs the per-tensor static scale; per-batch dynamic scales and smoothing recover it
    assert quality["minmax"] > 10.0 and quality["smoothquant"] > quality["minmax"] + 6.0


def test_per_channel_and_symmetric_options_reach_the_graph(tmp_path: Path) -> None:
    rng = np.random.default_rng(13)
    model, calibration = ffn_block(rng), _batches(rng, 2)

    def initializers(settings: LinearQuantSettings) -> dict[str, np.ndarray]:
        quantized, _ = linear_int8(_copy(model), calibration, settings, (), tmp_path)
        return {t.name: numpy_helper.to_array(t) for t in quantized.graph.initializer}

    per_channel = initializers(LinearQuantSettings(per_channel=True))
    per_tensor = initializers(LinearQuantSettings(per_channel=False))
    assert per_channel["w1_scale"].shape == (64,) and per_tensor["w1_scale"].shape == ()
    asymmetric = initializers(LinearQuantSettings(activation_type="uint8", symmetric_activations=False))
    symmetric_u8 = initializers(LinearQuantSettings(activation_type="uint8", symmetric_activations=True))
    symmetric_s8 = initializers(LinearQuantSettings(activation_type="int8", symmetric_activations=True))
    assert int(symmetric_u8["h_zero_point"]) == 128 and int(symmetric_s8["h_zero_point"]) == 0
    assert symmetric_s8["h_zero_point"].dtype == np.int8 and asymmetric["h_zero_point"].dtype == np.uint8
    # the LayerNorm output is not centred on zero here: the asymmetric zero point is not the midpoint
    assert int(asymmetric["h_zero_point"]) != 128


def test_alpha_auto_tries_only_the_given_alphas(tmp_path: Path) -> None:
    rng = np.random.default_rng(14)
    model, calibration = attention_block(rng), _batches(rng, 3)
    settings = SmoothQuantSettings("auto", quantization=STATIC, alphas=(0.75,))
    _, params = smoothquant_int8(_copy(model), calibration, settings, tmp_path)
    assert set(params["alphas_chosen"]) <= {"0.75", "none"} and sum(params["alphas_chosen"].values()) == 2


def test_smoothquant_options_are_checked_when_the_recipe_loads() -> None:
    from pydantic import ValidationError

    spec = VariantSpec(
        name="sq", precision="int8", calibrator="minmax", smoothquant={"alpha": "auto", "alphas": [0.9, 0.5]}
    )
    assert spec.technique_config.smoothquant.alphas == [0.5, 0.9]
    for options, message in [
        ({"alphas": [0.5]}, "alphas: applies only with alpha: auto"),
        ({"alpha": "auto", "alphas": [1.5]}, "expected a non-empty list of numbers from 0 to 1"),
        ({"fold": False, "unfoldable": "skip"}, "unfoldable: 'skip' applies only with fold: true"),
    ]:
        with pytest.raises(ValidationError, match=message):
            VariantSpec(name="sq", precision="int8", calibrator="minmax", smoothquant=options)
    with pytest.raises(ValidationError, match="activation_type: does not apply to dynamic int8 variants"):
        VariantSpec(name="l", precision="int8", technique="linear", calibrator="dynamic", activation_type="int8")
    with pytest.raises(ValidationError, match="calibrator: got 'entropy', expected one of dynamic, minmax with linear"):
        VariantSpec(name="l", precision="int8", technique="linear", calibrator="entropy")


@pytest.mark.parametrize("options", [{"technique": "linear", "calibrator": "minmax"},
                                     {"technique": "linear", "calibrator": "dynamic"},
                                     {"calibrator": "minmax", "smoothquant": {"alpha": 0.5}}])  # fmt: skip
def test_weights_behind_constant_ops_are_linear_weights(options, exporter_weights, tmp_path: Path) -> None:
    """A Linear was recognised only when its weight was an initializer: a Transposed, Constant or Cast weight left
    every MatMul of this MLP float (0 Linears quantized, counted as attention MatMuls). Folded first, the variant is
    the one built from the model with those weights stored."""
    exported, folded, calibration = exporter_weights
    spec = VariantSpec(name="int8", precision="int8", **options)
    built = {path.stem: build_variant(spec, BuildContext(reference_path=path, workdir=tmp_path / path.stem,
                                                         calibration=calibration)) for path in (exported, folded)}  # fmt: skip
    feeds = {"x": np.concatenate([batch["x"] for batch in calibration])}
    want = run_variant(built["folded"], feeds)
    np.testing.assert_allclose(run_variant(built["exported"], feeds), want, rtol=0,
                               atol=1e-6 * float(np.abs(want).max()))  # fmt: skip
    params = built["exported"].params
    assert params["folded_weights"] == ["w1", "w2", "w3"] and params["quantized_linears"] == 3
    assert params["float_matmuls"] == 0 and params["float_constant_weight_matmuls"] == []


def test_a_torch_linear_weight_used_transposed_is_quantized(tmp_path: Path) -> None:
    """`x @ W.t()` exported without constant folding reads its weight through a Transpose: it was left float."""
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            generator = torch.Generator().manual_seed(0)
            self.w1 = torch.nn.Parameter(torch.randn(16, 8, generator=generator))
            self.w2 = torch.nn.Parameter(torch.randn(4, 16, generator=generator))

        def forward(self, x):
            return torch.relu(x @ self.w1.t()) @ self.w2.t()

    rng = np.random.default_rng(0)
    calibration = [{"x": rng.normal(size=(16, 8)).astype(np.float32)} for _ in range(3)]
    built = {}
    for folding in (False, True):
        path = tmp_path / f"folding-{folding}.onnx"
        torch.onnx.export(Block().eval(), (torch.zeros(2, 8),), str(path), input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}}, do_constant_folding=folding, dynamo=False)  # fmt: skip
        spec = VariantSpec(name="int8", precision="int8", technique="linear", calibrator="minmax")
        context = BuildContext(reference_path=path, workdir=tmp_path / str(folding), calibration=calibration)
        built[folding] = build_variant(spec, context)
    assert "Transpose" in {n.op_type for n in onnx.load(str(tmp_path / "folding-False.onnx")).graph.node}
    assert built[False].params["quantized_linears"] == built[True].params["quantized_linears"] == 2
    assert len(built[False].params["folded_weights"]) == 2
    want = run_variant(built[True], calibration[0])
    np.testing.assert_allclose(run_variant(built[False], calibration[0]), want, rtol=0,
                               atol=1e-6 * float(np.abs(want).max()))  # fmt: skip


def test_a_matmul_left_float_with_a_constant_weight_is_named(tmp_path: Path) -> None:
    """Only a MatMul whose operands are both activations (attention) is counted as one; a constant weight no Linear
    has (3-D, or on the left) is named in a note, not counted with attention MatMuls."""
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="linear"),
        helper.make_node("Transpose", ["h"], ["h_t"], perm=[0, 2, 1], name="t"),
        helper.make_node("MatMul", ["h", "h_t"], ["s"], name="scores"),
        helper.make_node("MatMul", ["s", "batched"], ["b"], name="batched_matmul"),
        helper.make_node("MatMul", ["left", "b"], ["y"], name="left_weight"),  # W·x: a weight on the left
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3, 4])],
        [numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.normal(size=(2, 3, 4)).astype(np.float32), "batched"),
         numpy_helper.from_array(rng.normal(size=(3, 3)).astype(np.float32), "left")],
    )  # fmt: skip
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    calibration = [{"x": rng.normal(size=(2, 3, 4)).astype(np.float32)}]
    spec = VariantSpec(name="int8", precision="int8", technique="linear", calibrator="minmax")
    built = build_variant(spec, BuildContext(reference_path=path, workdir=tmp_path, calibration=calibration))
    assert built.params["quantized_linears"] == 1 and built.params["float_matmuls"] == 1
    assert built.params["float_constant_weight_matmuls"] == ["batched_matmul", "left_weight"]
    assert any("batched_matmul, left_weight" in note and "no activation" in note for note in built.notes)


def test_smoothing_folds_into_a_norm_whose_scale_the_exporter_shares_through_identity(tmp_path: Path) -> None:
    """The TorchScript exporter stores equal initializers once and reads the copies through Identity nodes (a fresh
    LayerNorm's ones and zeros, tied parameters): two LayerNorms read one gamma and beta so. Their scale and bias are
    constants all the same, and the smoothing folds into both instead of inserting two Muls."""
    rng = np.random.default_rng(0)
    weights = {"gamma": np.ones(WIDTH), "beta": np.zeros(WIDTH), "w1": rng.normal(0, WIDTH**-0.5, (WIDTH, WIDTH)),
               "w2": rng.normal(0, WIDTH**-0.5, (WIDTH, WIDTH))}  # fmt: skip
    nodes = [helper.make_node("Identity", [name], [f"{name}_{i}"]) for i in (1, 2) for name in ("gamma", "beta")]
    nodes += [helper.make_node("LayerNormalization", ["x", "gamma_1", "beta_1"], ["h1"], axis=-1),
              helper.make_node("MatMul", ["h1", "w1"], ["a"]),
              helper.make_node("LayerNormalization", ["a", "gamma_2", "beta_2"], ["h2"], axis=-1),
              helper.make_node("MatMul", ["h2", "w2"], ["y"])]  # fmt: skip
    model = _model(nodes, weights)
    path = tmp_path / "shared.onnx"
    onnx.save(model, str(path))
    calibration = _batches(rng, 3)
    spec = VariantSpec(name="sq", precision="int8", calibrator="minmax", smoothquant={"alpha": 0.5})
    built = build_variant(spec, BuildContext(reference_path=path, workdir=tmp_path / "sq", calibration=calibration))
    assert built.params["folded_into"] == {"LayerNormalization": 2} and built.params["inserted_muls"] == 0
    assert built.params["quantized_linears"] == 2
    held_out = _batches(rng, 1)[0]
    assert sqnr_db(_reference(model, held_out), _simulated(onnx.load(str(built.onnx_path)), held_out)) > 25.0


def test_a_float64_matmul_left_float_is_not_said_to_be_left_in_fp32(tmp_path: Path) -> None:
    """A layer computing in float64 between Casts (its weight a double matrix) is left float, as a 3-D weight is; the
    note said 'left in FP32' and named no float64 weight among the reasons."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="linear"),
             helper.make_node("Cast", ["h"], ["h64"], to=onnx.TensorProto.DOUBLE, name="widen"),
             helper.make_node("MatMul", ["h64", "w64"], ["y64"], name="double_linear"),
             helper.make_node("Cast", ["y64"], ["y"], to=onnx.TensorProto.FLOAT, name="narrow")]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 2])],
                              [numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float32), "w"),
                               numpy_helper.from_array(rng.normal(size=(4, 2)), "w64")])  # fmt: skip
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    calibration = [{"x": rng.normal(size=(8, 4)).astype(np.float32)}]
    spec = VariantSpec(name="int8", precision="int8", technique="linear", calibrator="minmax")
    built = build_variant(spec, BuildContext(reference_path=path, workdir=tmp_path, calibration=calibration))
    assert built.params["quantized_linears"] == 1 and built.params["float_constant_weight_matmuls"] == ["double_linear"]
    [note] = [note for note in built.notes if "double_linear" in note]
    assert "left in float though" in note and "a float64, 3-D or left-hand weight" in note and "FP32" not in note
