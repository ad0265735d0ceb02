"""The reference must compute in FP32: every variant is built from it and judged against it.

A model that is already INT8 (QOperator QLinear* nodes, MatMulInteger/ConvInteger, DynamicQuantizeLinear, or
Quantize/DequantizeLinear on activations, not a DequantizeLinear of a graph input, transposed or reshaped or not,
which decodes the integers the caller feeds) or FP16/BF16 (nodes computing on such tensors, or such graph inputs and
outputs) would be read as "FP32": variants would be "identical to FP32", some builders would write invalid graphs,
and a gate could pass having compared the model with itself. What decides is what the graph computes in, so a
FP32 graph storing weights in a smaller type (a bfloat16 initializer cast to float, an INT8 weight dequantized
once) is an FP32 reference, and so is a float64 graph. Such a reference is already rounded, though: `stored_weights`
says so, and the reference's note carries it to the results, the report and the gate's notes (every drop is measured
from that rounding, not from the float model the weights came from).

One rule draws the line between the two: a weight stored in 8 bits or fewer (int8/uint8, int4/uint4, float8, ...)
is a quantized weight, whichever form holds it (a DequantizeLinear of the stored weight, ONNX Runtime's fused
MatMulNBits, GatherBlockQuantized, MatMulBnb4, MatMulFpQ4, or an integer tensor cast to float, scaled or not, that a
matrix product or convolution reads as its weight, as a PyTorch export of `x @ (q.float() * scale).t()` leaves), and
the model is refused as weight-only quantized: its
drops would be measured from a quantized baseline, and an INT8 variant of it would be judged against an INT4 one. A
weight stored in 16 bits (float16, bfloat16, int16) and widened to float is accepted with the note above.

Activations are judged alike: a Cast that rounds a float32 value computed at run time to a 16-bit float, which only
a Cast back to float reads (nothing computes in that type), leaves an FP32 reference rounded (`rounded_activations`,
the same note); one to an 8-bit float is their quantization, refused as Q/DQ on activations is.

Some references hold such weights with no node to show it, as float32 initializers: their values say so. One holding
only values a 16-bit float holds exactly was rounded to it (the note above); one holding at most 256 evenly spaced
values per tensor or per channel was quantized and stored dequantized (refused, as its DequantizeLinear form is).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from qbench.onnx_read import all_graphs, subgraphs_of

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import onnx

# quantized ops of ONNX and of ONNX Runtime's com.microsoft domain named by no family pattern (`_quantized_op`)
_INTEGER_OPS = frozenset({"QGemm", "QAttention", "QEmbedLayerNormalization", "QMoE", "QuickGelu8Bit"})
# ONNX Runtime's weight-only quantized kernels (float activations, packed low-bit weights): op -> bits unless an
# attribute `bits` says otherwise
_WEIGHT_ONLY_OPS = {"MatMulNBits": 4, "GatherBlockQuantized": 4, "MatMulBnb4": 4, "MatMulFpQ4": 4}
_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
# ops that move or re-type values without computing on them: a reduced float type there is storage, not compute
_STORAGE_OPS = frozenset({
    "Cast", "CastLike", "Identity", "Constant", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Shape",
    "Size", "Gather", "Slice", "Concat", "Split", "Expand", "Tile",
})  # fmt: skip
_CONSTANT_FOLDING = _STORAGE_OPS | {"DequantizeLinear", "QuantizeLinear"}
_REDUCED_FLOATS = {10: "float16", 16: "bfloat16", 17: "float8", 18: "float8", 19: "float8", 20: "float8", 23: "float4",
                   24: "float8"}
# weights stored in 8 bits or fewer: quantized, refused (a Cast widens only the floats among them: an integer cast to
# float is a mask or an index, not a rounded weight)
_LOW_BIT = {**{k: v for k, v in _REDUCED_FLOATS.items() if k not in (10, 16)}, 2: "uint8", 3: "int8", 21: "uint4",
            22: "int4", 25: "uint2", 26: "int2"}  # fmt: skip
# types a DequantizeLinear (a Cast: the floats among them) widens an accepted stored weight from
_DEQUANTIZED = {10: "float16", 16: "bfloat16", 4: "uint16", 5: "int16", 6: "int32"}
# distinct values a float32 weight needs before holding only 16-bit float values says it was rounded (`_rounded_floats`)
_ROUNDED_DISTINCT = 16
# ops that read a weight: an integer tensor cast to float there is a stored weight (elsewhere, a mask or an index)
_CONTRACTIONS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "FusedMatMul", "FusedConv",
                           "FusedGemm"})  # fmt: skip
_INTEGERS = {2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 21: "uint4", 22: "int4", 25: "uint2",
             26: "int2"}  # fmt: skip


def reduced_precision(model: onnx.ModelProto) -> str | None:
    """What makes `model` compute in something other than FP32 (float64 is fine), as 'already quantized: 12
    QLinearMatMul, 3 DequantizeLinear nodes' or 'computes in float16: 8 MatMul, ...'; None for an FP32 model."""
    types = value_types(model)
    constants = _constants(model.graph)
    # the data fed, rearranged or not (a Transpose of NHWC pixels): a DequantizeLinear of it decodes what is fed
    fed = set(_reshaped(model.graph, {value.name for value in model.graph.input} - constants))
    integer: Counter[str] = Counter()
    weight_only: Counter[str] = Counter()
    weight_types: set[str] = set()
    reduced: Counter[str] = Counter()
    reduced_types: set[str] = set()
    low_bit: Counter[str] = Counter()
    low_bit_types: set[str] = set()
    for node, graph_constants in _nodes(model.graph, constants):
        op = node.op_type
        stored = _low_bit_weight(node, types, graph_constants)
        if stored:
            weight_only[op] += 1
            weight_types.add(stored)
        elif _quantized_op(op):
            integer[op] += 1
        elif op in _QDQ_OPS and node.input and node.input[0] not in graph_constants \
                and not (op == "DequantizeLinear" and node.input[0] in fed):  # fmt: skip
            # on activations; a DequantizeLinear of a stored weight computes nothing at run time, and one of a graph
            # input, or of one only reshaped or transposed, decodes the data the caller feeds (uint8 pixels to float):
            # every variant is fed the same
            integer[op] += 1
        elif (rounded := _rounded_activation(node, types, graph_constants)) in _LOW_BIT:
            low_bit[op] += 1  # an 8-bit float round trip on activations is their quantization, as Q/DQ on them is
            low_bit_types.add(_LOW_BIT[rounded])
        elif op not in _STORAGE_OPS and op not in _QDQ_OPS:
            found = {_REDUCED_FLOATS[types[name]] for name in (*node.input, *node.output)
                     if types.get(name) in _REDUCED_FLOATS}  # fmt: skip
            if found:
                reduced[op] += 1
                reduced_types |= found
    for op, stored, _ in _cast_integer_weights(model, types):
        if stored in _LOW_BIT:
            weight_only[op] += 1
            weight_types.add(_LOW_BIT[stored])
    for graph in all_graphs(model.graph):
        for op, bits in _grid_weights(graph):
            weight_only[op] += 1
            weight_types.add(f"{bits}-bit values stored as float32")
    io = {v.name: _REDUCED_FLOATS[v.type.tensor_type.elem_type] for v in (*model.graph.input, *model.graph.output)
          if v.name not in constants and v.type.tensor_type.elem_type in _REDUCED_FLOATS}  # fmt: skip
    if integer:
        fused = Counter({op: n for op, n in weight_only.items() if op in _WEIGHT_ONLY_OPS})  # a weight's DQ: not named
        return f"the model is already quantized: {_counted(integer + fused)}"
    if weight_only:
        return (f"the model's weights are already quantized to {'/'.join(sorted(weight_types))} (weight-only, "
                f"activations in float: {_counted(weight_only)}), so every drop would be measured from that "
                "rounding; give the float model the weights were quantized from (before MatMulNBitsQuantizer or the "
                "like)")  # fmt: skip
    found = []
    if low_bit:
        found.append(f"the model already rounds its activations to {'/'.join(sorted(low_bit_types))}: "
                     f"{_counted(low_bit)}")
    if reduced:
        found.append(f"the model already computes in {'/'.join(sorted(reduced_types))}: {_counted(reduced)}")
    if io:
        names = ", ".join(list(io)[:4]) + (f" and {len(io) - 4} more" if len(io) > 4 else "")
        found.append(f"its graph inputs/outputs {names} are {'/'.join(sorted(set(io.values())))}")
    return "; ".join(found) or None


def stored_weights(model: onnx.ModelProto) -> str | None:
    """For a model `reduced_precision` accepts: the weights it stores in a smaller type and widens to float when it
    runs, as 'stores 2 weights in int8 (DequantizeLinear), 1 in float16 (Cast) and widens them to float ...'; None
    when every weight is stored as it is computed with."""
    found: dict[str, dict[str, set[str]]] = {}  # type -> how it is widened -> the weights so stored
    types = value_types(model)
    for graph in all_graphs(model.graph):
        stored = {t.name: t.data_type for t in _stored_tensors(graph)}
        # a float weight narrowed to 16 bits when the model runs (transposed or reshaped first or not: `w.T`, never
        # rows gathered by a fed index: an activation) is held in that type too
        constants = _constants(graph)
        floats = {name for name in _reshaped(graph, {name for name, kind in stored.items() if kind in (1, 11)})
                  if name in constants}  # fmt: skip
        for node in graph.node:
            if _cast_to(node, types) in (10, 16) and node.input and node.input[0] in floats:
                stored[node.output[0]] = _cast_to(node, types)
        origin = _reshaped(graph, {name for name, kind in stored.items() if kind in _DEQUANTIZED})
        for node in graph.node:
            weight = origin.get(node.input[0]) if node.input else None
            widened_cast = _cast_to(node, types) in (1, 11) and stored.get(weight) in _REDUCED_FLOATS
            widens = bool(weight) and stored[weight] in _DEQUANTIZED and (
                node.op_type == "DequantizeLinear" or widened_cast)
            if widens:
                found.setdefault(_DEQUANTIZED[stored[weight]], {}).setdefault(node.op_type, set()).add(weight)
        for weight, kind in _rounded_floats(graph).items():
            found.setdefault(kind, {}).setdefault("rounded, stored as float32", set()).add(weight)
    for _, stored, weight in _cast_integer_weights(model, types):
        if stored in _DEQUANTIZED:
            found.setdefault(_DEQUANTIZED[stored], {}).setdefault("Cast", set()).add(weight)
    if not found:
        return None
    parts = [f"{len(names)} {'weights' if len(names) > 1 else 'weight'} in {kind} ({op})"
             for kind, ops in sorted(found.items()) for op, names in sorted(ops.items())]  # fmt: skip
    return (f"stores {', '.join(parts)} and widens them to float when it runs: it computes in FP32 on weights already "
            "rounded to that type, so every drop is measured from that rounding, not from the float model they came "
            "from")


def rounded_activations(model: onnx.ModelProto) -> str | None:
    """For a model `reduced_precision` accepts: the activations it rounds to a 16-bit float and widens back (a Cast
    to float16 after the input, or between two FP32 layers, that only another Cast reads), which no node computes
    in, as 'rounds 1 activation to bfloat16 (Cast) ...'; None when it rounds none. Like `stored_weights`, such a
    reference is already rounded: every drop is measured from that rounding."""
    narrowing = (node for graph in all_graphs(model.graph) for node in graph.node
                 if node.op_type == "CastLike" or (node.op_type == "Cast" and any(
                     a.name == "to" and a.i in _REDUCED_FLOATS for a in node.attribute)))  # fmt: skip
    if next(narrowing, None) is None:
        return None  # the usual reference: no shape inference for what no node could do
    types = value_types(model)
    found: Counter[str] = Counter()
    for node, graph_constants in _nodes(model.graph, _constants(model.graph)):
        rounded = _rounded_activation(node, types, graph_constants)
        if rounded in _REDUCED_FLOATS and rounded not in _LOW_BIT:
            found[f"{_REDUCED_FLOATS[rounded]} ({node.op_type})"] += 1
    if not found:
        return None
    parts = [f"{count} {'activations' if count > 1 else 'activation'} to {kind}"
             for kind, count in sorted(found.items())]  # fmt: skip
    them = "them" if sum(found.values()) > 1 else "it"
    return (f"rounds {', '.join(parts)} and widens {them} back to float when it runs: it computes in FP32 on values "
            "already rounded to that type, so every drop is measured from that rounding, not from the float model")


def _rounded_activation(node: onnx.NodeProto, types: dict[str, int], constants: set[str]) -> int | None:
    """The float type a Cast/CastLike `node` narrows a float32/float64 value computed at run time (an activation, not
    a stored weight) to; None for any other node or cast."""
    if node.op_type not in ("Cast", "CastLike") or not node.input or node.input[0] in constants \
            or types.get(node.input[0]) not in (1, 11):  # fmt: skip
        return None
    to = _cast_to(node, types)
    return to if to in _REDUCED_FLOATS else None


def _cast_to(node: onnx.NodeProto, types: dict[str, int]) -> int | None:
    """The element type a Cast, or a CastLike (the type of its second input, where known), converts to; None for any
    other node. Both widen a stored weight alike: PyTorch's dynamo exporter writes `w.type_as(x)` as CastLike(w, x)."""
    if node.op_type == "Cast":
        return next((a.i for a in node.attribute if a.name == "to"), None)
    if node.op_type == "CastLike" and len(node.input) > 1:
        return types.get(node.input[1])
    return None


def _read_values(node: onnx.NodeProto) -> list[str]:
    """The inputs whose values `node` computes from: a CastLike reads only the type of its second input, so a
    stored weight it widens is as constant as one a Cast widens."""
    inputs = [name for name in node.input if name]
    return inputs[:1] if node.op_type == "CastLike" else inputs


def _stored_tensors(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    """The tensors `graph` stores: its initializers and its Constant nodes' values (named after the node's output);
    an exporter keeps a weight in either."""
    import onnx

    held = []
    for node in graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None) if node.op_type == "Constant" else None
        if value is not None and node.output:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(value)
            tensor.name = node.output[0]
            held.append(tensor)
    return [*graph.initializer, *held]


def _reshaped(graph: onnx.GraphProto, weights: set[str]) -> dict[str, str]:
    """Each of `weights` and every tensor computed from one by a storage op (a Reshape, Transpose, ..., not a Cast),
    in any node order -> the weight it holds."""
    origin = {name: name for name in weights}
    for _ in range(len(graph.node) + 1):
        known = len(origin)
        for node in graph.node:
            if node.op_type in _STORAGE_OPS and node.op_type not in ("Cast", "CastLike") and node.input \
                    and node.input[0] in origin:  # fmt: skip
                origin.update(dict.fromkeys(node.output, origin[node.input[0]]))
        if len(origin) == known:
            break
    return origin


def _rounded_floats(graph: onnx.GraphProto) -> dict[str, str]:
    """The float32 weights of `graph` every value of which a 16-bit float holds exactly, as name -> 'float16' or
    'bfloat16': weights rounded to that type and stored back as float32, which no node shows (ONNX Runtime's
    optimized FP16 model saved on a CPU, a module trained in FP16 or loaded from FP16 weights, exported in FP32). A
    float32 weight comes out so by chance only when it holds few distinct values (a LayerNorm's ones, a 0/1 mask, a
    small integer table), so a weight counts only with `_ROUNDED_DISTINCT` distinct values or more, not all
    integers; one stored outside the file (external data, not read here) is not checked."""
    import numpy as np
    from onnx import numpy_helper

    found = {}
    for tensor in _stored_tensors(graph):
        if tensor.data_type != 1 or tensor.data_location == 1 or np.prod(tensor.dims) < _ROUNDED_DISTINCT:
            continue
        values = numpy_helper.to_array(tensor).ravel()
        distinct = np.unique(values[: 64 * _ROUNDED_DISTINCT])
        if len(distinct) < _ROUNDED_DISTINCT or np.all(distinct == np.round(distinct)):
            continue
        for kind, holds in (("bfloat16", _holds_bfloat16), ("float16", _holds_float16)):  # bfloat16 first: float16
            if holds(values[:4096]) and holds(values):  # holds most of its values too; the head screens a weight
                found[tensor.name] = kind
                break
    return found


def _holds_bfloat16(values: np.ndarray) -> bool:
    import numpy as np

    return not np.any(values.view(np.uint32) & 0xFFFF)


def _holds_float16(values: np.ndarray) -> bool:
    import numpy as np

    return np.array_equal(values.astype(np.float16).astype(np.float32), values)


def _grid_weights(graph: onnx.GraphProto) -> Iterator[tuple[str, int]]:
    """(op, bits) for each contraction (`_CONTRACTIONS`) reading, directly or through a Transpose/Reshape and the
    like, a float32 weight that holds at most 256 evenly spaced values per tensor or per slice along its first or
    last axis (`_grid_levels`): weights quantized to that many bits and stored dequantized, as a fake-quantized
    model folded for export (QAT, ModelOpt) leaves them. A weight with fewer than `_ROUNDED_DISTINCT` distinct values
    or only integers is not judged (a pooling matrix, a 0/1 selection); so a per-tensor 4-bit grid goes unseen."""
    import numpy as np
    from onnx import numpy_helper

    tensors = {t.name: t for t in _stored_tensors(graph)}
    origin = _reshaped(graph, {name for name, t in tensors.items() if t.data_type == 1 and t.data_location != 1})
    bits: dict[str, int | None] = {}
    for node in graph.node:
        for name in (origin[i] for i in node.input if i in origin) if node.op_type in _CONTRACTIONS else ():
            if name not in bits:
                values = numpy_helper.to_array(tensors[name])
                distinct = np.unique(values.ravel()[: 64 * _ROUNDED_DISTINCT])
                whole = np.all(distinct == np.round(distinct))
                judged = values.ndim and len(distinct) >= _ROUNDED_DISTINCT and not whole
                levels = _grid_levels(values) if judged else None
                bits[name] = int(np.ceil(np.log2(levels))) if levels else None
            if bits[name]:
                yield node.op_type, bits[name]
                break


def _grid_levels(values: np.ndarray) -> int | None:
    """The most levels an evenly spaced grid of at most 256 holds `values` in, per tensor or per slice along the first
    or last axis (per-channel scales); None when no such grid holds them. The first slice screens (its first values
    first, so a large float weight costs one small sort): a float weight fails there at once."""
    import numpy as np

    by_last_axis = np.moveaxis(values, -1, 0).reshape(values.shape[-1], -1)
    for slices in (values.reshape(1, -1), values.reshape(len(values), -1), by_last_axis):
        if slices.shape[1] < 4 or len(np.unique(slices[0, :4096])) > 256 or _slice_levels(slices[0]) is None:
            continue
        levels = [_slice_levels(row) for row in slices]
        if all(levels) and max(levels) >= 4 and not all(_complete_ramp(row) for row in slices):
            return max(levels)
    return None


def _slice_levels(values: np.ndarray) -> int | None:
    """How many levels of an evenly spaced grid of at most 256 hold `values`, None when none does. The grid's step is
    the smallest gap between two values, or, where a few values leave gaps of several steps, a quantizer's own: the
    largest magnitude over 127 or 7 (symmetric int8/int4, levels from 0) or the range over 255 or 15 (asymmetric)."""
    import numpy as np

    distinct = np.unique(values)
    if len(distinct) == 1:
        return 1
    low, high = distinct[0], distinct[-1]
    span = np.abs(distinct).max()
    for step, origin in ((np.diff(distinct).min(), low), (span / 127, 0.0), (span / 7, 0.0), ((high - low) / 255, low),
                         ((high - low) / 15, low)):  # fmt: skip
        # a step so small (a subnormal weight beside 0) that the levels overflow is no grid: inf is on none, quietly
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            levels = (distinct - origin) / step
            width = (high - low) / step
        on_grid = bool(np.isfinite(levels).all()) and np.allclose(levels, np.round(levels), rtol=0, atol=1e-2)
        # a quantized tensor holds one value per level: distinct values sharing a level are float values that a coarse
        # grid (one outlier's magnitude over 7) merely comes near, not a grid they were rounded to
        if on_grid and width <= 255 and len(np.unique(np.round(levels))) == len(distinct):
            return int(round(width)) + 1
    return None


def _complete_ramp(values: np.ndarray) -> bool:
    """Whether `values` are an arithmetic progression, each once (a ramp, a linspace): on an evenly spaced grid by
    construction, not by rounding; quantized values repeat levels or leave some unused."""
    import numpy as np

    return len(np.unique(values)) == values.size == _slice_levels(values)


def _cast_integer_weights(model: onnx.ModelProto, types: dict[str, int]) -> Iterator[tuple[str, int, str]]:
    """(op, stored type, integer tensor) for each integer tensor that a contraction (`_CONTRACTIONS`) reads as a
    constant input once cast to float, through any computation on constants (a Mul by its scale, a Transpose): a
    weight stored as integers and widened when the model runs, which no DequantizeLinear names. Only stored integers
    count (an initializer or Constant, reshaped or not: a `Range` of positions is computed, not stored), and a cast
    integer that only an elementwise op reads (a mask, an index) is no weight."""
    for graph in all_graphs(model.graph):
        constant = {t.name for t in graph.initializer}
        stored = set(constant)
        origin: dict[str, set[str]] = {}  # constant value -> the integer values cast to float that it is computed from
        for _ in range(len(graph.node) + 1):  # until nothing changes: the nodes need not be in topological order
            known = len(constant)
            for node in graph.node:
                inputs = _read_values(node)
                if any(name in constant for name in node.output) or any(name not in constant for name in inputs) \
                        or subgraphs_of(node):  # fmt: skip
                    continue
                came = set().union(*(origin.get(name, set()) for name in inputs))
                cast_to_float = _cast_to(node, types) in (1, 11)
                if cast_to_float and inputs[0] in stored and types.get(inputs[0]) in _INTEGERS:
                    came.add(inputs[0])
                elif node.op_type == "Constant" or (node.op_type in _STORAGE_OPS and inputs[0] in stored):
                    stored.update(node.output)
                constant.update(node.output)
                origin.update(dict.fromkeys(node.output, came))
            if len(constant) == known:
                break
        for node in graph.node:
            if node.op_type in _CONTRACTIONS:
                for weight in sorted(set().union(*(origin.get(name, set()) for name in node.input))):
                    yield node.op_type, types[weight], weight


def _low_bit_weight(node: onnx.NodeProto, types: dict[str, int], constants: set[str]) -> str | None:
    """The stored type of the weight `node` reads quantized to 8 bits or fewer, as 'int4' or '4-bit' (ONNX Runtime's
    weight-only kernels, which pack it into bytes); None when it reads none."""
    if node.op_type in _WEIGHT_ONLY_OPS:
        bits = next((a.i for a in node.attribute if a.name == "bits"), _WEIGHT_ONLY_OPS[node.op_type])
        return f"{bits}-bit"
    if node.op_type not in ("DequantizeLinear", "Cast", "CastLike") or not node.input or node.input[0] not in constants:
        return None
    stored = types.get(node.input[0])
    if node.op_type != "DequantizeLinear" and stored not in _REDUCED_FLOATS:
        return None  # an integer cast to float is a mask or an index
    return _LOW_BIT.get(stored)


def _quantized_op(op: str) -> bool:
    """An op that computes on quantized values, by family: QLinear*/QOrdered*, *Integer* (MatMulInteger16,
    MatMulIntegerToFloat), *Quantize* (DynamicQuantizeLinear, QuantizeWithOrder, DequantizeBFP)
    but Quantize/DequantizeLinear themselves (judged by what they read), so a new member of a family is caught too."""
    return (op.startswith(("QLinear", "QOrdered")) or "Integer" in op
            or ("quantize" in op.lower() and op not in _QDQ_OPS) or op in _INTEGER_OPS)  # fmt: skip


def _counted(ops: Counter[str]) -> str:
    """'12 QLinearMatMul, 3 DequantizeLinear nodes', or '..., 2 Gemm nodes and 3 more of 2 other kinds': five kinds
    named at most, Quantize/DequantizeLinear after the ops that compute, the most frequent first."""
    ordered = sorted(ops.items(), key=lambda item: (item[0] in _QDQ_OPS, -item[1], item[0]))
    shown = [f"{count} {op}" for op, count in ordered[:5]]
    hidden = sum(count for _, count in ordered[5:])
    more = f" and {hidden} more of {len(ops) - 5} other kind{'s' if len(ops) > 6 else ''}" if hidden else ""
    return f"{', '.join(shown)} node{'s' if sum(ops.values()) - hidden != 1 else ''}{more}"


def value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Value name -> ONNX element type, from the graph's declarations and ONNX shape inference (all subgraphs)."""
    from qbench.onnx_read import infer_shapes

    try:
        inferred = infer_shapes(model, check_type=False, strict_mode=False)
    except Exception:  # noqa: BLE001 - a graph inference cannot follow still declares its inputs and outputs
        inferred = model
    types: dict[str, int] = {}
    for graph in all_graphs(inferred.graph):
        for value in (*graph.input, *graph.output, *graph.value_info):
            if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
                types[value.name] = value.type.tensor_type.elem_type
        for tensor in graph.initializer:
            types[tensor.name] = tensor.data_type
    return types


def _constants(graph: onnx.GraphProto) -> set[str]:
    """Values known before the model runs: initializers and Constant outputs, and what Cast/Identity/Reshape
    and the like make of them (a stored weight re-typed or re-shaped is still a stored weight)."""
    constants = {t.name for t in graph.initializer}
    while True:  # until nothing changes: the nodes need not be in topological order
        known = len(constants)
        for node in graph.node:
            inputs = _read_values(node)
            if node.op_type == "Constant" or (
                node.op_type in _CONSTANT_FOLDING and inputs and all(name in constants for name in inputs)
            ):
                constants.update(node.output)
        if len(constants) == known:
            return constants


def _nodes(graph: onnx.GraphProto, constants: set[str]) -> Iterator[tuple[onnx.NodeProto, set[str]]]:
    """Every node of `graph` and its subgraphs, with the values constant where it runs."""
    for node in graph.node:
        yield node, constants
        for subgraph in subgraphs_of(node):
            yield from _nodes(subgraph, constants | _constants(subgraph))

