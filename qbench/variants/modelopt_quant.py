"""NVIDIA ModelOpt as the quantizer of INT8 / FP8 variants (`quantizer: modelopt`).

ModelOpt quantizes the recipe's PyTorch module, not the ONNX graph: `mtq.quantize` inserts fake quantizers from a preset
(INT8_DEFAULT_CFG, FP8_DEFAULT_CFG; INT8_SMOOTHQUANT_CFG with the alpha of the variant's `smoothquant:` block),
calibrates them on the calibration batches, and the TorchScript exporter writes ONNX.

Calibrators: `minmax` is ModelOpt's "max" algorithm; `entropy` / `percentile` use its histogram calibrator on
activations (per tensor only, so weights keep max). Its entropy search needs an integer format: FP8 takes minmax or
percentile.

Exclusions: `exclude_nodes` names a torch module ("encoder.layer.3.output.dense") or a node of the FP32 export
("/encoder/layer.3/output/dense/MatMul": the TorchScript exporter names nodes after the module path). That module's
quantizers and those inside it are disabled ({"quantizer_name": "<module>.*", "enable": False}).

NaN/inf: under `data.nonfinite_inputs: keep`, a quantizer fed NaN or ±inf on calibration rows would get no finite amax
(ModelOpt's max calibrator stops on an assertion, its histogram one in torch.histc) and, were it calibrated, its Q/DQ
would write NaN as a number, so a model reading NaN as missing afterwards would take the present-value branch. The
module owning such a quantizer is kept float, as the ONNX builds keep the nodes reading such a tensor
(`qbench.variants.nonfinite_scan`), named in the notes and `nonfinite_inputs_kept_fp32`.

Export: INT8 is standard QuantizeLinear/DequantizeLinear, read by ONNX Runtime and TensorRT alike (`<name>.onnx`). FP8
uses TensorRT's `trt::TRT_FP8QuantizeLinear` / `TRT_FP8DequantizeLinear`: that file is kept as `<name>.trt.onnx` for
TensorRT, and `<name>.onnx` is rewritten to standard float8e4m3fn Q/DQ (weights stored as float8) for ONNX Runtime's CPU
simulation. FP8 is exported at opset 19 directly (bumping an opset-17 graph by hand broke ReduceL2: trials pitfall 7).
"""

from __future__ import annotations

import copy
import importlib.metadata
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from qbench.errors import MissingExtraError, QbenchError, did_you_mean
from qbench.recipe.spec import VariantSpec
from qbench.recipe.variants import TRT_TAG
from qbench.sources.torch_model import single_torch_thread
from qbench.techniques.calibrators import CALIBRATORS
from qbench.techniques.modelopt import Modelopt
from qbench.variants.base import ONNX, BuildContext, BuiltVariant, Feeds, technique_of
from qbench.variants.calibrate import calibration_rows, require_calibration
from qbench.variants.nonfinite_scan import holds_nonfinite, kept_float_note
from qbench.variants.onnx_utils import (
    Stopwatch,
    build_step,
    custom_domains,
    default_opset,
    drop_unused_initializers,
    load_model,
    names_read,
    output_path,
    quantized_op_counts,
    quiet_stdout,
    save_model,
)

PRESETS = {"int8": "INT8_DEFAULT_CFG", "fp8": "FP8_DEFAULT_CFG"}
SMOOTHQUANT_PRESET = "INT8_SMOOTHQUANT_CFG"
FP8_OPSET = 19  # first opset whose QuantizeLinear/DequantizeLinear take float8
FP8_MAX = 448.0  # largest finite float8e4m3fn value
TRT_DOMAIN = "trt"
_TRT_FP8_OPS = {"TRT_FP8QuantizeLinear": "QuantizeLinear", "TRT_FP8DequantizeLinear": "DequantizeLinear"}
_FP8_ZERO_POINT = "qbench_fp8_zero_point"
QUANTIZED_OP_TYPES = ("Conv", "ConvTranspose", "Gemm", "MatMul")
CLIPPING_WARN_BELOW = 0.25  # a histogram amax under this fraction of the largest value seen gets a note
FP8_NOTE = (
    "FP8 simulated with Q/DQ on CPU: accuracy is representative, latency is not "
    "(TensorRT runs the .trt.onnx file with FP8 kernels)"
)
INT8_NOTE = (
    "ModelOpt's INT8 Q/DQ (on layer inputs and weights) is built for TensorRT: ONNX Runtime CPU runs in INT8 only the "
    "layers whose pattern it fuses (transformer MatMuls; quantized_op_types counts them), the rest in float"
)


@dataclass(frozen=True)
class ModeloptSettings:
    """What shapes the ModelOpt quantization of one variant, defaults resolved."""

    precision: str
    preset: str  # the ModelOpt config constant, e.g. INT8_DEFAULT_CFG
    calibrator: str  # minmax | entropy | percentile (recipe names)
    percentile: float | None  # percentile calibrator only
    num_bins: int | None  # histogram calibrators only
    per_channel: bool | None  # None: the preset's choice
    smoothquant_alpha: float | None = None  # INT8_SMOOTHQUANT_CFG's migration strength

    @property
    def histogram_method(self) -> str | None:
        """ModelOpt's histogram method for the activation quantizers, None for max calibration."""
        method = CALIBRATORS.get(self.calibrator).modelopt
        return None if method == "max" else method

    @property
    def algorithm(self) -> str:
        """ModelOpt's calibration algorithm as recorded in params."""
        if self.histogram_method is None:
            return f"smoothquant (alpha {self.smoothquant_alpha:g})" if self.smoothquant_alpha is not None else "max"
        detail = f" {self.percentile:g}" if self.histogram_method == "percentile" else ""
        return f"histogram ({self.histogram_method}{detail}) on activations, max on weights"

    def quant_config(self, mtq: Any, excluded_modules: Sequence[str]) -> dict[str, Any]:
        """A deep copy of the preset with the calibrator, the weight axis and the exclusions applied.

        Histogram calibration runs outside `mtq.quantize` (see `_calibrate_histograms`), so
        the config then asks for no algorithm.
        """
        from modelopt.torch.quantization.calib import HistogramCalibrator

        config = copy.deepcopy(getattr(mtq, self.preset))
        for entry in config["quant_cfg"]:
            attributes = entry.get("cfg")
            if entry["quantizer_name"] == "*input_quantizer" and self.histogram_method is not None:
                # ModelOpt's constructor form: (class, (num_bits, axis, unsigned), kwargs)
                calibrator_args = (attributes.get("num_bits", 8), None, False)
                attributes["calibrator"] = (HistogramCalibrator, calibrator_args, {"num_bins": self.num_bins})
            if entry["quantizer_name"] == "*weight_quantizer" and self.per_channel is not None:
                attributes["axis"] = 0 if self.per_channel else None
        # "" is the root module (a bare nn.Linear): every quantizer is its own
        config["quant_cfg"] += [{"quantizer_name": f"{name}.*" if name else "*", "enable": False}
                                for name in excluded_modules]
        if self.histogram_method is not None:
            config["algorithm"] = None
        elif self.smoothquant_alpha is not None:
            config["algorithm"] = {"method": "smoothquant", "alpha": self.smoothquant_alpha}
        return config

    def params(self, mtq: Any) -> dict[str, Any]:
        """What params records: the per_channel setting is the preset's (ModelOpt's INT8 weights are per channel)
        unless the recipe sets it."""
        preset = getattr(mtq, self.preset)["quant_cfg"]
        weights = next(e["cfg"] for e in preset if e["quantizer_name"] == "*weight_quantizer")
        per_channel = self.per_channel if self.per_channel is not None else weights.get("axis") is not None
        params: dict[str, Any] = {
            "quantizer": "modelopt",
            "modelopt_config": self.preset,
            "calibrator": self.calibrator,
            "calibration_algorithm": self.algorithm,
            "per_channel": per_channel,
            "per_channel_source": "recipe" if self.per_channel is not None else self.preset,
        }
        if self.histogram_method is not None:
            params["num_bins"] = self.num_bins
        if self.histogram_method == "percentile":
            params["percentile"] = self.percentile
        return params


def modelopt_settings(config: Modelopt) -> ModeloptSettings:
    """ModelOpt's settings for a technique config (its checks already ran when the recipe loaded)."""
    calibration = config.calibration
    histogram = calibration.method.modelopt != "max"
    smoothquant = config.smoothquant
    alpha = smoothquant.alpha if smoothquant is not None and smoothquant.alpha != "auto" else None
    return ModeloptSettings(
        precision=config.precision,
        preset=SMOOTHQUANT_PRESET if alpha is not None else PRESETS[config.precision],
        calibrator=calibration.calibrator,
        percentile=calibration.percentile if "percentile" in calibration.method.options else None,
        num_bins=calibration.num_bins if histogram else None,
        per_channel=config.per_channel,
        smoothquant_alpha=alpha,
    )


def build_modelopt(spec: VariantSpec, ctx: BuildContext) -> BuiltVariant:
    """Quantize the recipe's PyTorch model with ModelOpt, export it, and make an ONNX Runtime-ready file."""
    clock = Stopwatch()
    if ctx.torch_model is None:
        raise QbenchError(
            f"variant {spec.name!r}: quantizer modelopt needs the PyTorch model (model.torch in the recipe); "
            "this sweep has only an ONNX model"
        )
    require_calibration(spec.name, ctx.calibration)
    config = technique_of(spec, Modelopt)
    settings = modelopt_settings(config)
    mtq = import_modelopt()
    import torch  # present: ModelOpt imported

    target = output_path(spec.name, ctx)
    exported = target.with_name(f"{spec.name}.{TRT_TAG}.onnx") if spec.precision == "fp8" else target
    torch_model = ctx.torch_model
    with single_torch_thread():
        module = torch_model.build()
        excluded = resolve_exclusions(module, config.exclude_nodes, spec.name)
        with build_step(spec.name, "scanning calibration rows for NaN/inf"):
            reading = quantizers_reading_nonfinite(module, settings, excluded, ctx.calibration, torch_model.input_names)
        kept_float = sorted(set(excluded.values()) | set(reading))
        with build_step(spec.name, f"ModelOpt {settings.preset} quantization"):
            quantized, kept = quantize_module(module, settings, kept_float, ctx.calibration, torch_model.input_names)
        _check_excluded_modules_had_quantizers(quantized, excluded, spec.name)
        opset = max(FP8_OPSET, torch_model.opset) if spec.precision == "fp8" else None
        with build_step(spec.name, "ONNX export (TorchScript exporter)"), warnings.catch_warnings():
            # ModelOpt's quantizers trip the tracer's Python-condition warnings on every export: expected
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch_model.export(quantized, exported, opset=opset)
    with build_step(spec.name, "reading the exported model"):
        model = load_model(exported)
    if spec.precision == "fp8":
        with build_step(spec.name, "rewriting TRT FP8 nodes to standard Q/DQ"):
            model = standard_fp8_model(model)
            onnx.checker.check_model(model, full_check=True)
            save_model(model, target)
    if custom_domains(model):  # a config beyond int8/fp8 defaults (e.g. INT4 blocks) exports TensorRT-only nodes
        raise QbenchError(f"variant {spec.name!r}: ModelOpt's export holds custom nodes ONNX Runtime cannot run")
    # An INT8 build's count is what ONNX Runtime runs as integer kernels, taken where every build is finalised
    # (qbench.variants.integer_kernels); FP8 has no such kernel on CPU, so its count is of the Q/DQ'd layers.
    counts = quantized_op_counts(model, QUANTIZED_OP_TYPES) if spec.precision == "fp8" else None
    params = {
        **settings.params(mtq),
        "modelopt_version": importlib.metadata.version("nvidia-modelopt"),
        "format": _FORMATS[spec.precision],
        "opset": default_opset(model),
        "exclude_nodes": list(config.exclude_nodes),
        "excluded_modules": sorted(set(excluded.values())),
        "calibration_batches": len(ctx.calibration),
        "calibration_rows": calibration_rows(ctx.calibration),
        "quantized_modules": quantized_module_count(quantized),
        **({} if counts is None else {"quantized_nodes": sum(counts.values()), "quantized_op_types": counts}),
        "tensorrt_onnx": str(exported),
    }
    if reading:
        params["nonfinite_inputs_kept_fp32"] = reading
    if kept:
        params["histogram_range_kept"] = {name: round(fraction, 4) for name, fraction in sorted(kept.items())}
    return BuiltVariant(
        name=spec.name,
        precision=spec.precision,
        onnx_path=target,
        params=params,
        build_seconds=clock.seconds(),
        session_hints={"graph_optimization_level": "basic"} if spec.precision == "fp8" else {},
        notes=(FP8_NOTE if spec.precision == "fp8" else INT8_NOTE, *clipping_notes(settings, kept),
               *([kept_float_note(reading)] if reading else [])),
        torch_module=lambda: copy.deepcopy(quantized),
        # calibration shaped both forms; the export's facts and how ONNX Runtime runs it describe the ONNX file only
        param_forms=dict.fromkeys(("format", "opset", "quantized_nodes", "quantized_op_types", "tensorrt_onnx"), ONNX),
        note_forms={FP8_NOTE: ONNX, INT8_NOTE: ONNX},
    )


def clipping_notes(settings: ModeloptSettings, kept: dict[str, float]) -> list[str]:
    """Name the activations whose histogram calibration kept less than CLIPPING_WARN_BELOW of the observed range.

    ModelOpt's entropy search starts at 1/16 of the range (bin 128 of 2048): on inputs with a few
    discrete values (8-bit pixels) it can settle there and clip most of the signal.
    """
    clipped = sorted((fraction, name) for name, fraction in kept.items() if fraction < CLIPPING_WARN_BELOW)
    if not clipped:
        return []
    listed = ", ".join(f"{name} ({fraction:.0%})" for fraction, name in clipped[:5])
    return [f"{settings.calibrator} calibration kept only part of the observed range of: {listed}; compare with minmax"]


_FORMATS = {
    "int8": "QDQ int8, symmetric (ModelOpt's export, standard ONNX)",
    "fp8": "QDQ float8e4m3fn (standard ONNX, rewritten from ModelOpt's TRT_FP8 nodes)",
}


# -- ModelOpt -------------------------------------------------------------------------------------


def import_modelopt() -> Any:
    """`modelopt.torch.quantization`, or a MissingExtraError naming the extra."""
    try:
        with warnings.catch_warnings():
            # ModelOpt warns at import about untested transformers versions: not the user's concern here
            warnings.simplefilter("ignore", UserWarning)
            import modelopt.torch.quantization as mtq
    except ImportError:
        raise MissingExtraError("nvidia-modelopt", "modelopt", "install torch==2.13.0 first") from None
    return mtq


def quantize_module(
    module: Any, settings: ModeloptSettings, excluded: Sequence[str], batches: Sequence[Feeds],
    input_names: Sequence[str]
) -> tuple[Any, dict[str, float]]:
    """`mtq.quantize` the module in place with `settings`, calibrated on `batches`, the modules `excluded` kept float.

    Returns the module and, for histogram calibration, quantizer name -> the fraction of the
    observed range its amax keeps (empty for max calibration, which keeps all of it).
    """
    mtq = import_modelopt()
    config = settings.quant_config(mtq, excluded)
    forward_loop = calibration_loop(batches, input_names)
    with quiet_stdout():  # ModelOpt prints "Inserted N quantizers"
        module = mtq.quantize(module, config, forward_loop if settings.histogram_method is None else None)
    if settings.histogram_method is None:
        return module, {}
    return module, _calibrate_histograms(module, forward_loop, settings)


def quantizers_reading_nonfinite(
    module: Any, settings: ModeloptSettings, excluded: dict[str, str], batches: Sequence[Feeds],
    input_names: Sequence[str]
) -> dict[str, list[str]]:
    """Module name -> its enabled quantizers whose input holds NaN or ±inf on some calibration batch (FP32 values).

    Run only when a calibration batch is fed NaN/inf: the quantizers are inserted into a copy of `module` without
    calibrating, disabled so the forward pass is FP32's, and each one's input checked.
    """
    if not any(holds_nonfinite(batch) for batch in batches):
        return {}
    import torch

    mtq = import_modelopt()
    config = {**settings.quant_config(mtq, sorted(set(excluded.values()))), "algorithm": None}  # nothing calibrated
    with quiet_stdout():
        probe = mtq.quantize(copy.deepcopy(module), config, None)
    found: set[str] = set()

    def note_nonfinite(name: str) -> Callable[..., None]:
        def hook(_: Any, inputs: tuple[Any, ...], __: Any) -> None:
            if any(torch.is_tensor(t) and t.is_floating_point() and not torch.isfinite(t).all() for t in inputs):
                found.add(name)

        return hook

    for name, quantizer in _named_tensor_quantizers(probe):
        if quantizer.is_enabled:
            quantizer.disable()
            quantizer.register_forward_hook(note_nonfinite(name))
    calibration_loop(batches, input_names)(probe)
    owners: dict[str, list[str]] = {}
    for name in sorted(found):  # "fc1.input_quantizer" -> "fc1"; "fc1.weight_quantizer.0" (a sequence of them) too
        parts = name.split(".")
        owner = next((i for i, part in enumerate(parts) if part.endswith("quantizer")), len(parts) - 1)
        owners.setdefault(".".join(parts[:owner]), []).append(name)
    return owners


def calibration_loop(batches: Sequence[Feeds], input_names: Sequence[str]) -> Callable[[Any], None]:
    """ModelOpt's forward_loop: every calibration batch through the module, inputs in forward() order."""
    import torch

    missing = sorted({name for batch in batches for name in input_names if name not in batch})
    if missing:
        raise QbenchError(f"calibration batches lack the model input {missing[0]!r}")
    tensors = [tuple(torch.from_numpy(np.ascontiguousarray(batch[name])) for name in input_names) for batch in batches]

    def forward_loop(model: Any) -> None:
        with torch.no_grad():
            for arguments in tensors:
                model(*arguments)

    return forward_loop


def _calibrate_histograms(
    module: Any, forward_loop: Callable[[Any], None], settings: ModeloptSettings
) -> dict[str, float]:
    """Collect statistics with quantization off, then load each quantizer's amax from its calibrator.

    ModelOpt's "max" algorithm asks every calibrator for its amax without a method, which
    a histogram calibrator cannot answer, so the histogram pass is driven here through
    TensorQuantizer's calibration switches.
    Returns quantizer name -> calibrated amax / largest value seen, for the histogram-calibrated ones.
    """
    from modelopt.torch.quantization.calib import HistogramCalibrator

    quantizers = {name: q for name, q in _named_tensor_quantizers(module) if q.is_enabled}
    for quantizer in quantizers.values():
        quantizer.disable_quant()
        quantizer.enable_calib()
    forward_loop(module)
    kept: dict[str, float] = {}
    for name, quantizer in quantizers.items():
        calibrator = quantizer._calibrator
        if isinstance(calibrator, HistogramCalibrator):
            method = settings.histogram_method
            extra = {"percentile": settings.percentile} if method == "percentile" else {}
            quantizer.load_calib_amax(method, **extra)
            seen = float(calibrator._calib_bin_edges[-1])  # the histogram spans [0, largest |x| seen]
            kept[name] = float(quantizer.amax.max()) / seen if seen > 0 else 1.0
        else:
            quantizer.load_calib_amax()
        quantizer.enable_quant()
        quantizer.disable_calib()
    return kept


def _named_tensor_quantizers(module: Any) -> list[tuple[str, Any]]:
    from modelopt.torch.quantization.nn import TensorQuantizer

    return [(name, m) for name, m in module.named_modules() if isinstance(m, TensorQuantizer)]


def quantized_module_count(module: Any) -> int:
    """Modules whose own input or weight quantizer is enabled."""
    enabled = [name for name, q in _named_tensor_quantizers(module) if q.is_enabled]
    return len({name.rpartition(".")[0] for name in enabled if name.endswith(("input_quantizer", "weight_quantizer"))})


def resolve_exclusions(module: Any, names: Sequence[str], variant: str) -> dict[str, str]:
    """Map each exclude_nodes entry to a module name: a module name as is, or a TorchScript export node name
    ("/encoder/layer.0/dense/MatMul" -> "encoder.layer.0.dense"); raises QbenchError for names that match nothing."""
    modules = {name for name, _ in module.named_modules() if name}
    resolved = {}
    for name in names:
        candidate = name if name in modules else ".".join(name.strip("/").split("/")[:-1])
        if candidate not in modules:
            weighted = [n for n, m in module.named_modules() if n and getattr(m, "weight", None) is not None]
            shown = ", ".join(weighted[:8]) + (", ..." if len(weighted) > 8 else "")
            raise QbenchError(
                f"variant {variant!r}: exclude_nodes: {name!r} is neither a module of the PyTorch model nor a node "
                f"of its export (/<module path>/<Op>){did_you_mean(candidate, modules)}; modules with weights: {shown}"
            )
        resolved[name] = candidate
    return resolved


def _check_excluded_modules_had_quantizers(module: Any, excluded: dict[str, str], variant: str) -> None:
    """An exclusion that disables nothing is a mistake in the recipe: say so instead of ignoring it."""
    for name, module_name in excluded.items():
        if not _named_tensor_quantizers(module.get_submodule(module_name)):
            raise QbenchError(
                f"variant {variant!r}: exclude_nodes: {name!r} (module {module_name!r}) holds no layer ModelOpt "
                "quantizes (Linear, Conv, ...): there is nothing to keep in floating point"
            )


# -- ONNX --------------------------------------------------------------------------------------------


def standard_fp8_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of a ModelOpt FP8 export with trt::TRT_FP8{Quantize,Dequantize}Linear as standard ONNX Q/DQ.

    TRT's pair takes (x, scale) with y = saturate(x / scale) as E4M3, which is ONNX's
    QuantizeLinear with a float8e4m3fn zero point of 0. A Q of a weight initializer is
    folded here into a float8 initializer, so the file stores weights as FP8 (not FP32)
    and ONNX Runtime does not quantize the weights again on every run.
    """
    model = copy.deepcopy(model)
    graph = model.graph
    constants = _constant_values(graph)
    initializers = {t.name for t in graph.initializer}
    zero_point = numpy_helper.from_array(np.zeros((), dtype=ml_dtypes.float8_e4m3fn), _FP8_ZERO_POINT)
    nodes, folded = [], []
    for node in graph.node:
        if node.domain != TRT_DOMAIN or node.op_type not in _TRT_FP8_OPS:
            nodes.append(node)
        elif node.op_type == "TRT_FP8QuantizeLinear" and node.input[0] in initializers:
            values = fp8_quantize(constants[node.input[0]], constants[node.input[1]])
            folded.append(numpy_helper.from_array(values, node.output[0]))
        else:
            inputs = [*node.input[:2], _FP8_ZERO_POINT]
            nodes.append(helper.make_node(_TRT_FP8_OPS[node.op_type], inputs, list(node.output), name=node.name))
    leftover = custom_domains(model) - {TRT_DOMAIN}
    if leftover or any(n.domain == TRT_DOMAIN for n in nodes):
        raise QbenchError("the FP8 export holds custom nodes qbench cannot rewrite "
                          f"({', '.join(sorted(leftover)) or TRT_DOMAIN})")
    graph.ClearField("node")
    graph.node.extend(nodes)
    graph.initializer.extend([*folded, zero_point])
    # the exporter typed the TRT quantized tensors as uint8; ONNX infers float8 from the zero point
    quantized = {n.output[0] for n in nodes if n.op_type == "QuantizeLinear"} | {t.name for t in folded}
    kept_info = [info for info in graph.value_info if info.name not in quantized]
    graph.ClearField("value_info")
    graph.value_info.extend(kept_info)
    _drop_unread(graph)
    kept_opsets = [o for o in model.opset_import if o.domain != TRT_DOMAIN]
    model.ClearField("opset_import")
    model.opset_import.extend(kept_opsets)
    needed = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)  # com.microsoft etc.
    model.ir_version = max(model.ir_version, needed)
    return model


def fp8_quantize(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """ONNX QuantizeLinear to float8e4m3fn (saturating, round to nearest even) with a scalar scale."""
    scaled = np.asarray(values, dtype=np.float32) / np.asarray(scale, dtype=np.float32)
    return np.clip(scaled, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)


def _constant_values(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Initializers and Constant-node outputs (tensor-valued) by name."""
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _drop_unread(graph: onnx.GraphProto) -> None:
    """Remove Constant nodes and initializers nothing reads any more (the folded weights' FP32 copies)."""
    read = names_read(graph)
    nodes = [n for n in graph.node if n.op_type != "Constant" or any(out in read for out in n.output)]
    graph.ClearField("node")
    graph.node.extend(nodes)
    drop_unused_initializers(graph)

