"""INT8 variants with ONNX Runtime's quantizer: static QDQ (minmax / entropy / percentile) or dynamic.

Static: pre-process, compute ranges with qbench's own calibration call (so
`num_bins` and friends take effect, see `calibrate.py`), save them as ORT's
calibration cache, then `quantize_static` reads that cache. Dynamic:
`quantize_dynamic` (weights only; activations quantized at run time).

`reduce_range="auto"` turns on 7-bit weights on x86 CPUs without VNNI, where
ORT's u8s8 kernels can saturate (trials pitfall 2).

Both first fold the inputs computed from constants only (a Transposed or Constant weight) into initializers
(`constant_inputs`): ONNX Runtime's quantizers take only initializers for weights, so static INT8 quantized such a
weight as an activation with the calibrator's range and dynamic INT8 left its MatMul in float.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from pathlib import Path
from typing import Any

import onnx
from onnxruntime.capi._pybind_state import get_all_operator_schema
from onnxruntime.quantization import (
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)
from onnxruntime.quantization.calibrate import TensorsData, save_tensors_data
from onnxruntime.quantization.registry import (
    IntegerOpsRegistry,
    QDQRegistry,
    QLinearOpsRegistry,
)

from qbench.environment import cpu_has_vnni, needs_reduce_range
from qbench.onnx_read import file_over_protobuf_limit
from qbench.recipe.spec import VariantSpec
from qbench.techniques.onnxruntime import OrtDynamic, OrtInt8, OrtStatic
from qbench.variants.base import BuildContext, BuiltVariant, technique_of
from qbench.variants.calibrate import (
    FEEDING,
    CalibrationSettings,
    calibration_rows,
    clipping_ranges,
    compute_ranges_with,
    ort_method,
    preprocess_model,
    require_calibration,
)
from qbench.variants.constant_inputs import fold_constant_inputs
from qbench.variants.float_rules import default_notes, float_rules, kept_float_nodes
from qbench.variants.gemm_matmul import gemms_as_matmul, plain_gemm_factors
from qbench.variants.integer_kernels import computing_op_types
from qbench.variants.node_names import resolve_node_names
from qbench.variants.nonfinite_scan import kept_float_note, nodes_reading_nonfinite
from qbench.variants.onnx_utils import (
    Stopwatch,
    build_step,
    default_opset,
    output_path,
    quantized_tensors,
    quiet_stdout,
    save_model,
    scratch_dir,
    unchanged_variant,
)
from qbench.variants.opset_upgrade import ensure_opset
from qbench.variants.qdq_bypass import bypass_qdq
from qbench.variants.quant_scope import (
    predictor_output_nodes,
    preprocessing_nodes,
    subgraph_read_kept_float,
    table_lookups,
)
from qbench.variants.quantizable import (
    float64_clause,
    nested_clause,
    nested_nodes_note,
    nothing_to_quantize,
    quantizable_nodes,
    unquantizable_nodes,
)
from qbench.variants.reference import load_reference

_QUANT_TYPES = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
# What quantize_static / quantize_dynamic quantize when op_types_to_quantize is empty.
DEFAULT_STATIC_OP_TYPES = tuple(sorted(set(QLinearOpsRegistry) | set(QDQRegistry)))
DEFAULT_DYNAMIC_OP_TYPES = tuple(sorted(IntegerOpsRegistry))


def _integer_kernels_of(registry: Collection[str]) -> dict[str, Any]:
    """com.microsoft op type -> the schema of its integer kernel, for the op types `registry` (one of ONNX Runtime's
    quantizer registries) has a handler for: those whose handler rewrites the operator into its `Q<op>` kernel
    (Attention -> QAttention, EmbedLayerNormalization -> QEmbedLayerNormalization), as this ONNX Runtime build runs."""
    schemas = {schema.name: schema for schema in get_all_operator_schema() if schema.domain == "com.microsoft"}
    return {op: schemas[f"Q{op}"] for op in registry if op in schemas and f"Q{op}" in schemas}


# Contrib operators dynamic INT8 hands to ONNX Runtime's quantizer. Static INT8 hands none: its Q/DQ handlers would
# only round an Attention's inputs (ONNX Runtime fuses no Q/DQ pattern into QAttention), so the Attention would still
# compute in float.
DYNAMIC_CONTRIB_KERNELS = _integer_kernels_of(IntegerOpsRegistry)
# How many leading inputs ONNX Runtime's handler carries over into the integer kernel: a node reading a later one (an
# Attention's attention_bias or past_sequence_length, an EmbedLayerNormalization's position_ids) would lose it.
_CARRIED_INPUTS = {"Attention": 5, "EmbedLayerNormalization": 8}


def contrib_nodes(model: onnx.ModelProto, op_types: Collection[str]) -> list[str]:
    """Names of the com.microsoft nodes among `op_types` that dynamic INT8 hands to ONNX Runtime's quantizer: those its
    handler turns into an integer kernel that computes what the node does. A node is kept float when it reads an input
    the handler drops, writes more outputs than the kernel has, or sets an attribute the kernel's schema lacks (ONNX
    Runtime would refuse the kernel: an Attention's qkv_hidden_sizes, an EmbedLayerNormalization's mask_index_type)."""
    handed = []
    for node in model.graph.node:
        kernel = DYNAMIC_CONTRIB_KERNELS.get(node.op_type)
        if node.domain != "com.microsoft" or kernel is None or node.op_type not in op_types or not node.name:
            continue
        dropped = any(node.input[_CARRIED_INPUTS.get(node.op_type, 0):])
        outputs = len([name for name in node.output if name]) > len(kernel.outputs)
        if not dropped and not outputs and {a.name for a in node.attribute} <= set(kernel.attributes):
            handed.append(node.name)
    return handed


def resolve_reduce_range(setting: bool | str) -> tuple[bool, str]:
    """The reduce_range to use and where it came from ("recipe" or why "auto" chose it)."""
    if setting != "auto":
        return bool(setting), "recipe"
    if needs_reduce_range():
        return True, "auto (x86 CPU without VNNI)"
    return False, "auto (CPU has VNNI)" if cpu_has_vnni() else "auto (not an x86 CPU)"


PER_CHANNEL_OPSET = 13  # the first opset whose QuantizeLinear / DequantizeLinear take a per-channel axis


def build_int8(spec: VariantSpec, ctx: BuildContext) -> BuiltVariant:
    """Build an INT8 variant: QDQ static with qbench's calibration, or ORT dynamic quantization."""
    clock = Stopwatch()
    config = technique_of(spec, OrtInt8)
    dynamic = isinstance(config, OrtDynamic)
    if not dynamic:
        require_calibration(spec.name, ctx.calibration)
    reduce_range, reduce_range_source = resolve_reduce_range(config.reduce_range)
    params: dict[str, Any] = {
        "per_channel": config.per_channel,
        "reduce_range": reduce_range,
        "reduce_range_source": reduce_range_source,
        "weight_type": config.weight_type,
        "exclude_nodes": list(config.exclude_nodes),
    }
    target = output_path(spec.name, ctx)
    reference = ctx.reference_path.resolve()
    op_types = _op_types(config)
    with build_step(spec.name, "loading the FP32 model"):
        model = load_reference(reference)
    notes: list[str] = []
    if isinstance(config, OrtStatic) and config.per_channel and default_opset(model) < PER_CHANNEL_OPSET:
        original = default_opset(model)
        with build_step(spec.name, f"upgrading opset {original} to {PER_CHANNEL_OPSET}"):
            model = ensure_opset(model, PER_CHANNEL_OPSET)
        params["opset_original"] = original
        notes.append(f"opset {original} raised to {PER_CHANNEL_OPSET}: per-channel Q/DQ needs DequantizeLinear's axis")
    exclude_nodes = resolve_node_names(model, config.exclude_nodes, spec.name)
    with build_step(spec.name, "folding weights computed from constants"):
        lowered_types = _lowered_op_types(op_types, dynamic)
        reads = [(node, index) for node in model.graph.node if node.op_type in lowered_types
                 for index in range(len(node.input))]  # fmt: skip
        folded = fold_constant_inputs(model, reads)
    if dynamic and "MatMul" in op_types:
        params["gemms_as_matmul"] = len(gemms_as_matmul(model))  # the dynamic quantizer skips Gemm (a torch Linear)
    if isinstance(config, OrtStatic) and "Gemm" in op_types:
        # the static quantizer misreads alpha, beta, a 2-D C
        params["gemms_made_plain"] = len(plain_gemm_factors(model))
    rules, default = float_rules(config, static=isinstance(config, OrtStatic))
    kept_float = kept_float_nodes(model, rules, default=default)
    params.update(kept_float.params())
    notes += default_notes(params)
    lookups = {} if config.op_types else table_lookups(model, op_types)  # named in op_types: the recipe's choice
    if lookups:
        params["lookups_kept_float"] = dict(sorted(Counter(lookups.values()).items()))
        notes.append(f"{_listed(lookups)} kept float: they only look rows up in constant tables (embeddings), which no "
                     "integer kernel computes; 8-bit tables would round every row read and save no time (name the op "
                     "type in op_types to quantize them)")  # fmt: skip
    excluded = [*exclude_nodes, *kept_float.names, *lookups]
    handed = contrib_nodes(model, op_types) if dynamic else []
    if isinstance(config, OrtStatic):
        lowered = set(quantizable_nodes(model, op_types, excluded))
        params["preprocessing_kept_float"] = [name for name in preprocessing_nodes(model) if name in lowered]
        params["predictor_outputs_kept_float"] = [name for name in predictor_output_nodes(model) if name in lowered]
        excluded += params["preprocessing_kept_float"] + params["predictor_outputs_kept_float"]
    if not quantizable_nodes(model, computing_op_types(op_types), excluded, handed):
        params.update(calibrator=config.calibration.calibrator, op_types=list(op_types), quantized_nodes=0,
                      quantized_op_types={})  # fmt: skip
        why = _nothing_quantized(op_types, model, params.get("preprocessing_kept_float", []),
                                 params.get("predictor_outputs_kept_float", []))  # fmt: skip
        return unchanged_variant(spec.name, "int8", ctx, why, params, clock.seconds())
    params["folded_weights"] = folded
    exclude = [*excluded, *unquantizable_nodes(model, handed)]
    params["subgraph_read_kept_float"], read_by_subgraphs = subgraph_read_kept_float(model, lowered_types)
    with scratch_dir("qbench-int8-") as tmp:
        with build_step(spec.name, "pre-processing"):
            qdq = PER_CHANNEL_OPSET if isinstance(config, OrtStatic) else None  # dynamic INT8 writes no Q/DQ
            prepared, params["preprocess"] = preprocess_model(model, tmp, qdq)
        ranges: TensorsData | None = None
        if isinstance(config, OrtStatic):
            static_params, ranges = _quantize_static(spec.name, config, ctx, prepared, target, reduce_range, op_types,
                                                     exclude, notes)  # fmt: skip
            params.update(static_params)
        else:
            quantizable = quantizable_nodes(model, op_types, exclude, handed)
            exclude += _reading_nonfinite(spec.name, model, quantizable, ctx, tmp, params, notes)
            params.update(_quantize_dynamic(spec.name, config, prepared, target, reduce_range, op_types, exclude))
    with build_step(spec.name, "reading the quantized model"):
        quantized = onnx.load(str(target), load_external_data=False)
        # A node left out by the recipe or a rule (static) reads float activations and weights; every other node
        # kept out (a com.microsoft FusedMatMul or SkipLayerNormalization no quantizer is handed, a float64 node...)
        # its float weights: one sharing a constant with a quantized node computed on the 8-bit copy ORT's
        # quantizers (dynamic INT8 too) rewire every reader to, though counted and noted as left float.
        bypassed = excluded if isinstance(config, OrtStatic) else []
        if exclude:
            quantized = bypass_qdq(quantized, model, bypassed, weights_of=exclude)
            save_model(quantized, target)
    symmetric = isinstance(config, OrtStatic) and config.symmetric_activations
    clipping = {} if ranges is None else clipping_ranges(ranges, quantized_tensors(quantized), symmetric=symmetric)
    return BuiltVariant(
        name=spec.name,
        precision="int8",
        onnx_path=target,
        params=params,
        build_seconds=clock.seconds(),
        notes=tuple(notes + _notes(config, reduce_range, quantized) + read_by_subgraphs
                    + nested_nodes_note(model, lowered_types)),
        activation_ranges=clipping,
    )


def _nothing_quantized(
    op_types: tuple[str, ...], model: onnx.ModelProto, preprocessing: list[str], predictor_outputs: list[str]
) -> str:
    """Why no node computes in INT8: none the quantizer takes; every one it takes was kept float (a converted
    pipeline's Concat of scaled and one-hot features in front of an ONNX-ML predictor is all preprocessing, a Mul of
    a tree ensemble's scores computes on its float output); or those left only move or select data (a KNN's votes
    through Concat and ArgMax), which no integer kernel computes."""
    quantizable = set(quantizable_nodes(model, op_types, []))
    if not quantizable:
        return nothing_to_quantize(op_types, model)
    computing = set(quantizable_nodes(model, computing_op_types(op_types), []))
    nested = float64_clause(model, op_types) + nested_clause(model, op_types)
    if quantizable <= {*preprocessing, *predictor_outputs}:
        why = [text for names, text in ((preprocessing, "preprocessing in front of every layer with weights"),
                                        (predictor_outputs, "steps on the float output of an ONNX-ML predictor"))
               if quantizable.intersection(names)]  # fmt: skip
        return (f"nothing to quantize (every {_kinds(model, quantizable)} node is kept float: "
                f"{' and '.join(why)}{nested})")
    if not computing:
        return (f"nothing to quantize (Q/DQ on {_kinds(model, quantizable)} would only round data that ONNX Runtime "
                f"moves, selects or computes in float: no integer arithmetic{nested})")
    return (f"nothing to quantize (every {_kinds(model, computing)} node is kept float: exclude_nodes, keep_float or "
            f"preprocessing{nested})")


def _listed(op_types: dict[str, str]) -> str:
    """'2 Gather, 1 EmbedLayerNormalization' of node name -> op type."""
    return ", ".join(f"{count} {op}" for op, count in sorted(Counter(op_types.values()).items()))


def _kinds(model: onnx.ModelProto, names: set[str]) -> str:
    return ", ".join(sorted({node.op_type for node in model.graph.node if node.name in names}))


def _lowered_op_types(op_types: tuple[str, ...], dynamic: bool) -> tuple[str, ...]:
    """The op types the build lowers: dynamic INT8 quantizes a Gemm as the MatMul it is rewritten to (`gemms_as_matmul`,
    main graph only), so a Gemm left float inside a subgraph is as much a Linear left FP32 as a MatMul there."""
    return (*op_types, "Gemm") if dynamic and "MatMul" in op_types and "Gemm" not in op_types else op_types


def _op_types(config: OrtInt8) -> tuple[str, ...]:
    if config.op_types:
        return tuple(config.op_types)
    return DEFAULT_DYNAMIC_OP_TYPES if isinstance(config, OrtDynamic) else DEFAULT_STATIC_OP_TYPES


def _quantize_static(
    name: str,
    config: OrtStatic,
    ctx: BuildContext,
    prepared: Path,
    target: Path,
    reduce_range: bool,
    op_types: tuple[str, ...],
    exclude: list[str],
    notes: list[str],
) -> tuple[dict[str, Any], TensorsData]:
    """Calibrate, save the ranges beside the variant, and write the QDQ model; returns the params and ranges used.

    Tensors left without a range (calibrate.Calibrated.skipped) are named in `notes` (appended to).
    """
    settings = CalibrationSettings.of(config.calibration, config.symmetric_activations, op_types)
    cache = target.with_name(f"{name}.calibration.json")
    with build_step(name, f"{settings.method} calibration"):
        calibrated = compute_ranges_with(settings, prepared, ctx.calibration, prepared.parent)
        ranges = calibrated.ranges
        save_tensors_data(ranges, cache)
    notes.extend(calibrated.notes())
    unranged = _nodes_touching(prepared, {name for name in calibrated.skipped if name not in ranges})
    if unranged:
        exclude = [*exclude, *unranged]
        more = f" (+{len(unranged) - 5} more)" if len(unranged) > 5 else ""
        notes.append(f"{len(unranged)} node(s) left in FP32 around tensors without a range: "
                     f"{', '.join(unranged[:5])}{more}")
    with build_step(name, "static quantization"), quiet_stdout():
        quantize_static(
            prepared,
            target,
            calibration_data_reader=None,
            calibration_cache_path=cache,
            calibrate_method=ort_method(settings.method),
            quant_format=QuantFormat.QDQ,
            activation_type=_QUANT_TYPES[config.activation_type],
            weight_type=_QUANT_TYPES[config.weight_type],
            per_channel=config.per_channel,
            reduce_range=reduce_range,
            op_types_to_quantize=list(op_types),
            nodes_to_exclude=exclude,
            extra_options={"ActivationSymmetric": config.symmetric_activations, "WeightSymmetric": True},
            use_external_data_format=file_over_protobuf_limit(prepared),  # ORT writes one file by default
        )
    return {
        **settings.params(),
        "quant_format": "QDQ",
        "activation_type": config.activation_type,
        "symmetric_activations": config.symmetric_activations,
        "weight_symmetric": True,
        "op_types": list(op_types),
        "calibration_batches": len(ctx.calibration),
        "calibration_rows": calibration_rows(ctx.calibration),
        "calibration_feeding": FEEDING,
        "calibrated_tensors": len(ranges.keys()),
        "uncalibrated_tensors": calibrated.skipped,
        "unranged_nodes_kept_fp32": unranged,
        "calibration_cache": cache.name,
    }, ranges


def _nodes_touching(model_path: Path, tensors: set[str]) -> list[str]:
    """Named nodes that read or write any of `tensors` (ORT's QDQ quantizer needs a range for each of those)."""
    if not tensors:
        return []
    graph = onnx.load(str(model_path), load_external_data=False).graph
    return [n.name for n in graph.node if n.name and tensors.intersection([*n.input, *n.output])]


def _reading_nonfinite(
    name: str, model: onnx.ModelProto, nodes: list[str], ctx: BuildContext, tmp: Path, params: dict[str, Any],
    notes: list[str],
) -> list[str]:
    """Dynamic INT8: the nodes among `nodes` that read a tensor holding NaN/inf on the calibration rows, kept float
    (named in `params` and `notes`): DynamicQuantizeLinear writes NaN as the tensor's minimum, so a graph reading NaN
    as missing afterwards (IsNaN, a tree ensemble) would see a value (see `nonfinite_scan`)."""
    with build_step(name, "looking for NaN/inf on the calibration rows"):
        reading = nodes_reading_nonfinite(model, nodes, ctx.calibration, tmp)
    if reading:
        params["nonfinite_inputs_kept_fp32"] = reading
        notes.append(kept_float_note(reading))
    return list(reading)


def _quantize_dynamic(
    name: str, config: OrtInt8, prepared: Path, target: Path, reduce_range: bool, op_types: tuple[str, ...],
    exclude: list[str]
) -> dict[str, Any]:
    """Write the dynamically quantized model; returns the params it used."""
    with build_step(name, "dynamic quantization"), quiet_stdout():
        quantize_dynamic(
            prepared,
            target,
            op_types_to_quantize=list(op_types),
            per_channel=config.per_channel,
            reduce_range=reduce_range,
            weight_type=_QUANT_TYPES[config.weight_type],
            nodes_to_exclude=exclude,
            # Fused graphs (Attention, SkipLayerNorm) lack some tensor types; float is right for them (pitfall 8).
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            use_external_data_format=file_over_protobuf_limit(prepared),  # ORT writes one file by default
        )
    return {
        "calibrator": "dynamic",
        "quant_format": "IntegerOps (dynamic)",
        "activation_type": "uint8 (computed per batch at run time)",
        "op_types": list(op_types),
        "calibration_batches": 0,
        "calibration_rows": 0,
    }


def _notes(config: OrtInt8, reduce_range: bool, quantized: onnx.ModelProto) -> list[str]:
    """Caveats of the settings; whether any node computes in INT8 is noted where every INT8 build is finalised
    (`integer_kernels.with_integer_kernels`)."""
    notes = []
    if isinstance(config, OrtDynamic) and any(node.op_type == "ConvInteger" for node in quantized.graph.node):
        notes.append("dynamic INT8 runs Conv as ConvInteger, which is usually slower than FP32 on CPU; prefer static")
    if needs_reduce_range() and not reduce_range and config.weight_type == "int8":
        notes.append("reduce_range is off on an x86 CPU without VNNI: "
                     "int8-weight kernels may saturate and lose accuracy")
    return notes
