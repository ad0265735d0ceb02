"""Which nodes of a built INT8 graph ONNX Runtime runs as integer arithmetic.

A Q/DQ graph says where values are rounded to INT8, not where INT8 arithmetic runs. ONNX Runtime's CPU
provider fuses DequantizeLinear -> op -> QuantizeLinear into an integer kernel only for ops that compute:
Conv (QLinearConv), MatMul (QLinearMatMul, or MatMulIntegerToFloat when its output stays float), Gemm
(QGemm), Add and Mul (QLinearAdd/Mul), the average pools, Sigmoid, LeakyRelu and Softmax (lookup tables).
Every other op either runs on the INT8 data only to move or select it (Concat, Reshape, Transpose,
Gather, Slice, MaxPool, ArgMax...: its values are values of its input, so INT8 saves no arithmetic there)
or runs in float on the dequantized values (LayerNormalization, ConvTranspose, Sub, ReduceMean...).
A graph whose Q/DQ pairs only sit around such ops rounds data and computes in FP32: it is counted here
as quantizing nothing, so it is flagged as the FP32 model (its pass says nothing about INT8) and no
search takes it for an INT8 win.

The count is ONNX Runtime's own: the built model is optimised once, as the sweep's `onnxruntime-cpu` session would
optimise it (its graph optimisation level, one thread), the optimised graph is saved (its weights to a side file, not
read back) and its integer kernels are counted, each under the op type of the node it replaced (ONNX Runtime keeps
that node's name, or extends it; nodes without a unique name get one in a copy first). That costs one session
creation per INT8 build: 0.17 to 0.19 s for a MiniLM-sized dynamic INT8 build of 90 MB (a plain session of it takes
0.11 s). Only where ONNX Runtime cannot save that graph (onnxruntime is not installed, it refuses the model, or it
fails to write the file) is the count made from the graph alone, by the rules below, and the params say so
(`integer_kernels_from`).

What decides a fusion (ONNX Runtime 1.32, checked against its optimized graph in the tests), beyond the op type:
- re-quantized: every reader of the output is a QuantizeLinear. A Relu between the op and its QuantizeLinears is
  removed first when it is redundant, every one of them having its zero point at the type's minimum (a Relu'd range
  [0, max], as torchao's PT2E observers give it); a Relu that is not (ModelOpt's symmetric int8 ranges, zero point
  0) is fused into the float op instead (FusedConv, FusedGemm), which then runs in float whatever follows;
- a MatMul or Gemm left with a float output still fuses (MatMulIntegerToFloat, QGemm), unless such a Relu stops it
  or its only reader is a Relu or Clip read by one float node (fused into the float op: a Linear + ReLU whose output
  goes on to a Pad, as SmoothQuant leaves it), and a Gemm then only when its bias is absent or dequantized: with a
  float bias (PyTorch's nn.Linear as torchao and ModelOpt export it) it runs as a float Gemm. Re-quantized, ONNX
  Runtime quantizes a float bias itself.
- a float-output MatMul read only by an Add is first fused with it into a float Gemm where the shapes allow it
  (`_Graph.bias_add`, from ONNX shape inference), and then judged as that Gemm, the Add's other input its bias.
The rules also read subgraphs (If/Loop/Scan bodies), where ONNX Runtime fuses Q/DQ as in the main graph, but only with
DequantizeLinears of the same graph.
Every INT8 build is counted here, whoever built it (`with_integer_kernels`, called where a build is finalised), and
every INT8 or FP8 build has the weighted layers it leaves float counted (`with_float_weighted`): recurrent layers and
fused operators outside the standard domain.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections import Counter
from collections.abc import Collection
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from qbench.errors import MissingExtraError
from qbench.onnx_read import infer_shapes
from qbench.variants.base import BuiltVariant
from qbench.variants.onnx_utils import INTEGER_KERNELS, all_nodes, outer_scope_reads, subgraphs_of
from qbench.variants.quant_scope import nothing_quantized_note
from qbench.variants.quantizable import computing_in_float64

KERNELS_COUNTED_FOR = "onnxruntime-cpu"
"""The backend whose fusions the count follows: another runtime (TensorRT) may run in INT8 what this one runs in
float."""

# Fused with both operands dequantized, whether the output is re-quantized or left float (see the module docstring).
_BOTH_OPERANDS = frozenset({"MatMul", "Gemm"})
# Fused only when their data inputs are dequantized and every reader of the output re-quantizes it;
# the number is how many leading inputs are data (Conv: X and W; a bias may stay float or int32).
_REQUANTIZED = {"Conv": 2, "Add": 2, "Mul": 2, "AveragePool": 1, "GlobalAveragePool": 1, "Sigmoid": 1,
                "LeakyRelu": 1, "Softmax": 1}  # fmt: skip
# Activations ONNX Runtime fuses into a float MatMul/Gemm left with a float output, which then stays float: when the
# activation is that output's only reader and is itself read by exactly one node that is not a QuantizeLinear (not a
# graph output). A Relu re-quantized follows the zero-point rule of `_Graph.output_form` instead.
_FUSED_ACTIVATIONS = frozenset({"Relu", "Clip"})
# Op types a quantizer may turn into an integer kernel: quantizing none of them lowers nothing.
COMPUTING_OP_TYPES = frozenset({*_BOTH_OPERANDS, *_REQUANTIZED, "Attention", "LSTM"})


def computing_op_types(op_types: Collection[str]) -> tuple[str, ...]:
    """The op types among `op_types` whose quantization can run integer arithmetic."""
    return tuple(op for op in op_types if op in COMPUTING_OP_TYPES)


# Integer kernels of ONNX Runtime's optimised graph that only move or select their INT8 input: no arithmetic.
_MOVING_KERNELS = frozenset({"QLinearConcat", "QLinearWhere"})
# Integer kernels whose name says neither QLinear nor Integer.
_FUSED_KERNELS = frozenset({"QGemm", "DynamicQuantizeMatMul", "QAttention", "DynamicQuantizeLSTM"})


class OptimisedGraphUnavailable(Exception):
    """ONNX Runtime could not optimise the model and save the result: the count falls back to the graph rules."""


def onnx_runtime_kernel_counts(model: onnx.ModelProto, path: Path, options: object) -> dict[str, int]:
    """Op type -> main-graph nodes of `model` (saved at `path`, external data beside it) that ONNX Runtime's CPU
    provider runs as integer kernels, read from the graph it optimises with the session options `options` (an
    onnxruntime.SessionOptions); each kernel counted under the op type of the node it replaced (by name), else
    under its own. Raises OptimisedGraphUnavailable when ONNX Runtime cannot load the model or save that graph."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise OptimisedGraphUnavailable("onnxruntime is not installed") from exc
    named = _uniquely_named(model)
    with tempfile.TemporaryDirectory(prefix="kernels-") as scratch:
        source = path
        if named is not model:  # saved beside the model, so that its external data's relative paths still resolve
            source = path.with_name(f".{path.stem}.{Path(scratch).name}.onnx")
            onnx.save_model(named, str(source))
        optimised = Path(scratch) / "optimised.onnx"
        options.optimized_model_filepath = str(optimised)  # type: ignore[attr-defined]
        external = "session.optimized_model_external_initializers"  # its weights beside it, the graph read alone
        options.add_session_config_entry(f"{external}_file_name", "weights.bin")  # type: ignore[attr-defined]
        options.add_session_config_entry(f"{external}_min_size_in_bytes", "64")  # type: ignore[attr-defined]
        try:
            ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
            nodes = list(all_nodes(onnx.load(str(optimised), load_external_data=False).graph))
        except Exception as exc:  # ORT's own exception types, or a file it did not write: the rules count instead
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise OptimisedGraphUnavailable(f"onnxruntime could not save its optimised graph: {why}") from exc
        finally:
            if source != path:
                source.unlink(missing_ok=True)
    replaced = {node.name: node.op_type for node in all_nodes(named.graph)}
    counts = Counter(_replaced_op_type(node, replaced) for node in nodes if _is_integer_kernel(node.op_type))
    return dict(sorted(counts.items()))


def _replaced_op_type(kernel: onnx.NodeProto, replaced: dict[str, str]) -> str:
    """The op type of the node `kernel` replaced: ONNX Runtime keeps that node's name, or extends it when a later pass
    rewrites the kernel again (the NHWC layout pass names "conv" 's QLinearConv "conv_token_1"): the longest node name
    that the kernel's name starts with, up to a character that is no letter or digit. A kernel named after no node
    is counted under its own op type."""
    name = kernel.name
    for end in range(len(name), 0, -1):
        if name[:end] in replaced and (end == len(name) or not name[end].isalnum()):
            return replaced[name[:end]]
    return kernel.op_type


def _is_integer_kernel(op_type: str) -> bool:
    """Whether an op of ONNX Runtime's optimised graph is an integer kernel that computes (QLinearConv, QGemm,
    MatMulIntegerToFloat, ConvInteger, DynamicQuantizeMatMul, QAttention...)."""
    if op_type in _MOVING_KERNELS:
        return False
    return op_type.startswith("QLinear") or "Integer" in op_type or op_type in _FUSED_KERNELS


def _uniquely_named(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` if its nodes (subgraphs' included) have unique names, else a copy naming the others: ONNX Runtime gives
    a kernel the name of the node it replaces, which is how a kernel is traced back to its op type."""
    names = Counter(node.name for node in all_nodes(model.graph))
    if all(node.name and names[node.name] == 1 for node in all_nodes(model.graph)):
        return model
    named = onnx.ModelProto()
    named.CopyFrom(model)
    for index, node in enumerate(all_nodes(named.graph)):
        if not node.name or names[node.name] > 1:
            node.name = f"{node.name}#qbench{index}"
    return named


def rule_kernel_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Op type -> nodes (subgraphs' included) ONNX Runtime runs as integer kernels by the graph rules alone (the
    fallback where it cannot save its optimised graph): Q/DQ patterns it fuses (see the module docstring) and the
    integer operators a dynamic quantizer writes (MatMulInteger, ConvInteger...)."""
    counts: Counter[str] = Counter()
    _count_graph(_Graph(model.graph, _shapes(model)), counts)
    return {op: count for op, count in sorted(counts.items()) if count}


def _count_graph(graph: _Graph, counts: Counter[str]) -> None:
    """Add the integer kernels of `graph` and of its subgraphs (which see its dequantized tensors) to `counts`."""
    for node in graph.nodes:
        for body in subgraphs_of(node):
            _count_graph(_Graph(body, graph.shapes, graph), counts)
        if node.domain not in ("", "ai.onnx", "com.microsoft"):
            continue
        if node.op_type in INTEGER_KERNELS:
            counts[node.op_type] += 1
            continue
        if node.op_type not in _BOTH_OPERANDS and node.op_type not in _REQUANTIZED:
            continue
        data = _REQUANTIZED.get(node.op_type, 2)
        if len(node.input) < data:
            continue
        if not all(name in graph.dequantized for name in node.input[:data]):
            continue
        output = graph.output_form(node.output[0])
        if output == "requantized":
            counts[node.op_type] += 1
        elif output == "float" and node.op_type in _BOTH_OPERANDS:
            bias = node.input[2] if node.op_type == "Gemm" and len(node.input) > 2 else ""
            add = graph.bias_add(node) if node.op_type == "MatMul" else None
            if add is not None:  # fused into a Gemm first: judged as that Gemm, its bias the Add's other input
                bias = "" if graph.output_form(add.output[0]) == "requantized" else next(
                    name for name in add.input if name != node.output[0])
            counts[node.op_type] += not bias or bias in graph.dequantized


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int | None, ...]]:
    """Tensor name -> shape (None: a dim not fixed), where ONNX shape inference (or the graph's declarations) knows
    it, subgraphs included: the fusion of a MatMul and an Add into a Gemm depends on it. An inference that fails
    leaves the declared shapes."""
    try:
        model = infer_shapes(model)
    except Exception:  # noqa: BLE001 - a refinement: without it, fewer ranks are known and fewer Gemm fusions assumed
        pass
    shapes: dict[str, tuple[int | None, ...]] = {}

    def visit(graph: onnx.GraphProto) -> None:
        shapes.update({tensor.name: tuple(tensor.dims) for tensor in graph.initializer})
        for value in (*graph.input, *graph.output, *graph.value_info):
            if value.type.tensor_type.HasField("shape"):
                dims = value.type.tensor_type.shape.dim
                shapes[value.name] = tuple(dim.dim_value if dim.HasField("dim_value") else None for dim in dims)
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                shapes[node.output[0]] = tuple(node.attribute[0].t.dims)
            for body in subgraphs_of(node):
                visit(body)

    visit(model.graph)
    return shapes


class _Graph:
    """What the fusion rules read of a graph: dequantized tensors, readers, zero points."""

    def __init__(
        self, graph: onnx.GraphProto, shapes: dict[str, tuple[int | None, ...]], outer: _Graph | None = None
    ) -> None:
        """`outer`: the graph enclosing `graph` (a subgraph), whose constants it reads. Its dequantized tensors do not
        count: ONNX Runtime fuses a DequantizeLinear only with nodes of its own graph (a subgraph's MatMul of an outer
        DequantizeLinear's output runs in float, as MatMulNBits where its weight alone is dequantized in it)."""
        self.nodes = list(graph.node)
        self.dequantized = {node.output[0] for node in graph.node if node.op_type == "DequantizeLinear"}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:  # a node whose subgraph reads a tensor by name reads it too (never a QuantizeLinear)
            for name in dict.fromkeys([*node.input, *outer_scope_reads(node)]):
                self.readers.setdefault(name, []).append(node)
        self.graph_outputs = {output.name for output in graph.output}
        self.shapes = shapes
        self.constants = {} if outer is None else dict(outer.constants)
        self.constants.update({tensor.name: tensor for tensor in graph.initializer})
        self.constants.update({node.output[0]: node.attribute[0].t for node in graph.node
                               if node.op_type == "Constant" and node.attribute
                               and node.attribute[0].name == "value"})  # fmt: skip

    def bias_add(self, matmul: onnx.NodeProto) -> onnx.NodeProto | None:
        """The Add that ONNX Runtime fuses with `matmul` into a float Gemm before any Q/DQ fusion (MatMulAddFusion):
        the only reader of a MatMul output that is no graph output, whose weight is a matrix, and either its input a
        matrix too and the other addend of rank 1 or 2, or its input of higher rank with every dim fixed (reshaped to a
        matrix around the Gemm) and the addend of rank 1. Unknown shapes fuse nothing, in ONNX Runtime as here."""
        output = matmul.output[0]
        readers = self.readers.get(output, [])
        if output in self.graph_outputs or len(readers) != 1 or readers[0].op_type != "Add":
            return None
        add = readers[0]
        others = [name for name in add.input if name != output]
        data, weight, bias = (self.shapes.get(name) for name in (*matmul.input[:2], *others[:1]))
        if len(others) != 1 or data is None or weight is None or bias is None or len(weight) != 2:
            return None
        if len(data) == 2:
            return add if len(bias) in (1, 2) else None
        return add if len(data) > 2 and all(isinstance(dim, int) for dim in data) and len(bias) == 1 else None

    def _quantized_by(self, tensor: str) -> list[onnx.NodeProto] | None:
        """The QuantizeLinear nodes reading `tensor` when they are all its readers (and it is no graph output)."""
        readers = self.readers.get(tensor, [])
        if tensor in self.graph_outputs or not readers or any(node.op_type != "QuantizeLinear" for node in readers):
            return None
        return readers

    def output_form(self, tensor: str) -> str:
        """"requantized", "float", or "blocked" (a Relu ONNX Runtime fuses into the float op sits before the Qs)."""
        if self._quantized_by(tensor) is not None:
            return "requantized"
        readers = self.readers.get(tensor, [])
        if tensor in self.graph_outputs or len(readers) != 1 or readers[0].op_type not in _FUSED_ACTIVATIONS:
            return "float"
        activation = readers[0].output[0]
        quantizers = self._quantized_by(activation)
        if quantizers is not None and readers[0].op_type == "Relu":
            return "requantized" if all(self._zero_point_at_minimum(q) for q in quantizers) else "blocked"
        if activation not in self.graph_outputs and len(self.readers.get(activation, [])) == 1:
            return "blocked"  # read by one float node: ONNX Runtime fuses it into the float op (FusedGemm, MatMul)
        return "float"

    def _zero_point_at_minimum(self, quantizer: onnx.NodeProto) -> bool:
        """Whether the QuantizeLinear clamps at 0 (its zero point is its type's minimum), making a Relu before it
        redundant. Without a zero point it quantizes to uint8 with zero point 0."""
        if len(quantizer.input) < 3 or not quantizer.input[2]:
            return True
        tensor = self.constants.get(quantizer.input[2])
        if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
            return False
        values = numpy_helper.to_array(tensor)
        return values.dtype.kind in "iu" and bool(np.all(values == np.iinfo(values.dtype).min))


def blocking_activations(model: onnx.ModelProto) -> dict[str, np.dtype]:
    """The Relu/Clip nodes of the main graph that keep a MatMul or Gemm with both operands dequantized from its
    integer kernel (ONNX Runtime fuses them into the float op: output form "blocked"), by output, each with the float
    type of the values it reads (its MatMul's dequantized input's scale type)."""
    graph = _Graph(model.graph, _shapes(model))
    found: dict[str, np.dtype] = {}
    for node in graph.nodes:
        both_dequantized = len(node.input) >= 2 and all(n in graph.dequantized for n in node.input[:2])
        if node.op_type not in _BOTH_OPERANDS or not both_dequantized:
            continue
        add = graph.bias_add(node) if node.op_type == "MatMul" else None
        output = (add or node).output[0]
        if graph.output_form(output) == "blocked":
            activation = graph.readers[output][0]
            found[activation.output[0]] = _scale_type(graph, node.input[0])
    return found


def _scale_type(graph: _Graph, dequantized: str) -> np.dtype:
    """The numpy type of the scale a dequantized tensor is computed with (float32 where it is not a constant)."""
    producer = next(node for node in graph.nodes if dequantized in node.output)
    scale = graph.constants.get(producer.input[1])
    if scale is None or scale.data_location == onnx.TensorProto.EXTERNAL:
        return np.dtype(np.float32)
    return numpy_helper.to_array(scale).dtype


def rounded_only(model: onnx.ModelProto) -> dict[str, int]:
    """Op type -> nodes (besides Q/DQ, subgraphs' included) that read a dequantized tensor: where a graph with no
    integer kernel rounds data (the note names them)."""
    nodes = list(all_nodes(model.graph))
    dequantized = {node.output[0] for node in nodes if node.op_type == "DequantizeLinear"}
    counts = Counter(node.op_type for node in nodes
                     if node.op_type not in ("QuantizeLinear", "DequantizeLinear")
                     and dequantized.intersection(node.input))  # fmt: skip
    return dict(sorted(counts.items()))


def with_integer_kernels(built: BuiltVariant, model: onnx.ModelProto) -> BuiltVariant:
    """`built` (an INT8 build of `model`, saved at built.onnx_path) with what ONNX Runtime runs as integer kernels in
    its params (`quantized_nodes`, `quantized_op_types`): the one count every INT8 builder reports, so that a graph
    that only rounds data is the FP32 model for the gate and the search, whoever built it. Counted in the graph ONNX
    Runtime optimises with the session options the sweep gives this variant, else by the rules, noted. Without an
    integer kernel, the ops it rounds are in `rounded_only` and a note says that the variant computes in FP32."""
    from qbench.backends.base import RunOptions
    from qbench.backends.onnxruntime_cpu import OnnxRuntimeCPU

    notes = built.notes
    try:
        options = OnnxRuntimeCPU().session_options(built, RunOptions(threads=1))
        counts, source = onnx_runtime_kernel_counts(model, built.onnx_path, options), "onnxruntime"
    except (OptimisedGraphUnavailable, MissingExtraError) as exc:
        counts, source = rule_kernel_counts(model), f"graph rules ({exc})"
        notes += (f"integer kernels counted by qbench's graph rules, not by ONNX Runtime: {exc}",)
    params = {**built.params, "quantized_nodes": sum(counts.values()), "quantized_op_types": counts,
              "integer_kernels_of": KERNELS_COUNTED_FOR, "integer_kernels_from": source}  # fmt: skip
    if not counts:
        rounded = params["rounded_only"] = rounded_only(model)
        if rounded:
            notes += (f"no node computes in INT8: Q/DQ only round what {', '.join(rounded)} read, which ONNX Runtime "
                      "moves, selects or computes in float: this variant computes in FP32",)  # fmt: skip
        else:
            notes += (nothing_quantized_note(params),)
    return dataclasses.replace(built, params=params, notes=notes)


RECURRENT_OP_TYPES = frozenset({"GRU", "LSTM", "RNN"})
# Operators outside the standard domain that read rows of their constant tables (as Gather does) rather than compute
# with them: ONNX Runtime's fused BERT embedding. Its tables are lookups, not weights left unquantized.
_TABLE_LOOKUPS = frozenset({"EmbedLayerNormalization"})
# A node reading weights stored in these types computes with quantized weights: the float matrices beside them are
# their scales (DynamicQuantizeLSTM's per-channel W_scale is [directions, 4 * hidden]), not weights left float.
_QUANTIZED_TYPES = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT4,
                              onnx.TensorProto.UINT4})  # fmt: skip


def _float_weighted(model: onnx.ModelProto) -> tuple[Counter[str], Counter[str]]:
    """The recurrent layers and the other-domain layers reading a float weight matrix (and no quantized one) of
    `model`, subgraphs included, by op type (see `with_float_weighted`)."""
    nodes = list(all_nodes(model.graph))  # a layer inside an If/Loop/Scan body is left float too (main graph only)
    initializers = [*model.graph.initializer, *(tensor for node in nodes for body in subgraphs_of(node)
                                                 for tensor in body.initializer)]  # fmt: skip
    recurrent = Counter(node.op_type for node in nodes
                        if node.domain in ("", "ai.onnx") and node.op_type in RECURRENT_OP_TYPES)  # fmt: skip
    matrices = {tensor.name for tensor in initializers
                if tensor.data_type == onnx.TensorProto.FLOAT and len(tensor.dims) >= 2}  # fmt: skip
    quantized = {tensor.name for tensor in initializers if tensor.data_type in _QUANTIZED_TYPES}
    contrib = Counter(f"{node.op_type} ({node.domain})" for node in nodes
                      if node.domain not in ("", "ai.onnx") and node.op_type not in _TABLE_LOOKUPS
                      and matrices.intersection(node.input) and not quantized.intersection(node.input))  # fmt: skip
    return recurrent, contrib


_LINEAR_OP_TYPES = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


def float_weighted_layers(model: onnx.ModelProto) -> dict[str, int]:
    """Layers of `model` holding weights that a quantizer may leave float whole (recurrent layers, other-domain
    operators, Linear/Conv layers inside If/Loop/Scan bodies, which the quantizers never enter: the weights of an
    optimum merged decoder, whose If picks the with-past or the without-past graph, and Linear/Conv layers computing
    in float64, which the quantizers leave as they are: a scikit-learn MLP converted with double inputs), by op type:
    where an FP32 graph's weights are when no INT8 build lowered anything."""
    recurrent, contrib = _float_weighted(model)
    bodies = [body for node in all_nodes(model.graph) for body in subgraphs_of(node)]
    matrices = {tensor.name for tensor in [*model.graph.initializer, *(t for body in bodies for t in body.initializer)]
                if tensor.data_type == onnx.TensorProto.FLOAT and len(tensor.dims) >= 2}  # fmt: skip
    nested = Counter(f"{inner.op_type} (inside If/Loop/Scan)" for body in bodies for inner in body.node
                     if inner.domain in ("", "ai.onnx") and inner.op_type in _LINEAR_OP_TYPES
                     and matrices.intersection(inner.input))  # fmt: skip
    doubles = {tensor.name for tensor in model.graph.initializer
               if tensor.data_type == onnx.TensorProto.DOUBLE and len(tensor.dims) >= 2}  # fmt: skip
    wide = Counter(f"{node.op_type} (float64)" for node in computing_in_float64(model)
                   if node.domain in ("", "ai.onnx") and node.op_type in _LINEAR_OP_TYPES
                   and doubles.intersection(node.input))  # fmt: skip
    return dict(sorted((recurrent + contrib + nested + wide).items()))


def with_float_weighted(built: BuiltVariant, model: onnx.ModelProto) -> BuiltVariant:
    """`built` (an INT8 or FP8 build of `model`) with the layers holding weights that it leaves float counted in its
    params and noted, so that a variant whose other layers alone are quantized does not read as an INT8 (FP8) model
    with nothing left out:
    - recurrent layers (`float_recurrent`): an RNN classifier's GRU/LSTM holds most of its weights, yet ONNX Runtime's
      static (Q/DQ) quantizer and FP8 leave it float, and its dynamic quantizer lowers only LSTM (DynamicQuantizeLSTM);
    - operators outside the standard ONNX domain reading a float weight matrix and no quantized one (`float_contrib`;
      an integer kernel's float matrices are its scales, a per-channel DynamicQuantizeLSTM's): the com.microsoft
      Attention (its packed Q/K/V projection), FusedMatMul, FusedGemm, FusedConv... that ONNX Runtime's transformer
      optimizer or its saved optimised graphs write. Only dynamic INT8 lowers one, an Attention its QAttention kernel
      takes (int8.contrib_nodes); the rest are never handed to a quantizer (quantizable.unquantizable_nodes), so an
      optimised BERT's static INT8 or FP8 quantizes its other MatMuls only."""
    recurrent, contrib = _float_weighted(model)
    nested = sum(recurrent.values()) - sum(node.op_type in recurrent for node in model.graph.node
                                           if node.domain in ("", "ai.onnx"))  # fmt: skip
    params, notes = dict(built.params), list(built.notes)
    if recurrent:
        params["float_recurrent"] = dict(sorted(recurrent.items()))
        inside = f" ({nested} inside control-flow subgraphs, which quantization leaves float)" if nested else ""
        notes.append(f"{_listed(recurrent)} left in float, weights included{inside}: of ONNX Runtime's quantizers "
                     "only dynamic INT8 lowers a recurrent layer (LSTM, as DynamicQuantizeLSTM)")  # fmt: skip
    if contrib:
        params["float_contrib"] = dict(sorted(contrib.items()))
        notes.append(f"{_listed(contrib)} left in float, weights included: only standard ONNX operators are quantized, "
                     "and by dynamic INT8 a com.microsoft Attention that QAttention runs (export the model without "
                     "ONNX Runtime's fusions to quantize these layers too)")  # fmt: skip
    if not recurrent and not contrib:
        return built
    return dataclasses.replace(built, params=params, notes=tuple(notes))


def _listed(counts: Counter[str]) -> str:
    return ", ".join(f"{count} {op}" for op, count in sorted(counts.items()))
