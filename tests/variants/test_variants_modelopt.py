"""ModelOpt as the INT8/FP8 quantizer: accuracy vs FP32 on a trained CNN, the TRT and standard exports, options."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from qbench.errors import MissingExtraError, QbenchError
from qbench.recipe.spec import VariantSpec
from qbench.variants import build_variant
from qbench.variants.base import BuildContext, BuiltVariant, lowered_nothing
from qbench.variants.onnx_utils import custom_domains
from tests.variants.conftest import ort_integer_kernels

torch = pytest.importorskip("torch")

from qbench.sources.torch_model import TorchModel
from qbench.variants.modelopt_quant import (
    FP8_NOTE,
    INT8_NOTE,
    build_modelopt,
    clipping_notes,
    fp8_quantize,
    import_modelopt,
    modelopt_settings,
    standard_fp8_model,
)

# Top-1 agreement with FP32 on held-out digits that every ModelOpt variant must reach. The trials
# measured >= 0.984 per slice for ModelOpt FP8 on a similar CNN; 0.95 leaves room for this
# smaller training run while still failing on a broken scale (which drops to ~0.1).
MIN_AGREEMENT = 0.95


@dataclass(frozen=True)
class TrainedCnn:
    torch_model: TorchModel
    reference: Path  # FP32 ONNX export
    calibration: list[dict[str, np.ndarray]]
    held_out: np.ndarray

    def context(self, workdir: Path, torch_model: TorchModel | None | str = "default") -> BuildContext:
        return BuildContext(
            reference_path=self.reference,
            workdir=workdir,
            calibration=self.calibration,
            torch_model=self.torch_model if torch_model == "default" else torch_model,
        )


@pytest.fixture(scope="module")
def cnn(digits_net, tmp_path_factory: pytest.TempPathFactory) -> TrainedCnn:
    """The shared digits CNN (modules 0, 2, 5 Conv; 4 MaxPool; 8 Linear) as a TorchModel."""
    pytest.importorskip("modelopt.torch.quantization")
    torch.set_num_threads(1)
    net, images, labels = digits_net.net, digits_net.images, digits_net.labels
    train, held_out = digits_net.train, digits_net.held_out
    torch_model = TorchModel(
        factory="tests:digits_cnn", input_shapes={"image": (1, 1, 8, 8)}, input_dtypes={"image": "float32"},
        output_names=("logits",), opset=17, cache_key="test", _template=net,
    )  # fmt: skip
    reference = torch_model.export(torch_model.build(), tmp_path_factory.mktemp("cnn") / "fp32.onnx")
    calibration = [{"image": images[train[i : i + 32]]} for i in range(0, 128, 32)]
    accuracy = float(np.mean(_top1(reference, images[held_out]) == labels[held_out]))
    assert accuracy > 0.9, f"the FP32 fixture is not trained ({accuracy:.3f})"
    return TrainedCnn(torch_model, reference, calibration, images[held_out])


def _top1(path: Path, images: np.ndarray, hints: dict | None = None) -> np.ndarray:
    options = ort.SessionOptions()
    if (hints or {}).get("graph_optimization_level") == "basic":
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"image": images})[0].argmax(axis=1)


def _agreement(cnn: TrainedCnn, built: BuiltVariant) -> float:
    reference = _top1(cnn.reference, cnn.held_out)
    agreement = float(np.mean(_top1(built.onnx_path, cnn.held_out, built.session_hints) == reference))
    print(f"{built.name}: top-1 agreement with FP32 {agreement:.4f} on {len(reference)} held-out rows")
    return agreement


def _spec(precision: str, calibrator: str = "minmax", **options) -> VariantSpec:
    return VariantSpec(name=f"{precision}-mo", precision=precision, calibrator=calibrator, quantizer="modelopt",
                       **options)  # fmt: skip


# -- INT8 -------------------------------------------------------------------------------------------


def test_modelopt_int8_is_standard_qdq_and_agrees_with_fp32(cnn, tmp_path):
    built = build_variant(_spec("int8"), cnn.context(tmp_path))  # through the TECHNIQUES registry
    assert _agreement(cnn, built) >= MIN_AGREEMENT
    model = onnx.load(str(built.onnx_path))
    assert custom_domains(model) == set()
    assert built.params["tensorrt_onnx"] == str(built.onnx_path), "standard INT8 Q/DQ serves TensorRT too"
    # Q/DQ on each layer's inputs only, on symmetric ranges: ONNX Runtime's CPU provider runs every layer in float
    assert built.params["quantized_nodes"] == ort_integer_kernels(built.onnx_path, tmp_path) == 0
    assert lowered_nothing(built.params) and set(built.params["rounded_only"]) >= {"Conv", "Gemm"}
    assert built.params["quantized_modules"] == 5  # the convs, the linear layer and the max-pool's input
    assert (built.params["quantizer"], built.params["modelopt_config"]) == ("modelopt", "INT8_DEFAULT_CFG")
    assert built.params["calibration_algorithm"] == "max"
    assert built.params["calibration_rows"] == 128
    assert built.params["per_channel"] is True and built.params["per_channel_source"] == "INT8_DEFAULT_CFG"
    assert built.params["modelopt_version"].count(".") >= 1
    assert built.notes[0] == INT8_NOTE and built.session_hints == {}
    assert built.notes[1].startswith("no node computes in INT8") and built.notes[1].endswith("computes in FP32")
    zero_points = {
        numpy_helper.to_array(n.attribute[0].t).dtype.name
        for n in model.graph.node
        if n.op_type == "Constant" and "quantizer" in n.name
    }
    assert "uint8" not in zero_points, "ModelOpt's activations are signed"


def test_modelopt_int8_torch_form_matches_the_onnx_export(cnn, tmp_path):
    built = build_modelopt(_spec("int8", per_channel=False), cnn.context(tmp_path))
    assert built.params["per_channel"] is False and built.params["per_channel_source"] == "recipe"
    weight_dq = [
        n for n in onnx.load(str(built.onnx_path)).graph.node
        if n.op_type == "DequantizeLinear" and "weight_quantizer" in n.name
    ]  # fmt: skip
    assert len(weight_dq) == 4 and all(not any(a.name == "axis" for a in n.attribute) for n in weight_dq)
    module = built.torch_module()
    assert module is not built.torch_module(), "each call is a fresh copy"
    with torch.no_grad():
        torch_logits = module(torch.from_numpy(cnn.held_out)).numpy()
    session = ort.InferenceSession(str(built.onnx_path), providers=["CPUExecutionProvider"])
    onnx_logits = session.run(None, {"image": cnn.held_out})[0]
    assert np.mean(torch_logits.argmax(1) == onnx_logits.argmax(1)) >= 0.99
    assert np.max(np.abs(torch_logits - onnx_logits)) < 0.5


def test_modelopt_int8_percentile_clips_activation_ranges(cnn, tmp_path):
    built = build_modelopt(_spec("int8", "percentile", percentile=99.9), cnn.context(tmp_path))
    assert built.params["calibration_algorithm"] == "histogram (percentile 99.9) on activations, max on weights"
    assert (built.params["num_bins"], built.params["percentile"]) == (2048, 99.9)
    assert _agreement(cnn, built) >= MIN_AGREEMENT
    minmax = build_modelopt(_spec("int8"), cnn.context(tmp_path / "minmax"))
    scales, minmax_scales = _activation_scales(built.onnx_path), _activation_scales(minmax.onnx_path)
    assert scales.keys() == minmax_scales.keys() and len(scales) == 5
    assert all(scales[name] <= minmax_scales[name] * (1 + 1e-6) for name in scales), "a percentile clips, never widens"
    assert any(scales[name] < minmax_scales[name] * 0.99 for name in scales)
    kept = built.params["histogram_range_kept"]
    assert set(kept) == {f"{m}.input_quantizer" for m in ("0", "2", "4", "5", "8")}
    assert all(0 < fraction <= 1 for fraction in kept.values())


def test_modelopt_int8_entropy_searches_from_bin_128(cnn, tmp_path):
    """ModelOpt's entropy search tries amax from bin 128 up: with 256 bins it keeps at least half the range.

    (At the default 2048 bins its pure-Python search took ~10 s per activation here, and on the
    17-level pixel input it settled at 1/16 of the range: see the note test below.)
    """
    built = build_modelopt(_spec("int8", "entropy", num_bins=256), cnn.context(tmp_path))
    assert built.params["calibration_algorithm"] == "histogram (entropy) on activations, max on weights"
    assert built.params["num_bins"] == 256 and "percentile" not in built.params
    kept = built.params["histogram_range_kept"]
    print(f"entropy (256 bins): range kept per activation {kept}; agreement {_agreement(cnn, built):.4f}")
    assert len(kept) == 5 and all(0.5 - 1e-3 <= fraction <= 1 for fraction in kept.values())


def test_modelopt_notes_name_the_clipped_activations():
    settings = modelopt_settings(_spec("int8", "entropy").technique_config)
    (note,) = clipping_notes(settings,
                             {"0.input_quantizer": 0.0625, "2.input_quantizer": 0.9, "8.input_quantizer": 0.2})
    assert note.startswith("entropy calibration kept only part of the observed range of: 0.input_quantizer (6%), ")
    assert "8.input_quantizer (20%)" in note and "2.input_quantizer" not in note
    assert clipping_notes(settings, {"0.input_quantizer": 0.3}) == []


def _activation_scales(path: Path) -> dict[str, float]:
    """input_quantizer name -> its scale, read from the Constant feeding each activation QuantizeLinear."""
    model = onnx.load(str(path))
    constants = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node
                 if n.op_type == "Constant"}
    return {
        n.name: float(constants[n.input[1]])
        for n in model.graph.node
        if n.op_type == "QuantizeLinear" and "input_quantizer" in n.name
    }


def test_modelopt_int8_smoothquant_is_a_recipe_option(cnn, tmp_path):
    built = build_variant(_spec("int8", smoothquant={"alpha": 0.6}), cnn.context(tmp_path))
    assert built.params["modelopt_config"] == "INT8_SMOOTHQUANT_CFG"
    assert built.params["calibration_algorithm"] == "smoothquant (alpha 0.6)"
    assert _agreement(cnn, built) >= MIN_AGREEMENT


# -- FP8 --------------------------------------------------------------------------------------------


def test_modelopt_fp8_keeps_the_trt_file_and_writes_standard_qdq(cnn, tmp_path):
    built = build_modelopt(_spec("fp8"), cnn.context(tmp_path))
    trt_path = Path(built.params["tensorrt_onnx"])
    assert trt_path == tmp_path / "fp8-mo.trt.onnx" and built.onnx_path == tmp_path / "fp8-mo.onnx"
    trt_ops = {(n.domain, n.op_type) for n in onnx.load(str(trt_path)).graph.node if n.domain}
    assert trt_ops == {("trt", "TRT_FP8QuantizeLinear"), ("trt", "TRT_FP8DequantizeLinear")}

    model = onnx.load(str(built.onnx_path))
    onnx.checker.check_model(model, full_check=True)
    assert custom_domains(model) == set()
    assert {o.domain for o in model.opset_import} <= {"", "ai.onnx"}
    assert built.params["opset"] == 19
    float8 = [t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT8E4M3FN and t.dims]
    assert len(float8) == 4, "the three conv kernels and the linear weight are stored as FP8"
    float_weights = [t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT and len(t.dims) >= 2]
    assert float_weights == []
    assert built.params["quantized_op_types"] == {"Conv": 3, "Gemm": 1}
    assert built.session_hints["graph_optimization_level"] == "basic"
    assert FP8_NOTE in built.notes and built.notes[0].startswith("FP8 simulated with Q/DQ on CPU")
    assert _agreement(cnn, built) >= MIN_AGREEMENT


def test_modelopt_fp8_percentile(cnn, tmp_path):
    built = build_modelopt(_spec("fp8", "percentile"), cnn.context(tmp_path))
    assert built.params["calibration_algorithm"] == "histogram (percentile 99.999) on activations, max on weights"
    assert _agreement(cnn, built) >= MIN_AGREEMENT


def test_fp8_weight_folding_matches_onnx_runtime_quantize_linear():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(scale=3, size=500), [1000.0, -1000.0, 0.0, 448.0, 13.0, 0.0625 * 1.5]])
    values = values.astype(np.float32)
    scale = np.array(0.0123, dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
        "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [len(values)])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [len(values)])],
        initializer=[numpy_helper.from_array(scale, "s"), helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": values})[0]
    folded = fp8_quantize(values, scale).astype(np.float32) * scale
    np.testing.assert_array_equal(folded, expected)


def test_standard_fp8_model_rejects_other_trt_nodes():
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["x", "s"], ["y"], domain="trt", block_size=16)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=[numpy_helper.from_array(np.array(1.0, dtype=np.float32), "s")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid("trt", 1)])
    with pytest.raises(QbenchError, match="custom nodes qbench cannot rewrite"):
        standard_fp8_model(model)


# -- exclusions and options ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["/0/Conv", "0"])
def test_modelopt_exclusion_by_export_node_or_module_name(cnn, tmp_path, name):
    built = build_variant(_spec("int8", exclude_nodes=[name]), cnn.context(tmp_path))
    assert built.params["excluded_modules"] == ["0"] and built.params["exclude_nodes"] == [name]
    assert built.params["quantized_modules"] == 4
    model = onnx.load(str(built.onnx_path))
    first_conv = next(n for n in model.graph.node if n.op_type == "Conv")
    assert list(first_conv.input[:2]) == ["image", "0.weight"], "the excluded conv reads FP32 input and weight"


def test_modelopt_exclusion_errors(cnn, tmp_path):
    with pytest.raises(QbenchError,
                       match=r"exclude_nodes: '/9/Conv' is neither a module .*; modules with weights: 0, 2, 5, 8$"):
        build_modelopt(_spec("int8", exclude_nodes=["/9/Conv"]), cnn.context(tmp_path))
    with pytest.raises(QbenchError, match=r"'/1/Relu' \(module '1'\) holds no layer ModelOpt quantizes"):
        build_modelopt(_spec("int8", exclude_nodes=["/1/Relu"]), cnn.context(tmp_path))


def test_modelopt_without_a_torch_model_is_a_clear_error(cnn, tmp_path):
    with pytest.raises(QbenchError,
                       match=r"variant 'int8-mo': quantizer modelopt needs the PyTorch model \(model.torch"):
        build_modelopt(_spec("int8"), cnn.context(tmp_path, torch_model=None))
    assert not (tmp_path / "int8-mo.onnx").exists()


@pytest.mark.parametrize(
    ("precision", "calibrator", "options", "message"),
    [
        ("fp8", "entropy", {}, r"entropy calibrator works on integer formats only; for fp8 it supports minmax"),
        ("fp8", "minmax", {"per_channel": True},
         r"per_channel: ModelOpt exports FP8 to ONNX with per-tensor scales only"),
        ("int8", "minmax", {"op_types": ["Conv"]}, r"op_types: does not apply to quantizer modelopt"),
        ("int8", "minmax", {"reduce_range": True}, r"reduce_range: does not apply to quantizer modelopt"),
        ("int8", "entropy", {"num_quantized_bins": 256}, r"num_quantized_bins: does not apply"),
        ("int8", "auto", {}, r"calibrator: quantizer modelopt supports entropy, minmax, percentile, not 'auto'"),
        ("int8", "minmax", {"keep_float": ["Softmax"]}, r"keep_float: does not apply to quantizer modelopt"),
    ],
)  # fmt: skip
def test_modelopt_rejects_what_it_cannot_honour_when_the_recipe_loads(precision, calibrator, options, message):
    with pytest.raises(ValidationError, match=message):
        _spec(precision, calibrator, **options)


def test_modelopt_smoothquant_is_int8_minmax_with_one_alpha():
    for calibrator, options, message in [
        ("percentile", {}, "ModelOpt's SmoothQuant applies to int8 with calibrator minmax"),
        ("minmax", {"alpha": "auto"}, "smoothquant.alpha: ModelOpt's SmoothQuant takes one alpha"),
        ("minmax", {"fold": False}, r"smoothquant.fold: does not apply to quantizer modelopt \(it takes alpha only\)"),
    ]:
        with pytest.raises(ValidationError, match=message):
            _spec("int8", calibrator, smoothquant=options)
    settings = modelopt_settings(_spec("int8", smoothquant={"alpha": 0.8}).technique_config)
    assert (settings.preset, settings.smoothquant_alpha) == ("INT8_SMOOTHQUANT_CFG", 0.8)
    assert modelopt_settings(_spec("int8").technique_config).smoothquant_alpha is None


def test_missing_modelopt_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "modelopt.torch.quantization", None)  # makes the import fail
    with pytest.raises(MissingExtraError, match=r"nvidia-modelopt is not installed: .*qbench\[modelopt\]"):
        import_modelopt()


def test_modelopt_notes_and_graph_params_are_shown_on_the_form_they_describe(cnn, tmp_path):
    from qbench.variants.base import ONNX, TORCH

    built = build_variant(_spec("int8"), cnn.context(tmp_path))  # settled as every build is: integer kernels counted
    on_torch, on_onnx = built.as_run_in(TORCH), built.as_run_in(ONNX)
    assert INT8_NOTE in on_onnx.notes and INT8_NOTE not in on_torch.notes  # how ONNX Runtime runs the Q/DQ file
    for key in ("quantized_nodes", "rounded_only", "format", "tensorrt_onnx"):  # counted on, or naming, the ONNX file
        assert key in on_onnx.params and key not in on_torch.params
    for key in ("quantizer", "calibration_algorithm", "quantized_modules"):  # the calibration both forms share
        assert key in on_onnx.params and key in on_torch.params


# -- NaN/inf on calibration rows (data.nonfinite_inputs: keep) ---------------------------------------


class _ReadsNanAsMissing(torch.nn.Module):
    """fc1 passes NaN through; a row whose fc1 output holds NaN takes the missing branch: head(0) + 5."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)

    def forward(self, x):
        hidden = self.fc1(x)
        missing = torch.isnan(hidden).any(dim=1, keepdim=True)
        return self.head(torch.where(missing, torch.zeros_like(hidden), hidden)) + missing.float() * 5.0


@pytest.mark.parametrize("precision, calibrator, options", [
    ("int8", "minmax", {}), ("int8", "entropy", {}), ("int8", "minmax", {"smoothquant": {"alpha": 0.5}}),
    ("fp8", "minmax", {}),
])  # fmt: skip
@pytest.mark.parametrize("with_nan", [True, False])
def test_modelopt_keeps_layers_reading_nan_float(tmp_path, precision, calibrator, options, with_nan):
    pytest.importorskip("modelopt.torch.quantization")
    net = _ReadsNanAsMissing().eval()
    torch_model = TorchModel(
        factory="tests:nan", input_shapes={"x": (1, 4)}, input_dtypes={"x": "float32"},
        output_names=("y",), opset=17, cache_key="nan", _template=net,
    )  # fmt: skip
    reference = torch_model.export(torch_model.build(), tmp_path / "fp32.onnx")
    rows = np.random.default_rng(0).normal(size=(96, 4)).astype(np.float32)
    if with_nan:
        rows[:64:4, 0] = np.nan  # a quarter of the calibration rows miss a value
    rows[64::2, 1] = np.nan  # half of the evaluated ones
    context = BuildContext(reference_path=reference, workdir=tmp_path, torch_model=torch_model,
                           calibration=[{"x": rows[i : i + 16]} for i in range(0, 64, 16)])  # fmt: skip
    built = build_variant(_spec(precision, calibrator, **options), context)
    if not with_nan:  # the scan does not run: both layers quantized
        assert "nonfinite_inputs_kept_fp32" not in built.params and built.params["quantized_modules"] == 2
        return
    assert built.params["nonfinite_inputs_kept_fp32"] == {"fc1": ["fc1.input_quantizer"]}
    assert built.params["quantized_modules"] == 1  # head still quantized
    assert any(note.startswith("1 node(s) kept FP32") and "fc1" in note for note in built.notes)
    options = ort.SessionOptions()
    if built.session_hints.get("graph_optimization_level") == "basic":
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(str(built.onnx_path), options, providers=["CPUExecutionProvider"])
    evaluated = rows[64:]
    outputs = session.run(None, {"x": evaluated})[0]
    missing = np.isnan(evaluated).any(axis=1)
    # by hand: a row missing a value gives head's bias + 5 (head(0): its quantized weights times 0)
    expected = net.head.bias.detach().numpy() + 5.0
    np.testing.assert_allclose(outputs[missing], np.broadcast_to(expected, outputs[missing].shape), atol=1e-5)
    assert np.isfinite(outputs).all()
