"""Half-precision variants: FP16 (a real FP16 graph) and BF16 (an emulation, on every backend).

FP16 uses `onnxruntime.transformers.float16` with FP32 inputs/outputs; in our
trials onnxconverter-common's converter produced a MiniLM graph ORT could not
load, ORT's did not.

BF16: ORT's CPU provider has no bfloat16 kernels for MatMul, Add, Relu... (a
real BF16 graph fails with NOT_IMPLEMENTED), but it does cast float <-> bfloat16.
So the BF16 variant is an FP32 graph that carries BF16 precision: weights are
rounded to bfloat16, and every float tensor a node produces (and every float
graph input) goes through Cast(to=BFLOAT16) -> Cast(to=FLOAT) (emulate.py).
Arithmetic inside an op stays FP32, as on hardware that accumulates BF16 products
in FP32. Its accuracy is faithful to BF16 (range up to 3.39e38, then inf; 8 bits
of precision); its latency is that of the emulation, never a BF16 figure.

ONNX Runtime's contrib operators (com.microsoft Attention, SkipLayerNormalization...) are converted as its float16
converter converts them, by the schemas ONNX Runtime registers for them (float_support, runtime_schemas).
Which nodes stay FP32 under FP16: those whose schema or ONNX Runtime lacks float16 (float_support), those
that produce or read a tensor FP16 cannot hold on the calibration sample or in the weights (fp16_range), and
the data movement between such nodes (float_support.with_data_movement_between_kept). BF16 keeps ai.onnx.ml
operators, control flow and the data movement between them unrounded.

FP16 on a backend without FP16 kernels (ONNX Runtime's CPU provider) is evaluated
through `emulate.emulate_float16`, which restores FP16 overflow and underflow that
ORT's CPU provider would otherwise hide (qbench.validate.fidelity).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Collection
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, numpy_helper
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

from qbench.onnx_read import infer_shapes
from qbench.recipe.spec import VariantSpec
from qbench.variants.base import BuildContext, BuiltVariant
from qbench.variants.emulate import round_float_tensors
from qbench.variants.emulate_fold import fold_conv_batch_norms
from qbench.variants.emulate_recurrent import step_recurrent
from qbench.variants.float_support import (
    CONTRACTION_OP_TYPES,
    DATA_MOVEMENT_OPS,
    DEFAULT_DOMAINS,
    SHAPE_ONLY_OPS,
    KeptNodes,
    add_missing_float_value_info,
    cast_subgraph_reads_to_float32,
    contractions_held,
    drop_float_round_trips,
    kept_in_float32,
    kept_in_rounding_simulation,
    narrowed_nodes,
    non_tensor_values,
    restore_non_tensor_values,
    tensor_types,
    with_data_movement_between_kept,
)
from qbench.variants.fp16_range import FP16_MAX_FINITE, FP16_MIN_POSITIVE, out_of_fp16_range
from qbench.variants.onnx_utils import (
    Stopwatch,
    build_step,
    check_model_against,
    outer_scope_reads,
    output_path,
    rename_reads,
    save_model,
    subgraphs_of,
    unchanged_variant,
)
from qbench.variants.opset_upgrade import ensure_opset
from qbench.variants.quantizable import ML_PREDICTOR_OP_TYPES, float64_nodes
from qbench.variants.reference import fresh_name, load_reference, names_in

_CONVERTER_NODE_NAME = re.compile(r"graph_(input|output)_cast\d+")  # onnxruntime.transformers.float16's io Casts
BF16_CAST_OPSET = 13  # first opset whose Cast accepts bfloat16
BF16_MAX_FINITE = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
BF16_NOTE = "BF16 emulated (FP32 graph rounding every tensor to bfloat16): accuracy is faithful, latency is not BF16's"


def build_fp16(spec: VariantSpec, ctx: BuildContext) -> BuiltVariant:
    """FP16 weights and compute, FP32 inputs and outputs; nodes FP16 cannot serve stay FP32 (float_support)."""
    clock = Stopwatch()
    target = output_path(spec.name, ctx)
    with build_step(spec.name, "loading the FP32 model"):
        model = load_reference(ctx.reference_path.resolve())
        _free_converter_names(model.graph, names_in(model.graph))
    with build_step(spec.name, "choosing the nodes that stay FP32"):
        types = tensor_types(model)
        non_tensor = non_tensor_values(model)
        kept = _kept_for_fp16(model, types, non_tensor)
    with build_step(spec.name, "checking the FP32 model's values against FP16's range"):
        in_range = out_of_fp16_range(model, types, ctx.calibration, skip=kept.names, whole=ctx.fixed_batch is not None)
        kept = with_data_movement_between_kept(model, KeptNodes({**kept.reasons, **in_range.nodes}), types)
        narrowed = narrowed_nodes(model, kept, types)
    params: dict[str, Any] = {
        "converter": "onnxruntime.transformers.float16",
        "keep_io_types": True,
        "min_positive_val": FP16_MIN_POSITIVE,
        "max_finite_val": FP16_MAX_FINITE,
        "blocked_op_types": kept.op_types(model),
        "kept_fp32_nodes": len(kept.reasons),
        "converted_nodes": len(narrowed),
        **in_range.params(),
    }
    lowered_params, lowered_note = partly_lowered(model, kept, types, "FP16")
    params.update(lowered_params)
    range_note = [note] if (note := in_range.note()) else []
    if not params["converted_nodes"]:
        why = _nothing_to_lower("convert to FP16", kept.op_types(model), model)
        built = unchanged_variant(spec.name, "fp16", ctx, why, params, clock.seconds())
        return dataclasses.replace(built, notes=(*built.notes, *range_note))
    kept_text = kept.described(model)
    fused_note = _fused_rounding_note(model, set(narrowed), "FP16")
    kept = _float32_copies_for_kept(model, kept, types)
    too_large, too_small = _values_outside_fp16(model, set(kept.names))
    clamped = too_large + too_small
    io_types = {info.name: onnx.TypeProto.FromString(info.type.SerializeToString())  # the converter rewrites them
                for info in [*model.graph.input, *model.graph.output] if info.name in non_tensor}  # fmt: skip
    with build_step(spec.name, "FP16 conversion"):
        add_missing_float_value_info(model, types)
        converted = convert_float_to_float16(
            infer_shapes(model),  # the converter's own inference (onnx's in memory) fails on a model over 2 GiB
            disable_shape_infer=True,
            min_positive_val=FP16_MIN_POSITIVE,
            max_finite_val=FP16_MAX_FINITE,
            keep_io_types=True,
            op_block_list=[],
            node_block_list=kept.names,
        )
        cast_subgraph_reads_to_float32(converted, kept, types)
        restore_non_tensor_values(converted, non_tensor, io_types)
        drop_float_round_trips(converted, TensorProto.FLOAT16)
        save_model(converted, target)
    notes = []
    if too_large:
        notes.append(f"{too_large} weight value(s) beyond FP16's largest finite value ({FP16_MAX_FINITE:g}) were "
                     "clamped to it")
    if too_small:
        notes.append(f"{too_small} nonzero weight value(s) nearer 0 than FP16's smallest positive value "
                     f"({FP16_MIN_POSITIVE:g}) were raised to it, sign "
                     f"kept (a change of under {FP16_MIN_POSITIVE:g} each)")
    if kept.reasons:
        notes.append(f"kept in FP32: {kept_text}")
    notes += lowered_note + fused_note + range_note
    return BuiltVariant(
        name=spec.name,
        precision="fp16",
        onnx_path=target,
        params={**params, "weights_clamped": clamped},
        build_seconds=clock.seconds(),
        notes=tuple(notes),
    )


def _kept_for_fp16(model: onnx.ModelProto, types: dict[str, int], non_tensor: set[str]) -> KeptNodes:
    """Nodes the schemas keep FP32, plus op types ORT has no FP16 CPU kernel for (the converter's own list)."""
    kept = kept_in_float32(model, TensorProto.FLOAT16, types, non_tensor)
    no_kernel = set(DEFAULT_OP_BLOCK_LIST)
    extra = {
        node.name: "no FP16 kernel in ONNX Runtime (the converter's block list)"
        for node in model.graph.node
        if node.op_type in no_kernel and node.name not in kept.reasons
    }
    return KeptNodes({**kept.reasons, **extra})


def _float32_copies_for_kept(model: onnx.ModelProto, kept: KeptNodes, types: dict[str, int]) -> KeptNodes:
    """Let the nodes kept in FP32 read the float constants they share with narrowed nodes from float32 copies of
    their own, in place (`types` learns the copies); `kept` plus the nodes copied.

    A conversion stores a constant once: the FP16 converter narrows an initializer any converted node reads and
    casts it back to float32 for a kept reader, the BF16 simulation rounds it, and both narrow the value a Constant
    or ConstantOfShape node holds in its attributes (and round what it produces). A weight tied between a converted
    MatMul and one kept FP32 (by rule, or by the range check) would then be rounded for the kept one too, which is
    reported as computing in FP32. Its reads of such a constant, through its inputs or by name from its subgraphs
    (an If branch), go to a copy named `<name>/fp32` that only kept nodes read, which neither conversion touches:
    an initializer holding the original float32 values, or a copy of the node, kept FP32, beside the original
    (a ConstantOfShape's copy reads the same shape).
    """
    graph = model.graph
    values = {t.name: t for t in graph.initializer if t.data_type == TensorProto.FLOAT}
    narrowed = {name for node in graph.node if node.name not in kept.reasons
                for name in (*node.input, *outer_scope_reads(node)) if name in values}  # fmt: skip
    sources = {node.output[0]: node for node in graph.node
               if node.name not in kept.reasons and _holds_float_value(node)}  # fmt: skip
    narrowed.update(sources)
    taken = names_in(graph)
    copies: dict[str, str] = {}
    node_copies: dict[str, onnx.NodeProto] = {}  # original node's name -> its kept copy
    for node in graph.node:
        reads = [name for name in (*node.input, *outer_scope_reads(node)) if name in narrowed]
        if node.name not in kept.reasons or not reads:
            continue
        for name in reads:
            if name in copies:
                continue
            copies[name] = fresh_name(f"{name}/fp32", taken)
            types[copies[name]] = TensorProto.FLOAT
            if name in sources:
                copy = onnx.NodeProto.FromString(sources[name].SerializeToString())
                copy.name, copy.output[0] = fresh_name(f"{copy.name}/fp32", taken), copies[name]
                node_copies[sources[name].name] = copy
            else:
                copy = graph.initializer.add()
                copy.CopyFrom(values[name])
                copy.name = copies[name]
        renamed = {name: copies[name] for name in reads}
        node.input[:] = [renamed.get(name, name) for name in node.input]
        for body in subgraphs_of(node):
            rename_reads(body, renamed)
    if not node_copies:
        return kept
    nodes = [copied for node in graph.node for copied in (node, node_copies.get(node.name)) if copied is not None]
    graph.ClearField("node")
    graph.node.extend(nodes)
    reason = "a float32 copy of a constant that nodes kept FP32 read (the original is narrowed)"
    return KeptNodes({**kept.reasons, **{copy.name: reason for copy in node_copies.values()}})


def _holds_float_value(node: onnx.NodeProto) -> bool:
    """Whether the node produces a float32 value held in its attributes (Constant, ConstantOfShape's fill), which
    the conversions narrow. A ConstantOfShape without one fills with float32 zeros, which every format holds."""
    if node.op_type not in ("Constant", "ConstantOfShape") or node.domain not in DEFAULT_DOMAINS:
        return False
    return any(attribute.name == "value" and attribute.t.data_type == TensorProto.FLOAT  # read_onnx: no value_float
               for attribute in node.attribute)


def _float_constants(model: onnx.ModelProto, kept: Collection[str]) -> list[tuple[str, TensorProto]]:
    """The float32 constants a conversion stores in its format, with their names: the initializers converted nodes
    read and the tensors of converted Constant (and ConstantOfShape) nodes, named by the node's output, which
    exporters write scalars such as a mask fill as."""
    converted = [node for node in model.graph.node if node.name not in kept]
    constants = [(n.output[0], a.t) for n in converted for a in n.attribute if a.type == AttributeProto.TENSOR]
    read = {name for node in converted for name in node.input}
    tensors = [*((t.name, t) for t in model.graph.initializer if t.name in read), *constants]
    return [(name, tensor) for name, tensor in tensors if tensor.data_type == TensorProto.FLOAT]


def _values_outside_fp16(model: onnx.ModelProto, kept: Collection[str]) -> tuple[int, int]:
    """Float constant values the converter clamps (`_float_constants`): how many lie beyond FP16's largest finite
    value, and how many are nonzero and nearer 0 than its smallest positive one (raised to it). A whole constant out
    of range keeps its readers FP32 (fp16_range): what is left here are single values, tiny weights among normal
    ones."""
    too_large = too_small = 0
    for _, tensor in _float_constants(model, kept):
        magnitude = np.abs(numpy_helper.to_array(tensor))
        too_large += int(np.count_nonzero(magnitude > FP16_MAX_FINITE))
        too_small += int(np.count_nonzero((magnitude > 0) & (magnitude < FP16_MIN_POSITIVE)))
    return too_large, too_small


def _saturate_to_bf16(model: onnx.ModelProto, kept: Collection[str]) -> tuple[int, dict[str, float]]:
    """Clamp finite float constants beyond BF16's largest finite value (3.3895e38) to it, in place; how many values,
    and constant (an initializer, or the Constant node's output) -> the largest magnitude it held.

    Rounding to nearest even takes float32's extremes (torch.finfo(torch.float32).min, the usual attention-mask
    fill) to inf in bfloat16, and a row whose every score is masked then gets a softmax of NaN, which the next
    attention spreads to every row (0 x NaN). The nearest finite bfloat16 is within BF16's own rounding error of
    the value, as the FP16 converter clamps to 65504, and is what a model built in BF16 uses
    (torch.finfo(torch.bfloat16).min). Arithmetic that overflows still gives inf: only stored constants saturate.
    An infinity written in the graph stays one. The range analysis reads the record (`saturated_constants`)."""
    count, saturated = 0, {}
    for name, tensor in _float_constants(model, kept):
        values = numpy_helper.to_array(tensor)
        beyond = np.isfinite(values) & (np.abs(values) > BF16_MAX_FINITE)
        if beyond.any():
            saturated[name] = float(np.abs(values[beyond]).max())
            count += int(np.count_nonzero(beyond))
            clamped = np.where(beyond, np.sign(values) * BF16_MAX_FINITE, values).astype(np.float32)
            tensor.CopyFrom(numpy_helper.from_array(clamped, tensor.name))
    return count, saturated


def partly_lowered(
    model: onnx.ModelProto, kept: KeptNodes, types: dict[str, int], precision: str
) -> tuple[dict[str, Any], list[str]]:
    """What a variant lowers to `precision` (op type counts, in params), and for a partly lowered one a note naming
    it and the FP32 nodes that read its rounded values.

    The notes said only what stays FP32, so a variant whose one lowered step is a scaler in front of a tree ensemble
    read as an FP16 model: its trees run in FP32 but compare the scaler's FP16-rounded features with their
    thresholds, and a feature near a split crosses it. The figures measure that; the note says where it comes from.

    A graph with no contraction computes in its ONNX-ML predictors (`fp32_predictors`: a tree ensemble, a linear
    model), which stay FP32: a LightGBM classifier's FP16 variant lowered only onnxmltools' Mul of its scores by 1.

    Nodes are weighed by the contractions they hold (`contractions_held`: an If or Loop by those of its bodies):
    `contractions` in the graph, `lowered_contractions` among the lowered nodes. A graph computing only inside kept
    control flow lowers its condition (a ReduceMax, a Greater) and nothing of its compute; counted by node it read
    as an FP16 model, and its pass as an FP16 pass (the gate reads `lowered_contractions` 0 as computing in FP32).
    """
    lowered = set(narrowed_nodes(model, kept, types))
    nodes = [node for node in model.graph.node if node.name in lowered]
    counts = dict(sorted(Counter(node.op_type for node in nodes).items()))
    written = {name for node in nodes for name in node.output if types.get(name) == TensorProto.FLOAT}
    readers = [node for node in model.graph.node if node.name in kept.reasons and written & set(node.input)]
    total = sum(contractions_held(node) for node in model.graph.node)
    held = sum(contractions_held(node) for node in nodes)
    predictor_nodes = [node for node in model.graph.node
                       if node.domain == "ai.onnx.ml" and node.op_type in ML_PREDICTOR_OP_TYPES]  # fmt: skip
    predictors = [node.op_type for node in predictor_nodes]
    after = computed_after(model, predictor_nodes, lowered)
    params = {"lowered_op_types": counts, "fp32_nodes_reading_lowered": [node.name for node in readers],
              "contractions": total, "lowered_contractions": held, "fp32_predictors": len(predictors),
              "lowered_after_predictors": dict(sorted(Counter(node.op_type for node in after).items()))}  # fmt: skip
    if not nodes or not kept.reasons:
        return params, []
    listed = ", ".join(f"{count} {op}" for op, count in counts.items())
    note = f"lowered to {precision}: {listed}; every other node computes in FP32"
    if held < total:
        nested = sum(contractions_held(node) - (node.op_type in CONTRACTION_OP_TYPES) for node in model.graph.node
                     if node.name not in lowered)  # fmt: skip
        where = f" ({nested} sit inside control-flow subgraphs, which stay FP32)" if nested else ""
        note += f"; {held or 'none'} of the graph's {total} contractions (MatMul, Conv, Gemm...) lowered{where}"
        note += f": the variant computes in FP32, {precision} rounds only the nodes above" if not held else ""
    if readers:
        reader_types = ", ".join(sorted({node.op_type for node in readers}))
        note += (f"; the FP32 {reader_types} read values rounded to {precision}: thresholds and comparisons there "
                 f"see the rounded values, so outputs can change though nothing there runs in {precision}")
    if predictors and not total and after:
        note += (f"; the graph's ONNX-ML {', '.join(sorted(set(predictors)))} stay FP32, and {len(after)} lowered "
                 f"node(s) compute on what they give in {precision}")
    elif predictors and not total:
        note += (f"; the graph computes in its ONNX-ML {', '.join(sorted(set(predictors)))}, which stay FP32: the "
                 f"variant computes in FP32, {precision} rounds only the nodes above")
    return params, [note]


_IDENTITY_OPERAND = {"Mul": (1.0, (0, 1)), "Div": (1.0, (1,)), "Add": (0.0, (0, 1)), "Sub": (0.0, (1,))}


def computed_after(model: onnx.ModelProto, sources: Collection[onnx.NodeProto],
                   lowered: Collection[str]) -> list[onnx.NodeProto]:
    """The lowered nodes of the main graph that compute on what the `sources` (FP32 ONNX-ML predictors) give, directly
    or through other nodes: arithmetic on their values, not data movement (Cast, Reshape...) nor an identity by a
    constant (onnxmltools' Mul of a LightGBM model's scores by 1, which only rounds them).

    An IsolationForest's score is computed after its trees (the path lengths summed, divided, raised as a power of 2),
    and its BF16 variant computes that arithmetic in BF16, its scores 0.0026 off FP32's; the gate said it computed
    in FP32 and its pass said nothing about BF16, as for the LightGBM model that only rounds its scores."""
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    constants.update({node.output[0]: numpy_helper.to_array(attribute.t) for node in model.graph.node
                      if node.op_type == "Constant" for attribute in node.attribute
                      if attribute.name == "value"})  # fmt: skip
    reached = {name for node in sources for name in node.output if name}
    found = []
    for node in model.graph.node:  # topologically sorted: every variant is built from the sorted normal form
        if not reached.intersection(node.input):  # the predictors, kept FP32, are never among the lowered
            continue
        reached.update(name for name in node.output if name)
        if node.name in lowered and node.op_type not in DATA_MOVEMENT_OPS and node.op_type not in SHAPE_ONLY_OPS \
                and not _identity_by_constant(node, constants):
            found.append(node)
    return found


def _identity_by_constant(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> bool:
    """Whether `node` returns its other operand unchanged: a Mul or Div by constant ones, an Add or Sub of zeros."""
    identity, positions = _IDENTITY_OPERAND.get(node.op_type, (None, ()))
    return len(node.input) == 2 and any(
        node.input[i] in constants and constants[node.input[i]].size > 0
        and bool(np.all(constants[node.input[i]] == identity))
        for i in positions)  # fmt: skip


def _free_converter_names(graph: onnx.GraphProto, taken: set[str]) -> None:
    """Rename the nodes of `graph` (and its subgraphs) named as the FP16 converter names the Casts it adds at the
    graph's inputs and outputs (`graph_output_cast0`), in place: the converter leaves every node so named as it is,
    reading the tensors it renamed, so a model converted once and optimized back to FP32 (ONNX Runtime keeps the
    names) built an invalid graph."""
    for node in graph.node:
        if _CONVERTER_NODE_NAME.fullmatch(node.name):
            node.name = fresh_name(f"{node.name}_model", taken)
        for body in subgraphs_of(node):
            _free_converter_names(body, taken)


def _nothing_to_lower(action: str, kept_op_types: Collection[str], model: onnx.ModelProto) -> str:
    """Why a graph has no float32 node to lower: the op types kept FP32, and a graph computing in float64 (a
    scikit-learn model converted with double inputs), which the conversions leave as it is."""
    reasons = [f"every node stays FP32: {', '.join(kept_op_types)}"] if kept_op_types else []
    if float64_nodes(model):
        reasons.append("the graph computes in float64, which the conversion leaves as it is")
    return f"nothing to {action} ({'; '.join(reasons) or 'no float32 computation in the graph'})"


def build_bf16(spec: VariantSpec, ctx: BuildContext) -> BuiltVariant:
    """A BF16 simulation: FP32 graph with weights and activations rounded to bfloat16 (see module docstring).

    Nodes that stay FP32 (`float_support.kept_in_rounding_simulation`: ai.onnx.ml operators, control flow) read
    and write unrounded tensors.
    """
    clock = Stopwatch()
    target = output_path(spec.name, ctx)
    with build_step(spec.name, "loading the FP32 model"):
        model = load_reference(ctx.reference_path.resolve())
    params: dict[str, Any] = {
        "method": "simulated: FP32 graph, bfloat16-rounded weights, float activations cast to BFLOAT16 and back",
        "rounding": "round to nearest even",
    }
    with build_step(spec.name, "choosing the nodes that stay FP32"):
        types = tensor_types(model)
        kept = with_data_movement_between_kept(model, kept_in_rounding_simulation(model), types)
        params["kept_fp32_op_types"] = kept.op_types(model)
        lowered_params, lowered_note = partly_lowered(model, kept, types, "BF16")
        params.update(lowered_params)
        narrowed = narrowed_nodes(model, kept, types)
        fused_note = _fused_rounding_note(model, set(narrowed), "BF16")
    if not narrowed:
        why = _nothing_to_lower("round to BF16", params["kept_fp32_op_types"], model)
        return unchanged_variant(spec.name, "bf16", ctx, why, params, clock.seconds())
    with build_step(spec.name, "BF16 simulation"):
        model = ensure_opset(model, BF16_CAST_OPSET)
        kept_text = kept.described(model)
        kept = _float32_copies_for_kept(model, kept, types)
        saturated, saturated_constants = _saturate_to_bf16(model, set(kept.names))
        params["folded_batch_norms"] = fold_conv_batch_norms(model, round_to_bf16, keep=set(kept.names))
        weights = _round_weights_to_bf16(model, set(kept.names))
        activations = round_float_tensors(model, TensorProto.BFLOAT16, keep=set(kept.names))
        params["stepped_recurrent"] = step_recurrent(model, TensorProto.BFLOAT16, keep=set(kept.names))
        check_model_against(model, ctx.reference_path.resolve())
        save_model(model, target)
    kept_note = [f"kept in FP32: {kept_text}", *lowered_note] if kept.reasons else []
    kept_note += fused_note
    if saturated:
        kept_note.append(f"{saturated} constant value(s) beyond BF16's range (float32's extremes, as a mask fill) "
                         f"saturated to ±{BF16_MAX_FINITE:.4g}, not rounded to inf")
    return BuiltVariant(
        name=spec.name,
        precision="bf16",
        onnx_path=target,
        params={**params, "rounded_weights": weights, "rounded_activations": activations,
                "saturated_values": saturated, "saturated_constants": saturated_constants},
        build_seconds=clock.seconds(),
        simulation=True,
        notes=(BF16_NOTE, *kept_note),
    )


def _fused_rounding_note(model: onnx.ModelProto, narrowed: set[str], precision: str) -> list[str]:
    """A note naming the lowered operators outside the standard ONNX domains (`narrowed`: the nodes the build lowers,
    float_support.narrowed_nodes: a contrib operator reading and writing no float tensor, such as the string Tokenizer
    skl2onnx writes, has nothing to round and is not named): ONNX Runtime's fused contrib operators
    (com.microsoft Attention, SkipLayerNormalization, BiasGelu... that its transformer optimizer writes) stand for
    several ops whose intermediate tensors (Attention's Q, K, V and scores, the residual sum before a layer norm) a
    rounding graph cannot reach, so it rounds only what such an operator reads and writes: it rounds less than an
    engine running the unfused graph in `precision`, and its figures are optimistic by that much. BF16 is always
    such a graph; FP16 converts them (as ONNX Runtime's float16 converter does) and is such a graph where scored by
    its emulation (a backend without FP16 kernels: ONNX Runtime's CPU)."""
    fused = Counter(f"{node.op_type} ({node.domain})" for node in model.graph.node
                    if node.name in narrowed and node.domain not in ("", "ai.onnx", "ai.onnx.ml"))  # fmt: skip
    if not fused:
        return []
    listed = ", ".join(f"{count} {op}" for op, count in sorted(fused.items()))
    where = "rounded" if precision == "BF16" else (
        "converted to FP16 (their float inputs, weights and outputs, as ONNX Runtime's float16 converter converts "
        "them); emulated on a backend without FP16 kernels (ONNX Runtime's CPU), they are rounded")
    return [f"{listed}: {where} where they read and write only; what they compute inside (a fused Attention's Q, K, "
            f"V and scores, a SkipLayerNormalization's residual sum) stays float32, which {precision} running the "
            f"unfused ops would round: the figures may be closer to FP32 than {precision}'s"]


def round_to_bf16(values: np.ndarray) -> np.ndarray:
    """Float32 values rounded (to nearest even) to the nearest bfloat16, kept as float32."""
    return values.astype(ml_dtypes.bfloat16).astype(np.float32)


def _round_weights_to_bf16(model: onnx.ModelProto, keep: set[str]) -> int:
    """Round the float initializers nodes outside `keep` read to bfloat16 (kept as float32), in place; how many."""
    read = {name for node in model.graph.node if node.name not in keep for name in node.input}
    weights = [t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT and t.name in read]
    for tensor in weights:
        tensor.CopyFrom(numpy_helper.from_array(round_to_bf16(numpy_helper.to_array(tensor)), tensor.name))
    return len(weights)
