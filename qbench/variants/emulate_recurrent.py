"""Recurrent layers emulated step by step, their state rounded to the narrow format after every step.

An ONNX `LSTM`, `GRU` or `RNN` runs its whole sequence inside one node. Rounding only what the node reads and
writes (emulate.py) leaves the recurrent state in float32 from step to step, where narrow-float hardware stores it
in the format at every step: cuDNN's RNN and PyTorch's fused CUDA cells read h(t-1) (and c(t-1)) from half/bfloat16
buffers and accumulate each step's gates in FP32. On a 20-step LSTM the unrounded state put the emulation ~270 FP16
ulps away from a step-rounded numpy reference, an error as large as FP16's own.

`step_recurrent(graph, to)` replaces each such node by a `Scan` over time whose body is the same operator run for
one step (so every attribute, activation, clip, peephole and GRU `linear_before_reset` is ONNX Runtime's own),
followed by Cast(to) -> Cast(FLOAT) of the new state: the state each step hands on, the per-step output `Y` and the
final `Y_h` / `Y_c` are all rounded. Reverse runs the Scan backwards; bidirectional runs one Scan per direction on
that direction's weights and concatenates them as the operator does; `layout=1` is transposed to `layout=0` around
it. A node with `sequence_lens` (per-row lengths, whose padding the step-wise form would have to mask), or in a graph
before opset 9 (Scan-8 has another signature), is left whole and logged: its state stays float32 between steps.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import onnx
from onnx import TensorProto, helper

from qbench.variants.onnx_utils import round_trip
from qbench.variants.reference import fresh_name, names_in

log = logging.getLogger(__name__)

RECURRENT_OP_TYPES = ("LSTM", "GRU", "RNN")
SCAN_OPSET = 9  # Scan without a batch axis, and ConstantOfShape
_STATES = {"LSTM": 2, "GRU": 1, "RNN": 1}  # h (and c): what one step hands the next
_INITIAL = {"LSTM": (5, 6), "GRU": (5,), "RNN": (5,)}  # input index of initial_h (initial_c)
_WEIGHTS = {"LSTM": (1, 2, 3, 7), "GRU": (1, 2, 3), "RNN": (1, 2, 3)}  # W, R, B (P): one slice per direction


class _Builder:
    """Fresh names and the nodes and initializers one rewrite adds to the main graph."""

    def __init__(self, graph: onnx.GraphProto, taken: set[str], opset: int) -> None:
        self.graph, self.taken, self.opset = graph, taken, opset
        self.nodes: list[onnx.NodeProto] = []

    def name(self, base: str) -> str:
        return fresh_name(base, self.taken)

    def const(self, base: str, values: list[int]) -> str:
        name = self.name(base)
        self.graph.initializer.append(helper.make_tensor(name, TensorProto.INT64, [len(values)], values))
        return name

    def node(self, op: str, inputs: list[str], base: str, **attributes) -> str:
        out = self.name(base)
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.name(f"{base}/{op}"), **attributes))
        return out

    def direction_slice(self, source: str, index: int, base: str) -> str:
        """`source[index:index + 1]` along axis 0 (one direction's weights or initial state); Gather, in every opset."""
        return self.node("Gather", [source, self.const(f"{base}/index", [index])], base, axis=0)


def _attributes(node: onnx.NodeProto) -> dict[str, onnx.AttributeProto]:
    return {attribute.name: attribute for attribute in node.attribute}


def _zeros_state(b: _Builder, x: str, hidden: int, base: str) -> str:
    """float32 zeros of shape [1, batch, hidden] for a layout-0 input `x` [T, batch, input]."""
    batch = b.direction_slice(b.node("Shape", [x], f"{base}/shape"), 1, f"{base}/batch")
    shape = b.node("Concat", [b.const(f"{base}/one", [1]), batch, b.const(f"{base}/hidden", [hidden])],
                   f"{base}/state_shape", axis=0)  # fmt: skip
    zero = helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0])
    return b.node("ConstantOfShape", [shape], f"{base}/zeros", value=zero)


def _body(node: onnx.NodeProto, weights: list[str], to: int, opset: int, taken: set[str]) -> onnx.GraphProto:
    """One step of `node` (direction forward, no sequence_lens) on x_t [batch, input]; every state rounded."""
    states = _STATES[node.op_type]
    names = {key: fresh_name(f"{node.name}/step/{key}", taken) for key in ("x", "x1", "h", "c", "y", "yh", "yc")}
    inputs = [names["x1"], *weights[:3], "", names["h"]]
    if node.op_type == "LSTM":
        inputs += [names["c"], weights[3] if len(weights) > 3 else ""]
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute
                  if a.name not in ("direction", "layout")}
    step_outputs = [names["y"], names["yh"], names["yc"]][: 1 + states]
    nodes = []
    if opset >= 13:
        axes = fresh_name(f"{node.name}/step/axes", taken)
        nodes.append(helper.make_node("Constant", [], [axes],
                                      value=helper.make_tensor(axes, TensorProto.INT64, [1], [0])))  # fmt: skip
        nodes.append(helper.make_node("Unsqueeze", [names["x"], axes], [names["x1"]]))
    else:
        nodes.append(helper.make_node("Unsqueeze", [names["x"]], [names["x1"]], axes=[0]))
    nodes.append(helper.make_node(node.op_type, inputs, step_outputs, name=fresh_name(f"{node.name}/step", taken),
                                  **attributes))  # fmt: skip
    outputs = []
    for key in ("yh", "yc")[:states]:
        rounded = fresh_name(f"{names[key]}/rounded", taken)
        nodes.extend(round_trip(names[key], rounded, to))
        outputs.append(rounded)
    scan_out = fresh_name(f"{node.name}/step/y_out", taken)
    nodes.append(helper.make_node("Identity", [outputs[0]], [scan_out]))
    def value(name: str, rank: int = 3) -> onnx.ValueInfoProto:  # states [1, batch, hidden], x_t [batch, input]
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [None] * rank)

    body_inputs = [value(names["h"])] + ([value(names["c"])] if states == 2 else []) + [value(names["x"], 2)]
    return helper.make_graph(nodes, f"{node.name}_step", body_inputs, [value(o) for o in outputs] + [value(scan_out)])


def _one_direction(b: _Builder, node: onnx.NodeProto, x: str, direction: int, reverse: bool, to: int) -> list[str]:
    """A Scan over `x` (layout 0) running `node`'s direction `direction`: [Y (T,1,N,H), Y_h (1,N,H), Y_c]."""
    kind, hidden = node.op_type, helper.get_attribute_value(_attributes(node)["hidden_size"])
    base = f"{node.name}/d{direction}"
    weights = [b.direction_slice(node.input[i], direction, f"{base}/w{i}") if len(node.input) > i and node.input[i]
               else "" for i in _WEIGHTS[kind]]  # fmt: skip
    initial = [b.direction_slice(node.input[i], direction, f"{base}/init{i}")
               if len(node.input) > i and node.input[i] else _zeros_state(b, x, hidden, f"{base}/init{i}")
               for i in _INITIAL[kind]]  # fmt: skip
    body = _body(node, weights, to, b.opset, b.taken)
    outputs = [b.name(f"{base}/final{i}") for i in range(len(initial))] + [b.name(f"{base}/y")]
    b.nodes.append(helper.make_node("Scan", [*initial, x], outputs, name=b.name(f"{base}/Scan"),
                                    num_scan_inputs=1, body=body, scan_input_directions=[int(reverse)],
                                    scan_output_directions=[int(reverse)]))  # fmt: skip
    return [outputs[-1], *outputs[:-1]]


def _stepped(b: _Builder, node: onnx.NodeProto, to: int) -> None:
    """The nodes replacing `node`, writing its own output names."""
    attributes = _attributes(node)
    direction = helper.get_attribute_value(attributes["direction"]).decode() if "direction" in attributes else "forward"
    layout = helper.get_attribute_value(attributes["layout"]) if "layout" in attributes else 0
    x = b.node("Transpose", [node.input[0]], f"{node.name}/x_tnc", perm=[1, 0, 2]) if layout else node.input[0]
    if layout:  # initial states [N, D, H] -> [D, N, H], read by direction_slice
        for i in _INITIAL[node.op_type]:
            if len(node.input) > i and node.input[i]:
                node.input[i] = b.node("Transpose", [node.input[i]], f"{node.name}/init_dnh", perm=[1, 0, 2])
    runs = {"forward": [(0, False)], "reverse": [(0, True)], "bidirectional": [(0, False), (1, True)]}[direction]
    per_direction = [_one_direction(b, node, x, index, reverse, to) for index, reverse in runs]
    perms = ([2, 0, 1, 3], [1, 0, 2], [1, 0, 2])  # layout 1: Y [N, T, D, H], Y_h / Y_c [N, D, H]
    for position, name in enumerate(node.output):
        if not name:
            continue
        parts = [outputs[position] for outputs in per_direction]
        axis = 1 if position == 0 else 0
        joined = parts[0] if len(parts) == 1 else b.node("Concat", parts, f"{name}/directions", axis=axis)
        if layout:
            joined = b.node("Transpose", [joined], f"{name}/layout1", perm=perms[position])
        b.nodes.append(helper.make_node("Identity", [joined], [name], name=b.name(f"{name}/stepped")))


def step_recurrent(model: onnx.ModelProto, to: int, keep: Collection[str] = ()) -> int:
    """Rewrite, in place, each main-graph LSTM/GRU/RNN not named in `keep` so its state is rounded to `to` every
    step (module docstring); returns how many were rewritten. Node outputs keep their names."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    b = _Builder(graph, names_in(graph), opset)
    nodes: list[onnx.NodeProto] = []
    count = 0
    for node in graph.node:
        if node.op_type not in RECURRENT_OP_TYPES or node.domain not in ("", "ai.onnx") or node.name in keep:
            nodes.append(node)
            continue
        if (len(node.input) > 4 and node.input[4]) or opset < SCAN_OPSET:
            why = "has sequence_lens" if opset >= SCAN_OPSET else (f"is in opset {opset} (Scan "
                                                                   f"as used here: {SCAN_OPSET})")
            log.warning("%s %r %s: left whole, its state stays float32 between steps", node.op_type, node.name, why)
            nodes.append(node)
            continue
        b.nodes = []
        _stepped(b, node, to)
        nodes.extend(b.nodes)
        count += 1
    graph.ClearField("node")
    graph.node.extend(nodes)
    return count
