"""An editable view of an ONNX graph that knows its Linears: the nodes SmoothQuant and Linear Q/DQ rewrite.

A Linear is chosen BY RULE, never by node name: a MatMul (or a Gemm without transA)
whose weight (input 1) is a float32 2-D constant initializer and whose other input
is computed. Attention matmuls (two computed inputs), Softmax, LayerNorm, GELU and
mask arithmetic are therefore never Linears and stay float. A weight the graph computes from
constants (a Transpose or a Constant node) is folded into an initializer before the view is
made (`constant_inputs`), so it is a Linear's weight too.

The view keeps the original node list (protobuf wrappers, indexed by position), the
constant initializers as numpy arrays, and the edits: nodes inserted before a given
original node, nodes removed, initializers added or replaced. `commit()` writes the
edits back into the model in topological order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qbench.onnx_read import infer_shapes, subgraphs_of, typing_skeleton
from qbench.variants.onnx_utils import drop_unused_initializers, names_read

LINEAR_OP_TYPES = ("MatMul", "Gemm")
SHAPE_READERS = ("Shape", "Size")  # read a tensor's shape, never its values


@dataclass(frozen=True)
class Linear:
    """One Linear node: `index` is its position in the original node list."""

    index: int
    node: onnx.NodeProto

    @property
    def weight_input_axis(self) -> int:
        """Axis of the weight that holds the input channels (1 for a Gemm with transB)."""
        return 1 if node_attribute(self.node, "transB", 0) else 0

    @property
    def weight_output_axis(self) -> int:
        return 1 - self.weight_input_axis


class GraphView:
    """Producers, consumers and constants of one graph, with edits applied on commit()."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        graph = model.graph
        self.nodes: list[onnx.NodeProto] = list(graph.node)
        overridable = {value.name for value in graph.input}
        # initializers that are also graph inputs can be overridden at run time: not constants
        self.constants: dict[str, np.ndarray] = {
            t.name: numpy_helper.to_array(t) for t in graph.initializer if t.name not in overridable
        }
        self.graph_outputs = {value.name for value in graph.output}
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        for index, node in enumerate(self.nodes):
            for name in node.output:
                self.producer[name] = index
            for name in node.input:
                if name:
                    self.consumers[name].append(index)
        # names read inside If/Loop bodies: their readers are not in self.consumers
        self._read_by_subgraphs: set[str] = set()
        for node in self.nodes:
            for subgraph in subgraphs_of(node):
                self._read_by_subgraphs |= names_read(subgraph)
        self._taken = {name for node in self.nodes for name in (*node.input, *node.output, node.name)}
        self._taken |= set(self.constants) | overridable
        self._changed: set[str] = set()
        self._inserted: dict[int, list[onnx.NodeProto]] = defaultdict(list)
        self._removed: set[int] = set()
        self._dims: dict[str, list[int | None]] | None = None
        self._symbolic: dict[str, list[int | str | None]] | None = None
        self._from_inputs: set[str] | None = None

    # -- reading -------------------------------------------------------------------------------

    def is_constant(self, name: str) -> bool:
        return name in self.constants

    def read_only_by(self, tensor: str, readers: Iterable[int], *, shape_readers: bool = False) -> bool:
        """True when `tensor` is read by exactly the nodes `readers` (and is no graph output); `shape_readers`: Shape
        and Size nodes may read it too (they read only its shape, which a rescaling of its values keeps: exporters
        read a pre-LN block's normalised input's shape to split heads, `x.view(*x.shape[:-1], heads, -1)`)."""
        if tensor in self.graph_outputs or tensor in self._read_by_subgraphs:
            return False
        found = set(self.consumers.get(tensor, ()))
        if shape_readers:
            found = {index for index in found if self.nodes[index].op_type not in SHAPE_READERS}
        return found == set(readers)

    def linears(self, exclude_nodes: Sequence[str] = ()) -> list[Linear]:
        """Every Linear by rule (see the module docstring), minus the nodes named in `exclude_nodes`."""
        found = []
        for index, node in enumerate(self.nodes):
            if node.name and node.name in exclude_nodes:
                continue
            if self.is_linear(node):
                found.append(Linear(index, node))
        return found

    def is_linear(self, node: onnx.NodeProto) -> bool:
        if node.op_type not in LINEAR_OP_TYPES or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            return False
        weight = self.constants.get(node.input[1])
        if weight is None or weight.ndim != 2 or weight.dtype != np.float32 or self.is_constant(node.input[0]):
            return False
        if node.op_type == "Gemm":
            has_bias = len(node.input) > 2 and node.input[2]
            return not node_attribute(node, "transA", 0) and (not has_bias or self.is_constant(node.input[2]))
        return True

    def from_graph_inputs(self, tensor: str) -> bool:
        """Whether `tensor` depends on a graph input (an overridable initializer included): an activation, not a
        weight. One forward pass over the nodes (topologically sorted), no recursion."""
        if self._from_inputs is None:
            reached = {value.name for value in self.model.graph.input}
            for node in self.nodes:
                read = set(node.input)
                for subgraph in subgraphs_of(node):
                    read |= names_read(subgraph)
                if read & reached:
                    reached.update(node.output)
            self._from_inputs = reached
        return tensor in self._from_inputs

    def rank(self, tensor: str) -> int | None:
        """The rank of `tensor` from ONNX shape inference on the graph as loaded, or None when unknown."""
        dims = self._inferred_dims().get(tensor)
        return None if dims is None else len(dims)

    def last_dim(self, tensor: str) -> int | None:
        """The size of `tensor`'s last axis from ONNX shape inference on the graph as loaded, or None when unknown."""
        dims = self._inferred_dims().get(tensor)
        return dims[-1] if dims else None

    def symbolic_dims(self, tensor: str) -> list[int | str | None] | None:
        """`tensor`'s dims from ONNX Runtime's symbolic shape inference on the graph as loaded: an int, a symbol (one
        name for dims it proved equal) or None, per axis; None when unknown. Unlike onnx's inference it follows shapes
        computed at run time into a Reshape (Shape, Gather, Concat, a -1 resolved), as exporters write head splits.
        Inferred once, when first asked: ask before editing node inputs (an inserted node is in the model only after
        commit, and a graph reading a tensor nothing produces is not inferred: every dim is unknown then)."""
        if self._symbolic is None:
            from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference  # imports sympy: only when asked

            try:
                graph = SymbolicShapeInference.infer_shapes(typing_skeleton(self.model)).graph
            except Exception:  # noqa: BLE001 (it refuses graphs it cannot follow: shapes stay unknown)
                graph = onnx.GraphProto()
            shaped = [v for v in (*graph.value_info, *graph.output) if v.type.tensor_type.HasField("shape")]
            self._symbolic = {v.name: [_dim(d) for d in v.type.tensor_type.shape.dim] for v in shaped}
        return self._symbolic.get(tensor)

    def _inferred_dims(self) -> dict[str, list[int | None]]:
        if self._dims is None:
            try:
                inferred = infer_shapes(self.model).graph
            except Exception:  # noqa: BLE001 (inference fails on odd models: shapes stay unknown)
                inferred = onnx.GraphProto()
            values = [*inferred.value_info, *inferred.input, *inferred.output]
            self._dims = {
                v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
                for v in values if v.type.tensor_type.HasField("shape")
            }  # fmt: skip
        return self._dims

    # -- editing -------------------------------------------------------------------------------

    def fresh_name(self, base: str) -> str:
        """A tensor/node name not used anywhere in the graph yet (and reserved from now on)."""
        name, counter = base, 1
        while name in self._taken:
            name, counter = f"{base}_{counter}", counter + 1
        self._taken.add(name)
        return name

    def add_constant(self, base: str, value: np.ndarray) -> str:
        name = self.fresh_name(base)
        self.constants[name] = value
        self._changed.add(name)
        return name

    def own_constant(self, index: int, input_index: int) -> str:
        """The constant at input `input_index` of node `index`, copied first if anything else reads it.

        Call before changing a constant in place, so a weight shared by two nodes is never changed for both. A
        subgraph (a Loop body reading a tied weight by name) is a reader too, though not in `consumers`.
        """
        node = self.nodes[index]
        name = node.input[input_index]
        readers = self.consumers.get(name, [])
        shared = name in self.graph_outputs or name in self._read_by_subgraphs
        if len(readers) == 1 and list(node.input).count(name) == 1 and not shared:
            return name
        copy = self.add_constant(f"{name}_{node.name or index}", self.constants[name].copy())
        node.input[input_index] = copy
        readers.remove(index)
        self.consumers[copy].append(index)
        return copy

    def set_constant(self, name: str, value: np.ndarray) -> None:
        self.constants[name] = value
        self._changed.add(name)

    def insert_before(self, index: int, nodes: Sequence[onnx.NodeProto]) -> None:
        """Insert `nodes` (in order) right before original node `index`."""
        self._inserted[index].extend(nodes)

    def replace(self, index: int, nodes: Sequence[onnx.NodeProto]) -> None:
        """Remove original node `index` and put `nodes` in its place."""
        self._removed.add(index)
        self.insert_before(index, nodes)

    def commit(self) -> onnx.ModelProto:
        """Write the edits into the model (nodes in topological order, changed initializers) and return it."""
        graph = self.model.graph
        ordered: list[onnx.NodeProto] = []
        for index, node in enumerate(self.nodes):
            ordered.extend(self._inserted.get(index, ()))
            if index not in self._removed:
                ordered.append(node)
        copies = []
        for node in ordered:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copies.append(copy)
        graph.ClearField("node")
        graph.node.extend(copies)
        kept = [t for t in graph.initializer if t.name not in self._changed]
        graph.ClearField("initializer")
        graph.initializer.extend(kept)
        graph.initializer.extend(numpy_helper.from_array(self.constants[name], name) for name in sorted(self._changed))
        drop_unused_initializers(graph)
        self._changed.clear()
        return self.model


def _dim(dim: onnx.TensorShapeProto.Dimension) -> int | str | None:
    """A dim's number, else its symbol, else None."""
    return dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)


def float_tensor(name: str) -> onnx.ValueInfoProto:
    """A graph output entry for a float32 tensor of unknown shape."""
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)


def node_attribute(node: onnx.NodeProto, name: str, default: Any) -> Any:
    """An integer attribute of `node`, or `default` when it is absent."""
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)
